"""Rendering helpers shared by CLI commands (rich tables, human units)."""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from rich.console import Console
from rich.table import Table

if TYPE_CHECKING:
    from rlperf.scenario import Scenario

# Piped output (CI logs, files) gets a wide console so the plan tables stay on one line per row.
console = Console(width=None if sys.stdout.isatty() else 160)


def fmt_s(t: float) -> str:
    if math.isnan(t):
        return "-"
    if t >= 3600:
        return f"{t / 3600:.2f} h"
    if t >= 60:
        return f"{t / 60:.1f} min"
    if t >= 1:
        return f"{t:.1f} s"
    if t >= 1e-3:
        return f"{t * 1e3:.1f} ms"
    return f"{t * 1e6:.0f} µs"


def fmt_range_end(seconds: float) -> str:
    """One end of a step-time range; infinite where the plan does not run at those lengths
    (e.g. out of memory at the longer mean), which "inf h" did not say."""
    return fmt_s(seconds) if math.isfinite(seconds) else "infeasible at those lengths"


def fmt_bytes(n: float) -> str:
    for unit, scale in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n:.0f} B"


def fmt_count(n: float) -> str:
    if abs(n) >= 1e15:
        return f"{n:.2e}"
    for unit, scale in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.2f}{unit}"
    return f"{n:.0f}"


def question_line(sc: Scenario, suffix: str = "") -> str:
    """What a question runs, first in its answer (a scenario file may leave the model or the
    cluster to their defaults: the answer names them)."""
    wl = sc.workload
    return (f"[bold]{sc.algorithm.name}[/] on [bold]{sc.models['actor'].name}[/], {sc.cluster.num_nodes}x{sc.cluster.gpus_per_node} "
            f"{sc.cluster.accelerator.id}, {wl.prompts_per_step} prompts x {wl.group_size}, max response {wl.max_response_tokens:,}{suffix}")


def table(title: str, *columns: str) -> Table:
    t = Table(title=title, title_justify="left", header_style="bold")
    for i, c in enumerate(columns):
        t.add_column(c, justify="left" if i == 0 else "right")
    return t


@contextmanager
def progress_reporter(con: Console) -> Iterator[Callable[[str, int, int], None]]:
    """The one progress display of long commands: a transient bar on a terminal; on a pipe,
    one line per phase on stderr (so a piped run is never silent for minutes)."""
    if not con.is_terminal:
        t0 = time.perf_counter()
        last: list[str] = []

        def plain(what: str, done: int, total: int) -> None:
            if not last or last[-1] != what:
                last.append(what)
                print(f"[{time.perf_counter() - t0:6.1f} s] {what}", file=sys.stderr, flush=True)

        yield plain
        return
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                  TimeElapsedColumn(), console=con, transient=True) as bar:
        task = bar.add_task("planning", total=1)

        def update(what: str, done: int, total: int) -> None:
            bar.update(task, description=what, completed=done, total=max(total, 1))

        yield update
