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
- memory traffic: the adapter path runs as its own ops beside the frozen linear (DeepSpeed-Chat's
  ``LinearLayer_LoRA.forward``: ``F.linear(x, W, b) + (x @ A @ B) * scaling``; PEFT's
  ``result + lora_B(lora_A(dropout(x))) * scaling`` alike): the rank-``r`` GEMMs are thin (about
  ``r`` FLOPs per byte, below a GPU's ridge point at ``r = 128``) and read or write the full
  activations, and the scaling and the add are elementwise passes (:mod:`rlperf.stages.pass_cost`);
- gradients, optimizer states, the gradient reduce-scatter and the optimizer step cover the
  adapters only; the frozen weights keep their ``param_dtype`` copy (gathered as before).

Merging the adapters into the weights before an engine reads them (:func:`merge_cost`,
priced in the weight sync, :mod:`rlperf.stages.weight_sync`): DeepSpeed's hybrid engine
(``DeepSpeedHybridEngine._fuse_lora``, ``v0.9.0``) runs ``weight.data += scaling *
torch.matmul(A^T, B^T)`` for every adapted linear of every layer on each rank's gathered full
weights, before it copies its tensor-parallel slice into the inference containers. Per adapted
weight element (``d_in x d_out`` of each linear, in the weights' dtype): the rank-``r`` product
(``2 r`` FLOPs, the full-size result written, 2 bytes), the scaling (read 2, write 2) and the
in-place add (read 4, write 2): ``MERGE_BYTES_PER_WEIGHT`` = 12 bytes, three kernels per linear.

MoE experts and MLA's low-rank projections are not covered (``lora_rank`` is refused there).
"""

from __future__ import annotations

from rlperf.cost.roofline import elementwise, gemm
from rlperf.errors import SpecError
from rlperf.specs.dtypes import bytes_per
from rlperf.specs.hardware import Cluster
from rlperf.specs.model import ModelSpec
from rlperf.specs.parallel import TrainLayout

MERGE_SCALE_BYTES = 4.0  # ``scaling * (A B)``: reads and writes the full-size product (2 + 2)
MERGE_ADD_BYTES = 6.0  # ``weight.data += ...``: reads the weight and the product, writes the weight
MERGE_BYTES_PER_WEIGHT = 2.0 + MERGE_SCALE_BYTES + MERGE_ADD_BYTES  # with the product's write


def adapted_widths_per_layer(model: ModelSpec, tp: int = 1) -> tuple[float, float]:
    """(sum of input widths, sum of output widths) of one decoder layer's adapted linears on one
    device of a tp group: q, k, v and the MLP's up matrices read ``d`` and write their ``1/tp``
    slice; o and down read their slice and write ``d`` (module docstring)."""
    if model.moe is not None or model.mla is not None:
        kind = "MoE" if model.moe is not None else "MLA"
        raise SpecError("lora_rank", f"LoRA on {model.name}'s {kind} layers is not modelled", "0 (full fine-tuning)")
    d, f, ups = model.hidden_size, model.intermediate_size, model.mlp.num_matrices - 1
    q, kv = model.num_heads * model.head_dim, model.num_kv_heads * model.head_dim
    widths_in = 3 * d + q / tp + ups * d + f / tp
    widths_out = q / tp + 2 * kv / tp + d + ups * f / tp + d
    return widths_in, widths_out


def adapter_params_per_layer(model: ModelSpec, rank: int, tp: int = 1) -> float:
    """LoRA parameters of one decoder layer on one device of a tp group (module docstring):
    ``A`` is ``d_in x r`` and ``B`` is ``r x d_out`` for each adapted linear."""
    widths_in, widths_out = adapted_widths_per_layer(model, tp)
    return rank * (widths_in + widths_out)


def stage_adapter_params(model: ModelSpec, layout: TrainLayout, num_layers: int) -> float:
    """LoRA parameters on one device of a pipeline stage of ``num_layers`` layers (0 without LoRA)."""
    if layout.lora_rank == 0:
        return 0.0
    return num_layers * adapter_params_per_layer(model, layout.lora_rank, layout.tp)


def adapted_linears(model: ModelSpec) -> tuple[tuple[int, int], ...]:
    """(d_in, d_out) of each adapted linear of one decoder layer, whole (no tp split): q, k, v,
    o, the MLP's up matrices and its down matrix (module docstring)."""
    adapted_widths_per_layer(model)  # refuses MoE and MLA models
    d, f, ups = model.hidden_size, model.intermediate_size, model.mlp.num_matrices - 1
    q, kv = model.num_heads * model.head_dim, model.num_kv_heads * model.head_dim
    return ((d, q), (d, kv), (d, kv), (q, d), *((d, f),) * ups, (f, d))


def merge_cost(model: ModelSpec, cluster: Cluster, rank: int, dtype: str) -> tuple[float, float]:
    """(seconds, HBM bytes) of merging rank-``rank`` adapters into every adapted weight of
    ``model`` on one GPU that holds the whole weights in ``dtype`` (module docstring): per linear,
    the product ``A B`` as a GEMM (``d_out x d_in`` output, inner dimension ``rank``), then the
    scaling and the in-place add as elementwise passes over the weight."""
    if rank <= 0:
        return 0.0, 0.0
    b = bytes_per(dtype) / 2.0  # the byte counts above are for 2-byte weights
    time_s = num_bytes = 0.0
    for d_in, d_out in adapted_linears(model):
        product = gemm(cluster, d_out, d_in, rank, dtype)
        scale = elementwise(cluster, b * MERGE_SCALE_BYTES * d_in * d_out)
        add = elementwise(cluster, b * MERGE_ADD_BYTES * d_in * d_out)
        time_s += product.time_s + scale.time_s + add.time_s
        num_bytes += product.bytes + scale.bytes + add.bytes
    return model.num_layers * time_s, model.num_layers * num_bytes
