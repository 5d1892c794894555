"""Checkpoints that resume bit-exactly, written atomically, checked before they are trusted.

A checkpoint is a directory ``RUN/checkpoints/step_XXXXXXX`` holding the model and optimizer
state (torch.distributed.checkpoint when distributed, one ``torch.save`` file otherwise),
``trainer_rank*.pt`` (scheduler, step, RNG states), ``config.yaml`` (the resolved config it was
trained with, which a resume is checked against) and, written last, ``manifest.json`` (every
file's size). It is written to a temporary name and renamed into place only when complete, so a
crash mid-save leaves the previous checkpoint usable; ``latest`` points at the newest complete
one. On resume a checkpoint whose files do not match its manifest (truncated by a full disk, a
copy cut short) is skipped with a message naming the file. Data position needs no state: the
sampler is a pure function of the step.
"""

from __future__ import annotations

import errno
import json
import os
import pickle
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import torch

from .config import dump_yaml, load_yaml
from .distributed import World, barrier

MANIFEST = "manifest.json"
CONFIG = "config.yaml"
_STEP_DIR = re.compile(r"^step_(\d+)$")


class CheckpointError(OSError):
    """A checkpoint could not be written or read; the message says which file and what to do."""


def _rng_state() -> dict:
    state = {"torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _model_optimizer_state(model, optimizer, world: World, ema=None) -> dict:
    """What ``state`` holds: model, optimizer and, with ``train.ema_decay``, the weight
    average (:mod:`dlmkit.train.ema`)."""
    if world.distributed:
        from torch.distributed.checkpoint.state_dict import get_state_dict

        model_state, optim_state = get_state_dict(model, optimizer)
        state = {"model": model_state, "optimizer": optim_state}
    else:
        state = {"model": model.state_dict(), "optimizer": optimizer.state_dict()}
    if ema is not None:
        state["ema"] = ema.state_dict()
    return state


def _files(directory: Path) -> dict[str, int]:
    return {str(f.relative_to(directory)): f.stat().st_size
            for f in sorted(directory.rglob("*")) if f.is_file() and f.name != MANIFEST}


def _mib(n: int) -> str:
    return f"{n / 2**20:.1f} MiB"


def _write_failure(err: BaseException, root: Path, step: int) -> CheckpointError:
    """The message for a checkpoint that could not be written (a full disk, most often:
    torch then reports ``enforce fail at inline_container.cc ... file write failed``)."""
    full = (isinstance(err, OSError) and err.errno == errno.ENOSPC) or \
        "file write failed" in str(err) or "No space left" in str(err)
    try:
        free = f"; {_mib(shutil.disk_usage(root).free)} free there"
    except OSError:
        free = ""
    previous = newest_complete_checkpoint(root.parent)
    keep = (f"The newest complete checkpoint, {previous}, is intact: free some space and "
            f"continue from it with --resume." if previous is not None else
            "No earlier checkpoint exists: free some space and start the run again.")
    first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    cause = "the disk is full" if full else f"{type(err).__name__}: {first}"
    return CheckpointError(f"could not write the step-{step} checkpoint under {root} ({cause}"
                           f"{free}). {keep}")


def save_checkpoint(run_dir: Path, step: int, model, optimizer, scheduler, world: World,
                    config: dict | None = None, ema=None) -> Path:
    """Write ``RUN/checkpoints/step_<step>`` atomically; ``config`` is stored beside it, and
    ``ema`` (a :class:`~dlmkit.train.ema.WeightAverage`) with the model."""
    root = Path(run_dir) / "checkpoints"
    final = root / f"step_{step:07d}"
    tmp = root / f".tmp_step_{step:07d}"
    try:
        if world.is_main:
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir(parents=True)
        barrier(world)
        state = _model_optimizer_state(model, optimizer, world, ema)
        if world.distributed:
            import torch.distributed.checkpoint as dcp

            dcp.save(state, checkpoint_id=str(tmp / "state"))
        else:
            torch.save(state, tmp / "state.pt")
        torch.save({"step": step, "scheduler": scheduler.state_dict(), "rng": _rng_state(),
                    "ema": ema is not None}, tmp / f"trainer_rank{world.rank}.pt")
        barrier(world)
        if world.is_main:
            if config is not None:
                (tmp / CONFIG).write_text(dump_yaml(config))
            (tmp / MANIFEST).write_text(json.dumps({"step": step, "files": _files(tmp)},
                                                   indent=1))
    except (OSError, RuntimeError) as err:
        if world.is_main:
            shutil.rmtree(tmp, ignore_errors=True)
        raise _write_failure(err, root, step) from err
    barrier(world)
    if world.is_main:
        shutil.rmtree(final, ignore_errors=True)
        os.replace(tmp, final)
        link = root / "latest.tmp"
        link.write_text(final.name)
        os.replace(link, root / "latest")
    barrier(world)
    return final


def incomplete_reason(path: Path) -> str | None:
    """Why checkpoint ``path`` cannot be resumed from (None: it is complete)."""
    path = Path(path)
    manifest = path / MANIFEST
    if not manifest.is_file():
        # Written before manifests existed: trust it if its state files are there.
        has_state = (path / "state.pt").is_file() or (path / "state").is_dir()
        if has_state and (path / "trainer_rank0.pt").is_file():
            return None
        return f"{path} has no {MANIFEST} and no model state"
    try:
        files = json.loads(manifest.read_text())["files"]
    except (ValueError, KeyError, TypeError):
        return f"{manifest} is unreadable"
    for name, size in files.items():
        f = path / name
        if not f.is_file():
            return f"{f} is missing"
        actual = f.stat().st_size
        if actual != size:
            return f"{f} is truncated ({actual} of {size} bytes)"
    return None


def step_dirs(run_dir: Path) -> list[Path]:
    """``RUN/checkpoints/step_*`` directories, newest step first."""
    root = Path(run_dir) / "checkpoints"
    if not root.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in root.iterdir()
             if p.is_dir() and (m := _STEP_DIR.match(p.name))]
    return [p for _, p in sorted(found, reverse=True)]


def latest_checkpoint(run_dir: Path) -> Path | None:
    """What ``latest`` points at, if that directory exists (no completeness check)."""
    pointer = Path(run_dir) / "checkpoints" / "latest"
    if not pointer.is_file():
        return None
    path = pointer.parent / pointer.read_text().strip()
    return path if path.is_dir() else None


@dataclass
class ResumePoint:
    """The checkpoint a resume starts from, and what was skipped to find it."""

    path: Path
    notes: list[str] = field(default_factory=list)

    @property
    def step(self) -> int:
        """The step the checkpoint was saved at (from its ``step_XXXXXXX`` name)."""
        return int(_STEP_DIR.match(self.path.name).group(1))

    @property
    def config(self) -> dict | None:
        """The config the checkpoint was trained with (None: written by an older dlmkit)."""
        f = self.path / CONFIG
        return load_yaml(f.read_text()) if f.is_file() else None


def newest_complete_checkpoint(run_dir: Path | None) -> Path | None:
    """The checkpoint ``--resume`` would start from, or None when there is none."""
    if run_dir is None:
        return None
    try:
        return find_resume_point(run_dir).path
    except FileNotFoundError:
        return None


def find_resume_point(run_dir: Path) -> ResumePoint:
    """The newest complete checkpoint of ``run_dir``; ``notes`` say why newer ones, or the one
    ``latest`` names, were passed over. Raises FileNotFoundError when there is none."""
    run_dir = Path(run_dir)
    pointer = run_dir / "checkpoints" / "latest"
    notes: list[str] = []
    named = pointer.read_text().strip() if pointer.is_file() else None
    if named is not None and not (pointer.parent / named).is_dir():
        notes.append(f"{pointer} names {named}, which does not exist")
    for path in step_dirs(run_dir):
        reason = incomplete_reason(path)
        if reason is None:
            if named is not None and path.name != named and not notes:
                notes.append(f"{pointer} names {named}, but {path.name} is newer and complete")
            return ResumePoint(path, notes)
        notes.append(f"checkpoint {path.name} is incomplete: {reason}")
    detail = f" ({'; '.join(notes)})" if notes else ""
    raise FileNotFoundError(f"--resume: no complete checkpoint under {run_dir}{detail}")


def _load(file: Path, **kwargs):
    try:
        return torch.load(file, weights_only=False, **kwargs)
    except (RuntimeError, OSError, EOFError, ValueError, pickle.UnpicklingError) as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise CheckpointError(f"checkpoint file {file} is unreadable ({first}); delete its "
                              f"directory to resume from the one before") from err


def load_model_weights(path: Path, model) -> dict[str, torch.Tensor] | None:
    """Load checkpoint ``path``'s model weights into ``model`` (one process, not wrapped; the
    checkpoint may come from any number of ranks) and return its weight average (parameter
    name -> tensor; None when it has none), for an export of that step. The optimizer state
    is not read."""
    path = Path(path)
    reason = incomplete_reason(path)
    if reason is not None:
        raise CheckpointError(f"checkpoint {path} is incomplete: {reason}")
    try:
        if (path / "state.pt").is_file():
            state = _load(path / "state.pt", mmap=True)
            model_state, ema = state["model"], state.get("ema")
            shadow = None if ema is None else dict(ema["shadow"])
        else:  # torch.distributed.checkpoint, written by DDP / FSDP2 ranks
            model_state, shadow = _load_distributed_weights(path / "state", model)
        model.load_state_dict(model_state)
    except (RuntimeError, KeyError) as err:
        if isinstance(err, CheckpointError):
            raise
        first = "; ".join(line.strip() for line in str(err).strip().splitlines()[:3])
        raise CheckpointError(f"checkpoint {path} does not fit the model of its config.yaml "
                              f"({first})") from err
    if shadow is None:
        return None
    # A DDP-wrapped model names its parameters "module.<name>"; FSDP2 and one process don't.
    return {name.removeprefix("module."): tensor for name, tensor in shadow.items()}


def _load_distributed_weights(directory: Path, model):
    """``(model state, weight average or None)`` from a torch.distributed.checkpoint
    directory, read into full tensors in this process."""
    import torch.distributed.checkpoint as dcp

    keys = dcp.FileSystemReader(str(directory)).read_metadata().state_dict_metadata
    state: dict = {"model": model.state_dict()}  # read in place into the parameters
    prefix = "ema.shadow."
    shadow_names = [k[len(prefix):] for k in keys if k.startswith(prefix)]
    if shadow_names:
        params = dict(model.named_parameters())
        shadow = {}
        for name in shadow_names:
            own = name.removeprefix("module.")
            if own not in params:
                raise CheckpointError(f"checkpoint {directory.parent}: its weight average has "
                                      f"{name!r}, which the model of its config.yaml lacks")
            shadow[name] = torch.empty_like(params[own].detach())
        state["ema"] = {"shadow": shadow}
    dcp.load(state, checkpoint_id=str(directory))
    return state["model"], state.get("ema", {}).get("shadow")


def load_checkpoint(path: Path, model, optimizer, scheduler, world: World, ema=None) -> int:
    """Restore everything; returns the step to continue from. With ``ema``, its average is
    restored too, or restarted from the restored weights when the checkpoint has none (a run
    that turned ``train.ema_decay`` on at a resume, with ``--allow-config-change``)."""
    path = Path(path)
    trainer = _load(path / f"trainer_rank{world.rank}.pt")
    saved_ema = ema is not None and bool(trainer.get("ema", False))
    try:
        if world.distributed:
            import torch.distributed.checkpoint as dcp
            from torch.distributed.checkpoint.state_dict import set_state_dict

            state = _model_optimizer_state(model, optimizer, world, ema if saved_ema else None)
            dcp.load(state, checkpoint_id=str(path / "state"))
            set_state_dict(model, optimizer, model_state_dict=state["model"],
                           optim_state_dict=state["optimizer"])
        else:
            state = _load(path / "state.pt")
            model.load_state_dict(state["model"])
            optimizer.load_state_dict(state["optimizer"])
        if saved_ema:
            ema.load_state_dict(state["ema"])
        elif ema is not None:
            ema.restart()
    except (RuntimeError, ValueError, KeyError) as err:
        if isinstance(err, CheckpointError):
            raise
        first = str(err).strip().splitlines()
        detail = "; ".join(line.strip() for line in first[:3])
        raise CheckpointError(f"checkpoint {path} does not fit the model and optimizer of this "
                              f"config ({detail})") from err
    scheduler.load_state_dict(trainer["scheduler"])
    torch.set_rng_state(trainer["rng"]["torch"])
    if "cuda" in trainer["rng"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(trainer["rng"]["cuda"])
    return int(trainer["step"])
