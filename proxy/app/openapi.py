"""The OpenAPI 3.1 document of compactd's own endpoints, served at /compactd/v1/openapi.json.

The /v1/* relay is the upstreams' own APIs (OpenAI's, Anthropic's) and is described by their
documents; this one covers what compactd itself answers: health, readiness, metrics, the
conversation and restore API, accounting and the dashboard's data. tests/app/test_openapi.py
validates it with openapi-spec-validator and checks it against the app's routes, both ways.
"""

from __future__ import annotations

from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response

from proxy import __version__
from proxy.telemetry.stats import GROUP_BY, SERIES_METRICS

Json = dict[str, Any]
PATH = "/compactd/v1/openapi.json"

_ERROR: Json = {
    "type": "object",
    "description": "OpenAI-shaped error (compactd's own errors).",
    "required": ["error"],
    "properties": {
        "error": {
            "type": "object",
            "required": ["message", "type"],
            "properties": {
                "message": {"type": "string"},
                "type": {"type": "string"},
                "param": {"type": ["string", "null"]},
                "code": {"type": ["string", "null"]},
            },
        }
    },
}
_SUMMARY: Json = {
    "type": "object",
    "required": ["tenant", "conversation", "created_at", "updated_at"],
    "properties": {
        "tenant": {"type": "string", "description": "HMAC of the client's key, never the key."},
        "conversation": {"type": "string"},
        "created_at": {"type": "number", "description": "Epoch seconds."},
        "updated_at": {"type": "number"},
        "expires_at": {"type": "number", "description": "When retention deletes it."},
        "size_bytes": {"type": "integer"},
        "checkpoint_count": {"type": "integer"},
        "original_count": {"type": "integer"},
        "compacted": {"type": "boolean", "description": "false: never compacted (`all=true`)"},
        "api": {"type": ["string", "null"], "description": "The API of its latest request."},
        "model": {"type": ["string", "null"]},
        "requests": {"type": ["integer", "null"]},
        "compactions": {"type": ["integer", "null"]},
        "tokens_before": {"type": ["integer", "null"], "description": "As clients sent them."},
        "tokens_after": {"type": ["integer", "null"], "description": "As compactd forwarded."},
        "tokens_saved": {"type": ["integer", "null"]},
    },
}
_CONVERSATION: Json = {
    "type": "object",
    "description": (
        "A conversation with its checkpoints. Chat conversations carry `originals` and `refs`; "
        "Responses and Messages ones their originals restored in the API's own shape."
    ),
    "required": ["tenant", "conversation", "checkpoints"],
    "properties": {
        **_SUMMARY["properties"],
        "checkpoints": {"type": "array", "items": {"type": "object"}},
        "originals": {"type": "object", "additionalProperties": {"type": "object"}},
        "refs": {"type": "object", "additionalProperties": {"type": "array"}},
        "api": {"type": "string", "enum": ["chat.completions", "responses", "messages"]},
        "missing_ids": {"type": "array", "items": {"type": "string"}},
    },
}
_UNCOMPRESS: Json = {
    "type": "object",
    "description": (
        'Chat: {"messages": [...]}. Responses: {"api": "responses", "input": [...]}. '
        'Messages: {"api": "messages", "messages": [...]}.'
    ),
    "properties": {
        "api": {"type": "string", "enum": ["chat.completions", "responses", "messages"]},
        "messages": {"type": "array", "items": {"type": "object"}},
        "input": {"type": "array", "items": {"type": "object"}},
        "recursive": {"type": "boolean", "default": False},
    },
}
_RESTORED: Json = {
    "type": "object",
    "required": ["messages_expanded", "messages_passthrough", "missing_ids"],
    "properties": {
        "messages": {"type": "array", "items": {"type": "object"}},
        "input": {"type": "array", "items": {"type": "object"}},
        "messages_expanded": {"type": "integer"},
        "messages_passthrough": {"type": "integer"},
        "missing_ids": {"type": "array", "items": {"type": "string"}},
    },
}
_ROW: Json = {"type": "object", "additionalProperties": True}
_STATS: Json = {
    "type": "object",
    "required": ["by", "rows", "total"],
    "properties": {
        "by": {"type": "string", "enum": list(GROUP_BY)},
        "since": {"type": ["string", "null"], "format": "date"},
        "rows": {"type": "array", "items": _ROW},
        "total": _ROW,
        "assumptions": {
            "type": "string",
            "description": "How saved_usd is priced (the cache rules, proxy/telemetry/pricing.py).",
        },
    },
}
_SAVINGS: Json = {
    "type": "object",
    "description": f"Per UTC day and group: {', '.join(SERIES_METRICS)}.",
    "properties": {
        **_STATS["properties"],
        "days": {"type": "array", "items": {"type": "string", "format": "date"}},
        "series": {"type": "object"},
        "policies": {"type": "array", "items": {"type": "object"}},
        "tenant": {"type": ["string", "null"]},
    },
}
_QUERY = {
    "by": {
        "name": "by",
        "in": "query",
        "schema": {"type": "string", "enum": list(GROUP_BY), "default": "policy"},
    },
    "since": {
        "name": "since",
        "in": "query",
        "description": "First UTC day: `7d`, `2w`, `0d` (today) or YYYY-MM-DD.",
        "schema": {"type": "string", "default": "7d"},
    },
    "conv": {"name": "conv", "in": "path", "required": True, "schema": {"type": "string"}},
    "all": {
        "name": "all",
        "in": "query",
        "description": "true: also the conversations that never compacted.",
        "schema": {"type": "boolean", "default": False},
    },
    "tenant": {
        "name": "tenant",
        "in": "query",
        "description": "Admin key only: whose conversation of that id.",
        "schema": {"type": "string"},
    },
}


_REDIRECT: Json = {"307": {"description": "To /compactd/ui/ (the dashboard)."}}
_DELETED: Json = {
    "type": "object",
    "properties": {"deleted": {"type": "boolean"}, "id": {"type": "string"}},
}


def _listing(items: Json) -> Json:
    return {"type": "object", "properties": {"data": {"type": "array", "items": items}}}


def _json(schema: Json, description: str = "OK") -> Json:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def _ref(name: str) -> Json:
    return {"$ref": f"#/components/schemas/{name}"}


def _errors(*codes: int) -> Json:
    what = {
        400: "Bad request.",
        401: "No credential (or not the admin key).",
        404: "No such conversation.",
        413: "Body too large.",
        503: "Store unavailable; retry.",
    }
    return {str(c): _json(_ref("Error"), what[c]) for c in codes}


def _op(summary: str, ok: Json, *errors: int, params: tuple[str, ...] = (), **extra: Any) -> Json:
    op: Json = {"summary": summary, "responses": {"200": ok, **_errors(*errors)}, **extra}
    if params:
        op["parameters"] = [_QUERY[p] for p in params]
    if errors:
        op["security"] = [{"bearer": []}, {"apiKey": []}, {"xApiKey": []}]
    return op


def _paths() -> Json:
    plain = {"text/plain": {"schema": {"type": "string"}}}
    conv = ("conv", "tenant")
    return {
        "/": {"get": {"summary": "Redirects to the dashboard.", "responses": _REDIRECT}},
        "/healthz": {"get": _op("Liveness: the process answers.", _json({"type": "object"}))},
        "/readyz": {
            "get": {
                "summary": "Readiness: the lifespan finished; the store's state.",
                "responses": {
                    "200": _json({"type": "object"}),
                    "503": _json({"type": "object"}, "Still starting."),
                },
            }
        },
        "/metrics": {"get": _op("Prometheus exposition.", {"description": "OK", "content": plain})},
        PATH: {"get": _op("This document.", _json({"type": "object"}))},
        "/compactd/v1/me": {"get": _op("Who the credential is.", _json({"type": "object"}), 401)},
        "/compactd/v1/conversations": {
            "get": _op(
                "Conversations visible to the caller.",
                _json(_listing(_ref("ConversationSummary"))),
                401,
                503,
                params=("all",),
            )
        },
        "/compactd/v1/conversations/{conv}": {
            "get": _op("One conversation.", _json(_ref("Conversation")), 401, 404, params=conv),
            "delete": _op(
                "Delete a conversation and what only it references.",
                _json(_DELETED),
                401,
                404,
                params=conv,
            ),
        },
        "/compactd/v1/conversations/{conv}/inspect": {
            "get": _op(
                "One conversation, checkpoint by checkpoint (the dashboard's inspector).",
                _json({"type": "object"}),
                401,
                404,
                params=conv,
            )
        },
        "/compactd/v1/uncompress": {
            "post": _op(
                "Restore compacted messages from the caller's stored originals.",
                _json(_ref("Restored")),
                400,
                401,
                413,
                requestBody={"required": True, "content": _json(_ref("Uncompress"))["content"]},
            )
        },
        "/compactd/v1/stats": {
            "get": _op(
                "Accounting (admin key).", _json(_ref("Stats")), 400, 401, params=("by", "since")
            )
        },
        "/compactd/v1/savings": {
            "get": _op("Savings per day.", _json(_ref("Savings")), 400, 401, params=("by", "since"))
        },
    }


def document() -> Json:
    """The OpenAPI 3.1 document."""
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "compactd",
            "version": __version__,
            "summary": "compactd's own endpoints (the /v1/* relay speaks the upstreams' APIs).",
            "license": {"name": "Apache-2.0", "identifier": "Apache-2.0"},
        },
        "paths": _paths(),
        "components": {
            "schemas": {
                "Error": _ERROR,
                "ConversationSummary": _SUMMARY,
                "Conversation": _CONVERSATION,
                "Uncompress": _UNCOMPRESS,
                "Restored": _RESTORED,
                "Stats": _STATS,
                "Savings": _SAVINGS,
            },
            "securitySchemes": {
                "bearer": {"type": "http", "scheme": "bearer"},
                "apiKey": {"type": "apiKey", "in": "header", "name": "api-key"},
                "xApiKey": {"type": "apiKey", "in": "header", "name": "x-api-key"},
            },
        },
    }


async def openapi(request: Request) -> Response:
    """GET /compactd/v1/openapi.json."""
    del request
    return Response(orjson.dumps(document()), media_type="application/json")


if __name__ == "__main__":  # `python -m proxy.app.openapi > docs/openapi.json`
    import sys

    sys.stdout.write(orjson.dumps(document(), option=orjson.OPT_INDENT_2).decode() + "\n")
