"""Training step: ``epochs x num_minibatches`` optimizer steps over a batch (PPO/GRPO update).

Each optimizer step (one mini-batch) runs, on every dp rank, the forward and backward of its
micro-batches through the pipeline (:mod:`rlperf.stages.pipeline`: 1F1B/GPipe bubble
``(p-1)/(m+p-1)``, interleaved ``(p-1)/(v m+p-1)`` for uniform micro-batches), each micro-batch
with its tp/cp/ep/pp communication and ZeRO-3 gathers (:mod:`rlperf.stages.pass_cost`), padded
to its longest sequence without ``layout.packing``. The most loaded dp rank sets the step. Then:

- **gradient reduction** over the data-parallel groups (dense weights over ``dp x cp``, experts
  over ``dp x cp / ep``): ZeRO-3, and ZeRO-2 under the FSDP / DeepSpeed backend, reduce-scatter
  after every micro-batch's backward (FSDP without ``no_sync``; DeepSpeed from stage 2; counted
  per micro-batch, :attr:`rlperf.stages.pass_cost.LayoutCosts.reduces_every_microbatch`);
  ZeRO-1 (and Megatron's distributed optimizer) reduce-scatter and ZeRO-0 all-reduces once per
  step, after the last micro-batch (Megatron DDP / distributed optimizer). With
  ``overlap_grad_comm`` the reduction hides behind that backward except its last bucket (one
  layer's gradients) and whatever of the rest outlasts the backward; without it, all of it is
  exposed.
- **parameter all-gather** after the update under ZeRO-1/2 (the distributed optimizer's
  ``param_dtype`` gather; not overlapped).
- **optimizer step**: fused AdamW on the device's resident shard (:func:`rlperf.cost.roofline.
  adam_step`, memory bound); with ``offload_optimizer``, CPU Adam on the host at
  :func:`rlperf.cost.roofline.cpu_adam_params_per_s` (the GPU's share of the host's DRAM
  bandwidth over the update's bytes per parameter, at most what the rank's
  ``cpu_optimizer_threads`` update; or a given rate) plus the PCIe upload of the
  updated weights (the gradients' download is counted with the reduction).

Per-rank communication volume of the data-parallel traffic (``Psi`` stage parameters,
``N = dp x cp``, one micro-batch): ZeRO-3 sends ``(N-1)/N Psi b_bf16`` for each of the two
weight all-gathers (forward, backward; FSDP casts to the compute dtype before gathering) and
``(N-1)/N Psi b_grad`` for the gradient reduce-scatter; ZeRO-1/2 send ``(N-1)/N Psi (b_grad + b_param)`` per step (reduce-scatter +
all-gather, i.e. ``2 (N-1)/N Psi b`` with equal dtypes, as plain data parallelism's all-reduce);
ZeRO-0 sends ``2 (N-1)/N Psi b_grad`` (Rajbhandari et al. 2020, "ZeRO", §7).

Training kernels are costed one by one (:mod:`rlperf.stages.pass_cost`): each GEMM at the
profile's large-GEMM rate times its size factor, attention as the layout's kernel (flash or
unfused), memory-bound kernels at HBM bandwidth, plus the backend's host overhead per layer and
micro-batch pass. No end-to-end MFU caps them: ``train_mfu_cap`` is a whole-step figure, and
capping every GEMM with it and then adding the bubble, communication, memory-bound work and
launches counted those twice.

Work and depth: ``work_s`` is the device-seconds of every kernel at its roofline (forward,
backward, recompute, optimizer; no launches, communication, bubbles or host work); ``depth_s``
is ``epochs x num_minibatches`` sequential steps, each the longest sequence's forward +
backward through all layers (at the layout's tp x cp split, with launches, as in
:mod:`rlperf.stages.forward`) plus the optimizer step.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from rlperf.cost.memory import check_fits, train_memory
from rlperf.cost.roofline import adam_step
from rlperf.cost.roofline import cpu_adam_params_per_s as host_adam_rate
from rlperf.errors import SpecError
from rlperf.specs.dtypes import bytes_per
from rlperf.specs.hardware import Cluster
from rlperf.specs.model import ModelSpec
from rlperf.specs.parallel import TrainLayout, check_train_layout
from rlperf.stages.base import StageCost
from rlperf.stages.forward import longest_alone_s
from rlperf.stages.microbatch import MicroBatches, as_lengths, microbatches_for, split_minibatches
from rlperf.stages.pass_cost import LayoutCosts, MicroBatchShapes, PassCost, Tally, components
from rlperf.stages.pipeline import pipeline_times
from rlperf.stages.shard import Head, StageShard


@dataclass(frozen=True)
class StepCost:
    """One optimizer step: its time on the straggler, the parts of that time, and its totals."""

    time_s: float
    busy: dict[str, float]
    bubble_s: float
    depth_s: float
    tally: Tally


def train_step(
    model: ModelSpec,
    cluster: Cluster,
    layout: TrainLayout,
    seq_tokens: np.ndarray | Sequence[int],
    num_minibatches: int = 1,
    epochs: int = 1,
    name: str = "actor_update",
    *,
    head: Head = "logprobs",
    cpu_adam_params_per_s: float | None = None,
) -> StageCost:
    """Cost of updating ``model`` on a batch: ``epochs`` passes of ``num_minibatches`` steps.

    Args:
        model: the trained model (actor, or critic with ``head="value"``).
        cluster: the GPUs (``layout.world_size`` of them are used).
        layout: the training layout (ZeRO stage, tp/pp/cp/ep, recompute, micro-batching).
        seq_tokens: prompt + response tokens of every sequence in the batch.
        num_minibatches: optimizer steps per epoch (batch / mini-batch size).
        epochs: passes over the batch (PPO epochs).
        name: the stage's name in the result.
        head: ``"logprobs"`` (LM head + log-softmax) or ``"value"`` (critic).
        cpu_adam_params_per_s: host CPU Adam rate per GPU's shard (parameters/s) with
            ``offload_optimizer``; None derives it from the profile's host figures
            (:func:`rlperf.cost.roofline.cpu_adam_params_per_s`).

    Raises:
        SpecError: the layout does not fit the model, the cluster or device memory.
    """
    check_train_layout(model, layout)
    if epochs < 1:
        raise SpecError("epochs", f"must be >= 1, got {epochs}")
    if cpu_adam_params_per_s is not None and not cpu_adam_params_per_s > 0:
        raise SpecError("cpu_adam_params_per_s", f"must be > 0 parameters/s, got {cpu_adam_params_per_s!r}")
    if layout.offload_optimizer and cpu_adam_params_per_s is None:
        cpu_adam_params_per_s = cpu_adam_params_per_s_for(cluster, layout)
    seqs = as_lengths(seq_tokens)
    minis = split_minibatches(seqs, num_minibatches)
    costs = LayoutCosts.of(model, cluster, layout, head)
    plans = [microbatches_for(mini, layout) for mini in minis]
    mem = train_memory(
        model, layout, max(p.max_microbatch_tokens(not layout.packing) for p in plans), seq_len=int(seqs.max()),
        num_microbatches=max(p.max_microbatches() for p in plans), value_head=head == "value",
    )
    check_fits(mem, cluster.accelerator.device_memory_bytes, name)

    shapes = [MicroBatchShapes.of(p, padded=not layout.packing) for p in plans]
    steps = [_step(costs, plan, stages, part, cpu_adam_params_per_s)
             for plan, (stages, part) in zip(plans, _passes(costs, shapes))]
    busy: dict[str, float] = {}
    tally = Tally()
    for st in steps:
        for k, v in st.busy.items():
            busy[k] = busy.get(k, 0.0) + epochs * v
        tally.flops += epochs * st.tally.flops
        tally.hbm_bytes += epochs * st.tally.hbm_bytes
        tally.comm_bytes += epochs * st.tally.comm_bytes
        tally.work_s += epochs * st.tally.work_s
    return StageCost(
        name=name,
        time_s=epochs * sum(s.time_s for s in steps),
        num_gpus=layout.world_size,
        work_s=tally.work_s,
        depth_s=epochs * sum(s.depth_s for s in steps),
        flops=tally.flops,
        hbm_bytes=tally.hbm_bytes,
        comm_bytes=tally.comm_bytes,
        peak_memory_bytes=mem.total_bytes,
        breakdown=components(busy, epochs * sum(s.bubble_s for s in steps)),
    )


def cpu_adam_params_per_s_for(cluster: Cluster, layout: TrainLayout) -> float:
    """The profile's CPU Adam rate for ``layout``'s dtypes (fp32 master weights and states) on
    its ``cpu_optimizer_threads``."""
    return host_adam_rate(cluster, "fp32", layout.grad_dtype, layout.param_dtype, layout.cpu_optimizer_threads)


@dataclass(frozen=True)
class _StagePasses:
    """Forward and backward of micro-batches on one device of a pipeline stage, with their
    ZeRO gathers and per-micro-batch gradient reduction (arrays, one entry per micro-batch)."""

    fwd: PassCost
    bwd: PassCost
    gather_sent: tuple[float, float]  # bytes per micro-batch of the forward's and the backward's gathers
    reduce_sent: float  # bytes per micro-batch of the per-micro-batch reduce-scatter (0: none)
    time_s: np.ndarray  # all of it, per micro-batch
    parts: dict[str, np.ndarray]  # the parts of time_s (what the breakdown shows)


def _passes(costs: LayoutCosts, shapes: list[MicroBatchShapes]) -> list[tuple[list[_StagePasses], slice]]:
    """Per mini-batch (``shapes``: each one's micro-batches): its passes through every stage and
    its slice of them. Every figure of a micro-batch is its own formula (elementwise over the
    micro-batches), so the mini-batches are costed in one numpy pass over all their micro-batches
    one after the other, each then reading its slice: a step of many mini-batches pays the
    per-pass overhead once. (A mini-batch of one micro-batch is costed alone: numpy sums a
    one-column table over its rows in another order than a wider one.)"""
    if len(shapes) > 1 and all(sh.tokens.size > 1 for sh in shapes):
        stages = _stage_passes(costs, MicroBatchShapes.joined(shapes))
        ends = np.cumsum([sh.tokens.size for sh in shapes]).tolist()
        return [(stages, slice(a, b)) for a, b in zip([0, *ends[:-1]], ends)]
    costs.prime(shapes)
    return [(_stage_passes(costs, sh), slice(None)) for sh in shapes]


def _stage_passes(costs: LayoutCosts, shapes: MicroBatchShapes) -> list[_StagePasses]:
    """:class:`_StagePasses` of every stage of ``costs`` for the micro-batches ``shapes``."""
    out = []
    for shard in costs.shards:
        fwd = costs.forward(shard, shapes)
        bwd = costs.backward(shard, shapes, fwd)
        gather_f = costs.weight_gather(shard, fwd.compute_s)
        gather_b = costs.weight_gather(shard, bwd.compute_s, backward=True)
        if costs.reduces_every_microbatch:
            rs = costs.grad_reduce(shard, bwd.compute_s, "reduce_scatter")
            rs_exposed, rs_sent = rs.exposed_s, rs.bytes_sent
        else:
            rs_exposed, rs_sent = np.zeros(shapes.tokens.size), 0.0
        parts = {
            "compute": fwd.compute_s + bwd.compute_s, "tp_comm": fwd.tp_s + bwd.tp_s,
            "cp_comm": fwd.cp_s + bwd.cp_s, "ep_comm": fwd.ep_s + bwd.ep_s, "pp_comm": fwd.pp_s + bwd.pp_s,
            "zero_gather": gather_f.exposed_s + gather_b.exposed_s, "grad_comm": rs_exposed,
            "host": fwd.host_exposed_s + bwd.host_exposed_s,
        }
        time = fwd.time_s + bwd.time_s + gather_f.exposed_s + gather_b.exposed_s + rs_exposed
        out.append(_StagePasses(fwd, bwd, (gather_f.bytes_sent, gather_b.bytes_sent), rs_sent, time, parts))
    return out


def _step(costs: LayoutCosts, plan: MicroBatches, stages: list[_StagePasses], part: slice,
          cpu_adam_params_per_s: float | None) -> StepCost:
    """One optimizer step on the mini-batch ``plan`` (its micro-batches: ``part`` of the arrays
    of ``stages``; its longest sequence alone sets the depth)."""
    lay = costs.layout
    devices = lay.tp * lay.cp
    tally = Tally()
    total, busy, bubble, last_bwd = _pipeline(costs, plan, stages, part, tally, devices)

    # Once per step: gradient reduction (ZeRO 0-1, Megatron's ZeRO-2), parameter gather (ZeRO
    # 1-2), optimizer.
    sync = gather = opt = 0.0
    for s, shard in enumerate(costs.shards):
        if not costs.reduces_every_microbatch:
            red = costs.grad_reduce(shard, last_bwd[s], "all_reduce" if lay.zero_stage == 0 else "reduce_scatter")
            sync = max(sync, float(red.exposed_s))
            tally.comm_bytes += red.bytes_sent * devices * lay.dp
        if lay.zero_stage in (1, 2):
            pg = costs.param_gather(shard)
            gather = max(gather, float(pg.exposed_s))
            tally.comm_bytes += pg.bytes_sent * devices * lay.dp
        opt_s, opt_work = _optimizer(costs, shard, cpu_adam_params_per_s)
        opt = max(opt, opt_s)
        tally.work_s += opt_work * devices * lay.dp
    busy["grad_comm"] = busy.get("grad_comm", 0.0) + sync
    busy["param_gather"] = gather
    busy["optimizer"] = opt

    depth = longest_alone_s(costs, plan.longest_sequence(), backward=True)
    return StepCost(total + sync + gather + opt, busy, bubble, depth + opt, tally)


def _pipeline(
    costs: LayoutCosts, plan: MicroBatches, stages: list[_StagePasses], part: slice, tally: Tally, devices: int
) -> tuple[float, dict[str, float], float, list[float]]:
    """Forward + backward of every dp rank's micro-batches (``part`` of ``stages``, of ``plan``)
    through the pipeline, all ranks at once: the straggler's (time, parts of its busiest stage,
    bubble, each stage's last backward compute time); the work of all ranks goes to ``tally``."""
    lay = costs.layout
    for st in stages:
        tally.add(st.fwd, devices, st.gather_sent[0], part)
        tally.add(st.bwd, devices, st.gather_sent[1] + st.reduce_sent, part)
    times = np.stack([st.time_s[part] for st in stages])
    pipe = pipeline_times(times, plan.rank_of, plan.num_ranks, lay.pp_schedule, lay.virtual_stages)
    # The most loaded rank sets the step (the first of equals).
    r = int(np.argmax(pipe.total_s))
    mine = np.flatnonzero(plan.rank_of == r)
    if mine.size == 0:
        return 0.0, {}, 0.0, [0.0] * lay.pp
    busy = {k: sum(v[part][mine].tolist()) for k, v in stages[int(pipe.busiest_stage[r])].parts.items()}
    last_bwd = [float(st.bwd.compute_s[part][mine[-1]]) for st in stages]
    return float(pipe.total_s[r]), busy, float(pipe.bubble_s[r]), last_bwd


def _optimizer(costs: LayoutCosts, shard: StageShard, cpu_adam_params_per_s: float | None) -> tuple[float, float]:
    """(time, device work) of the optimizer step on one device of ``shard``'s stage."""
    lay, cl = costs.layout, costs.cluster
    local = costs.trained_params(shard)
    if lay.offload_optimizer:
        assert cpu_adam_params_per_s
        upload = local * bytes_per(lay.param_dtype) / cl.accelerator.pcie_bandwidth_bytes_per_s
        return local / cpu_adam_params_per_s + upload, 0.0
    op = adam_step(cl, local, "fp32", lay.grad_dtype, lay.param_dtype)
    return op.time_s, max(op.time_s - cl.profile.kernel_launch_s, 0.0)
