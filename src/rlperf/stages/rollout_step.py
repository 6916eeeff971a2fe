"""Step time of one rollout-engine replica (vLLM/SGLang-like), as closed-form coefficients.

One engine *step* runs every sequence of the batch through the model once: ``b`` decoding
sequences advance one token each and, under chunked prefill, up to
``max_num_batched_tokens - b`` prompt tokens are prefilled in the same step (vLLM V1 and
Sarathi-Serve schedule the running decodes first, then fill the token budget with prefill).

Per-step time of a replica (``tp`` GPUs per stage; every term below is one GPU's work summed
over the ``pp`` stages, i.e. the path of one micro-batch through the pipeline; with several
micro-batches in flight the token-proportional terms divide by their number, see
:meth:`StepModel.run`):

    device = max(compute, memory, launch floor) + communication + sampler + activation quantization
    step   = device + host                  (the engine schedules between steps: vLLM V0/V1)
           = max(device, host)              (overlap scheduling: SGLang, vLLM async scheduling)
    compute = linear FLOPs / (tp · peak · matmul_eff) + attention FLOPs / (tp · peak · attention_eff)
    memory  = streamed weight bytes per GPU / (HBM bandwidth · decode_hbm_efficiency)
              (a routed expert's slice s costs s + s_half: the grouped GEMM's size curve)
              + (KV bytes read + KV bytes written) per GPU / (HBM bandwidth · kv_eff)
              + q, k, v weights copied per step / (HBM bandwidth · hbm_efficiency)
                (EngineLayout.qkv_copy_per_forward; 0 otherwise)
    kv_eff  = decode_kv_hbm_efficiency  (paged KV cache: continuous batching, vLLM/SGLang)
            = decode_hbm_efficiency     (one contiguous cache per sequence: static batches)
    communication = 2·L all-reduces of the step's activations over the tp group (after the
                    attention and the MLP of every layer, Megatron TP; Shoeybi et al. 2019),
                    or, under data-parallel attention, a dispatch and a combine all-to-all per
                    MoE layer
                    + (pp-1) stage hand-offs (one point-to-point send of the activations)
                    + the all-gather of the vocab-parallel logits over the tp group (b · V fp32)
    sampler = b · V · 4 bytes · SAMPLER_PASSES / (HBM bandwidth · decode_hbm_efficiency)
    launch floor = max(graph_kernel_launch_s, decode_kernel_min_s) · kernels   (CUDA graphs)
                 = max(eager_op_launch_s · ops, decode_kernel_min_s · kernels)  (eager)
                   (ops = Σ_layers eager_ops_per_layer; kernels = ops less the all-reduces)
    host = engine_step_overhead_s + engine_layer_overhead_s · L + engine_seq_overhead_s · n
           (profile; n = sequences in the step, decoding and prefilling; 0 where unset)

A weight-quantized engine (``EngineLayout.dtype`` fp8: vLLM's block FP8, w8a8;
:mod:`rlperf.stages.rollout_quant`) streams its linear and expert weights in that dtype but the
LM head and the MoE gates in the activation dtype (bf16), runs its quantized GEMMs at
``peak(fp8) · matmul_eff(fp8)`` and the LM head at the bf16 rate (decode; a prefill's few
logit positions stay at the quantized rate), attention at ``peak(bf16) · attention_eff`` (bf16
q, k, v), moves bf16 activations in its collectives, and adds the activation quantization
before every quantized GEMM: its kernels in the launch floor and its pass over the step's
tokens (bf16 read, FP8 write, scales) at ``hbm_efficiency``, added to the step.

Decode messages are tiny (``b · d`` activations, a few hundred KB), so the all-reduces are
latency-bound: their cost is the collectives module's alpha-beta model with the profile's
per-step latencies (nccl-tests figures, data/profiles.yaml), across nodes when the tp group
spans nodes (a TP-32 engine on 8-GPU nodes). vLLM's expert parallelism with tensor-parallel
attention (``enable_expert_parallel``) keeps every token on every rank: each rank runs its
local experts and the layer ends with the same all-reduce, so ``ep`` adds no all-to-all here
(an all-to-all dispatch needs data-parallel attention, below).

Data-parallel attention (``EngineLayout.dp_attention``: SGLang's ``--enable-dp-attention`` with
DeepEP, ep = tp, pp = 1) runs attention, the dense layers and the LM head whole on every GPU for
its own ``1/tp`` of the sequences, so a GPU streams the dense weights whole, reads the whole KV
of its own tokens only (MLA's latent is no longer replicated tp times), samples its own rows,
and makes no tp all-reduce or logits gather. Every MoE layer instead dispatches each GPU's
tokens to the ranks of their ``k`` experts and combines the results back: two all-to-alls of
``ceil(n / tp) · k · d`` elements per GPU, in the activation dtype (a w8a8 engine dispatches
FP8 and combines in bf16, as DeepEP's low-latency kernels run it; profiles.yaml's figure). As DeepEP's low-latency kernels run them, the
bytes bound for other nodes (``(p - r) / p`` of them, ``r`` GPUs of the group on a node) move at
``moe_a2a_nic_efficiency`` of the NIC (0.78: DeepEP's published dispatch and combine times for
EP 16 to 256 on H800, profiles.yaml) while the rest rides NVLink, plus one network latency:

    all-to-all = alpha + max((r - 1)/p · bytes / B_intra, (p - r)/p · bytes / (NIC · moe_a2a_nic_efficiency))

Each data-parallel rank runs its own scheduler, so the host time per sequence divides by
``tp``. The busiest expert rank's reads are the expert-parallel ones above. Imbalance between the
data-parallel ranks (each schedules its own requests) is not modelled: the replica's batch is
taken as evenly split.

The sampler reads the step's logits (one fp32 row of ``V`` per sampled sequence) after the
forward: the LM head writes them, the temperature / softmax pass reads and writes them, and the
sampling kernel reads the probabilities: ``SAMPLER_PASSES = 4`` full passes over ``b · V · 4``
bytes (a structural count of vLLM's sampler with top-p = 1 and top-k off, the RL default; a
sort for top-p/top-k would add more). It runs after the forward, so it is added.

The host time is the engine's own CPU work per step: scheduling the batch, preparing its
inputs, sampler bookkeeping, processing the sampled tokens. Most of it is a loop over the
step's sequences, so it grows with the batch: ``engine_seq_overhead_s`` per sequence (vLLM's V1
engine leaves the GPU idle about 5-6 ms between two decode steps of 256 Llama-2-7B sequences,
vllm-project/vllm#10634, i.e. ~21.5 us per sequence; profiles.yaml). ``engine_step_overhead_s``
is the part that does not depend on the batch: 2.14 ms, vLLM's single-stream TPOT of
Qwen3-1.7B on an A100 (4.6 ms) less rlperf's own device step for it (2.46 ms)
(tenstorrent/tt-inference-server#340; profiles.yaml). ``engine_layer_overhead_s`` is the module
dispatch of an eager framework per layer (HF ``generate``; ``rlperf calibrate`` measures it
there), unset for vLLM and SGLang. Without overlap scheduling (vLLM V0 and V1
by default) the host work sits between two steps and is added: the next step cannot be
launched before its batch is scheduled (vLLM's v0.6 blog: with v0.5.3 on one H100, scheduling
took 29% of a Llama-3-8B run's time against 38% of GPU execution, and the GPU sat idle
meanwhile; https://blog.vllm.ai/2024/09/05/perf-update.html). With overlap scheduling
(``EngineLayout.overlap_scheduling``: SGLang's zero-overhead scheduler, vLLM
``--async-scheduling``) the host prepares step n+1 while the GPU runs step n, so a step costs
the larger of the two (SGLang v0.4's Nsight profile shows no GPU idle time between decode
steps; https://lmsys.org/blog/2024-12-04-sglang-v0-4/). In the closed form the host time is one
more flat line in the max: ``max(device, host) = max(compute, memory, floor, host - extra) +
extra`` with ``extra`` = communication + sampler.

The launch floor enters the max, not the sum: a step cannot finish before its kernels are
launched, but launches overlap with the kernels of the step, and ``decode_hbm_efficiency`` is an
end-to-end decode figure (gpt-fast MBU) that already carries the gaps between kernels; adding
the launches on top would count them twice. vLLM and SGLang replay decode steps as CUDA graphs:
a kernel then costs its replay (``graph_kernel_launch_s``, a no-op kernel's) but no decode
kernel is shorter than ``decode_kernel_min_s``, the time of a tiny kernel's launch latency, ramp
and tail (6.13 us, profiles.yaml: vLLM's single-stream TPOT of Qwen3-0.6B and Qwen3-1.7B on
an A100, 4.2 and 4.6 ms, both 28 layers, are met only by a floor of ~2.06 ms for the smaller
model's 336 kernels and the 2.14 ms host time of the larger), so small models and MoE layers
(more, smaller kernels) are floor-bound at small batches. Another implementation's layer sets
its own count (``EngineLayout.eager_ops_per_layer``, :func:`step_ops`): HF ``generate`` on a
transformers (v4.36-4.38, SDPA attention, ``DynamicCache``) Llama layer dispatches 45 (two 8-op fp32 RMSNorms, separate q/k/v projections,
rotary with its cos/sin casts and gathers and two rotate-half, two cache concatenations,
attention, the output transpose copy and projection, a 5-op MLP, two residual adds). In eager execution (``EngineLayout.cuda_graphs = False``, vLLM's
``enforce_eager``) the host dispatches every op of every layer through Python and the
PyTorch dispatcher, and the floor is ``eager_op_launch_s`` per op dispatched (Llama-3.1-8B on
an H100: 8.4 ms per decode step eager against 5.1 ms as a CUDA graph, the eager step
host-bound: 26.25 us per op of its 32 x 10; profiles.yaml), which binds for small batches. The
ops of a layer are a structural count of vLLM's decoder layers (:func:`eager_ops_per_layer`):
a dense layer dispatches 10 at tp 1 (norm, QKV, rotary, KV write, attention, output
projection, norm, gate-up, activation, down) and two all-reduces at tp > 1; Qwen3's q/k norms
add 2; MLA adds 6 (the q and kv down-projections with their norms and the two absorbed
up-projections in place of one QKV GEMM); a shared-expert MLP adds 3 (4 with its gate). A
routed-expert layer's block is counted from vLLM 0.8.5's fused-MoE path (the version of the
image verl's DeepSeek-V3 recipe names; ``fused_moe.py``, ``moe_align_block_size.py``,
``deepseek_v2.py``): the router GEMM, the top-k, the align step's three kernels (a fill of the
sorted ids, a zeroed expert-id buffer, the align kernel), the grouped gate-up, activation and
down (in place of the MLP's three) and the sum of the k outputs. The top-k is ``fused_topk``
(the logits cast to fp32 and one top-k softmax kernel: 2) for a plain router; DeepSeek's MoE
class always runs ``grouped_topk`` (``ModelSpec.moe.routing``), a ``torch.compile``'d function
that stays compiled under ``enforce_eager``: 7 kernels (4 fused pointwise/reduction kernels
and 3 top-k calls, the count of its inductor graph compiled here for the CPU, standing in for
the GPU's), followed by the routed scaling and the shared output's add. So a plain MoE layer
adds 7 and a DeepSeek one 14 (DeepSeek-V3's MoE layer at tp > 1: 10 + 2 + 6 + 14 + 3 = 35 as
a graph replays it). In eager mode vLLM's MLA decode path (``v1/attention/backends/mla/
common.py``, ``flashmla.py``) dispatches 19 more ops that a graph's ``torch.compile`` fuses:
the contiguous copies of the latent and of q_pe, DeepSeek's YaRN rotary
(``DeepseekScalingRotaryEmbedding.forward``, PyTorch ops: the cos/sin index, two
``repeat_interleave``, five ops each for q and k: 13 for the structural 1), the two copies of
the rotated q_pe and k_pe back into place, the cat of q_nope and q_pe before FlashMLA, the
output's reshape after the W_UV bmm and its copy into the layer's output: 54 ops per
DeepSeek-V3 MoE layer eager (37 for its 3 dense layers). The counts are low estimates: each
op is charged ``eager_op_launch_s``, a figure of vLLM's Llama layer whose 10 ops are whole
modules, while the compiled top-k's Triton launches and its guard check are not counted
apart. A count, not fitted.

The roofline ``max(compute, memory)`` is the usual decode model (Williams et al. 2009; Pope et
al. 2022, "Efficiently Scaling Transformer Inference", §2). With the batch fixed, the total
context ``C`` grows by ``b`` tokens per step, and both sides of the max are affine in ``C``, so
a run of ``n`` steps has a closed form (:meth:`Run.time_s`, :func:`envelope_sum`) and the run
is split where the max switches sides.

Weights streamed per step: every matmul weight (the embedding table is only gathered, ``b``
rows, and is not counted; the LM head is). For a mixture of experts, a layer reads only the
experts its tokens are routed to. With ``n`` tokens each choosing ``k`` of ``E`` experts
(assumed uniform and independent), the expected number of distinct experts touched is
``E · (1 - (1 - k/E)^n)``: ``k`` at ``n = 1``, approaching ``E`` for large batches. With the
experts tp-sharded (``ep = 1``) every GPU reads ``1/tp`` of each touched expert. With expert
parallelism each of the ``r = ep / pp`` ranks of a stage holds ``E / r`` whole experts, and the
step waits for the rank that touched the most: each local expert is touched with probability
``q = 1 - (1 - k/E)^n``, so a rank's count is Binomial(E/r, q) and the busiest of ``r`` ranks
touches about ``mean + sd · sqrt(2 ln r)`` (the Gaussian bound on the expected maximum of ``r``
draws), at most ``E / r``. Routing that is not uniform (popular experts) is the profile's
``moe_routing_imbalance`` factor on that count (default 1: no published figure; it could only be
fitted on MoE decode cases with published lengths, and the calibration split holds none).

Those expert reads do not stream at the dense rate. The engines' grouped GEMM (vLLM's and
SGLang's Triton fused-MoE kernel) runs a block of thread blocks per touched expert, and a small
expert slice (a tp-sharded expert: DeepSeek-V3 at TP 32 holds 2.75 MB of each expert per GPU
per layer) ends before its blocks reach full bandwidth. Published kernel sweeps give the
bandwidth per slice size ``s`` (one expert's matrices of one layer on one GPU): 0.87 of the HBM
peak at 176 MB (Mixtral TP2), 0.54 at 2.36 MB, 0.43 at 1.57 MB, 0.33 at 0.79 MB, i.e. the
large-slice rate times ``s / (s + s_half)`` with ``s_half = moe_expert_read_half_bytes`` (1.44
MB; profiles.yaml has the sweeps). A touched slice therefore costs ``s + s_half`` bytes at the
decode bandwidth (:meth:`StepModel.weight_read_s`); the HBM traffic stays ``s``.

The KV cache does not stream at the weights' rate. ``decode_hbm_efficiency`` is an end-to-end
decode figure of a batch-1 step (gpt-fast), i.e. of large contiguous weight matrices; the KV
cache of a continuous-batching engine is read by a paged decode-attention kernel that gathers
each sequence's blocks through its block table, one (sequence, KV head) tile at a time.
Published kernel sweeps of those kernels reach less of the HBM peak: FlashAttention-3's paged
decode (vLLM V1's and verl's SGLang backend on Hopper) 0.54-0.55 on an H100 (page 8, 2-4k
tokens), 0.27 with its default tiles and 0.46 with tuned ones on an H20 (page 128, 16k tokens),
FlashInfer's tensor-core decode 0.84 on the same H20 batch (flash-attention#1572); the median,
0.536, is the profile's generic ``decode_kv_hbm_efficiency`` (profiles.yaml). A static batch
(HF ``generate``, DeepSpeed's hybrid engine) keeps one contiguous cache per sequence and reads
it at ``decode_hbm_efficiency``.

KV bytes per GPU: the KV heads a tp rank holds (:func:`rlperf.cost.memory_params.kv_heads_per_device`,
the same count the memory model uses: split up to ``num_kv_heads`` ways, replicated beyond;
MLA's latent is whole on every rank).

MLA (DeepSeek) attention is counted with :meth:`ModelSpec.attention_flops`, the non-absorbed
form; engines absorb the up-projections into the latent for decode, which changes the FLOPs
but not the KV bytes that bound a decode step.

Prefill: a prompt chunk's linear FLOPs leave out the LM head except for the last position of
each sequence (engines compute logits only for sampled positions); attention FLOPs follow
:meth:`ModelSpec.attention_flops` (causal pairs).

An engine that refills a fused QKV buffer at every forward (``EngineLayout.qkv_copy_per_forward``):
DeepSpeed's hybrid engine under ZeRO-3 (``v0.9.0``) keeps each layer's q, k and v weights apart
in its inference containers (``set_params_wo_copy`` with ZeRO-3 leaves ``attn_qkvw`` unset and
points ``attn_qw``/``attn_kw``/``attn_vw`` at the parameters, which ``apply_tensor_parallelism``
replaces with the rank's slices), so ``DeepSpeedSelfAttention.forward`` runs ``_merge_qkv`` at
every decode step: three slice assignments of the rank's q, k and v weights into the shared
``_qkv_buffers[0]`` and three of the biases (when the model has them) into ``_qkv_buffers[1]``,
then the QKV GEMM reads the buffer. Per step and GPU that is a read and a write of
``(q + 2 kv) / tp x (d + bias)`` elements a layer, at the copy rate (``hbm_efficiency``, a STREAM
copy figure), and 3 or 6 more ops a layer in the eager floor.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import overload

import numpy as np

from rlperf.cost.collectives import all_gather, costs_each, group_for, p2p_each
from rlperf.cost.memory_params import kv_heads_per_device
from rlperf.specs.dtypes import bytes_per
from rlperf.specs.hardware import Cluster
from rlperf.specs.model import ModelSpec
from rlperf.specs.parallel import EngineLayout
from rlperf.stages.rollout_quant import EngineQuant

# Full passes of the sampler over the step's fp32 logits (LM-head write, softmax read + write,
# sampling read): see the module docstring. Structural, not fitted.
SAMPLER_PASSES = 4
_LOGIT_BYTES = 4  # fp32 logits

# Memoized flat parts of runs per step model (StepModel.run), at most.
_FLAT_CACHE_MAX = 1 << 16

# A coefficient of one run (a Python number) or of many runs at once (a numpy array, one entry
# per run): the engine times all runs of a replica in one pass once nothing outside the replica
# can change them (rlperf.stages.rollout_runout). Both go through the same expressions.
Coef = float | np.ndarray
Count = int | np.ndarray


@dataclass(frozen=True)
class StepModel:
    """Per-step cost coefficients of one engine replica. Build with :meth:`build`."""

    tp: int
    pp: int
    num_layers: int
    hidden_size: int
    # FLOPs
    decode_linear_flops_per_token: float  # 2 · matmul weights incl. the LM head
    prefill_linear_flops_per_token: float  # without the LM head
    lm_head_flops: float  # one position's logits
    attention_flops_per_pair: float  # one (query, key) pair over all layers
    # rates (per stage's tp GPUs; stages run one after the other)
    matmul_flops_per_s: float
    attention_flops_per_s: float
    hbm_bytes_per_s: float  # one GPU, decode streaming of the weights
    # bytes per GPU summed over the pp stages
    dense_weight_bytes_per_gpu: float  # all streamed weights except routed experts
    expert_bytes_per_gpu: float  # one routed expert in every MoE layer (its 1/tp share if ep = 1)
    kv_bytes_per_token_per_gpu: float
    num_experts: int  # 0 for a dense model
    experts_per_token: int
    floor_s: float  # kernel-launch floor per step
    overhead_s: float  # host-side engine cost per step that does not depend on the batch
    expert_ranks: int = 1  # ranks of a stage holding whole experts (ep / pp); 1: tp-sharded
    # bytes-equivalent a touched expert costs over all MoE layers on top of its bytes: the
    # grouped GEMM's half-saturation slice (moe_expert_read_half_bytes) x MoE layers
    expert_extra_bytes_per_gpu: float = 0.0
    # data-parallel attention (EngineLayout.dp_attention): each GPU holds its own sequences; the
    # MoE layers' dispatch and combine all-to-alls replace the tp all-reduces and logits gather
    dp_attention: bool = False
    num_moe_layers: int = 0
    a2a_nic_bytes_per_s: float = 0.0  # cross-node all-to-all rate per GPU (NIC x efficiency)
    routing_imbalance: float = 1.0  # busiest rank's touched experts over the uniform-routing figure
    vocab_size: int = 0
    sampler_s_per_seq: float = 0.0  # sampler HBM time per sampled sequence
    # one GPU reading and writing the KV cache (paged decode attention; see the module docstring)
    kv_hbm_bytes_per_s: float = 0.0
    host_s_per_seq: float = 0.0  # host-side engine cost per sequence of a step
    weight_copy_s: float = 0.0  # q, k, v weights copied into a fused buffer every step (qkv_copy_per_forward)
    overlap: bool = False  # host work overlaps the device step (max) instead of adding to it
    # a quantized engine (rollout_quant): the LM head's GEMM at the activation dtype's rate, per
    # FLOP on top of the quantized rate (decode; 0 otherwise), and the activation-quantization
    # pass before every quantized GEMM, per token of a step (added: a kernel of its own)
    lm_head_extra_s_per_flop: float = 0.0
    act_quant_s_per_token: float = 0.0
    # communication, filled lazily per token count
    _comm_cache: dict[tuple[int, int], float] = field(
        default_factory=dict, compare=False, repr=False
    )
    _gather_cache: dict[int, float] = field(default_factory=dict, compare=False, repr=False)
    # the array forms of comm_s (per micro-batch count) and sampler_s, tabled by token or
    # sequence count from 0 (_tabled)
    _tables: dict[tuple[str, int], np.ndarray] = field(default_factory=dict, compare=False, repr=False)
    _flat_cache: dict[tuple[int, float, float, int], _Flat] = field(default_factory=dict, compare=False, repr=False)
    _cluster: Cluster | None = field(default=None, compare=False, repr=False)
    _act_bytes: float = field(default=2.0, compare=False, repr=False)
    # bytes per element of an expert dispatch (DeepEP low-latency: FP8 for a w8a8 engine); the
    # combine returns activations (_act_bytes)
    dispatch_bytes_per_elem: float = field(default=2.0, compare=False, repr=False)

    @classmethod
    def build(
        cls, model: ModelSpec, cluster: Cluster, layout: EngineLayout, cuda_graphs: bool = True
    ) -> StepModel:
        acc, prof = cluster.accelerator, cluster.profile
        tp, pp = layout.tp, layout.pp
        quant = EngineQuant.of(layout)  # fp8: quantized GEMMs; LM head, attention, activations in bf16
        peak = acc.peak(quant.weight_dtype)
        act_peak = acc.peak(quant.act_dtype)
        wbytes, act_bytes = quant.weight_bytes, quant.act_bytes
        lm_head_params = model.vocab_size * model.token_embedding_size
        unquantized = lm_head_params + model.breakdown.router  # vLLM's LM head and MoE gates
        expert_params, active_expert_params = _expert_params(model)
        streamed_dense = model.matmul_params_per_token - active_expert_params
        kv_share = kv_heads_per_device(model, tp) / (
            1 if model.mla is not None else model.num_kv_heads
        )
        launch_s = prof.graph_kernel_launch_s
        moe = model.moe
        hbm = acc.hbm_bandwidth_bytes_per_s * prof.decode_hbm_efficiency
        # a paged KV cache (continuous batching) is read at the paged decode kernels' rate
        paged = layout.batching == "continuous"
        kv_hbm = acc.hbm_bandwidth_bytes_per_s * prof.decode_kv_hbm_efficiency if paged else hbm
        whole_experts = moe is not None and layout.ep > 1
        expert_ranks = max(1, layout.ep // pp) if whole_experts else 1
        dp = layout.dp_attention
        shard = 1 if dp else tp  # dense weights and the LM head: whole on every GPU under dp attention
        ops, kernels = step_ops(model, layout)
        copy_bytes = qkv_copy_bytes_per_gpu(model, layout)
        matmul_rate = tp * peak * prof.matmul_eff(quant.weight_dtype)
        lm_head_rate = tp * act_peak * prof.matmul_eff(quant.act_dtype)
        copy_rate = acc.hbm_bandwidth_bytes_per_s * prof.hbm_efficiency
        return cls(
            tp=tp,
            pp=pp,
            num_layers=model.num_layers,
            hidden_size=model.hidden_size,
            decode_linear_flops_per_token=model.linear_flops(1),
            prefill_linear_flops_per_token=model.linear_flops(1) - 2.0 * lm_head_params,
            lm_head_flops=2.0 * lm_head_params,
            attention_flops_per_pair=model.attention_flops(1, 0),
            matmul_flops_per_s=matmul_rate,
            # 0 unless the LM head runs at another rate than the quantized GEMMs (exactly 0 then)
            lm_head_extra_s_per_flop=1 / lm_head_rate - 1 / matmul_rate if lm_head_rate != matmul_rate else 0.0,
            attention_flops_per_s=tp * act_peak * prof.attention_efficiency,
            hbm_bytes_per_s=hbm,
            kv_hbm_bytes_per_s=kv_hbm,
            dense_weight_bytes_per_gpu=(streamed_dense * wbytes if wbytes == act_bytes else
                                        (streamed_dense - unquantized) * wbytes + unquantized * act_bytes) / shard,
            expert_bytes_per_gpu=expert_params * wbytes / (1 if whole_experts else tp),
            expert_extra_bytes_per_gpu=(prof.moe_expert_read_half_bytes or 0.0) * (model.num_moe_layers if moe else 0),
            # dp attention: a GPU keeps the whole KV of its 1/tp of the tokens
            kv_bytes_per_token_per_gpu=model.kv_bytes_per_token(layout.kv_dtype) * (1 / tp if dp else kv_share),
            num_experts=moe.num_experts if moe is not None else 0,
            experts_per_token=moe.experts_per_token if moe is not None else 0,
            floor_s=(max(launch_s, prof.decode_kernel_min_s) * kernels if cuda_graphs
                     else max(prof.eager_op_launch_s * ops, prof.decode_kernel_min_s * kernels)),
            overhead_s=prof.engine_step_s(model.num_layers),
            expert_ranks=expert_ranks,
            routing_imbalance=prof.moe_routing_imbalance or 1.0,
            vocab_size=model.vocab_size,
            sampler_s_per_seq=model.vocab_size * _LOGIT_BYTES * SAMPLER_PASSES / hbm / (tp if dp else 1),
            host_s_per_seq=prof.engine_seq_s / (tp if dp else 1),  # dp attention: a scheduler per rank
            overlap=layout.overlap_scheduling,
            weight_copy_s=copy_bytes / copy_rate,
            act_quant_s_per_token=quant.bytes_per_token(model, shard) / copy_rate,
            dp_attention=dp,
            num_moe_layers=model.num_moe_layers if moe is not None else 0,
            a2a_nic_bytes_per_s=acc.nic_bandwidth_bytes_per_s * (prof.moe_a2a_nic_efficiency or prof.inter_node_efficiency),
            _cluster=cluster,
            _act_bytes=act_bytes,
            dispatch_bytes_per_elem=wbytes if quant.quantizes_activations else act_bytes,
        )

    # ------------------------------------------------------------------ per step pieces
    def weight_bytes_per_gpu(self, num_tokens: Count) -> Coef:
        """Weight bytes one GPU streams in a step that processes ``num_tokens`` tokens."""
        if self.num_experts == 0:
            return self.dense_weight_bytes_per_gpu
        if isinstance(num_tokens, np.ndarray):
            # Python's pow, as for one run: numpy's may differ in the last bit.
            sizes, where = np.unique(num_tokens, return_inverse=True)
            return np.array([self.weight_bytes_per_gpu(t) for t in sizes.tolist()])[where]
        return self.dense_weight_bytes_per_gpu + self.experts_read(num_tokens) * self.expert_bytes_per_gpu

    def weight_read_s(self, num_tokens: Count) -> Coef:
        """Time one GPU streams its weights in a step over ``num_tokens`` tokens: the bytes of
        :meth:`weight_bytes_per_gpu`, each touched expert slice at the grouped GEMM's
        size-dependent bandwidth (module docstring: ``s / (s + s_half)`` of the dense rate)."""
        if self.num_experts == 0:
            return self.dense_weight_bytes_per_gpu / self.hbm_bytes_per_s + self.weight_copy_s
        if isinstance(num_tokens, np.ndarray):
            sizes, where = np.unique(num_tokens, return_inverse=True)
            return np.array([self.weight_read_s(t) for t in sizes.tolist()])[where]
        per_expert = self.expert_bytes_per_gpu + self.expert_extra_bytes_per_gpu
        streamed = self.dense_weight_bytes_per_gpu + self.experts_read(num_tokens) * per_expert
        return streamed / self.hbm_bytes_per_s + self.weight_copy_s

    def experts_read(self, num_tokens: int) -> float:
        """Routed experts (per MoE layer) whose weights the busiest GPU reads in a step over
        ``num_tokens`` tokens: all touched ones (tp-sharded, a 1/tp slice each), or the busiest
        expert-parallel rank's whole local experts (see the module docstring)."""
        e, k, r = self.num_experts, self.experts_per_token, self.expert_ranks
        q = 1.0 - (1.0 - k / e) ** num_tokens
        if r == 1:
            return e * q
        local = e / r
        busiest = local * q + math.sqrt(local * q * (1.0 - q) * 2.0 * math.log(r))
        return min(local, busiest * self.routing_imbalance)

    def sampler_s(self, num_seqs: Count) -> Coef:
        """Sampling over the vocabulary for ``num_seqs`` sequences: the logits' HBM passes plus
        the all-gather of the vocab-parallel logits over the tp group."""
        if isinstance(num_seqs, np.ndarray):  # many runs: every all-gather costed in one pass
            return self._tabled("sampler", 0, num_seqs, self._samplers_each)
        if num_seqs <= 0:
            return 0.0
        return num_seqs * self.sampler_s_per_seq + self.logits_gather_s(num_seqs)

    def _samplers_each(self, num_seqs: np.ndarray, _: int) -> np.ndarray:
        seqs = num_seqs.astype(np.float64)
        gather = self._gathers_each(seqs * self.vocab_size * _LOGIT_BYTES)
        return np.where(num_seqs <= 0, 0.0, seqs * self.sampler_s_per_seq + gather)

    def _tabled(self, name: str, mb: int, counts: np.ndarray, each: Callable[[np.ndarray, int], np.ndarray]) -> np.ndarray:
        """``each(counts, mb)`` read from a table of ``each(0, 1, 2, ..., mb)`` kept on the step
        model (every entry is the same elementwise expression, so the values are equal); the
        table is made, or doubled, when asked for many runs at once, else the counts are
        costed directly (a few runs would not pay for it)."""
        key = (name, mb)
        table = self._tables.get(key)
        if counts.size and counts.min() < 0:
            return each(counts, mb)
        top = int(counts.max(initial=0))
        if table is None or top >= len(table):
            size = max(top + 1, 2 * len(table) if table is not None else 0)
            if 4 * counts.size < size:
                return each(counts, mb)
            table = self._tables[key] = each(np.arange(size, dtype=np.int64), mb)
        got: np.ndarray = table[counts]
        return got

    def _gathers_each(self, out_bytes: np.ndarray) -> np.ndarray:
        if self.tp == 1 or self.vocab_size == 0 or self.dp_attention:
            return np.zeros(out_bytes.shape)
        cluster = self._cluster
        assert cluster is not None
        return costs_each("all_gather", cluster, out_bytes, group_for(cluster, self.tp)).time_s

    def logits_gather_s(self, num_seqs: int) -> float:
        if self.tp == 1 or self.vocab_size == 0 or self.dp_attention:
            return 0.0
        hit = self._gather_cache.get(num_seqs)
        if hit is None:
            cluster = self._cluster
            assert cluster is not None
            out = num_seqs * self.vocab_size * _LOGIT_BYTES
            hit = all_gather(cluster, out, group_for(cluster, self.tp)).time_s
            self._gather_cache[num_seqs] = hit
        return hit

    def comm_s(self, num_tokens: Count, num_microbatches: Count = 1) -> Coef:
        """TP all-reduces and PP hand-offs of one step over ``num_tokens`` tokens split into
        ``num_microbatches`` pipeline micro-batches (on the critical stage)."""
        if self.tp == 1 and self.pp == 1:
            return 0.0
        if isinstance(num_tokens, np.ndarray):  # many runs: every collective costed in one pass
            if isinstance(num_microbatches, int) or self.pp == 1:
                return self._tabled("comm", int(np.max(num_microbatches, initial=1)), num_tokens, self._comm_each)
            assert ((num_microbatches >= 1) & (num_microbatches <= self.pp)).all()
            out = np.empty(num_tokens.shape)
            for mb in range(1, self.pp + 1):
                at = num_microbatches == mb
                out[at] = self._tabled("comm", mb, num_tokens[at], self._comm_each)
            return out
        assert isinstance(num_microbatches, int)
        key = (num_tokens, num_microbatches)
        cached = self._comm_cache.get(key)
        if cached is None:
            cached = self._comm_uncached(num_tokens, num_microbatches)
            self._comm_cache[key] = cached
        return cached

    def _comm_uncached(self, num_tokens: int, num_microbatches: int) -> float:
        return float(self._comm_each(np.array([num_tokens]), num_microbatches)[0])

    def _comm_each(self, num_tokens: np.ndarray, num_microbatches: Count) -> np.ndarray:
        cluster = self._cluster
        assert cluster is not None
        per_mb = num_tokens * self.hidden_size * self._act_bytes / num_microbatches
        total = np.zeros(per_mb.shape)
        if self.dp_attention:  # a dispatch and a combine per MoE layer, nothing else
            if self.dispatch_bytes_per_elem == self._act_bytes:
                a2a: np.ndarray = total + 2 * self.num_moe_layers * self.all_to_all_each(num_tokens)
            else:
                both = self.all_to_all_each(num_tokens, self.dispatch_bytes_per_elem) + self.all_to_all_each(num_tokens)
                a2a = total + self.num_moe_layers * both
            return a2a
        if self.tp > 1:
            # A step lasts pp stage-times of one micro-batch (see run), and each stage
            # all-reduces the micro-batch's activations twice per layer.
            group = group_for(cluster, self.tp)
            total = total + 2 * self.num_layers * costs_each("all_reduce", cluster, per_mb, group).time_s
        if self.pp > 1:
            # A stage boundary stays in a node when the whole replica does.
            same_node = self.tp * self.pp <= cluster.gpus_per_node
            total = total + (self.pp - 1) * p2p_each(cluster, per_mb, same_node).time_s
        return total

    def all_to_all_each(self, num_tokens: np.ndarray, elem_bytes: float | None = None) -> np.ndarray:
        """One expert dispatch (or combine) of a step over ``num_tokens`` tokens under data-parallel
        attention: each GPU sends its ``num_tokens / tp`` tokens' ``k`` hidden vectors to the ranks
        of their experts (module docstring), ``elem_bytes`` per element (default: the activations')."""
        cluster = self._cluster
        assert cluster is not None
        group = group_for(cluster, self.tp)
        p, r = group.size, group.ranks_per_node
        sent = np.ceil(num_tokens / p) * self.experts_per_token * self.hidden_size * (elem_bytes or self._act_bytes)
        prof, acc = cluster.profile, cluster.accelerator
        intra_bw = acc.intra_node_group_bandwidth_bytes_per_s(r) * prof.intra_node_efficiency
        intra = (r - 1) / p * sent / intra_bw
        if p <= r:
            inside: np.ndarray = prof.intra_node_latency_s + intra
            return inside
        cross = (p - r) / p * sent / self.a2a_nic_bytes_per_s
        across: np.ndarray = prof.inter_node_latency_s + np.maximum(intra, cross)
        return across

    # ------------------------------------------------------------------ a run of steps
    def run(
        self,
        num_decode: int,
        context_tokens: float,
        chunk_tokens: float,
        prefill_s_per_token: float,
        num_prefill_seqs: int = 0,
    ) -> Run:
        """Coefficients of steps with ``num_decode`` decoding sequences of total context
        ``context_tokens`` (at the first step) plus ``chunk_tokens`` prefill tokens per step
        (from ``num_prefill_seqs`` prompts) costing ``prefill_s_per_token`` of compute each.

        Pipeline parallelism: as vLLM's virtual engines, the step's sequences are split into
        ``mb = min(pp, sequences)`` balanced micro-batches in flight on the pp stages. A step
        (every sequence advances once) then takes ``pp`` stage-times of one micro-batch: the
        token-proportional compute and KV traffic divide by ``mb``, while every micro-batch
        still streams its stage's weights (``mb = 1``: the stages run one after the other)."""
        # An engine replans at every event with a new context but mostly the same batch, chunk
        # and wave: the rest of the coefficients is computed once per such key.
        key = (num_decode, chunk_tokens, prefill_s_per_token, num_prefill_seqs)
        flat = self._flat_cache.get(key)
        if flat is None:
            if len(self._flat_cache) >= _FLAT_CACHE_MAX:  # a step model kept over many calls: bounded
                self._flat_cache.clear()
            flat = self._flat_cache[key] = self._flat(num_decode, chunk_tokens, prefill_s_per_token, num_prefill_seqs)
        c0, c1, m0, m1, floor, fixed = flat.lines(num_decode, context_tokens, chunk_tokens)
        return Run(float(c0), float(c1), float(m0), float(m1), float(floor), float(fixed))

    def runs(
        self,
        num_decode: np.ndarray,
        context_tokens: np.ndarray,
        chunk_tokens: np.ndarray,
        prefill_s_per_token: np.ndarray,
        num_prefill_seqs: np.ndarray,
    ) -> Runs:
        """:meth:`run` of many runs at once (arrays, one entry per run)."""
        c0, c1, m0, m1, floor, fixed = self._coefficients(
            num_decode, context_tokens, chunk_tokens, prefill_s_per_token, num_prefill_seqs
        )
        shape = num_decode.shape
        c0, c1, m0, m1, floor, fixed = (x if isinstance(x, np.ndarray) and x.shape == shape else np.broadcast_to(x, shape)
                                        for x in (c0, c1, m0, m1, floor, fixed))
        return Runs(c0, c1, m0, m1, floor, fixed)

    def _coefficients(
        self, b: Count, context_tokens: Coef, c: Coef, prefill_s_per_token: Coef, num_prefill_seqs: Count
    ) -> tuple[Coef, Coef, Coef, Coef, Coef, Coef]:
        """(c0, c1, m0, m1, floor, fixed) of :meth:`run`, for one run or arrays of runs."""
        return self._flat(b, c, prefill_s_per_token, num_prefill_seqs).lines(b, context_tokens, c)

    def _flat(self, b: Count, c: Coef, prefill_s_per_token: Coef, num_prefill_seqs: Count) -> _Flat:
        """The parts of :meth:`_coefficients` that do not depend on the context."""
        n_tok = b + _ceil(c)
        mb = self.num_microbatches(b + num_prefill_seqs)
        kv_s = self.kv_bytes_per_token_per_gpu / self.kv_hbm_bytes_per_s / mb
        attn_s = self.attention_flops_per_pair / self.attention_flops_per_s / mb
        c0 = b * self.decode_linear_flops_per_token / self.matmul_flops_per_s / mb
        weights_s = self.weight_read_s(-(-n_tok // mb))
        extra = self.comm_s(n_tok, mb) + self.sampler_s(b)
        if self.act_quant_s_per_token:  # a quantized engine only: other engines' sums stay bit-equal
            c0 = c0 + b * self.lm_head_flops * self.lm_head_extra_s_per_flop / mb
            extra = extra + n_tok * self.act_quant_s_per_token / mb
        host = self.host_s(b + num_prefill_seqs)
        if self.overlap:  # max(device, host): host is one more flat line, net of the extras
            floor: Coef = np.maximum(self.floor_s, host - extra)
            return _Flat(c0, attn_s, prefill_s_per_token * c / mb, weights_s, kv_s, floor, extra)
        return _Flat(c0, attn_s, prefill_s_per_token * c / mb, weights_s, kv_s, self.floor_s, extra + host)

    def host_s(self, num_seqs: Count) -> Coef:
        """Host-side engine time of a step over ``num_seqs`` sequences (module docstring)."""
        return self.overhead_s + self.host_s_per_seq * num_seqs

    def num_microbatches(self, num_seqs: Count) -> Count:
        """Pipeline micro-batches of a step over ``num_seqs`` sequences: ``min(pp, num_seqs)``,
        at least one."""
        if isinstance(num_seqs, np.ndarray):
            if self.pp == 1:  # the same ones, without clip's dispatch
                return np.ones_like(num_seqs)
            clipped: np.ndarray = np.clip(num_seqs, 1, self.pp)
            return clipped
        return max(1, min(self.pp, num_seqs))

    @overload
    def prefill_s_per_token(self, num_tokens: int, num_pairs: float, num_seqs: int) -> float: ...

    @overload
    def prefill_s_per_token(self, num_tokens: np.ndarray, num_pairs: np.ndarray, num_seqs: np.ndarray) -> np.ndarray: ...

    def prefill_s_per_token(self, num_tokens: Count, num_pairs: Coef, num_seqs: Count) -> Coef:
        """Average compute time per prefill token of a set of prompts: ``num_tokens`` tokens,
        ``num_pairs`` causal (query, key) pairs, logits for ``num_seqs`` last positions."""
        lin = num_tokens * self.prefill_linear_flops_per_token + num_seqs * self.lm_head_flops
        attn = num_pairs * self.attention_flops_per_pair
        return (lin / self.matmul_flops_per_s + attn / self.attention_flops_per_s) / num_tokens

    def prefill_flops(self, num_tokens: int, num_pairs: float, num_seqs: int) -> float:
        lin = num_tokens * self.prefill_linear_flops_per_token + num_seqs * self.lm_head_flops
        return lin + num_pairs * self.attention_flops_per_pair

    def decode_flops(self, num_decode: Count, context_sum: Coef) -> Coef:
        """FLOPs of decode steps whose contexts sum to ``context_sum`` over ``num_decode``
        sequence-steps (each token also attends to itself)."""
        return (
            num_decode * self.decode_linear_flops_per_token
            + (context_sum + num_decode) * self.attention_flops_per_pair
        )


@dataclass(frozen=True, slots=True)
class _Flat:
    """The context-free parts of a run's coefficients (StepModel._flat), for one run or arrays."""

    c0: Coef  # decode compute, without attention
    attn_s: Coef  # attention per context token
    prefill_s: Coef  # the chunk's prefill compute
    weights_s: Coef
    kv_s: Coef  # KV read per context token
    floor: Coef
    fixed: Coef

    def lines(self, b: Count, context_tokens: Coef, c: Coef) -> tuple[Coef, Coef, Coef, Coef, Coef, Coef]:
        """(c0, c1, m0, m1, floor, fixed) at total context ``context_tokens``."""
        c0 = self.c0 + (self.attn_s * (context_tokens + b) + self.prefill_s)
        m0 = self.weights_s + self.kv_s * (context_tokens + b + c)
        return c0, self.attn_s * b, m0, self.kv_s * b, self.floor, self.fixed


@dataclass(frozen=True, slots=True)
class Run:
    """Step ``i`` of a run costs ``max(c0 + c1·i, m0 + m1·i, floor) + fixed`` seconds
    (compute line, memory line, launch floor or overlapped host time; communication, sampler
    and host time that is not overlapped)."""

    c0: float
    c1: float
    m0: float
    m1: float
    floor: float
    fixed: float

    def step_s(self, i: int) -> float:
        return max(self.c0 + self.c1 * i, self.m0 + self.m1 * i, self.floor) + self.fixed

    def time_s(self, n: int) -> float:
        """Total time of steps ``0..n-1`` in closed form."""
        if n <= 0:
            return 0.0
        c0, c1, m0, m1 = self.c0, self.c1, self.m0, self.m1
        if self.floor > c0 and self.floor > m0:
            return envelope_sum([(c0, c1), (m0, m1), (self.floor, 0.0)], n) + n * self.fixed
        # Fast path (the floor never binds: both lines start above it and do not decrease).
        if c1 == m1:
            return _lin_sum(max(c0, m0), c1, 0, n) + n * self.fixed
        x = (m0 - c0) / (c1 - m1)  # the lines cross at step x
        k = n if x >= n else (0 if x <= 0 else math.ceil(x))  # steps before the crossing
        (a, s), (a2, s2) = ((m0, m1), (c0, c1)) if c1 > m1 else ((c0, c1), (m0, m1))
        return _lin_sum(a, s, 0, k) + _lin_sum(a2, s2, k, n) + n * self.fixed

    def steps_within(self, elapsed_s: float, n_max: int, round_up: bool) -> int:
        """The number of whole steps done after ``elapsed_s`` (``round_up``: the first step
        boundary at or after it), at most ``n_max``. Bisection on the monotone closed form."""
        lo, hi = 0, n_max
        if round_up:  # smallest m with time_s(m) >= elapsed
            while lo < hi:
                mid = (lo + hi) // 2
                if self.time_s(mid) >= elapsed_s:
                    hi = mid
                else:
                    lo = mid + 1
        else:  # largest m with time_s(m) <= elapsed
            while lo < hi:
                mid = (lo + hi + 1) // 2
                if self.time_s(mid) <= elapsed_s:
                    lo = mid
                else:
                    hi = mid - 1
        return lo


@dataclass(frozen=True)
class Runs:
    """Many runs at once (arrays, one entry per run), as :class:`Run`."""

    c0: np.ndarray
    c1: np.ndarray
    m0: np.ndarray
    m1: np.ndarray
    floor: np.ndarray
    fixed: np.ndarray

    def time_s(self, n: np.ndarray) -> np.ndarray:
        """:meth:`Run.time_s` of every run over its ``n[k]`` steps: the same closed form with
        the same operations, branch by branch, elementwise (the launch floor, rare, run by
        run)."""
        c0, c1, m0, m1, fixed = self.c0, self.c1, self.m0, self.m1, self.fixed
        out = np.zeros(n.shape)
        live = n > 0
        floor = live & (self.floor > c0) & (self.floor > m0)
        at = np.flatnonzero(floor)
        if at.size:
            out[at] = _envelope_sums(c0[at], c1[at], m0[at], m1[at], self.floor[at], n[at]) + n[at] * fixed[at]
        same = live & ~floor & (c1 == m1)
        if same.any():  # rare: parallel lines (costed on those runs alone, elementwise)
            ns = n[same]
            out[same] = _lin_sum(np.maximum(c0[same], m0[same]), c1[same], 0, ns) + ns * fixed[same]
        cross = live & ~floor & ~same
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):  # x: only where c1 != m1
            x = (m0 - c0) / (c1 - m1)  # the lines cross at step x
        k = np.where(x >= n, n, np.where(x <= 0, 0, np.ceil(x)))  # steps before the crossing
        up = c1 > m1
        a, s, a2, s2 = np.where(up, m0, c0), np.where(up, m1, c1), np.where(up, c0, m0), np.where(up, c1, m1)
        out[cross] = (_lin_sum(a, s, 0, k) + _lin_sum(a2, s2, k, n) + n * fixed)[cross]
        return out


def _ceil(x: Coef) -> Count:
    if isinstance(x, np.ndarray):
        up: np.ndarray = np.ceil(x).astype(np.int64)
        return up
    return int(math.ceil(x))


@overload
def _lin_sum(a: float, s: float, i0: int, i1: int) -> float: ...


@overload
def _lin_sum(a: np.ndarray, s: np.ndarray, i0: int | np.ndarray, i1: np.ndarray) -> np.ndarray: ...


def _lin_sum(a: Coef, s: Coef, i0: Count, i1: Count) -> Coef:
    """sum_{i=i0}^{i1-1} (a + s·i)."""
    return (i1 - i0) * a + s * 0.5 * (i1 * (i1 - 1) - i0 * (i0 - 1))


def _envelope_sums(c0: np.ndarray, c1: np.ndarray, m0: np.ndarray, m1: np.ndarray, floor: np.ndarray,
                   n: np.ndarray) -> np.ndarray:
    """:func:`envelope_sum` of each run's (compute, memory, floor) lines: compiled
    (:func:`rlperf.stages.rollout_loop.envelope_sums`, the same operations) where the loops are
    compiled, else run by run."""
    from rlperf.stages import rollout_loop
    from rlperf.stages.jit import compiled

    c0, c1, m0, m1, floor = (np.ascontiguousarray(x, np.float64) for x in (c0, c1, m0, m1, floor))
    steps = np.ascontiguousarray(n, np.int64)
    if compiled():
        return rollout_loop.envelope_sums(c0, c1, m0, m1, floor, steps)
    return np.array([envelope_sum([(c0[k], c1[k]), (m0[k], m1[k]), (floor[k], 0.0)], int(steps[k]))  # pragma: no cover
                     for k in range(steps.size)])


def envelope_sum(lines: list[tuple[float, float]], n: int) -> float:
    """sum_{i<n} max_j (a_j + s_j·i) for lines with slopes >= 0, in closed form.

    The upper envelope of lines is convex and piecewise linear: start on the line that is
    highest at ``i``, stay on it until the first integer where a steeper line overtakes it,
    and sum each piece as an arithmetic series. At most ``len(lines)`` pieces."""
    i, total = 0, 0.0
    while i < n:
        a, s = max(lines, key=lambda ln: (ln[0] + ln[1] * i, ln[1]))
        nxt = n
        for a2, s2 in lines:
            if s2 > s and a - a2 < (s2 - s) * n:  # overtakes after x = (a - a2)/(s2 - s) < n
                nxt = min(nxt, max(i + 1, math.floor((a - a2) / (s2 - s)) + 1))
        total += _lin_sum(a, s, i, nxt)
        i = nxt
    return total


# Ops of vLLM 0.8.5's routed-expert block beyond a dense MLP's three (its grouped gate-up,
# activation and down replace them), module docstring: router GEMM, top-k, the align step's
# three kernels (sorted-ids fill, expert-ids zeroing, align), the sum of the k outputs.
# Plain top-k (fused_topk): the logits' fp32 cast and the top-k softmax kernel. DeepSeek's
# grouped top-k (torch.compile'd grouped_topk: 4 fused pointwise/reduction kernels and 3 top-k
# calls), then the routed scaling and the shared output's add.
MOE_EXTRA_OPS = {"topk": 1 + 2 + 3 + 1, "grouped": 1 + 7 + 3 + 1 + 2}
# Ops vLLM 0.8.5's MLA decode path dispatches in eager mode beyond the structural 11 (module
# docstring): the latent's and q_pe's contiguous copies, DeepSeek's YaRN rotary run as PyTorch
# ops (13 for its 1: cos/sin index, two repeat_interleave, 5 per q and k), the two copies back
# into q_pe and k_pe, the cat of q_nope and q_pe, the output's reshape and its copy into place.
MLA_EAGER_EXTRA_OPS = 2 + 12 + 2 + 1 + 2


def structural_ops_per_layer(model: ModelSpec, tp: int, moe_layer: bool) -> int:
    """Ops (kernels and collectives) of one decoder layer of a decode step as a graph replays
    them: the structural count of the module docstring."""
    ops = 10 + (2 if tp > 1 else 0)
    ops += 2 if model.qk_norm else 0
    ops += 6 if model.mla is not None else 0
    moe = model.moe
    if moe_layer and moe is not None:
        ops += MOE_EXTRA_OPS[moe.routing]
        ops += (3 + (1 if moe.shared_expert_gate else 0)) if moe.shared_intermediate_size else 0
    return ops


def eager_ops_per_layer(model: ModelSpec, tp: int, moe_layer: bool) -> int:
    """Ops one decoder layer dispatches in an eager decode step: the structural count plus the
    PyTorch ops of vLLM's MLA decode path, which a graph (torch.compile) fuses."""
    extra = MLA_EAGER_EXTRA_OPS if model.mla is not None else 0
    return structural_ops_per_layer(model, tp, moe_layer) + extra


def step_ops(model: ModelSpec, layout: EngineLayout) -> tuple[int, int]:
    """(eager ops, device kernels) of one decode step of ``layout``: the structural counts of
    vLLM's layers (:func:`eager_ops_per_step`, :func:`kernels_per_step`); under data-parallel
    attention no all-reduces and a dispatch and a combine per MoE layer; with
    ``layout.eager_ops_per_layer`` set (another implementation's layer, e.g. HF ``generate``),
    that count per layer, every op a kernel except the all-reduces."""
    dp = layout.dp_attention
    tp = 1 if dp else layout.tp  # tp > 1 adds the two all-reduces a layer (dp attention: none)
    a2a = 2 * model.num_moe_layers if dp else 0  # dispatch, combine
    all_reduces = 2 * model.num_layers if tp > 1 else 0
    copies = qkv_copy_ops_per_layer(model, layout) * model.num_layers
    if layout.eager_ops_per_layer is not None:
        ops = layout.eager_ops_per_layer * model.num_layers + all_reduces
        return ops + a2a + copies, ops - all_reduces + copies
    quant = EngineQuant.of(layout)  # vLLM's activation quantization before each quantized GEMM
    moe_layers = model.num_moe_layers
    quants = ((model.num_layers - moe_layers) * quant.kernels_per_layer(model, False)
              + moe_layers * quant.kernels_per_layer(model, True))
    return (eager_ops_per_step(model, tp) + a2a + copies + quants,
            kernels_per_step(model, tp) + copies + quants)


def qkv_copy_ops_per_layer(model: ModelSpec, layout: EngineLayout) -> int:
    """Copies a layer's forward makes into the fused QKV buffer (module docstring): q, k and v,
    and their biases where the model has them; 0 unless ``layout.qkv_copy_per_forward``."""
    if not layout.qkv_copy_per_forward:
        return 0
    return 3 * (2 if model.qkv_bias else 1)


def qkv_copy_bytes_per_gpu(model: ModelSpec, layout: EngineLayout) -> float:
    """HBM bytes one GPU reads and writes per forward refilling the fused QKV buffer of every
    layer (module docstring; 0 unless ``layout.qkv_copy_per_forward``): the rank's q heads and KV
    heads (:func:`kv_heads_per_device`), each row of ``d`` weights and a bias."""
    if not layout.qkv_copy_per_forward:
        return 0.0
    rows = (model.num_heads / layout.tp + 2 * kv_heads_per_device(model, layout.tp)) * model.head_dim
    per_row = model.hidden_size + (1 if model.qkv_bias else 0)
    return 2.0 * rows * per_row * model.num_layers * bytes_per(layout.dtype)


def eager_ops_per_step(model: ModelSpec, tp: int) -> int:
    """Ops of all decoder layers of one eager decode step."""
    moe_layers = model.num_moe_layers
    dense_layers = model.num_layers - moe_layers
    return (dense_layers * eager_ops_per_layer(model, tp, False)
            + moe_layers * eager_ops_per_layer(model, tp, True))


def kernels_per_step(model: ModelSpec, tp: int) -> int:
    """Device kernels of all decoder layers of one decode step as a graph replays them: the
    structural ops less the two all-reduces a layer makes at tp > 1 (costed as communication)."""
    moe_layers = model.num_moe_layers
    ops = ((model.num_layers - moe_layers) * structural_ops_per_layer(model, tp, False)
           + moe_layers * structural_ops_per_layer(model, tp, True))
    return ops - (2 * model.num_layers if tp > 1 else 0)


def _expert_params(model: ModelSpec) -> tuple[float, float]:
    """(params of one routed expert summed over MoE layers, routed-expert params a token uses)."""
    moe = model.moe
    if moe is None or model.num_moe_layers == 0:
        return 0.0, 0.0
    per_layer_expert = model.breakdown.experts / (model.num_moe_layers * moe.num_experts)
    one = per_layer_expert * model.num_moe_layers
    return one, one * moe.experts_per_token
