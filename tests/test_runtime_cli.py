"""`rlperf calibrate` then `rlperf measure --compare` on a tiny scenario, end to end."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import yaml

pytest.importorskip("torch")
pytest.importorskip("transformers")

from rlperf.cli.app import main

TINY = {
    "name": "tiny-cli",
    "model": "tiny-qwen2",
    "cluster": {"gpu": "local", "num_nodes": 1, "gpus_per_node": 1},
    "workload": {
        "prompts_per_step": 2,
        "group_size": 2,
        "prompt_length": {"kind": "uniform", "min_tokens": 6, "max_tokens": 10},
        "response_length": {"kind": "uniform", "min_tokens": 4, "max_tokens": 8},
    },
    "algorithm": {"name": "GRPO", "minibatches": 2, "reward": {"kind": "rule", "cpu_s_per_sample": 1e-5, "cpu_workers": 1}},
    "plan": {
        "rollout": {"dtype": "fp32", "kv_dtype": "fp32", "max_num_seqs": 4, "prefix_sharing": False},
        "layouts": {"actor": {"zero_stage": 0, "recompute": "none", "param_dtype": "bf16", "micro_batch_size": 2}},
        "offload_between_phases": False,
    },
    "simulation": {"iterations": 1, "warmup": 0},
}


def test_calibrate_then_measure_and_compare(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    prof = tmp_path / "local.yaml"
    main(["calibrate", "--quick", "--device", "cpu", "--out", str(prof)])
    assert prof.is_file()
    scen = tmp_path / "tiny.yaml"
    scen.write_text(yaml.safe_dump(TINY))
    out = tmp_path / "out"
    main(["measure", str(scen), "--compare", "--hardware-profile", str(prof), "--repeats", "2",
          "--device", "cpu", "--out", str(out)])
    text = capsys.readouterr().out
    assert "predicted vs measured" in text and "whole step" in text
    res = json.loads((out / "tiny-cli.measure.json").read_text())
    rows = {r["name"]: r for r in res["comparison"]["stages"]}
    for stage in ("generate", "reward", "old_logprob", "ref_logprob", "actor_update"):
        assert rows[stage]["measured_s"] > 0 and rows[stage]["predicted_s"] > 0
        assert math.isfinite(rows[stage]["error"])
    assert res["comparison"]["measured_step_s"] == min(r["step_time_s"] for r in res["measured"]["runs"])
    for kind in ("measured", "predicted"):
        trace = json.loads((out / f"tiny-cli.{kind}.trace.json").read_text())
        assert any(e["ph"] == "X" for e in trace["traceEvents"])


def test_compare_without_a_profile_for_local_is_a_one_line_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    scen = tmp_path / "tiny.yaml"
    scen.write_text(yaml.safe_dump(TINY))
    with pytest.raises(SystemExit) as ex:
        main(["measure", str(scen), "--compare", "--device", "cpu", "--out", str(tmp_path)])
    assert ex.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: gpu:") and "\n" not in err


def test_measure_name_cannot_escape_out(tmp_path: Path) -> None:
    """A scenario name ``../../x`` is made a file name: measure writes inside --out only."""
    scen = tmp_path / "sc.yaml"
    scen.write_text(yaml.safe_dump({**TINY, "name": "../../evil"}))
    out = tmp_path / "a" / "b" / "out"
    main(["measure", str(scen), "--device", "cpu", "--repeats", "1", "--out", str(out)])
    written = sorted(p for p in tmp_path.rglob("*") if p.is_file() and p != scen)
    assert [p.parent for p in written] == [out, out] and all(p.name.startswith("evil.") for p in written)
