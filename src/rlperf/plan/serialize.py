"""The planner's JSON output (schema: docs/plan.schema.json, version 1)."""

from __future__ import annotations

import math
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

from rlperf.plan.explain import Explanation
from rlperf.plan.memory_breakdown import RoleMemory, concrete_plan
from rlperf.plan.search import PlanEvaluation, PlanSearchResult

if TYPE_CHECKING:
    from rlperf.api import PlanAnswer

SCHEMA_VERSION = 1


def evaluation_json(e: PlanEvaluation) -> dict[str, Any]:
    sim = e.sim
    return {
        "label": e.label,
        "source": e.source,
        "num_gpus": e.num_gpus,
        "step_time_s": e.step_time_s,
        "estimated_step_time_s": e.estimate.step_time_s if e.estimate else None,
        "cost_usd_per_step": e.cost_usd_per_step,
        "staleness": e.staleness,
        "staleness_bound": e.plan.mode.effective_staleness,
        "tokens_per_s_per_gpu": sim.tokens_per_s_per_gpu if sim else None,
        "lower_bound_s": sim.bounds.lower_bound_s if sim else None,
        "stages": [{"name": s.name, "pool": s.pool, "time_s": s.time_s} for s in sim.stages] if sim else [],
        "pools": [
            {"name": p.name, "num_gpus": p.num_gpus, "utilization": p.utilization,
             "peak_memory_bytes": p.peak_memory_bytes, "capacity_bytes": p.capacity_bytes}
            for p in sim.pools
        ] if sim else [],
        "plan": concrete_plan(e.plan, e.num_gpus).model_dump(mode="json"),
        "error": e.error,
    }


def search_json(res: PlanSearchResult, explanation: Explanation | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION,
        "scenario": res.scenario,
        "num_gpus": res.num_gpus,
        "candidates_considered": res.considered,
        "candidates_rejected": len(res.rejected),
        "estimates_per_s": res.estimates_per_s if res.estimates_per_s != float("inf") else None,
        "elapsed_s": res.elapsed_s,
        "best": evaluation_json(res.best),
        "ranked": [evaluation_json(e) for e in res.evaluated],
        "baselines": [evaluation_json(e) for e in res.baselines],
        "user_plan": evaluation_json(res.user) if res.user else None,
        "pareto": [e.label + f" @ {e.num_gpus} GPUs" for e in res.pareto],
        "rejected": [{"label": r.label, "reason": r.reason} for r in res.rejected[:200]],
        "notes": list(res.notes),
    }
    if explanation is not None:
        out["explanation"] = {
            "headline": explanation.headline(),
            "lower_bound_s": explanation.lower_bound_s,
            "gap": explanation.gap,
            "bottlenecks": [{"kind": b.kind, "share": b.share, "detail": b.detail} for b in explanation.bottlenecks],
            "what_ifs": [
                {"change": w.change, "step_time_s": w.step_time_s if w.step_time_s != float("inf") else None,
                 "speedup": w.speedup, "staleness": w.staleness, "note": w.note}
                for w in explanation.what_ifs
            ],
        }
        g = explanation.bound_gap
        if g is not None:
            out["explanation"]["bound_gap"] = {
                "headline": g.headline(), "ratio": _num(g.ratio), "bound_s": g.bound_s, "bound_term": g.bound_term,
                "pool": g.pool, "terms": [{"kind": t.kind, "seconds": t.seconds, "detail": t.detail} for t in g.terms],
            }
    return out


def _num(v: float | None) -> float | None:
    return v if v is not None and math.isfinite(v) else None


def memory_json(rows: tuple[RoleMemory, ...]) -> list[dict[str, Any]]:
    return [{**asdict(r), "device_bytes": r.device_bytes, "fits": r.fits} for r in rows]


def answer_json(ans: PlanAnswer) -> dict[str, Any]:
    """The search's JSON plus what the answer adds: lengths, interval, run, sweep, memory, launch."""
    out = search_json(ans.search, ans.explanation)
    iv = ans.interval
    out["response_lengths"] = {"mean_tokens": ans.lengths.distribution.mean_tokens(),
                               "median_tokens": ans.lengths.distribution.quantile(0.5),
                               "cap_tokens": ans.lengths.distribution.cap_tokens,
                               "fraction_at_cap": ans.lengths.distribution.fraction_at_cap(),
                               "stated": ans.lengths.stated, "source": ans.lengths.source}
    out["step_time_interval"] = {"predicted_s": iv.predicted_s, "low_s": _num(iv.low_s), "high_s": _num(iv.high_s),
                                 "num_cases": iv.num_cases, "basis": iv.basis, "description": iv.describe(),
                                 "mean_range_tokens": list(iv.mean_range_tokens) if iv.mean_range_tokens else None}
    run = ans.run
    out["run"] = None if run is None else {
        "steps": run.steps, "num_gpus": run.num_gpus, "total_s": run.total_s, "hours": run.hours,
        "gpu_hours": run.gpu_hours, "cost_usd": run.cost_usd,
        "total_low_s": _num(run.interval.low_s), "total_high_s": _num(run.interval.high_s),
        "points": [asdict(p) for p in run.points], "step_times_s": list(run.step_times_s),
    }
    out["length_sweep"] = [asdict(p) for p in ans.sweep]
    out["memory"] = {"best": memory_json(ans.memory), "user_plan": memory_json(ans.user_memory)}
    out["framework"] = ans.framework
    out["launch"] = None if ans.launch is None else {
        "framework": ans.launch.framework, "command_line": ans.launch.command_line(), "args": list(ans.launch.args),
        "not_expressible": list(ans.launch.not_expressible), "notes": list(ans.launch.notes)}
    return out
