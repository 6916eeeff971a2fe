"""``rlperf hardware``: the accelerator catalog with its achieved-efficiency profile."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from rlperf.cli.app import app
from rlperf.specs.hardware import Accelerator, HardwareProfile
from rlperf.errors import SpecError
from rlperf.specs.hardware_catalog import (
    accelerator_from_file,
    list_accelerators,
    load_accelerator,
    load_profile,
    normalize,
    profile_file,
)


def check_profile_file(path: Path, option: str) -> None:
    """A profile option names an existing file (or the shipped ``calibrated``): checked first."""
    p = profile_file(path)
    if not p.is_file():
        raise SpecError(option, f"{'is a directory' if p.is_dir() else 'file not found'}: {path}",
                        "an existing profile file (YAML or JSON), or 'calibrated'")


def profile_if_for(accelerator: str, path: Path, option: str) -> HardwareProfile | SpecError:
    """The profile file ``path`` applied to ``accelerator``, or the error saying the file is for
    other accelerators; any other mistake in the file is raised, naming ``option``."""
    try:
        return load_profile(accelerator, path)
    except SpecError as err:
        # A file for other accelerators says so under hardware_profile[.accelerator] (its
        # profiles: mapping lacks this one, or its accelerator: names another).
        if err.field in ("hardware_profile", "hardware_profile.accelerator"):
            return err
        raise SpecError(option, str(err)) from None


def profiles_for(ids: Sequence[str], path: Path, option: str) -> list[tuple[str, HardwareProfile]]:
    """The accelerators of ``ids`` the profile file ``path`` applies to, with their profiles; an
    error naming ``option`` if it applies to none of them."""
    found = [(a, profile_if_for(a, path, option)) for a in ids]
    fits = [(a, p) for a, p in found if isinstance(p, HardwareProfile)]
    misfit = next((p for _, p in found if isinstance(p, SpecError)), None)
    if len(ids) == 1 and misfit is not None:
        raise SpecError(option, misfit.problem, misfit.allowed)
    if ids and not fits and misfit is not None:
        raise SpecError(option, f"{path} applies to none of {', '.join(ids)} (e.g. {misfit.problem})",
                        "a profile of one of them (profiles: {<id>: fields}, or profile fields alone)")
    return fits


def _row(acc: Accelerator, prof: HardwareProfile) -> dict[str, Any]:
    return {"accelerator": acc.model_dump(mode="json"), "profile": prof.model_dump(mode="json")}


def _fmt(x: float | None, scale: float, digits: int = 0) -> str:
    return "-" if x is None else f"{x / scale:,.{digits}f}"


@app.command("hardware")
def hardware(
    gpu: Annotated[str | None, typer.Argument(help="One accelerator (id or alias); default: all.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print catalog and profiles as JSON.")] = False,
    hardware_profile: Annotated[
        Path | None, typer.Option("--hardware-profile", help="Profile file (YAML/JSON) overriding the shipped one.")
    ] = None,
) -> None:
    """List accelerators: peak compute, memory, links, price and achieved efficiencies."""
    option = "--hardware-profile"
    defined = None
    if hardware_profile is not None:
        check_profile_file(hardware_profile, option)
        # A profile file may define its own accelerator (`rlperf calibrate` on a device outside the catalog).
        try:
            defined = accelerator_from_file(hardware_profile)
        except SpecError as err:
            raise SpecError(option, str(err)) from None
    if defined is not None and (gpu is None or normalize(gpu) in {normalize(defined.id), *map(normalize, defined.aliases)}):
        rows = [(defined, load_profile(defined.id, hardware_profile))]
    else:
        ids = [load_accelerator(gpu).id] if gpu else list_accelerators()
        if hardware_profile is None:
            rows = [(load_accelerator(a), load_profile(a)) for a in ids]
        else:  # without a GPU named: the accelerators the file has profiles for
            rows = [(load_accelerator(a), p) for a, p in profiles_for(ids, hardware_profile, option)]
    if as_json:
        typer.echo(json.dumps([_row(a, p) for a, p in rows], indent=2))
        return
    source = "data/profiles.yaml" if hardware_profile is None else f"{hardware_profile} over data/profiles.yaml"
    table = Table(title=f"Accelerators (dense peak; efficiencies from {source})")
    for col in ("id", "name", "BF16 TF/s", "FP8 TF/s", "HBM GB", "HBM TB/s", "scale-up GB/s/dir",
                "NIC Gb/s", "$/GPU-h", "matmul eff", "HBM eff"):
        table.add_column(col, justify="left" if col in ("id", "name") else "right", no_wrap=col == "id")
    for acc, prof in rows:
        table.add_row(
            acc.id,
            acc.name,
            _fmt(acc.peak_flops.get("bf16"), 1e12),
            _fmt(acc.peak_flops.get("fp8"), 1e12),
            _fmt(acc.hbm_bytes, 1e9),
            _fmt(acc.hbm_bandwidth_bytes_per_s, 1e12, 2),
            _fmt(acc.intra_node_bandwidth_bytes_per_s, 1e9),
            _fmt(acc.nic_bandwidth_bytes_per_s * 8, 1e9) + ("*" if "nic_bandwidth_bytes_per_s" in acc.assumed else ""),
            _fmt(acc.price_usd_per_hour, 1, 2),
            f"{prof.matmul_efficiency:.2f}",
            f"{prof.hbm_efficiency:.2f}",
        )
    console = Console()
    console.print(table)
    console.print("* assumed (no documented NIC); sources and assumptions: rlperf hardware --json")
    if hardware_profile is not None and gpu is None and len(rows) < len(list_accelerators()):
        console.print(f"{hardware_profile}: only the {len(rows)} accelerator(s) it has a profile for", markup=False)
