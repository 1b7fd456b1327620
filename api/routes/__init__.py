"""One router per resource; :mod:`api.main` wires them."""

from api.schemas import ErrorBody


#: OpenAPI entries for the error answers a route can give.
def error_responses(*codes: int) -> dict[int | str, dict[str, object]]:
    described = {
        400: "The body could not be read (not UTF-8 text, a bad Content-Length).",
        401: "An endpoint that costs CPU or memory, without a valid API token.",
        404: "No such resource.",
        409: "The job has finished or is not on this replica.",
        413: "The request body is over max_body_bytes.",
        415: "The body is not JSON (Content-Type application/json).",
        422: "The request is malformed or asks for something invalid.",
        429: "This client is over its concurrency or rate limit, or the job "
        "queue is full; retry after Retry-After seconds.",
        503: "The service is busy or the solve failed for a reason that is not "
        "the request's (the body has an error id, never the cause); retry "
        "after Retry-After seconds.",
    }
    return {c: {"model": ErrorBody, "description": described[c]} for c in codes}
