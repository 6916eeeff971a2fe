"""Run a resolved scenario through the simulator with the analytic stage costs."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from rlperf.memo import BoundedMemo
from rlperf.scenario import Scenario
from rlperf.sim.result import SimResult
from rlperf.sim.simulate import SimConfig, simulate
from rlperf.specs.workload import Workload


# Draws already made in this process, by (workload, step, prompts): the planner simulates many
# plans of one workload, and each simulation draws the same steps again. A draw is a pure
# function of those and its arrays are read-only (rlperf.specs.workload.WorkloadSample).
_DRAWS: BoundedMemo[tuple[str, int, int], tuple[np.ndarray, np.ndarray]] = BoundedMemo(256)


def sampler(workload: Workload) -> Callable[[int, int], tuple[np.ndarray, np.ndarray]]:
    """(step, num_prompts) -> (prompt lengths (B,), response lengths (B, G)), seeded by step.

    Oversampled rollouts (DAPO rounds, PRIME) ask for more prompts than the workload's batch;
    the workload is then re-drawn with that many prompts (same seed and step)."""
    cache: dict[int, Workload] = {workload.prompts_per_step: workload}
    key = workload.model_dump_json()

    def sample(step: int, num_prompts: int) -> tuple[np.ndarray, np.ndarray]:
        got = _DRAWS.get((key, step, num_prompts))
        if got is not None:
            return got
        w = cache.get(num_prompts)
        if w is None:
            w = cache[num_prompts] = workload.model_copy(update={"prompts_per_step": num_prompts})
        s = w.sample(step)
        return _DRAWS.put((key, step, num_prompts), (np.asarray(s.prompt_tokens, np.int64),
                                                     np.asarray(s.response_tokens, np.int64)))

    return sample


def sim_config(sc: Scenario) -> SimConfig:
    price = sc.cluster.accelerator.price_usd_per_hour
    return SimConfig(
        name=sc.name,
        algorithm=sc.algorithm,
        plan=sc.plan,
        num_gpus=sc.cluster.num_gpus,
        prompts_per_step=sc.workload.prompts_per_step,
        group_size=sc.workload.group_size,
        sample=sampler(sc.workload),
        epochs=sc.epochs,
        minibatches=sc.minibatches,
        keep_rate=sc.spec.algorithm.keep_rate,
        reward_on_gpu=sc.spec.algorithm.reward.kind == "model",
        iterations=sc.spec.simulation.iterations,
        warmup=sc.spec.simulation.warmup,
        price_usd_per_gpu_hour=price,
        max_response_tokens=sc.workload.max_response_tokens,
    )


def run_scenario(sc: Scenario, timeline: bool = True) -> SimResult:
    """``timeline=False``: no engine segments in the result (a planner reads figures only)."""
    from rlperf.sim.costs import AnalyticCosts

    return simulate(sim_config(sc), AnalyticCosts(sc, timeline=timeline))
