"""Structured JSON log lines on stderr, with secrets masked on every handler.

Redaction is a filter, not a convention: it runs on every record that reaches any handler (ours,
uvicorn's, httpx's, aiohttp's), so an `Authorization` header or a `?key=` query string that some
library decides to log is masked before it is written. Message contents are never logged at info.
"""

from __future__ import annotations

import logging
import re
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from datetime import UTC, datetime
from typing import Any, TextIO

import orjson

REQUEST_LOGGER = "compactd.request"
ACCESS_LOGGER = "compactd.access"
MASK = "***"

# Loggers of the libraries we run under; their own handlers are replaced by ours so every line
# on stderr is one JSON object that went through the redaction filter.
ADOPTED_LOGGERS = (
    "uvicorn",
    "uvicorn.error",
    "uvicorn.access",
    "httpx",
    "httpcore",
    "aiohttp",
    "aiohttp.access",
    "aiohttp.client",
    "aiohttp.server",
    "redis",
)
# httpx/httpcore log every upstream call at info; our request line already says it.
_CHATTY = ("httpx", "httpcore")

_PATTERNS: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"(?i)\b(bearer|basic)(\s+)[A-Za-z0-9._~+/=\-*]+"), rf"\1\2{MASK}"),
    (
        re.compile(r"""(?i)(authorization['"]?\s*[:=]\s*['"]?)(?!bearer\b|basic\b)[^\s'",;}]+"""),
        rf"\1{MASK}",
    ),
    (
        re.compile(r"""(?i)((?:x-)?api[-_]?key['"]?\s*[:=]\s*['"]?)[^\s'",;}&]+"""),
        rf"\1{MASK}",
    ),
    (re.compile(r"\bsk-[A-Za-z0-9_\-]{4,}"), f"sk-{MASK}"),
    (
        re.compile(r"""(?i)([?&](?:key|api[-_]?key|access_token|token|sig)=)[^&\s'"#]+"""),
        rf"\1{MASK}",
    ),
)
# Cheap substring checks first: the regexes run only on text that could hold a credential.
_TRIGGERS = (
    *("bearer", "basic", "authorization", "api-key", "api_key", "apikey"),
    *("key=", "sk-", "token=", "sig="),
)

_STANDARD_ATTRS = frozenset(
    logging.LogRecord("", 0, "", 0, "", None, None).__dict__.keys() | {"message", "asctime"}
)
# uvicorn adds the message again with ANSI colour codes for terminals; JSON has no use for it.
_DROPPED_EXTRAS = frozenset({"color_message"})


def redact(text: str) -> str:
    """`text` with credentials (bearer tokens, api keys, sk-… keys, ?key= values) masked."""
    lower = text.lower()
    if not any(t in lower for t in _TRIGGERS):
        return text
    for pattern, repl in _PATTERNS:
        text = pattern.sub(repl, text)
    return text


def _redact_value(value: Any) -> Any:
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, bytes):
        return redact(value.decode("utf-8", "replace"))
    if isinstance(value, Mapping):
        return {k: _redact_value(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_redact_value(v) for v in value]
    if isinstance(value, tuple):
        return tuple(_redact_value(v) for v in value)
    return value


def _redact_message(record: logging.LogRecord) -> None:
    # Arguments first, then the formatted message: redacting the template alone could eat a
    # `%s` placeholder (`?key=%s`) and break formatting.
    if isinstance(record.args, tuple):
        record.args = tuple(_redact_value(a) for a in record.args)
    elif isinstance(record.args, Mapping):
        record.args = {k: _redact_value(v) for k, v in record.args.items()}
    try:
        message = record.getMessage()
    except (TypeError, ValueError, KeyError):
        return  # malformed call: logging reports it when formatting
    clean = redact(message)
    if clean != message:
        record.msg, record.args = clean, None


class RedactingFilter(logging.Filter):
    """Masks credentials in a record's message, arguments, extras and exception text."""

    def filter(self, record: logging.LogRecord) -> bool:
        """Rewrite the record in place; never drops it."""
        _redact_message(record)
        for key, value in record.__dict__.items():
            if key not in _STANDARD_ATTRS and isinstance(value, str):
                record.__dict__[key] = redact(value)
        if record.exc_info and not record.exc_text:
            record.exc_text = redact(logging.Formatter().formatException(record.exc_info))
        return True


def _redacting_factory(inner: Callable[..., logging.LogRecord]) -> Callable[..., logging.LogRecord]:
    def factory(*args: Any, **kwargs: Any) -> logging.LogRecord:
        record = inner(*args, **kwargs)
        _redact_message(record)
        return record

    factory.compactd = True  # type: ignore[attr-defined]
    return factory


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ts, level, logger, msg, then any `extra` fields."""

    def format(self, record: logging.LogRecord) -> str:
        """Serialize the record (already redacted by the filter; redacted again as a whole)."""
        line: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key, value in record.__dict__.items():
            if key not in _STANDARD_ATTRS and key not in line and key not in _DROPPED_EXTRAS:
                line[key] = value
        if record.exc_info and not record.exc_text:
            record.exc_text = self.formatException(record.exc_info)
        if record.exc_text:
            line["exc"] = record.exc_text
        return redact(orjson.dumps(line, default=str).decode())


def configure_logging(level: str = "info", stream: TextIO | None = None) -> None:
    """Send every log record to `stream` (stderr) as redacted JSON lines; safe to call again."""
    root = logging.getLogger()
    for handler in list(root.handlers):
        if getattr(handler, "compactd", False):
            root.removeHandler(handler)
    handler = logging.StreamHandler(stream if stream is not None else sys.stderr)
    handler.compactd = True  # type: ignore[attr-defined]
    handler.setFormatter(JsonFormatter())
    handler.addFilter(RedactingFilter())
    root.addHandler(handler)
    root.setLevel(level.upper())
    # Handlers added later (by a library, a test harness) never saw the filter; masking the
    # message when the record is created covers them too.
    factory = logging.getLogRecordFactory()
    if not getattr(factory, "compactd", False):
        logging.setLogRecordFactory(_redacting_factory(factory))
    for name in ADOPTED_LOGGERS:
        logger = logging.getLogger(name)
        for own in list(logger.handlers):
            logger.removeHandler(own)
        logger.propagate = True
        logger.setLevel(logging.NOTSET)
    quiet = max(logging.WARNING, root.level)
    for name in _CHATTY:
        logging.getLogger(name).setLevel(quiet)
    # Any other handler already installed (a library's, a test's) gets the filter too.
    redacting = RedactingFilter()
    for known in logging.root.manager.loggerDict.values():
        if isinstance(known, logging.Logger):
            for other in known.handlers:
                if not any(isinstance(f, RedactingFilter) for f in other.filters):
                    other.addFilter(redacting)


def mute_uvicorn_access() -> None:
    """Turn uvicorn's own per-request line off again, as `access_log=False` asks.

    uvicorn does this (no handlers, no propagation) before it loads the app; a worker then
    builds the app through the factory, whose `configure_logging` adopts `uvicorn.access` into
    the root handler again. Every request of every worker would then write a second line,
    `uvicorn.access`, besides ours (measured: ~13 % more CPU per request with two workers)."""
    access = logging.getLogger("uvicorn.access")
    for own in list(access.handlers):
        access.removeHandler(own)
    access.propagate = False


def request_log(
    *,
    request_id: str,
    tenant: str | None,
    model: str | None,
    policy: str | None,
    action: str,
    tokens_before: int | None = None,
    tokens_after: int | None = None,
    upstream_status: int | None = None,
    overhead_ms: float | None = None,
    ttfb_ms: float | None = None,
    error: str | None = None,
    conversation: str | None = None,
    prompt_tokens: int | None = None,
    cached_tokens: int | None = None,
    completion_tokens: int | None = None,
) -> dict[str, Any]:
    """The fields of one request's log line (`tenant` is the key fingerprint, never the key)."""
    return {
        "request_id": request_id,
        "tenant": tenant,
        "model": model,
        "policy": policy,
        "action": action,
        "tokens_before": tokens_before,
        "tokens_after": tokens_after,
        "upstream_status": upstream_status,
        "overhead_ms": None if overhead_ms is None else round(overhead_ms, 3),
        "ttfb_ms": None if ttfb_ms is None else round(ttfb_ms, 3),
        "error": error,
        "conversation": conversation,
        "prompt_tokens": prompt_tokens,
        "cached_tokens": cached_tokens,
        "completion_tokens": completion_tokens,
    }


# The HTTP exchange being served (method, route class, status, start time), set by the app for
# each request: a chat request's own line carries these too, and no second, access-only line
# is written for it.
_ACCESS: ContextVar[dict[str, Any] | None] = ContextVar("compactd_access", default=None)


@contextmanager
def access_context(fields: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Make `fields` (method, route, started: a perf_counter reading) the current request's
    access fields; the app fills in `status` when the response starts."""
    token = _ACCESS.set(fields)
    try:
        yield fields
    finally:
        _ACCESS.reset(token)


def _access_fields(access: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "method": access["method"],
        "route": access["route"],
        "status": access.get("status"),
        "duration_ms": round((time.perf_counter() - access["started"]) * 1000, 3),
    }


def log_request(entry: Mapping[str, Any], level: int = logging.INFO) -> None:
    """Write one request's line (built by `request_log`) to the `compactd.request` logger."""
    fields = dict(entry)
    access = _ACCESS.get()
    if access is not None:
        access["logged"] = True
        fields.update(_access_fields(access))
    logging.getLogger(REQUEST_LOGGER).log(level, "request", extra=fields)


def log_access(access: Mapping[str, Any], path: str) -> None:
    """The line for a request that wrote no `compactd.request` line of its own."""
    if access.get("logged"):
        return
    fields = {**_access_fields(access), "path": path}
    logging.getLogger(ACCESS_LOGGER).info("request", extra=fields)
