"""The rollout engine's state across iterations: the newest weights it holds and the requests
it carries over (partial rollout), with the policy version each request started with.

One explicit object that the rollout and weight-sync tasks update through named methods
(instead of closures mutating loose attributes). Staleness of a trained response is
``update index - version its generation started with`` (AReaL records the version per sample;
a carried response keeps the version of the call that generated its first token, the
conservative choice; one that has not started yet takes the weights of the call that starts it).

Whole groups (verl fully_async: the rollouter puts a prompt's sample into the trainer's queue
once all ``n`` of its responses are back): a call delivers the finished responses of the groups
that have no request left unfinished, at the time their last one finished; a finished response
whose group still has requests in flight is *held* until they finish, in a later call. So a
group is delivered once, whole, and ``delivered + held + carried`` is every request admitted.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from rlperf.sim.interface import RolloutBatch, RolloutOutcome

_EMPTY = np.zeros(0, dtype=np.int64)


@dataclass(frozen=True)
class Delivered:
    """Responses one rollout call hands to training (aligned arrays, in batch order; held
    responses of groups completed in the call after the call's own)."""

    seq_tokens: np.ndarray  # prompt + response tokens
    response_tokens: np.ndarray
    finish_s: np.ndarray  # offset from the call's start when training may take it
    versions: np.ndarray  # policy version each response started with

    @property
    def count(self) -> int:
        return len(self.seq_tokens)


@dataclass(frozen=True)
class Admitted:
    """The requests of one rollout call (carried first, then fresh), the policy version each
    started with, and which carried ones go on decoding with their KV (None: none)."""

    batch: RolloutBatch
    versions: np.ndarray
    kv_cached: np.ndarray | None = None


@dataclass
class RolloutState:
    version_synced: int = 0  # newest policy version on the rollout engine
    carry: RolloutBatch | None = None  # unfinished responses (partial rollout)
    carry_version: np.ndarray = field(default_factory=lambda: _EMPTY)
    carry_weights: int = 0  # the engine's weights when the carried requests stopped
    held: RolloutBatch | None = None  # finished responses waiting for their group (whole groups)
    held_version: np.ndarray = field(default_factory=lambda: _EMPTY)

    def synced(self, version: int) -> None:
        """A weight sync of ``version`` completed (syncs may finish out of order)."""
        self.version_synced = max(self.version_synced, version)

    def admit(self, fresh: RolloutBatch, carry_over: bool, keeps_kv: bool = False) -> Admitted:
        """The batch of one rollout call: carried requests first (group ids shifted past the
        fresh ones), then the fresh requests, which start with the newest synced weights, and
        the policy version each request started with. ``keeps_kv`` (the engine is interrupted
        only by a weight update, rlperf.modes.Mode.keeps_kv_between_syncs): when no update came
        since the carried requests stopped, the ones that had started keep their KV."""
        versions = np.full(fresh.num_requests, self.version_synced, np.int64)
        c = self.carry
        if not carry_over or c is None or not c.num_requests:
            return Admitted(fresh, versions)
        offset = int(fresh.group_ids.max(initial=-1)) + 1
        if self.held is not None:  # held responses follow their groups' new ids
            self.held = replace(self.held, group_ids=self.held.group_ids + offset)
        batch = RolloutBatch.concat([replace(c, group_ids=c.group_ids + offset), fresh])
        # A carried request that never started (queued behind the engine's batch) holds no
        # weights yet: it starts with the newest ones, like a fresh request.
        started = c.generated_tokens > 0
        carried = np.where(started, self.carry_version, self.version_synced)
        cached = None
        if keeps_kv and self.carry_weights == self.version_synced and started.any():
            cached = np.concatenate([started, np.zeros(fresh.num_requests, bool)])
        return Admitted(batch, np.concatenate([carried, versions]), cached)

    def settle(self, batch: RolloutBatch, out: RolloutOutcome, versions: np.ndarray, carry_over: bool,
               whole_groups: bool = False) -> Delivered:
        """After a call: keep the unfinished requests for the next call; returns what training
        receives (``whole_groups``: only groups with every response finished, see the module)."""
        finished: np.ndarray = out.generated_tokens >= batch.target_tokens
        ran = replace(batch, generated_tokens=out.generated_tokens)  # the batch after the call
        if carry_over:
            keep = ~finished
            self.carry = ran.take(keep)
            self.carry_version = versions[keep]
            self.carry_weights = self.version_synced
        else:
            assert finished.all(), "rollout without a budget must finish every request"
        seq = batch.prompt_tokens + batch.target_tokens
        if not whole_groups:
            return Delivered(seq[finished], batch.target_tokens[finished], out.finish_s[finished], versions[finished])
        # A group is complete when none of its requests is left unfinished; it is delivered
        # when its last request finishes.
        open_groups = np.unique(batch.group_ids[~finished])
        complete = finished & ~np.isin(batch.group_ids, open_groups)
        ids, inverse = np.unique(batch.group_ids[complete], return_inverse=True)
        done_s = np.full(len(ids), -np.inf)
        np.maximum.at(done_s, inverse.reshape(-1), out.finish_s[complete])
        parts = [Delivered(seq[complete], batch.target_tokens[complete], done_s[inverse.reshape(-1)], versions[complete])]
        wait = finished & ~complete
        h, hv = self.held, self.held_version
        if h is not None:
            go = np.isin(h.group_ids, ids)
            where = np.searchsorted(ids, h.group_ids[go])
            parts.append(Delivered((h.prompt_tokens + h.target_tokens)[go], h.target_tokens[go], done_s[where], hv[go]))
            stay = ~go
            h = h.take(stay)
            hv = hv[stay]
        new = ran.take(wait)
        self.held = new if h is None else RolloutBatch.concat([h, new])
        self.held_version = np.concatenate([hv, versions[wait]])
        # A held response waits for requests of its group still in flight (in the carry).
        assert self.carry is not None and np.isin(self.held.group_ids, self.carry.group_ids).all()
        return Delivered(*(np.concatenate([getattr(d, f) for d in parts])
                           for f in ("seq_tokens", "response_tokens", "finish_s", "versions")))
