"""A framework's default plan for a scenario: its documented defaults, sized to fit the model.

The defaults (:class:`rlperf.frameworks.presets.PlanDefaults`) fix the placement, the mode, the
backend and the configuration numbers. Two things depend on the model and must change for the
run to start at all, and a user of the framework would change them; the rule is the same for
every framework and each change is written into the notes:

- the rollout engine's tp grows from the framework's default (powers of two, up to a node) until
  the bf16 weights take at most half the engine's memory share (the rest holds the KV cache);
- the training states must fit in half of the device memory (what CUDA reports): ZeRO/FSDP
  states are ``16 B/param`` split by stage (algorithms.md §2.1: bf16 weights and grads, fp32 master and Adam moments), so a ZeRO
  stage that does not fit becomes ZeRO-3; Megatron keeps ``6 B/param`` (bf16 weights, fp32
  grads) per model-parallel shard plus ``12 B/param`` of optimizer state sharded over dp, and
  grows tp (up to a node), then pp.
"""

from __future__ import annotations

from dataclasses import dataclass

from rlperf.errors import SpecError
from rlperf.frameworks.presets import FrameworkPreset, PlanDefaults
from rlperf.scenario import ScenarioSpec, resolve
from rlperf.specs.model import ModelSpec
from rlperf.specs.parallel import EngineLayout, TrainLayout, check_engine_layout, check_train_layout
from rlperf.specs.plan import ExecutionMode, Placement, Plan

WEIGHTS_SHARE_OF_ENGINE = 0.5  # of the engine's memory share; the rest is KV cache
STATES_SHARE_OF_MEMORY = 0.5  # of device memory for the training states; the rest is activations and logits


@dataclass(frozen=True)
class DefaultPlan:
    plan: Plan
    notes: tuple[str, ...]


def why_not(preset: FrameworkPreset, spec: ScenarioSpec) -> str | None:
    """Why ``preset``'s framework cannot run ``spec``'s workload (None if it can)."""
    from rlperf.algorithms import get_algorithm

    name = get_algorithm(spec.algorithm.name).name
    if name not in preset.algorithms:
        return (
            f"{name} is not among {preset.name}'s documented algorithms"
            f" ({', '.join(preset.algorithms)}; frameworks_overview.md §1)"
        )
    if preset.defaults.placement == "disaggregated":
        sc = resolve(spec)
        if sc.cluster.num_gpus < 2:
            return f"{preset.name} generates on separate GPUs; the cluster has {sc.cluster.num_gpus}"
    return None


def build_default_plan(preset: FrameworkPreset, spec: ScenarioSpec) -> DefaultPlan:
    """The plan ``preset``'s framework would run ``spec``'s workload with, and why it looks so."""
    reason = why_not(preset, spec)
    if reason is not None:
        raise SpecError("framework", reason)
    d = preset.defaults
    sc = resolve(spec)
    actor, total = sc.models["actor"], sc.cluster.num_gpus
    memory, node = sc.cluster.accelerator.device_memory_bytes, sc.cluster.gpus_per_node
    notes = [f"{preset.name} defaults: {d.source}", *(f"assumed: {a}" for a in d.assumed)]
    engine_tp = _engine_tp(actor, d, memory, min(node, total), notes)
    rollout_gpus = total
    train_gpus = total
    layout = _train_layout(actor, d, memory, node, total, notes if d.placement != "disaggregated" else [])
    placement = Placement()
    if d.placement == "disaggregated":  # size the trainer on the whole cluster, split, then resize
        rollout_gpus = _rollout_share(d.rollout_share, total, engine_tp, layout.tp * layout.pp * layout.cp)
        train_gpus = total - rollout_gpus
        layout = _train_layout(actor, d, memory, node, train_gpus, notes)
        placement = Placement(kind="disaggregated", rollout_gpus=rollout_gpus)
        notes.append(f"{rollout_gpus} of {total} GPUs generate")
    mp = layout.tp * layout.pp * layout.cp
    if train_gpus % mp:
        notes.append(f"{train_gpus % mp} of the {train_gpus} training GPUs are left idle by tp·pp·cp = {mp}")
    # LoRA is what the run trains, not a layout choice: the default plan keeps the scenario's rank
    lora = spec.plan.layout_for("actor").lora_rank
    layout = layout.model_copy(update={"dp": max(1, train_gpus // mp), "lora_rank": lora})
    engine = EngineLayout(
        tp=engine_tp,
        replicas=max(1, rollout_gpus // engine_tp),
        gpu_memory_utilization=d.gpu_memory_utilization,
        max_num_seqs=d.max_num_seqs or EngineLayout().max_num_seqs,
        prefix_sharing=d.prefix_sharing,
    )
    mode = ExecutionMode(kind=d.mode, staleness=d.staleness, fusion=d.fusion)
    plan = Plan(
        placement=placement,
        rollout=engine,
        layouts={"actor": layout},
        mode=mode,
        offload_between_phases=d.offload_between_phases and d.placement == "colocated",
    )
    return DefaultPlan(plan, tuple(notes))


def _engine_tp(model: ModelSpec, d: PlanDefaults, memory_bytes: float, cap: int, notes: list[str]) -> int:
    budget = WEIGHTS_SHARE_OF_ENGINE * d.gpu_memory_utilization * memory_bytes
    tp = min(d.engine_tp, cap)
    while model.weight_bytes("bf16") / tp > budget and tp * 2 <= cap:
        tp *= 2
    while tp > 1 and not _engine_ok(model, tp):
        tp //= 2
    if tp != d.engine_tp:
        notes.append(f"rollout tp {d.engine_tp} -> {tp} so the weights fit the engine's memory share")
    if model.weight_bytes("bf16") / tp > budget:
        notes.append(f"the weights exceed half the engine's memory share even at tp {tp}")
    return tp


def _engine_ok(model: ModelSpec, tp: int) -> bool:
    try:
        check_engine_layout(model, EngineLayout(tp=tp))
    except SpecError:
        return False
    return True


def _zero_states_bytes_per_gpu(model: ModelSpec, zero: int, dp: int) -> float:
    """ZeRO/FSDP training states per GPU: 16 B/param, the stage's share split over ``dp``."""
    p = model.num_params
    if zero == 0:
        return 16 * p
    if zero == 1:
        return 4 * p + 12 * p / dp
    if zero == 2:
        return 2 * p + 14 * p / dp
    return 16 * p / dp


def _megatron_states_bytes_per_gpu(model: ModelSpec, tp: int, pp: int, gpus: int) -> float:
    """Megatron with the distributed optimizer: 6 B/param per model-parallel shard (bf16
    weights, fp32 grads) + 12 B/param of optimizer state sharded over dp."""
    shard = model.num_params / (tp * pp)
    return 6 * shard + 12 * shard / max(1, gpus // (tp * pp))


def _train_layout(model: ModelSpec, d: PlanDefaults, memory_bytes: float, node: int, gpus: int, notes: list[str]) -> TrainLayout:
    budget = STATES_SHARE_OF_MEMORY * memory_bytes
    base = TrainLayout(
        zero_stage=d.zero_stage,
        recompute=d.recompute,
        micro_batch_size=d.micro_batch_size,
        max_tokens_per_microbatch=d.max_tokens_per_microbatch,
        forward_logits_dtype=d.forward_logits_dtype,
        cp_kind="ulysses" if d.backend == "fsdp" else "ring",
        sequence_parallel=d.backend == "megatron",
        backend="megatron" if d.backend == "megatron" else "fsdp",  # DeepSpeed ZeRO engines cost as FSDP
    )
    if d.backend != "megatron":
        if _zero_states_bytes_per_gpu(model, d.zero_stage, gpus) > budget and d.zero_stage != 3:
            notes.append(f"ZeRO-{d.zero_stage} -> ZeRO-3 so the training states fit")
            return base.model_copy(update={"zero_stage": 3})
        return base
    tp, pp = 1, 1
    while _megatron_states_bytes_per_gpu(model, tp, pp, gpus) > budget and tp * 2 <= min(node, gpus) and _train_ok(model, base, tp * 2, pp):
        tp *= 2
    while _megatron_states_bytes_per_gpu(model, tp, pp, gpus) > budget and tp * pp * 2 <= gpus and _train_ok(model, base, tp, pp * 2):
        pp *= 2
    if (tp, pp) != (1, 1):
        notes.append(f"Megatron tp {tp}, pp {pp} so the training states fit")
    return base.model_copy(update={"tp": tp, "pp": pp})


def _train_ok(model: ModelSpec, base: TrainLayout, tp: int, pp: int) -> bool:
    try:
        check_train_layout(model, base.model_copy(update={"tp": tp, "pp": pp}))
    except SpecError:
        return False
    return True


def _rollout_share(share: float, total: int, engine_tp: int, train_mp: int) -> int:
    """Rollout GPUs nearest ``share`` of the cluster: whole engines, leaving whole training
    replicas (tp·pp·cp) for the rest."""
    candidates = [
        r for r in range(engine_tp, total, engine_tp) if (total - r) >= train_mp and (total - r) % train_mp == 0
    ]
    if not candidates:
        raise SpecError("framework", f"{total} GPUs cannot hold an engine of tp {engine_tp} and a trainer of {train_mp}")
    return min(candidates, key=lambda r: (abs(r - share * total), r))
