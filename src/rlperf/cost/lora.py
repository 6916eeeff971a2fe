"""LoRA adapters on a frozen model: their parameters, and what they change in a training step.

LoRA (Hu et al. 2021, arXiv:2106.09685, §4) keeps every adapted weight ``W`` (``d_in x d_out``)
frozen and trains ``A`` (``d_in x r``) and ``B`` (``r x d_out``) beside it: ``h = xW + xAB``.
verl (``lora_rank``, ``target_modules: all-linear``) and OpenRLHF (``--lora_rank``) adapt every
linear layer of the decoder: q, k, v, o and the MLP's gate, up and down projections.

Per device of a tp group, a column-parallel weight (q, k, v, gate, up) keeps its whole ``A``
and a ``1/tp`` slice of ``B``; a row-parallel one (o, down) the reverse:

    adapter_params = r x [ (d + q/tp) + 2 (d + kv/tp) + (q/tp + d)            attention
                         + (m - 1)(d + f/tp) + (f/tp + d) ]                     MLP, m matrices

per layer, ``d`` the hidden size, ``q``/``kv`` the query/key-value widths, ``f`` the MLP width.

What the step costs instead of full fine-tuning (module docstring of
:mod:`rlperf.stages.pass_cost` for the rest):

- forward: ``2 x adapter_params`` FLOPs per token more;
- backward: the frozen weights' data gradients only (one GEMM per weight instead of two) plus
  ``4 x adapter_params`` FLOPs per token for the adapters;
- gradients, optimizer states, the gradient reduce-scatter and the optimizer step cover the
  adapters only; the frozen weights keep their ``param_dtype`` copy (gathered as before).

MoE experts and MLA's low-rank projections are not covered (``lora_rank`` is refused there).
"""

from __future__ import annotations

from rlperf.errors import SpecError
from rlperf.specs.model import ModelSpec
from rlperf.specs.parallel import TrainLayout


def adapter_params_per_layer(model: ModelSpec, rank: int, tp: int = 1) -> float:
    """LoRA parameters of one decoder layer on one device of a tp group (module docstring)."""
    if model.moe is not None or model.mla is not None:
        kind = "MoE" if model.moe is not None else "MLA"
        raise SpecError("lora_rank", f"LoRA on {model.name}'s {kind} layers is not modelled", "0 (full fine-tuning)")
    d, f = model.hidden_size, model.intermediate_size
    q, kv = model.num_heads * model.head_dim, model.num_kv_heads * model.head_dim
    attention = (d + q / tp) + 2 * (d + kv / tp) + (q / tp + d)
    mlp = (model.mlp.num_matrices - 1) * (d + f / tp) + (f / tp + d)
    return rank * (attention + mlp)


def stage_adapter_params(model: ModelSpec, layout: TrainLayout, num_layers: int) -> float:
    """LoRA parameters on one device of a pipeline stage of ``num_layers`` layers (0 without LoRA)."""
    if layout.lora_rank == 0:
        return 0.0
    return num_layers * adapter_params_per_layer(model, layout.lora_rank, layout.tp)
