"""Benchmark (issue 17): CPU seconds of whole `rlperf plan` questions, as a user runs them.

Each question runs the CLI in a child process (search, what-ifs and rendering included) with
``--jobs 1`` and ``--json``; the CPU time is the child's user + system time
(``resource.getrusage(RUSAGE_CHILDREN)``), which the machine's load does not inflate the way
it inflates wall time. The load average is printed beside it.

Run: .venv/bin/python bench/bench_plan_questions.py [--skip-1024 | --only-from | --only TEXT] [--bytecode]
[--trees DIR,DIR,...] [--rounds N]
(``--only TEXT``: the questions whose label contains TEXT)

Comparing trees: CPU-s on a shared machine move by tens of percent from minute to minute, so two
trees are compared in the same minutes. ``--trees A,B`` runs each question in every tree (the
child's ``PYTHONPATH`` set to ``DIR/src``), one tree after the other, question by question;
``--rounds N`` repeats the whole, and a summary gives each question's CPU-s per tree (every
round, the median and the least). Each tree's numba cache must be warm (a first run compiles).

Byte code: the child inherits this shell's environment. Where ``PYTHONDONTWRITEBYTECODE`` is set
(the build machine sets it), no ``.pyc`` is ever written, so every run compiles rlperf's sources
again (~0.1 CPU-s of ~120 modules); an installed rlperf, or a source checkout run without that
variable, compiles them once. ``--bytecode`` measures that case: the child may cache byte code
(in a temporary ``PYTHONPYCACHEPREFIX``, not in the tree) and one small unmeasured question
fills the cache first (the ``--from`` question's importer modules compile in its measured run).
The first line printed says which case was measured; the second, where the simulator's loops
come from (``RLPERF_LOOPS=jit`` in the environment measures numba's run-time compile instead of
the extension built at install).
"""

from __future__ import annotations

import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

QUESTIONS: list[tuple[str, list[str]]] = [
    ("README main job (GRPO Qwen2.5-7B, 8x8 H100)", []),
    ("4 nodes, Qwen3-8B", ["--model", "Qwen3-8B", "--nodes", "4"]),
    ("16 nodes, Qwen2.5-32B PPO", ["--model", "Qwen2.5-32B", "--nodes", "16", "--algorithm", "PPO"]),
    ("128 nodes (1,024 H100), Qwen2.5-32B DAPO workload", ["--model", "Qwen2.5-32B", "--nodes", "128",
                                                          "--workload", "dapo-qwen2.5-32b"]),
    ("plan --from verl: DAPO Qwen2.5-32B recipe (128 GPUs)",
     ["--from", "verl", "tests/data/framework_corpus/verl/recipe/dapo/run_dapo_qwen2.5_32b.sh"]),
]

# A small question that imports the whole plan path.
WARM_UP = ["--model", "Qwen2.5-0.5B", "--nodes", "1", "--gpus-per-node", "4", "--prompts", "16", "--group-size", "4",
           "--max-response", "1024", "--top-k", "1"]


def run(args: list[str], env: dict[str, str] | None = None) -> tuple[float, float, dict[str, object]]:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", "from rlperf.cli.app import main; main()", "plan", "--jobs", "1", "--json", *args],
                         check=True, capture_output=True, text=True, env=env).stdout
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return cpu, wall, json.loads(out)


def option(name: str, default: str) -> str:
    return sys.argv[sys.argv.index(name) + 1] if name in sys.argv else default


def main() -> None:
    env = None
    if "--bytecode" in sys.argv:
        env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
        env["PYTHONPYCACHEPREFIX"] = tempfile.mkdtemp(prefix="rlperf-bench-pyc-")
    trees = [t for t in option("--trees", "").split(",") if t]
    envs: dict[str, dict[str, str] | None] = {"": env} if not trees else {
        t: {**(env if env is not None else os.environ), "PYTHONPATH": os.path.join(os.path.abspath(t), "src")} for t in trees}
    if env is not None:
        for e in envs.values():
            run(WARM_UP, e)  # fills the byte-code cache (and numba's, if empty); not measured
    cached = env is not None or not os.environ.get("PYTHONDONTWRITEBYTECODE")
    print("byte code: " + ("cached (compiled once)" if cached else "not cached (PYTHONDONTWRITEBYTECODE: compiled every run)"))
    for tree, e in envs.items():  # where the simulator's loops come from (rlperf.stages.jit)
        loops = subprocess.run([sys.executable, "-c", "from rlperf.stages.jit import implementation; print(implementation())"],
                               capture_output=True, text=True, env=e).stdout.strip() or "jit (before rlperf.stages.jit chose)"
        print(f"loops{' in ' + tree if tree else ''}: {loops} (aot: compiled at install; jit: numba at run time)")
    chosen = [(label, args) for label, args in QUESTIONS
              if not (("--skip-1024" in sys.argv and "128" in args) or ("--only-from" in sys.argv and "--from" not in args))
              and option("--only", "") in label]
    measured: dict[tuple[str, str], list[float]] = {}
    for _ in range(int(option("--rounds", "1"))):
        for label, args in chosen:
            for tree, tree_env in envs.items():
                load = os.getloadavg()[0]
                cpu, wall, doc = run(args, tree_env)
                measured.setdefault((label, tree), []).append(cpu)
                best = doc["best"]
                assert isinstance(best, dict)
                notes = "; ".join(str(n) for n in doc.get("notes", []))  # type: ignore[union-attr]
                where = f" [{tree}]" if tree else ""
                print(f"{label}{where}: {cpu:.1f} CPU-s ({wall:.1f} s wall, load {load:.1f}); best {best['label']} on "
                      f"{best['num_gpus']} GPUs, {best['step_time_s']:.0f} s/step\n  {notes}", flush=True)
    if trees or int(option("--rounds", "1")) > 1:
        print("\nCPU-s per question and tree: every round; median, least")
        for (label, tree), got in measured.items():
            print(f"  {label}{f' [{tree}]' if tree else ''}: {' / '.join(f'{x:.1f}' for x in got)}; "
                  f"median {statistics.median(got):.1f}, least {min(got):.1f}")


if __name__ == "__main__":
    main()
