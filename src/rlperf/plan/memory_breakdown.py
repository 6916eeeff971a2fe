"""Where the memory of a plan goes: per role and pool, weights to KV cache, device and host.

For every pass the algorithm runs (``AlgorithmSpec.active_stages``), the per-GPU bytes of the
fullest pipeline stage, from the closed forms of :mod:`rlperf.cost.memory`:

- a training pass (actor, critic): :func:`~rlperf.cost.memory.train_memory` -- weights,
  gradients, optimizer states (ZeRO-sharded over the role's ``dp x cp`` ranks), activations kept
  for backward, fp32 logits of one micro-batch, ZeRO working buffers;
- a forward-only pass (reference, old log-probs, reward model):
  :func:`~rlperf.cost.memory.forward_memory`;
- the rollout engine: :func:`~rlperf.cost.memory.inference_memory` -- weights, the step
  workspace, and the KV cache, which a vLLM-style engine preallocates to fill
  ``gpu_memory_utilization x`` the device memory CUDA reports
  (:attr:`~rlperf.specs.hardware.Accelerator.device_memory_bytes`, also each row's capacity).

Each pass is sized for two micro-batches (:class:`MicroBatchSizes`), from the layout's own
micro-batching (a forward pass: its ``forward_*`` fields, :meth:`TrainLayout.for_forward_passes`)
and the ``n`` sequences one dp rank holds in the pass (``B G / dp`` for a forward pass,
``B G / (minibatches dp)`` for a training pass):

- **worst**, every sequence at the longest length ``L`` (prompt cap + response cap, or
  ``max_total_tokens``): ``max(budget x cp, L)`` tokens over a cp group with a token budget (the
  budget is per device, as verl's ``*_max_token_len_per_gpu``; a longer sequence is a
  micro-batch of its own), else ``min(micro_batch_size, n) x L``. The components of a row are at
  this micro-batch: the peak a step can reach, what decides whether the plan fits;
- **mean**, sequences of the workload's mean length ``m = E[L_p] + E[L_r]``: ``max(m,
  floor(budget x cp / m) m)`` (as many as the budget holds), at most ``n m``, or
  ``min(micro_batch_size, n) x m``: a typical micro-batch, reported as the row's
  ``mean_device_bytes``.

The simulator's stage peaks use the sampled batch: between the two. Host RAM per GPU: the states a layout offloads, plus, on a colocated
pool with ``offload_between_phases``, the trained roles' model states parked in host memory while
the engine generates (verl's param/optimizer offload, vLLM sleep mode).

dp and replicas come from the pool sizes as the simulator sets them (:class:`rlperf.sim.costs.AnalyticCosts`):
``dp = pool GPUs / (tp pp cp)``, ``replicas = pool GPUs / (tp pp)``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from rlperf.cost.memory import forward_memory, inference_memory, train_memory
from rlperf.errors import SpecError
from rlperf.scenario import Scenario
from rlperf.specs.parallel import TrainLayout
from rlperf.specs.plan import Plan
from rlperf.stages.shard import head_of


@dataclass(frozen=True)
class RoleMemory:
    """Per-GPU bytes of one pass of one role, on its pool."""

    role: str  # actor, critic, ref, reward_model, prm, or "rollout" (the engine)
    work: str  # "train", "forward" or "generate"
    pool: str
    pool_gpus: int
    weights_bytes: float
    grads_bytes: float
    optimizer_bytes: float
    activations_bytes: float
    logits_bytes: float
    kv_cache_bytes: float
    other_bytes: float  # ZeRO buffers (training), step workspace (engine)
    host_bytes: float  # host RAM per GPU (offloaded states)
    capacity_bytes: float  # device memory per GPU (Accelerator.device_memory_bytes)
    note: str = ""  # why the pass does not fit, when it does not
    # the worst micro-batch (every sequence at the cap), which the components above are at
    micro_batch_tokens: float = 0.0
    # a micro-batch of mean-length sequences, and the device bytes with it (the same states)
    mean_micro_batch_tokens: float = 0.0
    mean_device_bytes: float = 0.0

    @property
    def device_bytes(self) -> float:
        return (self.weights_bytes + self.grads_bytes + self.optimizer_bytes + self.activations_bytes
                + self.logits_bytes + self.kv_cache_bytes + self.other_bytes)

    @property
    def fits(self) -> bool:
        return self.device_bytes <= self.capacity_bytes and not self.note


@dataclass(frozen=True)
class MicroBatchSizes:
    """Tokens of one pass's worst and mean micro-batch over a cp group, and the attention span
    (the sequence length) behind each (module docstring)."""

    worst_tokens: int
    worst_seq_tokens: int
    mean_tokens: int
    mean_seq_tokens: int

    @classmethod
    def of(cls, lay: TrainLayout, longest: int, mean: float, sequences_per_rank: float) -> MicroBatchSizes:
        n = max(1.0, sequences_per_rank)
        m = max(1, round(min(mean, longest)))
        budget = lay.max_tokens_per_microbatch
        if budget is None:
            k = min(float(lay.micro_batch_size), n)
            return cls(round(k * longest), longest, max(1, round(k * m)), m)
        group = budget * lay.cp
        filled = max(m, (group // m) * m)
        return cls(max(group, longest), longest, max(1, round(min(filled, n * m))), m)


def concrete_plan(plan: Plan, num_gpus: int) -> Plan:
    """``plan`` with ``dp`` of every layout and the engine's ``replicas`` set from its pools."""
    pools, assign = plan.placement.resolve(num_gpus)
    size = {p.name: p.num_gpus for p in pools}
    layouts: dict[str, TrainLayout] = {}
    for role in plan.layouts:
        lay = plan.layout_for(role)
        layouts[role] = lay.model_copy(update={"dp": max(1, size[assign[role]] // (lay.tp * lay.pp * lay.cp))})
    engine = plan.rollout
    engine = engine.model_copy(update={"replicas": max(1, size[assign["generate"]] // (engine.tp * engine.pp))})
    return plan.model_copy(update={"layouts": layouts, "rollout": engine})


def memory_breakdown(sc: Scenario, plan: Plan, num_gpus: int) -> tuple[RoleMemory, ...]:
    """One row per (role, pass) the algorithm runs, in stage order; the engine first."""
    pools, assign = plan.placement.resolve(num_gpus)
    size = {p.name: p.num_gpus for p in pools}
    capacity = sc.cluster.accelerator.device_memory_bytes
    cp = concrete_plan(plan, num_gpus)
    w = sc.workload
    longest = w.max_sequence_tokens
    mean = w.prompt_length.mean_tokens() + w.response_length.mean_tokens()
    colocated_offload = plan.offload_between_phases and assign["generate"] == assign["actor"]
    rows: list[RoleMemory] = []
    gen = assign["generate"]
    mem = inference_memory(sc.models["actor"], cp.rollout, capacity)
    engine = RoleMemory("rollout", "generate", gen, size[gen], mem.weights_bytes, 0.0, 0.0, 0.0, 0.0,
                        max(mem.kv_capacity_bytes, 0.0), mem.workspace_bytes, 0.0, capacity,
                        "" if mem.kv_capacity_bytes > 0 else "weights and workspace exceed gpu_memory_utilization")
    # the engine preallocates its KV cache: the same bytes whatever the lengths
    rows.append(replace(engine, mean_device_bytes=engine.device_bytes))
    seen: set[tuple[str, str]] = set()
    reward_model = sc.spec.algorithm.reward.kind == "model"
    for st in sc.algorithm.active_stages(updates_per_rollout=sc.epochs * sc.minibatches):
        work = {"train": "train", "forward": "forward", "reward": "forward" if reward_model else ""}.get(st.kind, "")
        if not work or (st.role, work) in seen:
            continue
        seen.add((st.role, work))
        lay = cp.layout_for(st.role)
        if work == "forward":
            lay = lay.for_forward_passes()
        per_rank = w.num_responses / lay.dp / (sc.minibatches if work == "train" else 1)
        mb = MicroBatchSizes.of(lay, longest, mean, per_rank)
        pool = assign[st.role]
        note = ""
        value = head_of(st.role) == "value"
        try:
            if work == "train":
                t = train_memory(sc.models[st.role], lay, mb.worst_tokens, seq_len=mb.worst_seq_tokens, value_head=value)
                typical = train_memory(sc.models[st.role], lay, mb.mean_tokens, seq_len=mb.mean_seq_tokens, value_head=value)
                host = t.host_bytes + (t.model_states_bytes if colocated_offload else 0.0)
                rows.append(RoleMemory(st.role, work, pool, size[pool], t.weights_bytes, t.grads_bytes, t.optimizer_bytes,
                                       t.activations_bytes, t.logits_bytes, 0.0, t.buffers_bytes, host, capacity, "",
                                       mb.worst_tokens, mb.mean_tokens, typical.total_bytes))
                continue
            f = forward_memory(sc.models[st.role], lay, mb.worst_tokens, seq_len=mb.worst_seq_tokens, value_head=value)
            typical_f = forward_memory(sc.models[st.role], lay, mb.mean_tokens, seq_len=mb.mean_seq_tokens, value_head=value)
            rows.append(RoleMemory(st.role, work, pool, size[pool], f.weights_bytes, 0.0, 0.0, f.activations_bytes,
                                   f.logits_bytes, 0.0, f.buffers_bytes, f.host_bytes, capacity, "",
                                   mb.worst_tokens, mb.mean_tokens, typical_f.total_bytes))
        except SpecError as err:
            note = str(err)
            rows.append(RoleMemory(st.role, work, pool, size[pool], 0, 0, 0, 0, 0, 0, 0, 0, capacity, note))
    return tuple(rows)
