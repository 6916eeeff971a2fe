"""The plan space: placements x parallel layouts x engine layouts x execution modes.

Enumeration is structural (divisibility); memory is checked when a candidate's stage costs are
first computed (the cost models raise SpecError with the reason), and every rejection keeps
its reason for ``rlperf plan --explain``.

Grid (documented choices, not tuned; kept small so that a search fits in a minute on 2 cores):
- placement: colocated; disaggregated with the rollout pool at 1/4, 1/2 and 3/4 of the cluster
  rounded to whole nodes (or to engine sizes inside one node); hybrid (algorithms with frozen
  models only): one node for the frozen reference / reward model, the rest split in half;
- rollout engine: tp in {1, 2, 4, 8} dividing the heads (ep = tp for MoE);
- training layout: tp in {1, 2, 4, 8} dividing the heads; Ulysses cp: the smallest power of two
  that brings the longest sequence under 32k tokens per GPU, and twice that; pp in {1, 2, 4}
  only when a node cannot hold the model states fully sharded; ZeRO-3 (FSDP), full recompute;
  token budget per micro-batch = the longest sequence / cp rounded up to a power of two, at
  least 16k; ep = the largest of {8, 4, 2, 1} dividing the experts, for MoE;
- execution mode: sync, sync + stage fusion, one-step off-policy, async (staleness 2) and
  streaming (verl fully_async with partial rollout, staleness threshold 0.5) on split pools,
  partial rollout with a budget of half the response cap.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Protocol

from rlperf.errors import SpecError
from rlperf.modes import GenerationRounds, mode_of
from rlperf.scenario import Scenario
from rlperf.specs.parallel import EngineLayout, TrainLayout, check_engine_layout, check_train_layout
from rlperf.specs.plan import ExecutionMode, Placement, Plan, Pool


class PlanFilter(Protocol):
    """Restricts the space, e.g. to what one framework runs (``FrameworkPreset.why_not_plan``)."""

    def why_not_plan(self, plan: Plan) -> str | None: ...


@dataclass(frozen=True)
class SearchOptions:
    max_staleness: int = 2  # modes whose staleness exceeds this are not considered
    allow_partial_rollout: bool = True
    allow_fusion: bool = True
    top_k: int = 3  # at most top_k x (GPU counts the bound leaves) plans simulated beyond the baselines
    tolerance: float = 0.05  # stop once no unsimulated plan's bound beats the best by more than this
    # Plans simulated between two pruning rounds (one per worker on a 4-core machine); fixed,
    # not taken from the executor, so that every executor simulates the same plans.
    sim_batch: int = 4
    objective: str = "time"  # time | cost | throughput_per_gpu
    plan_filter: PlanFilter | None = None  # candidates it refuses are rejected with its reason


@dataclass(frozen=True)
class Candidate:
    plan: Plan
    label: str  # short human description

    @property
    def staleness(self) -> int:
        return self.plan.mode.effective_staleness


@dataclass(frozen=True)
class Rejected:
    label: str
    reason: str


def _pow2_upto(n: int) -> list[int]:
    out, v = [], 1
    while v <= n:
        out.append(v)
        v *= 2
    return out


def rollout_splits(total: int, per_node: int, engine_gpus: int) -> list[int]:
    """Rollout pool sizes for split placements: quarters of the cluster, rounded to whole nodes
    (or to whole engines inside one node), deduplicated, each leaving GPUs for training."""
    unit = per_node if total > per_node else engine_gpus
    sizes = set()
    for k in (1, 2, 3):
        g = round(total * k / 4 / unit) * unit
        if unit <= g < total:
            sizes.add(g)
    return sorted(sizes)


def placements(sc: Scenario, engine_gpus: int) -> list[tuple[Placement, str]]:
    total = sc.cluster.num_gpus
    node = sc.cluster.gpus_per_node
    out: list[tuple[Placement, str]] = [(Placement(kind="colocated"), "colocated")]
    for g in rollout_splits(total, node, engine_gpus):
        out.append((Placement(kind="disaggregated", rollout_gpus=g), f"disagg {g}+{total - g}"))
    frozen = [r for r in sc.algorithm.frozen if r in ("ref", "reward_model")]
    if sc.spec.algorithm.reward.kind != "model":
        frozen = [r for r in frozen if r != "reward_model"]
    if frozen and total >= 4 * node:
        f = node
        rest = total - f
        splits = rollout_splits(rest, node, engine_gpus)
        if splits:
            g = min(splits, key=lambda x: abs(x - rest / 2))
            pools = (Pool(name="gen", num_gpus=g), Pool(name="train", num_gpus=rest - g), Pool(name="frozen", num_gpus=f))
            assign = {"generate": "gen", "actor": "train", "critic": "train", "prm": "train"}
            assign.update({r: "frozen" for r in frozen})
            out.append((Placement(kind="hybrid", pools=pools, assign=assign), f"hybrid {g}+{rest - g}+{f}"))
    return out


def engine_layouts(sc: Scenario) -> list[EngineLayout]:
    model = sc.models["actor"]
    base = sc.plan.rollout
    out = []
    for tp in (1, 2, 4, 8):
        if tp > sc.cluster.gpus_per_node:
            continue
        ep = tp if model.moe is not None and tp > 1 and model.moe.num_experts % tp == 0 else 1
        lay = base.model_copy(update={"tp": tp, "pp": 1, "ep": ep, "replicas": 1})
        try:
            check_engine_layout(model, lay)
        except SpecError:
            continue
        out.append(lay)
    return out


def _next_pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def train_layouts(sc: Scenario) -> list[TrainLayout]:
    model = sc.models["actor"]
    node = sc.cluster.gpus_per_node
    max_seq = sc.workload.max_sequence_tokens
    # Model states fully sharded over one node: if even that exceeds a GPU, add pipeline stages.
    states_per_gpu = 16.0 * model.num_params / max(1, min(node, sc.cluster.num_gpus))
    pps = [1, 2, 4] if states_per_gpu > 0.6 * sc.cluster.accelerator.hbm_bytes else [1]
    cp0 = 1
    while max_seq / cp0 > 32768 and cp0 < node:
        cp0 *= 2
    ep = 1
    if model.moe is not None:
        ep = max(e for e in (8, 4, 2, 1) if model.moe.num_experts % e == 0 and e <= node)
    lora = sc.spec.plan.layout_for("actor").lora_rank
    out = []
    for tp in (1, 2, 4, 8):
        for pp in pps:
            for cp in sorted({cp0, min(node, 2 * cp0)}):
                if tp * cp > node:
                    continue
                budget = max(16384, _next_pow2(-(-max_seq // cp)))
                # lora_rank: what the run trains (the scenario's), not a layout choice
                lay = TrainLayout(tp=tp, pp=pp, cp=cp, cp_kind="ulysses", ep=1, zero_stage=3, recompute="full",
                                  max_tokens_per_microbatch=budget, sequence_parallel=tp > 1, lora_rank=lora)
                try:
                    check_train_layout(model, lay)
                except SpecError:
                    continue
                out.append(lay.model_copy(update={"ep": ep}) if ep > 1 else lay)
    return out


def streaming_mode(minibatches: int, threshold: float = 0.5) -> ExecutionMode:
    """The streaming candidate: threshold ``τ``, and as many local updates per sync as verl's
    default ``trigger_parameter_sync_step`` (4) allows with whole mini-batches each."""
    parts = max(d for d in (4, 2, 1) if minibatches % d == 0)
    return ExecutionMode(kind="streaming", staleness_threshold=threshold, train_parts=parts)


def modes(sc: Scenario, split: bool, opts: SearchOptions) -> list[tuple[ExecutionMode, str]]:
    out: list[tuple[ExecutionMode, str]] = [(ExecutionMode(kind="sync"), "sync")]
    rounds = GenerationRounds.of(sc.algorithm, sc.spec.algorithm.keep_rate)
    if opts.allow_fusion and rounds.allows_fusion:
        out.append((ExecutionMode(kind="sync", fusion=True), "sync+fusion"))
    if split and opts.max_staleness >= 1:
        out.append((ExecutionMode(kind="one_step_off"), "one-step-off"))
        if opts.max_staleness >= 2:
            out.append((ExecutionMode(kind="async", staleness=2), "async s=2"))
            # verl fully_async: half a batch runs ahead with the old weights, resumed requests
            # keep their start version (about τ of the trained responses lag, some by more than
            # one update), and the trainer takes the batch in local updates as it streams in.
            streaming = streaming_mode(sc.minibatches)
            out.append((streaming, mode_of(streaming).label))
    if opts.allow_partial_rollout and opts.max_staleness >= 1 and rounds.allows_partial_rollout:
        b = max(1, sc.workload.max_response_tokens // 2)
        out.append((ExecutionMode(kind="partial_rollout", token_budget=b), f"partial {b}"))
    return out


def enumerate_candidates(sc: Scenario, opts: SearchOptions) -> Iterator[Candidate | Rejected]:
    base = sc.plan
    engines = engine_layouts(sc)
    if not engines:
        yield Rejected("rollout engine", f"no tensor-parallel degree in 1..8 divides {sc.models['actor'].num_heads} heads")
        return
    layouts = train_layouts(sc)
    if not layouts:
        yield Rejected("training layout", "no tp/pp/cp layout fits the longest sequence and the heads")
        return
    for eng in engines:
        for place, plabel in placements(sc, eng.tp * eng.pp):
            split = place.kind != "colocated"
            for lay in layouts:
                for mode, mlabel in modes(sc, split, opts):
                    plan = base.model_copy(update={
                        "placement": place,
                        "rollout": eng,
                        "layouts": {"actor": lay},
                        "mode": mode,
                    })
                    label = (f"{plabel} | gen tp{eng.tp} | train tp{lay.tp} pp{lay.pp} cp{lay.cp}"
                             f" mb{(lay.max_tokens_per_microbatch or 0) // 1024}k | {mlabel}")
                    yield Candidate(plan, label)


def framework_default_plans(sc: Scenario) -> list[Candidate]:
    """The plans a framework would run by default on the same GPUs (verl-like colocated sync,
    and a disaggregated sync split), with the user's layouts: the baselines the planner must
    not lose to."""
    total = sc.cluster.num_gpus
    eng = sc.plan.rollout
    out = [Candidate(sc.plan.model_copy(update={"placement": Placement(kind="colocated"), "mode": ExecutionMode()}),
                     "framework default: colocated sync")]
    splits = rollout_splits(total, sc.cluster.gpus_per_node, eng.tp * eng.pp)
    if splits:
        g = min(splits, key=lambda s: abs(s - total / 2))
        out.append(Candidate(sc.plan.model_copy(update={"placement": Placement(kind="disaggregated", rollout_gpus=g),
                                                        "mode": ExecutionMode()}),
                             f"framework default: disaggregated {g}+{total - g} sync"))
    return out
