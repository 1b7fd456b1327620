"""FastAPI dependencies, as ``Annotated`` aliases the routes declare."""

from __future__ import annotations

import secrets
from typing import Annotated

from fastapi import Depends, HTTPException, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from api.service import PlannerService
from api.settings import Settings, get_settings
from api.store import Store

_bearer = HTTPBearer(
    auto_error=False, description="An API token (MTF_PLANNER_API_TOKENS)."
)


def get_service(request: Request) -> PlannerService:
    service: PlannerService = request.app.state.service
    return service


def get_store(request: Request) -> Store:
    return get_service(request).store


def token_ok(settings: Settings, token: str | None) -> bool:
    """Whether ``token`` may write (always, when no tokens are configured)."""
    tokens = settings.tokens
    if not tokens:
        return True
    if not token:
        return False
    # compare_digest on every token: no early exit that times the match.
    return any([secrets.compare_digest(token.encode(), t.encode()) for t in tokens])


def require_token(
    settings: Annotated[Settings, Depends(get_settings)],
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> None:
    """Write endpoints: a configured bearer token, or 401."""
    token = credentials.credentials if credentials is not None else None
    if not token_ok(settings, token):
        detail = (
            "this endpoint needs an API token: send 'Authorization: Bearer <token>'"
            if token is None
            else "the API token is not valid"
        )
        raise HTTPException(401, detail, headers={"WWW-Authenticate": "Bearer"})


SettingsDep = Annotated[Settings, Depends(get_settings)]
ServiceDep = Annotated[PlannerService, Depends(get_service)]
StoreDep = Annotated[Store, Depends(get_store)]
WriteAccess = Annotated[None, Depends(require_token)]
