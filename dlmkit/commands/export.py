"""``dlmkit export``: a training checkpoint (``RUN/checkpoints/step_N``) as a model directory.

A checkpoint holds the model and optimizer state to resume from; ``dlmkit generate``, ``eval``
and transformers load model directories. The export is the one the run itself writes to
``RUN/final`` (:func:`dlmkit.train.recipe.export_final`: safetensors, config, tokenizer,
``dlmkit.json``), of the checkpoint's weights: its weight average when the run kept one
(``train.ema_decay``), as ``final/`` does, unless ``--no-average``.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

EPILOG = """examples:
  dlmkit export runs/x --step 400 --output runs/x/step_400
  dlmkit export runs/x --output exported          # the newest complete checkpoint
  dlmkit export runs/x/checkpoints/step_0000400 --output runs/x/step_400
  dlmkit generate --model runs/x/step_400 --prompt 'rev abc'"""


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser(
        "export", help="export a training checkpoint as a model directory",
        description="Write checkpoint step N of a training run as a model directory, like the "
                    "RUN/final the run writes when it ends (Hugging Face safetensors, config "
                    "and tokenizer, and dlmkit.json), for dlmkit generate/eval or "
                    "transformers. The model is rebuilt from the checkpoint's config.yaml "
                    "(its data too: dlmkit.json records the longest training response).",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run", metavar="RUN",
                        help="the run directory (or one of its checkpoints/step_N directories)")
    parser.add_argument("--step", type=int,
                        help="the checkpoint's step (default: the newest complete checkpoint)")
    parser.add_argument("--output", required=True, metavar="DIR",
                        help="the model directory to write (must not exist, or be empty)")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace a non-empty --output (deleted once the export is written)")
    parser.add_argument("--no-average", dest="average", action="store_false",
                        help="export the raw trained weights, not the checkpoint's weight "
                             "average (train.ema_decay; the default, as RUN/final)")
    parser.add_argument("--device", default="cpu",
                        help="torch device the model is rebuilt on (default: cpu)")
    parser.set_defaults(func=run)


def _checkpoint(run: Path, step: int | None) -> tuple[Path, Path]:
    """``(run directory, checkpoint directory)`` for ``RUN`` (or a checkpoint) and ``--step``."""
    from dlmkit.models.directory import checkpoint_step, run_of_checkpoint
    from dlmkit.train.checkpoint import find_resume_point, incomplete_reason, step_dirs

    if not run.is_dir():
        raise ValueError(f"RUN {run}: not a directory")
    own = checkpoint_step(run)
    if own is not None:  # a checkpoint directory was passed
        if step is not None and step != own:
            raise ValueError(f"--step {step} contradicts RUN {run}, the checkpoint of step "
                             f"{own}; pass the run directory with --step, or the checkpoint "
                             "alone")
        run, step = run_of_checkpoint(run), own
    found = {int(p.name.removeprefix("step_")): p for p in step_dirs(run)}
    if not found:
        raise ValueError(f"RUN {run} holds no checkpoints (no {run / 'checkpoints'}/step_N "
                         "directories); pass a run directory of `dlmkit train` (it saves "
                         "every train.save_every steps and at the end)")
    if step is None:
        try:
            return run, find_resume_point(run).path
        except FileNotFoundError as err:
            raise ValueError(str(err).replace("--resume: ", "")) from None
    if step not in found:
        raise ValueError(f"--step {step}: {run} has no checkpoint of that step; its steps: "
                         f"{', '.join(str(s) for s in sorted(found))}")
    reason = incomplete_reason(found[step])
    if reason is not None:
        raise ValueError(f"--step {step}: the checkpoint is incomplete ({reason})")
    return run, found[step]


def export_checkpoint(run: str | Path, output: str | Path, *, step: int | None = None,
                      average: bool = True, overwrite: bool = False,
                      device: str = "cpu") -> Path:
    """Write checkpoint ``step`` of run ``run`` (None: the newest complete one) as a model
    directory ``output``; returns it. ``average``: the checkpoint's weight average when it
    has one (as ``RUN/final``), else the raw weights. ``dlmkit.json`` is ``final/``'s plus
    ``exported_from`` (run, step, checkpoint, which weights)."""
    import torch

    from dlmkit.models import quiet_transformers
    from dlmkit.models.directory import checkpoint_step
    from dlmkit.train.checkpoint import CONFIG, load_model_weights
    from dlmkit.train.config import ConfigError, RunConfig, load_yaml, with_defaults
    from dlmkit.train.distributed import World
    from dlmkit.train.recipe import build_components, export_final

    run_dir, checkpoint = _checkpoint(Path(run), step)
    output = Path(output)
    if output.exists() and not output.is_dir():
        raise ValueError(f"--output {output} is a file; pass a directory path")
    if output.is_dir() and any(output.iterdir()) and not overwrite:
        raise ValueError(f"--output {output} exists and is not empty; pass --overwrite to "
                         "replace it, or another path")
    config_file = checkpoint / CONFIG if (checkpoint / CONFIG).is_file() \
        else run_dir / "config.yaml"
    if not config_file.is_file():
        raise ValueError(f"{checkpoint} has no {CONFIG} and {run_dir} none either: the model "
                         "cannot be rebuilt without the run's config")
    try:  # keys added to dlmkit since the run was written take their defaults
        config = RunConfig.from_dict(with_defaults(load_yaml(config_file.read_text())))
    except ConfigError as err:
        raise ConfigError(f"{config_file}: {err}") from None
    config.train.device = device
    world = World(rank=0, world_size=1, local_rank=0, device=torch.device(device))
    c = build_components(config, world)
    shadow = load_model_weights(checkpoint, c.model)
    weights = "raw"
    if shadow is not None and average:
        params = dict(c.model.named_parameters())
        with torch.no_grad():
            for name, tensor in shadow.items():
                params[name].copy_(tensor)
        weights = "average"
    meta = {"exported_from": {"run": str(run_dir), "step": checkpoint_step(checkpoint),
                              "checkpoint": str(checkpoint), "weights": weights}}
    if weights == "average":  # as the run's own exports record it
        meta["ema_decay"] = config.train.ema_decay
    output.parent.mkdir(parents=True, exist_ok=True)
    tmp_name = f".{output.name}.export.tmp"
    shutil.rmtree(output.parent / tmp_name, ignore_errors=True)
    with quiet_transformers():  # no shard-writing bar in the command's output
        fresh = export_final(output.parent, c.model, c.tokenizer, config, c.strategy, world,
                             c.train_set, name=tmp_name, meta=meta, pad_to=c.collator.pad_to)
    if output.exists():
        shutil.rmtree(output)
    fresh.rename(output)
    return output


def run(args) -> int:
    from dlmkit.train.checkpoint import CheckpointError
    from dlmkit.train.config import ConfigError

    try:
        output = export_checkpoint(args.run, args.output, step=args.step, average=args.average,
                                   overwrite=args.overwrite, device=args.device)
    except (ValueError, FileNotFoundError, CheckpointError, ConfigError) as err:
        raise SystemExit(f"error: {err}") from None
    source = json.loads((output / "dlmkit.json").read_text())["exported_from"]
    print(f"exported step {source['step']} of {source['run']} ({source['weights']} weights) "
          f"to {output}\nuse it with: dlmkit generate --model {output} --prompt '...'",
          file=sys.stdout)
    return 0
