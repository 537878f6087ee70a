"""Which markers count: a ref resolves only within its own conversation, and only where compactd
wrote it.

A marker is plain text (`[compactd:ref=<id>]`): a client can type one into any message, naming a
ref of another of its conversations (one app key often serves many end users), or build chains
of them inside the originals it sends, which a recursive restore multiplied level by level. So a
restore is scoped to one stored conversation (`RefScope.of`): only that conversation's refs are
looked up, and a marker inside a restored original counts only if that original is a message
compactd itself forwarded with that ref (a checkpoint's message whose `parts` name it). The
caller's own messages may carry any ref of the conversation: its lossless forms are forwarded
outside every checkpoint.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from proxy.chat.request import conversation_of
from proxy.providers.units import message_text, refs_in
from proxy.runtime.digest import message_digest
from proxy.store.base import ConversationInfo, Store, resolve_readable

Message = dict[str, Any]


@dataclass(frozen=True)
class RefScope:
    """One conversation's refs (-> originals) and the refs compactd wrote in each of its
    forwarded messages (message digest -> refs)."""

    refs: Mapping[str, list[Message]] = field(default_factory=dict)
    written: Mapping[str, frozenset[str]] = field(default_factory=dict)
    texts: Mapping[str, frozenset[str]] = field(default_factory=dict)
    """The same by the forwarded message's text (what a Responses or Messages projection of
    the forwarded items gives back, beside items a digest would also see)."""

    @classmethod
    def of(cls, info: ConversationInfo | None) -> RefScope:
        """The scope of a stored conversation; an empty one (nothing resolves) for None."""
        if info is None:
            return cls()
        refs = {
            ref: [info.originals[d] for d in digests if d in info.originals]
            for ref, digests in info.refs.items()
        }
        written: dict[str, frozenset[str]] = {}
        texts: dict[str, frozenset[str]] = {}
        for cp in info.checkpoints:
            for i, message in enumerate(cp.messages):
                # A checkpoint written before `parts` were kept: its own markers are its parts.
                parts = frozenset(cp.parts[i] if i < len(cp.parts) else refs_in(message))
                if parts:
                    digest, text = message_digest(message), message_text(message)
                    written[digest] = written.get(digest, frozenset()) | parts
                    texts[text] = texts.get(text, frozenset()) | parts
        return cls({r: found for r, found in refs.items() if found}, written, texts)

    def lookup(self, ids: list[str]) -> dict[str, list[Message]]:
        """The originals of the ids this conversation owns."""
        return {ref: self.refs[ref] for ref in ids if ref in self.refs}

    def refs_of(self, message: Message, depth: int) -> list[str]:
        """The refs of `message` that count: all of the caller's own (depth 0, resolved in this
        conversation only), else only those compactd wrote in that very message."""
        found = refs_in(message)
        if depth == 0 or not found:
            return found
        genuine = self.written.get(message_digest(message), frozenset())
        return [ref for ref in found if ref in genuine]


_MAX_TRIED = 4
"""Conversations loaded while looking for the one a restore's messages were sent in."""


async def find_scope(
    store: Store, owner: str | None, named: str | None, messages: Sequence[Message], secret: bytes
) -> tuple[str, RefScope]:
    """(conversation, its scope) of a restore: the one named; else the one the messages start,
    if stored; else the one whose checkpoint holds the first of the messages that carries a
    ref (as sent), else the first that wrote one of their refs in a checkpoint."""
    conversation = conversation_of(named, messages, secret)
    info = await _info(store, owner, conversation)
    if named or info is not None or owner is None:
        return conversation, await _scope(info)
    found = await _written_in(store, owner, messages)
    return found if found is not None else (conversation, RefScope())


async def _written_in(
    store: Store, owner: str, messages: Sequence[Message]
) -> tuple[str, RefScope] | None:
    carriers = [(m, refs_in(m)) for m in messages]
    carriers = [(m, refs) for m, refs in carriers if refs]
    wanted = list(dict.fromkeys(ref for _, refs in carriers for ref in refs))
    owners = await store.ref_conversations(owner, wanted)
    candidates = list(dict.fromkeys(c for ref in wanted for c in owners.get(ref, [])))
    scopes = [
        (conversation, await _scope(await _info(store, owner, conversation)))
        for conversation in candidates[:_MAX_TRIED]
    ]
    for message, refs in carriers:  # the message itself, as compactd forwarded it
        digest = message_digest(message)
        for conversation, scope in scopes:
            if scope.written.get(digest, frozenset()) & set(refs):
                return conversation, scope
    for message, refs in carriers:  # a projection (Responses, Messages): the same text
        text = message_text(message)
        for conversation, scope in scopes:
            if scope.texts.get(text, frozenset()) & set(refs):
                return conversation, scope
    return None


async def _scope(info: ConversationInfo | None) -> RefScope:
    # A digest of every message of every checkpoint: a long conversation's take milliseconds.
    return await asyncio.to_thread(RefScope.of, info)


async def _info(store: Store, owner: str | None, conversation: str) -> ConversationInfo | None:
    try:
        return await store.get_conversation(owner, conversation)
    except ValueError:  # not an id a store can hold: nothing is stored under it
        return None


async def resolve_within(
    store: Store, tenant: str, ref_ids: list[str], *, conversation: str
) -> dict[str, list[Message]]:
    """The originals of the ids that `conversation` stores (the expand tool's lookup): a ref of
    another conversation, typed into a kept message, resolves to nothing."""
    owners = await store.ref_conversations(tenant, ref_ids)
    mine = [ref for ref in ref_ids if conversation in owners.get(ref, ())]
    return await resolve_readable(store, tenant, mine) if mine else {}
