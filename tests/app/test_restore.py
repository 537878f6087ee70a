"""Restore is complete at any depth, or says exactly what is missing."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

from proxy.chat.checkpoint import restore
from proxy.runtime.digest import message_digest
from tests.cli.test_cli import run, run_into_a_closed_pipe
from tests.inprocess import Proxy, running

Message = dict[str, Any]
SECRET = {"server": {"secret": "test-secret", "admin_key": "admin-key"}}


def turn(k: int) -> list[Message]:
    """One exchange whose keys are not in sorted order, with a tool call and its result."""
    call = f"call_{k}"
    return [
        {"role": "user", "content": f"Step {k}: read src/mod{k}.py " + "please now " * 30},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": call, "type": "function", "function": {"name": "read", "arguments": "{}"}}
            ],
        },
        {"role": "tool", "tool_call_id": call, "content": f"def f{k}():\n" + "    pass\n" * 150},
        {"role": "assistant", "content": f"Done with step {k}. " + "all good " * 20},
    ]


async def grow(
    proxy: Proxy, turns: int, key: str = "sk-alpha"
) -> tuple[list[Message], list[str], dict[str, Any]]:
    """A conversation sent turn by turn; (its messages, the actions, the last forwarded body)."""
    messages: list[Message] = [{"role": "system", "content": "You are a coding agent."}]
    actions = []
    for k in range(turns):
        messages += turn(k)
        r = await proxy.chat({"model": "gpt-4o", "messages": messages}, key=key)
        actions.append(r.headers["x-compactd-action"])
    return messages, actions, proxy.upstream.last_json()


def config(tmp_path: Path) -> Path:
    path = tmp_path / "compactd.toml"
    path.write_text("[default_policy]\nbudget_tokens = 1500\n")
    return path


async def test_fifty_compactions_restore_exactly_in_one_call(tmp_path: Path) -> None:
    policy = {"default_policy": {"budget_tokens": 1500}}
    async with running(tmp_path, **SECRET, **policy) as proxy:
        messages, actions, last = await grow(proxy, 60)
        api = await proxy.uncompress(last["messages"], recursive=False)
        info = await proxy.services.store.get_conversation(None, proxy.conversations[-1])
    assert actions.count("compacted") >= 50
    # One call, one round: every ref maps to original messages, however many events came before.
    assert api.json()["missing_ids"] == []
    assert api.json()["messages"] == messages
    assert info is not None
    restored = restore(info)
    assert restored is not None
    assert restored.missing_ids == []
    covered = messages[: restored.checkpoint.covered_through + 1]
    # Exactly as the client sent them: same keys, same order, nulls kept.
    assert json.dumps(restored.messages) == json.dumps(covered)
    cli = run(
        "restore", info.conversation, "--config", str(config(tmp_path)), data=tmp_path / "data"
    )
    assert cli.returncode == 0, cli.stderr
    assert json.dumps(json.loads(cli.stdout)["messages"]) == json.dumps(covered)


async def compacted(tmp_path: Path) -> tuple[str, dict[str, Any]]:
    """An 8-turn conversation, compacted along the way: its id and the last forwarded body."""
    policy = {"default_policy": {"budget_tokens": 1500}}
    async with running(tmp_path, **SECRET, **policy) as proxy:
        _, actions, last = await grow(proxy, 8)
        conversation = proxy.conversations[-1]
    assert "compacted" in actions
    return conversation, last


async def test_restore_into_a_reader_that_has_gone_stops_quietly(tmp_path: Path) -> None:
    conversation, _ = await compacted(tmp_path)
    args = ("restore", conversation, "--config", str(config(tmp_path)))
    cli = run_into_a_closed_pipe(*args, data=tmp_path / "data")
    # `compactd restore … | head`: no BrokenPipeError line, the status of a tool ended by SIGPIPE
    # (stderr names the store it read, as every store command does, and nothing else).
    data = tmp_path / "data"
    assert (
        cli.stderr.decode() == f"compactd: store sqlite {data / 'compactd.db'} (data dir {data})\n"
    )
    assert cli.returncode == 141


async def test_restore_says_what_is_missing_and_exits_non_zero(tmp_path: Path) -> None:
    conversation, last = await compacted(tmp_path)
    database = sqlite3.connect(tmp_path / "data" / "compactd.db")
    with database:
        database.execute("DELETE FROM refs")
    database.close()
    cli = run("restore", conversation, "--config", str(config(tmp_path)), data=tmp_path / "data")
    assert cli.returncode == 1
    out = json.loads(cli.stdout)
    assert out["missing_ids"]
    assert b"missing" in cli.stderr
    refs = [m for m in last["messages"] if "[compactd:ref=" in str(m.get("content"))]
    assert refs


async def test_the_admin_key_uncompresses_any_tenants_messages(tmp_path: Path) -> None:
    policy = {"default_policy": {"budget_tokens": 1500}}
    async with running(tmp_path, **SECRET, **policy) as proxy:
        messages, _, last = await grow(proxy, 6)
        admin = await proxy.uncompress(last["messages"], key="admin-key")
        stranger = await proxy.uncompress(last["messages"], key="sk-stranger")
    assert admin.status_code == 200
    assert admin.json()["messages"] == messages
    assert admin.json()["missing_ids"] == []
    assert stranger.json()["missing_ids"]
    assert stranger.json()["messages"] != messages


async def test_a_stored_value_that_does_not_decode_is_listed_as_missing(tmp_path: Path) -> None:
    # One corrupt original used to fail the whole restore (the CLI said UnreadableValueError,
    # the API "store unavailable"): now it costs only what it stood for, and says so.
    policy = {"default_policy": {"budget_tokens": 1500}}
    async with running(tmp_path, **SECRET, **policy) as proxy:
        messages, _, _ = await grow(proxy, 8)
        conversation = proxy.conversations[-1]
        first = message_digest(messages[0])
        database = sqlite3.connect(tmp_path / "data" / "compactd.db")
        with database:
            database.execute("UPDATE originals SET body = ? WHERE digest = ?", (b"{bad", first))
        database.close()
        shown = await proxy.client.get(
            f"/compactd/v1/conversations/{conversation}",
            headers={"authorization": "Bearer sk-alpha"},
        )
    assert shown.status_code == 200
    assert shown.json()["unreadable"] == [["original", first]]
    cli = run("restore", conversation, "--config", str(config(tmp_path)), data=tmp_path / "data")
    assert cli.returncode == 1
    out = json.loads(cli.stdout)
    assert out["missing_ids"]
    assert b"incomplete restore" in cli.stderr


async def test_an_unreadable_longest_checkpoint_makes_the_restore_incomplete(
    tmp_path: Path,
) -> None:
    policy = {"default_policy": {"budget_tokens": 1500}}
    async with running(tmp_path, **SECRET, **policy) as proxy:
        _, actions, _ = await grow(proxy, 8)
        conversation = proxy.conversations[-1]
    assert actions.count("compacted") >= 2
    database = sqlite3.connect(tmp_path / "data" / "compactd.db")
    with database:
        (longest,) = database.execute(
            "SELECT source_digest FROM checkpoints ORDER BY covered_through DESC LIMIT 1"
        ).fetchone()
        database.execute("UPDATE checkpoints SET body = ? WHERE source_digest = ?", (b"{", longest))
    database.close()
    cli = run("restore", conversation, "--config", str(config(tmp_path)), data=tmp_path / "data")
    assert cli.returncode == 1
    assert longest in json.loads(cli.stdout)["missing_ids"]


async def test_the_admin_reaches_each_tenants_conversation_of_one_id(tmp_path: Path) -> None:
    # A conversation id is a digest of how a conversation starts: two tenants of one app have
    # the same one. The listing shows both; the admin must be able to open, restore and delete
    # each, not only the one used last.
    policy = {"default_policy": {"budget_tokens": 1500}}
    async with running(tmp_path, **SECRET, **policy) as proxy:
        await grow(proxy, 4, key="sk-alpha")
        await grow(proxy, 4, key="sk-beta")  # the same messages: the same id, used last
        conv = proxy.conversations[-1]
        api = proxy.client
        admin = {"authorization": "Bearer admin-key"}
        listed = (await api.get("/compactd/v1/conversations", headers=admin)).json()["data"]
        beta, alpha = (c["tenant"] for c in listed)
        shown = {
            t: (await api.get(f"/compactd/v1/conversations/{conv}?tenant={t}", headers=admin))
            for t in (alpha, beta)
        }
        inspected = await api.get(
            f"/compactd/v1/conversations/{conv}/inspect?tenant={alpha}", headers=admin
        )
        # A client naming another tenant learns nothing: it is not there for it.
        peek = await api.get(
            f"/compactd/v1/conversations/{conv}/inspect?tenant={beta}",
            headers={"authorization": "Bearer sk-alpha"},
        )
        gone = await api.delete(f"/compactd/v1/conversations/{conv}?tenant={alpha}", headers=admin)
        left = (await api.get("/compactd/v1/conversations", headers=admin)).json()["data"]
    assert [c["conversation"] for c in listed] == [conv, conv]
    assert {t: r.json()["tenant"] for t, r in shown.items()} == {alpha: alpha, beta: beta}
    assert inspected.json()["tenant"] == alpha
    assert peek.status_code == 404
    assert gone.status_code == 200
    assert [c["tenant"] for c in left] == [beta]


async def test_the_cli_restores_and_purges_one_tenants_conversation_by_tenant_id(
    tmp_path: Path,
) -> None:
    policy = {"default_policy": {"budget_tokens": 1500}}
    async with running(tmp_path, **SECRET, **policy) as proxy:
        await grow(proxy, 4, key="sk-alpha")
        await grow(proxy, 4, key="sk-beta")
        conv = proxy.conversations[-1]
        infos = await proxy.services.store.list_conversations(None)
    beta, alpha = (i.tenant for i in infos)
    path, data = str(config(tmp_path)), tmp_path / "data"
    restored = run("restore", conv, "--tenant", alpha, "--config", path, data=data)
    assert restored.returncode == 0, restored.stderr
    purged = run("purge", conv, "--tenant", alpha, "--config", path, data=data)
    assert purged.returncode == 0, purged.stderr
    listed = json.loads(run("conversations", "--json", "--config", path, data=data).stdout)
    assert [c["tenant"] for c in listed] == [beta]
    both = run("purge", conv, "--tenant", beta, "--key", "sk-beta", "--config", path, data=data)
    assert both.returncode == 2
