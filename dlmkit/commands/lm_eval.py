"""``dlmkit lm-eval``: lm-evaluation-harness's command line with the ``dlmkit`` model
registered (see :mod:`dlmkit.generate.harness`)."""

from __future__ import annotations

import sys

# lm-eval's subcommands; without one, lm-eval runs ``run`` (its legacy form).
_SUBCOMMANDS = ("run", "ls", "validate")

# The dlmkit model's --model_args besides the sampler options (DlmkitLM's keywords; a test
# keeps the two in step).
MODEL_ARGS = (
    ("pretrained=DIR", "the exported model directory, RUN/final of `dlmkit train` (not the run "
                       "directory)"),
    ("device=DEVICE", "cpu, cuda or cuda:N (`dlmkit lm-eval` passes lm-eval's --device: the GPU "
                      "when there is one, else the CPU)"),
    ("attention=NAME", "sdpa (default), flex_attention or eager"),
    ("batch_size=N", "requests per batch (default 8; lm-eval's --batch_size sets it too)"),
    ("sampler=NAME", "the decoder of generate_until requests (default: the model's training "
                     "strategy, as `dlmkit generate`)"),
    ("mc_samples=N", "Monte-Carlo draws per loglikelihood request of a diffusion model "
                     "(default 32)"),
    ("chat=true|false", "render each request with the model's chat template, as in training "
                        "(default true); false: the raw text"),
)

PREFACE = """\
dlmkit lm-eval: lm-evaluation-harness's command line with the dlmkit model registered.

usage:
  dlmkit lm-eval --model dlmkit --model_args pretrained=RUN/final[,KEY=VALUE...] \\
      --tasks NAME[,NAME...] [lm-eval options]
  dlmkit lm-eval ls tasks          (the tasks lm-eval knows)

model_args of --model dlmkit:
{args}
{options}

examples:
  dlmkit lm-eval --model dlmkit --model_args pretrained=runs/x/final --tasks arc_easy --limit 50
  dlmkit lm-eval --model dlmkit --model_args pretrained=runs/x/final,steps=16,threshold=0.9 \\
      --tasks my_task --include_path my_tasks/

Every argument goes to lm-eval unchanged. lm-eval's own help follows.
"""


def preface() -> str:
    import textwrap

    from .generate import sampler_fields

    width = max(len(name) for name, _ in MODEL_ARGS) + 4
    args = "\n".join(textwrap.fill(text, 88, initial_indent=f"  {name:<{width - 2}}",
                                   subsequent_indent=" " * width) for name, text in MODEL_ARGS)
    options = textwrap.fill(
        "any sampler option of `dlmkit generate`, by its field name: "
        + ", ".join(sampler_fields()),
        88, initial_indent="  ", subsequent_indent=" " * width)
    return PREFACE.format(args=args, options=options)


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
    argv = list(args.args)
    runs = not argv or argv[0] not in _SUBCOMMANDS[1:]  # `ls` and `validate` load no model
    if runs and (not argv or "-h" in argv or "--help" in argv):
        print(preface())
        argv = ["run", "--help"]  # the help of the command that takes --model dlmkit
    try:
        import lm_eval  # noqa: F401
    except ImportError:
        raise SystemExit("error: dlmkit lm-eval needs lm-evaluation-harness: "
                         "pip install dlmkit[lm-eval]") from None
    from lm_eval.__main__ import cli_evaluate

    import dlmkit.generate.harness  # noqa: F401  (registers --model dlmkit)

    if runs and not any(a == "--device" or a.startswith("--device=") for a in argv):
        # lm-eval defaults to cuda:0; dlmkit's default is the GPU when there is one.
        from .generate import resolve_device

        argv += ["--device", resolve_device("auto")]
    saved, sys.argv = sys.argv, ["lm_eval", *argv]  # lm-eval reads its arguments there
    try:
        cli_evaluate()
    except ValueError as err:  # lm-eval's and the dlmkit model's checks of the arguments
        raise SystemExit(f"error: {_explain(err)}") from None
    finally:
        sys.argv = saved
    return 0


def _explain(err: ValueError) -> str:
    text = str(err)
    if text.startswith("Tasks not found"):
        text += ("; `dlmkit lm-eval ls tasks` lists the tasks lm-eval knows, and --include_path "
                 "DIR adds your own task YAML files")
    return text
