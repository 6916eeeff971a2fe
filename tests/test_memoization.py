"""Memoized stage results (rollouts, micro-batch packing) and rollouts without a timeline give
exactly what a fresh, full computation gives."""

from __future__ import annotations

import dataclasses

import numpy as np

from rlperf.scenario import load_scenario
from rlperf.sim import costs as costs_mod
from rlperf.sim.costs import AnalyticCosts
from rlperf.sim.interface import RolloutBatch
from rlperf.sim.run import run_scenario
from rlperf.specs.parallel import TrainLayout
from rlperf.stages import microbatch


def _scenario():  # type: ignore[no-untyped-def]
    return load_scenario({
        "name": "memo",
        "model": "Qwen2.5-0.5B",
        "cluster": {"gpu": "H100", "num_nodes": 1, "gpus_per_node": 4},
        "workload": {
            "prompts_per_step": 16, "group_size": 4,
            "prompt_length": {"kind": "uniform", "min_tokens": 32, "max_tokens": 256},
            "response_length": {"kind": "lognormal", "median_tokens": 400, "sigma": 0.9, "cap_tokens": 2048},
        },
        "algorithm": {"name": "GRPO", "minibatches": 2},
        "plan": {"rollout": {"tp": 1}, "layouts": {"actor": {"max_tokens_per_microbatch": 4096}}},
    })


def _batch() -> RolloutBatch:
    rng = np.random.default_rng(3)
    p = np.repeat(rng.integers(32, 256, 16), 4)
    r = rng.integers(1, 2048, 64)
    return RolloutBatch(p, r, np.zeros(64, np.int64), np.repeat(np.arange(16), 4))


def _same_outcome(a, b) -> None:  # type: ignore[no-untyped-def]
    assert a.cost == b.cost
    assert a.tail_s == b.tail_s
    for f in ("finish_s", "generated_tokens", "replica_finish_s"):
        assert np.array_equal(getattr(a, f), getattr(b, f))


def test_rollout_without_timeline_and_from_the_cache_is_the_fresh_rollout() -> None:
    sc = _scenario()
    costs_mod._ROLLOUTS.clear()
    fresh = AnalyticCosts(sc).rollout(_batch(), 4, None)
    assert fresh.segments
    cached = AnalyticCosts(sc).rollout(_batch(), 4, None)
    bare = AnalyticCosts(sc, timeline=False).rollout(_batch(), 4, None)
    assert len(costs_mod._ROLLOUTS) == 1
    _same_outcome(fresh, cached)
    _same_outcome(fresh, bare)
    assert cached.segments == fresh.segments and bare.segments == ()
    # A different budget is a different rollout.
    AnalyticCosts(sc).rollout(_batch(), 4, 64)
    assert len(costs_mod._ROLLOUTS) == 2


def test_packing_cache_returns_what_packing_computes() -> None:
    rng = np.random.default_rng(0)
    seqs = rng.integers(100, 9000, 300)
    for lay in (TrainLayout(dp=4, max_tokens_per_microbatch=16384), TrainLayout(dp=2, cp=2, max_tokens_per_microbatch=8192),
                TrainLayout(dp=2, max_tokens_per_microbatch=16384),  # the cut above (budget x cp), shared
                TrainLayout(dp=3, max_tokens_per_microbatch=None, micro_batch_size=5)):
        fresh = microbatch._pack(seqs, lay)
        for _ in range(2):
            got = microbatch.microbatches_for(seqs, lay)
            assert np.array_equal(got.lengths, fresh.lengths) and np.array_equal(got.sizes, fresh.sizes)
            assert np.array_equal(got.rank_of, fresh.rank_of) and got.num_ranks == fresh.num_ranks
    # Another batch of the same size is packed on its own.
    other = microbatch.microbatches_for(seqs[::-1] + 1, TrainLayout(dp=4, max_tokens_per_microbatch=16384))
    assert int(other.lengths.sum()) == int(seqs.sum()) + seqs.size


def test_simulation_is_unchanged_by_warm_caches() -> None:
    sc = _scenario()
    costs_mod._ROLLOUTS.clear()
    microbatch._PACKED.clear()
    cold = run_scenario(sc)
    warm = run_scenario(sc)
    assert cold.step_times_s == warm.step_times_s
    assert dataclasses.replace(cold, segments=()) == dataclasses.replace(warm, segments=())


def test_stage_costs_from_the_cache_are_the_fresh_ones() -> None:
    sc = _scenario()
    seqs = np.random.default_rng(5).integers(100, 2000, 64)
    costs_mod._STAGES.clear()
    a = AnalyticCosts(sc)
    fresh_t, fresh_f = a.train("actor", seqs, 4, "actor_update"), a.forward("actor", seqs, 4, "old_logprob")
    assert len(costs_mod._STAGES) == 2
    assert AnalyticCosts(sc).train("actor", seqs, 4, "actor_update") == fresh_t
    assert AnalyticCosts(sc).forward("actor", seqs, 4, "old_logprob") == fresh_f
    assert len(costs_mod._STAGES) == 2
    # Another batch or GPU count is another entry.
    AnalyticCosts(sc).forward("actor", seqs, 2, "old_logprob")
    AnalyticCosts(sc).forward("actor", seqs + 1, 4, "old_logprob")
    assert len(costs_mod._STAGES) == 4
    # Another name for the same pass (the reference's log-probs) shares the entry, named its own.
    from rlperf.stages.forward import forward_pass

    ref = AnalyticCosts(sc).forward("actor", seqs, 4, "ref_logprob")
    assert len(costs_mod._STAGES) == 4
    assert ref == forward_pass(sc.models["actor"], sc.cluster.with_gpus(4), a._train_layout("actor", 4), seqs, name="ref_logprob")


def test_local_mapper_keeps_one_pool_and_the_order() -> None:
    from rlperf.plan.search import LocalMapper

    m = LocalMapper(2)
    assert m(abs, [-3, 1, -2]) == [3, 1, 2]
    pool = m._pool
    assert pool is not None
    assert m(abs, [-5, -6]) == [5, 6] and m._pool is pool


def test_stage_shards_from_the_cache_are_the_fresh_ones() -> None:
    from rlperf.catalog import load_model
    from rlperf.stages.elementwise import EAGER
    from rlperf.stages.shard import stage_shards

    m = load_model("Qwen2.5-0.5B")
    fresh = stage_shards.__wrapped__(m, 2, 2, 1, "value", False, None, EAGER)
    assert stage_shards(m, 2, 2, 1, "value", False, None, EAGER) == fresh
    assert stage_shards(m, 2, 2, 1, "value", False, None, EAGER) is stage_shards(m, 2, 2, 1, "value", False, None, EAGER)
    assert stage_shards(m, 2, 2, 1, "logprobs", False, None, EAGER) != fresh


def test_context_parallel_kind_is_the_layouts() -> None:
    assert TrainLayout(cp=2, cp_kind="ulysses").ulysses and not TrainLayout(cp=2, cp_kind="ulysses").ring_attention
    assert TrainLayout(cp=2, cp_kind="ring").ring_attention and not TrainLayout(cp=2, cp_kind="ring").ulysses
    assert not TrainLayout(cp=1, cp_kind="ulysses").ulysses and not TrainLayout(cp=1, cp_kind="ring").ring_attention


def test_shared_layout_costs_give_what_a_fresh_instance_gives() -> None:
    from rlperf.catalog import load_model
    from rlperf.specs.hardware_catalog import make_cluster
    from rlperf.stages.microbatch import microbatches_for
    from rlperf.stages.pass_cost import LayoutCosts, MicroBatchShapes

    m, cl = load_model("Qwen2.5-0.5B"), make_cluster("H100", num_gpus=8)
    lay = TrainLayout(dp=2, tp=2, pp=2, max_tokens_per_microbatch=4096)
    shared = LayoutCosts.of(m, cl, lay)
    assert LayoutCosts.of(m, cl, lay) is shared and LayoutCosts.of(m, cl, lay, "value") is not shared
    for seed in (1, 2):  # the second batch meets the shared instance's warm caches
        shapes = MicroBatchShapes.of(microbatches_for(np.random.default_rng(seed).integers(50, 3000, 64), lay))
        fresh = LayoutCosts(m, cl, lay)
        for a, b in zip(shared.shards, fresh.shards):
            fa, fb = shared.forward(a, shapes), fresh.forward(b, shapes)
            for x, y in ((fa, fb), (shared.backward(a, shapes, fa), fresh.backward(b, shapes, fb))):
                assert all(np.array_equal(getattr(x, f.name), getattr(y, f.name))
                           for f in dataclasses.fields(x))


def test_primed_collectives_are_the_ones_costed_plan_by_plan() -> None:
    from rlperf.catalog import load_model
    from rlperf.specs.hardware_catalog import make_cluster
    from rlperf.stages.microbatch import microbatches_for
    from rlperf.stages.pass_cost import LayoutCosts, MicroBatchShapes

    m, cl = load_model("Qwen2.5-0.5B"), make_cluster("H100", num_gpus=16)
    lay = TrainLayout(dp=2, tp=2, pp=2, cp=2, ep=1, max_tokens_per_microbatch=2048)
    rng = np.random.default_rng(4)
    plans = [MicroBatchShapes.of(microbatches_for(rng.integers(50, 3000, 48), lay)) for _ in range(3)]
    plans.append(MicroBatchShapes.single(np.array([2999])))
    primed, plain = LayoutCosts(m, cl, lay), LayoutCosts(m, cl, lay)
    primed.prime(plans)
    for shapes in plans:
        for a, b in zip(primed.shards, plain.shards):
            fa, fb = primed.forward(a, shapes), plain.forward(b, shapes)
            for x, y in ((fa, fb), (primed.backward(a, shapes, fa), plain.backward(b, shapes, fb))):
                assert all(np.array_equal(getattr(x, f.name), getattr(y, f.name)) for f in dataclasses.fields(x))


def test_estimator_keeps_a_partial_and_a_streaming_steady_call_apart() -> None:
    """A partial rollout's steady call cuts responses at their start, a stream's at its own
    phase: with equal budgets the estimator's memo must still give each its own call."""
    from rlperf.plan.estimate import Estimator
    from rlperf.plan.space import Candidate
    from rlperf.specs.plan import ExecutionMode, Placement
    from tests.test_scenarios import small

    sc = small("grpo-qwen2.5-7b-async-s2", prompts=16)
    stream = sc.plan.model_copy(update={"mode": ExecutionMode(kind="streaming", staleness_threshold=0.5),
                                        "placement": Placement(kind="disaggregated", rollout_gpus=8)})
    est = Estimator(sc)
    delta = est.mode(stream).steady_budget(est.batch, est.slots(stream, 8))
    assert delta is not None
    partial = stream.model_copy(update={"mode": ExecutionMode(kind="partial_rollout", token_budget=delta)})
    est.estimate(Candidate(partial, "partial"))
    assert est.estimate(Candidate(stream, "stream")) == Estimator(sc).estimate(Candidate(stream, "stream"))
