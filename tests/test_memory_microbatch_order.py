"""The memory peak of a pass is its largest micro-batch as verl cuts it, not the longest
``micro_batch_size`` sequences of a rank in one micro-batch.

verl (``RayPPOTrainer._balance_batch`` since #3605) sorts a rank's sequences by length and
lays them out as the even positions rising, then the odd ones falling; micro-batches are
consecutive chunks of ``micro_batch_size``. Closed form for lengths 100, 200, ..., 800 on one
rank in micro-batches of 2: order 100 300 500 700 | 800 600 400 200, micro-batches 400, 1200,
1400 and 600 tokens: the peak is 1,400 tokens (the old longest-first cut put 800 and 700, 1,500
tokens, in one micro-batch).
"""

from __future__ import annotations

import numpy as np

from rlperf.catalog import load_model
from rlperf.cost.memory import forward_memory, train_memory
from rlperf.specs.hardware_catalog import make_cluster
from rlperf.specs.parallel import TrainLayout
from rlperf.stages.forward import forward_pass
from rlperf.stages.microbatch import microbatches_for
from rlperf.stages.train import train_step

MODEL = load_model("Qwen3-0.6B")
ONE_GPU = make_cluster("h100_sxm", num_gpus=1)
LENGTHS = np.arange(100, 900, 100, dtype=np.int64)  # 100 .. 800
LAYOUT = TrainLayout(dp=1, micro_batch_size=2)


def test_micro_batches_follow_verls_order() -> None:
    plan = microbatches_for(LENGTHS[::-1].copy(), LAYOUT)
    assert [mb.tolist() for mb in plan.ranks[0]] == [[100, 300], [500, 700], [800, 600], [400, 200]]
    assert plan.max_microbatch_tokens() == 1400


def test_forward_peak_is_the_largest_micro_batch_in_verls_order() -> None:
    cost = forward_pass(MODEL, ONE_GPU, LAYOUT, LENGTHS)
    want = forward_memory(MODEL, LAYOUT, 1400, seq_len=800).total_bytes
    assert cost.peak_memory_bytes == want
    assert want < forward_memory(MODEL, LAYOUT, 1500, seq_len=800).total_bytes


def test_train_peak_is_the_largest_micro_batch_in_verls_order() -> None:
    cost = train_step(MODEL, ONE_GPU, LAYOUT, LENGTHS, num_minibatches=1)
    want = train_memory(MODEL, LAYOUT, 1400, seq_len=800, num_microbatches=4).total_bytes
    assert cost.peak_memory_bytes == want
