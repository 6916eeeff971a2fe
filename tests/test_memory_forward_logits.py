"""Logits of a forward-only pass in the dtype the engine holds them in.

verl's remove-padding path (``dp_actor._forward_micro_batch``) keeps the model's bf16 logits:
the temperature is divided in place, log-probs come from flash-attn's in-place cross-entropy and
the entropy from a ``torch.compile``d function. One bf16 copy is ``T * V * 2 / tp`` bytes; the
default counts an fp32 copy, ``T * V * 4 / tp``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import rlperf.frameworks

from rlperf.catalog import load_model
from rlperf.cost.memory import check_fits, forward_memory, train_memory
from rlperf.errors import SpecError
from rlperf.frameworks import export_verl, load_framework_config
from rlperf.specs.parallel import TrainLayout

MODEL = load_model("Qwen2.5-7B")


@pytest.mark.parametrize("tp", [1, 2])
def test_forward_logits_closed_form(tp: int) -> None:
    tokens = 100_000
    fp32 = forward_memory(MODEL, TrainLayout(tp=tp), tokens)
    bf16 = forward_memory(MODEL, TrainLayout(tp=tp, forward_logits_dtype="bf16"), tokens)
    assert bf16.logits_bytes == tokens * MODEL.vocab_size * 2 / tp
    assert fp32.logits_bytes == tokens * MODEL.vocab_size * 4 / tp
    # only the logits change
    assert fp32.total_bytes - bf16.total_bytes == fp32.logits_bytes - bf16.logits_bytes


def test_training_logits_unchanged_by_the_forward_dtype() -> None:
    a = train_memory(MODEL, TrainLayout(), 8192)
    b = train_memory(MODEL, TrainLayout(forward_logits_dtype="bf16"), 8192)
    assert a == b


def test_a_real_oom_stays_an_oom() -> None:
    """bf16 logits of 300k tokens on one GPU, 300k x 152,064 x 2 = 91 GB, still exceed 80 GB."""
    mem = forward_memory(MODEL, TrainLayout(forward_logits_dtype="bf16"), 300_000)
    assert mem.logits_bytes == 300_000 * MODEL.vocab_size * 2
    with pytest.raises(SpecError, match="logits"):
        check_fits(mem, 80e9, "old_logprob")


def _import(*overrides: str) -> TrainLayout:
    spec, _ = load_framework_config("verl", None, [
        "actor_rollout_ref.model.path=Qwen/Qwen2.5-7B-Instruct", "trainer.n_gpus_per_node=8",
        "data.train_batch_size=64", "actor_rollout_ref.actor.ppo_mini_batch_size=32",
        *overrides])
    return spec.plan.layouts["actor"]


def test_verl_remove_padding_holds_bf16_logits() -> None:
    assert _import("actor_rollout_ref.model.use_remove_padding=True").forward_logits_dtype == "bf16"
    assert _import("actor_rollout_ref.model.use_remove_padding=False").forward_logits_dtype == "fp32"


MEGATRON = Path(rlperf.frameworks.__file__).parent / "examples" / "verl_ppo_megatron_qwen2.5_32b.yaml"


def test_verl_megatron_packs_unless_its_engine_says_not() -> None:
    """verl's Megatron workers pack (thd) by <role>.megatron.use_remove_padding, True by default;
    model.use_remove_padding (the FSDP switch, False by default) does not unpack them."""
    packed, _ = load_framework_config("verl", MEGATRON, [])
    off = "actor_rollout_ref.actor.megatron.use_remove_padding=False"
    padded, _ = load_framework_config("verl", MEGATRON, [off])
    assert packed.plan.layouts["actor"].backend == "megatron"
    assert packed.plan.layouts["actor"].packing and not padded.plan.layouts["actor"].packing
    for spec in (packed, padded):
        again, _ = load_framework_config("verl", None, export_verl(spec).args)
        assert again.plan.layouts["actor"].packing == spec.plan.layouts["actor"].packing


def test_framework_default_plans_hold_logits_as_the_framework_does() -> None:
    """verl's default plan (FSDP, packed) takes its forward log-probs from bf16 logits, as an
    imported verl config does; OpenRLHF's Actor.forward upcasts them to fp32 first. The verl
    default plan's log-prob pass then holds half the logits bytes of an fp32 copy."""
    from rlperf.frameworks import get_framework
    from rlperf.scenario import load_scenario_spec

    spec = load_scenario_spec("grpo-qwen2.5-7b-colocated-sync")
    verl = get_framework("verl").default_plan(spec).layout_for("actor")
    assert verl.forward_logits_dtype == "bf16" and verl.packing and verl.backend == "fsdp"
    assert _import("actor_rollout_ref.model.use_remove_padding=true").forward_logits_dtype == verl.forward_logits_dtype
    assert get_framework("OpenRLHF").default_plan(spec).layout_for("actor").forward_logits_dtype == "fp32"
    tokens = 16384
    held = forward_memory(MODEL, verl.model_copy(update={"dp": 8}), tokens).logits_bytes
    assert held == tokens * MODEL.vocab_size * 2
