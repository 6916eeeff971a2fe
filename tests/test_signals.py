"""Ctrl-C: each long command exits 130 with one line, writes nothing, leaves no worker behind.

These run the command in a subprocess (a signal is sent to a process) and are the only
subprocess cases of the hardening suite.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from typing import IO
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"


def interrupt(args: list[str], tmp_path: Path, after_s: float, wait_for: str | None = None) -> tuple[int, str]:
    """Run ``rlperf args``; Ctrl-C it ``after_s`` seconds after start, or after the first stderr
    line matching ``wait_for`` (so the interrupt lands in the work, however fast the machine)."""
    env = {**os.environ, "PYTHONPATH": f"{SRC}{os.pathsep}{os.environ.get('PYTHONPATH', '')}", "COLUMNS": "120"}
    proc = subprocess.Popen([sys.executable, "-c", "from rlperf.cli.app import main; main()", *args], cwd=tmp_path, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True)
    assert proc.stderr is not None
    lines: list[str] = []
    seen = threading.Event()

    def read(stream: IO[str]) -> None:
        for line in stream:
            lines.append(line)
            if wait_for is None or re.search(wait_for, line):
                seen.set()

    reader = threading.Thread(target=read, args=(proc.stderr,), daemon=True)
    reader.start()
    if wait_for is not None:
        assert seen.wait(timeout=120), f"never printed {wait_for!r}: {''.join(lines)[-2000:]}"
    time.sleep(after_s)
    assert proc.poll() is None, f"finished before the interrupt: {''.join(lines)[-2000:]}"
    os.killpg(proc.pid, signal.SIGINT)  # as a terminal's Ctrl-C: the whole process group
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        pytest.fail("did not stop within 60 s of Ctrl-C")
    reader.join(timeout=10)
    return proc.returncode, "".join(lines)


RAY_LOG = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+\s+(INFO|WARNING) ")  # Ray's own start-up lines


def assert_interrupted(code: int, err: str) -> None:
    assert code == 130, (code, err[-2000:])
    assert "Traceback" not in err and "Fatal Python error" not in err, err[-3000:]
    lines = [ln for ln in err.splitlines() if ln.strip() and not RAY_LOG.match(ln)]
    # Progress lines (plan prints them on stderr) may come before; the error is one line, last.
    assert [ln for ln in lines if ln.startswith("error")] == ["error: interrupted (nothing written)"], lines
    assert lines[-1] == "error: interrupted (nothing written)", lines
    assert all(ln.startswith(("[", "warning: ", "error: ")) for ln in lines), lines


def test_plan_ctrl_c(tmp_path: Path) -> None:
    code, err = interrupt(["plan", "--report", str(tmp_path / "report"), "--jobs", "2"], tmp_path, after_s=1,
                          wait_for=r"candidates")
    assert_interrupted(code, err)
    assert not (tmp_path / "report").exists() or not any((tmp_path / "report").iterdir())


def test_simulate_ctrl_c(tmp_path: Path) -> None:
    code, err = interrupt(["simulate", "grpo-qwen2.5-7b-colocated-sync", "--iterations", "1000", "--out", str(tmp_path / "out")],
                          tmp_path, after_s=6)
    assert_interrupted(code, err)
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


def test_validate_ctrl_c(tmp_path: Path) -> None:
    code, err = interrupt(["validate", "--jobs", "2"], tmp_path, after_s=6)
    assert_interrupted(code, err)


def test_plan_ray_ctrl_c(tmp_path: Path) -> None:
    pytest.importorskip("ray")
    code, err = interrupt(["plan", "--executor", "ray", "--report", str(tmp_path / "report")], tmp_path, after_s=1,
                          wait_for=r"Started a local Ray instance")
    assert_interrupted(code, err)


def test_an_interrupt_inside_a_c_call_is_an_interrupt(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """A Ctrl-C landing in a C or compiled call surfaces as another exception carrying it
    (``SystemError: <built-in ...> returned a result with an exception set``, seen in
    test_plan_ctrl_c): it exits 130 with the interrupt's line, not as an internal error (70)."""
    import rlperf.cli.app as cli

    def raising(**_: object) -> None:
        try:
            raise KeyboardInterrupt
        except KeyboardInterrupt as ki:
            raise SystemError("<built-in method> returned a result with an exception set") from ki

    cli._register()  # the commands register on the real app first
    monkeypatch.delitem(sys.modules, "ray", raising=False)  # with Ray loaded, _interrupted leaves by os._exit
    monkeypatch.setattr(cli, "app", raising)
    with pytest.raises(SystemExit) as ex:
        cli.main(["plan"])
    assert ex.value.code == 130
    assert capsys.readouterr().err.strip() == "error: interrupted (nothing written)"
