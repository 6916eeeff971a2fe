"""The work-depth model of an RL step: the symbolic taxonomy table and the numbers of a scenario.

Work ``W`` is everything that must be done (FLOPs, bytes moved, bytes communicated, expressed as
device-seconds at the roofline rate); depth ``D`` is the longest chain of dependent steps, i.e.
the time with unlimited devices. On ``P`` devices: ``max(W/P, D) <= T_P <= W/P + D`` (Brent
1974; Blelloch 1996). Average parallelism ``W/D`` says how many devices a stage can use at all:
decode has large ``W`` but depth ``max_i L_i`` steps, so beyond ``W/D`` devices adding GPUs
cannot shorten the rollout, only the tail techniques (partial rollout, async) change ``D``.

Notation of the symbolic table: ``P`` parameters (active for MoE), ``N = B*G`` responses,
``L_p`` prompt and ``L_r,i`` response lengths, ``L = L_p + L_r``, ``n_l`` layers, ``h`` hidden
size, ``e`` epochs, ``M`` mini-batches, ``d/t/p/c/x`` the dp/tp/pp/cp/ep degrees, ``m``
micro-batches, ``s`` staleness bound, ``b`` bytes per element, ``t_l`` minimal per-layer latency.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SymbolicRow:
    what: str
    work: str
    depth: str
    communication: str
    memory_per_device: str


STAGES: tuple[SymbolicRow, ...] = (
    SymbolicRow("rollout: prefill", "2P·B·L_p (+ attention 2·n_l·h·L_p²) with prefix sharing", "n_l·t_l per chunk",
                "TP: 2 all-reduces/layer of chunk·h·b", "weights/t + KV of admitted requests"),
    SymbolicRow("rollout: decode", "2P·Σ L_r,i FLOPs; bytes: weights per step + Σ ctx·kv_bytes", "max_i L_r,i · n_l·t_l",
                "TP: 2 all-reduces/layer/step of batch·h·b", "weights/t + KV ≤ capacity"),
    SymbolicRow("reward (rule / sandbox)", "N verifications (CPU)", "max_i latency_i", "none", "host"),
    SymbolicRow("reward model / ref / old log-probs / values", "2P·N·L each (forward, teacher forcing)", "n_l·t_l per micro-batch",
                "as training forward", "weights (+shards) + one micro-batch of activations + logits N·L·V"),
    SymbolicRow("advantage (GAE / group stats)", "O(N·L_r) elementwise", "L_r (GAE reverse scan) or log G (group)", "none", "negligible"),
    SymbolicRow("training (actor, critic, PRM)", "(6P, 8P with recompute)·N·L·e", "e·M optimizer steps · (fwd+bwd through n_l layers)",
                "grad reduce-scatter/all-reduce of P per step", "16P/d (ZeRO-3) + activations"),
    SymbolicRow("weight sync", "2P bytes (bf16)", "one collective: log p steps (tree) or bytes/bw", "2P bytes to every rollout replica",
                "a second copy of the weights during the transfer"),
)

STRATEGIES: tuple[SymbolicRow, ...] = (
    SymbolicRow("data parallel (ZeRO-0..3 / FSDP)", "W/d per device", "unchanged (+ log d for the all-reduce)",
                "2(d-1)/d·P·b per step (ring all-reduce); ZeRO-3 adds 2 all-gathers of P", "16P (ZeRO-0) → 4P+12P/d (1) → 2P+14P/d (2) → 16P/d (3)"),
    SymbolicRow("tensor parallel (+ Megatron SP)", "W/t", "per-layer latency /t down to t_l", "4 collectives/layer of b·s·h·(t-1)/t (fwd), ×2 bwd",
                "P/t; activations /t with SP"),
    SymbolicRow("pipeline parallel (1F1B / interleaved)", "W/p", "+ bubble (p-1)/(m+p-1) (interleaved: /v)", "p2p b·s·h per micro-batch per boundary",
                "P/p; first stage holds p micro-batches in flight"),
    SymbolicRow("context parallel (ring / Ulysses)", "W/c", "sequence split: per-layer latency /c", "ring: (c-1)·KV block per layer; Ulysses: 4 all-to-alls/layer of s·h/c",
                "activations /c"),
    SymbolicRow("expert parallel", "expert W/x", "unchanged", "2 all-to-alls per MoE layer of tokens·k·h·b", "experts /x"),
    SymbolicRow("rollout replicas (engine dp)", "decode W/replicas", "max_i L_r,i per replica (the tail)", "none", "full engine per replica"),
    SymbolicRow("colocation (time sharing)", "W unchanged", "stages serialize: Σ stage depths", "reshard P per phase switch", "max over phases (with offload)"),
    SymbolicRow("disaggregation", "W unchanged", "rollout ∥ training only across iterations", "broadcast 2P bytes per step", "each pool its own models"),
    SymbolicRow("async (staleness s) / one-step off", "W unchanged", "per step ≥ D_iter/(s+1)", "as disaggregation", "s+1 policy versions in flight"),
    SymbolicRow("streaming (threshold τ, requests interrupted at each sync)", "W unchanged (+ re-prefill of resumed KV)",
                "no rollout tail: a call ends when B·G responses finished", "as disaggregation (in-flight updates: off the rollout GPUs)",
                "(1+τ)·B·G requests' KV in flight"),
    SymbolicRow("partial rollout (budget β)", "W unchanged (+ re-prefill of carried KV)", "decode depth per step ≤ β", "none", "carried requests' KV"),
    SymbolicRow("stage fusion", "W unchanged", "forward-only passes overlap the rollout tail", "none", "engine and trainer share memory"),
)


@dataclass(frozen=True)
class StageBounds:
    """Work-depth numbers of one stage of a concrete scenario (steady-state mean per step)."""

    stage: str
    pool: str
    num_gpus: int  # P: the GPUs of the stage's pool
    flops: float
    work_s: float  # W, device-seconds at roofline
    depth_s: float  # D, seconds with unlimited devices
    parallelism: float  # W/D
    lower_bound_s: float  # max(W/P, D)
    brent_bound_s: float  # W/P + D
    predicted_s: float  # the simulated time of the stage on its pool


@dataclass(frozen=True)
class WorkDepthReport:
    scenario: str
    num_gpus: int
    stages: tuple[StageBounds, ...]
    step_lower_bound_s: float
    step_predicted_s: float
    iteration_depth_s: float
    iteration_work_s: float


def analyze(sc: object) -> WorkDepthReport:
    """Numbers of the work-depth model for a scenario: one simulated steady-state step."""
    from rlperf.scenario import Scenario
    from rlperf.sim.run import run_scenario

    assert isinstance(sc, Scenario)
    # The scenario's own iterations, as `rlperf simulate` runs them: one number per question
    # (a shorter run samples other batches and gives another step time).
    r = run_scenario(sc)
    pools = {p.name: p.num_gpus for p in r.pools}
    rows = []
    for s in r.stages:
        p = pools.get(s.pool, max(s.gpus, 1))  # CPU stages: their workers
        par = s.work_s / s.depth_s if s.depth_s > 0 else float("inf")
        rows.append(StageBounds(s.name, s.pool, p, s.flops, s.work_s, s.depth_s, par,
                                max(s.work_s / p, s.depth_s), s.work_s / p + s.depth_s, s.time_s))
    return WorkDepthReport(sc.name, r.num_gpus, tuple(rows), r.bounds.lower_bound_s, r.step_time_s,
                           r.bounds.depth_s, r.bounds.work_s)
