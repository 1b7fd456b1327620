"""JSON error bodies for every failure, and the request body size limit.

Every error answer is ``{"error": code, "detail": message[, "errors": [...]]}``
(:class:`api.schemas.ErrorBody`).  Bad input is a 4xx: pydantic's checks and
malformed JSON (422), :class:`~mtf_core.errors.MtfError` ValueErrors from the
graph reader, planner or cost model (422), a body over the limit (413), a
client over its limits (429).  A 500 is our bug: its body says only
``internal_error`` and an ``error_id``; the log has the traceback under that
id.  Nothing of an exception's class or message reaches a 5xx body.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Mapping
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from api.limits import LimitExceeded
from api.store.base import StoreUnavailable
from mtf_core.errors import MtfError

log = logging.getLogger(__name__)

_CODES = {
    400: "bad_request",
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    409: "conflict",
    413: "payload_too_large",
    415: "unsupported_media_type",
    422: "invalid_request",
    429: "too_many_requests",
    503: "unavailable",
}


def error_response(
    status: int,
    detail: str,
    error: str | None = None,
    headers: dict[str, str] | None = None,
    errors: list[dict[str, Any]] | None = None,
    error_id: str | None = None,
) -> JSONResponse:
    body: dict[str, Any] = {
        "error": error or _CODES.get(status, "error"),
        "detail": detail,
    }
    if errors is not None:
        body["errors"] = errors
    if error_id is not None:
        body["error_id"] = error_id
    return JSONResponse(body, status_code=status, headers=headers)


def opaque_error(
    status: int,
    public_detail: str,
    exc: BaseException,
    where: str,
    error: str | None = None,
    headers: dict[str, str] | None = None,
) -> JSONResponse:
    """A 5xx whose body says ``public_detail`` and an error id, never the
    exception; the log gets the id, ``where`` and the traceback."""
    error_id = uuid.uuid4().hex[:16]
    log.error("error id %s: %s", error_id, where, exc_info=exc)
    return error_response(
        status,
        f"{public_detail} (error id {error_id}; the service log has the details)",
        error=error or ("internal_error" if status == 500 else None),
        headers=headers,
        error_id=error_id,
    )


#: The most characters of a client's id an answer echoes (not 10 KB of it).
SHOWN_CHARS = 200


def quoted(ident: str) -> str:
    """``repr(ident)`` for an answer that names what a client asked for,
    cut after :data:`SHOWN_CHARS` characters."""
    if len(ident) <= SHOWN_CHARS:
        return repr(ident)
    return f"{ident[:SHOWN_CHARS]!r}... ({len(ident):,} characters)"


def _snake(name: str) -> str:
    return "".join("_" + c.lower() if c.isupper() else c for c in name).lstrip("_")


def clean_validation_error(err: Mapping[str, Any]) -> dict[str, Any]:
    """One pydantic error as the API reports it: its location, its message
    with the offending value where short, its type."""
    # Drop ctx (exceptions) and any offending input but a short scalar (it
    # may be the whole graph): the message names the value when it can.
    msg = str(err.get("msg", ""))
    value = err.get("input")
    if isinstance(value, bool | int | float | str) and len(repr(value)) <= 80:
        msg += f" (got {value!r})"
    return {
        "loc": [str(x) for x in err.get("loc", ())],
        "msg": msg,
        "type": str(err.get("type", "")),
    }


async def _validation(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    errors = [clean_validation_error(e) for e in exc.errors()]
    parts = [f"{'.'.join(e['loc'])}: {e['msg']}" for e in errors[:5]]
    more = f" (and {len(errors) - 5} more)" if len(errors) > 5 else ""
    return error_response(422, "; ".join(parts) + more, errors=errors)


def _where(request: Request) -> str:
    return f"{request.method} {request.url.path}"


async def _mtf_error(request: Request, exc: Exception) -> JSONResponse:
    if isinstance(exc, ValueError):
        return error_response(422, str(exc), error=_snake(type(exc).__name__))
    return opaque_error(500, "internal error", exc, _where(request))


async def _limit(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, LimitExceeded)
    headers = {"Retry-After": exc.retry_after} if exc.status in (429, 503) else None
    error = "request_too_complex" if exc.status == 422 else None
    return error_response(exc.status, str(exc), error=error, headers=headers)


async def _http(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    headers = dict(exc.headers) if exc.headers else None
    if exc.status_code >= 500:
        return opaque_error(exc.status_code, "unavailable", exc, _where(request))
    return error_response(exc.status_code, str(exc.detail), headers=headers)


async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
    return opaque_error(500, "internal error", exc, _where(request))


async def _store_unavailable(request: Request, exc: Exception) -> JSONResponse:
    # The database pool was exhausted or the database did not answer: a
    # moment's overload, not a client's mistake nor a permanent failure.
    assert isinstance(exc, StoreUnavailable)
    return error_response(
        503,
        str(exc),
        error="store_unavailable",
        headers={"Retry-After": str(exc.retry_after_s)},
    )


def install_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(StoreUnavailable, _store_unavailable)
    app.add_exception_handler(RequestValidationError, _validation)
    app.add_exception_handler(LimitExceeded, _limit)
    app.add_exception_handler(MtfError, _mtf_error)
    app.add_exception_handler(StarletteHTTPException, _http)
    app.add_exception_handler(Exception, _unexpected)


class NoNulInUrl:
    """The JSON API's answer to a NUL character (``%00``) in a path (404: no
    id has one) or a query string (422), before any route: PostgreSQL cannot
    even compare a NUL (``GET /v1/plans/%00`` was a 500 there).  The
    dashboard's pages answer their own 404 page (:mod:`api.routes.dashboard`)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path: str = scope.get("path", "")
        if scope["type"] == "http" and path.startswith("/v1/"):
            query: bytes = scope.get("query_string", b"")
            answer = None
            if "\x00" in path:
                answer = error_response(
                    404,
                    "the request's path has a NUL character (%00); there is no "
                    "resource with one (expected an id without NUL)",
                    headers={"Connection": "close"},  # any body is left unread
                )
            elif b"%00" in query or b"\x00" in query:
                answer = error_response(
                    422,
                    "the request's query string has a NUL character (%00); "
                    "expected values without NUL",
                    headers={"Connection": "close"},
                )
            if answer is not None:
                await answer(scope, receive, send)
                return
        await self.app(scope, receive, send)


class BodySizeLimit:
    """Answers 413 for a request body over ``max_bytes``: by Content-Length
    before anything is read, else (a chunked body) as soon as the bytes read
    pass the limit.  Nothing is buffered here: the body is read by the route,
    after its token and limits are checked (:mod:`api.deps`)."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        length = dict(scope.get("headers", ())).get(b"content-length")
        if length is not None:
            if not length.isdigit():
                await self._reject(scope, receive, send, 400, "bad Content-Length")
                return
            if int(length) > self.max_bytes:
                await self._reject(
                    scope, receive, send, 413, self._message(int(length))
                )
                return
            await self.app(scope, receive, send)
            return
        total = 0

        async def counted() -> Message:
            nonlocal total
            message = await receive()
            if message["type"] == "http.request":
                total += len(message.get("body", b""))
                if total > self.max_bytes:
                    # Raised inside the route's read: its handler answers 413.
                    raise StarletteHTTPException(
                        413, self._message(total), headers={"Connection": "close"}
                    )
            return message

        await self.app(scope, counted, send)

    def _message(self, n: int) -> str:
        return (
            f"request body has {n} bytes or more; this service accepts at most "
            f"{self.max_bytes} bytes (max_body_bytes)"
        )

    async def _reject(
        self, scope: Scope, receive: Receive, send: Send, status: int, detail: str
    ) -> None:
        await error_response(status, detail, headers={"Connection": "close"})(
            scope, receive, send
        )
