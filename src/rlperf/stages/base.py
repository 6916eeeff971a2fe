"""What every stage cost model returns: time on the given devices, and its work and depth.

Work-depth (Blelloch 1996; Brent 1974): a stage has work ``W`` (here ``work_s``, the
device-seconds the stage needs on one device at its roofline rate, plus the FLOPs, bytes and
communicated bytes behind it) and depth ``D`` (``depth_s``, the critical path with unlimited
devices, e.g. decode depth = longest response x per-token latency at batch 1). On ``P``
devices any schedule takes at least ``max(W/P, D)`` and a greedy one at most ``W/P + D``
(Brent's theorem). The predicted ``time_s`` of a concrete layout sits between the two only up
to modelled overheads (communication, bubbles), which is exactly what the gap report shows.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class StageCost:
    """Cost of one stage (or sub-stage) on a concrete layout."""

    name: str
    time_s: float  # predicted wall time on ``num_gpus`` devices
    num_gpus: int
    work_s: float  # device-seconds of work at the roofline rate (W)
    depth_s: float  # critical path with unlimited devices (D)
    flops: float = 0.0
    hbm_bytes: float = 0.0  # bytes moved to/from device memory, all devices
    comm_bytes: float = 0.0  # bytes sent over links, all ranks
    peak_memory_bytes: float = 0.0  # per device
    # Named components of time_s, e.g. (("compute", 3.1), ("tp_comm", 0.4), ("bubble", 0.6)).
    breakdown: tuple[tuple[str, float], ...] = field(default=())

    def __post_init__(self) -> None:
        assert self.time_s >= 0 and self.work_s >= 0 and self.depth_s >= 0, self
        assert self.num_gpus >= 1, self

    @property
    def parallelism(self) -> float:
        """Average parallelism W/D: how many devices the stage can keep busy."""
        return self.work_s / self.depth_s if self.depth_s > 0 else float("inf")

    def lower_bound_s(self, num_gpus: int | None = None) -> float:
        """max(W/P, D): no schedule on P devices is faster."""
        p = num_gpus or self.num_gpus
        return max(self.work_s / p, self.depth_s)

    def brent_bound_s(self, num_gpus: int | None = None) -> float:
        """W/P + D: a greedy schedule on P devices is no slower (Brent's theorem)."""
        p = num_gpus or self.num_gpus
        return self.work_s / p + self.depth_s

    def component(self, name: str) -> float:
        return sum(v for k, v in self.breakdown if k == name)
