"""The ``rlperf`` command. Each concept registers its commands from its own module.

Errors a user can cause (``SpecError`` / ``ValueError``, an unreadable or unwritable file) print as
one line and exit 2; Ctrl-C prints one line and exits 130.
"""

from __future__ import annotations

import gc
import os
import sys
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from typing import NoReturn, TextIO

import typer

from pydantic import ValidationError

from rlperf.errors import SpecError, one_line, show_path

app = typer.Typer(
    name="rlperf",
    help="Performance model, simulator and planner for RL post-training of reasoning LMs.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _register() -> None:
    """Import every ``rlperf.cli.*_cmd`` module; each adds its commands to ``app``."""
    import importlib
    import pkgutil

    import rlperf.cli as pkg

    for info in sorted(pkgutil.iter_modules(pkg.__path__), key=lambda i: i.name):
        if info.name.endswith("_cmd"):
            importlib.import_module(f"rlperf.cli.{info.name}")


@contextmanager
def collector_paused() -> Iterator[None]:
    """Python's cyclic garbage collector off for one command's work, then back as it was.

    A planner question allocates millions of containers and keeps large lists (rollout and
    stage-cost memos); every full collection walks them all. Measured on the 16-node PPO
    question: 4 full collections and ~500 younger ones cost 0.7-0.8 CPU-s of a 4.4-5.5 CPU-s
    question, the 1,024-GPU question 1.6 CPU-s. Reference counting still frees almost
    everything; what only the collector frees (reference cycles) is left until the command
    ends: about 100k objects, 9-25 MB more peak memory on those questions
    (docs/benchmarks.md). The process ends after the command, so none of it outlives it; a
    Python caller of :func:`rlperf.api.plan` keeps its own collector settings.

    Back on, the collector would walk every object the command made at its first young
    collection (all of them are still in the youngest generation: 0.14 CPU-s after the README
    question), so they go to the oldest generation first (frozen and unfrozen), unless
    something else froze objects (unfreezing would release those too)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            if gc.get_freeze_count() == 0:
                gc.freeze()
                gc.unfreeze()
            gc.enable()


def _show_warning(message: Warning | str, category: type[Warning], filename: str, lineno: int,
                  file: TextIO | None = None, line: str | None = None) -> None:
    """Warnings as one line (``warning: ...``), each once, without the source line Python shows."""
    text = " ".join(str(message).split())
    if text not in _shown:
        _shown.add(text)
        print(f"warning: {text}", file=sys.stderr)


_shown: set[str] = set()


# Commands that run torch (the reference runtime): the threads of its BLAS are torch's to set.
_TORCH_COMMANDS = frozenset({"calibrate", "measure"})


def _one_blas_thread(args: list[str]) -> None:
    """One OpenBLAS thread for numpy, unless the user set a number or the command runs torch.

    numpy's OpenBLAS starts a worker thread per core when numpy loads, and they spin: 0.08
    CPU-s of every process on 2 cores (``python -c "import numpy"``, median of 12: 0.19 against
    0.11 CPU-s; docs/benchmarks.md), for nothing, since rlperf's arrays never call BLAS (its
    work is elementwise). Set before the commands' modules load numpy (:func:`_register`)."""
    if not (args and args[0] in _TORCH_COMMANDS):
        os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")


def main(argv: list[str] | None = None) -> None:
    """Run the command line; every failure a user can cause ends in one line on stderr.

    Exit codes: 0 done, 2 bad input (``error: ...``), 70 internal error (a bug: one line too; the
    traceback with ``RLPERF_TRACEBACK=1``), 130 interrupted (Ctrl-C).
    """
    warnings.showwarning = _show_warning
    _one_blas_thread(sys.argv[1:] if argv is None else argv)
    try:
        _register()
        # Not standalone, typer turns Ctrl-C into Exit(130) and *returns* the code (it was dropped).
        code = app(args=argv, standalone_mode=False)
    except KeyboardInterrupt:
        _interrupted()
    except ValidationError as err:  # a spec built inside a command: its first error, in one line
        print(f"error: {one_line(err)}", file=sys.stderr)
        raise SystemExit(2) from None
    except (SpecError, ValueError, FileNotFoundError) as err:
        print(f"error: {' '.join(str(err).split())}", file=sys.stderr)
        raise SystemExit(2) from None
    except OSError as err:  # e.g. a full disk or a folder that cannot be written
        where = f"{show_path(err.filename)}: " if err.filename else ""
        print(f"error: {where}{err.strerror or type(err).__name__}", file=sys.stderr)
        raise SystemExit(2) from None
    except typer.Exit as ex:
        code = ex.exit_code
    except Exception as err:  # click usage errors
        # typer >= 0.20 raises the exceptions of its vendored click (typer._click), not click's.
        import click

        modules = [click.exceptions]
        try:
            from typer import _click

            modules.append(_click.exceptions)
        except ImportError:  # older typer uses click itself
            pass
        for exc in modules:
            if isinstance(err, getattr(exc, "NoArgsIsHelpError", ())):  # bare group: show its help
                print(err.format_message())  # type: ignore[attr-defined]
                raise SystemExit(0) from None
            if isinstance(err, exc.ClickException):
                print(f"error: {err.format_message()}", file=sys.stderr)
                raise SystemExit(2) from None
            if isinstance(err, getattr(exc, "Abort", ())):
                _interrupted()
        if _from_interrupt(err):
            _interrupted()
        if os.environ.get("RLPERF_TRACEBACK"):
            raise
        # A bug, not a bad input: one line still, with its own exit code (EX_SOFTWARE) so that
        # scripts and the fuzz tests tell it from a refused input; the traceback on request.
        print(f"error: internal error ({type(err).__name__}: {' '.join(str(err).split())[:300]}); "
              "rerun with RLPERF_TRACEBACK=1 for the traceback and please report it", file=sys.stderr)
        raise SystemExit(70) from None
    if argv is None:
        # rlperf as a program (not a caller's main(argv)): the process ends after the command,
        # and the interpreter's shutdown collection would walk every object it leaves (a
        # planner question's memos: 0.3 of the README question's 4.8 CPU-s). Moved to the
        # collector's permanent generation, they are only freed.
        gc.freeze()
    if code == 130:
        _interrupted()
    if isinstance(code, int) and code != 0:
        raise SystemExit(code)


def _from_interrupt(err: BaseException) -> bool:
    """Whether ``err`` was raised because of a Ctrl-C: a KeyboardInterrupt that lands inside a
    C or compiled call (numpy, numba, a process pool's result handling) can surface as another
    exception (``SystemError: ... returned a result with an exception set``) that carries it as
    its cause or context."""
    seen: set[int] = set()
    cur: BaseException | None = err
    while cur is not None and id(cur) not in seen:
        if isinstance(cur, KeyboardInterrupt):
            return True
        seen.add(id(cur))
        cur = cur.__cause__ or cur.__context__
    return False


def _interrupted() -> NoReturn:
    print("error: interrupted (nothing written)", file=sys.stderr)
    ray = sys.modules.get("ray")
    if ray is not None:
        # A Ctrl-C reaches Ray's own processes too (one process group). Stop the local instance
        # (its agents outlive the driver otherwise), without cancelling tasks first: cancelling
        # raced their replies and crashed the driver's core-worker threads under load (a C++
        # abort in TaskManager::CompletePendingTask), as did the interpreter's finalization
        # afterwards (SIGSEGV). So leave without finalization: nothing is left to write, and the
        # exit code stays 130.
        try:
            if ray.is_initialized():
                ray.shutdown()
        except Exception:  # a half-started instance: its processes got the same SIGINT
            pass
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(130)
    raise SystemExit(130) from None


if __name__ == "__main__":
    # ``python -m rlperf.cli.app`` runs this file as ``__main__``, a second module object: the
    # ``*_cmd`` modules register their commands on ``rlperf.cli.app.app``, not on this one, so an
    # own ``main()`` here would find a Typer with no commands. Run the registered module's.
    from rlperf.cli.app import main as registered_main

    registered_main()
