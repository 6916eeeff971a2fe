"""ModelSpec invariants over random valid configs, and one-line errors for random invalid ones."""

from __future__ import annotations

import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlperf.errors import SpecError
from rlperf.specs.hf_config import SUPPORTED_TYPES
from rlperf.specs.model import ModelSpec
from tests.helpers.hf_configs import hf_configs

# Large enough to reach real model widths; the closed forms cost nothing to evaluate.
configs = hf_configs(max_dim=8192, max_layers=128)


def spec_of(cfg: dict[str, Any]) -> ModelSpec:
    return ModelSpec.from_hf_config(cfg, "random")


@given(cfg=configs)
def test_params_are_positive_and_active_at_most_total(cfg: dict[str, Any]) -> None:
    m = spec_of(cfg)
    b = m.breakdown
    assert all(getattr(b, f) >= 0 for f in b.__dataclass_fields__)
    assert b.total == m.num_params > 0
    assert 0 < m.num_active_params <= m.num_params
    if m.moe is None or m.moe.experts_per_token == m.moe.num_experts or m.num_moe_layers == 0:
        assert m.num_active_params == m.num_params
    else:
        assert m.num_active_params < m.num_params
    assert m.weight_bytes("bf16") == 2 * m.num_params
    assert m.kv_bytes_per_token("bf16") > 0


@given(cfg=configs, t=st.integers(1, 1 << 17), c=st.integers(0, 1 << 17))
def test_flops_are_finite_positive_and_monotone(cfg: dict[str, Any], t: int, c: int) -> None:
    m = spec_of(cfg)
    f = m.forward_flops(t, c)
    assert math.isfinite(f) and f > 0
    assert m.forward_flops(t + 1, c) > f  # one more token costs more
    longer = m.forward_flops(t, c + 1)
    if m.num_sliding_layers < m.num_layers or c + 1 < (m.sliding_window or 0):
        assert longer > f  # so does a longer context
    else:
        assert longer == f  # unless every layer only sees a window the context already fills
    assert m.forward_flops(t, c, "full") >= f
    assert m.forward_flops(0, c) == 0


@given(cfg=configs, t=st.integers(1, 64), c=st.integers(0, 4096))
def test_prefill_equals_sum_of_decode_steps(cfg: dict[str, Any], t: int, c: int) -> None:
    """Causal identity: T tokens at once cost what T one-token steps cost, each seeing the
    context grown by the tokens before it (query i attends to c + i + 1 keys)."""
    m = spec_of(cfg)
    steps = math.fsum(m.forward_flops(1, c + i) for i in range(t))
    assert m.forward_flops(t, c) == pytest.approx(steps, rel=1e-12)


@given(cfg=configs, t=st.integers(1, 1 << 16))
def test_full_minus_causal_is_the_masked_half(cfg: dict[str, Any], t: int) -> None:
    m = spec_of(cfg)
    per_pair = 2 * m.num_heads * (m.q_head_dim + m.v_head_dim)
    gap = m.forward_flops(t, 0, "full") - m.forward_flops(t, 0, "causal")
    w = min(t, m.sliding_window or t)  # a sliding layer also masks keys a window behind
    masked_sliding = t * t - (w * (w + 1) / 2 + (t - w) * w)
    full_layers = m.num_layers - m.num_sliding_layers
    expected = per_pair * (full_layers * t * (t - 1) / 2 + m.num_sliding_layers * masked_sliding)
    assert gap == pytest.approx(expected, rel=1e-12)


@given(cfg=configs, t=st.integers(1, 1 << 16))
def test_train_flops_are_three_forwards_plus_recompute(cfg: dict[str, Any], t: int) -> None:
    m = spec_of(cfg)
    fwd = m.forward_flops(t)
    assert m.train_flops(t, "none") == pytest.approx(3 * fwd, rel=1e-12)
    assert m.train_flops(t, "full") == pytest.approx(4 * fwd, rel=1e-12)
    assert 3 * fwd <= m.train_flops(t, "selective") <= 4 * fwd


def test_negative_tokens_are_rejected() -> None:
    cfg = {
        "model_type": "qwen2",
        "hidden_size": 64,
        "num_hidden_layers": 1,
        "num_attention_heads": 4,
    }
    m = spec_of({**cfg, "intermediate_size": 128, "vocab_size": 256})
    with pytest.raises(SpecError, match="num_tokens"):
        m.forward_flops(-1)


# ---- invalid configs -------------------------------------------------------------------------

SIZE_KEYS = (
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "intermediate_size",
    "vocab_size",
)


def assert_one_line_naming(err: SpecError, key: str) -> None:
    msg = str(err)
    assert "\n" not in msg
    assert msg.startswith(f"model.config.{key}:"), msg


@given(cfg=hf_configs(), key=st.sampled_from(SIZE_KEYS), bad=st.integers(-(1 << 20), 0))
def test_non_positive_sizes_name_the_key(cfg: dict[str, Any], key: str, bad: int) -> None:
    with pytest.raises(SpecError) as ei:
        spec_of({**cfg, key: bad})
    assert_one_line_naming(ei.value, key)


@given(
    cfg=hf_configs(), key=st.sampled_from(SIZE_KEYS), bad=st.sampled_from([1.5, "64", True, [64]])
)
def test_non_integer_sizes_name_the_key(cfg: dict[str, Any], key: str, bad: object) -> None:
    with pytest.raises(SpecError) as ei:
        spec_of({**cfg, key: bad})
    assert_one_line_naming(ei.value, key)


@given(cfg=hf_configs(), key=st.sampled_from(SIZE_KEYS))
def test_missing_keys_are_named(cfg: dict[str, Any], key: str) -> None:
    with pytest.raises(SpecError) as ei:
        spec_of({k: v for k, v in cfg.items() if k != key})
    assert_one_line_naming(ei.value, key)


@given(heads=st.integers(2, 64), data=st.data())
def test_kv_heads_must_divide_heads(heads: int, data: st.DataObject) -> None:
    kv = data.draw(st.integers(1, heads).filter(lambda k: heads % k != 0))
    cfg = {"model_type": "llama", "hidden_size": 64 * heads, "num_hidden_layers": 1}
    cfg |= {
        "num_attention_heads": heads,
        "num_key_value_heads": kv,
        "intermediate_size": 8,
        "vocab_size": 8,
    }
    with pytest.raises(SpecError) as ei:
        spec_of(cfg)
    assert_one_line_naming(ei.value, "num_key_value_heads")


@given(heads=st.integers(2, 64), data=st.data())
def test_heads_must_divide_hidden_without_head_dim(heads: int, data: st.DataObject) -> None:
    hidden = data.draw(st.integers(1, 1 << 14).filter(lambda d: d % heads != 0))
    cfg = {
        "model_type": "qwen2",
        "hidden_size": hidden,
        "num_hidden_layers": 1,
        "num_attention_heads": heads,
    }
    with pytest.raises(SpecError) as ei:
        spec_of({**cfg, "intermediate_size": 8, "vocab_size": 8})
    assert_one_line_naming(ei.value, "num_attention_heads")


@given(cfg=hf_configs(), mtype=st.text(max_size=12).filter(lambda s: s not in SUPPORTED_TYPES))
def test_unknown_model_type_lists_the_supported_ones(cfg: dict[str, Any], mtype: str) -> None:
    with pytest.raises(SpecError) as ei:
        spec_of({**cfg, "model_type": mtype})
    assert_one_line_naming(ei.value, "model_type")
    assert "allowed: llama" in str(ei.value)


@settings(max_examples=50)
@given(cfg=hf_configs().filter(lambda c: "num_experts_per_tok" in c))
def test_more_active_experts_than_experts_is_named(cfg: dict[str, Any]) -> None:
    experts_key = next(
        k for k in ("num_experts", "num_local_experts", "n_routed_experts") if k in cfg
    )
    with pytest.raises(SpecError) as ei:
        spec_of({**cfg, "num_experts_per_tok": cfg[experts_key] + 1})
    assert_one_line_naming(ei.value, "num_experts_per_tok")


@settings(max_examples=60)
@given(t=st.integers(1, 300), c=st.integers(0, 300), w=st.integers(1, 400))
def test_windowed_pairs_equal_the_sum_over_queries(t: int, c: int, w: int) -> None:
    # query at 1-based position n sees min(n, w) keys
    expected = sum(min(n, w) for n in range(c + 1, c + t + 1))
    m = spec_of({**_GEMMA2_SMALL})
    assert m.attention_pairs(t, c, window=w) == expected
    assert m.attention_pairs(t, c, window=w) <= m.attention_pairs(t, c)


_GEMMA2_SMALL = {
    "model_type": "gemma2", "hidden_size": 64, "num_hidden_layers": 4, "num_attention_heads": 2,
    "num_key_value_heads": 1, "head_dim": 32, "intermediate_size": 128, "vocab_size": 100,
    "sliding_window": 16,
}


@given(t=st.integers(1, 4096))
def test_sliding_layers_bound_kv_and_attention_by_the_window(t: int) -> None:
    m = spec_of(_GEMMA2_SMALL)  # layers 0 and 2 sliding (window 16), 1 and 3 global
    full = m.model_copy(update={"layer_types": (), "sliding_window": None})
    per_layer_token = m.kv_bytes_per_token() / 4
    assert m.kv_bytes(t) == per_layer_token * (2 * t + 2 * min(t, 16))
    assert full.kv_bytes(t) == full.kv_bytes_per_token() * t
    assert m.attention_flops(t) <= full.attention_flops(t)
    assert m.attention_flops(t, attention="full") == full.attention_flops(t, attention="full")
    assert (m.attention_flops(t) == full.attention_flops(t)) == (t <= 16)


def test_unsupported_model_type_names_the_field_and_the_supported_types() -> None:
    with pytest.raises(SpecError) as err:
        spec_of({"model_type": "bloom", "hidden_size": 64})
    msg = str(err.value)
    assert "\n" not in msg and msg.startswith("model.config.model_type: unsupported 'bloom'")
    assert all(t in msg for t in ("gpt2", "gpt_neox", "opt", "gemma2", "llama"))
