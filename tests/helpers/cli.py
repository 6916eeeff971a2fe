"""Run the ``rlperf`` command in-process (fast: no interpreter start per case) with a time limit.

``invoke(args)`` returns the exit code and the captured streams. A case that runs past its time
limit fails (SIGALRM interrupts it), so an input that makes the tool work forever is a failure,
not a hung test run.
"""

from __future__ import annotations

import contextlib
import io
import re
import signal
import types
from dataclasses import dataclass
from pathlib import Path


PROGRESS = re.compile(r"^\[\s*[\d.]+ s\] ")


class TooSlow(Exception):
    """The command ran past its time limit."""


@dataclass(frozen=True)
class Outcome:
    code: int
    out: str
    err: str

    @property
    def err_lines(self) -> list[str]:
        return [ln for ln in self.err.splitlines() if ln.strip()]

    @property
    def error_lines(self) -> list[str]:
        """stderr lines other than one-line warnings and plan's progress lines (``[  1.2 s] ...``)."""
        return [ln for ln in self.err_lines if not ln.startswith("warning: ") and not PROGRESS.match(ln)]


def invoke(args: list[str], time_limit_s: float = 20.0) -> Outcome:
    from rlperf.cli.app import main

    out, err = io.StringIO(), io.StringIO()

    def alarm(signum: int, frame: types.FrameType | None) -> None:
        raise TooSlow(f"rlperf {' '.join(args)[:200]} ran past {time_limit_s} s")

    previous = signal.signal(signal.SIGALRM, alarm)
    signal.setitimer(signal.ITIMER_REAL, time_limit_s)
    code = 0
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            main(args)
    except SystemExit as ex:
        code = ex.code if isinstance(ex.code, int) else (0 if ex.code is None else 1)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    return Outcome(code, out.getvalue(), err.getvalue())


def assert_one_line_error(res: Outcome, *, contains: str = "") -> str:
    """Exit 2, exactly one ``error:`` line on stderr (warnings aside), no traceback."""
    assert res.code == 2, (res.code, res.err[-2000:], res.out[-500:])
    assert "Traceback" not in res.err and "Traceback" not in res.out, res.err[-2000:]
    lines = res.error_lines
    assert len(lines) == 1, res.err
    assert lines[0].startswith("error: "), lines
    assert contains in lines[0], (contains, lines[0])
    return lines[0]


def files_under(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if p.is_file()) if folder.exists() else []
