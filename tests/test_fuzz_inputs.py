"""Fuzzing every input kind: whatever a file or an option holds, rlperf either does its job or
says what is wrong in one line (exit 2), writes nothing, and never runs past a time limit.

Strategies start from a valid input of each kind and mutate it: a value replaced by an
adversarial one (0, -1, 2^63, 1e30, NaN, inf, strings, lists, mappings), a key deleted or added,
or the text itself cut and spliced with YAML's special characters. Each case runs the command
in-process (tests/helpers/cli.py) with a time limit.

CI runs derandomized (tests/conftest.py); locally each run explores new inputs. More examples:
``RLPERF_FUZZ_SCALE=20 HYPOTHESIS_PROFILE=explore pytest tests/test_fuzz_inputs.py``.
"""

from __future__ import annotations

import copy
import json
import os
import shlex
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.helpers.cli import Outcome, assert_one_line_error, files_under, invoke
from tests.helpers.models import QWEN25_7B_CONFIG
from tests.test_hardening_corpus import EX, OPENRLHF, SMALL, VERL, simulate_refused, small, write

SCALE = float(os.environ.get("RLPERF_FUZZ_SCALE", "2"))  # ~45 s in CI


def fuzz(examples: int) -> Any:
    return settings(max_examples=max(1, int(examples * SCALE)), deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@contextmanager
def workdir() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="rlperf-fuzz-") as d:
        yield Path(d)


def check(res: Outcome, out: Path | None = None) -> None:
    """Done (exit 0; stderr may carry warnings and progress) or refused in one line (exit 2,
    nothing written)."""
    assert "Traceback" not in res.err and "Traceback" not in res.out, res.err[-3000:]
    assert res.code in (0, 2), (res.code, res.err[-2000:])
    if res.code == 2:
        assert_one_line_error(res)
        if out is not None:
            assert files_under(out) == [], files_under(out)
    else:
        assert not any(ln.startswith("error: ") for ln in res.err_lines), res.err[-2000:]


# ------------------------------------------------------------------------------ strategies

SPECIAL = [0, -1, 1, 2, 2**31, 2**63, -(2**63), 10**30, 1e30, 1e-30, 0.5, 1.5, -0.0, float("inf"), float("-inf"),
           float("nan"), "", "1:30", "0x10", "0o7", "yes", "off", "~", "null", ".inf", "-", "../../x", "/etc/passwd",
           "a" * 300, None, True, False, [], {},
           # the upper edges of the physical ranges: accepted, and must still finish in time
           144, 1_000, 4_096, 10_000, 16_384, 65_536, 131_072, 524_288, 4_194_304]
LEAF = st.one_of(st.sampled_from(SPECIAL), st.integers(), st.floats(), st.text(max_size=12))
VALUE = st.recursive(LEAF, lambda kids: st.one_of(st.lists(kids, max_size=3),
                                                  st.dictionaries(st.text(max_size=6), kids, max_size=3)), max_leaves=6)
YAML_CHARS = "[]{}:,&*!|>-#'\"%@`?\n\t 0123456789.eE+-~aZ\\"


def key_paths(tree: Any, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    out: list[tuple[str, ...]] = []
    if isinstance(tree, dict):
        for k, v in tree.items():
            out.append((*prefix, k))
            out.extend(key_paths(v, (*prefix, k)))
    return out


@st.composite
def mutated(draw: st.DrawFn, base: dict[str, Any]) -> dict[str, Any]:
    """``base`` with 1 to 3 edits: a value replaced, a key deleted, or an unknown key added."""
    data = copy.deepcopy(base)
    for _ in range(draw(st.integers(1, 3))):
        paths = key_paths(data)
        if not paths:
            break
        path = draw(st.sampled_from(paths))
        parent: Any = data
        for k in path[:-1]:
            parent = parent[k]
        if not isinstance(parent, dict) or path[-1] not in parent:
            continue
        op = draw(st.sampled_from(["set", "set", "set", "delete", "add"]))
        if op == "set":
            parent[path[-1]] = draw(VALUE)
        elif op == "delete":
            del parent[path[-1]]
        else:
            parent[draw(st.text(min_size=1, max_size=8))] = draw(VALUE)
    return data


@st.composite
def spliced_text(draw: st.DrawFn, text: str) -> str:
    """``text`` with a slice replaced by characters that mean something to YAML."""
    i = draw(st.integers(0, len(text)))
    j = draw(st.integers(i, min(len(text), i + 40)))
    return text[:i] + draw(st.text(alphabet=YAML_CHARS, max_size=30)) + text[j:]


def dump(data: Any) -> str:
    return yaml.safe_dump(data, sort_keys=False, allow_unicode=True)


def document(base: dict[str, Any]) -> st.SearchStrategy[str]:
    return st.one_of(mutated(base).map(dump), mutated(base).map(dump), spliced_text(dump(base)))


# ------------------------------------------------------------------------------ scenario


def simulate_checked(d: Path, scenario: str | dict[str, Any]) -> None:
    f = d / "sc.yaml"
    f.write_text(scenario if isinstance(scenario, str) else dump(scenario))
    out = d / "out"
    check(invoke(["simulate", str(f), "--out", str(out)], time_limit_s=60), out)


@fuzz(30)
@given(text=document(SMALL))
def test_fuzz_scenario_simulate(text: str) -> None:
    with workdir() as d:
        simulate_checked(d, text)


@fuzz(6)
@given(data=mutated(SMALL))
def test_fuzz_scenario_plan(data: dict[str, Any]) -> None:
    with workdir() as d:
        f = d / "sc.yaml"
        f.write_text(dump(data))
        out = d / "report"
        check(invoke(["plan", "-s", str(f), "--report", str(out), "--top-k", "1", "--jobs", "1"], time_limit_s=90), out)


# ------------------------------------------------------------------------------ HF config.json


@fuzz(20)
@given(config=mutated(QWEN25_7B_CONFIG), raw=st.booleans(), junk=st.text(max_size=20))
def test_fuzz_hf_config(config: dict[str, Any], raw: bool, junk: str) -> None:
    with workdir() as d:
        (d / "m").mkdir()
        text = json.dumps(config)  # NaN/Infinity as Python writes them: refused by the loader
        (d / "m" / "config.json").write_text(text[: len(text) // 2] + junk if raw else text)
        simulate_checked(d, {**SMALL, "model": str(d / "m")})


# ------------------------------------------------------------------------------ hardware profile

PROFILE: dict[str, Any] = {
    "kernel_launch_s": 3e-6, "matmul_efficiency": 0.7, "hbm_efficiency": 0.8, "inter_node_latency_s": 1e-5,
    "intra_node_efficiency": 0.8, "engine_step_overhead_s": 1e-3, "matmul_efficiency_by_dtype": {"fp8": 0.6},
    "measurements": {"engine_step_s": {"fixed_s": 0.001, "per_layer_s": 1e-5}},
}


@fuzz(20)
@given(text=document(PROFILE), as_json=st.booleans())
def test_fuzz_profile(text: str, as_json: bool) -> None:
    with workdir() as d:
        prof = d / ("prof.json" if as_json else "prof.yaml")
        try:
            prof.write_text(json.dumps(yaml.safe_load(text)) if as_json else text)
        except yaml.YAMLError:
            prof.write_text(text)
        simulate_checked(d, {**SMALL, "cluster": {**SMALL["cluster"], "profile": str(prof)}})


# ------------------------------------------------------------------------------ verl YAML and scripts

VERL_TREE: dict[str, Any] = yaml.safe_load(VERL.read_text())


def _flat_keys(tree: dict[str, Any], prefix: str = "") -> list[str]:
    out: list[str] = []
    for k, v in tree.items():
        out.extend(_flat_keys(v, f"{prefix}{k}.") if isinstance(v, dict) and v else [f"{prefix}{k}"])
    return out


VERL_KEYS = _flat_keys(VERL_TREE)


def as_text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value)


@fuzz(30)
@given(text=document(VERL_TREE))
def test_fuzz_verl_yaml(text: str) -> None:
    with workdir() as d:
        f = d / "ppo.yaml"
        f.write_text(text)
        out = d / "imported.yaml"
        res = invoke(["import", "verl", str(f), "--out", str(out)], time_limit_s=20)
        check(res)
        assert out.exists() == (res.code == 0)


@fuzz(30)
@given(lines=st.lists(st.one_of(
    st.tuples(st.sampled_from(["", "+", "++", "~"]), st.sampled_from(VERL_KEYS), VALUE).map(
        lambda t: f"{t[0]}{t[1]}" if t[0] == "~" else f"{t[0]}{t[1]}={as_text(t[2])}"),
    st.text(alphabet=YAML_CHARS + "=$\\", max_size=30)), min_size=1, max_size=6), suffix=st.sampled_from([".sh", ".overrides"]))
def test_fuzz_verl_script(lines: list[str], suffix: str) -> None:
    with workdir() as d:
        f = d / f"run{suffix}"
        f.write_text("\n".join(lines) + "\n")
        check(invoke(["import", "verl", str(f)], time_limit_s=20))
        check(invoke(["import", "verl", str(VERL), *lines], time_limit_s=20))  # the same as arguments


SHELL_PIECES = ["A=1", "B=$A$A", 'C="${B}x"', "D=${UNSET:-8}", "E=$((A*2**62+7/0))", "F=(1 2 3)", "F[5]=x", "G+=$F",
                "${F[@]}", "$((", "))", "'", '"', "\\", "$(echo hi)", "`x`", "if [ $A -gt 0 ]; then", "else", "fi", "for i in 1 2; do",
                "done", "export H=$A", "bash -c 'python3 -m verl.trainer.main_ppo trainer.nnodes=$A'", "&&", "||", ";", "\n", "#",
                "python3 -m verl.trainer.main_ppo", "trainer.nnodes=$A", "trainer.n_gpus_per_node=${D}", "data.train_batch_size=$E",
                "actor_rollout_ref.model.path=Qwen/Qwen2.5-7B", "$@", "$1", "${#F[@]}", "${A:?}", "~", "*"]


@fuzz(30)
@given(pieces=st.lists(st.one_of(st.sampled_from(SHELL_PIECES), st.text(alphabet=YAML_CHARS + "$(){}=;", max_size=8)),
                       min_size=1, max_size=25))
def test_fuzz_launch_script(pieces: list[str]) -> None:
    """Bash launch scripts: variables, arrays, arithmetic, quoting, conditionals, ``bash -c``."""
    with workdir() as d:
        f = d / "run.sh"
        f.write_text(" ".join(pieces) + "\npython3 -m verl.trainer.main_ppo actor_rollout_ref.model.path=Qwen/Qwen2.5-7B "
                     + " ".join(pieces[-3:]) + "\n")
        check(invoke(["import", "verl", str(f)], time_limit_s=20))


HYDRA_ENTRY = st.one_of(
    st.sampled_from(["a", "b", "c", "top", "_self_", "missing", "a@x", "g/a", "../a", "/etc/passwd"]),
    st.dictionaries(st.sampled_from(["g", "override g", "optional g", "g@pkg"]), st.sampled_from(["a", "b", None, "zz"]),
                    min_size=1, max_size=1),
    LEAF,
)


@fuzz(20)
@given(files=st.fixed_dictionaries({name: st.lists(HYDRA_ENTRY, max_size=6) for name in ("top", "a", "b", "c", "g/a", "g/b")}),
       extra=VALUE)
def test_fuzz_hydra_defaults(files: dict[str, list[Any]], extra: Any) -> None:
    """Composed verl configs (``defaults:`` lists naming each other, groups, packages, cycles)."""
    with workdir() as d:
        (d / "g").mkdir()
        for name, entries in files.items():
            tree = {"defaults": entries, name.replace("/", "_"): {"v": extra}}
            if name == "top":
                tree.update(VERL_TREE)
            (d / f"{name}.yaml").write_text(dump(tree))
        check(invoke(["import", "verl", str(d / "top.yaml")], time_limit_s=20))


# ------------------------------------------------------------------------------ OpenRLHF script

OPENRLHF_OPTIONS = sorted({tok for tok in shlex.split(OPENRLHF.read_text(), comments=True) if tok.startswith("--")})


@fuzz(30)
@given(edits=st.lists(st.tuples(st.sampled_from(OPENRLHF_OPTIONS), st.one_of(LEAF.map(as_text), st.just(""))),
                      min_size=1, max_size=4),
       junk=st.text(alphabet=YAML_CHARS + "=$\\'\"", max_size=20))
def test_fuzz_openrlhf_script(edits: list[tuple[str, str]], junk: str) -> None:
    with workdir() as d:
        f = d / "run.sh"
        extra = " ".join(f"{opt} {shlex.quote(val)}" if val else opt for opt, val in edits)
        f.write_text(OPENRLHF.read_text().rstrip() + f" {extra} {junk}\n")
        out = d / "imported.yaml"
        res = invoke(["import", "openrlhf", str(f), "--out", str(out)], time_limit_s=20)
        check(res)
        assert out.exists() == (res.code == 0)


# ------------------------------------------------------------------------------ cases file

CASES: dict[str, Any] = {
    "version": 1,
    "simulation": {"iterations": 2, "warmup": 1},
    "templates": {"small": {k: v for k, v in SMALL.items() if k not in ("name", "simulation")}},
    "cases": [{"id": "c1", "source_url": "https://example.org/a", "metric": {"kind": "step_time_s"}, "measured": 10.0,
               "scenario": {"template": "small"}}],
}


@fuzz(15)
@given(text=document(CASES))
def test_fuzz_cases_file(text: str) -> None:
    with workdir() as d:
        f = d / "cases.yaml"
        f.write_text(text)
        check(invoke(["validate", "--cases", str(f), "--jobs", "1", "--json"], time_limit_s=60))


# ------------------------------------------------------------------------------ command-line options

PLAN_OPTIONS = ["--nodes", "--gpus-per-node", "--prompts", "--group-size", "--max-response", "--max-staleness", "--top-k",
                "--jobs", "--objective", "--executor", "--gpu", "--model", "--algorithm", "--workload", "--hardware-profile"]
BAD_NUMBERS = st.one_of(st.sampled_from(["0", "-1", "-5", "1e27", "2.5", "nan", "inf", "", "x", str(2**63), "100000000"]),
                        st.integers(max_value=0).map(str), st.integers(min_value=10**6).map(str))


@fuzz(20)
@given(opts=st.lists(st.tuples(st.sampled_from(PLAN_OPTIONS), st.one_of(BAD_NUMBERS, st.text(max_size=10))),
                     min_size=1, max_size=3))
def test_fuzz_plan_options(opts: list[tuple[str, str]]) -> None:
    with workdir() as d:
        sc = d / "sc.yaml"
        sc.write_text(dump(SMALL))
        args = ["plan", "-s", str(sc), "--report", str(d / "r"), "--top-k", "1", "--jobs", "1"]
        for opt, val in opts:
            args += [opt, val]
        check(invoke(args, time_limit_s=90), d / "r")


@fuzz(15)
@given(iterations=BAD_NUMBERS, out_kind=st.sampled_from(["new", "file", "deep"]))
def test_fuzz_simulate_options(iterations: str, out_kind: str) -> None:
    with workdir() as d:
        sc = d / "sc.yaml"
        sc.write_text(dump(SMALL))
        out = {"new": d / "out", "file": d / "file", "deep": d / "a" / "b" / "c"}[out_kind]
        if out_kind == "file":
            out.write_text("keep")
        res = invoke(["simulate", str(sc), "--out", str(out), "--iterations", iterations], time_limit_s=60)
        check(res)
        if out_kind == "file":
            assert out.read_text() == "keep"


@pytest.mark.parametrize("kind", ["verl", "openrlhf"])
def test_examples_still_import(kind: str) -> None:
    """The fuzz bases are valid: every shipped example imports (so mutations start from a good input)."""
    for f in sorted(EX.glob("*")):
        if f.name.startswith(kind) and f.suffix != ".overrides":  # overrides go with a YAML
            res = invoke(["import", kind, str(f)])
            assert res.code == 0, res.err


# ------------------------------------------------------------------------------ found by hand


@pytest.mark.parametrize("path", ["cluster.num_nodes", "workload.group_size", "workload.response_length.max_tokens",
                                  "plan.rollout.tp", "algorithm.minibatches", "simulation.iterations"])
def test_a_boolean_for_a_number_is_refused_naming_the_field(tmp_path: Path, path: str) -> None:
    # Pydantic's lax mode read `num_nodes: true` as one node, silently.
    line = simulate_refused(tmp_path, write(tmp_path / "sc.yaml", small(**{path: True})), contains=path)
    assert "true/false" in line


def test_a_boolean_where_a_boolean_belongs_is_still_read() -> None:
    from rlperf.inputs.booleans import boolean_for_number
    from rlperf.scenario import ScenarioSpec

    assert boolean_for_number(ScenarioSpec, small(**{"plan.layouts.actor.packing": False, "plan.layouts.actor.tp": 1})) is None
    assert boolean_for_number(ScenarioSpec, small(**{"plan.layouts.actor.tp": False})) == "plan.layouts.actor.tp"


def test_a_count_the_script_computes_names_set(tmp_path: Path) -> None:
    script = write(tmp_path / "run.sh", "GPUS=`nvidia-smi -L | wc -l`\npython3 -m verl.trainer.main_ppo "
                   "actor_rollout_ref.model.path=Qwen/Qwen2.5-0.5B trainer.n_gpus_per_node=$GPUS trainer.nnodes=1\n")
    res = invoke(["import", "verl", str(script)], time_limit_s=30)
    line = assert_one_line_error(res, contains="trainer.n_gpus_per_node")
    assert "--set NAME=VALUE" in line


@pytest.mark.parametrize("kind, script", [
    ("verl", "NNODES=${SLURM_JOB_NUM_NODES}\npython3 -m verl.trainer.main_ppo actor_rollout_ref.model.path=Qwen/Qwen2.5-0.5B "
             "trainer.n_gpus_per_node=8 trainer.nnodes=\"${NNODES}\"\n"),
    ("openrlhf", "python3 -m openrlhf.cli.train_ppo_ray --pretrain Qwen/Qwen2.5-0.5B --remote_rm_url http://rm "
                 "--actor_num_nodes 1 --actor_num_gpus_per_node 8 --generate_max_len $SLURM_JOB_NUM_NODES\n"),
])
def test_a_value_from_an_unset_variable_names_it(tmp_path: Path, kind: str, script: str) -> None:
    res = invoke(["import", kind, str(write(tmp_path / "run.sh", script))], time_limit_s=30)
    assert "--set SLURM_JOB_NUM_NODES=VALUE" in assert_one_line_error(res)


def test_more_minibatches_than_responses_names_the_scenario_key(tmp_path: Path) -> None:
    # It was refused deep in the simulator as `num_minibatches`, a name the file does not have.
    line = simulate_refused(tmp_path, write(tmp_path / "sc.yaml", small(**{"algorithm.minibatches": 65})),
                            contains="algorithm.minibatches")
    assert "64 responses" in line


@pytest.mark.parametrize("name", ["run.bash", "train_grpo"])
def test_a_verl_script_without_the_sh_suffix_is_read_as_a_script(tmp_path: Path, name: str) -> None:
    # It was read as YAML: "the document is a str".
    script = write(tmp_path / name, "#!/bin/bash\npython3 -m verl.trainer.main_ppo actor_rollout_ref.model.path="
                   "Qwen/Qwen2.5-0.5B trainer.n_gpus_per_node=4 trainer.nnodes=1\n")
    res = invoke(["import", "verl", str(script)], time_limit_s=30)
    assert res.code == 0, res.err
    assert "model: Qwen2.5-0.5B" in res.out


@pytest.mark.parametrize("path", ["algorithm.critic_model", "algorithm.reward.model"])
def test_an_unknown_critic_or_reward_model_names_its_key(tmp_path: Path, path: str) -> None:
    changes: dict[str, Any] = {"algorithm.name": "PPO", path: "Nope-7B"}
    if path == "algorithm.reward.model":
        changes["algorithm.reward.kind"] = "model"
    line = simulate_refused(tmp_path, write(tmp_path / "sc.yaml", small(**changes)), contains=f"{path}: unknown name")
    assert "model:" not in line.split(path)[0]


def test_an_error_in_a_hardware_profile_names_that_file(tmp_path: Path) -> None:
    # It was attributed to the scenario that names the profile.
    prof = write(tmp_path / "prof.yaml", {"accelerator": "A100"})
    res = invoke(["simulate", str(write(tmp_path / "sc.yaml", small(**{"cluster.profile": str(prof)}))),
                  "--out", str(tmp_path / "out")], time_limit_s=30)
    line = assert_one_line_error(res, contains="prof.yaml:hardware_profile.accelerator")
    assert "sc.yaml" not in line


@pytest.mark.parametrize("override, contains", [
    ("trainer.nnodes=100000", "trainer.nnodes: 100,000 nodes is outside"),  # was refused as "dp"
    ("'actor_rollout_ref.rollout.n=${oc.env:RLPERF_UNSET_VAR}'", "rollout.n: ${oc.env:RLPERF_UNSET_VAR} reads the environment"),
    ("'actor_rollout_ref.rollout.n=${eval:2*4}'", "rollout.n: ${eval:2*4} uses a resolver rlperf does not run"),
    # the cap vanished into a sub-key nobody reads and verl's default 1024 was used, silently
    ("data.max_response_length=4096 'data.max_response_length={a: 1}'", "data.max_response_length: a mapping"),
    # the section's keys were dropped and verl's defaults used (rollout.n 1, not the script's 4)
    ("actor_rollout_ref.rollout.n=4 actor_rollout_ref.rollout=5", "actor_rollout_ref.rollout: a single value '5'"),
])
def test_verl_overrides_found_by_hand(tmp_path: Path, override: str, contains: str) -> None:
    script = write(tmp_path / "run.sh", "python3 -m verl.trainer.main_ppo actor_rollout_ref.model.path=Qwen/Qwen2.5-0.5B "
                   f"trainer.n_gpus_per_node=4 {override}\n")
    assert_one_line_error(invoke(["import", "verl", str(script)], time_limit_s=30), contains=contains)


@pytest.mark.parametrize("option, contains", [
    (["--mean-response-tokens", "-5"], "--mean-response-tokens: -5 tokens"),  # was named data.max_response_length
    (["--gpu", "Z100"], "--gpu: unknown name 'Z100'"),  # was written into the scenario, then named gpu:
])
def test_import_options_found_by_hand(tmp_path: Path, option: list[str], contains: str) -> None:
    script = write(tmp_path / "run.sh", "python3 -m verl.trainer.main_ppo actor_rollout_ref.model.path=Qwen/Qwen2.5-0.5B "
                   "trainer.n_gpus_per_node=4 trainer.nnodes=1\n")
    assert_one_line_error(invoke(["import", "verl", str(script), *option], time_limit_s=30), contains=contains)


def test_a_layout_that_leaves_gpus_idle_is_warned_about(tmp_path: Path) -> None:
    # The simulator runs pool // (tp·pp·cp) replicas; the rest idled without a word.
    from rlperf.scenario import load_scenario

    with pytest.warns(UserWarning, match=r"plan.layouts.actor: tp·pp·cp = 3 does not divide the 8 GPUs of its pool; 2 of"):
        load_scenario(small(**{"plan.layouts": {"actor": {"pp": 3}}}))
    with pytest.warns(UserWarning, match=r"plan.rollout: tp·pp = 3 does not divide the 8 GPUs"):
        load_scenario(small(**{"plan.rollout.tp": 1, "plan.rollout.pp": 3}))


@pytest.mark.parametrize("profile, contains", [
    ({"profiles": {"h100_sxm": 3}}, "hardware_profile.profiles.h100_sxm: a int, not a mapping"),  # was an internal error
    ({"profiles": 3}, "hardware_profile.profiles: a int, not a mapping"),
    ({"matmul_efficiency": True}, "hardware_profile.matmul_efficiency: true/false"),
])
def test_hardware_profile_shapes_found_by_hand(tmp_path: Path, profile: dict[str, Any], contains: str) -> None:
    prof = write(tmp_path / "prof.yaml", profile)
    res = invoke(["simulate", str(write(tmp_path / "sc.yaml", small(**{"cluster.profile": str(prof)}))),
                  "--out", str(tmp_path / "out")], time_limit_s=30)
    assert_one_line_error(res, contains=contains)


@pytest.mark.parametrize("path", ["plan.rollout.tp", "plan.layouts.actor.tp"])
def test_tp_that_cannot_share_the_kv_heads_is_refused(tmp_path: Path, path: str) -> None:
    # Qwen2.5-0.5B: 14 heads, 2 KV heads. tp 7 divides the heads, not the KV heads (nor they it):
    # vLLM and Megatron refuse it; the engine was simulated as if it ran.
    changes: dict[str, Any] = {path: 7}
    if path.startswith("plan.layouts"):
        changes["plan.layouts.actor.zero_stage"] = 3
    line = simulate_refused(tmp_path, write(tmp_path / "sc.yaml", small(**changes)),
                            contains=f"{path}: 7 GPUs cannot share Qwen2.5-0.5B's 2 KV heads")
    assert "a divisor or a multiple of num_kv_heads (2)" in line


@pytest.mark.parametrize("options, contains", [
    (["--gpu", "nope"], "--gpu: unknown name 'nope'"),
    (["--algorithm", "NOPE"], "--algorithm: unknown name 'NOPE'"),
    (["--model", "Qwen2.5-Math-7B"], "--model: sequences of up to 9,216 tokens"),
    (["--model", "Qwen2.5-Math-7B", "--max-response", "8192"], "--max-response: sequences of up to 9,216 tokens"),
])
def test_a_bad_plan_option_is_named_not_the_base_scenario_file(options: list[str], contains: str) -> None:
    # It was attributed to the shipped scenario: ".../grpo-qwen2.5-7b-colocated-sync.yaml:gpu: ...".
    line = assert_one_line_error(invoke(["plan", *options], time_limit_s=60), contains=contains)
    assert ".yaml" not in line


def test_a_learned_positions_model_given_as_an_option_is_named() -> None:
    line = assert_one_line_error(invoke(["plan", "--model", "gpt2"], time_limit_s=60), contains="--model: sequences")
    assert "1024 learned positions of gpt2" in line


def test_a_layout_the_model_cannot_take_names_the_scenario_file(tmp_path: Path) -> None:
    # It was refused during the simulation without the file: "plan.layouts.actor.pp: 64 exceeds ...".
    path = write(tmp_path / "sc.yaml", small(**{"plan.layouts.actor.pp": 64}))
    line = simulate_refused(tmp_path, path, contains="plan.layouts.actor.pp: 64 exceeds num_layers (24)")
    assert "sc.yaml:plan.layouts.actor.pp" in line


@pytest.mark.parametrize("args, contains", [
    (["plan", "--from", "nemo", "x.sh"], "--from: unknown framework 'nemo'; allowed: verl, openrlhf"),
    (["import", "nemo", "x.sh"], "kind: unknown framework 'nemo'; allowed: verl, openrlhf"),
])
def test_an_unknown_framework_kind_names_the_argument(args: list[str], contains: str) -> None:
    # It was "framework: unknown config kind", a name neither command has.
    assert_one_line_error(invoke(args, time_limit_s=30), contains=contains)
