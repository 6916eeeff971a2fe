"""bench/bench_param_walk.py times dict(named_parameters()) on module trees shaped like vLLM's:
its figure (the profile's engine_load_param_walk_s, per parameter) is only meaningful if each
tree holds exactly the parameter tensors the weight-sync model counts."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from rlperf.catalog import load_model
from rlperf.stages.weight_sync import Checkpoint

pytest.importorskip("torch")
_PATH = Path(__file__).resolve().parents[1] / "bench" / "bench_param_walk.py"
_spec = importlib.util.spec_from_file_location("bench_param_walk", _PATH)
assert _spec is not None and _spec.loader is not None
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)


@pytest.mark.parametrize("name", ["Qwen2.5-Math-7B", "Qwen3-30B-A3B", "Qwen3-235B-A22B"])
def test_bench_tree_holds_the_engine_parameters_the_sync_model_counts(name: str) -> None:
    m = load_model(name)
    tree = bench.engine_tree(m)
    assert sum(1 for _ in tree.named_parameters()) == Checkpoint.of(m).num_engine_params
    assert all(p.device.type == "meta" for p in tree.parameters())  # no memory

