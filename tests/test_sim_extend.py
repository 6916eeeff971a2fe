"""A simulation continued to more iterations (Simulator.extend, Kernel.hold) is the simulation
of the longer run from the start, bit for bit."""

from __future__ import annotations

from dataclasses import asdict, replace
from unittest.mock import patch

from hypothesis import given, settings
from hypothesis import strategies as st

from rlperf.algorithms import get_algorithm
from rlperf.sim.kernel import Kernel, Task, TaskRun
from rlperf.sim.result import SimResult
from rlperf.sim.simulate import MAX_SETTLE_ITERATIONS, SimConfig, Simulator, simulate
from rlperf.specs.plan import ExecutionMode, Placement, Plan
from tests.helpers.toy_costs import ToyCosts, toy_sampler


def _pipeline(iterations: int, gen_s: float, train_s: float, held_from: int | None = None) -> Kernel:
    """A pipelined loop on two pools and a shared one: rollout ``i`` waits for update ``i - 2``,
    a sync of each version takes both pools, and a checker on the shared pool backfills."""
    k = Kernel({"gen": 4, "train": 4, "cpu": 2})

    def fixed(d: float):  # type: ignore[no-untyped-def]
        return lambda now, grant: TaskRun(duration_s=d)

    for i in range(iterations):
        dur = gen_s * (1 + (i * 7) % 3)
        k.add(Task(f"gen#{i}", (i, 1), (f"sync#{i - 1}",) if i >= 2 else (), {"gen": (4, 4)}, fixed(dur), i))
        k.add(Task(f"check#{i}", (i, 2), (f"gen#{i}",), {"cpu": (1, 2)}, fixed(0.5 * dur), i))
        k.add(Task(f"train#{i}", (i, 3), (f"gen#{i}",), {"train": (4, 4)}, fixed(train_s), i))
        k.add(Task(f"sync#{i}", (i, 4), (f"train#{i}",), {"gen": (2, 4), "train": (4, 4)}, fixed(0.3), i))
    if held_from is not None:
        k.hold(held_from, lambda: "state")
    return k


def _schedule(k: Kernel) -> list[tuple[str, float, float, dict[str, int]]]:
    return [(t.name, t.start_s, t.end_s, t.granted) for t in k.done]


@settings(max_examples=25, deadline=None)
@given(st.integers(1, 5), st.integers(1, 4), st.floats(0.5, 5.0), st.floats(0.5, 5.0))
def test_a_held_run_continued_is_the_longer_run(short: int, more: int, gen_s: float, train_s: float) -> None:
    longer = _pipeline(short + more, gen_s, train_s)
    longer.run()
    k = _pipeline(short + more, gen_s, train_s, held_from=short)
    k.run()
    alone = _pipeline(short, gen_s, train_s)
    alone.run()
    assert _schedule(k) == _schedule(alone)  # held tasks change nothing before they are released
    cp = k.checkpoint
    assert cp is not None and cp.saved == "state"
    k.restore(cp)
    k.hold(None)
    k.run()
    assert _schedule(k) == _schedule(longer)


def _cfg(mode: ExecutionMode, placement: Placement, iterations: int, seed: int) -> SimConfig:
    plan = Plan(placement=placement, mode=mode)
    return SimConfig(name="toy", algorithm=get_algorithm("GRPO"), plan=plan, num_gpus=8, prompts_per_step=8,
                     group_size=4, sample=toy_sampler(seed), minibatches=2, iterations=iterations, warmup=1,
                     max_response_tokens=2000)


def _from_the_start(cfg: SimConfig) -> SimResult:
    """The longer runs simulated from the start each time (how simulate() extended its warm-up
    before it continued the run instead)."""
    sim = Simulator(cfg, ToyCosts())
    result = sim.run()
    for _ in range(2):
        need = min(max(sim.settle_iterations(), sim.warmup_needed), MAX_SETTLE_ITERATIONS)
        if need <= sim.warmup:
            break
        cfg = replace(cfg, iterations=need + cfg.iterations - sim.warmup, warmup=need)
        sim = Simulator(cfg, ToyCosts())
        result = sim.run()
    return result


STREAMING = st.builds(lambda t, k, g, f: ExecutionMode(kind="streaming", staleness_threshold=t, train_parts=k,
                                                       groups_per_engine=g, inflight_weight_updates=f),
                      st.sampled_from([0.0, 0.5, 1.0, 2.0]), st.sampled_from([1, 2, 4]), st.sampled_from([None, 1, 2]),
                      st.booleans())
OTHER = st.sampled_from([ExecutionMode(kind="partial_rollout", token_budget=150), ExecutionMode(kind="async", staleness=2),
                         ExecutionMode(kind="one_step_off"), ExecutionMode()])
PLACEMENTS = st.sampled_from([Placement(), Placement(kind="disaggregated", rollout_gpus=2),
                              Placement(kind="disaggregated", rollout_gpus=6)])


@settings(max_examples=20, deadline=None)
@given(mode=st.one_of(STREAMING, OTHER), placement=PLACEMENTS, iterations=st.integers(2, 4), seed=st.integers(0, 9))
def test_a_continued_simulation_equals_the_longer_one_from_the_start(mode: ExecutionMode, placement: Placement,
                                                                     iterations: int, seed: int) -> None:
    cfg = _cfg(mode, placement, iterations, seed)
    extended: list[int] = []
    real_go_on = Simulator.go_on

    def counting(self: Simulator, longer: SimConfig) -> None:
        extended.append(longer.iterations)
        real_go_on(self, longer)

    with patch.object(Simulator, "go_on", counting):
        got = simulate(cfg, ToyCosts())
    assert asdict(got) == asdict(_from_the_start(cfg))
    if got.iterations > iterations and Simulator(cfg, ToyCosts()).may_settle_later:
        assert extended[-1] == got.iterations  # continued, not simulated again from the start


def test_streaming_runs_are_continued() -> None:
    # A streaming plan whose carried requests need more warm-up than asked for: simulated once,
    # continued twice at most, never restarted.
    cfg = _cfg(ExecutionMode(kind="streaming", staleness_threshold=1.0), Placement(kind="disaggregated", rollout_gpus=2),
               3, 0)
    runs: list[int] = []
    real_start = Simulator.start

    def counting(self: Simulator, longest: int | None = None) -> None:
        runs.append(self.cfg.iterations)
        real_start(self, longest)

    with patch.object(Simulator, "start", counting):
        got = simulate(cfg, ToyCosts())
    assert runs == [3] and got.iterations > 3
    assert asdict(got) == asdict(_from_the_start(cfg))
