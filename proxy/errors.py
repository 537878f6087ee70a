"""OpenAI-shaped errors: what compactd answers when the failure is its own or the upstream's leg."""

from __future__ import annotations

import orjson


class ProxyError(Exception):
    """An error compactd answers itself, with an HTTP status and an OpenAI error body."""

    status = 500
    type = "server_error"
    code = "compactd_error"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class BodyTooLargeError(ProxyError):
    """The request body exceeds `server.max_body_bytes`."""

    status = 413
    type = "invalid_request_error"
    code = "request_too_large"


class HeadersTooLargeError(ProxyError):
    """The request's headers exceed `server.max_header_bytes` or `server.max_headers`."""

    status = 431
    type = "invalid_request_error"
    code = "request_headers_too_large"


class BadPathError(ProxyError):
    """The path cannot be mapped onto the upstream safely."""

    status = 400
    type = "invalid_request_error"
    code = "invalid_path"


class InvalidRequestError(ProxyError):
    """A request to compactd's own API that it cannot act on."""

    status = 400
    type = "invalid_request_error"
    code = "invalid_request"


class NotFoundError(ProxyError):
    """No such compactd route."""

    status = 404
    type = "invalid_request_error"
    code = "not_found"


class MethodNotAllowedError(ProxyError):
    """A compactd route that does not take this method."""

    status = 405
    type = "invalid_request_error"
    code = "method_not_allowed"


class UnauthorizedError(ProxyError):
    """The client's key is not admitted by this gateway."""

    status = 401
    type = "invalid_request_error"
    code = "invalid_api_key"


class StoreUnavailableError(ProxyError):
    """The store did not answer one of compactd's own API calls."""

    status = 503
    type = "server_error"
    code = "store_unavailable"


class UpstreamUnreachableError(ProxyError):
    """The upstream refused or dropped the connection before answering."""

    status = 502
    type = "server_error"
    code = "upstream_unreachable"


class UpstreamBadResponseError(ProxyError):
    """The upstream answered something the transport would not parse (e.g. oversized headers)."""

    status = 502
    type = "server_error"
    code = "upstream_bad_response"


class UpstreamTimeoutError(ProxyError):
    """The upstream did not connect or answer in time."""

    status = 504
    type = "server_error"
    code = "upstream_timeout"


class ResultTooLargeError(ProxyError):
    """What was asked for would make an answer over compactd's limits (uncompress)."""

    status = 413
    type = "invalid_request_error"
    code = "result_too_large"


class WorkTimeoutError(ProxyError):
    """An answer took longer than its deadline to compute (retry with a shorter period)."""

    status = 503
    type = "server_error"
    code = "timeout"


class RequestTimeoutError(ProxyError):
    """The client took too long to send its request's head or body."""

    status = 408
    type = "invalid_request_error"
    code = "request_timeout"


class TooManyConnectionsError(ProxyError):
    """The worker holds as many client connections as it may (`limits.max_connections`)."""

    status = 503
    type = "server_error"
    code = "too_many_connections"


class RateLimitedError(ProxyError):
    """A tenant sent more requests than its rate allows; `retry_after` seconds to wait."""

    status = 429
    type = "rate_limit_error"
    code = "rate_limit_exceeded"

    def __init__(self, message: str, retry_after: int = 1) -> None:
        super().__init__(message)
        self.retry_after = retry_after


def error_body(message: str, type_: str, code: str | None) -> bytes:
    """`{"error": {"message", "type", "param", "code"}}` as OpenAI sends it."""
    return orjson.dumps({"error": {"message": message, "type": type_, "param": None, "code": code}})


def sse_error_event(
    message: str, type_: str = "server_error", code: str = "upstream_error"
) -> bytes:
    """An SSE event the openai SDK raises as APIError; never followed by a fake [DONE]."""
    return b"data: " + error_body(message, type_, code) + b"\n\n"
