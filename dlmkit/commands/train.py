"""``dlmkit train``: the SFT recipe (one process, or many under torchrun)."""

from __future__ import annotations

import argparse
import os
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from dlmkit.train.config import RunConfig

EPILOG = """examples:
  dlmkit train                      # embedded default: tiny Llama, BD3-LM, 'reverse', CPU
  dlmkit train configs/bd3lm-tiny.yaml --set train.steps=50
  dlmkit train --set strategy.name=idlm --set strategy.block_size=4 --output-dir runs/idlm
  dlmkit train --output-dir runs/idlm --resume   # continue bit-exactly from the last checkpoint
  dlmkit train --output-dir runs/idlm --resume --set train.steps=800   # extend a finished run
  dlmkit train --output-dir runs/idlm --overwrite   # replace the run there (deleted first)
  torchrun --nproc-per-node 2 -m dlmkit.cli train configs/mdlm-tiny.yaml \\
      --set train.distributed=fsdp2

run directory: config.yaml, metrics.jsonl, loss.png, checkpoints/step_N (+ latest), final/ (a
Hugging Face model directory with tokenizer and dlmkit.json), data_files.json (size and sha256
of each data file, checked by --resume), tensorboard/ (with train.tensorboard=true). A running
training holds the directory (its .lock): a second one into it is an error. Ctrl-C or SIGTERM
(a scheduler's preemption) finishes the step in progress, saves a checkpoint of it and prints the
command that resumes it (exit code 130 / 143); a second one stops at once."""


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser(
        "train", help="train a diffusion LM (SFT recipe)",
        description="Train a diffusion language model. Without a config file, trains the "
                    "embedded default (tiny model, bundled task, CPU: about 2.5 minutes on 2 idle "
                    "cores, early stopping ending it once the task is learned; longer on a busy "
                    "machine; --set train.threads=N sets torch's threads).",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("config", nargs="?", help="YAML config (default: the embedded one)")
    parser.add_argument("--set", dest="overrides", action="append", default=[],
                        metavar="KEY.SUB=VALUE", help="override a config value (YAML syntax)")
    parser.add_argument("--output-dir",
                        help="run directory (default: runs/<strategy>-<task>-<time>)")
    existing = parser.add_mutually_exclusive_group()
    existing.add_argument("--resume", action="store_true",
                          help="continue the run in --output-dir from its newest complete "
                               "checkpoint, with the config it was trained with; --set may "
                               "change only train.steps (to extend it), the log/validation/"
                               "save intervals, threads, progress, tensorboard and device")
    existing.add_argument("--overwrite", action="store_true",
                          help="replace an existing run in --output-dir (deletes it first); "
                               "without it a non-empty --output-dir is an error")
    parser.add_argument("--allow-config-change", action="store_true",
                        help="with --resume: apply other config changes too (recorded in "
                             "RUN/config_changes.jsonl)")
    parser.add_argument("--print-config", action="store_true",
                        help="print the resolved config (with the strategy's options), each "
                             "key under its help, and every strategy's options and training "
                             "defaults (lr, steps, warmup, weight average), then exit")
    parser.set_defaults(func=run_train)


def print_config(config: RunConfig) -> None:
    """The resolved config, each key under its help text as a comment and the chosen
    strategy's options filled in (so the output loads as a config), then every strategy's
    options and defaults as comments. The strategy is built with the real tokenizer, so a bad
    strategy option is an error here as in training."""
    import copy

    from dlmkit import families, strategies
    from dlmkit.data import load_tokenizer
    from dlmkit.train.config import commented_yaml
    from dlmkit.train.regime import resolve_regime_options

    d = config.data
    cls = strategies.get(config.strategy["name"])
    tokenizer = load_tokenizer(d.tokenizer, allow_eos_as_pad=d.allow_eos_as_pad)
    options = {k: v for k, v in config.strategy.items() if k != "name"}
    # the options whose default depends on the regime, as the run would resolve them
    resolve_regime_options(config, cls, options)
    strategy = cls(options, mask_token_id=tokenizer.mask_token_id,
                   vocab_size=tokenizer.vocab_size,
                   loss_chunk_size=config.train.loss_chunk_size)
    shown = copy.deepcopy(config)
    shown.strategy = {"name": cls.name, **strategy.config}
    lines = [commented_yaml(shown).rstrip("\n"), "",
             "# Every family's options (strategy.<option>): default, what it accepts, help"]
    for name in families.names():
        lines += [f"#   {line}" for line in families.training_help(name).splitlines()]
    lines += ["", "# Every strategy's training defaults, from scratch (model.name a preset) and",
              "# fine-tuning (a model directory with weights): what an unset train.<key> resolves",
              "# to (dlmkit.train.regime; the run's config.yaml records the value used):"]
    lines += [f"#   {name}: {training_defaults(strategies.get(name))}"
              for name in strategies.names()]
    print("\n".join(lines))


def training_defaults(cls) -> str:
    """One family's ``default_lr`` / ``default_steps`` / warmup / ``default_ema_decay`` as the
    train keys they fill in: the one place a user reads them, so no comment restates them."""
    from dlmkit.train.budget import WARMUP_FRACTION

    warmup = (cls.default_warmup_steps if cls.default_warmup_steps is not None
              else f"{WARMUP_FRACTION:.0%} of steps")
    f = cls.finetune_defaults
    return (f"from scratch lr={cls.default_lr:g}, weight_decay={cls.default_weight_decay:g}, "
            f"steps={cls.default_steps}, warmup_steps={warmup}, "
            f"ema_decay={cls.default_ema_decay:g}; fine-tuning lr={f['lr']:g}, "
            f"weight_decay={f['weight_decay']:g}, epochs={f['epochs']:g}, "
            f"warmup_steps={f['warmup_fraction']:.0%} of steps, ema_decay={f['ema_decay']:g}")


def _interrupted_message(err, args) -> str:
    """Two lines: where the run stopped (and by which signal), and the command that continues
    it."""
    import shlex
    import signal

    how = "terminated by SIGTERM" if err.signal == signal.SIGTERM else "interrupted"
    if err.step is None or err.run_dir is None:
        return f"{how} before training started; nothing was trained"
    if err.checkpoint is not None:
        saved = f"the last checkpoint is {err.checkpoint}"
        again = f"resume with: dlmkit train --output-dir {shlex.quote(str(err.run_dir))} --resume"
    else:
        saved = "no checkpoint was written yet (see train.save_every)"
        argv = [a for a in (args.argv or []) if a not in ("--overwrite", "--resume")]
        again = "start again with: dlmkit " + shlex.join([*argv, "--overwrite"])
    return f"{how} at step {err.step}; {saved}\n{again}"


def run_train(args) -> int:
    from dlmkit.train import ConfigError, load_config, run
    from dlmkit.train.checkpoint import CheckpointError
    from dlmkit.train.config import explicit_keys
    from dlmkit.train.recipe import TrainingInterrupted

    overrides = list(args.overrides)
    if args.output_dir:
        overrides.append(f"output_dir={args.output_dir}")
    try:
        notes: list[str] = []
        config = load_config(args.config, overrides, notes)
        if os.environ.get("RANK", "0") == "0":  # once under torchrun
            for line in notes:  # stderr: --print-config's stdout stays a loadable config
                print(line, file=sys.stderr)
        if args.resume and not config.output_dir:
            raise ConfigError("--resume needs --output-dir (the run to continue)")
        if args.allow_config_change and not args.resume:
            raise ConfigError("--allow-config-change applies to --resume only")
        if args.print_config:
            print_config(config)
            return 0
        run(config, resume=args.resume, overwrite=args.overwrite,
            explicit=explicit_keys(args.config, overrides),
            allow_config_change=args.allow_config_change)
    except TrainingInterrupted as err:
        print(_interrupted_message(err, args), file=sys.stderr)
        return 128 + err.signal  # what a shell reports for a command killed by it: 130, 143
    except (ValueError, FileNotFoundError, CheckpointError) as err:
        raise SystemExit(f"error: {err}") from None
    return 0
