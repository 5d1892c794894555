"""What a directory passed as a model is, and why it cannot be loaded when it cannot.

Users pass the wrong directory in predictable ways: the run directory instead of its
``final/``, a training checkpoint (``RUN/checkpoints/step_N``, optimizer state, not a model
directory), or a model directory whose weights were not copied. :func:`check_model_directory`
names each case and says what to pass instead, before transformers fails on a missing file.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

__all__ = ["WEIGHT_FILES", "check_model_directory", "checkpoint_step", "run_of_checkpoint"]

# What transformers loads weights from: one file, or an index naming the shards.
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                "pytorch_model.bin.index.json")
_STEP_DIR = re.compile(r"^step_(\d+)$")
_CHECKPOINT_FILES = ("state.pt", "state", "trainer_rank0.pt", "manifest.json")


def checkpoint_step(path: Path) -> int | None:
    """The step of a training checkpoint directory (``RUN/checkpoints/step_N`` holding
    training state), else None."""
    m = _STEP_DIR.match(path.name)
    if m is None or not any((path / f).exists() for f in _CHECKPOINT_FILES):
        return None
    return int(m.group(1))


def run_of_checkpoint(path: Path) -> Path:
    """The run directory a checkpoint ``RUN/checkpoints/step_N`` belongs to."""
    return path.parent.parent


def _is_run_directory(path: Path) -> bool:
    return (path / "config.yaml").is_file() and any(
        (path / d).is_dir() for d in ("checkpoints", "final", "best"))


def _steps(run: Path) -> list[int]:
    root = run / "checkpoints"
    if not root.is_dir():
        return []
    return sorted(s for p in root.iterdir() if p.is_dir() and (s := checkpoint_step(p)) is not None)


def _export_hint(run: Path, step: int | str = "N") -> str:
    return f"dlmkit export {run} --step {step} --output DIR"


def _not_a_model(path: Path, what: str) -> str | None:
    """The message for a run directory or a checkpoint passed as a model (None otherwise)."""
    if path.name == "checkpoints" and _is_run_directory(path.parent):
        path = path.parent
    step = checkpoint_step(path)
    if step is not None:
        run = run_of_checkpoint(path)
        exported = f" (the run's exported model is {run / 'final'})" \
            if (run / "final" / "config.json").is_file() else ""
        return (f"{what} {path} is a training checkpoint (step {step} of run {run}: model and "
                f"optimizer state), not a model directory{exported}. Export it as one with "
                f"`{_export_hint(run, step)}` and pass DIR.")
    if not _is_run_directory(path):
        return None
    models = [path / d for d in ("final", "best") if (path / d / "config.json").is_file()]
    steps = _steps(path)
    if models:
        best = (f" (or {path / 'best'}, the best model by validation loss so far)"
                if path / "best" in models else "")
        use = f"pass {models[0]}{best}"
    else:
        use = "it has no exported model yet (final/ is written when training ends)"
    if steps:
        use += (f"; to use a checkpoint, export it with `{_export_hint(path)}` (steps: "
                f"{', '.join(map(str, steps))})")
    return f"{what} {path} is a training run directory, not a model directory; {use}."


def _missing_weights(path: Path, what: str) -> str | None:
    """The message for a model directory (config.json present) whose weights are absent."""
    for index_name in ("model.safetensors.index.json", "pytorch_model.bin.index.json"):
        index = path / index_name
        if index.is_file():
            try:
                shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
            except (ValueError, KeyError, TypeError, AttributeError):
                return f"{what} {path}: {index} is not a valid weight index (no weight_map)"
            missing = [s for s in shards if not (path / s).is_file()]
            if missing:
                return (f"{what} {path}: {len(missing)} of the {len(shards)} weight shards "
                        f"{index_name} lists are missing: {', '.join(missing[:5])}"
                        f"{' ...' if len(missing) > 5 else ''}; copy them into the directory")
            return None
    if any((path / f).is_file() for f in WEIGHT_FILES):
        return None
    present = sorted(p.name + ("/" if p.is_dir() else "") for p in path.iterdir())
    return (f"{what} {path} has config.json but no model weights (expected "
            f"{', '.join(WEIGHT_FILES[:-1])} or {WEIGHT_FILES[-1]}); it holds: "
            f"{', '.join(present[:20])}{' ...' if len(present) > 20 else ''}. Copy the weights "
            "file(s) into it, or pass a complete model directory (`dlmkit train` writes one to "
            "RUN/final).")


def check_model_directory(path: str | Path, what: str = "--model") -> Path:
    """``path`` as a :class:`~pathlib.Path` when it is a directory a model can be loaded from;
    otherwise a ValueError that names ``what`` (the option it came from), says what the
    directory is instead (a run directory, a training checkpoint, a model directory without
    its weights, or no model directory at all) and what to pass."""
    path = Path(path)
    if not path.is_dir():
        raise ValueError(f"{what} {path}: not a directory (pass a model directory such as a "
                         "run's RUN/final)")
    message = _not_a_model(path, what)
    if message is None and not (path / "config.json").is_file():
        if (path / "adapter_config.json").is_file():  # a LoRA adapter: its base has the config
            return path
        present = sorted(p.name for p in path.iterdir())
        message = (f"{what} {path} is not a model directory (no config.json; it holds: "
                   f"{', '.join(present[:20]) or 'nothing'}); pass a model directory such as a "
                   "run's RUN/final")
    message = message or _missing_weights(path, what)
    if message is not None:
        raise ValueError(message)
    return path
