"""`rlperf calibrate`: quick micro-benchmarks written as a profile that the catalog loads."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

pytest.importorskip("torch")

from rlperf.errors import SpecError
from rlperf.runtime.calibrate import Calibration, calibrate, write_profile
from rlperf.specs.hardware import HardwareProfile
from rlperf.specs.hardware_catalog import accelerator_from_file, load_profile, make_cluster


@pytest.fixture(scope="module")
def cal() -> Calibration:
    return calibrate(device="cpu", quick=True)


@pytest.fixture(scope="module")
def profile_file(cal: Calibration, tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("cal") / "local.yaml"
    write_profile(cal, path)
    return path


def test_measurements_are_positive(cal: Calibration) -> None:
    assert cal.gemm and all(g.flops_per_s > 0 for g in cal.gemm)
    for x in (cal.copy_bytes_per_s, cal.triad_bytes_per_s, *cal.attention_prefill_flops_per_s.values(),
              *cal.decode_bytes_per_s.values(), cal.adam_bytes_per_s, cal.kernel_launch_s, cal.memory_bytes):
        assert x > 0
    assert set(cal.peak_flops()) == {"fp32", "bf16"}  # the engine may run fp32, training bf16
    assert cal.graph_kernel_launch_s is None  # no CUDA graphs on a CPU


def test_profile_loads_through_the_catalog(cal: Calibration, profile_file: Path) -> None:
    acc = accelerator_from_file(profile_file)
    assert acc is not None and acc.id == "local"
    assert acc.peak_flops == pytest.approx(cal.peak_flops())  # peak = the best GEMM measured
    assert acc.hbm_bandwidth_bytes_per_s == pytest.approx(max(cal.copy_bytes_per_s, cal.triad_bytes_per_s))
    prof = load_profile("local", profile_file)
    assert 0 < prof.matmul_efficiency <= 1 and 0 < prof.attention_efficiency <= 1
    assert prof.hbm_efficiency == pytest.approx(cal.copy_bytes_per_s / acc.hbm_bandwidth_bytes_per_s)
    assert prof.kernel_launch_s == pytest.approx(cal.kernel_launch_s)
    assert prof.graph_kernel_launch_s == prof.kernel_launch_s
    assert "calibrate" in prof.provenance["attention_efficiency"] or "SDPA" in prof.provenance["attention_efficiency"]
    assert prof.forward_mfu_cap == pytest.approx(min(1.0, cal.block_forward_mfu)) and prof.forward_mfu_cap > 0
    # a CPU is its own host: the CPU Adam figures are the device's own bandwidth and AdamW rate
    assert cal.host_devices == 1
    assert prof.host_memory_bandwidth_bytes_per_s == pytest.approx(acc.hbm_bandwidth_bytes_per_s)
    assert prof.host_adam_bytes_per_s == pytest.approx(min(cal.adam_bytes_per_s, acc.hbm_bandwidth_bytes_per_s))
    # HF generate's framework cost per step: the engine model adds it to every step
    assert prof.engine_step_s(4) == pytest.approx(
        max(0.0, cal.engine_step_s["fixed_s"]) + 4 * max(0.0, cal.engine_step_s["per_layer_s"]))
    assert prof.engine_step_s(4) > 0
    # fields the calibration does not measure keep the generic profile
    assert prof.inter_node_efficiency == HardwareProfile(accelerator="x").inter_node_efficiency
    cluster = make_cluster("local", num_gpus=1, profile_path=profile_file)
    assert cluster.accelerator == acc and cluster.num_gpus == 1 and cluster.profile == prof


def test_raw_measurements_are_kept_but_not_read_back(profile_file: Path) -> None:
    data = yaml.safe_load(profile_file.read_text())
    assert data["measurements"]["gemm"]
    assert "measurements" not in load_profile("local", profile_file).model_dump()


def test_a_defined_accelerator_does_not_stand_in_for_a_catalog_one(profile_file: Path) -> None:
    with pytest.raises(SpecError) as err:
        load_profile("h100", profile_file)
    assert err.value.field == "hardware_profile.accelerator"
    with pytest.raises(SpecError):
        make_cluster("local", num_gpus=1)  # without the file, "local" is unknown


def test_json_output(cal: Calibration, tmp_path: Path) -> None:
    path = tmp_path / "local.json"
    write_profile(cal, path)
    assert load_profile("local", path).matmul_efficiency == load_profile("local", path).matmul_efficiency
    assert make_cluster("LOCAL", profile_path=path).gpus_per_node == 1
