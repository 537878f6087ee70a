"""Originals first: what a rewritten request stands for is stored before it is forwarded.

The third phase of the decision (`proxy.chat.compactor`): a new compaction's originals and
checkpoint (`save_compaction`), and the originals of the lossless forms a request sends past its
checkpoint (`save_originals`), so every ref compactd sends resolves and every rewrite can be
restored. A store failure raises (the original request is forwarded) unless the config says
`compact-unstored`, which forwards the rewrite unstored.
"""

from __future__ import annotations

import dataclasses
import logging
import time

from proxy.chat.bodycache import BodyCache
from proxy.chat.checkpoint import replay_problem
from proxy.chat.lossless import Lossless, StoredForms
from proxy.chat.planner import Plan, unreadable
from proxy.chat.quota import Quota
from proxy.chat.request import ChatRequest
from proxy.config import PolicySettings, StoreSettings
from proxy.errors import StoreError, TenantMismatchError, UnreadableValueError
from proxy.store.base import Store
from proxy.telemetry.metrics import Metrics

log = logging.getLogger("compactd.compaction")


class Persister:
    """Stores the originals (and checkpoints) of rewritten requests before they go out."""

    def __init__(
        self,
        *,
        settings: StoreSettings,
        store: Store,
        metrics: Metrics,
        bodies: BodyCache,
        quota: Quota | None = None,
    ) -> None:
        self.settings = settings
        self.store = store
        self.metrics = metrics
        self.bodies = bodies
        self.quota = quota
        self.stored_forms = StoredForms()

    async def compaction(self, plan: Plan, policy: PolicySettings) -> tuple[Plan, bool]:
        """Originals first: a compacted request is forwarded only once they are durable.
        Returns the plan to send and whether it goes out unstored."""
        compaction = plan.compaction
        assert compaction is not None
        ttl = (policy.retention_days or self.settings.retention_days) * 86400
        if self.quota is not None:
            self.quota.check(compaction.checkpoint.tenant)  # over it: fails open, nothing saved
        t0 = time.perf_counter()
        try:
            winner = await self.store.save_compaction(compaction, ttl)
        except (UnreadableValueError, TenantMismatchError) as exc:
            # Written, but the checkpoint already stored for this prefix does not decode (or
            # claims another tenant): ours is durable with its originals, so ours is sent.
            self.metrics.checkpoint_discarded(unreadable(exc))
            return plan, False
        except StoreError:
            if self.settings.on_store_error != "compact-unstored":
                raise
            self.metrics.fail_open("store_unstored")
            log.warning("originals not stored; forwarding compacted (compact-unstored)")
            return plan, True
        finally:
            self.metrics.observe_store("save_compaction", time.perf_counter() - t0)
        mine = compaction.checkpoint
        if winner.messages == mine.messages:
            return plan, False
        # Another request of this conversation compacted the same prefix first: use its bytes,
        # if they stand for the same originals and this request could replay them (ours were
        # stored too, so ours are safe to send). Ours may cover this request's final unit (a
        # final tool result cut in place, the last resort); a longer request's checkpoint of the
        # same prefix may have dropped that unit as middle messages, so it is never used then.
        history = plan.history
        assert history is not None
        if winner.ends and not replay_problem(winner, history.messages, history.digests):
            merged = [*winner.messages, *plan.messages[len(mine.messages) :]]
            return dataclasses.replace(
                plan, messages=merged, providers=tuple(winner.providers), tokens=None
            ), False
        self.metrics.checkpoint_discarded("invalid")
        return plan, False

    async def forms(
        self, request: ChatRequest, policy: PolicySettings, forms: Lossless, *, after: int
    ) -> bool:
        """The originals of the lossless forms past message `after` that this worker has not
        written lately, stored before the forms are forwarded (a checkpoint stores those it
        covers), so every ref compactd sends resolves and every rewrite can be restored.
        Returns whether they go out unstored (`compact-unstored`); otherwise a store failure
        raises and the original request is forwarded."""
        tenant = request.tenant
        assert tenant is not None
        assert request.messages is not None
        conversation, now = request.conversation, time.time()
        due = [
            (i, ref)
            for i, ref in enumerate(forms.refs)
            if ref is not None
            and i > after
            and self.stored_forms.due(tenant, conversation, ref, now)
        ]
        if not due:
            return False
        digests = self.bodies.digests(request.messages)
        originals = {digests[i]: request.messages[i] for i, _ in due}
        refs = {ref: [digests[i]] for i, ref in due}
        ttl = (policy.retention_days or self.settings.retention_days) * 86400
        t0 = time.perf_counter()
        try:
            await self.store.save_originals(tenant, conversation, originals, refs, ttl)
        except StoreError:
            if self.settings.on_store_error != "compact-unstored":
                raise
            self.metrics.fail_open("store_unstored")
            log.warning("lossless originals not stored; forwarding the forms (compact-unstored)")
            return True
        finally:
            self.metrics.observe_store("save_originals", time.perf_counter() - t0)
        self.stored_forms.written(tenant, conversation, list(refs), now)
        return False
