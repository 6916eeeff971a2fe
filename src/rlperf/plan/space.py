"""The plan space: placements x parallel layouts x engine layouts x execution modes.

Enumeration is structural (divisibility); memory is checked when a candidate's stage costs are
first computed (the cost models raise SpecError with the reason), and every rejection keeps
its reason for ``rlperf plan --explain``. Knobs whose best value memory decides (ZeRO stage,
recompute, token budget, offload) are not enumerated blindly: for each training pool they take
the fastest value the memory model (rlperf.cost.memory.train_memory) lets fit, so the space keeps
one candidate per layout.

Grid (documented choices, not tuned; kept small so that a search fits in a minute on 2 cores):
- placement: colocated; disaggregated with the rollout pool at 1/4, 1/2 and 3/4 of the cluster
  rounded to whole nodes (or engines inside one node), or at every node (engine) boundary up to
  8 nodes on the question's own cluster when asked (``SearchOptions.fine_splits_at_gpus``); hybrid (algorithms with frozen models only): one node for the frozen
  reference / reward model, the rest split in half;
- rollout engine: tp in {1, 2, 4, 8} dividing the heads (ep = tp·pp for MoE); pp 2 or 4 at the
  widest tp when no single-node engine holds the weights and one longest sequence's KV;
- training layout: tp in {1, 2, 4, 8} dividing the heads; context parallel: the smallest power
  of two that brings the longest sequence under 32k tokens per GPU, and twice that, Ulysses
  where cp·tp divides the heads, else ring attention; pp in {1, 2, 4} only when a node cannot
  hold the model states fully sharded (interleaved, 2 virtual stages, in the fast rung where
  the layers divide and it fits); ep = the largest of {8, 4, 2, 1} dividing the experts, for MoE;
- memory rung of each training layout on its pool (:meth:`MemoryRungs.fitted`): the fast
  rung, no recompute at the largest power-of-two token budget per micro-batch that fits (with
  tp/pp/ep/ring the lowest ZeRO stage that fits, Megatron's distributed optimizer), when it fits; else the
  safe rung, ZeRO-3 (FSDP) with full recompute and a token budget of the longest sequence / cp
  rounded up to a power of two, at least 16k, rescued if even that does not fit (smaller
  budgets, then the optimizer offloaded, then the parameters);
- execution mode: sync, sync + stage fusion, one-step off-policy, async (staleness 2) and
  streaming (verl fully_async with partial rollout, staleness threshold 0.5) on split pools,
  partial rollout with a budget of half the response cap (neither under dynamic sampling,
  no streaming under oversampling: rlperf.modes.GenerationRounds).

The engine's max_num_seqs is raised to the sequences its KV cache holds at the mean length
(the nearest power of two, up to 1,024), except under streaming (see enumerate_candidates). Not searched (the scenario's values are kept): the engine's
gpu_memory_utilization (it would multiply the rollout simulations, the estimate's dominant cost),
per-role layouts beyond memory (the reference and reward models take the actor's layout; a
critic of another model takes its own memory rung of the same tp/pp/cp layout), selective
recompute (with FlashAttention it keeps what no recompute keeps: rlperf.cost.memory).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Protocol

from rlperf.cost.memory import check_kv_capacity, inference_memory, train_memory
from rlperf.errors import SpecError
from rlperf.modes import GenerationRounds, mode_of
from rlperf.scenario import Scenario
from rlperf.specs.parallel import (
    ContextParallel,
    EngineLayout,
    TrainLayout,
    check_engine_layout,
    check_train_layout,
)
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
    # Split placements at every node boundary (up to 8 nodes) on this many GPUs (the question's
    # own cluster: `rlperf plan --fine-splits`), quarters on the others; None: quarters only.
    # Off by default: on the PPO hybrid scenario (64 H100) it cost 5.0 -> 8.2 CPU-s for the
    # same best plan.
    fine_splits_at_gpus: int | None = None
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


def rollout_splits(total: int, per_node: int, engine_gpus: int, parts: int = 4) -> list[int]:
    """Rollout pool sizes for split placements: ``k/parts`` of the cluster (quarters by
    default), rounded to whole nodes (or to whole engines inside one node), deduplicated, each
    leaving GPUs for training."""
    unit = per_node if total > per_node else engine_gpus
    sizes = set()
    for k in range(1, parts):
        g = round(total * k / parts / unit) * unit
        if unit <= g < total:
            sizes.add(g)
    return sorted(sizes)


# Split placements at every node (engine) boundary up to this many nodes (engines), else at
# quarters: a finer grid on 128 nodes quintupled the 1,024-GPU question's plans (15,498 ->
# 70,350) and its CPU time (44.5 -> 207.5 CPU-s) without changing its best plan.
SPLIT_EVERY_UNIT_UP_TO = 8


def placements(sc: Scenario, engine_gpus: int, fine: bool = True) -> list[tuple[Placement, str]]:
    total = sc.cluster.num_gpus
    node = sc.cluster.gpus_per_node
    out: list[tuple[Placement, str]] = [(Placement(kind="colocated"), "colocated")]
    unit = node if total > node else engine_gpus
    parts = total // unit if fine and total // unit <= SPLIT_EVERY_UNIT_UP_TO else 4
    for g in rollout_splits(total, node, engine_gpus, parts):
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
    """Engines of tp in {1, 2, 4, 8} inside a node; when none of them holds the weights and the
    KV cache of one longest sequence, the largest of them with pp in {2, 4} across nodes too
    (vLLM pipeline parallelism), the smallest such pp that holds it (two of them at most)."""
    base = sc.plan.rollout
    out = []
    for tp in (1, 2, 4, 8):
        if tp > sc.cluster.gpus_per_node:
            continue
        lay = _engine(sc, base, tp, 1)
        if lay is not None:
            out.append(lay)
    if out and not any(_engine_holds_a_sequence(sc, lay) for lay in out):
        widest = max(out, key=lambda lay: lay.tp)
        for pp in (2, 4):
            lay = _engine(sc, base, widest.tp, pp)
            if lay is not None and pp * widest.tp <= sc.cluster.num_gpus:
                out.append(lay)
                if _engine_holds_a_sequence(sc, lay):
                    break
    return out


def _engine(sc: Scenario, base: EngineLayout, tp: int, pp: int) -> EngineLayout | None:
    model = sc.models["actor"]
    n = tp * pp
    ep = n if model.moe is not None and n > 1 and model.moe.num_experts % n == 0 else 1
    lay = base.model_copy(update={"tp": tp, "pp": pp, "ep": ep, "replicas": 1})
    try:
        check_engine_layout(model, lay)
    except SpecError:
        return None
    # max_num_seqs: as many sequences as the KV cache holds at the mean sequence length (the
    # nearest power of two, up to verl's default of 1,024), never fewer than the scenario's. Decode batches
    # grow with it; the rollout model charges the preemptions when the sequences outgrow it.
    wl = sc.workload
    mean_seq = wl.prompt_length.mean_tokens() + wl.response_length.mean_tokens()
    held = inference_memory(model, lay, sc.cluster.accelerator.device_memory_bytes).kv_capacity_tokens / max(mean_seq, 1.0)
    seqs = min(1024, 1 << round(math.log2(held))) if held >= 1 else 0
    if seqs > lay.max_num_seqs:
        lay = lay.model_copy(update={"max_num_seqs": seqs})
    return lay


def _engine_holds_a_sequence(sc: Scenario, lay: EngineLayout) -> bool:
    mem = inference_memory(sc.models["actor"], lay, sc.cluster.accelerator.device_memory_bytes)
    return mem.kv_capacity_tokens >= sc.workload.max_sequence_tokens


def _next_pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def train_layouts(sc: Scenario) -> list[TrainLayout]:
    """The structural training layouts (tp, pp, cp, ep; the safe memory rung), before a pool
    size is known: :func:`fitted_layouts` places each on a pool."""
    model = sc.models["actor"]
    node = sc.cluster.gpus_per_node
    max_seq = sc.workload.max_sequence_tokens
    # Model states fully sharded over one node: if even that exceeds a GPU, add pipeline stages.
    states_per_gpu = 16.0 * model.num_params / max(1, min(node, sc.cluster.num_gpus))
    pps = [1, 2, 4] if states_per_gpu > 0.6 * sc.cluster.accelerator.device_memory_bytes else [1]
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
                # Ulysses needs the heads to divide cp·tp; ring attention does not.
                kinds: list[ContextParallel] = ["ulysses"] if cp == 1 or model.num_heads % (cp * tp) == 0 else ["ring"]
                for kind in kinds:
                    # lora_rank: what the run trains (the scenario's), not a layout choice
                    lay = TrainLayout(tp=tp, pp=pp, cp=cp, cp_kind=kind, ep=1, zero_stage=3, recompute="full",
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


class MemoryRungs:
    """The memory rung of each structural layout on a training pool (module docstring),
    memoized per (layout, pool size): the memory model is closed form, so choosing costs
    a few microseconds per layout, and the space keeps one candidate per layout."""

    def __init__(self, sc: Scenario, role: str = "actor") -> None:
        self.sc = sc
        self.model = sc.models[role]
        self._memo: dict[tuple[TrainLayout, int], TrainLayout] = {}

    def _fits(self, lay: TrainLayout, gpus: int) -> bool:
        sc = self.sc
        dp = gpus // (lay.tp * lay.pp * lay.cp)
        if dp < 1:
            return False
        max_seq = sc.workload.max_sequence_tokens
        # A micro-batch holds budget·cp tokens over its cp group, or the longest sequence alone;
        # as many micro-batches as the schedule ever keeps in flight (a long mini-batch's).
        tokens = max((lay.max_tokens_per_microbatch or max_seq) * lay.cp, max_seq)
        try:
            mem = train_memory(self.model, lay.model_copy(update={"dp": dp}), tokens, seq_len=max_seq,
                               num_microbatches=1 << 20)
        except SpecError:
            return False
        return mem.total_bytes <= sc.cluster.accelerator.device_memory_bytes

    def _budgets(self, lay: TrainLayout) -> list[int]:
        """Powers of two from the layout's budget down to the one that holds the longest
        sequence (smaller budgets would not lower the peak: that sequence is a micro-batch)."""
        b = lay.max_tokens_per_microbatch or 16384
        out = [b]
        while b * lay.cp > self.sc.workload.max_sequence_tokens and b > 1024:
            b //= 2
            out.append(b)
        return out

    def fitted(self, lay: TrainLayout, gpus: int) -> TrainLayout:
        """``lay`` on a training pool of ``gpus``.

        The fast rung when it fits: no recompute at the largest budget that fits (forward-only
        passes keep the layout's budget: they keep no activations for a backward), and with
        tp/pp/ep/ring the lowest ZeRO stage that fits there (data-parallel layouts keep ZeRO-3).
        Pipelines take the interleaved schedule (2 virtual stages) in the fast rung where it fits.
        Measured with the cost model (docs/benchmarks.md): the fast rung's update is 25-30%
        shorter on every layout tried (0.5B to 32B, dense and MoE, 1 to 128 GPUs), its
        forward passes at most 7% longer without the separate forward budget; interleaving
        shortens a pipelined update by 1-2%.
        Else the safe rung, rescued if it does not fit: the budget halved down to the longest
        sequence, then the optimizer offloaded, then the parameters too. Nothing fits: ``lay``,
        whose rejection names the reason."""
        key = (lay, gpus)
        got = self._memo.get(key)
        if got is not None:
            return got
        budget = lay.max_tokens_per_microbatch
        # Interleaved 1F1B (Narayanan et al. 2021) divides the bubble by the virtual stages but
        # keeps more micro-batches in flight: first where the layers divide, else plain 1F1B.
        schedules = [lay]
        if lay.pp > 1 and self.model.num_layers % (2 * lay.pp) == 0:
            schedules.insert(0, lay.model_copy(update={"pp_schedule": "interleaved", "virtual_stages": 2}))
        fast = next((f for sched in schedules for b in self._budgets(lay)
                     if self._fits(f := sched.model_copy(update={
                         "recompute": "none", "max_tokens_per_microbatch": b,
                         "forward_max_tokens_per_microbatch": budget if budget is not None and b < budget else None}), gpus)),
                    None)
        if fast is not None:
            # Tensor/pipeline/expert-parallel layouts run with Megatron's distributed optimizer
            # (ZeRO-1) in the frameworks that run them; FSDP + tp is rare (verl refuses it).
            # Data-parallel layouts keep ZeRO-3 (FSDP): a lower stage shortened the README
            # scenario's update by 0.2% and would key its stage costs by the placement too.
            model_parallel = lay.tp > 1 or lay.pp > 1 or lay.ep > 1 or lay.ring_attention
            if model_parallel:
                fast = next((z for stage in (1, 2) if self._fits(z := fast.model_copy(update={"zero_stage": stage}), gpus)), fast)
            got = fast
        elif self._fits(lay, gpus):
            got = lay
        else:
            rescue = [lay.model_copy(update={"max_tokens_per_microbatch": b}) for b in self._budgets(lay)[1:]]
            small = rescue[-1] if rescue else lay
            rescue += [small.model_copy(update={"offload_optimizer": True}),
                       small.model_copy(update={"offload_optimizer": True, "offload_params": True})]
            got = next((r for r in rescue if self._fits(r, gpus)), lay)
        self._memo[key] = got
        return got


def _tokens(n: int) -> str:
    """A token count as the labels write it: ``16k`` for a whole number of 1,024s, else the
    count (a user's 10-token micro-batch read "mb0k")."""
    return f"{n // 1024}k" if n % 1024 == 0 else str(n)


def layout_label(lay: TrainLayout) -> str:
    """``train tp1 pp1 cp1 mb16k`` and whatever differs from the safe rung's defaults."""
    parts = [f"train tp{lay.tp} pp{lay.pp} cp{lay.cp}"]
    if lay.ring_attention:
        parts.append("ring")
    if lay.virtual_stages > 1:
        parts.append(f"vpp{lay.virtual_stages}")
    fwd = lay.forward_max_tokens_per_microbatch
    parts.append(f"mb{_tokens(lay.max_tokens_per_microbatch or 0)}" + (f"/fwd{_tokens(fwd)}" if fwd else ""))
    if lay.zero_stage != 3:
        parts.append(f"zero{lay.zero_stage}")
    if lay.recompute != "full":
        parts.append(f"recompute {lay.recompute}")
    if lay.offload_optimizer or lay.offload_params:
        parts.append("offload " + "+".join(w for w, on in (("params", lay.offload_params), ("optimizer", lay.offload_optimizer)) if on))
    return " ".join(parts)


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
            # Not with filtered rounds (GenerationRounds.allows_streaming: no steady state).
            if rounds.allows_streaming:
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
    rungs = MemoryRungs(sc)
    # A critic of another model (PPO's critic_model) gets its own rung of the same layout.
    critic = MemoryRungs(sc, "critic") if "critic" in sc.algorithm.roles and sc.models["critic"] != sc.models["actor"] else None
    n_responses = sc.workload.prompts_per_step * sc.workload.group_size
    fine = opts.fine_splits_at_gpus == sc.cluster.num_gpus
    # The modes of a colocated and of a split placement, made once (frozen values): every
    # candidate of a kind shares them, and whether its rollout calls stop early.
    mode_sets = {split: [(mode, mlabel, mode_of(mode).stop_after_finished(n_responses) is not None)
                         for mode, mlabel in modes(sc, split, opts)] for split in (False, True)}
    for eng in engines:
        try:  # weights and workspace alone overflow the engine's budget: no placement helps
            check_kv_capacity(inference_memory(sc.models["actor"], eng, sc.cluster.accelerator.device_memory_bytes), "engine")
        except SpecError as err:
            yield Rejected(f"rollout engine tp{eng.tp} pp{eng.pp}", str(err))
            continue
        # A call that stops at the first B·G finished responses keeps the long ones in flight
        # (the short ones leave), so the mean length overstates what its KV cache holds: it
        # keeps the scenario's max_num_seqs (README scenario, 32+32 streaming: 136.1 s at 256,
        # 145.0 s at 512).
        stopping = eng.model_copy(update={"max_num_seqs": base.rollout.max_num_seqs})
        for place, plabel in placements(sc, eng.tp * eng.pp, fine):
            split = place.kind != "colocated"
            pools, assign = place.resolve(sc.cluster.num_gpus)
            train_gpus = next(p.num_gpus for p in pools if p.name == assign["actor"])
            for b in layouts:
                lay = rungs.fitted(b, train_gpus)
                roles = {"actor": lay}
                if critic is not None and (c := critic.fitted(b, train_gpus)) != lay:
                    roles["critic"] = c
                for mode, mlabel, stops in mode_sets[split]:
                    e = stopping if stops else eng
                    plan = base.model_copy(update={
                        "placement": place,
                        "rollout": e,
                        "layouts": roles,
                        "mode": mode,
                    })
                    seqs = f" seqs{e.max_num_seqs}" if e.max_num_seqs != base.rollout.max_num_seqs else ""
                    crit = f"; critic {layout_label(roles['critic'])[6:]}" if "critic" in roles else ""
                    gen = f"gen tp{e.tp}" + (f" pp{e.pp}" if e.pp > 1 else "") + seqs
                    yield Candidate(plan, f"{plabel} | {gen} | {layout_label(lay)}{crit} | {mlabel}")


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
