"""``rlperf hardware``: the accelerator catalog with its achieved-efficiency profile."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from rlperf.cli.app import app
from rlperf.specs.hardware import Accelerator, HardwareProfile
from rlperf.specs.hardware_catalog import accelerator_from_file, list_accelerators, load_accelerator, load_profile, normalize


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
    # A profile file may define its own accelerator (`rlperf calibrate` on a device outside the catalog).
    defined = accelerator_from_file(hardware_profile) if hardware_profile else None
    if defined is not None and (gpu is None or normalize(gpu) in {normalize(defined.id), *map(normalize, defined.aliases)}):
        rows = [(defined, load_profile(defined.id, hardware_profile))]
    else:
        ids = [load_accelerator(gpu).id] if gpu else list_accelerators()
        rows = [(load_accelerator(a), load_profile(a, hardware_profile)) for a in ids]
    if as_json:
        typer.echo(json.dumps([_row(a, p) for a, p in rows], indent=2))
        return
    table = Table(title="Accelerators (dense peak; efficiencies from data/profiles.yaml)")
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
