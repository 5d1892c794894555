"""The ``dlmkit`` command line: ``dlmkit <command> --help`` documents each command."""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from . import __version__

# Each command lives in dlmkit/commands/<name>.py and exposes add_parser(subparsers).
_COMMANDS = ("train", "generate", "eval", "serve", "export", "mask", "rl", "lm_eval")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="dlmkit",
        description="Train and sample diffusion language models; build structured attention "
                    "masks for every backend.")
    parser.add_argument("--version", action="version", version=f"dlmkit {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in _COMMANDS:
        try:
            module = importlib.import_module(f"dlmkit.commands.{name}")
        except ModuleNotFoundError as err:
            if err.name != f"dlmkit.commands.{name}":
                raise
            continue
        module.add_parser(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    args.argv = argv  # for messages that repeat the command (e.g. how to resume)
    try:
        code = int(args.func(args) or 0)
        sys.stdout.flush()  # a closed pipe must fail here, inside the handler below
        return code
    except BrokenPipeError:
        # The reader went away (`dlmkit train --print-config | head`): not an error of ours.
        # Point stdout at /dev/null so the interpreter's final flush does not fail again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141  # 128 + SIGPIPE, what a shell reports for a command killed by the pipe


if __name__ == "__main__":
    sys.exit(main())
