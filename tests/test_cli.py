"""The CLI surface: one-line errors with exit code 2, JSON outputs, the main job's options."""

from __future__ import annotations

import gc
import json
import os
from pathlib import Path

import pytest

from rlperf.cli.app import collector_paused, main

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "src" / "rlperf" / "frameworks" / "examples"
SMALL = ["--model", "Qwen2.5-0.5B", "--nodes", "1", "--gpus-per-node", "4", "--prompts", "16", "--group-size", "4",
         "--max-response", "1024", "--top-k", "1", "--jobs", "1"]
NO_CAP = [a for i, a in enumerate(SMALL) if "--max-response" not in SMALL[max(i - 1, 0): i + 1]]


def run(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    try:
        main(args)
        code = 0
    except SystemExit as ex:
        code = int(ex.code or 0)
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.mark.parametrize("args, field", [
    (["model", "show", "Qwen9-7B"], "model"),
    (["plan", "--model", "nosuch"], "model"),
    (["plan", "--objective", "speed"], "--objective"),
    (["simulate", "no-such-scenario"], "scenario"),
    (["hardware", "Z100"], "gpu"),
    # found by hand: an internal error (a 7 TiB array), a numpy message, a silent clamp to the cap
    (["plan", *SMALL, "--steps", "1000000000000"], "--steps"),
    (["plan", *SMALL, "--lengths", "2k,nan"], "--lengths"),
    (["plan", *SMALL, "--lengths", "1e9"], "--lengths"),
    (["plan", *SMALL, "--lengths", "500,5000"], "5,000 tokens is not below the response cap 1,024"),
    (["plan", *SMALL, "--median-response", "1e300"], "1e+300 tokens"),
    (["plan", *SMALL, "--length-preset", "nonsense"], "--length-preset: unknown name"),
    # read only by the import: without --from they were ignored, and a script planned the default
    (["plan", *SMALL, "run.sh"], "config: is read only with --from"),
    (["plan", *SMALL, "--model-config", "x.json"], "--model-config: is read only with --from"),
    (["plan", *SMALL, "--set", "N=1"], "--set: is read only with --from"),
    (["plan", *SMALL[2:], "--model", ""], "--model: is empty"),  # the default model answered
    (["plan", *SMALL, "--framework", " "], "--framework: is empty"),
    # with --from the config sets these; they were ignored and the import answered, silently
    (["plan", "--from", "verl", str(EXAMPLES / "verl_grpo_qwen2.5_7b.yaml"), "--prompts", "3"],
     "--prompts: is set by the framework config"),
    (["plan", "--from", "verl", str(EXAMPLES / "verl_grpo_qwen2.5_7b.yaml"), "--gpu", "Z100"], "gpu: unknown name 'Z100'"),
    # a mean of at most 1 token: refused late, as mean_tokens, and --lengths after the whole search
    (["plan", *NO_CAP, "--max-response", "3"], "--max-response: 3 tokens is too short for assumed response lengths"),
    (["plan", *SMALL, "--mean-response", "1.0"], "--mean-response: 1 tokens is not above 1"),
    (["plan", *SMALL, "--lengths", "1,2"], "--lengths: 1 tokens is not above 1"),
    (["plan", *SMALL, "--steps", "10", "--end-mean-response", "0"], "--end-mean-response: 0 tokens is not above 1"),
    (["plan", *SMALL, "--steps", "10", "--end-mean-response", "nan"], "--end-mean-response: nan tokens is not a number"),
    # output paths: an empty one wrote into the current folder; --force alone did nothing
    (["plan", *SMALL, "--report", ""], "--report: is empty"),
    (["plan", *SMALL, "--force"], "--force: is read only with --report"),
    (["simulate", "grpo-qwen2.5-7b-colocated-sync", "--out", ""], "--out: is empty"),
])
def test_bad_input_is_one_line_naming_the_field(args: list[str], field: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(args, capsys)
    assert code == 2
    lines = [x for x in err.splitlines() if x.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:") and field in lines[0], err
    assert "Traceback" not in err + out


def test_plan_json_has_best_baselines_and_user_plan(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(["plan", *SMALL, "--json"], capsys)
    assert code == 0
    doc = json.loads(out)
    assert doc["best"]["step_time_s"] > 0
    assert doc["user_plan"] is not None and doc["baselines"]
    for b in doc["baselines"]:
        assert doc["best"]["step_time_s"] <= b["step_time_s"] * (1 + 1e-9)
    assert "explanation" in doc and doc["explanation"]["what_ifs"]
    assert gc.isenabled()  # the collector, paused for the question, is back


def test_the_collector_pause_restores_the_setting_it_found() -> None:
    assert gc.isenabled()
    with pytest.raises(RuntimeError), collector_paused():
        assert not gc.isenabled()
        raise RuntimeError
    assert gc.isenabled()
    gc.disable()
    try:
        with collector_paused():
            pass
        assert not gc.isenabled()  # a caller that had it off keeps it off
    finally:
        gc.enable()


def test_plan_from_verl_predicts_the_users_config_beside_the_best(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(["plan", "--from", "verl", str(EXAMPLES / "verl_grpo_qwen2.5_7b.yaml"),
                        "-o", "trainer.nnodes=1", "-o", "data.train_batch_size=32", "-o", "actor_rollout_ref.actor.ppo_mini_batch_size=16", "--top-k", "1", "--jobs", "1", "--json"], capsys)
    assert code == 0, out
    doc = json.loads(out)
    user, best = doc["user_plan"], doc["best"]
    assert user["label"].startswith("your plan") and user["step_time_s"] > 0
    assert best["step_time_s"] <= user["step_time_s"] * (1 + 1e-9) or user["source"] == "user"
    assert doc["import_report"]


def test_python_dash_m_runs_the_registered_commands(tmp_path: Path) -> None:
    """``python -m rlperf.cli.app`` runs the file as ``__main__``, a second module object whose
    Typer has no commands (the ``*_cmd`` modules register on ``rlperf.cli.app``); it must still
    reach them (it failed with 'Could not get a command for this Typer instance')."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'src'}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    proc = subprocess.run([sys.executable, "-m", "rlperf.cli.app", "hardware", "Z100"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2, proc.stderr  # the hardware command ran and refused the GPU
    assert proc.stderr.startswith("error:") and "gpu" in proc.stderr and "internal error" not in proc.stderr


def test_an_infinite_end_of_the_step_range_reads_infeasible() -> None:
    # verl's DeepSeek-671B 80 GB script: the plan does not fit at the longer published mean; the
    # answer printed "(at published runs' lengths 3.4 min - inf h)".
    import math

    from rlperf.cli.render import fmt_range_end, fmt_s

    assert fmt_range_end(math.inf) == "infeasible at those lengths"
    assert fmt_range_end(204.0) == fmt_s(204.0)


def test_plan_from_reads_the_gpu_and_mean_response_options(capsys: pytest.CaptureFixture[str]) -> None:
    # Framework configs name no GPU: --gpu was ignored (H100 always), and so was --mean-response.
    args = ["plan", "--from", "verl", str(EXAMPLES / "verl_grpo_qwen2.5_7b.yaml"), "-o", "trainer.nnodes=1",
            "-o", "data.train_batch_size=32", "-o", "actor_rollout_ref.actor.ppo_mini_batch_size=16",
            "--top-k", "1", "--jobs", "1", "--json", "--gpu", "A100", "--mean-response", "300"]
    code, out, err = run(args, capsys)
    assert code == 0, err
    assert "a100" in out.lower() and "mean response length 300 tokens" in out


def test_numpy_gets_one_blas_thread_unless_the_user_set_one_or_torch_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    """rlperf's arrays never call BLAS; OpenBLAS's spinning worker threads only cost CPU time."""
    from rlperf.cli import app as cli_app

    monkeypatch.delenv("OPENBLAS_NUM_THREADS", raising=False)
    cli_app._one_blas_thread(["measure", "scenario.yaml"])  # the reference runtime: torch's choice
    assert "OPENBLAS_NUM_THREADS" not in os.environ
    cli_app._one_blas_thread(["plan"])
    assert os.environ["OPENBLAS_NUM_THREADS"] == "1"
    monkeypatch.setenv("OPENBLAS_NUM_THREADS", "4")
    cli_app._one_blas_thread(["plan"])
    assert os.environ["OPENBLAS_NUM_THREADS"] == "4"



def _small_scenario(tmp_path: Path, placement: dict[str, object] | None = None, **rollout: object) -> Path:
    import yaml

    doc = {"name": "small", "model": "Qwen2.5-0.5B", "cluster": {"gpu": "H100", "num_nodes": 1, "gpus_per_node": 4},
           "workload": {"prompts_per_step": 16, "group_size": 4, "prompt_length": {"kind": "fixed", "tokens": 256},
                        "response_length": {"kind": "lognormal", "median_tokens": 300, "sigma": 0.9, "cap_tokens": 1024}},
           "algorithm": {"name": "GRPO", "minibatches": 4},
           "plan": {"placement": placement or {"kind": "colocated"}, "rollout": {"tp": 1, **rollout},
                    "layouts": {"actor": {"tp": 1, "zero_stage": 3}}, "mode": {"kind": "sync"}}}
    path = tmp_path / "small.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def test_a_framework_that_runs_none_of_the_plans_is_an_error_not_the_users_plan(capsys: pytest.CaptureFixture[str]) -> None:
    # "120 candidates, 120 rejected", and the answer named the scenario's FSDP plan best, which
    # slime cannot run (it does not run ZeRO)
    code, out, err = run(["plan", *SMALL, "--framework", "slime"], capsys)
    assert code == 2 and "best:" not in out
    last = err.splitlines()[-1]  # after the search's progress lines
    assert last.startswith("error: --framework: no plan the framework runs is feasible on 4 GPUs (120 candidates): "
                           "slime does not run ZeRO"), err
    assert "Traceback" not in err


def test_a_users_plan_the_framework_runs_stays_the_answer_when_nothing_else_is_feasible(tmp_path: Path) -> None:
    from rlperf.api import build_scenario
    from rlperf.plan.search import local_mapper, search
    from rlperf.plan.space import SearchOptions
    from rlperf.specs.plan import Plan

    # a split no framework default uses (they split 2+2)
    sc, _ = build_scenario(_small_scenario(tmp_path, {"kind": "disaggregated", "rollout_gpus": 3}))

    class OnlyTheUsers:
        def why_not_plan(self, plan: Plan) -> str | None:
            return None if plan == sc.plan else "not the user's plan"

    res = search(sc, SearchOptions(top_k=1, plan_filter=OnlyTheUsers()), local_mapper(1), timeline=False)
    assert res.best.source == "user" and res.best.plan == sc.plan


def test_the_progress_line_shows_a_sub_second_step_in_milliseconds() -> None:
    # "best so far: ... 0 s/step" for a 320 ms step
    from rlperf.api import build_scenario
    from rlperf.plan.search import local_mapper, search
    from rlperf.plan.space import SearchOptions

    sc, _ = build_scenario(None, model="Qwen2.5-0.5B", nodes=1, gpus_per_node=4, prompts=4, group_size=2, max_response=64)
    lines: list[str] = []
    res = search(sc, SearchOptions(top_k=2), local_mapper(1), lambda what, done, total: lines.append(what), timeline=False)
    assert res.best.step_time_s < 1
    so_far = [x for x in lines if "best so far" in x]
    assert so_far and all(x.endswith(" ms/step") for x in so_far), so_far


def test_an_infeasible_plan_of_the_scenario_is_reported_under_its_field_beside_the_best(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # The search went on and answered, then the memory of the user's plan failed as "engine.tp".
    code, out, err = run(["plan", "-s", str(_small_scenario(tmp_path, tp=3)), "--top-k", "1", "--jobs", "1", "--json"], capsys)
    assert code == 0, err
    doc = json.loads(out)
    assert doc["best"]["step_time_s"] > 0
    assert doc["user_plan"]["error"].startswith("plan.rollout.tp: 3 GPUs cannot share")


def test_a_scenario_cap_too_short_for_assumed_lengths_names_the_file_field(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import yaml

    path = _small_scenario(tmp_path)
    doc = yaml.safe_load(path.read_text())
    doc["workload"]["response_length"].update(median_tokens=2, cap_tokens=4)
    path.write_text(yaml.safe_dump(doc))
    code, _, err = run(["plan", "-s", str(path), "--top-k", "1", "--jobs", "1"], capsys)
    assert code == 2
    assert err.splitlines() == [
        f"error: {path}:workload.response_length.cap_tokens: 4 tokens is too short for assumed response lengths "
        "(mean cap/3, step-time range down to cap/4: each must be above 1 token); allowed: >= 5, or state --mean-response "
        "(1 < mean < max response)"], err


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs Linux's /proc (no files can be made in it)")
@pytest.mark.parametrize("args", [["plan", *SMALL, "--report", "/proc/rlperf-report"],
                                  ["simulate", "grpo-qwen2.5-7b-colocated-sync", "--out", "/proc/rlperf-out"]])
def test_an_output_folder_that_cannot_be_written_is_refused_before_the_work(
        args: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    # os.access says yes to root anywhere: the plan ran, then failed with a bare "[Errno 2]"
    code, _, err = run(args, capsys)
    assert code == 2
    lines = err.splitlines()  # one line: no progress of a search first
    assert len(lines) == 1 and lines[0].startswith(f"error: {args[-2]}: cannot write in '/proc' ("), err
    assert lines[0].endswith("); allowed: a writable folder"), err
