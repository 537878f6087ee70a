"""Issue 32, row 10: a conversation id is keyed with the server secret, so one read in a log
cannot be matched offline to a guessed system prompt and first message."""

from __future__ import annotations

from pathlib import Path

from proxy.runtime.digest import conversation_id
from tests.inprocess import running

MESSAGES = [
    {"role": "system", "content": "You are the support bot of Example Corp."},
    {"role": "user", "content": "hello"},
]


async def _id_under(tmp_path: Path, secret: str) -> str:
    async with running(tmp_path / secret, server={"secret": secret}) as proxy:
        r = await proxy.chat({"model": "gpt-4o", "messages": MESSAGES})
    return r.headers["x-compactd-conversation"]


async def test_the_conversation_id_is_keyed_with_the_server_secret(tmp_path: Path) -> None:
    first = await _id_under(tmp_path, "secret-one")
    again = await _id_under(tmp_path, "secret-one")
    other = await _id_under(tmp_path, "secret-two")
    assert first == again == conversation_id(MESSAGES, b"secret-one")
    assert first != other
    assert conversation_id(MESSAGES) not in (first, other)  # the unkeyed digest anyone can take
