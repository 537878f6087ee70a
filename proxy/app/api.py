"""compactd's own HTTP API: health, metrics, conversations, restore, stats."""

from __future__ import annotations

import asyncio
import hmac
import logging
from collections.abc import Callable, Mapping
from datetime import UTC, date, datetime, timedelta
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from proxy.app.services import Services
from proxy.app.views import conversation_json, conversation_list
from proxy.chat.refscope import find_scope
from proxy.chat.request import CONVERSATION_HEADER
from proxy.dialects import restore
from proxy.errors import (
    BodyTooLargeError,
    InvalidRequestError,
    NotFoundError,
    ProxyError,
    RateLimitedError,
    RestoreTooLargeError,
    ResultTooLargeError,
    StoreError,
    StoreUnavailableError,
    UnauthorizedError,
)
from proxy.providers.uncompress import Bounds
from proxy.providers.uncompress import uncompress as uncompress_messages
from proxy.store.base import ConversationInfo
from proxy.telemetry.stats import GROUP_BY, GroupBy, parse_since, period_json
from proxy.wire.asgi import error_body
from proxy.wire.tenant import credential
from proxy.wire.upstream_keys import admitted

log = logging.getLogger("compactd.api")


class _Json(Response):
    media_type = "application/json"

    def render(self, content: Any) -> bytes:
        return orjson.dumps(content)


def _error(exc: ProxyError) -> Response:
    return Response(
        error_body(exc.message, exc.type, exc.code), exc.status, media_type="application/json"
    )


def _services(request: Request) -> Services:
    services: Services = request.app.state.services
    return services


def _caller(request: Request, services: Services) -> str | None:
    """The caller's tenant; None for the admin key (sees every tenant).

    Raises 401 for a request without a credential, unless the shared anonymous tenant is on.
    """
    found = credential(request.headers, services.tenancy.headers)
    admin = services.settings.server.admin_key
    if admin and found is not None and hmac.compare_digest(found.encode(), admin.encode()):
        return None
    if not admitted(services.settings.upstream, services.secret, found):
        # Upstream-key mode: compactd's own API is gated as chat is (same key ids, same 401).
        raise UnauthorizedError("This API key is not admitted by the gateway.")
    tenant = services.tenancy.identify(request.headers).tenant
    if tenant is None:
        raise UnauthorizedError(
            "Send the API key whose conversations you want (Authorization, api-key or x-api-key)."
        )
    if services.api_rate is not None:
        try:
            services.api_rate.check(tenant, "limits.api_rate_per_minute")
        except RateLimitedError:
            services.metrics.rate_limited("api")
            raise
    return tenant


async def _proxy_error(request: Request, exc: Exception) -> Response:
    del request
    assert isinstance(exc, ProxyError)
    response = _error(exc)
    if isinstance(exc, RateLimitedError):
        response.headers["retry-after"] = str(exc.retry_after)
    return response


async def _store_error(request: Request, exc: Exception) -> Response:
    """The store is down or slow: an OpenAI-shaped 503 the client can retry, not a plain 500."""
    log.warning("store unavailable for %s: %s", request.url.path, type(exc).__name__)
    response = _error(StoreUnavailableError("The store is unavailable; retry shortly."))
    response.headers["retry-after"] = "1"
    return response


EXCEPTION_HANDLERS = {ProxyError: _proxy_error, StoreError: _store_error}
"""For the router: compactd's own errors and store failures as OpenAI-shaped responses."""


async def healthz(request: Request) -> Response:
    """Liveness: the process answers."""
    del request
    return JSONResponse({"status": "ok"})


async def readyz(request: Request) -> Response:
    """Readiness: the lifespan finished; the store's state is reported (we fail open without it)."""
    services: Services | None = getattr(request.app.state, "services", None)
    if services is None:
        return JSONResponse({"status": "starting"}, status_code=503)
    try:
        await services.store.ping()
        store = "ok"
    except StoreError:
        store = "unavailable"
    warnings = await services.store_warnings.current()
    return JSONResponse({"status": "ready", "store": store, "store_warnings": warnings})


async def metrics(request: Request) -> Response:
    """Prometheus exposition."""
    services = _services(request)
    services.caches.update()  # this worker's caches as they are now
    body, content_type = services.metrics.render()
    return Response(body, media_type=content_type)


ACTIVITY_LIMIT = 1000
"""The most recently active conversations a listing reads the activity of."""


async def list_conversations(request: Request) -> Response:
    """Conversations visible to the caller, with sizes, API, model and tokens: most recently
    used first, a page at a time (`limit`, at most limits.list_page_size; `after`: the `next`
    of the page before); `?all=true` adds those that never compacted."""
    services = _services(request)
    tenant = _caller(request, services)
    most = services.settings.limits.list_page_size
    try:
        limit = int(request.query_params.get("limit", most))
        after = page_key(request.query_params.get("after"))
    except ValueError:
        raise InvalidRequestError(
            f"limit must be 1..{most}; after must be the `next` of the page before"
        ) from None
    if not 0 < limit <= most:
        raise InvalidRequestError(f"limit must be 1..{most} (limits.list_page_size)")
    every = request.query_params.get("all", "").lower() in ("1", "true", "yes")
    infos = await services.store.list_conversations(tenant)
    activity = await services.store.activity(tenant, ACTIVITY_LIMIT)
    rows = sorted(conversation_list(infos, activity, every=every), key=_order)
    if after is not None:
        rows = [r for r in rows if _order(r) > after]
    page, more = rows[:limit], len(rows) > limit
    return _Json({"data": page, "has_more": more, "next": _cursor(page[-1]) if more else None})


def _order(row: Mapping[str, Any]) -> tuple[float, str, str]:
    """Most recently used first; ties by tenant and id, so a cursor is a position."""
    return (-float(row["updated_at"]), str(row["tenant"]), str(row["conversation"]))


def _cursor(row: Mapping[str, Any]) -> str:
    return f"{float(row['updated_at'])!r}:{row['tenant']}:{row['conversation']}"


def page_key(cursor: str | None) -> tuple[float, str, str] | None:
    """The sort key a `next` cursor stands for (ValueError if it is not one)."""
    if cursor is None:
        return None
    updated, tenant, conversation = cursor.split(":", 2)
    return (-float(updated), tenant, conversation)


def _owner(request: Request, services: Services) -> str | None:
    """Whose `{conv}` the path means: the caller's own, or for the admin key the `tenant` query
    parameter's, if given (an id is a digest of how a conversation starts, so two tenants can
    have the same one). A client naming another tenant is told there is no such conversation."""
    tenant = _caller(request, services)
    chosen = request.query_params.get("tenant")
    if chosen is None or chosen == tenant:
        return tenant
    if tenant is None:
        return chosen
    raise NotFoundError("No such conversation.")


async def visible_conversation(request: Request, services: Services) -> ConversationInfo:
    """The `{conv}` of the path, if the caller may see it; else 404 (never "not yours")."""
    tenant = _owner(request, services)
    try:
        info = await services.store.get_conversation(tenant, request.path_params["conv"])
    except ValueError:
        info = None
    if info is None:
        raise NotFoundError("No such conversation.")
    return info


def grouping(request: Request, max_days: int) -> tuple[GroupBy, date]:
    """`by` and `since` of a stats query (InvalidRequestError if either is bad, or `since` is
    more than `max_days` ago: the answer's size and cost grow with the days)."""
    by = request.query_params.get("by", "policy")
    try:
        if by not in GROUP_BY:
            raise ValueError(f"by must be one of {', '.join(GROUP_BY)}")  # noqa: TRY301
        since = parse_since(request.query_params.get("since", "7d"))
    except (ValueError, OverflowError) as exc:
        raise InvalidRequestError(str(exc)) from None
    earliest = datetime.now(UTC).date() - timedelta(days=max_days)
    if since < earliest:
        raise InvalidRequestError(
            f"since reaches back more than {max_days} days (limits.stats_max_days):"
            f" the earliest is {earliest.isoformat()}"
        )
    return by, since


async def get_conversation(request: Request) -> Response:
    """One conversation: metadata, checkpoints and originals (the caller's own only)."""
    info = await visible_conversation(request, _services(request))
    return _Json(conversation_json(info))


async def purge_conversation(request: Request) -> Response:
    """Delete a conversation and what only it references (data-subject requests)."""
    services = _services(request)
    tenant = _owner(request, services)
    try:
        deleted = await services.store.purge(tenant, request.path_params["conv"])
    except ValueError:
        deleted = False
    if not deleted:
        return _error(NotFoundError("No such conversation."))
    return _Json({"deleted": True, "id": request.path_params["conv"]})


async def uncompress(request: Request) -> Response:
    """Restore compacted messages from the originals of the conversation they were sent in.

    The conversation is the body's `conversation`, else the `x-compactd-conversation-id`
    header, else the one the messages start (as for chat); only its refs resolve, and the
    answer is bounded (`limits.uncompress_*`: 413 past them)."""
    services = _services(request)
    owner = _owner(request, services)
    raw = await _bounded_body(request, services.settings.server.max_api_body_bytes)
    try:
        body = orjson.loads(raw)
        # Each API's own shape in and out (proxy.dialects.restore); chat messages by default.
        api, messages = restore.read(body)
        recursive = bool(body.get("recursive", False))
        named = body.get("conversation")
        if named is not None and not isinstance(named, str):
            raise TypeError(restore.USAGE)  # noqa: TRY301
    except (orjson.JSONDecodeError, TypeError):
        return _error(InvalidRequestError(restore.USAGE))
    named = named or request.headers.get(CONVERSATION_HEADER)
    conversation, scope = await find_scope(services.store, owner, named, messages, services.secret)
    limits = services.settings.limits
    bounds = Bounds(
        max_messages=limits.uncompress_max_messages,
        max_bytes=limits.uncompress_max_bytes,
        max_depth=limits.uncompress_max_depth,
        refs_of=scope.refs_of,
    )
    try:
        result = await asyncio.to_thread(
            uncompress_messages, messages, scope.lookup, recursive, bounds
        )
    except RestoreTooLargeError as exc:
        raise ResultTooLargeError(
            f"Restoring these messages would pass compactd's limits ({exc}); restore fewer"
            " messages at once, or without `recursive`."
        ) from None
    return _Json(
        {
            **restore.write(api, result.messages, body),
            "conversation": conversation,
            "messages_expanded": result.messages_expanded,
            "messages_passthrough": result.messages_passthrough,
            "missing_ids": list(result.missing_ids),
        }
    )


async def _bounded_body(request: Request, limit: int) -> bytes:
    """The request body, refused with 413 past `limit` bytes before more is buffered."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise BodyTooLargeError(f"Request body exceeds the limit of {limit} bytes.")
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise BodyTooLargeError(f"Request body exceeds the limit of {limit} bytes.")
        chunks.append(chunk)
    return b"".join(chunks)


async def stats(request: Request) -> Response:
    """Accounting (admin key only)."""
    services = _services(request)
    if _caller(request, services) is not None:
        return _error(UnauthorizedError("Stats need the admin key."))
    _, body = await usage_answer(request, services, None, period_json)
    return _Json(body)


async def usage_answer(
    request: Request, services: Services, tenant: str | None, compute: Callable[..., Any]
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """(the usage rows of the query's period, `compute` of them): the period checked, this
    worker's latest counts flushed, and the work done off the event loop within its deadline."""
    limits = services.settings.limits
    by, since = grouping(request, limits.stats_max_days)
    if services.accountant is not None:
        await services.accountant.flush()  # this worker's latest counts, not a second old
    rows = await services.store.usage(tenant, since.isoformat())
    body: dict[str, Any] = await services.heavy.run(
        compute,
        rows,
        by=by,
        since=since,
        model_table=services.models,
        max_groups=limits.stats_max_groups,
    )
    return rows, body


ROUTES = [
    Route("/healthz", healthz),
    Route("/readyz", readyz),
    Route("/metrics", metrics),
    Route("/compactd/v1/conversations", list_conversations),
    Route("/compactd/v1/conversations/{conv}", get_conversation, methods=["GET"]),
    Route("/compactd/v1/conversations/{conv}", purge_conversation, methods=["DELETE"]),
    Route("/compactd/v1/uncompress", uncompress, methods=["POST"]),
    Route("/compactd/v1/stats", stats),
]
