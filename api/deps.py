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


# Dependencies are ``async def`` (they do not block): FastAPI runs a sync one
# in its thread pool, a hop per dependency per request on the hot path.
async def get_service(request: Request) -> PlannerService:
    service: PlannerService = request.app.state.service
    return service


async def get_store(request: Request) -> Store:
    store: Store = request.app.state.service.store
    return store


def token_ok(settings: Settings, token: str | None) -> bool:
    """Whether ``token`` may write (always, when no tokens are configured)."""
    tokens = settings.tokens
    if not tokens:
        return True
    if not token:
        return False
    # compare_digest on every token: no early exit that times the match.
    return any([secrets.compare_digest(token.encode(), t.encode()) for t in tokens])


async def require_token(
    service: Annotated[PlannerService, Depends(get_service)],
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> None:
    """Write endpoints: a configured bearer token, or 401.  The tokens are the
    service's settings (those :func:`get_settings` gave when it started)."""
    token = credentials.credentials if credentials is not None else None
    if not token_ok(service.settings, token):
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
