"""Checkpoints that resume bit-exactly, written atomically.

A checkpoint is a directory ``RUN/checkpoints/step_XXXXXXX`` holding the model and optimizer
state (torch.distributed.checkpoint when distributed, one ``torch.save`` file otherwise), plus
``trainer.pt`` (scheduler, step, RNG states). It is written to a temporary name and renamed
into place only when complete, so a crash mid-save leaves the previous checkpoint usable;
``latest`` points at the newest complete one. Data position needs no state: the sampler is a
pure function of the step.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import torch

from .distributed import World, barrier


def _rng_state() -> dict:
    state = {"torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _model_optimizer_state(model, optimizer, world: World) -> dict:
    if world.distributed:
        from torch.distributed.checkpoint.state_dict import get_state_dict

        model_state, optim_state = get_state_dict(model, optimizer)
        return {"model": model_state, "optimizer": optim_state}
    return {"model": model.state_dict(), "optimizer": optimizer.state_dict()}


def save_checkpoint(run_dir: Path, step: int, model, optimizer, scheduler, world: World) -> Path:
    root = Path(run_dir) / "checkpoints"
    final = root / f"step_{step:07d}"
    tmp = root / f".tmp_step_{step:07d}"
    if world.is_main:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    barrier(world)
    state = _model_optimizer_state(model, optimizer, world)
    if world.distributed:
        import torch.distributed.checkpoint as dcp

        dcp.save(state, checkpoint_id=str(tmp / "state"))
    else:
        torch.save(state, tmp / "state.pt")
    torch.save({"step": step, "scheduler": scheduler.state_dict(), "rng": _rng_state()},
               tmp / f"trainer_rank{world.rank}.pt")
    barrier(world)
    if world.is_main:
        shutil.rmtree(final, ignore_errors=True)
        os.replace(tmp, final)
        link = root / "latest.tmp"
        link.write_text(final.name)
        os.replace(link, root / "latest")
    barrier(world)
    return final


def latest_checkpoint(run_dir: Path) -> Path | None:
    pointer = Path(run_dir) / "checkpoints" / "latest"
    if not pointer.is_file():
        return None
    path = pointer.parent / pointer.read_text().strip()
    return path if path.is_dir() else None


def load_checkpoint(path: Path, model, optimizer, scheduler, world: World) -> int:
    """Restore everything; returns the step to continue from."""
    path = Path(path)
    if world.distributed:
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import set_state_dict

        state = _model_optimizer_state(model, optimizer, world)
        dcp.load(state, checkpoint_id=str(path / "state"))
        set_state_dict(model, optimizer, model_state_dict=state["model"],
                       optim_state_dict=state["optimizer"])
    else:
        state = torch.load(path / "state.pt", weights_only=False)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
    trainer = torch.load(path / f"trainer_rank{world.rank}.pt", weights_only=False)
    scheduler.load_state_dict(trainer["scheduler"])
    torch.set_rng_state(trainer["rng"]["torch"])
    if "cuda" in trainer["rng"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(trainer["rng"]["cuda"])
    return int(trainer["step"])
