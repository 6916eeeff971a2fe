"""The rollout engine's state across iterations: the newest weights it holds and the requests
it carries over (partial rollout), with the policy version each request started with.

One explicit object that the rollout and weight-sync tasks update through named methods
(instead of closures mutating loose attributes). Staleness of a trained response is
``update index - version its generation started with`` (AReaL records the version per sample;
a carried response keeps the version of the call that generated its first token, the
conservative choice; one that has not started yet takes the weights of the call that starts it).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from rlperf.sim.interface import RolloutBatch, RolloutOutcome

_EMPTY = np.zeros(0, dtype=np.int64)


@dataclass
class RolloutState:
    version_synced: int = 0  # newest policy version on the rollout engine
    carry: RolloutBatch | None = None  # unfinished responses (partial rollout)
    carry_version: np.ndarray = field(default_factory=lambda: _EMPTY)

    def synced(self, version: int) -> None:
        """A weight sync of ``version`` completed (syncs may finish out of order)."""
        self.version_synced = max(self.version_synced, version)

    def admit(self, fresh: RolloutBatch, carry_over: bool) -> tuple[RolloutBatch, np.ndarray]:
        """The batch of one rollout call: carried requests first (group ids shifted past the
        fresh ones), then the fresh requests, which start with the newest synced weights.
        Returns the batch and the policy version each request started with."""
        versions = np.full(fresh.num_requests, self.version_synced, np.int64)
        c = self.carry
        if not carry_over or c is None or not c.num_requests:
            return fresh, versions
        offset = int(fresh.group_ids.max(initial=-1)) + 1
        batch = RolloutBatch(
            np.concatenate([c.prompt_tokens, fresh.prompt_tokens]),
            np.concatenate([c.target_tokens, fresh.target_tokens]),
            np.concatenate([c.generated_tokens, fresh.generated_tokens]),
            np.concatenate([c.group_ids + offset, fresh.group_ids]),
        )
        # A carried request that never started (queued behind the engine's batch) holds no
        # weights yet: it starts with the newest ones, like a fresh request.
        carried = np.where(c.generated_tokens > 0, self.carry_version, self.version_synced)
        return batch, np.concatenate([carried, versions])

    def settle(self, batch: RolloutBatch, out: RolloutOutcome, versions: np.ndarray, carry_over: bool) -> np.ndarray:
        """After a call: keep the unfinished requests for the next call; returns the finished mask."""
        finished: np.ndarray = out.generated_tokens >= batch.target_tokens
        if carry_over:
            keep = ~finished
            self.carry = RolloutBatch(batch.prompt_tokens[keep], batch.target_tokens[keep], out.generated_tokens[keep],
                                      batch.group_ids[keep])
            self.carry_version = versions[keep]
        else:
            assert finished.all(), "rollout without a budget must finish every request"
        return finished
