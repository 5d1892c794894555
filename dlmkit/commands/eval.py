"""``dlmkit eval``: exact-match accuracy of an exported model on a bundled task."""

from __future__ import annotations

import argparse


def add_parser(subparsers) -> None:
    from .generate import add_sampler_arguments

    parser = subparsers.add_parser(
        "eval", help="exact-match accuracy on a bundled task",
        description="Generate a response for each problem of a bundled task split and print "
                    "exact-match accuracy (last line: `exact_match: NN.N%`). Takes the same "
                    "sampler options as `dlmkit generate`.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--task", help="bundled task (default: the model's training task)")
    parser.add_argument("--split", default="test", help="train, validation or test")
    parser.add_argument("-n", type=int, default=200, help="number of problems")
    parser.add_argument("--show", type=int, default=0, help="print this many examples")
    add_sampler_arguments(parser)
    parser.set_defaults(func=run)


def run(args) -> int:
    from dlmkit.data import get_task, task_names
    from dlmkit.generate import evaluate

    from .generate import load_and_configure

    if args.n < 1:
        raise SystemExit(f"error: -n must be >= 1, got {args.n}")
    loaded, config = load_and_configure(args)
    name = args.task or loaded.meta.get("task")
    if not name:
        raise SystemExit(f"error: --task is required: {args.model} records no training task "
                         f"(bundled tasks: {', '.join(task_names())})")
    try:
        records = get_task(name).records(args.split, args.n)
        accuracy, rows, totals = evaluate(loaded.model, loaded.tokenizer, records, config,
                                          batch_size=args.batch_size)
    except ValueError as err:
        raise SystemExit(f"error: {err}") from None
    for row in rows[:args.show]:
        mark = "ok " if row["correct"] else "BAD"
        print(f"{mark} {row['prompt']!r} -> {row['output']!r} (want {row['response']!r})")
    print(f"task: {name}  split: {args.split}  n: {len(rows)}  sampler: {config.sampler}")
    print(f"forwards: {totals.forwards}  tokens/forward: {totals.tokens_per_forward:.2f}  "
          f"tokens/s: {totals.tokens_per_second:.1f}")
    print(f"exact_match: {100.0 * accuracy:.1f}%")
    return 0
