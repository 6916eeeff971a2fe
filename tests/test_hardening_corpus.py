"""Regression corpus of issue 16: every bad input it lists gets one line and exit 2, nothing is
written outside ``--out``, nothing is left half-written, no input runs until killed.

Each case runs the command in-process with a time limit (tests/helpers/cli.py).
"""

from __future__ import annotations

import errno
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from rlperf.frameworks.load import load_framework_config
from tests.helpers.cli import assert_one_line_error, files_under, invoke
from tests.helpers.scenarios import SMALL_SCENARIO

EX = Path(__file__).resolve().parents[1] / "src" / "rlperf" / "frameworks" / "examples"
VERL = EX / "verl_grpo_qwen2.5_7b.yaml"
OPENRLHF = EX / "openrlhf_grpo_qwen2.5_7b_hybrid.sh"

# A small scenario (0.5B model, 8 GPUs, short responses): simulating it takes well under a second.
SMALL: dict[str, Any] = {"name": "small", **SMALL_SCENARIO, "simulation": {"iterations": 2, "warmup": 1}}


def small(**changes: Any) -> dict[str, Any]:
    """SMALL with dotted-path changes, e.g. ``small(**{"cluster.num_nodes": 0})``."""
    data = json.loads(json.dumps(SMALL))
    for path, value in changes.items():
        *parents, leaf = path.split(".")
        node = data
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = value
    return data


def write(path: Path, data: Any) -> Path:
    path.write_text(data if isinstance(data, str) else yaml.safe_dump(data, sort_keys=False))
    return path


def simulate_refused(tmp_path: Path, scenario: Path | str, contains: str = "") -> str:
    out = tmp_path / "out"
    res = invoke(["simulate", str(scenario), "--out", str(out)], time_limit_s=20)
    line = assert_one_line_error(res, contains=contains)
    assert files_under(out) == []
    return line


# ------------------------------------------------------------------------------ path traversal


@pytest.mark.parametrize("name", ["../../x", "../escape", "/tmp/rlperf-abs-x", "a/../../b", ".hidden", "..", "/"])
def test_scenario_name_cannot_escape_out(tmp_path: Path, name: str) -> None:
    work = tmp_path / "work"
    out = work / "out"
    sc = write(tmp_path / "sc.yaml", small(name=name))
    res = invoke(["simulate", str(sc), "--out", str(out), "--json"], time_limit_s=30)
    assert res.code == 0, res.err
    written = files_under(tmp_path)
    assert {p.parent for p in written if p != sc} == {out}, written
    assert len([p for p in written if p.parent == out]) == 2
    assert not Path("/tmp/rlperf-abs-x.result.json").exists()


def test_verl_experiment_name_cannot_escape_out(tmp_path: Path) -> None:
    spec, _ = load_framework_config("verl", VERL, ["trainer.experiment_name=../../evil"])
    assert spec.name == "../../evil"  # kept as written: it is a label; the writer sanitizes it
    from rlperf.outputs import safe_name

    assert "/" not in safe_name(spec.name) and not safe_name(spec.name).startswith(".")
    sc = tmp_path / "imported.yaml"
    res = invoke(["import", "verl", str(VERL), "trainer.experiment_name=../../evil", "--out", str(sc)])
    assert res.code == 0, res.err
    data = yaml.safe_load(sc.read_text())
    data.update({k: SMALL[k] for k in ("model", "cluster", "workload", "simulation")})
    data["plan"] = {"placement": {"kind": "colocated"}}
    write(sc, data)
    out = tmp_path / "a" / "b" / "out"
    res = invoke(["simulate", str(sc), "--out", str(out)], time_limit_s=30)
    assert res.code == 0, res.err
    assert {p.parent for p in files_under(tmp_path) if p != sc} == {out}


# ------------------------------------------------------------------------------ unbounded work


def alias_bomb(levels: int = 9, width: int = 9) -> str:
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x]"]
    for i in range(1, levels):
        lines.append(f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * width) + "]")
    lines.append("trainer: {n_gpus_per_node: 8, nnodes: 1, bomb: " + f"*a{levels - 1}" + "}")
    return "\n".join(lines) + "\n"


def test_verl_yaml_alias_bomb_is_refused_at_once(tmp_path: Path) -> None:
    bomb = write(tmp_path / "bomb.yaml", alias_bomb())
    assert bomb.stat().st_size < 3000
    res = invoke(["import", "verl", str(bomb)], time_limit_s=10)
    assert_one_line_error(res, contains="aliases")


def doubling(levels: int, line: str) -> str:
    return "A0=xxxxxxxxxxxxxxxx\n" + "".join(f'A{i}="$A{i - 1}$A{i - 1}"\n' for i in range(1, levels + 1)) + line + "\n"


@pytest.mark.parametrize(
    ("script", "contains"),
    [
        (doubling(40, "python3 -m verl.trainer.main_ppo trainer.nnodes=1 trainer.experiment_name=$A40"), "expands to over"),
        (doubling(12, "python3 -m verl.trainer.main_ppo trainer.nnodes=1" + " x=$A12" * 40), "the command line"),
        ("Y[999999999999]=1\npython3 -m verl.trainer.main_ppo trainer.nnodes=1\n", "array index"),
        ("X=$((2**99999999999 * 9**9**9**9))\npython3 -m verl.trainer.main_ppo trainer.nnodes=$X\n", ""),
    ],
    ids=["variable-doubling", "command-line", "array-index", "arithmetic-power"],
)
def test_shell_script_bombs_are_refused_at_once(tmp_path: Path, script: str, contains: str) -> None:
    sh = write(tmp_path / "run.sh", script)
    assert_one_line_error(invoke(["import", "verl", str(sh)], time_limit_s=10), contains=contains)


def test_hydra_defaults_that_fan_out_are_refused_at_once(tmp_path: Path) -> None:
    # Each level includes the next one 8 times: 8^7 files to compose before the depth limit.
    for level in range(1, 8):
        entries = "".join(f"  - l{level + 1}\n" for _ in range(8))
        (tmp_path / f"l{level}.yaml").write_text(f"defaults:\n{entries}x{level}: 1\n")
    (tmp_path / "l8.yaml").write_text("x8: 1\n")
    top = write(tmp_path / "top.yaml", "defaults:\n  - l1\n  - _self_\ntrainer: {nnodes: 1, n_gpus_per_node: 8}\n")
    assert_one_line_error(invoke(["import", "verl", str(top)], time_limit_s=10), contains="fan out")


@pytest.mark.parametrize(
    ("path", "value", "field"),
    [
        ("plan.mode", {"kind": "sync", "fusion": True, "fusion_chunks": 10**9}, "fusion_chunks"),
        ("cluster.num_nodes", 10**30, "num_nodes"),
        ("cluster.num_nodes", 1e30, "num_nodes"),
        ("cluster.gpus_per_node", 10**9, "gpus_per_node"),
        ("simulation.iterations", 2**63, "iterations"),
        ("plan.mode", {"kind": "partial_rollout", "token_budget": 2**63}, "token_budget"),
        ("workload.group_size", 10**9, "group_size"),
        ("workload.prompts_per_step", 10**12, "prompts_per_step"),
        ("algorithm.reward", {"kind": "rule", "cpu_s_per_sample": float("inf")}, "cpu_s_per_sample"),
        ("algorithm.reward", {"kind": "sandbox", "sandbox_median_s": float("inf")}, "sandbox_median_s"),
        ("algorithm.epochs", 1e30, "epochs"),
        ("workload.prompts_per_step", "1:30", "prompts_per_step"),
        ("workload", float("nan"), "workload"),
    ],
    ids=lambda v: str(v)[:24],
)
def test_huge_or_non_finite_scenario_values_are_one_line(tmp_path: Path, path: str, value: Any, field: str) -> None:
    sc = write(tmp_path / "sc.yaml", small(**{path: value}))
    simulate_refused(tmp_path, sc, contains=field)


def test_sexagesimal_is_a_string_not_ninety(tmp_path: Path) -> None:
    sc = write(tmp_path / "sc.yaml", yaml.safe_dump(small()).replace("prompts_per_step: 16", "prompts_per_step: 1:30"))
    line = simulate_refused(tmp_path, sc, contains="prompts_per_step")
    assert "integer" in line  # YAML 1.1 would have read 90 and accepted it


@pytest.mark.parametrize("iterations", ["1e27", str(2**63), "0", "-1", "100000"])
def test_iterations_option_is_bounded(tmp_path: Path, iterations: str) -> None:
    sc = write(tmp_path / "sc.yaml", small())
    res = invoke(["simulate", str(sc), "--out", str(tmp_path / "out"), "--iterations", iterations], time_limit_s=10)
    if iterations == "0":  # 0 = keep the scenario's
        assert res.code == 0, res.err
        return
    assert_one_line_error(res, contains="iterations")
    assert files_under(tmp_path / "out") == []


def test_hf_config_with_2_63_layers_is_one_line(tmp_path: Path) -> None:
    from tests.helpers.models import QWEN25_7B_CONFIG

    cfg = {**QWEN25_7B_CONFIG, "num_hidden_layers": 2**63}
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text(json.dumps(cfg))
    sc = write(tmp_path / "sc.yaml", small(model=str(tmp_path / "m")))
    simulate_refused(tmp_path, sc, contains="num_")


# ------------------------------------------------------------------------------ tracebacks


def test_directory_as_scenario(tmp_path: Path) -> None:
    (tmp_path / "d").mkdir()
    simulate_refused(tmp_path, tmp_path / "d", contains="directory")


def test_special_file_as_scenario(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)  # reading it would block forever: refused before it is opened
    simulate_refused(tmp_path, fifo, contains="not a regular file")
    simulate_refused(tmp_path, "/dev/null", contains="not a regular file")


def test_300_character_path(tmp_path: Path) -> None:
    line = simulate_refused(tmp_path, tmp_path / ("x" * 300 + ".yaml"))
    assert len(line) < 400


@pytest.mark.parametrize("text", ["a: " + "[" * 1000 + "]" * 1000, "a:\n" + "".join("  " * i + f"k{i}:\n" for i in range(1, 200))],
                         ids=["flow", "block"])
def test_deep_yaml(tmp_path: Path, text: str) -> None:
    simulate_refused(tmp_path, write(tmp_path / "deep.yaml", text), contains="nesting")


@pytest.mark.parametrize(
    ("text", "contains"),
    [
        ("name: [unclosed\n", "not valid YAML"),
        ("", "empty"),
        ("- a\n- b\n", "list"),
        ("workload: .nan\n", "workload"),
        ("name: a\nname: b\n", "duplicate key"),
        ("cluster: {num_nodes: 0}\nworkload: {preset: deepscaler-8k}\n", "num_nodes"),
    ],
    ids=["bad-yaml", "empty", "list", "nan-workload", "duplicate-key", "zero-nodes"],
)
@pytest.mark.parametrize("command", ["plan", "simulate"])
def test_plan_s_checks_like_the_other_commands(tmp_path: Path, text: str, contains: str, command: str) -> None:
    sc = write(tmp_path / "sc.yaml", text)
    args = ["plan", "-s", str(sc), "--report", str(tmp_path / "out")] if command == "plan" else ["simulate", str(sc), "--out", str(tmp_path / "out")]
    res = invoke(args, time_limit_s=15)
    line = assert_one_line_error(res, contains=contains)
    assert str(sc) in line  # the file is named
    assert files_under(tmp_path / "out") == []


@pytest.mark.parametrize(
    ("overrides", "key"),
    [
        (["actor_rollout_ref.rollout.tensor_model_parallel_size=0"], "actor_rollout_ref.rollout.tensor_model_parallel_size"),
        (["actor_rollout_ref.actor.ppo_mini_batch_size=0"], "actor_rollout_ref.actor.ppo_mini_batch_size"),
        (["actor_rollout_ref.actor.ulysses_sequence_parallel_size=0"], "actor_rollout_ref.actor.ulysses_sequence_parallel_size"),
        (["trainer.n_gpus_per_node=0"], "trainer.n_gpus_per_node"),
        (["trainer.nnodes=0"], "trainer.nnodes"),
        (["actor_rollout_ref.rollout.n=1000000000"], "actor_rollout_ref.rollout.n"),
        (["actor_rollout_ref.rollout.gpu_memory_utilization=2"], "gpu_memory_utilization"),
        # inside the importer's integer range, outside the scenario's physical one
        (["trainer.n_gpus_per_node=200"], "trainer.n_gpus_per_node"),
        (["actor_rollout_ref.rollout.n=5000"], "actor_rollout_ref.rollout.n"),
        (["data.max_response_length=9000000"], "data.max_response_length"),
        (["actor_rollout_ref.actor.ppo_epochs=5000"], "actor_rollout_ref.actor.ppo_epochs"),
    ],
    ids=lambda v: str(v)[-30:],
)
def test_verl_bad_numbers_name_the_verl_key(tmp_path: Path, overrides: list[str], key: str) -> None:
    res = invoke(["import", "verl", str(VERL), *overrides], time_limit_s=10)
    line = assert_one_line_error(res, contains=key)
    assert "TrainLayout" not in line and "validation error" not in line


@pytest.mark.parametrize("option", ["--actor_num_gpus_per_node 0", "--vllm_tensor_parallel_size 0", "--ring_attn_size 0",
                                    "--micro_train_batch_size 0", "--actor_num_nodes 0", "--n_samples_per_prompt 5000",
                                    "--generate_max_len 9000000", "--max_epochs 5000"])
def test_openrlhf_zero_sizes_name_the_option(tmp_path: Path, option: str) -> None:
    sh = write(tmp_path / "run.sh", OPENRLHF.read_text().rstrip() + f" {option}\n")
    res = invoke(["import", "openrlhf", str(sh)], time_limit_s=10)
    assert_one_line_error(res, contains=option.split()[0])


def test_cases_file_template_mapping(tmp_path: Path) -> None:
    cases = {"version": 1, "templates": {"t": small()},
             "cases": [{"id": "c", "source_url": "https://example.org", "metric": {"kind": "step_time_s"}, "measured": 1.0,
                        "scenario": {"template": {"a": 1}}}]}
    f = write(tmp_path / "cases.yaml", cases)
    res = invoke(["validate", "--cases", str(f)], time_limit_s=20)
    assert_one_line_error(res, contains="template")


@pytest.mark.parametrize("value", [".inf", "-1", "1.0", ".nan"])
def test_profile_kernel_launch_out_of_range(tmp_path: Path, value: str) -> None:
    prof = write(tmp_path / "prof.yaml", f"kernel_launch_s: {value}\n")
    sc = write(tmp_path / "sc.yaml", small(**{"cluster.profile": str(prof)}))
    simulate_refused(tmp_path, sc, contains="kernel_launch_s")


def test_profile_peak_flops_of_one_and_a_half_is_refused(tmp_path: Path) -> None:
    from rlperf.specs.hardware_catalog import load_accelerator

    acc = load_accelerator("H100").model_dump(mode="json")
    acc.update(id="slow", name="slow", aliases=[], peak_flops={"bf16": 1.5})
    prof = write(tmp_path / "prof.yaml", {"accelerator": acc})
    sc = write(tmp_path / "sc.yaml", small(**{"cluster.gpu": "slow", "cluster.profile": str(prof)}))
    simulate_refused(tmp_path, sc, contains="peak_flops")


# ------------------------------------------------------------------------------ existing targets


def test_out_pointing_at_a_file_is_refused_before_the_work(tmp_path: Path) -> None:
    target = tmp_path / "file"
    target.write_text("keep")
    sc = write(tmp_path / "sc.yaml", small())
    res = invoke(["simulate", str(sc), "--out", str(target)], time_limit_s=10)
    assert_one_line_error(res, contains="--out")
    assert target.read_text() == "keep"


def test_out_below_a_file_is_refused_before_the_work(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("keep")
    sc = write(tmp_path / "sc.yaml", small())
    res = invoke(["simulate", str(sc), "--out", str(tmp_path / "file" / "sub")], time_limit_s=10)
    assert_one_line_error(res, contains="not a folder")


def test_report_pointing_at_a_file_is_refused_before_the_search(tmp_path: Path) -> None:
    target = tmp_path / "file"
    target.write_text("keep")
    # The search of the default scenario takes minutes; the time limit shows it never started.
    res = invoke(["plan", "--report", str(target)], time_limit_s=5)
    assert_one_line_error(res, contains="--report")
    assert target.read_text() == "keep"


def test_existing_report_is_refused_unless_force(tmp_path: Path) -> None:
    from rlperf.report.html import REPORT_NAME

    (tmp_path / REPORT_NAME).write_text("old report")
    res = invoke(["plan", "--report", str(tmp_path)], time_limit_s=5)
    assert_one_line_error(res, contains="--force")
    assert (tmp_path / REPORT_NAME).read_text() == "old report"


def test_existing_results_are_refused_unless_force(tmp_path: Path) -> None:
    sc = write(tmp_path / "sc.yaml", small())
    out = tmp_path / "out"
    assert invoke(["simulate", str(sc), "--out", str(out)], time_limit_s=30).code == 0
    before = {p: p.read_bytes() for p in files_under(out)}
    assert_one_line_error(invoke(["simulate", str(sc), "--out", str(out)], time_limit_s=10), contains="--force")
    assert {p: p.read_bytes() for p in files_under(out)} == before
    assert invoke(["simulate", str(sc), "--out", str(out), "--force"], time_limit_s=30).code == 0


def test_import_out_existing_is_refused_unless_force(tmp_path: Path) -> None:
    target = tmp_path / "sc.yaml"
    target.write_text("keep")
    assert_one_line_error(invoke(["import", "verl", str(VERL), "--out", str(target)]), contains="--force")
    assert target.read_text() == "keep"
    assert invoke(["import", "verl", str(VERL), "--out", str(target), "--force"]).code == 0
    assert yaml.safe_load(target.read_text())["name"]


@pytest.mark.parametrize("args", [["validate", "--calibrate", "--out"], ["validate", "--errors-out"]], ids=["calibrate", "errors"])
def test_validate_outputs_existing_are_refused_before_the_work(tmp_path: Path, args: list[str]) -> None:
    target = tmp_path / "profile.yaml"
    target.write_text("keep")
    res = invoke([*args, str(target)], time_limit_s=5)  # the validation itself takes a minute
    assert_one_line_error(res, contains="--force")
    assert target.read_text() == "keep"


# ------------------------------------------------------------------------------ half-written output


def _full_disk(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_space(fd: int) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr("rlperf.outputs.os.fsync", no_space)


def test_full_disk_leaves_targets_untouched_and_no_temp_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    sc = write(tmp_path / "sc.yaml", small())
    out = tmp_path / "out"
    out.mkdir()
    _full_disk(monkeypatch)
    res = invoke(["simulate", str(sc), "--out", str(out)], time_limit_s=30)
    assert_one_line_error(res, contains="No space left")
    assert files_under(out) == []


def test_atomic_write_keeps_the_old_file_on_failure(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from rlperf.outputs import write_text

    target = tmp_path / "report.html"
    target.write_text("<html>old</html>")
    _full_disk(monkeypatch)
    with pytest.raises(OSError):
        write_text(target, "<html>" + "x" * 1_000_000 + "</html>")
    assert target.read_text() == "<html>old</html>"
    assert files_under(tmp_path) == [target]


def test_interrupted_write_keeps_the_old_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from rlperf.outputs import write_text

    target = tmp_path / "trace.json"
    target.write_text("{}")

    def interrupt(fd: int) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr("rlperf.outputs.os.fsync", interrupt)
    with pytest.raises(KeyboardInterrupt):
        write_text(target, "[" * 10)
    assert target.read_text() == "{}" and files_under(tmp_path) == [target]


# ------------------------------------------------------------------------------ strict JSON


def test_strict_json_has_no_infinity() -> None:
    from rlperf.outputs import dumps_strict

    text = dumps_strict({"step_time_s": float("inf"), "rows": [float("nan"), 1.5], "ok": 2.0})
    data = json.loads(text, parse_constant=lambda c: pytest.fail(f"non-JSON constant {c}"))
    assert data == {"step_time_s": None, "step_time_s_reason": "infinite", "rows": [None, 1.5], "ok": 2.0}


def test_plan_json_is_strict_when_a_plan_is_infeasible(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import rlperf.plan.serialize as serialize

    real = serialize.search_json

    def with_infeasible(*args: Any) -> Any:  # an infeasible plan's step time is infinite
        out = real(*args)
        out["infeasible_example"] = {"step_time_s": float("inf"), "speedup": float("nan")}
        return out

    monkeypatch.setattr(serialize, "search_json", with_infeasible)
    sc = write(tmp_path / "sc.yaml", small())
    res = invoke(["plan", "-s", str(sc), "--json", "--top-k", "1", "--jobs", "1"], time_limit_s=60)
    assert res.code == 0, res.err
    data = json.loads(res.out, parse_constant=lambda c: pytest.fail(f"non-JSON constant {c}"))
    assert data["infeasible_example"] == {"step_time_s": None, "step_time_s_reason": "infinite",
                                          "speedup": None, "speedup_reason": "not a number"}


# ------------------------------------------------------------------------------ silent wrong answers


@pytest.mark.parametrize(
    "args",
    [["--nodes", "0"], ["--prompts", "0"], ["--group-size", "0"], ["--max-response", "0"], ["--max-staleness", "-1"],
     ["--gpus-per-node", "0"], ["--nodes", "1000000000"], ["--top-k", "0"], ["--jobs", "-1"]],
    ids=lambda a: " ".join(a),
)
def test_plan_options_out_of_range(args: list[str], tmp_path: Path) -> None:
    res = invoke(["plan", *args, "--report", str(tmp_path / "out")], time_limit_s=5)
    assert_one_line_error(res, contains=args[0])
    assert files_under(tmp_path / "out") == []


# ------------------------------------------------------------------------------ loader units


@pytest.mark.parametrize(
    ("text", "expected"),
    [("a: 1:30", "1:30"), ("a: 010", 10), ("a: yes", "yes"), ("a: on", "on"), ("a: 1e3", 1000.0), ("a: 0x1f", 31),
     ("a: 0o17", 15), ("a: 2020-01-01", "2020-01-01"), ("a: ~", None), ("a: true", True), ("a: 1_000", "1_000")],
)
def test_yaml_1_2_core_scalars(text: str, expected: Any) -> None:
    from rlperf.inputs import parse_yaml

    assert parse_yaml(text)["a"] == expected


@pytest.mark.parametrize(
    ("reader", "text", "contains"),
    [
        ("yaml", "a: 1\na: 2\n", "duplicate key"),
        ("yaml", "&a [*a]", "recursive alias"),
        ("yaml", "a: \x08", "not valid YAML"),  # a control character (found by the fuzz suite)
        ("yaml", "a: !!python/object/apply:os.system [echo]", "not valid YAML"),
        ("json", '{"a": 1, "a": 2}', "duplicate key"),
        ("json", '{"a": NaN}', "NaN"),
        ("json", '{"a": Infinity}', "Infinity"),
        ("json", "[" * 100_000 + "]" * 100_000, "nesting"),
    ],
)
def test_loader_refusals_are_one_line(reader: str, text: str, contains: str) -> None:
    from rlperf.errors import SpecError
    from rlperf.inputs import parse_json, parse_yaml

    parse: Callable[[str, str], Any] = parse_yaml if reader == "yaml" else parse_json
    with pytest.raises(SpecError) as ei:
        parse(text, "f")
    assert contains in str(ei.value) and "\n" not in str(ei.value) and str(ei.value).startswith("f:")


def test_an_internal_error_is_one_line_with_its_own_exit_code(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import rlperf.scenario

    def bug(*args: Any, **kwargs: Any) -> Any:
        raise TypeError("a bug, not a bad input")

    monkeypatch.setattr(rlperf.scenario, "load_scenario", bug)
    res = invoke(["simulate", str(write(tmp_path / "sc.yaml", small())), "--out", str(tmp_path / "out")])
    assert res.code == 70 and "Traceback" not in res.err
    assert res.err_lines == ["error: internal error (TypeError: a bug, not a bad input); rerun with RLPERF_TRACEBACK=1 "
                             "for the traceback and please report it"]
    monkeypatch.setenv("RLPERF_TRACEBACK", "1")
    with pytest.raises(TypeError):
        invoke(["simulate", str(tmp_path / "sc.yaml"), "--out", str(tmp_path / "out")])
