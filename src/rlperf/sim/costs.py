"""The analytic stage costs of a resolved scenario, behind the simulator's StageCosts protocol.

Each call is given the number of GPUs the simulator granted; the layouts of the plan fix the
model-parallel degrees (tp, pp, cp, ep) and the data-parallel degree follows from the GPUs:
``dp = gpus // (tp·pp·cp)`` for training and forward passes, ``replicas = gpus // (tp·pp)``
for the rollout engine (the plan's ``replicas`` and ``dp`` fields are ignored here).

A pool of ``g`` GPUs is costed as its own cluster: one node when ``g`` fits in a node, else
``g / n`` nodes of ``n`` GPUs with ``n`` the largest divisor of ``g`` not above the node size.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
from collections.abc import Callable
from functools import lru_cache
from typing import TYPE_CHECKING, Literal

import numpy as np
from pydantic import BaseModel

from rlperf.memo import BoundedMemo
from rlperf.errors import SpecError
from rlperf.scenario import Scenario
from rlperf.sim.interface import GroupAdmission, RolloutBatch, RolloutOutcome
from rlperf.sim.kernel import Segment
from rlperf.specs.hardware import ROLLOUT_ONLY_FIELDS, SYNC_ONLY_FIELDS, Cluster
from rlperf.specs.model import ModelSpec
from rlperf.specs.parallel import EngineLayout, TrainLayout, check_engine_layout, check_train_layout
from rlperf.stages.base import StageCost
from rlperf.stages.rollout_requests import Dispatch
from rlperf.stages.rollout_result import RolloutResult
from rlperf.stages.shard import head_of

if TYPE_CHECKING:
    from rlperf.stages.rollout_step import StepModel


class AnalyticCosts:
    """``timeline=False``: rollouts carry no engine timeline segments (a planner reads step
    times only, and merging the segments of every engine step costs as much as a sixth of the
    rollout simulation); every figure is the same."""

    def __init__(self, sc: Scenario, timeline: bool = True) -> None:
        self.sc = sc
        self.timeline = timeline
        self.plan = sc.plan
        self._clusters: dict[int, Cluster] = {}
        for role in ("actor", "critic", "ref", "reward_model", "prm"):
            check_train_layout(sc.models[role], self.plan.layout_for(role), prefix=f"plan.layouts.{role}")
        check_engine_layout(sc.models["actor"], self.plan.rollout, prefix="plan.rollout")
        self._engine_cache: dict[int, tuple[EngineLayout, int]] = {}
        # The actor, the rollout pool's cluster and engine as JSON (rollout cache keys), per pool size.
        self._engine_keys: dict[int, tuple[str, str, str]] = {}
        # Per (role, pool size): its layout, and the model, cluster and layout as JSON (the stage
        # cache's key). A planner asks for the same role on the same pool at every batch of every
        # iteration; the layout and the three JSON texts are the same each time.
        self._pass_keys: dict[tuple[str, int], _PassKey] = {}

    # ------------------------------------------------------------------ resources
    def cluster(self, gpus: int) -> Cluster:
        c = self._clusters.get(gpus)
        if c is None:
            c = self.sc.cluster.with_gpus(gpus)  # packed node by node (NVL72: 72-GPU domains)
            self._clusters[gpus] = c
        return c

    def _pass_key(self, role: str, gpus: int) -> _PassKey:
        got = self._pass_keys.get((role, gpus))
        if got is None:
            lay = self._train_layout(role, gpus)
            cluster = self.cluster(lay.world_size)
            got = self._pass_keys[role, gpus] = _PassKey(
                lay, cluster, self.sc.models[role].model_dump_json(), _cluster_key(cluster, _TRAIN_IGNORES),
                lay.model_dump_json())
        return got

    def _train_layout(self, role: str, gpus: int) -> TrainLayout:
        lay = self.plan.layout_for(role)
        mp = lay.tp * lay.pp * lay.cp
        dp = gpus // mp
        if dp < 1:
            raise SpecError(f"plan.layouts.{role}", f"tp·pp·cp = {mp} exceeds the {gpus} GPUs of its pool")
        out = lay.model_copy(update={"dp": dp})
        if err := out.expert_grid_error():
            raise SpecError(f"plan.layouts.{role}.ep", f"{err} on {gpus} GPUs")
        if out.compute_dtype not in self.sc.cluster.accelerator.peak_flops:
            raise SpecError(
                f"plan.layouts.{role}.compute_dtype",
                f"{self.sc.cluster.accelerator.id} has no {out.compute_dtype} tensor throughput",
                ", ".join(sorted(self.sc.cluster.accelerator.peak_flops)),
            )
        return out

    def _engine(self, gpus: int) -> EngineLayout:
        lay = self.plan.rollout
        replicas = gpus // (lay.tp * lay.pp)
        if replicas < 1:
            raise SpecError("plan.rollout", f"tp·pp = {lay.tp * lay.pp} exceeds the {gpus} rollout GPUs")
        return lay.model_copy(update={"replicas": replicas})

    def min_gpus(self, key: str) -> int:
        if key == "generate":
            return self.plan.rollout.tp * self.plan.rollout.pp
        lay = self.plan.layout_for(key)
        return lay.tp * lay.pp * lay.cp

    def device_memory_bytes(self) -> float:
        return self.sc.cluster.accelerator.device_memory_bytes

    def engine_memory_bytes(self, gpus: int) -> float:
        # The engine pre-allocates gpu_memory_utilization of the device's memory (the total CUDA
        # reports, Accelerator.device_memory_bytes) for weights, workspace and KV.
        return self.plan.rollout.gpu_memory_utilization * self.device_memory_bytes()

    # ------------------------------------------------------------------ stages
    def rollout(self, batch: RolloutBatch, gpus: int, token_budget: int | None,
                stop_after_finished: int | None = None, groups: GroupAdmission | None = None,
                kv_cached: np.ndarray | None = None) -> RolloutOutcome:
        from rlperf.stages.rollout import RolloutOptions, RolloutRequests, simulate_rollout

        engine = self._engine(gpus)
        used = engine.num_gpus
        model, cluster = self.sc.models["actor"], self.cluster(used)
        stop = stop_after_finished if stop_after_finished is not None and stop_after_finished < batch.num_requests else None
        # Group admission: a gate that admits every group, or a stop at the last group, is none.
        in_flight = stop_groups = None
        dispatch: Dispatch = "round_robin" if groups is None else groups.dispatch
        if groups is not None:
            num_groups = len(np.unique(batch.group_ids))
            if groups.in_flight(engine.replicas) < num_groups:
                in_flight = groups.in_flight(engine.replicas)
            if groups.stop_after_groups is not None and groups.stop_after_groups < num_groups:
                stop_groups = groups.stop_after_groups
        keys = self._engine_keys.get(gpus)
        if keys is None:
            keys = self._engine_keys[gpus] = (model.model_dump_json(), _cluster_key(cluster, SYNC_ONLY_FIELDS),
                                              engine.model_dump_json())
        key = _rollout_key(*keys, batch, token_budget, stop, in_flight, stop_groups, dispatch, kv_cached)
        r = _ROLLOUTS.get(key)
        if r is None:
            reqs = RolloutRequests.build(batch.prompt_tokens, batch.target_tokens, batch.group_ids, batch.generated_tokens,
                                         kv_cached=kv_cached)
            opts = RolloutOptions(token_budget_per_request=token_budget, stop_after_num_finished=stop,
                                  max_groups_in_flight=in_flight, stop_after_num_groups=stop_groups,
                                  dispatch=dispatch)
            r = simulate_rollout(model, cluster, engine, reqs, opts, step=_step_model(keys, model, cluster, engine))
            _remember(key, r)
        # A call stopped after k finished requests: its depth (computed for every request's full
        # length) is capped at the stop time, the chain it actually ran.
        depth_s = min(r.depth_s, r.makespan_s) if r.stopped_early else r.depth_s
        cost = StageCost(
            name="generate",
            time_s=r.makespan_s,
            num_gpus=used,
            work_s=r.work_s,
            depth_s=depth_s,
            flops=r.total_flops,
            hbm_bytes=r.total_hbm_bytes,
            peak_memory_bytes=self.engine_memory_bytes(used),
            breakdown=(("decode_depth", r.decode_depth_s), ("tail", r.tail_s)),
        )
        segs = _merge_segments(r.segments, engine.gpus_per_replica) if self.timeline else ()
        return RolloutOutcome(
            cost=cost,
            finish_s=np.asarray(r.finish_time_s, dtype=np.float64),
            generated_tokens=np.asarray(r.generated_tokens, dtype=np.int64),
            replica_finish_s=np.asarray(r.replica_finish_s, dtype=np.float64),
            gpus_per_replica=engine.gpus_per_replica,
            tail_s=r.tail_s,
            segments=segs,
        )

    def forward(self, role: str, seq_tokens: np.ndarray, gpus: int, name: str) -> StageCost:
        from rlperf.stages.forward import forward_pass

        k = self._pass_key(role, gpus)
        lay, cluster, model = k.layout, k.cluster, self.sc.models[role]
        head = head_of(role)
        # Keyed without the stage's name: the old-policy and the reference log-probs of one batch
        # are one pass of the same model and layout (the name is set on the shared result).
        got = _memo_stage(("forward", k.model_json, k.cluster_json, k.layout_json, _digest(seq_tokens), head),
                          lambda: forward_pass(model, cluster, lay, seq_tokens, name=name, head=head))
        return got if got.name == name else dataclasses.replace(got, name=name)

    def train(self, role: str, seq_tokens: np.ndarray, gpus: int, name: str,
              num_minibatches: int | None = None) -> StageCost:
        from rlperf.stages.train import train_step

        k = self._pass_key(role, gpus)
        lay, cluster, model = k.layout, k.cluster, self.sc.models[role]
        mb, ep = num_minibatches or self.sc.minibatches, self.sc.epochs
        return _memo_stage(("train", k.model_json, k.cluster_json, k.layout_json, _digest(seq_tokens), name, mb, ep),
                           lambda: train_step(model, cluster, lay, seq_tokens, num_minibatches=mb, epochs=ep, name=name,
                                              head=head_of(role)))

    def reward(self, seq_tokens: np.ndarray, gpus: int) -> StageCost:
        spec = self.sc.spec.algorithm.reward
        n = len(seq_tokens)
        if spec.kind == "model":
            return self.forward("reward_model", seq_tokens, gpus, "reward")
        if spec.kind == "rule":
            # n verifications on w CPU workers: ceil(n / w) rounds of cpu_s_per_sample.
            # Work is in CPU-seconds here (the simulator keeps CPU stages out of the GPU bound).
            t = math.ceil(n / spec.cpu_workers) * spec.cpu_s_per_sample
            return StageCost("reward", t, spec.cpu_workers, work_s=n * spec.cpu_s_per_sample,
                             depth_s=spec.cpu_s_per_sample if n else 0.0)
        lat = _sandbox_latencies(n, spec.sandbox_median_s, spec.sandbox_sigma)
        t = _list_schedule_makespan(lat, spec.cpu_workers)
        return StageCost("reward", t, spec.cpu_workers, work_s=float(lat.sum()), depth_s=float(lat.max(initial=0.0)))

    def weight_sync(self, rollout_gpus: int, train_gpus: int, same_pool: bool) -> StageCost:
        from rlperf.stages import weight_sync as ws

        actor = self.sc.models["actor"]
        lay = self._train_layout("actor", train_gpus)
        engine = self._engine(rollout_gpus)
        if same_pool:
            return ws.reshard_colocated(actor, self.cluster(train_gpus), lay, engine, sync=self.plan.weight_sync)
        return ws.broadcast_disaggregated(actor, self.cluster(rollout_gpus + train_gpus), lay, engine,
                                          sync=self.plan.weight_sync)

    def phase_switch(self, gpus: int, to: Literal["rollout", "train"]) -> StageCost:
        from rlperf.stages import weight_sync as ws

        lay = self._train_layout("actor", gpus)
        return ws.offload_switch(self.sc.models["actor"], self.cluster(gpus), lay, to=to)


@dataclasses.dataclass(frozen=True)
class _PassKey:
    """A role's training layout on a pool of GPUs, its cluster, and the three as the stage cache's
    key (JSON: the specs themselves are not hashable)."""

    layout: TrainLayout
    cluster: Cluster
    model_json: str
    cluster_json: str
    layout_json: str


# Rollouts already simulated in this process, by everything they depend on: a planner asks for
# the same rollout from its fast estimate and again in the first simulated iteration of the
# plans it shortlists (the same workload sample, engine and GPUs). Results are immutable
# (read-only arrays), so sharing one is safe.
# (model, cluster, engine, hash of the batch, token budget, stop after k finished)
_RolloutKey = tuple[str, str, str, bytes, int | None, int | None, int | None, int | None, str]
_ROLLOUTS: BoundedMemo[_RolloutKey, RolloutResult] = BoundedMemo(32)


# Rollout step models by what they are built from (the actor, the cluster less its sync-only
# figures and the engine, as in a rollout's key): every rollout call of one engine shares its
# step model, whose memoized per-run coefficients (communication, sampler, flat parts) then
# carry over from call to call; a StepModel's figures never change once built.
_STEPS: BoundedMemo[tuple[str, str, str], StepModel] = BoundedMemo(64)


def _step_model(keys: tuple[str, str, str], model: ModelSpec, cluster: Cluster, engine: EngineLayout) -> StepModel:
    from rlperf.stages.rollout_step import StepModel

    return _STEPS.get_or_make(keys, lambda: StepModel.build(model, cluster, engine, engine.cuda_graphs))


# Forward and training stage costs by everything they read: plans that differ only in their
# rollout engine or execution mode train the same batch under the same layout, and a planner
# simulates many such plans. StageCost is frozen, so sharing one is safe.
_STAGES: BoundedMemo[tuple[object, ...], StageCost] = BoundedMemo(1024)


def _digest(a: np.ndarray) -> bytes:
    arr = np.ascontiguousarray(a, dtype=np.int64)
    return hashlib.sha256(arr.size.to_bytes(8, "little") + arr.tobytes()).digest()[:16]


_TRAIN_IGNORES = SYNC_ONLY_FIELDS | ROLLOUT_ONLY_FIELDS


def _cluster_key(cluster: Cluster, ignore: frozenset[str]) -> str:
    """The cluster as a cache key, without the profile fields the stage never reads: a
    calibration that moves only the sync (or engine) figures reuses the other stages. pydantic's
    own JSON writer (fields in declaration order; 17 µs against 64 for a dump re-encoded by
    ``json``, asked for by every stage cost the planner looks up: ~1,800 times a question)."""
    return cluster.model_dump_json(exclude={"profile": set(ignore)})


def _memo_stage(key: tuple[object, ...], fn: Callable[[], StageCost]) -> StageCost:
    # Pydantic specs go into the key by their JSON: hashing a spec with a dict field fails.
    k = tuple(x.model_dump_json() if isinstance(x, BaseModel) else x for x in key)
    return _STAGES.get_or_make(k, fn)


def _rollout_key(model: str, cluster: str, engine: str, batch: RolloutBatch,
                 token_budget: int | None, stop: int | None, in_flight: int | None = None,
                 stop_groups: int | None = None, dispatch: Dispatch = "round_robin",
                 kv_cached: np.ndarray | None = None) -> _RolloutKey:
    # SHA-256 (16 bytes of it): about twice blake2b's speed where the CPU has SHA instructions
    # (x86 SHA-NI, ARMv8), and the arrays are a question's largest hashed input (~60 MB).
    h = hashlib.sha256()
    for a in (batch.prompt_tokens, batch.target_tokens, batch.generated_tokens, batch.group_ids):
        arr = np.ascontiguousarray(a, dtype=np.int64)
        h.update(arr.size.to_bytes(8, "little"))
        h.update(arr.tobytes())
    if kv_cached is not None and kv_cached.any():  # none cached hashes as before
        h.update(b"kv")
        h.update(np.packbits(np.asarray(kv_cached, bool)).tobytes())
    return model, cluster, engine, h.digest()[:16], token_budget, stop, in_flight, stop_groups, dispatch


def _remember(key: _RolloutKey, r: RolloutResult) -> None:
    for a in (r.finish_time_s, r.generated_tokens, r.replica_finish_s):
        if isinstance(a, np.ndarray):
            a.flags.writeable = False
    _ROLLOUTS.put(key, r)


def _merge_segments(segments: tuple, gpus_per_replica: int) -> tuple[Segment, ...]:  # type: ignore[type-arg]
    """Rollout timeline segments, merged per replica into runs of the same kind (a trace with one
    span per engine step would be huge); each keeps the mean batch size of its steps."""
    out: list[Segment] = []
    by_rep: dict[int, list] = {}  # type: ignore[type-arg]
    for s in segments:
        by_rep.setdefault(s.replica, []).append(s)
    for rep in sorted(by_rep):
        runs = by_rep[rep]
        cur = runs[0]
        start, end, kind = cur.start_s, cur.end_s, cur.kind
        wsum, tsum = cur.batch_size * (cur.end_s - cur.start_s), cur.end_s - cur.start_s
        for s in runs[1:]:
            gap = s.start_s - end
            if s.kind == kind and gap <= 1e-9 and (end - start) < 5.0:
                end = s.end_s
                wsum += s.batch_size * (s.end_s - s.start_s)
                tsum += s.end_s - s.start_s
                continue
            out.append(Segment(f"replica-{rep}", kind, start, end, gpus_per_replica, 0, (("mean_batch", wsum / tsum if tsum else 0.0),)))
            start, end, kind = s.start_s, s.end_s, s.kind
            wsum, tsum = s.batch_size * (s.end_s - s.start_s), s.end_s - s.start_s
        out.append(Segment(f"replica-{rep}", kind, start, end, gpus_per_replica, 0, (("mean_batch", wsum / tsum if tsum else 0.0),)))
    return tuple(out)


@lru_cache(maxsize=64)
def _sandbox_cached(n: int, median_s: float, sigma: float) -> tuple[float, ...]:
    rng = np.random.default_rng([n, 7])
    return tuple(median_s * np.exp(sigma * rng.standard_normal(n)))


def _sandbox_latencies(n: int, median_s: float, sigma: float) -> np.ndarray:
    return np.asarray(_sandbox_cached(n, median_s, sigma))


def _list_schedule_makespan(latencies: np.ndarray, workers: int) -> float:
    """Greedy list scheduling of jobs in arrival order on ``workers`` identical workers."""
    if len(latencies) == 0:
        return 0.0
    import heapq

    free = [0.0] * min(workers, len(latencies))
    for lat in latencies:
        t = heapq.heappop(free)
        heapq.heappush(free, t + float(lat))
    return max(free)
