"""``dlmkit lm-eval``: lm-evaluation-harness's command line with the ``dlmkit`` model
registered (see :mod:`dlmkit.generate.harness`)."""

from __future__ import annotations

import sys


def add_parser(subparsers) -> None:
    # prefix_chars="+": every --flag is lm-eval's, passed through untouched.
    parser = subparsers.add_parser(
        "lm-eval", prefix_chars="+", add_help=False,
        help="lm-evaluation-harness with the dlmkit model registered",
        description="Runs lm-eval's command line with `--model dlmkit` available, e.g. "
                    "dlmkit lm-eval --model dlmkit --model_args pretrained=RUN/final "
                    "--tasks NAME. All arguments go to lm-eval (`dlmkit lm-eval --help`); "
                    "without --device it runs on the GPU if there is one, else the CPU.")
    parser.add_argument("args", nargs="*")
    parser.set_defaults(func=run)


def run(args) -> int:
    try:
        import lm_eval  # noqa: F401
    except ImportError:
        raise SystemExit("error: dlmkit lm-eval needs lm-evaluation-harness: "
                         "pip install dlmkit[lm-eval]") from None
    from lm_eval.__main__ import cli_evaluate

    import dlmkit.generate.harness  # noqa: F401  (registers --model dlmkit)

    argv = list(args.args)
    if not any(a == "--device" or a.startswith("--device=") for a in argv):
        # lm-eval defaults to cuda:0; dlmkit's default is the GPU when there is one.
        import torch

        argv += ["--device", "cuda:0" if torch.cuda.is_available() else "cpu"]
    sys.argv = ["lm_eval", *argv]
    cli_evaluate()
    return 0
