"""Workload presets: published numbers as written in algorithms.md, summaries, and the CLI."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from rlperf.errors import SpecError
from rlperf.specs.workload import Workload
from rlperf.specs.workload_presets import (
    MEAN_OVER_CAP,
    WorkloadPreset,
    get_workload_preset,
    list_workload_presets,
    load_workload_preset,
)
from rlperf.specs.workload_summary import describe, describe_lengths

# The research notes live next to the repository in the project workspace; CI may lack them.
ALGORITHMS_MD = Path(__file__).resolve().parents[2] / "shared" / "research" / "algorithms.md"
# Column of each published key in the algorithms.md §4 table (0 = "Recipe (source)").
COLUMNS = {"prompts_per_step": 3, "group_size": 4, "max_prompt_tokens": 7, "max_response_tokens": 8}
PRESETS = [get_workload_preset(n) for n in list_workload_presets()]


def _value(cell: str, part: int | None) -> int:
    """Leading number of a cell, or of its ``part``-th entry in an ``a / b / c`` cell."""
    parts = cell.split(" / ")
    text = parts[part] if part is not None and len(parts) > 1 else parts[0]
    m = re.match(r"[\d,]+", text.strip())
    assert m, cell
    return int(m.group().replace(",", ""))


def _published_value(w: Workload, key: str) -> float:
    return w.response_length.mean_tokens() if key == "mean_response_tokens" else getattr(w, key)


@pytest.mark.parametrize("p", PRESETS, ids=lambda p: p.name)
def test_preset_numbers_equal_the_published_cells(p: WorkloadPreset) -> None:
    assert p.source and p.assumptions and p.published
    for key, cell in p.published:
        assert _published_value(p.workload, key) == pytest.approx(
            _value(cell, p.row_part), rel=1e-9
        )


@pytest.mark.skipif(not ALGORITHMS_MD.exists(), reason="shared/research/algorithms.md not present")
@pytest.mark.parametrize("p", PRESETS, ids=lambda p: p.name)
def test_published_cells_appear_as_written_in_algorithms_md(p: WorkloadPreset) -> None:
    text = ALGORITHMS_MD.read_text()
    rows = [ln for ln in text.splitlines() if ln.startswith(f"| {p.table_row} |")]
    assert len(rows) == 1, p.table_row
    cells = [c.strip() for c in rows[0].strip().strip("|").split("|")]
    for key, cell in p.published:
        if key == "mean_response_tokens":  # §6.2 prose, e.g. "mean **22,386** tokens"
            assert f"**{cell}**" in text
        else:
            assert cells[COLUMNS[key]] == cell, key


def test_brief_numbers() -> None:
    dapo = load_workload_preset("dapo-qwen2.5-32b")
    assert (
        dapo.prompts_per_step,
        dapo.group_size,
        dapo.max_prompt_tokens,
        dapo.max_response_tokens,
    ) == (
        512,
        16,
        2048,
        20480,
    )
    moon = load_workload_preset("seer-moonlight")
    assert moon.max_response_tokens == 65536
    assert moon.response_length.mean_tokens() == pytest.approx(22386)
    r1 = load_workload_preset("r1-zero")
    assert (r1.prompts_per_step, r1.group_size, r1.max_response_tokens) == (512, 16, 32768)
    assert r1.response_length.mean_tokens() / 32768 == pytest.approx(1 / 3, abs=0.04)


def test_unpublished_mean_follows_the_stated_rule() -> None:
    for p in PRESETS:
        if any("cap/3" in a for a in p.assumptions):
            r = p.workload.response_length
            assert r.mean_tokens() == pytest.approx(r.cap_tokens * MEAN_OVER_CAP, rel=1e-9)


def test_overrides_and_unknown_names() -> None:
    w = load_workload_preset("deepscaler-8k", group_size=4, seed=3)
    assert (w.group_size, w.seed, w.prompts_per_step) == (4, 3, 128)
    with pytest.raises(
        SpecError, match=r"^workload.preset: unknown name 'dapo'; did you mean dapo-qwen2.5-32b\?"
    ):
        load_workload_preset("dapo")
    with pytest.raises(SpecError, match=r"^workload.groupsize: unknown field"):
        load_workload_preset("dapo-qwen2.5-32b", groupsize=8)
    with pytest.raises(SpecError, match=r"^workload.group_size: "):
        load_workload_preset("dapo-qwen2.5-32b", group_size=0)


def test_describe_agrees_with_the_sample_and_the_distribution() -> None:
    w = load_workload_preset("seer-kimi-k2")
    d = describe(w, step=2)
    s = w.sample(2)
    assert d.response.num_samples == w.num_responses
    assert d.response.sample_max_tokens == s.max_response_tokens
    assert d.response.sample_fraction_at_cap == pytest.approx(s.fraction_at_cap)
    assert d.sample_total_tokens == s.total_tokens
    r = w.response_length
    assert (d.response.p50_tokens, d.response.p99_tokens) == (r.quantile(0.5), r.quantile(0.99))
    assert (
        d.response.p50_tokens
        <= d.response.p90_tokens
        <= d.response.p99_tokens
        <= d.response.cap_tokens
    )
    one = describe_lengths(r, num_samples=50_000, seed=1)
    assert one.sample_mean_tokens == pytest.approx(r.mean_tokens(), rel=0.02)
    assert one.sample_fraction_at_cap == pytest.approx(r.fraction_at_cap(), abs=0.01)
    assert np.isfinite(d.expected_tokens_per_step)


def test_cli_workloads_table_and_show() -> None:
    from rlperf.cli.app import _register, app

    _register()
    runner = CliRunner()
    table = runner.invoke(app, ["workloads"], env={"COLUMNS": "220"})
    assert table.exit_code == 0, table.output
    for name in list_workload_presets():
        assert name in table.output
    assert "20,480" in table.output and "22,386" in table.output
    show = runner.invoke(
        app, ["workload", "show", "seer-moonlight", "--step", "1"], env={"COLUMNS": "220"}
    )
    assert show.exit_code == 0, show.output
    assert (
        "p99" in show.output
        and "assumptions:" in show.output
        and "Seer production workloads" in show.output
    )


def test_cli_unknown_preset_is_one_line_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    from rlperf.cli.app import main

    with pytest.raises(SystemExit) as ei:
        main(["workload", "show", "dapo"])
    assert ei.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: workload: unknown name 'dapo'") and "\n" not in err  # the argument, not workload.preset
