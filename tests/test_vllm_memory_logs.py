"""rlperf's engine memory against vLLM's own start-up memory profiles.

The runs are in ``tests/data/vllm_memory_profiles.yaml`` (model, tp, pp, GPU total, utilization,
and what vLLM printed: weights, torch activation peak, non-torch increase, KV cache), each with
its source. rlperf sizes the same engine with :func:`inference_memory` on the logged device
total and is compared term by term. Tolerances (documented, not tuned to one run):

- weights: every run within 1.5% (vLLM also counts rotary caches and padding; rlperf counts
  the checkpoint's parameters).
- workspace against the activation peak (runs whose settings the log states, vLLM v0.19.0,
  pp 1): single-GPU runs within 10%; every run within 40%, median -24%. rlperf adds the
  forward's peak over ``max_num_batched_tokens`` tokens (split by tp) to an
  8-byte-per-element sampler over ``max_num_seqs`` x vocab; vLLM's peak is the same at tp 1, 2 and 4 (1.89 GiB for
  Llama-3.1-8B, 2.21 GiB for Qwen2.5-7B), i.e. the sampler over the whole vocabulary
  dominates it, so rlperf's shrinking forward term under-counts it at tp > 1 (-24% at tp 2,
  -33% at tp 4). Left as is: the sampler's bytes per element behind vLLM's figure are not
  sourced here. Pipeline runs are left out of this comparison: the log gives one stage's peak
  (1.10 GiB at pp 2, forward only), rlperf the fullest stage's (the last, with the sampler).
- KV cache budget with the logged non-torch figure (runs whose settings the log states):
  every run within 3%, median +0.5%.
- KV cache budget with rlperf's default non-torch figure (vLLM v0.19.0 runs): within 3%.
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import TypedDict

import pytest
import yaml

from rlperf.catalog import load_model
from rlperf.cost.memory import InferenceMemory, inference_memory
from rlperf.cost.memory_engine import non_torch_bytes
from rlperf.specs.parallel import EngineLayout

_GIB = 2**30
_DATA = Path(__file__).parent / "data" / "vllm_memory_profiles.yaml"


class _Run(TypedDict):
    source: str
    vllm: str
    gpu: str
    model: str
    tp: int
    pp: int
    total_gib: float
    util: float
    max_num_batched_tokens: int | None
    max_num_seqs: int | None
    weights_gib: float
    activation_gib: float
    non_torch_gib: float
    accounting: str
    kv_gib: float
    kv_derived: bool


def _runs() -> list[_Run]:
    data = yaml.safe_load(_DATA.read_text())
    runs: list[_Run] = data["runs"]
    assert all(r["source"] in data["sources"] for r in runs)
    return runs


def _layout(run: _Run) -> EngineLayout:
    lay = EngineLayout(tp=run["tp"], pp=run["pp"], gpu_memory_utilization=run["util"])
    if run["max_num_batched_tokens"] is not None:  # else: rlperf's defaults (weights only)
        lay = lay.model_copy(update={"max_num_batched_tokens": run["max_num_batched_tokens"]})
    if run["max_num_seqs"] is not None:
        lay = lay.model_copy(update={"max_num_seqs": run["max_num_seqs"]})
    return lay


def _rlperf(run: _Run, reserved_bytes: float | None) -> InferenceMemory:
    return inference_memory(
        load_model(run["model"]), _layout(run), run["total_gib"] * _GIB, reserved_bytes=reserved_bytes
    )


def _err(ours: float, theirs: float) -> float:
    return ours / theirs - 1


def _stated(run: _Run) -> bool:
    return run["max_num_batched_tokens"] is not None and run["max_num_seqs"] is not None


def test_the_logged_terms_add_up_to_the_logged_kv_cache() -> None:
    # vLLM's formula holds for every run (0.02 GiB: the logs round each term to 0.01)
    for r in _runs():
        budget = r["util"] * r["total_gib"]
        rest = budget - r["weights_gib"] - r["activation_gib"] - r["non_torch_gib"]
        assert rest == pytest.approx(r["kv_gib"], abs=0.02), r


def test_weights_match_vllm() -> None:
    errs = [_err(_rlperf(r, 0.0).weights_bytes, r["weights_gib"] * _GIB) for r in _runs()]
    assert max(abs(e) for e in errs) < 0.015, errs
    assert abs(statistics.median(errs)) < 0.005


def test_workspace_against_vllm_activation_peak() -> None:
    runs = [r for r in _runs() if _stated(r) and r["pp"] == 1]
    assert len(runs) == 6
    errs = {
        (r["model"], r["tp"], r["pp"]): _err(
            _rlperf(r, 0.0).workspace_bytes, r["activation_gib"] * _GIB
        )
        for r in runs
    }
    single = [e for (_, tp, _), e in errs.items() if tp == 1]
    assert max(abs(e) for e in single) < 0.10, errs
    assert max(abs(e) for e in errs.values()) < 0.40, errs
    # the systematic part: vLLM's peak does not fall with tp, rlperf's does
    for (_, tp, _), e in errs.items():
        assert e < 0 if tp > 1 else True, errs


def test_kv_budget_with_the_logged_non_torch_memory() -> None:
    errs = [
        _err(_rlperf(r, r["non_torch_gib"] * _GIB).kv_capacity_bytes, r["kv_gib"] * _GIB)
        for r in _runs()
        if _stated(r)
    ]
    assert max(abs(e) for e in errs) < 0.03, errs
    assert abs(statistics.median(errs)) < 0.01, errs


def test_kv_budget_with_the_default_non_torch_memory() -> None:
    runs = [r for r in _runs() if r["vllm"] == "0.19.0"]
    for r in runs:  # the default is these runs' figure within the sweep's spread
        assert non_torch_bytes(_layout(r)) == pytest.approx(r["non_torch_gib"] * _GIB, abs=0.05 * _GIB)
    errs = [_err(_rlperf(r, None).kv_capacity_bytes, r["kv_gib"] * _GIB) for r in runs]
    assert max(abs(e) for e in errs) < 0.03, errs
