"""A critic or reward model ends in a scalar head (verl: ``AutoModelForTokenClassification``
with one label): its passes hold no vocabulary logits, only ``T`` scores."""

from __future__ import annotations

import numpy as np

from rlperf.catalog import load_model
from rlperf.cost.memory import forward_memory, train_memory
from rlperf.specs.hardware_catalog import make_cluster
from rlperf.specs.parallel import TrainLayout
from rlperf.stages.forward import forward_pass
from rlperf.stages.shard import head_of
from rlperf.stages.train import train_step

MODEL = load_model("Qwen3-0.6B")
LAYOUT = TrainLayout(dp=1, micro_batch_size=4)
LENGTHS = np.array([700, 500, 300, 100], dtype=np.int64)  # one micro-batch of 1,600 tokens


def test_value_head_drops_exactly_the_vocabulary_logits() -> None:
    for mem, scored in ((forward_memory(MODEL, LAYOUT, 1600), forward_memory(MODEL, LAYOUT, 1600, value_head=True)),
                        (train_memory(MODEL, LAYOUT, 1600), train_memory(MODEL, LAYOUT, 1600, value_head=True))):
        assert mem.logits_bytes == 1600 * MODEL.vocab_size * 4
        assert scored.logits_bytes == 0.0
        assert mem.total_bytes - scored.total_bytes == mem.logits_bytes


def test_critic_and_reward_passes_peak_without_logits() -> None:
    gpu = make_cluster("h100_sxm", num_gpus=1)
    fwd = forward_pass(MODEL, gpu, LAYOUT, LENGTHS, "values", head="value")
    assert fwd.peak_memory_bytes == forward_memory(MODEL, LAYOUT, 1600, seq_len=700, value_head=True).total_bytes
    upd = train_step(MODEL, gpu, LAYOUT, LENGTHS, name="critic_update", head="value")
    want = train_memory(MODEL, LAYOUT, 1600, seq_len=700, num_microbatches=1, value_head=True)
    assert upd.peak_memory_bytes == want.total_bytes


def test_roles_heads() -> None:
    assert [head_of(r) for r in ("actor", "ref", "prm", "critic", "reward_model")] == [
        "logprobs", "logprobs", "logprobs", "value", "value"]
