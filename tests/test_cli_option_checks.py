"""Options of analyze, compare, validate, hardware, workload, import and frameworks checked up
front: one `error:` line naming the option the user wrote (each was found by a fuzzing pass)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers.cli import assert_one_line_error, invoke

ROOT = Path(__file__).resolve().parent.parent
VERL = ROOT / "src" / "rlperf" / "frameworks" / "examples" / "verl_grpo_qwen2.5_7b.yaml"


@pytest.fixture
def bad_profiles(tmp_path: Path) -> dict[str, Path]:
    out = {}
    for name, text in {"zero": "matmul_efficiency: 0\n",  # plain fields: every accelerator's, invalid
                       "foreign": "profiles:\n  nosuchgpu:\n    matmul_efficiency: 0.5\n",
                       "h100": "profiles:\n  h100_sxm:\n    matmul_efficiency: 0.5\n"}.items():
        out[name] = tmp_path / f"{name}.yaml"
        out[name].write_text(text)
    return out


@pytest.mark.parametrize("args, contains", [
    # --iterations -1 answered exit 0, every framework "plan rejected"; 1e8 had no bound and hung
    (["compare", "no-such-scenario", "--iterations", "-1"], "--iterations: -1 is outside the plausible range"),
    (["compare", "no-such-scenario", "--iterations", "100000000"], "--iterations: 1e+08 is outside"),
    # --jobs -1 was accepted (plan refuses it)
    (["validate", "--jobs", "-1"], "--jobs: -1 is outside the useful range"),
    (["validate", "--profile", "/nonexistent/p.yaml"], "--profile: file not found: /nonexistent/p.yaml"),
    # the training-step score ignored these
    (["validate", "--train-csv", "x.csv", "--json"], "--train-csv: scores the training-step model alone; --json"),
    # the scenario was ignored; with --json nothing was printed
    (["analyze", "grpo-qwen2.5-7b-colocated-sync", "--symbolic"], "--symbolic: prints the taxonomy alone"),
    (["workload", "show", "nosuch"], "error: workload: unknown name 'nosuch'"),  # was workload.preset
    (["plan", "--workload", "nosuch"], "error: --workload: unknown name 'nosuch'"),  # was workload.preset
    (["workload", "show", "r1-zero", "--seed", "-1"], "--seed: -1 is negative"),  # was workload.seed
    (["workload", "show", "r1-zero", "--step", "99999999999999999999"], "--step: 99,999,999,999,999,999,999 is outside"),
    (["import", "verl", str(VERL), "--gpu", "Z100"], "error: --gpu: unknown name 'Z100'"),  # was gpu:
    (["frameworks", " "], "framework: is empty"),  # printed every framework
])
def test_a_bad_option_is_one_line_naming_it(args: list[str], contains: str) -> None:
    assert_one_line_error(invoke(args), contains=contains)


@pytest.mark.parametrize("profile, contains", [
    # every case "failed" and the command exited 0 with its 335-line report
    ("zero", "--profile: {path}:hardware_profile.matmul_efficiency: Input should be greater than 0"),
    ("foreign", "--profile: {path} applies to none of "),
])
def test_validate_checks_the_profile_before_the_work(profile: str, contains: str, bad_profiles: dict[str, Path]) -> None:
    path = bad_profiles[profile]
    assert_one_line_error(invoke(["validate", "--profile", str(path), "--jobs", "1"], time_limit_s=10),
                          contains=contains.format(path=path))


def test_hardware_lists_the_accelerators_a_profile_is_for(bad_profiles: dict[str, Path]) -> None:
    # it failed on the first accelerator the file had no profile for, naming hardware_profile
    res = invoke(["hardware", "--json", "--hardware-profile", str(bad_profiles["h100"])])
    assert res.code == 0, res.err
    rows = json.loads(res.out)
    assert [r["accelerator"]["id"] for r in rows] == ["h100_sxm"] and rows[0]["profile"]["matmul_efficiency"] == 0.5
    assert_one_line_error(invoke(["hardware", "h20", "--hardware-profile", str(bad_profiles["h100"])]),
                          contains="--hardware-profile: h100.yaml has no profile for h20")
    assert_one_line_error(invoke(["hardware", "--hardware-profile", str(bad_profiles["zero"])]),
                          contains="--hardware-profile: ")


def test_analyze_symbolic_json_is_the_taxonomy() -> None:
    res = invoke(["analyze", "--symbolic", "--json"])  # it printed nothing, exit 0
    assert res.code == 0 and res.err == ""
    doc = json.loads(res.out)
    assert doc["stages"][0]["what"] == "rollout: prefill" and doc["strategies"] and "P parameters" in doc["notation"]
