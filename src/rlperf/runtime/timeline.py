"""Wall-clock timers of the reference runtime, recorded as the simulator's trace segments.

Each stage is one :class:`rlperf.sim.kernel.Segment` on the pool's track (``all``, the one
colocated pool); sub-steps (a generate batch, a micro-batch, an optimizer step) go to
``all/detail``. On CUDA the device is synchronized before every reading, so a span covers the
kernels it launched.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

import torch

from rlperf.sim.kernel import Segment

POOL = "all"
DETAIL = "all/detail"


class Timeline:
    def __init__(self, device: torch.device, iteration: int = 0) -> None:
        self.device = device
        self.iteration = iteration
        self.segments: list[Segment] = []
        self._t0 = self._now_raw()

    def _now_raw(self) -> float:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return time.perf_counter()

    def now(self) -> float:
        """Seconds since the timeline started."""
        return self._now_raw() - self._t0

    @contextmanager
    def span(self, name: str, track: str = POOL, **args: float) -> Iterator[None]:
        start = self.now()
        yield
        end = self.now()
        self.segments.append(Segment(track, name, start, end, 1, self.iteration, tuple(sorted(args.items()))))

    def stage_times(self) -> dict[str, float]:
        """Seconds per stage (top-level spans), in the order they ran."""
        out: dict[str, float] = {}
        for s in self.segments:
            if s.track == POOL:
                out[s.name] = out.get(s.name, 0.0) + (s.end_s - s.start_s)
        return out
