"""verl interpolations as OmegaConf resolves them: ``${oc.env:NAME[,default]}`` (the launch's
environment, then this process's, then the default), ``${oc.decode:...}``, references to keys
the script leaves at verl's defaults, and one-line errors for what cannot be resolved."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlperf.errors import SpecError
from rlperf.frameworks.config_tree import Environment, resolve
from rlperf.frameworks.load import load_framework_config
from rlperf.frameworks.report import ImportReport
from rlperf.scenario import ScenarioSpec, resolve_workload

BASE = ("python3 -m verl.trainer.main_ppo actor_rollout_ref.model.path=Qwen/Qwen2.5-0.5B "
        "trainer.n_gpus_per_node=4 trainer.nnodes=1 data.train_batch_size=256 ")
UNSET = "RLPERF_TEST_SURELY_UNSET"


def imported(tmp_path: Path, script: str, **env: str) -> tuple[ScenarioSpec, ImportReport]:
    path = tmp_path / "run.sh"
    path.write_text(script)
    return load_framework_config("verl", path, env=env)


def group_size(spec: ScenarioSpec) -> int:
    return resolve_workload(spec.workload).group_size


def test_oc_env_default_is_used_when_the_variable_is_unset(tmp_path: Path) -> None:
    spec, rep = imported(tmp_path, BASE + f"'actor_rollout_ref.rollout.n=${{oc.env:{UNSET},8}}'\n")
    assert group_size(spec) == 8
    assert f"${{oc.env:{UNSET},8}} = 8 (the default: {UNSET} is not set)" in rep.assumptions


def test_oc_env_reads_the_process_environment_first(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(UNSET, "16")
    spec, rep = imported(tmp_path, BASE + f"'actor_rollout_ref.rollout.n=${{oc.env:{UNSET},8}}'\n")
    assert group_size(spec) == 16  # OmegaConf: the variable wins over the default
    assert any(f"{UNSET}=16 (from this process's environment)" in a for a in rep.assumptions)


def test_oc_env_reads_the_scripts_exports_and_set_values(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GROUP", "2")  # the launch's own environment comes before this process's
    spec, rep = imported(tmp_path, "export GROUP=4\n" + BASE + "'actor_rollout_ref.rollout.n=${oc.env:GROUP}'\n")
    assert group_size(spec) == 4
    assert any("GROUP=4 (exported by the script)" in a for a in rep.assumptions)
    spec, rep = imported(tmp_path, "GROUP=4 " + BASE + "'actor_rollout_ref.rollout.n=${oc.env:GROUP}'\n")
    assert group_size(spec) == 4  # an assignment before the command is in its environment
    spec, rep = imported(tmp_path, BASE + "'actor_rollout_ref.rollout.n=${oc.env:GROUP}'\n", GROUP="32")
    assert group_size(spec) == 32
    assert any("GROUP=32 (given with --set)" in a for a in rep.assumptions)


def test_oc_env_without_value_or_default_names_the_key(tmp_path: Path) -> None:
    with pytest.raises(SpecError) as err:
        imported(tmp_path, f"{UNSET}=4\n" + BASE + f"'actor_rollout_ref.rollout.n=${{oc.env:{UNSET}}}'\n")
    line = str(err.value)
    assert "\n" not in line
    assert line.startswith(f"actor_rollout_ref.rollout.n: ${{oc.env:{UNSET}}} reads the environment variable {UNSET}")
    assert "the script sets" in line and "without exporting it" in line and f"--set {UNSET}=VALUE" in line


def test_an_unresolved_variable_in_a_key_rlperf_does_not_read_is_no_error(tmp_path: Path) -> None:
    spec, rep = imported(tmp_path, BASE + f"'trainer.default_local_dir=${{oc.env:{UNSET}}}/ckpt'\n")
    assert group_size(spec) == 1
    assert any(n.key == "trainer.default_local_dir" for n in rep.ignored + rep.unknown)


def test_references_to_keys_left_at_verls_defaults(tmp_path: Path) -> None:
    # The script does not set data.max_prompt_length: verl's default (512) is what it refers to.
    spec, _ = imported(tmp_path, BASE + "'data.max_response_length=${data.max_prompt_length}'\n")
    assert resolve_workload(spec.workload).max_response_tokens == 512


def test_a_reference_to_a_key_nobody_sets_names_both(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match=r"^data\.max_response_length: \$\{data\.nope\} refers to data\.nope, which"):
        imported(tmp_path, BASE + "'data.max_response_length=${data.nope}'\n")


def test_a_single_quoted_shell_variable_is_named(tmp_path: Path) -> None:
    # bash leaves '${N}' alone; Hydra then reads it as a reference to a key N.
    with pytest.raises(SpecError, match=r"a shell variable N is not expanded inside single quotes"):
        imported(tmp_path, "N=4\n" + BASE + "'actor_rollout_ref.rollout.n=${N}'\n")
    spec, _ = imported(tmp_path, "N=4\n" + BASE + "actor_rollout_ref.rollout.n=${N} \"data.max_response_length=$((N * 256))\"\n")
    assert group_size(spec) == 4 and resolve_workload(spec.workload).max_response_tokens == 1024


def test_resolution_forms() -> None:
    env = Environment({"A": "3"}, process={})
    res = resolve({"x": "${oc.decode:${oc.env:A}}", "y": "${oc.env:B,null}", "z": "${oc.env:B,'a b'}",
                   "w": "n${oc.env:A}", "v": "${oc.env:B}", "u": "${eval:1+1}", "t": "${x}"}, env=env)
    assert res.flat["x"] == 3 and res.flat["t"] == 3
    assert res.flat["y"] is None and res.flat["z"] == "a b" and res.flat["w"] == "n3"
    assert set(res.unresolved) == {"v", "u"}
    assert "resolver rlperf does not run" in res.unresolved["u"]


def test_a_cycle_of_references_is_named() -> None:
    res = resolve({"a": "${b}", "b": "${a}", "c": "${c}"})
    assert "never resolves (a cycle?)" in res.unresolved["a"] and "never resolves" in res.unresolved["c"]


def test_a_negative_staleness_threshold_is_refused(tmp_path: Path) -> None:
    # It was read as "synchronous" (t <= 0).
    with pytest.raises(SpecError, match=r"^async_training\.staleness_threshold: -1 is out of range; allowed: >= 0"):
        imported(tmp_path, BASE.replace("verl.trainer.main_ppo", "verl.experimental.fully_async_policy.fully_async_main")
                 + "rollout.nnodes=1 rollout.n_gpus_per_node=4 async_training.staleness_threshold=-1\n")
