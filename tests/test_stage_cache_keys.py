"""The stage caches of rlperf.sim.costs key training and forward stages without the rollout-only
and sync-only profile fields, and rollouts without the sync-only ones. That is only right while
those stages never read them: each stage, costed under profiles that differ only there, must
give the same result (a calibration grid then reuses them)."""

from __future__ import annotations

import numpy as np

from rlperf.catalog import load_model
from rlperf.specs.hardware import ROLLOUT_ONLY_FIELDS, SYNC_ONLY_FIELDS, Cluster, HardwareProfile
from rlperf.specs.hardware_catalog import make_cluster
from rlperf.specs.parallel import EngineLayout, TrainLayout
from rlperf.stages.forward import forward_pass
from rlperf.stages.rollout import simulate_rollout
from rlperf.stages.rollout_requests import RolloutRequests
from rlperf.stages.train import train_step

MODEL = load_model("DeepSeek-R1-Distill-Qwen-1.5B")
BASE = make_cluster("h100_sxm", num_gpus=8)
# A value for each field, far from any shipped one.
ODD: dict[str, float] = {
    "weight_sync_tensor_overhead_s": 0.05, "weight_sync_bucket_overhead_s": 0.5,
    "engine_load_tensor_overhead_s": 0.02, "engine_load_param_walk_s": 1e-4, "decode_hbm_efficiency": 0.11,
    "decode_kv_hbm_efficiency": 0.13,
    "engine_step_overhead_s": 0.07,
    "engine_layer_overhead_s": 0.003, "engine_seq_overhead_s": 0.001, "moe_routing_imbalance": 3.0,
    "moe_expert_read_half_bytes": 5e7, "moe_a2a_nic_efficiency": 0.05,
}


def _with(fields: frozenset[str]) -> Cluster:
    profile: HardwareProfile = BASE.profile.model_copy(update={f: ODD[f] for f in fields})
    return BASE.model_copy(update={"profile": profile})


def test_every_cache_ignored_field_has_an_odd_value() -> None:
    assert set(ODD) == SYNC_ONLY_FIELDS | ROLLOUT_ONLY_FIELDS
    assert all(f in HardwareProfile.model_fields for f in ODD)


def test_training_and_forward_stages_do_not_read_rollout_or_sync_fields() -> None:
    other = _with(SYNC_ONLY_FIELDS | ROLLOUT_ONLY_FIELDS)
    seqs = np.array([300, 1200, 2500, 700] * 4)
    for lay in (TrainLayout(dp=8, zero_stage=3), TrainLayout(dp=4, tp=2, zero_stage=1, backend="megatron")):
        assert train_step(MODEL, BASE, lay, seqs, num_minibatches=2) == train_step(MODEL, other, lay, seqs, num_minibatches=2)
        assert forward_pass(MODEL, BASE, lay, seqs) == forward_pass(MODEL, other, lay, seqs)


def test_rollouts_do_not_read_sync_fields() -> None:
    reqs = RolloutRequests.build(np.array([100] * 8), np.array([50, 400, 90, 800] * 2), np.repeat(np.arange(2), 4))
    engine = EngineLayout(tp=1, replicas=2)
    a = simulate_rollout(MODEL, BASE, engine, reqs)
    b = simulate_rollout(MODEL, _with(SYNC_ONLY_FIELDS), engine, reqs)
    assert a.makespan_s == b.makespan_s and a.depth_s == b.depth_s
    assert np.array_equal(a.finish_time_s, b.finish_time_s)


def test_the_cache_key_drops_exactly_the_ignored_fields() -> None:
    from rlperf.sim.costs import _TRAIN_IGNORES, _cluster_key

    assert _cluster_key(_with(SYNC_ONLY_FIELDS | ROLLOUT_ONLY_FIELDS), _TRAIN_IGNORES) == _cluster_key(BASE, _TRAIN_IGNORES)
    assert _cluster_key(_with(SYNC_ONLY_FIELDS), SYNC_ONLY_FIELDS) == _cluster_key(BASE, SYNC_ONLY_FIELDS)
    assert _cluster_key(_with(ROLLOUT_ONLY_FIELDS), SYNC_ONLY_FIELDS) != _cluster_key(BASE, SYNC_ONLY_FIELDS)
    read = BASE.model_copy(update={"profile": BASE.profile.model_copy(update={"matmul_efficiency": 0.123})})
    assert _cluster_key(read, _TRAIN_IGNORES) != _cluster_key(BASE, _TRAIN_IGNORES)
    assert _cluster_key(BASE.with_gpus(4), _TRAIN_IGNORES) != _cluster_key(BASE, _TRAIN_IGNORES)
