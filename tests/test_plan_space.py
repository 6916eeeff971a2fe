"""The plan space's knobs: memory rungs (recompute, token budget, ZeRO stage, offload) chosen by
the memory model and agreeing with the training stage's own memory check, ring attention where
Ulysses cannot split the heads, interleaved pipelines, splits at every node boundary."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from rlperf.api import build_scenario
from rlperf.cost.memory import inference_memory, train_memory
from rlperf.errors import SpecError
from rlperf.plan.space import (
    Candidate,
    MemoryRungs,
    SearchOptions,
    _engine_holds_a_sequence,
    engine_layouts,
    enumerate_candidates,
    placements,
    train_layouts,
)
from rlperf.scenario import Scenario, load_scenario
from rlperf.stages.train import train_step


def _scenario(**q: object) -> Scenario:
    return build_scenario(None, **q)[0]  # type: ignore[arg-type]


def _fits_train_step(sc: Scenario, lay: object, gpus: int) -> bool:
    """The training stage's own memory check (rlperf.stages.train) on the scenario's batch."""
    from rlperf.specs.parallel import TrainLayout

    assert isinstance(lay, TrainLayout)
    s = sc.workload.sample(0)
    seq = np.repeat(np.asarray(s.prompt_tokens), len(s.response_tokens[0])) + np.asarray(s.response_tokens).reshape(-1)
    try:
        train_step(sc.models["actor"], sc.cluster.with_gpus(gpus), lay.model_copy(update={"dp": gpus // (lay.tp * lay.pp * lay.cp)}),
                   seq, num_minibatches=sc.minibatches, epochs=sc.epochs)
    except SpecError as err:
        assert "GB per GPU" in str(err), err
        return False
    return True


@pytest.mark.parametrize(("question", "gpus"), [
    ({"model": "Qwen2.5-0.5B", "nodes": 1, "gpus_per_node": 2}, 2),
    ({"model": "Qwen2.5-7B", "nodes": 1, "prompts": 64, "group_size": 8}, 8),
    ({"model": "Qwen2.5-32B", "nodes": 2, "prompts": 32, "group_size": 4}, 16),
])
def test_the_chosen_rung_passes_the_training_stage_memory_check(question: dict[str, object], gpus: int) -> None:
    sc = _scenario(**question)
    rungs = MemoryRungs(sc)
    chosen = 0
    for base in train_layouts(sc):
        lay = rungs.fitted(base, gpus)
        if lay is base:
            continue  # nothing fits: the plain layout stays and its rejection names why
        chosen += 1
        assert _fits_train_step(sc, lay, gpus), lay
        if lay.recompute == "none":
            # The fastest rung that fits: full recompute would only add the forward's replay.
            assert lay.zero_stage == 3 or lay.tp > 1 or lay.pp > 1 or lay.ep > 1 or lay.cp_kind == "ring"
        else:
            # The fast rung did not fit at any budget that still holds the longest sequence.
            b = max(1024, base.max_tokens_per_microbatch or 0)
            assert not _fits_train_step(sc, base.model_copy(update={"recompute": "none", "max_tokens_per_microbatch": b}), gpus)
    assert chosen


def test_roomy_pools_drop_recompute_and_model_parallel_layouts_drop_zero3() -> None:
    sc = _scenario(model="Qwen2.5-0.5B", nodes=1, gpus_per_node=2)
    dp = next(lay for lay in train_layouts(sc) if lay.tp == lay.cp == 1)
    tp = next(lay for lay in train_layouts(sc) if lay.tp == 2)
    rungs = MemoryRungs(sc)
    assert (rungs.fitted(dp, 2).recompute, rungs.fitted(dp, 2).zero_stage) == ("none", 3)
    assert (rungs.fitted(tp, 2).recompute, rungs.fitted(tp, 2).zero_stage) == ("none", 1)
    # The forward-only passes keep the layout's budget when the update's shrank.
    assert rungs.fitted(dp, 2).forward_max_tokens_per_microbatch in (None, dp.max_tokens_per_microbatch)


def test_a_model_too_big_for_its_pool_is_rescued_by_offload_or_smaller_budgets() -> None:
    sc = _scenario(model="Qwen2.5-32B", nodes=1, prompts=32, group_size=4)
    rungs = MemoryRungs(sc)
    base = next(lay for lay in train_layouts(sc) if lay.tp == 1 and lay.pp == 1)
    got = rungs.fitted(base, 8)
    max_seq = sc.workload.max_sequence_tokens
    mem = train_memory(sc.models["actor"], got.model_copy(update={"dp": 8 // (got.tp * got.cp)}),
                       max((got.max_tokens_per_microbatch or 0) * got.cp, max_seq), seq_len=max_seq)
    assert mem.total_bytes <= sc.cluster.accelerator.device_memory_bytes
    assert got.offload_optimizer or got.recompute != "none" or got.max_tokens_per_microbatch != base.max_tokens_per_microbatch


def test_ring_attention_where_ulysses_cannot_split_the_heads() -> None:
    sc = _scenario(model="Qwen2.5-7B", nodes=1)  # 28 heads: cp 2 x tp 4 does not divide them
    lays = {(lay.tp, lay.cp): lay.cp_kind for lay in train_layouts(sc)}
    assert lays[(4, 2)] == "ring" and lays[(2, 2)] == "ulysses" and lays[(1, 1)] == "ulysses"


def test_pipelines_run_interleaved_in_the_fast_rung() -> None:
    sc = _scenario(model="Qwen2.5-32B", nodes=2, prompts=32, group_size=4)
    rungs = MemoryRungs(sc)
    pairs = [(lay, rungs.fitted(lay, 16)) for lay in train_layouts(sc) if lay.pp > 1]
    fitted = [f for _, f in pairs]
    fast = [(o, f) for o, f in pairs if f.recompute == "none"]
    assert any(f.virtual_stages == 2 and f.pp_schedule == "interleaved" for _, f in fast)
    for o, f in fast:
        if sc.models["actor"].num_layers % (2 * o.pp) == 0 and f.pp_schedule != "interleaved":
            # interleaving keeps more micro-batches in flight: plain 1F1B only where it does not fit
            inter = o.model_copy(update={
                "pp_schedule": "interleaved", "virtual_stages": 2, "recompute": "none",
                "max_tokens_per_microbatch": f.max_tokens_per_microbatch,
                "forward_max_tokens_per_microbatch": f.forward_max_tokens_per_microbatch})
            assert not rungs._fits(inter, 16)
    assert all(lay.virtual_stages == 1 for lay in fitted if lay.recompute != "none")


@pytest.mark.parametrize(("nodes", "splits"), [(8, list(range(8, 64, 8))), (16, [32, 64, 96])])
def test_splits_at_every_node_boundary_up_to_eight_nodes(nodes: int, splits: list[int]) -> None:
    sc = _scenario(model="Qwen2.5-7B", nodes=nodes)
    got = sorted(p.rollout_gpus or 0 for p, _ in placements(sc, 4) if p.kind == "disaggregated")
    assert got == splits


def test_candidate_labels_name_the_knobs_that_differ() -> None:
    sc = _scenario(model="Qwen2.5-0.5B", nodes=1, gpus_per_node=2)
    labels = [c.label for c in enumerate_candidates(sc, SearchOptions()) if isinstance(c, Candidate)]
    assert any("recompute none" in lab and "zero1" in lab and "train tp2" in lab for lab in labels)
    assert len(labels) == len(set(labels))


def test_engine_pipelines_only_when_no_single_node_engine_holds_a_sequence() -> None:
    big = load_scenario(Path(__file__).parents[1] / "src/rlperf/scenarios/grpo-deepseek-v3-h20.yaml")  # 671B on 96 GB H20s
    engines = engine_layouts(big)
    assert not any(_engine_holds_a_sequence(big, e) for e in engines if e.pp == 1)
    piped = [e for e in engines if e.pp > 1]
    assert piped and _engine_holds_a_sequence(big, piped[-1]) and all(e.ep == e.tp * e.pp for e in piped)
    assert all(e.pp == 1 for e in engine_layouts(_scenario(model="Qwen2.5-7B", nodes=2)))


@pytest.mark.parametrize("question", [{}, {"model": "Qwen3-8B", "nodes": 4}, {"model": "Qwen2.5-32B", "nodes": 2}])
def test_engine_max_num_seqs_is_what_its_kv_cache_holds_at_the_mean_length(question: dict[str, object]) -> None:
    sc = _scenario(**question)
    wl = sc.workload
    mean_seq = wl.prompt_length.mean_tokens() + wl.response_length.mean_tokens()
    base = sc.plan.rollout.max_num_seqs
    for e in engine_layouts(sc):
        held = inference_memory(sc.models["actor"], e, sc.cluster.accelerator.device_memory_bytes).kv_capacity_tokens / mean_seq
        assert base <= e.max_num_seqs <= max(base, 1024)
        if e.max_num_seqs > base:  # raised: the nearest power of two to what the cache holds
            assert e.max_num_seqs == 1024 or e.max_num_seqs / 2**0.5 <= held * 1.01 < e.max_num_seqs * 2**0.5
        else:
            assert held < base * 2**0.5 * 1.01


def test_fine_splits_only_on_the_questions_own_cluster() -> None:
    sc = _scenario(model="Qwen2.5-7B", nodes=8)

    def splits(opts: SearchOptions) -> set[int]:
        return {c.plan.placement.rollout_gpus or 0 for c in enumerate_candidates(sc, opts)
                if isinstance(c, Candidate) and c.plan.placement.kind == "disaggregated"}

    assert splits(SearchOptions(fine_splits_at_gpus=64)) == set(range(8, 64, 8))
    assert splits(SearchOptions(fine_splits_at_gpus=128)) == {16, 32, 48}  # a fraction of a 16-node question
    assert splits(SearchOptions()) == {16, 32, 48}  # by default


def test_a_critic_of_another_model_gets_its_own_memory_rung() -> None:
    from rlperf.plan.search import _simulate_one

    sc = load_scenario({
        "name": "critic", "model": "Qwen2.5-0.5B",
        "cluster": {"gpu": "H100", "num_nodes": 1, "gpus_per_node": 2},
        "workload": {"prompts_per_step": 4, "group_size": 2,
                     "prompt_length": {"kind": "uniform", "min_tokens": 16, "max_tokens": 256},
                     "response_length": {"kind": "lognormal", "median_tokens": 2000, "sigma": 0.5, "cap_tokens": 16000}},
        "algorithm": {"name": "PPO", "minibatches": 1, "critic_model": "Qwen2.5-7B"},
    })
    cands = [c for c in enumerate_candidates(sc, SearchOptions()) if isinstance(c, Candidate)]
    own = [c for c in cands if "critic" in c.plan.layouts]
    assert own and all("; critic " in c.label for c in own)
    c = next(c for c in own if c.plan.placement.kind == "colocated" and c.plan.mode.kind == "sync")
    actor, critic = c.plan.layouts["actor"], c.plan.layouts["critic"]
    assert actor.recompute == "none" and (critic.recompute, critic.max_tokens_per_microbatch) != (actor.recompute, actor.max_tokens_per_microbatch)
    # The critic's rung is what its own model fits: the candidate simulates (a 7B critic on
    # 2 GPUs with the actor's no-recompute rung would not).
    assert not isinstance(_simulate_one((sc, c.plan)), str)
    too_big = c.plan.model_copy(update={"layouts": {"actor": actor}})
    assert isinstance(_simulate_one((sc, too_big)), str)


def test_engines_whose_weights_overflow_their_budget_are_rejected_once_with_the_reason() -> None:
    sc = _scenario(model="Qwen2.5-72B", nodes=2)  # 145 GB of bf16 weights: tp 1 and 2 overflow 68 GB
    out = list(enumerate_candidates(sc, SearchOptions()))
    for tp in (1, 2):
        rejected = [r for r in out if not isinstance(r, Candidate) and r.label.startswith(f"rollout engine tp{tp} ")]
        assert len(rejected) == 1 and "gpu_memory_utilization budget" in rejected[0].reason
        assert not any(isinstance(c, Candidate) and c.plan.rollout.tp == tp for c in out)
    assert any(isinstance(c, Candidate) and c.plan.rollout.tp == 4 for c in out)


def test_no_stream_where_more_is_generated_than_trained() -> None:
    """A stream admits a step's requests and stops after one batch has finished: with filtered
    rounds (DAPO's dynamic sampling, PRIME's oversampling) its requests in flight grow without
    end, so it is neither searched nor offered as a what-if there; partial rollout is out under
    dynamic sampling only (GenerationRounds.allows_partial_rollout)."""
    from rlperf.modes import mode_of
    from rlperf.plan.explain import variants

    def carrying(sc: Scenario) -> set[str]:
        found = {c.plan.mode.kind for c in enumerate_candidates(sc, SearchOptions())
                 if isinstance(c, Candidate) and mode_of(c.plan.mode).carries_unfinished}
        split = sc.with_plan(sc.plan.model_copy(update={"placement": placements(sc, 1, False)[1][0]}))
        return found | {p.mode.kind for _, p in variants(split) if mode_of(p.mode).carries_unfinished}

    q = {"model": "Qwen2.5-0.5B", "nodes": 1, "gpus_per_node": 2}
    assert carrying(_scenario(**q, algorithm="DAPO")) == set()
    assert carrying(_scenario(**q, algorithm="PRIME")) == {"partial_rollout"}
    assert carrying(_scenario(**q, algorithm="GRPO")) == {"streaming", "partial_rollout"}
