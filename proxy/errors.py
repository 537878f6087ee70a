"""Every exception compactd raises on purpose, in one tree under `CompactdError`.

Standard library only, so every layer may import it (it sits below `runtime` in the layer
contract) and the plugin API can re-export `OptionError` without a dependency. A class keeps
the standard-library base its callers catch it by (`ConfigError` is a `ValueError`,
`ChainTimeoutError` a `TimeoutError` …).

```text
CompactdError
├── ProxyError                  answered by compactd itself: HTTP status + OpenAI error body
│   ├── BodyTooLargeError          413  request_too_large
│   ├── HeadersTooLargeError       431  request_headers_too_large
│   ├── BadPathError               400  invalid_path
│   ├── InvalidRequestError        400  invalid_request
│   ├── NotFoundError              404  not_found
│   ├── MethodNotAllowedError      405  method_not_allowed
│   ├── UnauthorizedError          401  invalid_api_key
│   ├── ResultTooLargeError        413  result_too_large
│   ├── RequestTimeoutError        408  request_timeout
│   ├── RateLimitedError           429  rate_limit_exceeded
│   ├── StoreUnavailableError      503  store_unavailable
│   ├── WorkTimeoutError           503  timeout
│   ├── TooManyConnectionsError    503  too_many_connections
│   ├── UpstreamUnreachableError   502  upstream_unreachable
│   ├── UpstreamBadResponseError   502  upstream_bad_response
│   └── UpstreamTimeoutError       504  upstream_timeout
├── ConfigError (ValueError)    the settings cannot start a server; `problems`: each one
│   └── OptionError             one setting or provider option, named by its `key`
├── StoreError                  the store could not do what was asked
│   ├── TenantMismatchError        a value read back is another tenant's
│   ├── UnreadableValueError       a stored value does not decode
│   └── QuotaExceededError         the tenant is over `limits.tenant_quota_mb`
├── ProviderError               the providers: loading them, running the chain, restoring
│   ├── ProviderLoadError (RuntimeError)
│   ├── ChainTimeoutError (TimeoutError)
│   ├── CompletionError (RuntimeError)     an LLM call made for a provider failed
│   └── RestoreTooLargeError (ValueError)  an uncompress would pass its bounds
├── ChatError                   this request is not compacted (it is forwarded as sent)
│   ├── CompactionError (ValueError)       the chain's result cannot stand for the originals
│   ├── TooManyMessagesError
│   └── WideIntegerError                   an integer beyond 64 bits
├── ClientDisconnectedError     the client went away before the request finished
├── EncodingUnavailableError (RuntimeError)
├── StatsTimeoutError           savings took longer than their deadline
├── AllocatorError (RuntimeError)
└── CommandError                a CLI command cannot do what was asked
    └── LineError (ValueError)     one line of `compactd compress` input
```

Only `ProxyError`s reach a client as themselves (`proxy.wire.asgi.error_body`); the others are
turned into one where the layer that knows the answer catches them, or fail open around
compaction (`x-compactd-action: error`, with the reason).
"""

from __future__ import annotations


class CompactdError(Exception):
    """The root: every error compactd raises on purpose (see the tree above)."""


# --- answered over HTTP -----------------------------------------------------------------------


class ProxyError(CompactdError):
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


# --- configuration -----------------------------------------------------------------------------


class ConfigError(CompactdError, ValueError):
    """A setting is unknown or invalid; the message names the key (`problems`: each one)."""

    def __init__(self, message: str, problems: list[str] | None = None) -> None:
        super().__init__(message)
        self.problems = problems or [message]


class OptionError(ConfigError):
    """A setting or a provider's option is unknown or has the wrong type or value; `key` names
    it, `why` says what is wrong."""

    def __init__(self, key: str, why: str) -> None:
        super().__init__(f"{key}: {why}")
        self.key = key
        self.why = why


# --- the store ---------------------------------------------------------------------------------


class StoreError(CompactdError):
    """The store could not do what was asked (down, timed out, inconsistent)."""


class TenantMismatchError(StoreError):
    """A value read back belongs to another tenant; never returned to the caller."""


class UnreadableValueError(StoreError):
    """A stored value does not decode (corrupt, truncated or of an unknown shape)."""


class QuotaExceededError(StoreError):
    """The tenant's stored data is over `limits.tenant_quota_mb`: nothing more is stored."""


# --- providers ---------------------------------------------------------------------------------


class ProviderError(CompactdError):
    """A provider could not be loaded, run or restored from."""


class ProviderLoadError(ProviderError, RuntimeError):
    """An enabled provider is unknown or could not be loaded or instantiated."""


class ChainTimeoutError(ProviderError, TimeoutError):
    """The chain ran past its deadline; `provider` was running (or about to)."""

    def __init__(self, provider: str, seconds: float) -> None:
        super().__init__(f"provider {provider or '(none)'} still running after {seconds:g} s")
        self.provider = provider


class CompletionError(ProviderError, RuntimeError):
    """An LLM call made on behalf of a provider failed."""


class RestoreTooLargeError(ProviderError, ValueError):
    """A restore (uncompress) would pass its bounds (messages or bytes)."""


# --- one chat request --------------------------------------------------------------------------


class ChatError(CompactdError):
    """This request is not compacted; the fail-open boundary forwards it as sent."""


class CompactionError(ChatError, ValueError):
    """A chain's result cannot be recorded as a checkpoint that stands for the originals."""


class TooManyMessagesError(ChatError):
    """The request has more than `MAX_MESSAGES` messages: too many to compact (fails open)."""


class WideIntegerError(ChatError):
    """The request holds an integer beyond 64 bits: a rewrite could not carry it exactly."""


# --- the rest, one layer each ------------------------------------------------------------------


class ClientDisconnectedError(CompactdError):
    """The client went away before the request finished."""


class EncodingUnavailableError(CompactdError, RuntimeError):
    """An encoding could not be loaded from the packaged copy or the cache."""


class StatsTimeoutError(CompactdError):
    """Savings took longer than their deadline to compute (the answer is a 503)."""


class AllocatorError(CompactdError, RuntimeError):
    """`server.allocator = "jemalloc"` but no jemalloc library can be found."""


class CommandError(CompactdError):
    """A command cannot do what was asked; `main` prints the message as one line."""


class LineError(CommandError, ValueError):
    """A line that cannot be compressed; reported on its own output line."""
