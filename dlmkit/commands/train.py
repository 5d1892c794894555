"""``dlmkit train``: the SFT recipe (one process, or many under torchrun)."""

from __future__ import annotations

import argparse

EPILOG = """examples:
  dlmkit train                      # embedded default: tiny Llama, BD3-LM, 'reverse', CPU
  dlmkit train configs/bd3lm-tiny.yaml --set train.steps=50
  dlmkit train --set strategy.name=idlm --set strategy.block_size=4 --output-dir runs/idlm
  dlmkit train --output-dir runs/idlm --resume   # continue bit-exactly from the last checkpoint
  torchrun --nproc-per-node 2 -m dlmkit.cli train configs/mdlm-tiny.yaml \\
      --set train.distributed=fsdp2

run directory: config.yaml, metrics.jsonl, loss.png, checkpoints/step_N (+ latest), final/ (a
Hugging Face model directory with tokenizer and dlmkit.json)."""


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser(
        "train", help="train a diffusion LM (SFT recipe)",
        description="Train a diffusion language model. Without a config file, trains the "
                    "embedded default (tiny model, bundled task, CPU, a few minutes).",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("config", nargs="?", help="YAML config (default: the embedded one)")
    parser.add_argument("--set", dest="overrides", action="append", default=[],
                        metavar="KEY.SUB=VALUE", help="override a config value (YAML syntax)")
    parser.add_argument("--output-dir",
                        help="run directory (default: runs/<strategy>-<task>-<time>)")
    parser.add_argument("--resume", action="store_true",
                        help="continue from the latest checkpoint in --output-dir")
    parser.add_argument("--print-config", action="store_true",
                        help="print the resolved config and exit")
    parser.set_defaults(func=run_train)


def run_train(args) -> int:
    import yaml

    from dlmkit.train import ConfigError, load_config, run

    overrides = list(args.overrides)
    if args.output_dir:
        overrides.append(f"output_dir={args.output_dir}")
    try:
        config = load_config(args.config, overrides)
        if args.resume and not config["output_dir"]:
            raise ConfigError("--resume needs --output-dir (the run to continue)")
    except ConfigError as err:
        raise SystemExit(f"error: {err}") from None
    if args.print_config:
        print(yaml.safe_dump(config, sort_keys=False))
        return 0
    try:
        run(config, resume=args.resume)
    except (ValueError, FileNotFoundError) as err:
        raise SystemExit(f"error: {err}") from None
    return 0
