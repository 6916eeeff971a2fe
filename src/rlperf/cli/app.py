"""The ``rlperf`` command. Each concept registers its commands from its own module.

Errors a user can cause (``SpecError`` / ``ValueError``) print as one line and exit 2.
"""

from __future__ import annotations

import sys

import typer

from rlperf.errors import SpecError

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


def main(argv: list[str] | None = None) -> None:
    _register()
    try:
        app(args=argv, standalone_mode=False)
    except (SpecError, ValueError, FileNotFoundError) as err:
        print(f"error: {err}", file=sys.stderr)
        raise SystemExit(2) from None
    except typer.Exit as ex:
        raise SystemExit(ex.exit_code) from None
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
                raise SystemExit(130) from None
        raise


if __name__ == "__main__":
    main()
