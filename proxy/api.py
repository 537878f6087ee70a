"""compactd's own HTTP API: health, metrics, conversations, restore, stats."""

from __future__ import annotations

import hmac
import logging
from datetime import date
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from proxy.dialects import restore
from proxy.errors import (
    BodyTooLargeError,
    InvalidRequestError,
    NotFoundError,
    ProxyError,
    StoreUnavailableError,
    UnauthorizedError,
    error_body,
)
from proxy.providers.uncompress import uncompress_async
from proxy.services import Services
from proxy.stats import GROUP_BY, GroupBy, compute_stats, parse_since, stats_json
from proxy.store.base import ConversationInfo, Store, StoreError, resolve_readable
from proxy.tenant import credential
from proxy.views import conversation_json, conversation_list

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
    tenant = services.tenancy.identify(request.headers).tenant
    if tenant is None:
        raise UnauthorizedError(
            "Send the API key whose conversations you want (Authorization, api-key or x-api-key)."
        )
    return tenant


async def _proxy_error(request: Request, exc: Exception) -> Response:
    del request
    assert isinstance(exc, ProxyError)
    return _error(exc)


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
    return JSONResponse({"status": "ready", "store": store})


async def metrics(request: Request) -> Response:
    """Prometheus exposition."""
    body, content_type = _services(request).metrics.render()
    return Response(body, media_type=content_type)


ACTIVITY_LIMIT = 1000
"""The most recently active conversations a listing reads the activity of."""


async def list_conversations(request: Request) -> Response:
    """Conversations visible to the caller, with sizes, API, model and tokens; `?all=true`
    adds those that never compacted."""
    services = _services(request)
    tenant = _caller(request, services)
    every = request.query_params.get("all", "").lower() in ("1", "true", "yes")
    infos = await services.store.list_conversations(tenant)
    activity = await services.store.activity(tenant, ACTIVITY_LIMIT)
    return _Json({"data": conversation_list(infos, activity, every=every)})


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


def grouping(request: Request) -> tuple[GroupBy, date]:
    """`by` and `since` of a stats query (InvalidRequestError if either is bad)."""
    by = request.query_params.get("by", "policy")
    try:
        if by not in GROUP_BY:
            raise ValueError(f"by must be one of {', '.join(GROUP_BY)}")  # noqa: TRY301
        return by, parse_since(request.query_params.get("since", "7d"))
    except (ValueError, OverflowError) as exc:
        raise InvalidRequestError(str(exc)) from None


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
    """Restore compacted messages from the caller's stored originals."""
    services = _services(request)
    tenant = _caller(request, services)
    raw = await _bounded_body(request, services.settings.server.max_api_body_bytes)
    try:
        body = orjson.loads(raw)
        # Each API's own shape in and out (proxy.dialects.restore); chat messages by default.
        api, messages = restore.read(body)
        recursive = bool(body.get("recursive", False))
    except (orjson.JSONDecodeError, TypeError):
        return _error(InvalidRequestError(restore.USAGE))
    store = services.store
    # The admin key restores any tenant's messages: each id is looked for in every tenant's data.
    tenants = [tenant] if tenant is not None else await _tenants(store)

    async def lookup(ids: list[str]) -> dict[str, list[dict[str, Any]]]:
        found: dict[str, list[dict[str, Any]]] = {}
        for owner in tenants:
            rest = [i for i in ids if i not in found]
            if not rest:
                break
            found.update(await resolve_readable(store, owner, rest))
        return found

    result = await uncompress_async(messages, lookup, recursive=recursive)
    return _Json(
        {
            **restore.write(api, result.messages, body),
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


async def _tenants(store: Store) -> list[str]:
    """Every tenant with stored conversations, most recently used first."""
    infos = await store.list_conversations(None)
    return list(dict.fromkeys(i.tenant for i in sorted(infos, key=lambda i: -i.updated_at)))


async def stats(request: Request) -> Response:
    """Accounting (admin key only)."""
    services = _services(request)
    if _caller(request, services) is not None:
        return _error(UnauthorizedError("Stats need the admin key."))
    by, since = grouping(request)
    if services.accountant is not None:
        await services.accountant.flush()  # this worker's latest counts, not a second old
    rows = await services.store.usage(None, since.isoformat())
    table = compute_stats(rows, by=by, model_table=services.models)
    return _Json(stats_json(table, by=by, since=since))


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
