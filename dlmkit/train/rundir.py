"""The run directory: checked before anything is built, never overwritten without being asked.

A new run refuses a directory that already holds files (a second run there would replace
``metrics.jsonl``, ``config.yaml`` and ``final/`` but leave the old checkpoints and ``latest``:
a mixed directory); ``overwrite`` clears it first, and only when it looks like a dlmkit run (a
mistyped ``--output-dir ~`` must not delete a home directory). Paths that cannot be written —
under a file, read-only, not creatable — are errors before any work starts.

A run holds an OS lock on ``RUN/.lock`` (``flock``) from before these checks to its end, so a
second run started into the same directory (or a ``--resume`` of it) while the first is alive
is an error instead of interleaving ``metrics.jsonl`` and replacing the checkpoints. The kernel
drops the lock when its process dies, however it dies: a lock file left by a killed run does
not block the next one.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import socket
import tempfile
from pathlib import Path

from .config import ConfigError
from .distributed import World

# Another rank's write probe may sit in the directory while this one looks at it.
_PROBE = ".dlmkit-write-test-"
# What a dlmkit run directory holds (see the README); one of them marks a directory as a run.
RUN_MARKERS = ("config.yaml", "metrics.jsonl", "checkpoints", "final")
LOCK = ".lock"


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
    if not run_dir.is_dir() or not any(not p.name.startswith(_PROBE) and p.name != LOCK
                                       for p in run_dir.iterdir()):
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
    """Make ``run_dir`` (after :func:`check_new_run_dir`); ``overwrite`` empties it first,
    keeping the lock this run holds on it."""
    run_dir = Path(run_dir)
    if overwrite and run_dir.is_dir():
        for path in run_dir.iterdir():
            if path.name == LOCK:
                continue
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            else:
                path.unlink()
    run_dir.mkdir(parents=True, exist_ok=True)


class RunLock:
    """This process's lock on ``RUN/.lock`` (see :func:`lock_run_dir`)."""

    def __init__(self, run_dir: Path, fd: int, created: list[Path]) -> None:
        self.run_dir, self.fd = run_dir, fd
        self.created = created  # directories made to hold the lock, deepest first

    @classmethod
    def acquire(cls, run_dir: Path) -> RunLock:
        """Lock ``run_dir`` (created if missing), or raise ConfigError naming the holder."""
        run_dir = Path(run_dir)
        created = [d for d in (run_dir, *run_dir.parents) if not d.exists()]
        run_dir.mkdir(parents=True, exist_ok=True)
        path = run_dir / LOCK
        while True:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                holder = os.read(fd, 200).decode(errors="replace").strip()
                os.close(fd)
                who = f"pid {holder}" if holder else "its pid unknown"
                raise ConfigError(f"output directory {run_dir} is in use by another training "
                                  f"run ({who}; it holds {path}). Wait for it to finish (or "
                                  "stop it), or pick another --output-dir") from None
            # A holder that just finished removed the file between our open and our lock: we
            # would hold a lock on a file no one else opens. Lock the new one instead.
            try:
                current = os.stat(path).st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                current = False
            if current:
                break
            os.close(fd)
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()} on {socket.gethostname()}\n".encode())
        return cls(run_dir, fd, created)

    def release(self) -> None:
        """Drop the lock and its file; the directories made for it go too while still empty
        (a run that stopped at a config error leaves nothing behind)."""
        if self.fd is None:
            return
        try:
            (self.run_dir / LOCK).unlink(missing_ok=True)  # before the unlock: see acquire()
        finally:
            os.close(self.fd)
            self.fd = None
        for directory in self.created:
            try:
                directory.rmdir()
            except OSError:  # not empty: the run wrote there
                break


def lock_run_dir(run_dir: Path, world: World) -> RunLock | None:
    """The main rank locks ``run_dir`` for the whole run (the other ranks write only where it
    says); if it cannot, every rank raises the same ConfigError. Release the returned lock
    (None on the other ranks) when the run ends, however it ends."""
    error, lock = None, None
    if world.is_main:
        try:
            lock = RunLock.acquire(run_dir)
        except ConfigError as err:
            error = str(err)
    if world.distributed:
        import torch.distributed as dist

        shared = [error]
        dist.broadcast_object_list(shared, src=0)
        error = shared[0]
    if error is not None:
        raise ConfigError(error)
    return lock
