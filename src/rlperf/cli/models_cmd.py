"""``rlperf models`` (the catalog) and ``rlperf model show NAME|PATH`` (one model in detail)."""

from __future__ import annotations

import json

import typer
from rich.console import Console
from rich.table import Table

from rlperf.catalog import aliases_of, list_models, load_model
from rlperf.catalog.summary import ModelSummary, summarize
from rlperf.cli.app import app

model_app = typer.Typer(help="Inspect one model.", no_args_is_help=True)
app.add_typer(model_app, name="model")


def _si(x: float, unit: str = "") -> str:
    """1234567 -> '1.23 M' (decimal prefixes, three significant digits)."""
    for scale, prefix in ((1e12, "T"), (1e9, "G" if unit else "B"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= scale:
            return f"{x / scale:.3g} {prefix}{unit}"
    return f"{x:.0f} {unit}".rstrip()


def _bytes(x: float) -> str:
    """Binary prefixes, as memory is sized."""
    for scale, prefix in ((2**40, "TiB"), (2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB")):
        if x >= scale:
            return f"{x / scale:.3g} {prefix}"
    return f"{x:.0f} B"


def _console() -> Console:
    # Tables are wider than the 80 columns rich assumes when output is piped.
    return Console(width=max(Console().width, 110))


@app.command("models")
def models() -> None:
    """List the model catalog."""
    table = Table(title="rlperf model catalog")
    for col in (
        "name",
        "arch",
        "layers",
        "hidden",
        "heads/kv",
        "params",
        "active",
        "KV/token bf16",
    ):
        table.add_column(col, justify="left" if col in ("name", "arch") else "right", no_wrap=True)
    for name in list_models():
        m = load_model(name)
        table.add_row(
            name,
            m.architecture,
            str(m.num_layers),
            str(m.hidden_size),
            f"{m.num_heads}/{m.num_kv_heads}" if m.mla is None else f"{m.num_heads}/MLA",
            _si(m.num_params),
            _si(m.num_active_params),
            _bytes(m.kv_bytes_per_token("bf16")),
        )
    _console().print(table)


@model_app.command("show")
def show(
    name: str = typer.Argument(..., help="catalog name or alias, or a config.json path / folder"),
    as_json: bool = typer.Option(False, "--json", help="print the numbers as JSON"),
) -> None:
    """Parameters, weight and KV-cache bytes, and FLOPs per token of one model."""
    summary = summarize(load_model(name))
    if as_json:
        typer.echo(json.dumps(summary.to_dict(), indent=2))
        return
    console = _console()
    console.print(_shape_line(summary, name))
    console.print(_params_table(summary))
    console.print(_flops_table(summary))


def _shape_line(s: ModelSummary, asked: str) -> str:
    alias = aliases_of(s.name)
    moe = f", {s.num_experts} experts (top-{s.experts_per_token})" if s.num_experts else ""
    tied = ", tied embeddings" if s.tie_word_embeddings else ""
    head = f"[bold]{s.name}[/bold] ({s.architecture})"
    if alias:
        head += f" [dim]aliases: {', '.join(alias)}[/dim]"
    return (
        f"{head}\n{s.num_layers} layers, hidden {s.hidden_size}, heads {s.num_heads}/{s.num_kv_heads} "
        f"x {s.head_dim}, ffn {s.intermediate_size}, vocab {s.vocab_size}{moe}{tied}\n{s.blocks}"
    )


def _params_table(s: ModelSummary) -> Table:
    table = Table(title="parameters and bytes", show_header=False)
    table.add_column("what")
    table.add_column("value", justify="right")
    table.add_row("total params", f"{s.num_params:,} ({_si(s.num_params)})")
    table.add_row("active params / token", f"{s.num_active_params:,} ({_si(s.num_active_params)})")
    for kind, count in s.params_by_kind:
        if count:
            table.add_row(f"  {kind}", f"{count:,}")
    table.add_row("weights bf16", _bytes(s.weight_bytes_bf16))
    table.add_row("weights fp8", _bytes(s.weight_bytes_fp8))
    table.add_row("KV cache / token bf16", _bytes(s.kv_bytes_per_token_bf16))
    return table


def _flops_table(s: ModelSummary) -> Table:
    table = Table(title="FLOPs per token (causal attention)")
    for col in (
        "sequence",
        "decode @ctx",
        "prefill avg",
        "train",
        "train sel. recompute",
        "train full recompute",
    ):
        table.add_column(col, justify="right")
    for f in s.flops:
        table.add_row(
            f"{f.num_tokens:,}",
            _si(f.decode_flops_per_token, "FLOP"),
            _si(f.prefill_flops_per_token, "FLOP"),
            _si(f.train_flops_per_token, "FLOP"),
            _si(f.train_selective_recompute_flops_per_token, "FLOP"),
            _si(f.train_full_recompute_flops_per_token, "FLOP"),
        )
    return table
