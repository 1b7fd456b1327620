"""JSON error bodies for every failure, and the request body size limit.

Every error answer is ``{"error": code, "detail": message[, "errors": [...]]}``
(:class:`api.schemas.ErrorBody`).  Bad input is a 4xx: pydantic's checks and
malformed JSON (422), :class:`~mtf_core.errors.MtfError` ValueErrors from the
graph reader, planner or cost model (422), a body over the limit (413).
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

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
    422: "invalid_request",
    429: "queue_full",
    503: "unavailable",
}


def error_response(
    status: int,
    detail: str,
    error: str | None = None,
    headers: dict[str, str] | None = None,
    errors: list[dict[str, Any]] | None = None,
) -> JSONResponse:
    body: dict[str, Any] = {
        "error": error or _CODES.get(status, "error"),
        "detail": detail,
    }
    if errors is not None:
        body["errors"] = errors
    return JSONResponse(body, status_code=status, headers=headers)


def _snake(name: str) -> str:
    return "".join("_" + c.lower() if c.isupper() else c for c in name).lstrip("_")


def _clean(err: dict[str, Any]) -> dict[str, Any]:
    # Drop the offending input (it may be the whole graph) and ctx (exceptions).
    return {
        "loc": [str(x) for x in err.get("loc", ())],
        "msg": str(err.get("msg", "")),
        "type": str(err.get("type", "")),
    }


async def _validation(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    errors = [_clean(e) for e in exc.errors()]
    parts = [f"{'.'.join(e['loc'])}: {e['msg']}" for e in errors[:5]]
    more = f" (and {len(errors) - 5} more)" if len(errors) > 5 else ""
    return error_response(422, "; ".join(parts) + more, errors=errors)


async def _mtf_error(request: Request, exc: Exception) -> JSONResponse:
    if isinstance(exc, ValueError):
        return error_response(422, str(exc), error=_snake(type(exc).__name__))
    log.exception("unexpected %s", type(exc).__name__)
    return error_response(500, f"{type(exc).__name__}: {exc}", error="internal_error")


async def _http(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    headers = dict(exc.headers) if exc.headers else None
    return error_response(exc.status_code, str(exc.detail), headers=headers)


async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
    log.exception("unhandled error on %s %s", request.method, request.url.path)
    return error_response(500, f"{type(exc).__name__}: {exc}", error="internal_error")


def install_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(RequestValidationError, _validation)
    app.add_exception_handler(MtfError, _mtf_error)
    app.add_exception_handler(StarletteHTTPException, _http)
    app.add_exception_handler(Exception, _unexpected)


class BodySizeLimit:
    """Answers 413 for a request body over ``max_bytes`` (by Content-Length
    before reading, or while reading a chunked body), before any parsing."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        length = dict(scope.get("headers", ())).get(b"content-length")
        if length is not None:
            try:
                too_big = int(length) > self.max_bytes
            except ValueError:
                await self._reject(scope, receive, send, 400, "bad Content-Length")
                return
            if too_big:
                await self._reject(
                    scope, receive, send, 413, self._message(int(length))
                )
                return
            await self.app(scope, receive, send)
            return
        # No length given: read (up to the limit) before the app sees anything.
        messages: list[Message] = []
        total = 0
        while True:
            message = await receive()
            messages.append(message)
            if message["type"] != "http.request":
                break
            total += len(message.get("body", b""))
            if total > self.max_bytes:
                await self._reject(scope, receive, send, 413, self._message(total))
                return
            if not message.get("more_body", False):
                break

        async def replay() -> Message:
            return messages.pop(0) if messages else await receive()

        await self.app(scope, replay, send)

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
