"""One router per resource; :mod:`api.main` wires them."""

from api.schemas import ErrorBody


#: OpenAPI entries for the error answers a route can give.
def error_responses(*codes: int) -> dict[int | str, dict[str, object]]:
    described = {
        400: "The body could not be read (not UTF-8 text, a bad Content-Length).",
        401: "A write endpoint without a valid API token.",
        404: "No such resource.",
        409: "The job has finished or is not on this replica.",
        413: "The request body is over max_body_bytes.",
        422: "The request is malformed or asks for something invalid.",
        429: "The job queue is full; retry after Retry-After seconds.",
        503: "The solve failed for a reason that is not the request's.",
    }
    return {c: {"model": ErrorBody, "description": described[c]} for c in codes}
