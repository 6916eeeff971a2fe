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
  ``gpu_memory_utilization x HBM``.

The micro-batch is the largest the layout admits at the longest sequence (prompt cap + response
cap): ``max(token budget, longest)`` with a token budget, else ``micro_batch_size x longest``,
so these are peaks, the worst micro-batch of a step (the simulator's stage peaks use the sampled
batch and can be lower). Host RAM per GPU: the states a layout offloads, plus, on a colocated
pool with ``offload_between_phases``, the trained roles' model states parked in host memory while
the engine generates (verl's param/optimizer offload, vLLM sleep mode).

dp and replicas come from the pool sizes as the simulator sets them (:class:`rlperf.sim.costs.AnalyticCosts`):
``dp = pool GPUs / (tp pp cp)``, ``replicas = pool GPUs / (tp pp)``.
"""

from __future__ import annotations

from dataclasses import dataclass

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
    capacity_bytes: float  # HBM per GPU
    note: str = ""  # why the pass does not fit, when it does not

    @property
    def device_bytes(self) -> float:
        return (self.weights_bytes + self.grads_bytes + self.optimizer_bytes + self.activations_bytes
                + self.logits_bytes + self.kv_cache_bytes + self.other_bytes)

    @property
    def fits(self) -> bool:
        return self.device_bytes <= self.capacity_bytes and not self.note


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
    hbm = sc.cluster.accelerator.hbm_bytes
    cp = concrete_plan(plan, num_gpus)
    longest = sc.workload.max_prompt_tokens + sc.workload.max_response_tokens
    colocated_offload = plan.offload_between_phases and assign["generate"] == assign["actor"]
    rows: list[RoleMemory] = []
    gen = assign["generate"]
    mem = inference_memory(sc.models["actor"], cp.rollout, hbm)
    rows.append(RoleMemory("rollout", "generate", gen, size[gen], mem.weights_bytes, 0.0, 0.0, 0.0, 0.0,
                           max(mem.kv_capacity_bytes, 0.0), mem.workspace_bytes, 0.0, hbm,
                           "" if mem.kv_capacity_bytes > 0 else "weights and workspace exceed gpu_memory_utilization"))
    seen: set[tuple[str, str]] = set()
    reward_model = sc.spec.algorithm.reward.kind == "model"
    for st in sc.algorithm.active_stages(updates_per_rollout=sc.epochs * sc.minibatches):
        work = {"train": "train", "forward": "forward", "reward": "forward" if reward_model else ""}.get(st.kind, "")
        if not work or (st.role, work) in seen:
            continue
        seen.add((st.role, work))
        lay = cp.layout_for(st.role)
        mb = max(lay.max_tokens_per_microbatch or 0, longest) if lay.max_tokens_per_microbatch else lay.micro_batch_size * longest
        pool = assign[st.role]
        note = ""
        try:
            if work == "train":
                t = train_memory(sc.models[st.role], lay, mb, seq_len=longest, value_head=head_of(st.role) == "value")
                host = t.host_bytes + (t.model_states_bytes if colocated_offload else 0.0)
                rows.append(RoleMemory(st.role, work, pool, size[pool], t.weights_bytes, t.grads_bytes, t.optimizer_bytes,
                                       t.activations_bytes, t.logits_bytes, 0.0, t.buffers_bytes, host, hbm))
                continue
            f = forward_memory(sc.models[st.role], lay, mb, seq_len=longest, value_head=head_of(st.role) == "value")
            rows.append(RoleMemory(st.role, work, pool, size[pool], f.weights_bytes, 0.0, 0.0, f.activations_bytes,
                                   f.logits_bytes, 0.0, f.buffers_bytes, f.host_bytes, hbm))
        except SpecError as err:
            note = str(err)
            rows.append(RoleMemory(st.role, work, pool, size[pool], 0, 0, 0, 0, 0, 0, 0, 0, hbm, note))
    return tuple(rows)
