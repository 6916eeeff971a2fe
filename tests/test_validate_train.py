"""The training-step validation harness: file format, stable split, summaries, the CLI table."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from rlperf.cli.app import main
from rlperf.errors import SpecError
from rlperf.validate_train import (
    COLUMNS,
    ErrorSummary,
    TrainValidation,
    fit_layer_overhead,
    load_train_csv,
    shipped_csv,
    validate_train,
)

FIXTURE = Path(__file__).parent / "data" / "vtrain_small.csv"


def test_the_shipped_file_loads_and_splits_about_in_half() -> None:
    rows = load_train_csv(shipped_csv())
    assert len(rows) == 1440
    fit = sum(m.split == "fit" for m in rows)
    assert 600 < fit < 840  # a hash split, not an exact half


def test_the_split_depends_on_the_configuration_only() -> None:
    rows = load_train_csv(FIXTURE)
    m = rows[0]
    slower = type(m)(**{**m.__dict__, "measured_s": 10 * m.measured_s})
    assert slower.split == m.split and slower.config_key == m.config_key
    # the documented rule, recomputed by hand for the first row
    import hashlib

    expected = "fit" if hashlib.sha256(m.config_key.encode()).digest()[0] % 2 == 0 else "holdout"
    assert m.split == expected
    assert m.config_key == "gpus=2,gbs=16,mbs=8,h=1024,heads=16,layers=24,seq=1024,tp=1,dp=1,pp=2"


def test_error_summary_closed_form() -> None:
    e = ErrorSummary.of(np.array([0.5, 1.0, 1.2, 2.0]))
    assert e.mape == pytest.approx((0.5 + 0 + 0.2 + 1.0) / 4)
    assert e.median_ape == pytest.approx(0.35)
    assert e.median_ratio == pytest.approx(1.1)


def test_bad_files_are_refused_with_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.csv"
    bad.write_text("a,b\n1,2\n")
    with pytest.raises(SpecError, match="train_csv"):
        load_train_csv(bad)
    wrong = tmp_path / "wrong.csv"
    wrong.write_text(",".join(COLUMNS) + "\n8,16,2,1024,16,12,1024,2,2,1,100\n")  # 2 x 2 x 1 != 8 GPUs
    with pytest.raises(SpecError, match="tp x dp x pp"):
        load_train_csv(wrong)


def test_groups_cover_every_row_of_a_split() -> None:
    result = validate_train(FIXTURE, fit=False)
    assert isinstance(result, TrainValidation)
    for split in ("fit", "holdout"):
        n = result.summary(split).num_rows
        for by in ("tp", "pp", "micro_batch", "microbatches_per_rank", "hidden_size"):
            assert sum(g.errors.num_rows for g in result.groups(split) if g.by == by) == n
    assert np.all(result.predicted_s > 0)


def test_cli_prints_the_summary_and_groups(capsys: pytest.CaptureFixture[str]) -> None:
    main(["validate", "--train-csv", str(FIXTURE)])
    out = capsys.readouterr().out
    for text in ("MAPE", "median ratio", "holdout", "micro_batch", "hidden_size", "SHA-256"):
        assert text in out


def test_the_fit_sees_only_the_fit_half(tmp_path: Path) -> None:
    rows = load_train_csv(FIXTURE)
    assert {m.split for m in rows} == {"fit", "holdout"}
    fitted = fit_layer_overhead(rows, upper_s=5e-3, tolerance_s=1e-5)
    # triple every hold-out time: the fitted value must not move
    lines = FIXTURE.read_text(encoding="utf-8-sig").splitlines()
    out = [lines[0]]
    for line, m in zip(lines[1:], rows, strict=True):
        cols = line.split(",")
        if m.split == "holdout":
            cols[-1] = str(3 * float(cols[-1]))
        out.append(",".join(cols))
    changed = tmp_path / "changed.csv"
    changed.write_text("\n".join(out) + "\n")
    assert fit_layer_overhead(load_train_csv(changed), upper_s=5e-3, tolerance_s=1e-5) == fitted
    # and it is a real fit: slower fit-half rows give a larger overhead
    slower = [type(m)(**{**m.__dict__, "measured_s": 1.5 * m.measured_s}) for m in rows]
    assert fit_layer_overhead(slower, upper_s=5e-3, tolerance_s=1e-5) > fitted


@pytest.mark.parametrize("row, contains", [
    # micro batch 0 was an internal error (integer modulo by zero)
    ("8,64,0,1024,16,8,2048,1,8,1,100", "line 2, column 'micro batch': 0 sequences is outside"),
    ("8,64,1,1024,16,8,0,1,8,1,100", "line 2, column 'sequence length': 0 tokens is outside"),
    ("8,64,1,1024,16,8,2048,1,8,x,100", "line 2, column 'pipeline parallelism': 'x' is not an integer"),
    # nan quietly dropped the MAPE, inf scored 100%, 1e-300 ms an APE of 1.6e300
    ("8,64,1,1024,16,8,2048,1,8,1,nan", "column 'iteration time (ms)': 'nan' is not a finite number"),
    ("8,64,1,1024,16,8,2048,1,8,1,inf", "column 'iteration time (ms)': 'inf' is not a finite number"),
    ("8,64,1,1024,16,8,2048,1,8,1,1e-300", "column 'iteration time (ms)': 1e-300 ms is outside"),
    # named by the model's internal fields (model.config.num_attention_heads, layout.tp, layout.pp)
    ("8,64,1,1000,16,8,2048,1,8,1,100", "line 2: attention heads 16 do not divide the hidden size 1000"),
    ("8,64,1,1536,12,8,2048,8,1,1,100", "line 2: tensor parallelism 8 does not divide the attention heads 12"),
    ("8,64,1,1024,16,3,2048,1,2,4,100", "line 2: pipeline parallelism 4 exceeds the # layers 3"),
])
def test_a_bad_row_names_the_line_and_column(tmp_path: Path, capsys: pytest.CaptureFixture[str], row: str,
                                             contains: str) -> None:
    f = tmp_path / "r.csv"
    f.write_text(",".join(COLUMNS) + "\n" + row + "\n")
    with pytest.raises(SystemExit) as ei:
        main(["validate-train", str(f)])
    err = capsys.readouterr().err.strip()
    assert ei.value.code == 2 and err.startswith("error: train_csv:") and "\n" not in err, err
    assert contains in err and "allowed:" in err, err
