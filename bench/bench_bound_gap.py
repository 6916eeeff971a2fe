"""Benchmark (issue 17): the best plan against its work-depth bound on every shipped scenario and
at 1,024 GPUs, and the term the report names when it is not within 1.2x.

Each question is ``rlperf plan --jobs 1 --json`` in a child process (``-s NAME`` for a shipped
scenario, default options; the 1,024-GPU question of bench/bench_plan_questions.py); the figures
come from its JSON: the best plan's simulated step, its simulated work-depth bound and their
ratio (``explanation.bound_gap``), and the largest term past the bound (rlperf.plan.gap). The
child's CPU seconds and the load average are printed beside them.

Run: .venv/bin/python bench/bench_bound_gap.py [TEXT ...]   (only the questions containing a TEXT)
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
from pathlib import Path

SCENARIOS = Path(__file__).resolve().parent.parent / "src/rlperf/scenarios"
GOAL = 1.2


def questions() -> list[tuple[str, list[str]]]:
    out = [(p.stem, ["-s", p.stem]) for p in sorted(SCENARIOS.glob("*.yaml"))]
    out.append(("1,024 H100, Qwen2.5-32B DAPO workload", ["--model", "Qwen2.5-32B", "--nodes", "128",
                                                          "--workload", "dapo-qwen2.5-32b"]))
    return out


def main() -> None:
    only = sys.argv[1:]
    print("| question | CPU-s (load) | best plan | step | bound | best / bound | what keeps it away |")
    print("|---|---|---|---|---|---|---|")
    for label, args in questions():
        if only and not any(t in label for t in only):
            continue
        load = os.getloadavg()[0]
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        p = subprocess.run([sys.executable, "-c", "from rlperf.cli.app import main; main()", "plan", "--jobs", "1",
                            "--json", *args], capture_output=True, text=True)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
        if p.returncode != 0:
            print(f"| {label} | {cpu:.1f} ({load:.1f}) | error: {(p.stderr.strip().splitlines() or ['?'])[-1]} |||||", flush=True)
            continue
        doc = json.loads(p.stdout)
        best = doc["best"]
        gap = doc.get("explanation", {}).get("bound_gap")
        if gap is None:
            print(f"| {label} | {cpu:.1f} ({load:.1f}) | {best['label']} | {best['step_time_s']:.1f} s | - | - | no bound_gap |",
                  flush=True)
            continue
        ratio = gap["ratio"]
        term = gap["terms"][0] if gap["terms"] else None
        why = "within 1.2x" if ratio is not None and ratio <= GOAL else (
            f"{term['kind']}: {term['seconds']:.1f} s ({term['detail']})" if term else "(no term named)")
        print(f"| {label} | {cpu:.1f} ({load:.1f}) | {best['label']} on {best['num_gpus']} GPUs | {best['step_time_s']:.1f} s "
              f"| {gap['bound_s']:.1f} s ({gap['bound_term']}) | {ratio:.2f}x | {why} |", flush=True)


if __name__ == "__main__":
    main()
