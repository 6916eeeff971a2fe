"""Benchmark (issue 17): CPU seconds of ``rlperf plan --from verl`` on every real verl script and
shipped verl example, as a user runs them (goal: each under 30 CPU-s on 2 cores).

Each runs in a child process like bench/bench_plan_questions.py (``--jobs 1 --json``; the child's
user + system CPU time, the load average beside it). A script the importer refuses is listed
with its one-line error, not timed.

Run: .venv/bin/python bench/bench_from_verl.py [TEXT ...]   (only the paths containing a TEXT)
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SOURCES = [ROOT / "tests/data/framework_corpus/verl", ROOT / "src/rlperf/frameworks/examples"]


def configs() -> list[Path]:
    out = sorted(p for p in SOURCES[0].rglob("*.sh"))
    out += sorted(p for p in SOURCES[1].glob("verl_*") if p.suffix in (".yaml", ".sh"))
    return out


def main() -> None:
    only = sys.argv[1:]
    for path in configs():
        rel = path.relative_to(ROOT)
        if only and not any(t in str(rel) for t in only):
            continue
        load = os.getloadavg()[0]
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        p = subprocess.run([sys.executable, "-c", "from rlperf.cli.app import main; main()", "plan", "--jobs", "1",
                            "--json", "--from", "verl", str(path)], capture_output=True, text=True)
        wall = time.perf_counter() - t0
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
        if p.returncode != 0:
            err = (p.stderr.strip().splitlines() or ["?"])[-1]
            print(f"{rel}: refused in {cpu:.1f} CPU-s: {err}", flush=True)
            continue
        doc = json.loads(p.stdout)
        best = doc["best"]
        # The best plan against the framework defaults and the imported plan (never worse than a default).
        others = [o for o in [*doc["baselines"], doc.get("user_plan") or {}] if o.get("step_time_s")]
        vs = ", ".join(f"{o['label'].split(':')[0]} {o['step_time_s'] / best['step_time_s']:.2f}x" for o in others)
        print(f"{rel}: {cpu:.1f} CPU-s ({wall:.0f} s wall, load {load:.1f}); {best['num_gpus']} GPUs, "
              f"{best['step_time_s']:.0f} s/step, {best['label']} ({vs})", flush=True)


if __name__ == "__main__":
    main()
