"""Host time of a rollout engine's ``dict(model.named_parameters())`` per parameter tensor
(the profile's ``engine_load_param_walk_s``; prints figures, no assertions).

    .venv/bin/python bench/bench_param_walk.py

Every ``load_weights`` call of vLLM's and SGLang's model files first builds
``params_dict = dict(self.named_parameters())`` over the whole module tree (vLLM 0.8.5
``Qwen3MoeModel.load_weights``; sglang#30848 names it as a cost of RL weight sync), so a sync
that calls ``load_weights`` once per checkpoint tensor walks the tree once per tensor
(rlperf.stages.weight_sync):

    walk per call = P x engine_load_param_walk_s      (P: the engine's parameter tensors)

This builds, on the meta device (no memory), module trees shaped like vLLM's
``*ForCausalLM``: embedding, decoder layers (attention with fused ``qkv_proj`` (+ bias) and
``o_proj``, optional q/k norms, the parameter-less rotary and attention modules, a fused
``gate_up_proj`` / ``down_proj`` MLP or a ``FusedMoE`` block with its two expert tensors and a
router), two norms per layer, final norm, LM head; and times the walk. Its parameter counts are
:attr:`rlperf.stages.weight_sync.Checkpoint.num_engine_params` of the catalog models it times
(tests/test_bench_param_walk.py; DeepSeek's MLA layers are not built here). Times are
the best CPU time (``time.process_time``) of 7 rounds of 200 walks: on a shared machine wall
time mostly measures the neighbours. A host-CPU figure: the H20 / H100 hosts of the validation
runs are other CPUs (a Python-bound walk scales with one core's speed).
"""

from __future__ import annotations

import sys
import time

import torch
from torch import nn

from rlperf.catalog import load_model
from rlperf.specs.model import ModelSpec
from rlperf.stages.weight_sync import Checkpoint


def _param(*shape: int) -> nn.Parameter:
    return nn.Parameter(torch.empty(*shape, device="meta"), requires_grad=False)


class _Params(nn.Module):
    """A module holding the named parameters (vLLM's linear / norm / FusedMoE leaves)."""

    def __init__(self, **shapes: tuple[int, ...]) -> None:
        super().__init__()
        for name, shape in shapes.items():
            self.register_parameter(name, _param(*shape))


def _layer(m: ModelSpec, moe: bool) -> nn.Module:
    h = m.hidden_size
    attn = nn.Module()
    attn.qkv_proj = _Params(weight=(3, h), **({"bias": (3,)} if m.qkv_bias else {}))
    attn.o_proj = _Params(weight=(h, 1))
    attn.rotary_emb = nn.Module()
    attn.attn = nn.Module()
    if m.qk_norm:
        attn.q_norm = _Params(weight=(1,))
        attn.k_norm = _Params(weight=(1,))
    mlp = nn.Module()
    if moe:
        mlp.experts = _Params(w13_weight=(1,), w2_weight=(1,))
        mlp.gate = _Params(weight=(1,))
        if m.moe is not None and m.moe.shared_intermediate_size:
            mlp.shared_expert = nn.Module()
            mlp.shared_expert.gate_up_proj = _Params(weight=(1,))
            mlp.shared_expert.down_proj = _Params(weight=(1,))
    else:
        mlp.gate_up_proj = _Params(weight=(1,))
        mlp.down_proj = _Params(weight=(1,))
        mlp.act_fn = nn.Module()
    layer = nn.Module()
    layer.self_attn, layer.mlp = attn, mlp
    layer.input_layernorm = _Params(weight=(1,))
    layer.post_attention_layernorm = _Params(weight=(1,))
    return layer


def engine_tree(m: ModelSpec) -> nn.Module:
    """A vLLM-shaped module tree of ``m`` (parameters on the meta device)."""
    dense = m.num_layers - (m.num_moe_layers if m.moe is not None else 0)
    inner = nn.Module()
    inner.embed_tokens = _Params(weight=(1,))
    inner.layers = nn.ModuleList([_layer(m, i >= dense) for i in range(m.num_layers)])
    inner.norm = _Params(weight=(1,))
    top = nn.Module()
    top.model = inner
    if not m.tie_word_embeddings:
        top.lm_head = _Params(weight=(1,))
    top.logits_processor = nn.Module()
    return top


def walk_s(tree: nn.Module, rounds: int = 7, calls: int = 200) -> float:
    best = float("inf")
    for _ in range(rounds):
        t0 = time.process_time()
        for _ in range(calls):
            dict(tree.named_parameters())
        best = min(best, (time.process_time() - t0) / calls)
    return best


def main() -> None:
    print(f"Python {sys.version.split()[0]}, torch {torch.__version__}")
    for name in ("Qwen2.5-Math-7B", "Qwen3-30B-A3B", "Qwen3-235B-A22B"):
        m = load_model(name)
        tree = engine_tree(m)
        n = sum(1 for _ in tree.named_parameters())
        t = walk_s(tree)
        print(f"{name}: {n} parameters (Checkpoint.num_engine_params {Checkpoint.of(m).num_engine_params}), "
              f"{sum(1 for _ in tree.modules())} modules: walk {t * 1e6:,.0f} us = {t / n * 1e6:.3f} us per parameter")


if __name__ == "__main__":
    main()
