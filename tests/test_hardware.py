"""Accelerator catalog, hardware profiles, clusters and the `rlperf hardware` command."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from rlperf.errors import SpecError
from rlperf.specs.hardware import HardwareProfile
from rlperf.specs.hardware_catalog import (
    PROFILE_FIELDS,
    generic_profile_values,
    list_accelerators,
    load_accelerator,
    load_profile,
    make_cluster,
)

REQUIRED = {"a100_40gb_sxm", "a100_80gb_sxm", "h100_sxm", "h100_pcie", "h800_sxm", "h20", "h200_sxm",
            "b200", "gb200", "mi300x", "mi325x", "mi355x", "l40s"}


def test_catalog_has_the_required_accelerators_with_sources() -> None:
    ids = set(list_accelerators())
    assert REQUIRED <= ids
    for aid in ids:
        acc = load_accelerator(aid)
        assert acc.sources and all(s.url.startswith("http") for s in acc.sources), aid
        assert acc.peak("bf16") > 0


def test_units_are_si() -> None:
    h100 = load_accelerator("h100_sxm")
    assert h100.peak("bf16") == pytest.approx(989.4e12)
    assert h100.peak("fp8") == pytest.approx(1978.9e12)
    assert h100.hbm_bytes == pytest.approx(80e9)
    assert h100.hbm_bandwidth_bytes_per_s == pytest.approx(3.35e12)
    assert h100.intra_node_bandwidth_bytes_per_s == pytest.approx(450e9)  # 900 GB/s bidirectional
    assert h100.nic_bandwidth_bytes_per_s == pytest.approx(50e9)  # 400 Gb/s
    assert load_accelerator("gb200").gpus_per_node == 72  # the NVLink domain is the node


def test_device_memory_is_the_reported_total_where_catalogued() -> None:
    h100 = load_accelerator("h100_sxm")
    assert h100.hbm_bytes == 80e9  # datasheet
    assert h100.reported_memory_bytes == h100.device_memory_bytes == 85_045_477_376  # deviceQuery
    pcie = load_accelerator("h100_pcie")  # no published figure: the datasheet's
    assert pcie.reported_memory_bytes is None and pcie.device_memory_bytes == pcie.hbm_bytes
    for aid in list_accelerators():
        acc = load_accelerator(aid)
        if acc.reported_memory_bytes is None:
            assert any(n.startswith("reported_memory_bytes: no published") for n in acc.notes), aid
        else:
            assert any("reported_memory_bytes" in src.fields for src in acc.sources), aid


def test_a_reported_total_in_the_wrong_unit_is_refused() -> None:
    from rlperf.errors import parse
    from rlperf.specs.hardware import Accelerator

    rec = load_accelerator("h100_sxm").model_dump()
    with pytest.raises(SpecError, match="reported_memory_bytes"):
        parse(Accelerator, {**rec, "reported_memory_bytes": 81_106 * 2**20 / 1024})  # KiB, not bytes
    assert parse(Accelerator, {**rec, "reported_memory_bytes": 85e9}).device_memory_bytes == 85e9


def test_aliases_are_case_insensitive() -> None:
    assert load_accelerator("H100").id == "h100_sxm"
    assert load_accelerator("A100").id == "a100_80gb_sxm"
    assert load_accelerator("h100-SXM").id == "h100_sxm"
    assert load_accelerator("RTX 4090").id == "rtx_4090"


def test_unknown_name_suggests_close_names() -> None:
    with pytest.raises(SpecError) as ei:
        load_accelerator("H1000")
    msg = str(ei.value)
    assert msg.startswith("gpu:") and "h100" in msg and "\n" not in msg


def test_every_accelerator_has_a_profile_with_provenance_for_every_field() -> None:
    for aid in list_accelerators():
        prof = load_profile(aid)
        assert prof.accelerator == aid
        for field in PROFILE_FIELDS - {"matmul_efficiency_by_dtype"}:
            if getattr(prof, field) is not None:
                assert "http" in prof.provenance.get(field, ""), (aid, field)
        for dt in prof.matmul_efficiency_by_dtype:
            assert "http" in prof.provenance[f"matmul_efficiency_by_dtype.{dt}"], (aid, dt)


def test_generic_block_equals_profile_defaults() -> None:
    defaults = {name: f.default for name, f in HardwareProfile.model_fields.items() if name in PROFILE_FIELDS}
    generic = generic_profile_values()
    for name, value in generic.items():
        assert defaults[name] == pytest.approx(value) if value is not None else defaults[name] is None, name


def test_profile_values_follow_their_measurements() -> None:
    # a few spot checks of the derivations (measured / peak), not tuned numbers
    assert load_profile("h100").matmul_efficiency == pytest.approx(794.5 / 989.4, abs=1e-3)
    assert load_profile("h100").matmul_eff("fp8") == pytest.approx(1402.6 / 1978.9, abs=1e-3)
    assert load_profile("h100").matmul_eff("fp16") == load_profile("h100").matmul_efficiency
    assert load_profile("a100").hbm_efficiency == pytest.approx(1.61 / 2.039, abs=1e-3)
    assert load_profile("h200").intra_node_efficiency == pytest.approx(367.61 / 450, abs=1e-3)
    assert load_profile("b200").inter_node_efficiency == pytest.approx(36.95 / 50, abs=1e-3)
    assert load_profile("a100").nvls_allreduce_efficiency is None


def test_profile_override_file(tmp_path: Path) -> None:
    f = tmp_path / "prof.yaml"
    f.write_text("accelerator: h100\nmatmul_efficiency: 0.5\nhbm_efficiency: {value: 0.7, url: mine}\n")
    prof = load_profile("h100_sxm", f)
    assert prof.matmul_efficiency == 0.5 and prof.hbm_efficiency == 0.7
    assert prof.attention_efficiency == load_profile("h100_sxm").attention_efficiency
    assert prof.provenance["hbm_efficiency"] == "mine"
    j = tmp_path / "prof.json"
    j.write_text(json.dumps({"profiles": {"h100_sxm": {"kernel_launch_s": 1e-6}}}))
    assert load_profile("h100", j).kernel_launch_s == 1e-6
    assert make_cluster("h100", 8, profile_path=f).profile.matmul_efficiency == 0.5


@pytest.mark.parametrize(
    ("text", "field"),
    [
        ("matmul_efficiency: 1.5\n", "matmul_efficiency"),
        ("matmul_eff: 0.5\n", "matmul_eff"),
        ("inter_node_latency_s: -1\n", "inter_node_latency_s"),
        ("accelerator: b200\n", "accelerator"),
    ],
)
def test_invalid_profile_is_one_line_error_naming_the_field(tmp_path: Path, text: str, field: str) -> None:
    f = tmp_path / "bad.yaml"
    f.write_text(text)
    with pytest.raises(SpecError) as ei:
        load_profile("h100", f)
    msg = str(ei.value)
    assert field in msg and "\n" not in msg


def test_missing_profile_file() -> None:
    with pytest.raises(SpecError, match="not found"):
        load_profile("h100", "/nonexistent/profile.yaml")


def test_shipped_calibrated_profiles_are_their_fit_applied_to_the_shipped_profiles() -> None:
    """``calibrated`` names data/calibrated_profiles.yaml, which `rlperf validate --calibrate`
    wrote: every accelerator's profile is the shipped one with the recorded fit applied. A change
    to profiles.yaml without a new fit fails here (re-run the calibration: docs/validation.md)."""
    import yaml

    from rlperf.calibration import GROUPS, PARAMS, scale_profile
    from rlperf.specs.hardware_catalog import profile_file

    record = yaml.safe_load(profile_file("calibrated").read_text(encoding="utf-8"))["calibration"]
    factors = record["factors"]
    assert set(factors) == set(PARAMS) and record["objective_after"] <= record["objective_before"]
    for aid in list_accelerators():
        shipped = load_profile(aid)
        got, want = load_profile(aid, "calibrated"), scale_profile(shipped, factors)
        for field in (f for group in factors for f in GROUPS[group]):
            a, b = getattr(got, field), getattr(want, field)
            if isinstance(b, dict):
                assert a.keys() == b.keys() and all(a[k] == pytest.approx(b[k], abs=1e-4) for k in b), (aid, field)
            else:
                assert a == pytest.approx(b, abs=1e-4), (aid, field)
        assert got.hbm_efficiency == shipped.hbm_efficiency  # a field the fit does not touch
    # The name reaches every command that takes a profile file.
    assert make_cluster("h100", num_gpus=8, profile_path="calibrated").profile == load_profile("h100", "calibrated")


def test_make_cluster_counts_and_price() -> None:
    c = make_cluster("h100", num_gpus=16)
    assert (c.num_nodes, c.gpus_per_node, c.num_gpus) == (2, 8, 16)
    assert c.price_usd_per_hour == pytest.approx(16 * 3.99)
    part = make_cluster("h100", num_gpus=4)
    assert (part.num_nodes, part.gpus_per_node) == (1, 4)
    assert make_cluster("a100").num_gpus == 8
    assert make_cluster("h200", num_nodes=4).num_gpus == 32
    assert make_cluster("h800", num_gpus=8).price_usd_per_hour is None
    twelve = make_cluster("h100", num_gpus=12)  # a full node and half of a second one
    assert (twelve.num_nodes, twelve.gpus_per_node, twelve.last_node_gpus, twelve.num_gpus) == (2, 8, 4, 12)
    with pytest.raises(SpecError, match="num_gpus"):
        make_cluster("h100", num_gpus=0)
    with pytest.raises(SpecError, match="num_gpus"):
        make_cluster("h100", num_gpus=8, num_nodes=2)


def test_full_mesh_group_bandwidth() -> None:
    mi = load_accelerator("mi300x")
    assert mi.intra_node_group_bandwidth_bytes_per_s(2) == pytest.approx(64e9)
    assert mi.intra_node_group_bandwidth_bytes_per_s(8) == pytest.approx(448e9)
    h = load_accelerator("h100")
    assert h.intra_node_group_bandwidth_bytes_per_s(2) == h.intra_node_bandwidth_bytes_per_s


def test_cli_hardware_json_and_table() -> None:
    from rlperf.cli.app import _register, app

    _register()
    runner = CliRunner()
    out = runner.invoke(app, ["hardware", "--json"])
    assert out.exit_code == 0, out.output
    rows = json.loads(out.output)
    assert {r["accelerator"]["id"] for r in rows} == set(list_accelerators())
    table = runner.invoke(app, ["hardware"], env={"COLUMNS": "220"})
    assert table.exit_code == 0 and "h100_sxm" in table.output


def test_shipped_data_reads_the_same_with_either_yaml_loader() -> None:
    """The shipped catalog is read with libyaml's safe loader where PyYAML has it: it must give
    the documents the pure Python safe loader gives."""
    from importlib import resources

    import yaml

    from rlperf.specs import hardware_catalog

    for name in ("hardware.yaml", "profiles.yaml"):
        text = resources.files("rlperf").joinpath("data").joinpath(name).read_text(encoding="utf-8")
        assert hardware_catalog._read_data(name) == yaml.load(text, Loader=yaml.SafeLoader)
