"""Benchmark of the request-granularity rollout model (prints figures; no assertions).

    .venv/bin/python bench/bench_rollout.py

Workload: 1,024 prompts x 8 samples = 8,192 requests, Qwen2.5-7B, 64 H100s. Prompts are
log-normal (median 600, cap 2,048); responses are log-normal (median 8,000, sigma 1.0) truncated
at 32,768 with the clipped mass at the cap, lengths correlated within a group (rho 0.5).
Qwen2.5-7B has 28 attention heads, so tp=8 does not divide it: the 8-GPU replica is tp4 x pp2.

Part 1 times one simulation per layout. Part 2 shows that the cost follows the number of
requests (1k..8k) and not the number of tokens (the same requests with responses 4x longer).
"""

from __future__ import annotations

import time

import numpy as np

from rlperf.catalog import load_model
from rlperf.specs.hardware_catalog import make_cluster
from rlperf.specs.lengths import LogNormalLength
from rlperf.specs.parallel import EngineLayout
from rlperf.specs.workload import Workload
from rlperf.stages.rollout import RolloutRequests, RolloutResult, simulate_rollout

MODEL = load_model("Qwen2.5-7B")
CLUSTER = make_cluster("H100", num_gpus=64)
LAYOUTS = {
    "64 x tp1": EngineLayout(tp=1, replicas=64),
    "16 x tp4": EngineLayout(tp=4, replicas=16),
    "8 x tp4pp2": EngineLayout(tp=4, pp=2, replicas=8),
}


def requests(num_prompts: int, stretch: int = 1, group_size: int = 8) -> RolloutRequests:
    """Requests of one step; ``stretch`` multiplies every response length (and the cap)."""
    wl = Workload(
        prompts_per_step=num_prompts,
        group_size=group_size,
        prompt_length=LogNormalLength(median_tokens=600, sigma=0.5, cap_tokens=2048),
        response_length=LogNormalLength(median_tokens=8000, sigma=1.0, cap_tokens=32768),
        group_length_correlation=0.5,
        seed=0,
    )
    s = wl.sample(0)
    return RolloutRequests.build(
        s.prompt_tokens[s.group_ids], s.flat_response_tokens * stretch, s.group_ids
    )


def timed(
    layout: EngineLayout, req: RolloutRequests, repeat: int = 3
) -> tuple[float, RolloutResult]:
    best, res = float("inf"), None
    for _ in range(repeat):
        t0 = time.perf_counter()
        res = simulate_rollout(MODEL, CLUSTER, layout, req)
        best = min(best, time.perf_counter() - t0)
    assert res is not None
    return best, res


def part1() -> None:
    req = requests(1024)
    r = req.response_tokens
    print(
        f"workload: {req.num_requests} requests, response mean {r.mean():.0f} / max {r.max()} tokens, "
        f"{np.mean(r == 32768):.1%} at the cap, {int(r.sum()):,} tokens to generate"
    )
    head = f"{'layout':<12} {'wall s':>7} {'events':>7} {'makespan s':>10} {'tail s':>7} {'<25% slots s':>12} {'preempt':>7} {'tok/s':>9} {'depth s':>8} {'lower bound s':>13}"
    print(head)
    for name, lay in LAYOUTS.items():
        wall, res = timed(lay, req)
        print(
            f"{name:<12} {wall:7.3f} {len(res.segments):7d} {res.makespan_s:10.1f} {res.tail_s:7.1f} "
            f"{res.below_25pct_slots_s:12.1f} {res.num_preemptions:7d} {res.decode_tokens_per_s:9.0f} "
            f"{res.depth_s:8.1f} {res.lower_bound_s():13.1f}"
        )


def part2() -> None:
    lay = LAYOUTS["8 x tp4pp2"]
    print("\nscaling on 8 x tp4pp2 (wall s, best of 3; events = timeline segments)")
    print(
        f"{'requests':>8} {'tokens':>13} {'wall s':>7} {'events':>7} | {'tokens x4':>13} {'wall s':>7} {'events':>7} {'preempt':>7}"
    )
    for prompts in (128, 256, 512, 1024):
        base, long = requests(prompts), requests(prompts, stretch=4)
        w1, r1 = timed(lay, base)
        w4, r4 = timed(lay, long)
        print(
            f"{base.num_requests:8d} {int(base.response_tokens.sum()):13,d} {w1:7.3f} {len(r1.segments):7d} | "
            f"{int(long.response_tokens.sum()):13,d} {w4:7.3f} {len(r4.segments):7d} {r4.num_preemptions:7d}"
        )


if __name__ == "__main__":
    part1()
    part2()
