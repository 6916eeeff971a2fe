"""Timelines in the Chrome trace event format (opens in Perfetto and chrome://tracing).

Format: https://docs.google.com/document/d/1CvAClvFfyA5R-PhYUmn5OOQtYMH4h6I0nSsKchNAySU
("Trace Event Format"): complete events ``ph: "X"`` with ``ts``/``dur`` in microseconds, and
metadata events ``ph: "M"`` naming processes (one per GPU pool) and threads (one per track:
the pool itself, or a rollout replica inside it).
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from rlperf.sim.kernel import Segment


def chrome_trace(segments: Iterable[Segment], title: str = "rlperf") -> dict[str, Any]:
    segs = list(segments)
    pools: dict[str, int] = {}
    tracks: dict[str, tuple[int, int]] = {}
    for s in segs:
        pool = s.track.split("/", 1)[0]
        pid = pools.setdefault(pool, len(pools) + 1)
        if s.track not in tracks:
            tracks[s.track] = (pid, sum(1 for t in tracks.values() if t[0] == pid) + 1)
    events: list[dict[str, Any]] = []
    for pool, pid in pools.items():
        events.append({"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": f"pool {pool}"}})
    for track, (pid, tid) in tracks.items():
        events.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": track}})
    for s in segs:
        pid, tid = tracks[s.track]
        args: dict[str, Any] = {"iteration": s.iteration, "gpus": s.gpus}
        args.update({k: v for k, v in s.args})
        events.append({
            "name": s.name,
            "cat": s.name.split("/", 1)[0],
            "ph": "X",
            "ts": round(s.start_s * 1e6, 3),
            "dur": round(max(0.0, s.end_s - s.start_s) * 1e6, 3),
            "pid": pid,
            "tid": tid,
            "args": args,
        })
    return {"traceEvents": events, "displayTimeUnit": "ms", "otherData": {"title": title}}


def write_chrome_trace(path: str | Path, segments: Iterable[Segment], title: str = "rlperf") -> Path:
    from rlperf.outputs import dumps_strict, write_text

    return write_text(path, dumps_strict(chrome_trace(segments, title), separators=(",", ":"), sort_keys=True))
