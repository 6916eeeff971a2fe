"""One decode step of a rollout engine, term by term, each with where its figure comes from.

The step model (:mod:`rlperf.stages.rollout_step`) times a step as

    device = max(compute, memory, launch floor) + communication + sampler
    step   = device + host, or max(device, host) under the engine's overlap scheduling
    host   = engine_step_overhead_s + engine_seq_overhead_s · b

This module splits one step of ``b`` decoding sequences with ``C`` context tokens in total
(no prefill in the step) into those terms, each named with its source: a hardware figure
(data/hardware.yaml), a profile field with its provenance (data/profiles.yaml), a structural
count, or "unset" where no figure is published. The terms inside the max are reported as they
are; ``bound`` says which side of the max sets the step.

    compute = b · 2·(matmul weights) / (tp · peak · matmul_eff) + (C + b) · attention FLOPs per pair / (tp · peak · attention_eff)
    memory  = (dense weights + experts read · (one expert + s_half)) / (HBM · decode_hbm_efficiency)
              + (C + b) · KV per token / (HBM · decode_kv_hbm_efficiency)   (paged KV cache; a static
              batch's contiguous cache at decode_hbm_efficiency)

``rlperf simulate`` prints it for a representative step of the scenario's rollout.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from rlperf.cost.collectives import all_reduce, group_for, p2p
from rlperf.specs.hardware import Cluster
from rlperf.specs.model import ModelSpec
from rlperf.specs.parallel import EngineLayout
from rlperf.stages.rollout_quant import EngineQuant
from rlperf.stages.rollout_step import SAMPLER_PASSES, StepModel, qkv_copy_ops_per_layer, step_ops

if TYPE_CHECKING:
    from rlperf.scenario import Scenario


@dataclass(frozen=True)
class StepTerm:
    name: str
    time_s: float
    side: str  # "compute", "memory", "floor" (inside the max), "added", or "overlapped" (host time
    # in a max with the whole device step)
    source: str


@dataclass(frozen=True)
class StepBreakdown:
    num_decode: int
    context_tokens: float
    experts_read: float  # per MoE layer, on the busiest GPU (0 for a dense model)
    terms: tuple[StepTerm, ...]

    def side_s(self, side: str) -> float:
        return sum(t.time_s for t in self.terms if t.side == side)

    @property
    def device_s(self) -> float:
        return max(self.side_s("compute"), self.side_s("memory"), self.side_s("floor")) + self.side_s("added")

    @property
    def bound(self) -> str:
        """Which side of the max sets the step ("host" when overlapped host time exceeds the device's)."""
        if self.side_s("overlapped") > self.device_s:
            return "host"
        return max(("compute", "memory", "floor"), key=self.side_s)

    @property
    def step_s(self) -> float:
        return max(self.device_s, self.side_s("overlapped"))


def _prov(cluster: Cluster, field: str) -> str:
    got = cluster.profile.provenance.get(field)
    return f"profiles.yaml {field} = {getattr(cluster.profile, field)} ({got})" if got else f"profiles.yaml {field} = {getattr(cluster.profile, field)}"


def decode_step_breakdown(
    model: ModelSpec, cluster: Cluster, layout: EngineLayout, num_decode: int, context_tokens: float,
) -> StepBreakdown:
    """The terms of one decode step of ``num_decode`` sequences with ``context_tokens`` in total."""
    cuda_graphs = layout.cuda_graphs
    step = StepModel.build(model, cluster, layout, cuda_graphs)
    b, ctx = num_decode, context_tokens
    mb = int(step.num_microbatches(b))
    acc = cluster.accelerator
    hbm_src = f"{acc.id} HBM {acc.hbm_bandwidth_bytes_per_s / 1e12:.2f} TB/s (hardware.yaml) x {_prov(cluster, 'decode_hbm_efficiency')}"
    quant = EngineQuant.of(layout)
    peak_src = f"{acc.id} {quant.weight_dtype} peak {acc.peak(quant.weight_dtype) / 1e12:.0f} TFLOP/s (hardware.yaml)"
    act_src = f"{acc.id} {quant.act_dtype} peak {acc.peak(quant.act_dtype) / 1e12:.0f} TFLOP/s (hardware.yaml)"
    lm_extra = b * step.lm_head_flops * step.lm_head_extra_s_per_flop / mb
    terms = [
        StepTerm("linear GEMMs", b * step.decode_linear_flops_per_token / step.matmul_flops_per_s / mb + lm_extra, "compute",
                 f"{peak_src} x matmul_eff({quant.weight_dtype}) {cluster.profile.matmul_eff(quant.weight_dtype)}"
                 + (f"; the LM head at {act_src} x matmul_eff({quant.act_dtype}) (vLLM quantizes no LM head)"
                    if lm_extra else "")),
        StepTerm("attention", (ctx + b) * step.attention_flops_per_pair / step.attention_flops_per_s / mb, "compute",
                 f"{act_src} x {_prov(cluster, 'attention_efficiency')}"),
        StepTerm("dense weights read", step.dense_weight_bytes_per_gpu / step.hbm_bytes_per_s, "memory", hbm_src),
    ]
    if step.weight_copy_s:
        terms.append(StepTerm(
            "q, k, v weights copied into the fused buffer", step.weight_copy_s, "memory",
            f"EngineLayout.qkv_copy_per_forward: every layer's forward refills one fused QKV buffer "
            f"(DeepSpeed v0.9.0 DeepSpeedSelfAttention._merge_qkv under ZeRO-3), read + write at "
            f"{acc.id} HBM {acc.hbm_bandwidth_bytes_per_s / 1e12:.2f} TB/s x {_prov(cluster, 'hbm_efficiency')}"))
    read = 0.0
    if step.num_experts:
        tokens = -(-b // mb)
        read = step.experts_read(tokens)
        where = ("tp-sharded: 1/tp of every touched expert" if step.expert_ranks == 1 else
                 f"ep: busiest of {step.expert_ranks} ranks, mean + sd*sqrt(2 ln r) of Binomial(E/r, q), "
                 f"x moe_routing_imbalance {step.routing_imbalance:g}"
                 + ("" if cluster.profile.moe_routing_imbalance is not None else " (unset: no published figure)"))
        layers = model.num_moe_layers
        slice_bytes = step.expert_bytes_per_gpu / layers
        half = step.expert_extra_bytes_per_gpu / layers
        terms.append(StepTerm(
            f"MoE experts read ({read:.1f} of {step.num_experts} per layer, {slice_bytes / 1e6:.2f} MB each)",
            read * step.expert_bytes_per_gpu / step.hbm_bytes_per_s, "memory",
            f"distinct experts of {tokens} tokens x top-{step.experts_per_token}: E(1-(1-k/E)^n), uniform routing; {where}; {hbm_src}",
        ))
        if half:
            eff = slice_bytes / (slice_bytes + half)
            terms.append(StepTerm(
                f"MoE grouped-GEMM size penalty (slices at {eff:.0%} of the dense rate)",
                read * step.expert_extra_bytes_per_gpu / step.hbm_bytes_per_s, "memory",
                f"s / (s + s_half), s = {slice_bytes / 1e6:.2f} MB per expert, layer and GPU; "
                f"{_prov(cluster, 'moe_expert_read_half_bytes')}",
            ))
    kv_src = (f"{acc.id} HBM {acc.hbm_bandwidth_bytes_per_s / 1e12:.2f} TB/s (hardware.yaml) x "
              f"{_prov(cluster, 'decode_kv_hbm_efficiency')} (paged decode attention)"
              if layout.batching == "continuous" else f"{hbm_src} (contiguous cache of a static batch)")
    terms.append(StepTerm("KV cache read", (ctx + b) * step.kv_bytes_per_token_per_gpu / step.kv_hbm_bytes_per_s / mb,
                          "memory", kv_src))
    ops, kernels = step_ops(model, layout)
    count = (f"{model.num_layers} layers x {layout.eager_ops_per_layer} ops (EngineLayout.eager_ops_per_layer)"
             if layout.eager_ops_per_layer is not None else
             f"{model.num_layers} layers, structural count: rollout_step.eager_ops_per_layer"
             + (f"; routed-expert layers as vLLM 0.8.5's fused-MoE path runs them ({model.moe.routing} routing)"
                if model.moe is not None else "")
             + ("; MLA's decode path with its eager PyTorch ops (vLLM 0.8.5)" if model.mla is not None and not cuda_graphs
                else "")
             + (f"; + {qkv_copy_ops_per_layer(model, layout)} fused-QKV buffer copies a layer"
                if layout.qkv_copy_per_forward else ""))
    terms.append(StepTerm(
        f"kernel floor ({'CUDA graphs' if cuda_graphs else 'eager'})", step.floor_s, "floor",
        f"max({_prov(cluster, 'graph_kernel_launch_s')}, {_prov(cluster, 'decode_kernel_min_s')}) x {kernels} kernels ({count})"
        if cuda_graphs else
        f"max({_prov(cluster, 'eager_op_launch_s')} x {ops} ops, decode_kernel_min_s x {kernels} kernels) ({count})"))
    act = b * model.hidden_size * quant.act_bytes / mb
    if layout.dp_attention:
        group = group_for(cluster, layout.tp)
        step_tokens = np.array([float(b)])
        dispatch = float(step.all_to_all_each(step_tokens, step.dispatch_bytes_per_elem)[0])
        a2a = (dispatch + float(step.all_to_all_each(step_tokens)[0])) / 2  # the mean of a dispatch and a combine
        where = "in a node" if group.num_nodes == 1 else f"across {group.num_nodes} nodes"
        sent = -(-b // layout.tp) * step.experts_per_token * model.hidden_size * quant.act_bytes
        terms.append(StepTerm(
            f"expert dispatch + combine x {model.num_moe_layers} ({sent / 1e3:.0f} KB per GPU each"
            f"{f', the dispatch in {quant.weight_dtype}' if step.dispatch_bytes_per_elem != quant.act_bytes else ''}, {where}; dp attention)",
            2 * model.num_moe_layers * a2a, "added",
            "DeepEP-style all-to-all: the cross-node share at NIC x "
            f"{_prov(cluster, 'moe_a2a_nic_efficiency')}, the node share over NVLink; + one "
            f"{_prov(cluster, 'inter_node_latency_s' if group.num_nodes > 1 else 'intra_node_latency_s')}",
        ))
    elif layout.tp > 1:
        group = group_for(cluster, layout.tp)
        ar = all_reduce(cluster, act, group)
        where = "in a node" if group.num_nodes == 1 else f"across {group.num_nodes} nodes"
        lat = "intra_node_latency_s" if group.num_nodes == 1 else "inter_node_latency_s"
        moe_note = " (MoE layers: the expert output's all-reduce, vLLM EP with TP attention)" if step.num_experts else ""
        terms.append(StepTerm(
            f"tp all-reduce x {2 * model.num_layers} ({act / 1e3:.0f} KB each, {where}){moe_note}",
            2 * model.num_layers * ar.time_s, "added",
            f"alpha-beta all-reduce (rlperf.cost.collectives, {ar.algorithm}); {_prov(cluster, lat)}",
        ))
        terms.append(StepTerm(
            f"logits all-gather ({b} x {model.vocab_size:,} fp32)", step.logits_gather_s(b), "added",
            f"alpha-beta all-gather over tp; {_prov(cluster, lat)}",
        ))
    if layout.pp > 1:
        same = layout.tp * layout.pp <= cluster.gpus_per_node
        terms.append(StepTerm(f"pp hand-offs x {layout.pp - 1}", (layout.pp - 1) * p2p(cluster, act, same).time_s, "added",
                              _prov(cluster, "intra_node_latency_s" if same else "inter_node_latency_s")))
    if step.act_quant_s_per_token:
        terms.append(StepTerm(
            f"{quant.weight_dtype} activation quantization ({b} tokens)", b * step.act_quant_s_per_token / mb, "added",
            f"per-token-group quantization before every {quant.weight_dtype} GEMM (vLLM 0.10 "
            f"apply_w8a8_block_fp8_linear, fused_experts): bf16 read, {quant.weight_dtype} write, scales; "
            f"{acc.id} HBM x {_prov(cluster, 'hbm_efficiency')}"))
    terms.append(StepTerm("sampler over the vocabulary", b * step.sampler_s_per_seq, "added",
                          f"{SAMPLER_PASSES} fp32 passes over b x V logits (structural count); {hbm_src}"))
    # The engine's host time: added to the device step, or overlapped with it (the larger wins).
    side = "overlapped" if step.overlap else "added"
    how = ("overlap scheduling: the step takes max(device, host)" if step.overlap else
           "no overlap scheduling: added between steps")
    fixed = cluster.profile.engine_step_overhead_s
    terms.append(StepTerm(
        "engine host, fixed per step", step.overhead_s, side,
        (_prov(cluster, "engine_step_overhead_s") if fixed is not None else
         "engine_step_overhead_s unset: no published per-step figure (rlperf validate --calibrate fits one)") + f"; {how}",
    ))
    terms.append(StepTerm(
        f"engine host, per sequence (x {b}{f', over {layout.tp} dp-rank schedulers' if layout.dp_attention else ''})",
        b * step.host_s_per_seq, side,
        f"{_prov(cluster, 'engine_seq_overhead_s')}; {how}",
    ))
    return StepBreakdown(b, ctx, read, tuple(terms))


def representative_step(sc: Scenario) -> StepBreakdown:
    """A decode step of the scenario's rollout when each replica is full: ``b`` = its share of
    the step's responses (at most ``max_num_seqs`` and what its KV cache holds), each halfway
    through a mean response."""
    from rlperf.stages.rollout import kv_capacity_tokens

    plan, wl = sc.plan, sc.workload
    pools, assign = plan.placement.resolve(sc.cluster.num_gpus)
    gpus = {p.name: p.num_gpus for p in pools}[assign["generate"]]
    eng = plan.rollout
    replicas = max(1, gpus // eng.gpus_per_replica)
    per_seq = wl.prompt_length.mean_tokens() + 0.5 * wl.response_length.mean_tokens()
    cluster = sc.cluster.with_gpus(replicas * eng.gpus_per_replica)
    layout = eng.model_copy(update={"replicas": replicas})
    # as many as the KV cache holds at that context (the engine preempts beyond it)
    fits = int(kv_capacity_tokens(sc.models["actor"], cluster, layout) // per_seq)
    b = max(1, min(eng.max_num_seqs, -(-wl.num_responses // replicas), fits))
    return decode_step_breakdown(sc.models["actor"], cluster, layout, b, b * per_seq)
