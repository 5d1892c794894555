"""The run directory: checked before anything is built, never overwritten without being asked.

A new run refuses a directory that already holds files (a second run there would replace
``metrics.jsonl``, ``config.yaml`` and ``final/`` but leave the old checkpoints and ``latest``:
a mixed directory); ``overwrite`` clears it first, and only when it looks like a dlmkit run (a
mistyped ``--output-dir ~`` must not delete a home directory). Paths that cannot be written —
under a file, read-only, not creatable — are errors before any work starts.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from .config import ConfigError

# Another rank's write probe may sit in the directory while this one looks at it.
_PROBE = ".dlmkit-write-test-"
# What a dlmkit run directory holds (see the README); one of them marks a directory as a run.
RUN_MARKERS = ("config.yaml", "metrics.jsonl", "checkpoints", "final")


def _nearest_existing(path: Path) -> Path:
    probe = path
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    return probe


def check_writable(run_dir: Path) -> None:
    """Raise ConfigError if ``run_dir`` cannot be created or written (writes nothing there;
    a probe file in its nearest existing ancestor is created and removed)."""
    run_dir = Path(run_dir)
    if run_dir.exists() and not run_dir.is_dir():
        raise ConfigError(f"output directory {run_dir} is a file, not a directory; pick another "
                          "--output-dir")
    base = _nearest_existing(run_dir.absolute())
    if not base.is_dir():
        raise ConfigError(f"output directory {run_dir} cannot be created: {base} is a file, not "
                          "a directory; pick another --output-dir")
    try:
        fd, probe = tempfile.mkstemp(prefix=_PROBE, dir=base)
    except OSError as err:
        why = err.strerror or type(err).__name__
        raise ConfigError(f"output directory {run_dir} cannot be created or written: "
                          f"writing in {base} fails ({why}); pick another --output-dir"
                          ) from None
    os.close(fd)
    os.unlink(probe)


def check_new_run_dir(run_dir: Path, *, overwrite: bool) -> None:
    """A new run may use ``run_dir``: it is writable, and empty unless ``overwrite``."""
    run_dir = Path(run_dir)
    check_writable(run_dir)
    if not run_dir.is_dir() or not any(not p.name.startswith(_PROBE) for p in run_dir.iterdir()):
        return
    held = [m for m in RUN_MARKERS if (run_dir / m).exists()]
    if not held:
        raise ConfigError(f"output directory {run_dir} is not empty and holds no dlmkit run "
                          f"(none of {', '.join(RUN_MARKERS)}); refusing to write into it or "
                          "clear it: pick another --output-dir")
    if not overwrite:
        raise ConfigError(f"output directory {run_dir} already holds a run ({', '.join(held)}); "
                          "a new run would mix with it. Continue it with --resume, replace it "
                          "with --overwrite (deletes it first), or pick another --output-dir")


def create_run_dir(run_dir: Path, *, overwrite: bool) -> None:
    """Make ``run_dir`` (after :func:`check_new_run_dir`); ``overwrite`` empties it first."""
    run_dir = Path(run_dir)
    if overwrite and run_dir.is_dir():
        shutil.rmtree(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
