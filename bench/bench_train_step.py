"""Benchmark of one training-step costing (prints figures; no assertions).

    .venv/bin/python bench/bench_train_step.py

Part 1: every configuration of vTrain's single-node file (GPT-3-style models on 2-8 A100s,
Megatron layout: tp/pp/dp, unfused attention, full recompute, 2-16 micro-batches per rank),
one :func:`rlperf.stages.train.train_step` call each. Part 2: an RL actor update as the planner
costs it (Qwen2.5-7B on 8 H100, ZeRO-3, 256 sequences of 1-8k tokens, 4 mini-batches, packed
2-8k-token micro-batches). Goal: median under 20 ms per call. Times are CPU time of the
process (``time.process_time``): on a shared machine wall time mostly measures the neighbours.
"""

from __future__ import annotations

import time

import numpy as np

from rlperf.catalog import load_model
from rlperf.specs.hardware_catalog import make_cluster
from rlperf.specs.parallel import TrainLayout
from rlperf.stages.train import train_step
from rlperf.validate_train import gpt3_model, layout_of, load_train_csv, shipped_csv


def vtrain_calls() -> np.ndarray:
    rows = load_train_csv(shipped_csv())
    clusters = {n: make_cluster("a100_80gb_sxm", num_gpus=n) for n in (2, 4, 8)}
    out = []
    for m in rows:
        model = gpt3_model(m.hidden_size, m.num_heads, m.num_layers, m.seq_len)
        seqs = np.full(m.global_batch, m.seq_len)
        lay = layout_of(m)
        t0 = time.process_time()
        train_step(model, clusters[m.num_gpus], lay, seqs)
        out.append(time.process_time() - t0)
    return np.array(out)


def rl_calls(repeat: int = 20) -> np.ndarray:
    model, cluster = load_model("Qwen2.5-7B"), make_cluster("H100", num_gpus=8)
    seqs = np.random.default_rng(0).integers(1024, 8192, 256)
    lay = TrainLayout(dp=8, zero_stage=3, max_tokens_per_microbatch=16384)
    out = []
    for _ in range(repeat):
        t0 = time.process_time()
        train_step(model, cluster, lay, seqs, num_minibatches=4)
        out.append(time.process_time() - t0)
    return np.array(out)


def main() -> None:
    v = vtrain_calls()
    print(f"vTrain single-node configurations: {v.size} calls, median {1e3 * np.median(v):.2f} ms, "
          f"p90 {1e3 * np.percentile(v, 90):.2f} ms, max {1e3 * v.max():.2f} ms")
    r = rl_calls()
    print(f"RL actor update (Qwen2.5-7B, 8 H100, 256 seqs, 4 mini-batches): median {1e3 * np.median(r):.2f} ms, "
          f"max {1e3 * r.max():.2f} ms")


if __name__ == "__main__":
    main()
