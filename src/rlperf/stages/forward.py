"""Forward-only pass over a batch: reference / old-policy log-probs, critic values, reward scores.

A teacher-forced forward over every token of every sequence (prompt + response), prefill-like
and compute bound, on a training-engine layout (FSDP / Megatron). The batch is balanced over the
dp ranks and cut into micro-batches (:mod:`rlperf.stages.microbatch`); each micro-batch runs
through the pipeline stages (forward-only fill and drain, :mod:`rlperf.stages.pipeline`) with
the per-micro-batch compute and communication of :mod:`rlperf.stages.pass_cost`. The most
loaded dp rank sets the time. Without ``layout.packing`` every sequence of a micro-batch is
computed at the micro-batch's longest length (padding).

Its kernels are costed one by one as the training step's forward (:mod:`rlperf.stages.
pass_cost`): each GEMM at the profile's large-GEMM rate times its size factor, attention as the
layout's kernel, memory-bound kernels at HBM bandwidth, the launches, and the training backend's
host time per layer (the same engine runs these passes). No end-to-end MFU caps the GEMMs:
``forward_mfu_cap`` / ``train_mfu_cap`` are whole-pass figures that already contain the
memory-bound work, launches and host time counted here, so capping with them counted those
twice.

Work and depth (:mod:`rlperf.stages.base`):

- ``work_s``: device-seconds of every kernel at its roofline (per-op max of compute and memory
  time, summed over all devices that run it): no launches, no communication, no bubbles.
- ``depth_s``: the longest sequence alone through all layers, each device of a stage doing its
  ``1/(tp x cp)`` share at the roofline plus its kernel launches. The sequence's tokens are
  independent in a teacher-forced pass, so more tp/cp could cut this further, down to the
  launch floor (kernels per layer x ``kernel_launch_s`` x layers); the layout's tp x cp is
  taken as the intra-op split so that ``time_s >= depth_s`` holds for the layout's own time.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from rlperf.memo import BoundedMemo
from rlperf.cost.memory import check_fits, forward_memory
from rlperf.specs.hardware import Cluster
from rlperf.specs.model import ModelSpec
from rlperf.specs.parallel import TrainLayout, check_train_layout
from rlperf.stages.base import StageCost
from rlperf.stages.microbatch import as_lengths, microbatches_for
from rlperf.stages.pass_cost import LayoutCosts, MicroBatchShapes, Tally, components
from rlperf.stages.pipeline import pipeline_times
from rlperf.stages.shard import Head


def forward_pass(
    model: ModelSpec,
    cluster: Cluster,
    layout: TrainLayout,
    seq_tokens: np.ndarray | Sequence[int],
    name: str = "ref_logprob",
    *,
    head: Head = "logprobs",
) -> StageCost:
    """Cost of one forward-only pass over sequences of ``seq_tokens`` tokens each.

    Args:
        model: the model run (reference policy, old policy, critic, reward model).
        cluster: the GPUs it runs on (``layout.world_size`` of them are used).
        layout: its layout; ``forward_micro_batch_size`` / ``forward_max_tokens_per_microbatch``
            (else ``micro_batch_size`` / ``max_tokens_per_microbatch``) set the micro-batches.
        seq_tokens: prompt + response tokens of every sequence in the batch.
        name: the stage's name in the result.
        head: ``"logprobs"`` (LM head + log-softmax over the vocabulary) or ``"value"`` (a
            scalar head: critic values, reward scores).

    Raises:
        SpecError: the layout does not fit the model or the cluster, or a micro-batch does not
            fit in device memory.
    """
    check_train_layout(model, layout)
    layout = layout.for_forward_passes()  # its own micro-batch size / token budget, if set
    seqs = as_lengths(seq_tokens)
    costs = LayoutCosts.of(model, cluster, layout, head)
    plan = microbatches_for(seqs, layout)
    padded = not layout.packing
    mem = forward_memory(model, layout, plan.max_microbatch_tokens(padded), seq_len=int(seqs.max()),
                         value_head=head == "value")
    check_fits(mem, cluster.accelerator.device_memory_bytes, name)

    devices = layout.tp * layout.cp
    shapes = MicroBatchShapes.of(plan, padded)
    costs.prime([shapes])
    tally = Tally()
    times = np.zeros((layout.pp, shapes.tokens.size))
    parts: list[dict[str, np.ndarray]] = []  # per stage: each component, per micro-batch
    for s, shard in enumerate(costs.shards):
        fwd = costs.forward(shard, shapes)
        gather = costs.weight_gather(shard, fwd.compute_s)
        tally.add(fwd, devices, gather.bytes_sent)
        times[s] = fwd.time_s + gather.exposed_s
        parts.append({
            "compute": fwd.compute_s, "tp_comm": fwd.tp_s, "cp_comm": fwd.cp_s, "ep_comm": fwd.ep_s,
            "pp_comm": fwd.pp_s, "zero_gather": gather.exposed_s, "host": fwd.host_exposed_s,
        })
    pipe = pipeline_times(times, plan.rank_of, plan.num_ranks, layout.pp_schedule, layout.virtual_stages)
    # The most loaded rank sets the time (the first of equals).
    r = int(np.argmax(pipe.total_s))
    mine = plan.rank_of == r
    busy = {k: sum(v[mine].tolist()) for k, v in parts[int(pipe.busiest_stage[r])].items()} if mine.any() else {}
    depth = longest_alone_s(costs, int(seqs.max()))
    return StageCost(
        name=name,
        time_s=float(pipe.total_s[r]),
        num_gpus=layout.world_size,
        work_s=tally.work_s,
        depth_s=depth,
        flops=tally.flops,
        hbm_bytes=tally.hbm_bytes,
        comm_bytes=tally.comm_bytes,
        peak_memory_bytes=mem.total_bytes,
        breakdown=components(busy, float(pipe.bubble_s[r])),
    )


# The depth's longest sequence alone, by its layout's cost model and its length: a planner costs
# one layout on batch after batch whose longest sequence is often the same (responses cut at the
# length limit), and the figure depends on nothing else. LayoutCosts instances are shared per
# (model, cluster, layout, head) and key by identity; the memo holds them, so an id is not reused.
_ALONE: BoundedMemo[tuple[LayoutCosts, int, bool], float] = BoundedMemo(4096)


def longest_alone_s(costs: LayoutCosts, longest: int, backward: bool = False) -> float:
    """A sequence of ``longest`` tokens alone through every stage of ``costs``: the sum over stages
    of its forward compute (``backward``: forward + backward compute), in stage order."""
    key = (costs, longest, backward)
    got = _ALONE.get(key)
    if got is not None:
        return got
    one = MicroBatchShapes.single(np.array([longest]))
    # compute only: the sequence's communication is no part of its depth (and costing the
    # collectives at one more size was most of this function's time)
    if backward:
        got = 0.0
        for shard in costs.shards:
            fwd = costs.forward(shard, one, comm_too=False)
            got += float(fwd.compute_s[0] + costs.backward(shard, one, fwd, comm_too=False).compute_s[0])
    else:
        got = sum(float(costs.forward(shard, one, comm_too=False).compute_s[0]) for shard in costs.shards)
    return _ALONE.put(key, got)
