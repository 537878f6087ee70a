"""Issue 11, item 8: what becomes a usage key is bounded, and refused requests create none."""

from __future__ import annotations

import httpx
import orjson

from tests.upstream import respond

ADMIN = {"authorization": "Bearer admin-usage"}


async def test_huge_model_names_and_refused_keys_leave_only_bounded_rows(
    upstream, make_proxy
) -> None:
    fake, base = upstream
    server = {"admin_key": "admin-usage"}
    async with make_proxy(base, server=server) as url, httpx.AsyncClient() as http:
        for i in range(3):
            model = f"m{i}-" + "x" * 2_000_000
            body = orjson.dumps({"model": model, "messages": [{"role": "user", "content": "hi"}]})
            r = await http.post(
                f"{url}/v1/chat/completions", content=body, headers={"x-api-key": "sk-real"}
            )
            assert r.status_code == 200
        # A made-up key the upstream refuses: served as the upstream answers, never recorded.
        fake.then(respond(401, {"error": {"message": "bad key", "type": "auth", "code": None}}))
        body = orjson.dumps({"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]})
        refused = await http.post(
            f"{url}/v1/chat/completions", content=body, headers={"x-api-key": "sk-made-up"}
        )
        stats = (await http.get(f"{url}/compactd/v1/stats?by=model", headers=ADMIN)).json()
    keys = [row["key"] for row in stats["rows"]]
    assert refused.status_code == 401
    assert len(keys) == 3
    assert all(len(k) <= 128 for k in keys)
    assert stats["total"]["requests"] == 3
