"""The ``dlmkit`` command line: ``dlmkit <command> --help`` documents each command."""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import warnings

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


def _show_warning(message, category, filename, lineno, file=None, line=None) -> None:
    """dlmkit's own warnings (its data checks, the pure-bf16 opt-in, ...) as one line,
    ``warning: ...``; other libraries' as Python shows them."""
    package = os.path.dirname(os.path.abspath(__file__))
    if category.__module__.startswith("dlmkit") or os.path.abspath(filename).startswith(package):
        print(f"warning: {message}", file=file or sys.stderr)
    else:
        _python_show_warning(message, category, filename, lineno, file, line)


_python_show_warning = warnings.showwarning


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    args.argv = argv  # for messages that repeat the command (e.g. how to resume)
    warnings.showwarning = _show_warning
    try:
        code = int(args.func(args) or 0)
        sys.stdout.flush()  # a closed pipe must fail here, inside the handler below
        return code
    except BrokenPipeError:
        # The reader went away (`dlmkit train --print-config | head`): not an error of ours.
        # Point stdout at /dev/null so the interpreter's final flush does not fail again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141  # 128 + SIGPIPE, what a shell reports for a command killed by the pipe
    finally:
        warnings.showwarning = _python_show_warning


if __name__ == "__main__":
    sys.exit(main())
