"""FastAPI dependencies, as ``Annotated`` aliases the routes declare.

The endpoints that cost CPU or memory declare :data:`JsonBody` (or, for the
dashboard's form, :data:`FormBody`) and no body parameter, so that FastAPI
reads nothing before these run, in this order: the API token (401), the
client's concurrency and rate (429), the content type (415), then the body
as it arrives: the service's budget of body bytes in flight (503), 413 past
``max_body_bytes``, 408 past ``body_timeout_s``; then its shape before
decoding (nesting, string length, token count; 422).  Only then does a
route decode it (:func:`parse_body`).
"""

from __future__ import annotations

import contextvars
import functools
import hashlib
import re
import secrets
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Annotated, Any, TypeVar
from urllib.parse import parse_qs

import anyio
import anyio.to_thread
from fastapi import Depends, HTTPException, Request
from fastapi.exceptions import RequestValidationError
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import BaseModel, ValidationError
from starlette.requests import ClientDisconnect

from api.limits import BodyBudget, ClientLimiter, LimitExceeded, scan_json
from api.planning import RequestError
from api.service import PlannerService
from api.settings import Settings, get_settings
from api.store import Store

_bearer = HTTPBearer(
    auto_error=False, description="An API token (MTF_PLANNER_API_TOKENS)."
)

#: Bodies over this many bytes are scanned and decoded off the event loop.
_OFF_LOOP_BYTES = 64 * 1024
#: The dashboard's form is a few short fields.
MAX_FORM_BYTES = 16 * 1024

M = TypeVar("M", bound=BaseModel)
T = TypeVar("T")


@dataclass
class Guards:
    """The per-app limiters (made with the service, from its settings)."""

    clients: ClientLimiter
    bodies: BodyBudget
    heavy: anyio.CapacityLimiter

    @classmethod
    def from_settings(cls, settings: Settings) -> Guards:
        return cls(
            ClientLimiter(
                settings.client_max_concurrent,
                settings.client_rate_per_s,
                settings.client_burst,
            ),
            BodyBudget(max(settings.max_inflight_body_bytes, settings.max_body_bytes)),
            anyio.CapacityLimiter(settings.heavy_concurrency),
        )


#: The running app's limiter of heavy work (set by JsonBody for its request).
_heavy: contextvars.ContextVar[anyio.CapacityLimiter | None] = contextvars.ContextVar(
    "heavy", default=None
)


async def run_heavy(fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)`` in the thread pool, at most ``heavy_concurrency`` at once
    (the rest wait without a thread).  Decoding or pricing a large graph is
    pure Python: with every pool thread doing it, the event loop gets the GIL
    so rarely that /healthz takes seconds.  Outside a request: no limit."""
    return await anyio.to_thread.run_sync(
        functools.partial(fn, *args), limiter=_heavy.get()
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


def _unauthorized(token: str | None, how: str) -> HTTPException:
    detail = (
        f"this endpoint needs an API token: {how}"
        if not token
        else "the API token is not valid"
    )
    return HTTPException(401, detail, headers={"WWW-Authenticate": "Bearer"})


async def require_token(
    service: Annotated[PlannerService, Depends(get_service)],
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> str | None:
    """Write endpoints: a configured bearer token, or 401.  The tokens are the
    service's settings (those :func:`get_settings` gave when it started)."""
    token = credentials.credentials if credentials is not None else None
    if not token_ok(service.settings, token):
        raise _unauthorized(token, "send 'Authorization: Bearer <token>'")
    return token


def client_key(request: Request, token: str | None) -> str:
    """Whom a request counts against: its token (hashed) or its address."""
    if token:
        return "token:" + hashlib.sha256(token.encode()).hexdigest()[:16]
    host = request.client.host if request.client else "unknown"
    return "addr:" + host


async def throttle(
    request: Request, token: Annotated[str | None, Depends(require_token)]
) -> AsyncIterator[None]:
    """A token (401), then a slot of the client's concurrency and rate (429)."""
    guards: Guards = request.app.state.guards
    key = client_key(request, token)
    guards.clients.acquire(key)  # LimitExceeded: 429 with Retry-After
    try:
        yield
    finally:
        guards.clients.release(key)


def _media_type(request: Request) -> str:
    return request.headers.get("content-type", "").split(";")[0].strip().lower()


def _declared_length(request: Request) -> int | None:
    value = request.headers.get("content-length")
    return int(value) if value is not None and value.isdigit() else None


async def read_body(
    request: Request, timeout_s: float, each: Callable[[bytes], None]
) -> bytes:
    """``request``'s body, ``each`` called on every chunk as it arrives (it
    may raise to refuse the rest): 408 if it takes longer than
    ``timeout_s``, and 499 if the client goes away first (nobody reads that
    answer, but the logs and metrics then say what happened: no 500)."""
    chunks = []
    try:
        with anyio.fail_after(timeout_s):
            async for chunk in request.stream():
                each(chunk)
                chunks.append(chunk)
    except TimeoutError:
        raise HTTPException(
            408,
            f"the request body did not arrive within {timeout_s:g} s (body_timeout_s)",
        ) from None
    except ClientDisconnect:
        raise HTTPException(
            499, "the client closed the connection before its body arrived"
        ) from None
    return b"".join(chunks)


_OP_TYPE_KEY = re.compile(rb'"op_type"\s*:')
#: ``\u0000`` in a JSON string (an odd run of backslashes before ``u0000``).
_NUL_ESCAPE = re.compile(rb"(?<!\\)(?:\\\\)*\\u0000")


def check_json_shape(raw: bytes, settings: Settings) -> None:
    """422 for JSON nested too deep, with a string too long, too many values,
    a NUL character in a string or a graph of too many operations, before
    it is decoded."""
    shape = scan_json(raw)
    if shape.depth > settings.max_json_depth:
        raise LimitExceeded(
            f"the JSON body nests {shape.depth} levels deep; this service accepts "
            f"at most {settings.max_json_depth} (max_json_depth)",
            422,
            0,
        )
    if shape.longest_string > settings.max_json_string_chars:
        raise LimitExceeded(
            f"the JSON body has a string of {shape.longest_string} bytes; this "
            f"service accepts at most {settings.max_json_string_chars} "
            "(max_json_string_chars)",
            422,
            0,
        )
    if shape.tokens > settings.max_json_tokens:
        raise LimitExceeded(
            f"the JSON body has about {shape.tokens} values; this service accepts "
            f"at most {settings.max_json_tokens} (max_json_tokens)",
            422,
            0,
        )
    # No name or text here may hold a NUL: PostgreSQL's text columns cannot
    # store one (graph and hardware names went there raw: a 500).
    if b"\\u0000" in raw:
        nul = _NUL_ESCAPE.search(raw)
        if nul is not None:
            raise RequestError(
                f"the JSON body has a NUL character (\\u0000) in a string, at "
                f"byte {nul.end() - 6}; expected names and text without NUL"
            )
    # Every operation of the graph format has one "op_type" key.
    ops = len(_OP_TYPE_KEY.findall(raw))
    if ops > settings.max_graph_operations:
        raise LimitExceeded(
            f"the graph has {ops} operations; this service allows at most "
            f"{settings.max_graph_operations} (max_graph_operations)",
            422,
            0,
        )


async def json_body(
    request: Request, service: ServiceDep, _: Annotated[None, Depends(throttle)]
) -> AsyncIterator[bytes]:
    """A JSON request body, after the token and the client's limits, bounded
    in bytes and checked in shape (see the module docstring)."""
    media = _media_type(request)
    if media != "application/json" and not media.endswith("+json"):
        raise HTTPException(
            415,
            f"the body's Content-Type is {media or 'missing'!r}; this endpoint "
            "accepts application/json",
        )
    budget: BodyBudget = request.app.state.guards.bodies
    reserved = 0

    def hold(chunk: bytes) -> None:  # each chunk as it arrives
        nonlocal reserved
        reserved += budget.reserve(len(chunk))  # LimitExceeded: 503

    try:
        # BodySizeLimit: 413 past max_body_bytes
        raw = await read_body(request, service.settings.body_timeout_s, hold)
        request._body = raw  # request.body() answers from here afterwards
        _heavy.set(request.app.state.guards.heavy)
        if service.responses.get(service.responses.key(raw)) is not None:
            pass  # these exact bytes passed the checks before: a cached plan
        elif len(raw) > _OFF_LOOP_BYTES:
            await run_heavy(check_json_shape, raw, service.settings)
        else:
            check_json_shape(raw, service.settings)
        yield raw
    finally:
        budget.release(reserved)


def _validate(model: type[M], raw: bytes) -> M:
    try:
        return model.model_validate_json(raw)
    except ValidationError as e:
        errors = e.errors(include_url=False)
        raise RequestValidationError(
            [{**err, "loc": ("body", *err["loc"])} for err in errors]
        ) from None


async def parse_body(model: type[M], raw: bytes) -> M:
    """``raw`` decoded into ``model`` (422 naming each bad field); large
    bodies are decoded off the event loop (:func:`run_heavy`)."""
    if len(raw) > _OFF_LOOP_BYTES:
        return await run_heavy(_validate, model, raw)
    return _validate(model, raw)


@dataclass(frozen=True)
class Form:
    """The dashboard's form fields, and whether its ``token`` may plan."""

    fields: dict[str, str]
    authorized: bool


async def form_body(request: Request, service: ServiceDep) -> AsyncIterator[Form]:
    """The dashboard's form (at most MAX_FORM_BYTES; its token is a field, so
    this small body is read first), then the client's limits (429) when the
    token is good.  A bad token is for the route to answer (a page, 401)."""
    if _media_type(request) != "application/x-www-form-urlencoded":
        raise HTTPException(
            415, "this form accepts application/x-www-form-urlencoded bodies"
        )
    declared = _declared_length(request)
    too_big = f"a form body has at most {MAX_FORM_BYTES} bytes"
    if declared is not None and declared > MAX_FORM_BYTES:
        raise HTTPException(413, too_big)
    size = 0

    def count(chunk: bytes) -> None:
        nonlocal size
        size += len(chunk)
        if size > MAX_FORM_BYTES:
            raise HTTPException(413, too_big)

    raw = await read_body(request, service.settings.body_timeout_s, count)
    try:
        parsed = parse_qs(raw.decode(errors="replace"), max_num_fields=32)
    except ValueError:  # more fields than that
        raise HTTPException(413, "a form has at most 32 fields") from None
    fields = {k: v[0] for k, v in parsed.items() if v}
    token = fields.get("token") or None
    if not token_ok(service.settings, token):
        yield Form(fields, authorized=False)
        return
    guards: Guards = request.app.state.guards
    key = client_key(request, token)
    guards.clients.acquire(key)
    try:
        yield Form(fields, authorized=True)
    finally:
        guards.clients.release(key)


SettingsDep = Annotated[Settings, Depends(get_settings)]
ServiceDep = Annotated[PlannerService, Depends(get_service)]
StoreDep = Annotated[Store, Depends(get_store)]
WriteAccess = Annotated[None, Depends(throttle)]
JsonBody = Annotated[bytes, Depends(json_body)]
FormBody = Annotated[Form, Depends(form_body)]


def json_request_body(model: type[BaseModel]) -> dict[str, Any]:
    """``openapi_extra`` documenting a body the route reads through JsonBody
    (:func:`api.main.create_app` adds the model to the schema's components)."""
    ref = {"$ref": f"#/components/schemas/{model.__name__}"}
    return {
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": ref}},
        }
    }
