"""Writing results: safe file names, targets checked before the work, atomic writes, strict JSON.

- A name that comes from an input (a scenario's ``name``, verl's ``trainer.experiment_name``)
  becomes one file name component with :func:`safe_name`: it cannot climb out of the output
  folder (``../../x``) or point elsewhere (``/etc/x``).
- :func:`claim` refuses an existing target unless ``force``; commands call it before a long
  search or simulation, not after it.
- :func:`write_text` writes a temporary file next to the target and renames it over the target:
  a reader sees the old file or the new one, never half of one; on any failure (a full disk,
  Ctrl-C) the temporary file is removed and the target is untouched.
- :func:`dumps_strict` writes JSON that every parser reads: a non-finite number becomes ``null``
  with a ``<key>_reason`` field beside it (``Infinity`` and ``NaN`` are not JSON).
"""

from __future__ import annotations

import json
import math
import os
import re
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from rlperf.errors import SpecError, show_path

MAX_NAME_CHARS = 100
_UNSAFE = re.compile(r"[^A-Za-z0-9._+-]+")


def safe_name(name: str, default: str = "scenario") -> str:
    """``name`` as one file name component: other characters become ``_``, no leading dot."""
    cleaned = _UNSAFE.sub("_", str(name)).strip("._")[:MAX_NAME_CHARS]
    return cleaned or default


def output_folder(folder: str | Path, option: str) -> Path:
    """``folder`` if it is a folder or does not exist yet (created later); else a SpecError.
    Give the option's text (a ``str``): an empty one would become ``Path(".")``, the current folder."""
    if not str(folder).strip():
        raise SpecError(option, "is empty (an unset shell variable?)", "a folder path, or leave the option out")
    p = Path(folder)
    try:
        if p.exists() and not p.is_dir():
            raise SpecError(option, f"{show_path(p)!r} is a file, not a folder", "a folder (existing or new)")
    except OSError as err:
        raise SpecError(option, f"cannot use {show_path(p)!r} ({err.strerror or type(err).__name__})") from None
    return p


def claim(paths: Iterable[Path], force: bool, option: str) -> None:
    """Refuse targets that exist (unless ``force``) or are not files; call before the long work."""
    for p in paths:
        try:
            exists = p.exists() or p.is_symlink()
            is_file = p.is_file()
        except OSError as err:
            raise SpecError(option, f"cannot use {show_path(p)!r} ({err.strerror or type(err).__name__})") from None
        if exists and not is_file:
            raise SpecError(option, f"{show_path(p)!r} exists and is not a file", "a new file path")
        if exists and not force:
            raise SpecError(option, f"{show_path(p)!r} exists", "a new path, or --force to replace it")
        _check_writable(p.parent, option)


def _check_writable(folder: Path, option: str) -> None:
    """The nearest existing folder on the way to ``folder`` must be a folder we may write in."""
    here = folder
    while not here.exists() and here != here.parent:
        here = here.parent
    if not here.is_dir():
        raise SpecError(option, f"{show_path(here)!r} is a file, not a folder", "a path inside a folder")
    # A file made and removed there, not os.access: as root access() says yes to any folder,
    # and a read-only or virtual file system (/proc, /sys) refuses only the write itself.
    try:
        fd, probe = tempfile.mkstemp(dir=here, prefix=".rlperf-probe.", suffix=".tmp")
    except OSError as err:
        raise SpecError(option, f"cannot write in {show_path(here)!r} ({err.strerror or type(err).__name__})",
                        "a writable folder") from None
    os.close(fd)
    os.unlink(probe)


def write_text(path: str | Path, text: str) -> Path:
    """Write ``text`` to ``path`` atomically (temporary file in the same folder, then rename)."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=p.parent, prefix=f".{p.name[:60]}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, p)
    except BaseException:  # a full disk, Ctrl-C: leave the target as it was
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return p


def finite(data: Any) -> Any:
    """``data`` with every non-finite float replaced by None; in a mapping, a ``<key>_reason``
    field says what it was (``infinite``: e.g. an infeasible plan's step time)."""
    if isinstance(data, float):
        return data if math.isfinite(data) else None
    if isinstance(data, dict):
        out: dict[Any, Any] = {}
        for k, v in data.items():
            if isinstance(v, float) and not math.isfinite(v):
                out[k] = None
                out.setdefault(f"{k}_reason", "not a number" if math.isnan(v) else ("infinite" if v > 0 else "-infinite"))
            else:
                out[k] = finite(v)
        return out
    if isinstance(data, (list, tuple)):
        return [finite(v) for v in data]
    return data


def dumps_strict(data: Any, **kwargs: Any) -> str:
    """JSON text with no NaN/Infinity (see :func:`finite`); other floats as they are."""
    return json.dumps(finite(data), allow_nan=False, default=_default, **kwargs)


def _default(value: Any) -> Any:
    try:
        return finite(float(value))
    except (TypeError, ValueError):
        return str(value)
