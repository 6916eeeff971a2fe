"""Memory model: ZeRO closed forms, Korthikanti's activation count, pipeline in-flight counts,
rollout KV capacity, and Hypothesis invariants over random models and layouts."""

from __future__ import annotations

import math

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from rlperf.cost.memory import (
    TrainMemory,
    check_fits,
    check_kv_capacity,
    forward_memory,
    inference_memory,
    microbatches_in_flight,
    train_memory,
)
from rlperf.cost.memory_engine import non_torch_bytes
from rlperf.cost.memory_activations import layer_activations
from rlperf.cost.memory_params import attention_params_on_device, stage_layers, stage_params
from rlperf.errors import SpecError
from rlperf.specs.model import MLASpec, ModelSpec, MoESpec
from rlperf.specs.parallel import EngineLayout, TrainLayout
from tests.helpers.models import QWEN25_7B_CONFIG

QWEN25_7B = ModelSpec.from_hf_config(QWEN25_7B_CONFIG, "Qwen2.5-7B")
QWEN3_30B_A3B = ModelSpec.from_hf_config(
    {
        "model_type": "qwen3_moe",
        "hidden_size": 2048,
        "num_attention_heads": 32,
        "num_key_value_heads": 4,
        "head_dim": 128,
        "num_hidden_layers": 48,
        "intermediate_size": 6144,
        "moe_intermediate_size": 768,
        "num_experts": 128,
        "num_experts_per_tok": 8,
        "vocab_size": 151936,
        "tie_word_embeddings": False,
    },
    "Qwen3-30B-A3B",
)


def gpt(h: int = 1024, a: int = 16, layers: int = 4) -> ModelSpec:
    """Korthikanti's GPT shape: multi-head attention, 4h MLP."""
    return ModelSpec(
        name="gpt",
        architecture="gpt",
        hidden_size=h,
        num_layers=layers,
        num_heads=a,
        num_kv_heads=a,
        head_dim=h // a,
        intermediate_size=4 * h,
        vocab_size=50257,
    )


# ---------------------------------------------------------------------------- parameters
def test_stage_params_add_up_to_the_model() -> None:
    for model in (QWEN25_7B, QWEN3_30B_A3B):
        for pp in (1, 2, 3, 4):
            total = sum(s.total_params for s in stage_params(model, 1, pp, 1))
            assert total == model.num_params
    tied = ModelSpec.from_hf_config({**QWEN25_7B_CONFIG, "tie_word_embeddings": True}, "tied")
    assert sum(s.total_params for s in stage_params(tied, 1, 1, 1)) == tied.num_params
    # pp > 1: the last stage keeps its own copy of the tied embedding for the LM head.
    extra = tied.vocab_size * tied.hidden_size
    assert sum(s.total_params for s in stage_params(tied, 1, 2, 1)) == tied.num_params + extra


def test_stage_layers_are_contiguous_with_extras_before_the_last() -> None:
    assert stage_layers(28, 3) == (range(9), range(9, 19), range(19, 28))
    assert stage_layers(10, 4) == (range(2), range(2, 5), range(5, 8), range(8, 10))


def test_attention_params_at_tp1_match_the_model() -> None:
    mla = ModelSpec(
        name="mla", architecture="deepseek_v3", hidden_size=1024, num_layers=2, num_heads=8,
        num_kv_heads=8, head_dim=96, intermediate_size=2048, vocab_size=1000,
        mla=MLASpec(q_lora_rank=256, kv_lora_rank=128, qk_nope_head_dim=64, qk_rope_head_dim=32, v_head_dim=64),
    )  # fmt: skip
    qwen3 = QWEN3_30B_A3B  # QK-norm
    for model in (QWEN25_7B, qwen3, mla):
        assert attention_params_on_device(model, 1) == model.attention_params_per_layer


def test_kv_projections_are_replicated_beyond_num_kv_heads() -> None:
    m = QWEN3_30B_A3B  # 32 query heads, 4 KV heads of width 128
    d, c = m.hidden_size, m.head_dim
    qo = 2 * 32 * c * d
    assert attention_params_on_device(m, 8) == qo / 8 + 2 * c * d * 1 + 2 * c  # 1 KV head per rank
    assert attention_params_on_device(m, 2) == qo / 2 + 2 * c * d * 2 + 2 * c


def test_experts_are_split_by_ep_times_tp_in_training() -> None:
    m = QWEN3_30B_A3B
    experts = m.breakdown.experts
    one = stage_params(m, 1, 1, 1)[0].expert_params
    assert one == experts
    assert stage_params(m, 2, 1, 8 * 2)[0].expert_params == experts / 16


# ---------------------------------------------------------------------------- model states
@pytest.mark.parametrize("n", [1, 2, 8, 64])
def test_zero_stages_match_the_zero_paper(n: int) -> None:
    psi = QWEN25_7B.num_params
    expected = {0: 16 * psi, 1: 4 * psi + 12 * psi / n, 2: 2 * psi + 14 * psi / n, 3: 16 * psi / n}
    for stage, want in expected.items():
        lay = TrainLayout(dp=n, zero_stage=stage, grad_dtype="bf16")
        mem = train_memory(QWEN25_7B, lay, 4096)
        assert mem.model_states_bytes == pytest.approx(want, rel=1e-12)


def test_state_bytes_follow_the_layout_dtypes() -> None:
    psi = QWEN25_7B.num_params
    fp32_grads = train_memory(QWEN25_7B, TrainLayout(zero_stage=0, grad_dtype="fp32"), 4096)
    assert fp32_grads.model_states_bytes == 18 * psi  # 2 + 4 + 12
    verl = train_memory(QWEN25_7B, TrainLayout(zero_stage=0, param_dtype="fp32"), 4096)
    assert (verl.weights_bytes, verl.grads_bytes, verl.optimizer_bytes) == (
        4 * psi,
        4 * psi,
        8 * psi,
    )


def test_expert_states_are_sharded_over_the_expert_data_parallel_group() -> None:
    m = QWEN3_30B_A3B
    lay = TrainLayout(dp=16, ep=8, zero_stage=3, grad_dtype="bf16")
    mem = train_memory(m, lay, 4096)
    dense = m.num_params - m.breakdown.experts
    # Dense states over 16 ranks; each rank's 1/8 of the experts over 16/8 = 2 ranks.
    want = 16 * (dense / 16 + m.breakdown.experts / 8 / 2)
    assert mem.model_states_bytes == pytest.approx(want, rel=1e-12)


def test_offload_moves_states_to_the_host() -> None:
    base = TrainLayout(dp=8, zero_stage=3)
    on = train_memory(QWEN25_7B, base, 4096)
    off = train_memory(
        QWEN25_7B, base.model_copy(update={"offload_params": True, "offload_optimizer": True}), 4096
    )
    assert off.weights_bytes == off.grads_bytes == off.optimizer_bytes == 0
    assert off.host_bytes == pytest.approx(on.model_states_bytes)
    assert off.total_bytes < on.total_bytes


def test_zero3_gathers_the_largest_unit() -> None:
    m = QWEN25_7B
    mem = train_memory(m, TrainLayout(dp=8, zero_stage=3, grad_dtype="fp32"), 4096)
    lm_head = m.vocab_size * m.hidden_size  # bigger than one decoder layer
    assert mem.buffers_bytes == lm_head * (2 + 4)
    assert train_memory(m, TrainLayout(dp=8, zero_stage=1), 4096).buffers_bytes == 0


# ---------------------------------------------------------------------------- activations
def korthikanti(
    h: int, a: int, s: int, t: int = 1, sp: bool = True, selective: bool = False
) -> float:
    """Korthikanti et al. 2022, Table 2, bytes per token per layer."""
    score = 0.0 if selective else 5 * a * s / t
    linear = 34 * h / t if sp else h * (10 + 24 / t)
    return linear + score


@pytest.mark.parametrize("t", [1, 2, 4, 8])
@pytest.mark.parametrize("sp", [True, False])
def test_gpt_layer_matches_korthikanti(t: int, sp: bool) -> None:
    h, a, s = 2048, 16, 2048
    model = gpt(h, a)
    acts = layer_activations(
        model,
        0,
        tp=t,
        sequence_parallel=sp,
        seq_len=s,
        flash_attention=False,
        dropout=True,
        gated_mlp=False,
    )
    assert acts.total_bytes == pytest.approx(korthikanti(h, a, s, t, sp))
    assert acts.linear_bytes == pytest.approx(korthikanti(h, a, s, t, sp, selective=True))
    assert acts.input_bytes == 2 * h / (t if sp else 1)


def test_swiglu_gqa_layer_from_shapes() -> None:
    m = QWEN25_7B  # h 3584, 28 heads, 4 KV heads of 128, f 18944, no dropout, flash
    acts = layer_activations(m, 0, tp=1, sequence_parallel=False, seq_len=4096)
    norms_inputs = 2 * (2 * 3584) + 2 * (2 * 3584)  # two norm inputs, QKV and MLP inputs
    attn = 2 * 3584 + 2 * 512 * 2 + 2 * 3584 + 4 * 28  # Q, K and V, output, fp32 log-sum-exp
    mlp = 4 * 2 * 18944  # gate, SiLU, up, product
    assert acts.total_bytes == norms_inputs + attn + mlp
    assert acts.score_bytes == 0


def tiny_moe(num_experts: int = 8) -> ModelSpec:
    """h 64, 4 query heads and 2 KV heads of 16, 2 of ``num_experts`` experts of width 32."""
    moe = MoESpec(num_experts=num_experts, experts_per_token=2, expert_intermediate_size=32)
    return ModelSpec(
        name="tiny-moe", architecture="moe", hidden_size=64, num_layers=1, num_heads=4, num_kv_heads=2,
        head_dim=16, intermediate_size=256, vocab_size=1000, moe=moe,
    )


# Hand-derived bytes per token of tiny_moe's one layer (bf16, flash, no dropout, tp 1):
# norm inputs 2*(2*64) = 256; QKV input 2*64 = 128; Q 2*64 + K, V 2*(2*32) + output 2*64 +
# log-sum-exp 4*4 = 400; MoE input 2*64 = 128; router probabilities 4*8 = 32. Per routed copy
# (2 per token): Hugging Face: input 128 + SwiGLU 8*32 + output 128 = 512; Megatron fused
# (weighted_bias_swiglu_impl): input 128 + fc1 output 4*32 + product 2*32 + fp32 weight 4 = 324;
# Megatron unfused: input 128 + 8*32 + weighted product 2*32 + weight 4 = 452.
_TINY_DENSE_PART = 256 + 128 + 400 + 128 + 32


@pytest.mark.parametrize(
    ("megatron", "fused", "per_copy"), [(False, False, 512), (True, True, 324), (True, False, 452)]
)
def test_moe_layer_matches_hand_count(megatron: bool, fused: bool, per_copy: int) -> None:
    acts = layer_activations(tiny_moe(), 0, megatron_experts=megatron, fused_activation=fused)
    assert acts.total_bytes == _TINY_DENSE_PART + 2 * per_copy


def test_moe_routed_copies_split_by_tp_over_etp() -> None:
    """tp 2 with sequence parallelism: every h-wide and head-split tensor halves. etp 1: each tp
    rank routes its half of the tokens to whole experts (1 copy per token, 324 bytes); etp 2:
    the copies are gathered over the etp group (2 per token), each expert half as wide
    (input 128 + fc1 output 4*16 + product 2*16 + weight 4 = 228)."""
    halved = _TINY_DENSE_PART / 2
    for etp, routed in ((1, 324), (2, 2 * 228)):
        acts = layer_activations(tiny_moe(), 0, tp=2, etp=etp, megatron_experts=True, fused_activation=True)
        assert acts.total_bytes == halved + routed
    full = layer_activations(tiny_moe(), 0, megatron_experts=True, fused_activation=True).total_bytes
    assert layer_activations(tiny_moe(), 0, tp=2, etp=1, megatron_experts=True, fused_activation=True).total_bytes == full / 2


def test_moe_activations_follow_the_routed_tokens_not_the_experts() -> None:
    """Doubling the experts at the same top-k adds only the router's fp32 probabilities."""
    for megatron in (False, True):
        few, many = (
            layer_activations(tiny_moe(n), 0, megatron_experts=megatron, fused_activation=megatron).total_bytes
            for n in (8, 16)
        )
        assert many - few == 8 * 4


def test_fused_activation_keeps_six_bytes_per_mlp_width() -> None:
    """Megatron's bias_swiglu_impl keeps the fc1 output and the product: 6 bytes per unit of
    width where the unfused SwiGLU keeps 8 (gate, SiLU, up, product)."""
    unfused = layer_activations(QWEN25_7B, 0, seq_len=4096).total_bytes
    fused = layer_activations(QWEN25_7B, 0, seq_len=4096, fused_activation=True).total_bytes
    assert unfused - fused == 2 * 18944


def test_megatron_layout_reads_its_moe_kernels() -> None:
    """train_memory passes the layout's etp, backend and fused activation to the count."""
    m = QWEN3_30B_A3B
    hf_layout = TrainLayout(dp=8, ep=8, etp=1, recompute="none", zero_stage=1)
    mg_layout = hf_layout.model_copy(update={"backend": "megatron", "fused_activation": True})
    hf = train_memory(m, hf_layout, 10240).activations_bytes
    mg = train_memory(m, mg_layout, 10240).activations_bytes
    per_layer = sum(
        layer_activations(m, i, etp=1, megatron_experts=True, fused_activation=True).total_bytes for i in range(48)
    )
    assert mg == pytest.approx(10240 * (per_layer + 2 * 2048 * 2))
    assert mg < hf


def test_recompute_ordering() -> None:
    m = gpt(2048, 16, layers=8)
    mems = {
        r: train_memory(m, TrainLayout(recompute=r), 8192, flash_attention=False).activations_bytes
        for r in ("none", "selective", "full")
    }
    assert mems["full"] < mems["selective"] < mems["none"]
    flash = {
        r: train_memory(m, TrainLayout(recompute=r), 8192).activations_bytes
        for r in ("none", "selective", "full")
    }
    assert flash["full"] < flash["selective"] == flash["none"]


def test_full_recompute_keeps_layer_inputs_and_one_layer() -> None:
    m, tokens = QWEN25_7B, 8192
    mem = train_memory(m, TrainLayout(tp=4, recompute="full"), tokens)
    h = m.hidden_size
    one_layer = layer_activations(m, 0, tp=4, seq_len=tokens).total_bytes
    inputs = m.num_layers * 2 * h / 4
    head = 2 * 2 * h / 4  # final-norm and LM-head inputs
    assert mem.activations_bytes == pytest.approx(tokens * (inputs + one_layer + head))


def test_context_parallel_splits_tokens() -> None:
    m = QWEN25_7B
    one = train_memory(m, TrainLayout(recompute="none"), 32768)
    four = train_memory(m, TrainLayout(cp=4, recompute="none"), 32768)
    assert four.activations_bytes == pytest.approx(one.activations_bytes / 4)
    assert four.logits_bytes == pytest.approx(one.logits_bytes / 4)


def test_microbatches_in_flight() -> None:
    pp = 4
    one_f = TrainLayout(pp=pp)
    assert [microbatches_in_flight(one_f, i) for i in range(pp)] == [4, 3, 2, 1]
    assert microbatches_in_flight(one_f, 0, num_microbatches=2) == 2
    assert (
        microbatches_in_flight(TrainLayout(pp=pp, pp_schedule="gpipe"), 3, num_microbatches=16)
        == 16
    )
    v = 2
    inter = TrainLayout(pp=pp, pp_schedule="interleaved", virtual_stages=v)
    assert microbatches_in_flight(inter, 0, num_microbatches=64) == pytest.approx(
        pp * (1 + (pp - 1) / (pp * v))
    )


def test_logits_spike_and_chunking() -> None:
    m, tokens = QWEN25_7B, 16384
    mem = train_memory(m, TrainLayout(tp=2), tokens)
    assert mem.logits_bytes == tokens * m.vocab_size * 4 / 2
    chunked = train_memory(m, TrainLayout(tp=2), tokens, logits_chunk_tokens=1024)
    assert chunked.logits_bytes == 1024 * m.vocab_size * 4 / 2


def test_forward_memory_has_no_grads_or_optimizer() -> None:
    m, lay = QWEN25_7B, TrainLayout(dp=8, zero_stage=3, param_dtype="bf16")
    fwd = forward_memory(m, lay, 8192)
    assert fwd.weights_bytes == pytest.approx(2 * m.num_params / 8)
    assert fwd.activations_bytes == pytest.approx(
        8192 * layer_activations(m, 0, seq_len=8192).total_bytes
    )
    assert fwd.total_bytes < train_memory(m, lay, 8192).total_bytes
    full = forward_memory(m, TrainLayout(zero_stage=1), 8192)
    assert full.weights_bytes == 2 * m.num_params and full.buffers_bytes == 0


# ---------------------------------------------------------------------------- rollout engine
def test_kv_capacity_qwen25_7b_on_80gb() -> None:
    mem = inference_memory(QWEN25_7B, EngineLayout(gpu_memory_utilization=0.9), 80e9)
    weights = 7_615_616_512 * 2  # Qwen2.5-7B parameters, bf16
    # Forward peak per token: residual + normed input (2 x 3584 x 2 B) + gate-up and SiLU-mul
    # outputs (3 x 18944 x 2 B); sampler: 256 rows x 152064 vocab x (fp32 logits + probs);
    # non-torch memory: vLLM v0.19.0's single-GPU figure, 0.27 GiB (cost.memory_engine).
    workspace = 8192 * (2 * 3584 * 2 + 3 * 18944 * 2) + 256 * 152064 * 8 + round(0.27 * 2**30)
    kv_per_token = 2 * 28 * 4 * 128 * 2  # K and V, 28 layers, 4 KV heads of 128, bf16 = 57,344
    assert mem.weights_bytes == weights
    assert mem.workspace_bytes == workspace == 1_649_913_364
    assert mem.kv_bytes_per_token == kv_per_token == 57_344
    assert (
        mem.kv_capacity_tokens
        == math.floor((0.9 * 80e9 - weights - workspace) / kv_per_token)
        == 961_196
    )


def test_engine_kv_capacity_on_an_h100_is_sized_from_the_reported_total() -> None:
    # vLLM: KV = gpu_memory_utilization x torch.cuda.mem_get_info()[1] - weights - workspace; the
    # H100 SXM's total is 85,045,477,376 bytes (hardware.yaml), not the datasheet's 80e9.
    from rlperf.specs.hardware_catalog import load_accelerator, make_cluster
    from rlperf.stages.rollout import kv_capacity_tokens

    h100 = load_accelerator("h100_sxm")
    weights, workspace, kv_per_token = 7_615_616_512 * 2, 1_649_913_364, 57_344  # as above
    want = math.floor((0.9 * 85_045_477_376 - weights - workspace) / kv_per_token)
    assert want == 1_040_384
    mem = inference_memory(QWEN25_7B, EngineLayout(gpu_memory_utilization=0.9), h100.device_memory_bytes)
    assert mem.budget_bytes == 0.9 * 85_045_477_376
    assert mem.kv_capacity_tokens == want
    # the rollout stage sizes the engine the same way
    assert kv_capacity_tokens(QWEN25_7B, make_cluster("h100", 8), EngineLayout(gpu_memory_utilization=0.9)) == want


def test_reserved_bytes_come_out_of_the_kv_cache() -> None:
    lay = EngineLayout(gpu_memory_utilization=0.9)
    base = inference_memory(QWEN25_7B, lay, 80e9, reserved_bytes=0.0)
    reserved = inference_memory(QWEN25_7B, lay, 80e9, reserved_bytes=2e9)
    assert reserved.kv_capacity_bytes == pytest.approx(base.kv_capacity_bytes - 2e9)
    default = inference_memory(QWEN25_7B, lay, 80e9)  # vLLM v0.19.0's measured non-torch memory
    assert default.kv_capacity_bytes == base.kv_capacity_bytes - non_torch_bytes(lay)


def test_default_non_torch_memory_follows_the_measured_layouts() -> None:
    gib = 2**30
    at = {(tp, pp): non_torch_bytes(EngineLayout(tp=tp, pp=pp)) for tp, pp in
          ((1, 1), (1, 2), (1, 4), (2, 1), (4, 1), (8, 1), (32, 1), (2, 2))}
    assert at[1, 1] == round(0.27 * gib) and at[1, 2] == at[1, 4] == round(0.07 * gib)
    assert at[2, 1] == round(2.08 * gib) and at[4, 1] == round(2.17 * gib)
    assert at[8, 1] == at[32, 1] == at[4, 1]  # beyond the largest measured tp: its figure
    assert at[2, 2] == at[2, 1]
    with pytest.raises(SpecError, match="reserved_bytes"):
        inference_memory(QWEN25_7B, EngineLayout(), 80e9, reserved_bytes=-1.0)


def test_kv_heads_are_replicated_when_tp_exceeds_them() -> None:
    m = QWEN3_30B_A3B  # 4 KV heads
    full = m.kv_bytes_per_token()  # 98,304 bytes
    tp4 = inference_memory(m, EngineLayout(tp=4), 141e9)
    tp8 = inference_memory(m, EngineLayout(tp=8, ep=8), 141e9)
    assert tp4.kv_bytes_per_token == full / 4
    assert tp8.kv_bytes_per_token == full / 4  # one replicated head per GPU, not full / 8
    assert tp8.weights_bytes < tp4.weights_bytes


def test_pipeline_engine_splits_layers() -> None:
    m = QWEN25_7B
    mem = inference_memory(m, EngineLayout(pp=2), 80e9)
    assert mem.kv_bytes_per_token == m.kv_bytes_per_token() / 2  # 14 layers per stage


def test_engine_that_does_not_fit_is_rejected_with_reason() -> None:
    mem = inference_memory(QWEN25_7B, EngineLayout(gpu_memory_utilization=0.9), 16e9)
    assert mem.kv_capacity_bytes < 0 and mem.kv_capacity_tokens == 0
    with pytest.raises(SpecError, match=r"rollout: weights 15\.2 GB .* exceed the 14\.4 GB"):
        check_kv_capacity(mem, "rollout")
    ok = inference_memory(QWEN25_7B, EngineLayout(gpu_memory_utilization=0.9), 80e9)
    check_kv_capacity(ok, "rollout", min_tokens=32768)
    with pytest.raises(SpecError, match="KV cache holds 961,196 tokens < 2,000,000"):
        check_kv_capacity(ok, "rollout", min_tokens=2_000_000)


# ---------------------------------------------------------------------------- check_fits
def test_check_fits_names_the_largest_component() -> None:
    mem = TrainMemory(10e9, 10e9, 45.1e9, 20e9, 5e9, 2.2e9, 0.0)
    check_fits(mem, 100e9, "actor training")
    with pytest.raises(SpecError) as ei:
        check_fits(mem, 80e9, "actor training")
    msg = str(ei.value)
    assert msg.startswith(
        "actor training: needs 92.3 GB per GPU > 80.0 GB device memory (optimizer 45.1 GB: try zero_stage=3"
    )
    assert "\n" not in msg


def test_bad_inputs_are_spec_errors() -> None:
    with pytest.raises(SpecError, match="micro_batch_tokens"):
        train_memory(QWEN25_7B, TrainLayout(), 0)
    with pytest.raises(SpecError, match="tp"):
        train_memory(QWEN25_7B, TrainLayout(tp=3), 1024)
    with pytest.raises(SpecError, match="device_memory_bytes"):
        inference_memory(QWEN25_7B, EngineLayout(), 0)


# ---------------------------------------------------------------------------- invariants
@st.composite
def models(draw: st.DrawFn) -> ModelSpec:
    kv = draw(st.sampled_from([1, 2, 4, 8]))
    heads = kv * draw(st.sampled_from([1, 2, 4]))
    layers = draw(st.integers(1, 24))
    moe = None
    if draw(st.booleans()):
        n = draw(st.sampled_from([4, 8, 16, 64]))
        moe = MoESpec(
            num_experts=n,
            experts_per_token=draw(st.integers(1, n)),
            expert_intermediate_size=draw(st.integers(16, 2048)),
            shared_intermediate_size=draw(st.sampled_from([0, 512])),
            first_dense_layers=draw(st.integers(0, layers)),
        )
    mla = None
    if draw(st.booleans()):
        mla = MLASpec(
            q_lora_rank=draw(st.sampled_from([None, 256])),
            kv_lora_rank=draw(st.sampled_from([64, 512])),
            qk_nope_head_dim=64,
            qk_rope_head_dim=32,
            v_head_dim=64,
        )
    return ModelSpec(
        name="random",
        architecture="random",
        hidden_size=draw(st.sampled_from([256, 1024, 4096])),
        num_layers=layers,
        num_heads=heads,
        num_kv_heads=kv,
        head_dim=draw(st.sampled_from([32, 64, 128])),
        intermediate_size=draw(st.integers(64, 16384)),
        vocab_size=draw(st.integers(100, 200_000)),
        tie_word_embeddings=draw(st.booleans()),
        qk_norm=draw(st.booleans()),
        moe=moe,
        mla=mla,
    )


@st.composite
def cases(draw: st.DrawFn) -> tuple[ModelSpec, TrainLayout, int]:
    model = draw(models())
    dp = draw(st.sampled_from([1, 2, 4, 8]))
    cp = draw(st.sampled_from([1, 2]))
    experts = model.moe.num_experts if model.moe else 1
    ep = draw(st.sampled_from([e for e in (1, 2, 4, 8) if (dp * cp) % e == 0 and experts % e == 0]))
    tp = draw(st.sampled_from([t for t in (1, 2, 4, 8) if model.num_heads % t == 0]))
    layout = TrainLayout(
        dp=dp,
        tp=tp,
        pp=draw(st.integers(1, model.num_layers)),
        cp=cp,
        cp_kind=draw(st.sampled_from(["ring", "ulysses"])),
        ep=ep if model.moe else 1,
        sequence_parallel=draw(st.booleans()),
        zero_stage=draw(st.sampled_from([0, 1, 2, 3])),
        recompute=draw(st.sampled_from(["none", "selective", "full"])),
        param_dtype=draw(st.sampled_from(["bf16", "fp32"])),
        grad_dtype=draw(st.sampled_from(["bf16", "fp32"])),
        offload_params=draw(st.booleans()),
        offload_optimizer=draw(st.booleans()),
    )
    return model, layout, draw(st.integers(1, 65536))


def _valid(model: ModelSpec, layout: TrainLayout) -> bool:
    try:
        train_memory(model, layout, 1)
    except SpecError:
        return False
    return True


_SETTINGS = settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.filter_too_much]
)


@_SETTINGS
@given(cases(), st.booleans())
def test_no_nan_or_negative_bytes(case: tuple[ModelSpec, TrainLayout, int], flash: bool) -> None:
    model, layout, tokens = case
    assume(_valid(model, layout))
    for mem in (
        train_memory(model, layout, tokens, flash_attention=flash),
        forward_memory(model, layout, tokens, flash_attention=flash),
    ):
        for name, value in (*mem.components(), ("host", mem.host_bytes)):
            assert math.isfinite(value) and value >= 0, (name, value)
        assert mem.total_bytes > 0


@_SETTINGS
@given(cases())
def test_more_dp_never_increases_memory_under_zero3(
    case: tuple[ModelSpec, TrainLayout, int],
) -> None:
    model, layout, tokens = case
    layout = layout.model_copy(update={"zero_stage": 3})
    assume(_valid(model, layout))
    more = layout.model_copy(update={"dp": layout.dp * 2})
    assert (
        train_memory(model, more, tokens).total_bytes
        <= train_memory(model, layout, tokens).total_bytes
    )
    assert (
        forward_memory(model, more, tokens).total_bytes
        <= forward_memory(model, layout, tokens).total_bytes
    )


@_SETTINGS
@given(cases())
def test_more_tp_never_increases_memory(case: tuple[ModelSpec, TrainLayout, int]) -> None:
    model, layout, tokens = case
    more = layout.model_copy(update={"tp": layout.tp * 2})
    assume(_valid(model, layout) and _valid(model, more))
    assert train_memory(model, more, tokens).total_bytes <= train_memory(
        model, layout, tokens
    ).total_bytes * (1 + 1e-12)
    assert forward_memory(model, more, tokens).total_bytes <= forward_memory(
        model, layout, tokens
    ).total_bytes * (1 + 1e-12)


@_SETTINGS
@given(models(), st.sampled_from([1, 2, 4, 8]), st.floats(0.5, 1.0))
def test_engine_kv_capacity_is_consistent(model: ModelSpec, tp: int, util: float) -> None:
    assume(model.num_heads % tp == 0)
    mem = inference_memory(model, EngineLayout(tp=tp, gpu_memory_utilization=util), 80e9)
    assert mem.kv_bytes_per_token > 0 and mem.weights_bytes > 0 and mem.workspace_bytes > 0
    assert mem.kv_capacity_tokens * mem.kv_bytes_per_token <= max(mem.kv_capacity_bytes, 0.0)
    bigger = inference_memory(model, EngineLayout(tp=tp, gpu_memory_utilization=util), 141e9)
    assert bigger.kv_capacity_tokens >= mem.kv_capacity_tokens


def test_zero_offload_keeps_gradient_shards_on_the_host() -> None:
    """ZeRO-Offload (ZeRO-2 + offload_optimizer): the reduced gradient partitions live on the
    host with the optimizer; ZeRO-1 keeps its (unsharded) gradients on the GPU."""
    lay = TrainLayout(dp=2, zero_stage=2, offload_optimizer=True)
    on_gpu = train_memory(QWEN25_7B, lay.model_copy(update={"offload_optimizer": False}), 4096)
    off = train_memory(QWEN25_7B, lay, 4096)
    assert off.grads_bytes == off.optimizer_bytes == 0
    assert off.weights_bytes == on_gpu.weights_bytes
    assert off.host_bytes == pytest.approx(on_gpu.grads_bytes + on_gpu.optimizer_bytes)
    z1 = train_memory(QWEN25_7B, lay.model_copy(update={"zero_stage": 1}), 4096)
    assert z1.grads_bytes > 0
