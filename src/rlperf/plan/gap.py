"""What keeps a simulated plan away from its work-depth bound, named from the simulation.

The simulator's bound (rlperf.sim.result.Bounds) is ``max(max_p W_p / P_p, max_p Σ D_stage,
D_iter / (s + 1))``. Over one steady step, every GPU pool ``p`` is either running a stage or
idle, so its step splits as

    step = idle_p + Σ_{stages on p} time_stage
         = idle_p + Σ_{stages on p} (time_stage - W_stage / P_p) + W_p / P_p

with ``W_stage / P_p`` the stage's share of the pool's work term (its time at roofline on the
whole pool). On the pool that decides the step (the least idle one) the gap to the bound is
therefore at most ``idle_p + Σ excess_stage`` (``W_p / P_p`` is at most the bound), and the
largest of these parts is the term that keeps the plan away from its bound:

- ``pool_idle``: the pool waits for stages on other pools (a synchronous step serializes the
  pools; a pipelined loop whose pools are unbalanced leaves the faster one waiting);
- ``rollout_tail``: the rollout's last 10% of responses, decoded at small batches
  (``SimResult.rollout_tail_s``), as far as the rollout's excess covers it;
- ``decode_below_roofline``: the rest of the rollout's excess: decode steps latency- or
  overhead-bound at the batch the engine holds (per-step launch, all-reduce and host costs);
- ``stage_below_roofline``: any other stage's time past its roofline work on the pool
  (pipeline bubbles, communication, a stage that holds part of the pool).

Stages that overlap on a pool (stage fusion) are counted once each, so the parts may sum past
the gap; they rank causes, they are not a partition.
"""

from __future__ import annotations

from dataclasses import dataclass

from rlperf.sim.result import SimResult


def seconds_text(t: float) -> str:
    """Seconds as the plan output prints them (sub-second plans of small questions included)."""
    if t >= 100:
        return f"{t:.0f} s"
    return f"{t:.1f} s" if t >= 1 else f"{t * 1e3:.0f} ms"


@dataclass(frozen=True)
class GapTerm:
    kind: str  # pool_idle | rollout_tail | decode_below_roofline | stage_below_roofline
    seconds: float  # seconds per step it accounts for
    detail: str


@dataclass(frozen=True)
class BoundGap:
    step_s: float
    bound_s: float
    ratio: float  # step / bound
    bound_term: str  # the term of the bound that is largest (means over the window)
    pool: str  # the pool whose step is decomposed (the least idle one)
    terms: tuple[GapTerm, ...]  # largest first

    def headline(self) -> str:
        lead = f"{self.ratio:.2f}x its work-depth bound ({seconds_text(self.bound_s)}, set by {self.bound_term})"
        if not self.terms or self.terms[0].seconds <= 0.0:
            return lead
        return f"{lead}; kept from it mostly by {self.terms[0].detail}"


def bound_gap(r: SimResult) -> BoundGap:
    """The terms of ``r``'s step past its work-depth bound, largest first (module docstring)."""
    pools = {p.name: p for p in r.pools}
    on_pool: dict[str, list[tuple[str, float, float, float]]] = {}  # name, time, work, depth
    for s in r.stages:
        if s.pool in pools:
            on_pool.setdefault(s.pool, []).append((s.name, s.time_s, s.work_s, s.depth_s))
    candidates = [(f"work of pool {p} (W/P)", sum(w for _, _, w, _ in st) / pools[p].num_gpus) for p, st in on_pool.items()]
    candidates += [(f"stage depths on pool {p}", sum(d for _, _, _, d in st)) for p, st in on_pool.items()]
    b = r.bounds
    candidates.append((f"iteration depth D/(s+1) with s = {b.staleness}", b.depth_s / (b.staleness + 1)))
    bound_term = max(candidates, key=lambda c: c[1])[0]
    busiest = min(pools.values(), key=lambda p: (p.idle_s_per_step, -sum(w for _, _, w, _ in on_pool.get(p.name, [])) / p.num_gpus))
    g = busiest.num_gpus
    terms: list[GapTerm] = []
    if busiest.idle_s_per_step > 0.0:
        why = "for stages on other pools" if len(pools) > 1 else "between stages"
        terms.append(GapTerm("pool_idle", busiest.idle_s_per_step,
                             f"pipeline idle: pool {busiest.name} ({g} GPUs) waits {seconds_text(busiest.idle_s_per_step)} per step {why}"))
    for name, time_s, work_s, _ in on_pool.get(busiest.name, []):
        floor = work_s / g
        excess = time_s - floor
        if excess <= 0.0:
            continue
        if name == "generate":
            tail = min(r.rollout_tail_s, excess)
            if tail > 0.0:
                terms.append(GapTerm("rollout_tail", tail, f"the rollout tail: the last 10% of responses take {seconds_text(tail)} "
                                                           f"of the {seconds_text(time_s)} rollout at small decode batches"))
            rest = excess - tail
            if rest > 0.0:
                terms.append(GapTerm("decode_below_roofline", rest,
                                     f"decode below roofline: the rollout's bulk runs {seconds_text(rest)} past its work at roofline "
                                     f"({seconds_text(floor)} on {g} GPUs): decode steps are latency- and overhead-bound"))
        else:
            terms.append(GapTerm("stage_below_roofline", excess,
                                 f"{name} runs {seconds_text(excess)} past its work at roofline ({seconds_text(floor)} on {g} GPUs)"))
    terms.sort(key=lambda t: (-t.seconds, t.kind))
    step = r.step_time_s
    lb = b.lower_bound_s
    return BoundGap(step, lb, step / lb if lb > 0 else float("inf"), bound_term, busiest.name, tuple(terms))
