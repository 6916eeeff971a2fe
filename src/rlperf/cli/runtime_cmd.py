"""`rlperf calibrate` and `rlperf measure`: the reference runtime on the local device (extra
``runtime``: torch + transformers). torch is imported only when a command runs."""

from __future__ import annotations

import math
from dataclasses import asdict
from pathlib import Path
from typing import Any

import typer

from rlperf.cli.app import app
from rlperf.cli.render import console, fmt_s, table
from rlperf.errors import SpecError


def _need_torch() -> None:
    try:
        import torch  # noqa: F401
        import transformers  # noqa: F401
    except ImportError:
        raise SpecError("runtime", "needs torch and transformers", "pip install 'rlperf[runtime]'") from None


@app.command("calibrate")
def calibrate_cmd(
    out: Path = typer.Option(..., "--out", help="profile file to write (.yaml, or .json)"),
    quick: bool = typer.Option(False, "--quick", help="smaller problems, fewer shapes (seconds; for tests)"),
    device: str = typer.Option("auto", "--device", help="auto (CUDA if available), cpu, cuda, cuda:N"),
    threads: int = typer.Option(0, "--threads", min=0, help="torch CPU threads (0: torch's default); measure with the same count"),
    dtype: str = typer.Option("", "--dtype", help="compute dtype of the attention benchmark and of attention_efficiency (default bf16)"),
    force: bool = typer.Option(False, "--force", help="replace --out if it exists"),
) -> None:
    """Micro-benchmark the local device and write its hardware profile (use it with --hardware-profile)."""
    _need_torch()
    from rlperf.outputs import claim

    claim([out], force, "--out")  # before the measurements
    from rlperf.runtime.calibrate import calibrate, write_profile

    cal = calibrate(device=device, quick=quick, compute_dtype=dtype or None, threads=threads or None, progress=lambda m: console.print(f"[dim]measuring {m}...[/dim]"))
    write_profile(cal, out)
    t = table(f"{cal.device_name}: measured in {cal.seconds:.1f} s", "benchmark", "result")
    for g in cal.gemm:
        t.add_row(f"GEMM {g.dtype} {g.m}x{g.n}x{g.k}", f"{g.flops_per_s / 1e9:,.1f} GFLOP/s")
    t.add_row("copy  |  triad", f"{cal.copy_bytes_per_s / 1e9:,.2f}  |  {cal.triad_bytes_per_s / 1e9:,.2f} GB/s")
    a = cal.attention_shape
    for d, rate in cal.attention_prefill_flops_per_s.items():
        t.add_row(f"attention prefill {d} (seq {a['seq']}, heads {a['heads']})", f"{rate / 1e9:,.1f} GFLOP/s")
    for d in cal.decode_bytes_per_s:
        t.add_row(f"decode {d}: GEMV  |  SDPA  |  both",
                  f"{cal.gemv_bytes_per_s[d] / 1e9:,.2f}  |  {cal.decode_attention_bytes_per_s[d] / 1e9:,.2f}  |  {cal.decode_bytes_per_s[d] / 1e9:,.2f} GB/s")
    t.add_row(f"AdamW step ({cal.adam_params / 1e6:.1f}M params)", f"{cal.adam_bytes_per_s / 1e9:,.2f} GB/s")
    if cal.device == "cuda":
        t.add_row("host copy  |  triad  |  AdamW", f"{cal.host_copy_bytes_per_s / 1e9:,.2f}  |  {cal.host_triad_bytes_per_s / 1e9:,.2f}  |  "
                  f"{cal.host_adam_bytes_per_s / 1e9:,.2f} GB/s")
    t.add_row("decoder layer fwd+bwd (MFU)", f"{cal.block_flops_per_s / 1e9:,.1f} GFLOP/s ({100 * cal.block_mfu:.0f}%)")
    t.add_row("decoder layer fwd only (MFU)", f"{cal.block_forward_flops_per_s / 1e9:,.1f} GFLOP/s ({100 * cal.block_forward_mfu:.0f}%)")
    t.add_row("HF generate per step: fixed  |  per layer", f"{fmt_s(cal.engine_step_s['fixed_s'])}  |  {fmt_s(cal.engine_step_s['per_layer_s'])}")
    t.add_row("kernel launch (eager)", fmt_s(cal.kernel_launch_s))
    if cal.graph_kernel_launch_s is not None:
        t.add_row("kernel launch (CUDA graph)", fmt_s(cal.graph_kernel_launch_s))
    console.print(t)
    prof = cal.to_profile()
    eff = table("profile: fractions of the measured peaks", "field", "value")
    for k in ("matmul_efficiency", "attention_efficiency", "hbm_efficiency", "decode_hbm_efficiency", "train_mfu_cap",
              "forward_mfu_cap", "host_adam_efficiency"):
        eff.add_row(k, f"{prof[k]['value']:.3f}")
    for d, e in prof["matmul_efficiency_by_dtype"].items():
        eff.add_row(f"matmul_efficiency ({d})", f"{e['value']:.3f}")
    console.print(eff)
    console.print(f"wrote {out} (accelerator id 'local')")


def _scenario_spec(source: str) -> Any:
    from rlperf.runtime.measure import RUNTIME_SCENARIOS
    from rlperf.scenario import load_scenario_spec

    if "/" not in source and (RUNTIME_SCENARIOS / f"{source}.yaml").is_file() and not _exists(source):
        source = str(RUNTIME_SCENARIOS / f"{source}.yaml")
    return load_scenario_spec(source)


def _exists(path: str) -> bool:
    try:
        return Path(path).exists()
    except OSError:  # a name too long to be a path
        return False


def _err(e: float | None) -> str:
    return "-" if e is None else f"{100 * e:+.0f}%"


@app.command("measure")
def measure_cmd(
    scenario: str = typer.Argument(..., help="scenario YAML file, a runtime scenario (tiny-grpo-cpu) or a shipped one"),
    compare: bool = typer.Option(False, "--compare", help="also simulate the scenario and print predicted vs measured per stage"),
    hardware_profile: Path | None = typer.Option(None, "--hardware-profile", help="profile file (from rlperf calibrate) for the prediction"),
    repeats: int = typer.Option(3, "--repeats", min=1, help="timed repetitions of the step (best and median reported)"),
    device: str = typer.Option("auto", "--device", help="auto (CUDA if available), cpu, cuda, cuda:N"),
    seed: int = typer.Option(0, "--seed", min=0),
    threads: int = typer.Option(0, "--threads", min=0, help="torch CPU threads (0: torch's default); as in calibrate"),
    out: Path = typer.Option(Path("out"), "--out", help="folder for the traces and the JSON result"),
    as_json: bool = typer.Option(False, "--json", help="print the result as JSON instead of tables"),
    force: bool = typer.Option(False, "--force", help="replace result and trace files that exist"),
) -> None:
    """Run one real RL step of SCENARIO on the local device, per-stage timers (and the prediction)."""
    _need_torch()
    from rlperf.outputs import claim, dumps_strict, output_folder, safe_name, write_text
    from rlperf.runtime.measure import compare as compare_fn
    from rlperf.runtime.measure import measure, predict
    from rlperf.runtime.step import RuntimeOptions
    from rlperf.sim.trace import write_chrome_trace

    spec = _scenario_spec(scenario)
    stem = output_folder(out, "--out") / safe_name(spec.name)
    paths = [Path(f"{stem}.measured.trace.json"), Path(f"{stem}.measure.json")]
    if compare:
        paths.append(Path(f"{stem}.predicted.trace.json"))
    claim(paths, force, "--out")  # before the measurement, not after it
    sim = predict(spec, hardware_profile) if compare else None  # fail fast on a bad profile
    meas = measure(spec, RuntimeOptions(seed=seed, device=device, threads=threads or None), repeats)
    last = meas.last
    trace = write_chrome_trace(paths[0], last.segments, title=f"{spec.name} (measured)")
    payload: dict[str, Any] = {
        "measured": {
            "runs": [{k: v for k, v in asdict(r).items() if k != "segments"} for r in meas.runs],
            "stage_best_s": {n: meas.stage_best(n) for n in meas.stage_names()},
            "stage_median_s": {n: meas.stage_median(n) for n in meas.stage_names()},
            "step_best_s": meas.step_best_s,
            "load_average": meas.load_average,
            "cpus": meas.cpus,
        }
    }
    cmp = None
    if sim is not None:
        from rlperf.catalog import load_model
        from rlperf.runtime.measure import unmodelled

        cmp = compare_fn(meas, sim, unmodelled(hardware_profile or spec.cluster.profile, load_model(spec.model).num_layers, meas))
        write_chrome_trace(paths[2], sim.segments, title=f"{spec.name} (predicted)")
        payload["comparison"] = {
            "stages": [{**asdict(r), "error": r.error} for r in cmp.rows],
            "measured_step_s": cmp.measured_step_s,
            "predicted_step_s": cmp.predicted_step_s,
            "step_error": cmp.step_error,
            "notes": list(cmp.notes),
        }
    text = dumps_strict(payload, indent=1)
    res_path = write_text(paths[1], text)
    if as_json:
        typer.echo(text)
        return
    _render(meas, cmp)
    console.print(f"wrote {res_path} and {trace} (open traces in https://ui.perfetto.dev)")


def _render(meas: Any, cmp: Any) -> None:
    last = meas.last
    head = table(f"{last.scenario}: {last.algorithm}, {last.model} on {last.device}, best of {len(meas.runs)}", "metric", "value")
    head.add_row("step time (best  |  median)", f"{fmt_s(meas.step_best_s)}  |  {fmt_s(meas.step_median_s)}")
    head.add_row("responses  |  response tokens", f"{last.num_responses}  |  {last.response_tokens:,}")
    head.add_row("train tokens (real  |  computed)", f"{last.train_tokens:,}  |  {last.padded_train_tokens:,}")
    head.add_row("reward mean  |  policy loss", f"{last.reward_mean:.3f}  |  {last.policy_loss:.4g}")
    if not math.isnan(last.critic_loss):
        head.add_row("critic loss", f"{last.critic_loss:.4g}")
    if not math.isnan(meas.load_average):
        head.add_row("load average (1 min)  |  CPUs", f"{meas.load_average:.2f}  |  {meas.cpus}")
    console.print(head)
    if cmp is None:
        t = table("stages (measured)", "stage", "best", "median", "share")
        total = sum(meas.stage_best(n) for n in meas.stage_names()) or 1.0
        for n in meas.stage_names():
            t.add_row(n, fmt_s(meas.stage_best(n)), fmt_s(meas.stage_median(n)), f"{100 * meas.stage_best(n) / total:.0f}%")
        console.print(t)
    else:
        t = table("predicted vs measured", "stage", "measured (best)", "median", "predicted", "error")
        for r in cmp.rows:
            t.add_row(r.name, fmt_s(r.measured_s) if r.measured_s is not None else "-",
                      fmt_s(r.measured_median_s) if r.measured_median_s is not None else "-",
                      fmt_s(r.predicted_s) if r.predicted_s is not None else "-", _err(r.error))
        t.add_row("whole step", fmt_s(cmp.measured_step_s), fmt_s(meas.step_median_s), fmt_s(cmp.predicted_step_s), _err(cmp.step_error))
        console.print(t)
    for n in (*last.notes, *(cmp.notes if cmp is not None else ())):
        console.print(f"note: {n}")
