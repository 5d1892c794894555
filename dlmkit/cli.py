"""The ``dlmkit`` command line: ``dlmkit <command> --help`` documents each command."""

from __future__ import annotations

import argparse
import importlib
import sys

from . import __version__

# Each command lives in dlmkit/commands/<name>.py and exposes add_parser(subparsers).
_COMMANDS = ("train", "generate", "eval", "mask")


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
    args = build_parser().parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
