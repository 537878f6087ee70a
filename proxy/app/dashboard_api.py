"""The JSON the dashboard reads, under /compactd/v1 with the API's tenant rules: the admin key
sees every tenant, a client key only its own data, a request without a credential gets 401."""

from __future__ import annotations

import asyncio
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from proxy.app.api import _caller, _Json, _services, usage_answer, visible_conversation
from proxy.app.views import inspection
from proxy.telemetry.stats import series_json
from proxy.wire.tenant import credential, key_fingerprint


async def me(request: Request) -> Response:
    """Who the credential is: the admin (every tenant) or one tenant, with its key id."""
    services = _services(request)
    tenant = _caller(request, services)
    found = credential(request.headers, services.tenancy.headers)
    return _Json(
        {
            "admin": tenant is None,
            "tenant": tenant,
            "key_id": None if tenant is None else key_fingerprint(services.secret, found),
        }
    )


async def savings(request: Request) -> Response:
    """Savings per day and over the period, grouped by tenant, policy, model or API; with the
    policies' modes and providers, so the dashboard can show what shadow policies would save."""
    services = _services(request)
    tenant = _caller(request, services)
    rows, body = await usage_answer(request, services, tenant, series_json)
    used = {str(r.get("policy")) for r in rows}
    body["policies"] = [
        {"name": p.name, "mode": p.mode, "providers": list(p.providers)}
        for p in services.settings.all_policies()
        if tenant is None or p.name in used  # a client sees only the policies it ran under
    ]
    body["tenant"] = tenant
    return _Json(body)


async def inspect_conversation(request: Request) -> Response:
    """One conversation, checkpoint by checkpoint: what was forwarded, what it stands for."""
    services = _services(request)
    info = await visible_conversation(request, services)
    model = request.query_params.get("model", "")
    counter = services.tokenizers.for_model(services.models.lookup(model))
    # Counting every original of a long conversation is CPU work: off the event loop.
    view: dict[str, Any] = await asyncio.to_thread(inspection, info, counter.count_message)
    view["encoding"] = counter.encoding_name
    return _Json(view)


ROUTES = [
    Route("/compactd/v1/me", me),
    Route("/compactd/v1/savings", savings),
    Route("/compactd/v1/conversations/{conv:path}/inspect", inspect_conversation),
]
