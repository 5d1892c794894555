"""``dlmkit eval``: exact-match accuracy of an exported model on a bundled task or on your own
data file (every assistant turn of every conversation scored; see
:mod:`dlmkit.generate.evaluation`)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path


def add_parser(subparsers) -> None:
    from .generate import DefaultsHelpFormatter, add_sampler_arguments

    parser = subparsers.add_parser(
        "eval", help="exact-match accuracy on a bundled task or a data file",
        description="Generate a response for each problem of a bundled task split, or for "
                    "every assistant turn of a data file (--data), and print exact-match "
                    "accuracy (last line: `exact_match: NN.N%`). A turn is generated from the "
                    "conversation before it with the reference answers as history "
                    "(teacher-forced), or only the last turn with --last-turn. Takes the same "
                    "sampler options as `dlmkit generate`.",
        formatter_class=DefaultsHelpFormatter)
    parser.add_argument("--task", help="bundled task (default: the model's training task)")
    parser.add_argument("--data", action="append", metavar="FILE",
                        help="test file(s) in a training format (JSONL/JSON/Parquet/CSV or a "
                             "saved HF dataset; prompt/response, messages, ShareGPT or Alpaca "
                             "records; repeat for several)")
    parser.add_argument("--field", action="append", metavar="FIELD=NAME", default=[],
                        help="with --data: the data's name for a format field, e.g. "
                             "prompt=question (default: the model's training data.fields)")
    parser.add_argument("--last-turn", action="store_true",
                        help="with --data: score only each conversation's last assistant turn")
    parser.add_argument("--output", metavar="FILE",
                        help="write one JSON line per scored turn: source, turn, prompt, "
                             "reference, prediction, correct, forwards (its folder is created; "
                             "checked before evaluating)")
    parser.add_argument("--no-progress", dest="progress", action="store_false",
                        help="no progress bar on stderr")
    parser.add_argument("--split",
                        help="bundled task: train, validation or test (default: test); with "
                             "--data the files are the split")
    parser.add_argument("-n", type=int,
                        help="number of problems: a bundled task's first n (default: 200), the "
                             "first n records of the --data files (default: all)")
    parser.add_argument("--show", type=int, default=0, help="print this many examples")
    add_sampler_arguments(parser)
    parser.set_defaults(func=run)


def field_mapping(items: list[str], meta: dict) -> dict:
    """``--field FIELD=NAME`` flags as a mapping; none given: the training run's fields."""
    if not items:
        return meta.get("fields") or {}
    mapping = {}
    for item in items:
        field, sep, name = item.partition("=")
        if not sep:
            raise SystemExit(f"error: --field expects FIELD=NAME (e.g. prompt=question), "
                             f"got {item!r}")
        mapping[field] = name
    return mapping


def check_output(path: str) -> Path:
    """``--output`` before anything is evaluated: a file path (not a directory) in a folder
    that exists (made here) and can be written."""
    out = Path(path)
    if out.is_dir():
        raise SystemExit(f"error: --output {path} is a directory; pass a file path, e.g. "
                         f"{out / 'predictions.jsonl'}")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise SystemExit(f"error: --output {path}: cannot create its folder {out.parent} "
                         f"({err.strerror or err})") from None
    if not os.access(out.parent, os.W_OK) or (out.exists() and not os.access(out, os.W_OK)):
        raise SystemExit(f"error: --output {path}: permission denied (not writable); pass a "
                         "path you can write")
    return out


def run(args) -> int:
    from dlmkit.data import DataError, get_task, load_records, records_from_dicts, task_names
    from dlmkit.generate.evaluation import (
        EvaluationInterrupted,
        conversation_turns,
        format_summary,
        score_turns,
        summarize,
    )

    from .generate import _print_speculative, load_and_configure

    if args.n is not None and args.n < 1:
        raise SystemExit(f"error: -n must be >= 1, got {args.n}")
    if args.data and args.task:
        raise SystemExit("error: give --task or --data, not both")
    if args.last_turn and not args.data:
        raise SystemExit("error: --last-turn applies to --data files only")
    if args.field and not args.data:
        raise SystemExit(f"error: --field {args.field[0]} names a field of --data files; a "
                         "bundled task has its own fields: drop --field or pass --data FILE")
    if args.data and args.split is not None:
        raise SystemExit(f"error: --split {args.split} picks a bundled task's split; the --data "
                         "files are the split to score: drop --split (or pass that split's file)")
    output = check_output(args.output) if args.output else None
    try:
        loaded, config = load_and_configure(args)
    except KeyboardInterrupt:
        print("interrupted while loading the model; nothing was evaluated", file=sys.stderr)
        return 130
    name = args.task or (None if args.data else loaded.meta.get("task"))
    if not name and not args.data:
        raise SystemExit(f"error: {args.model} was trained on data files, not a bundled task: "
                         "pass a test file in the training format with --data FILE (JSONL, "
                         "JSON, Parquet, CSV or a saved Hugging Face dataset), or a bundled "
                         "task with --task "
                         f"({', '.join(task_names())})")
    try:
        if args.data:
            records = load_records(args.data, field_mapping(args.field, loaded.meta))
            records = records[:args.n]  # None: all
            source = ", ".join(args.data)
        else:
            split, n = args.split or "test", args.n or 200
            records = records_from_dicts(get_task(name).records(split, n),
                                         f"task:{name}/{split}")
            source = f"task: {name}  split: {split}"
        turns = conversation_turns(records, last_turn_only=args.last_turn)
        rows, totals = score_turns(loaded.model, loaded.tokenizer, turns, config,
                                   batch_size=args.batch_size, progress=args.progress)
    except (DataError, FileNotFoundError) as err:
        raise SystemExit(f"error: --data {err}") from None
    except ValueError as err:
        raise SystemExit(f"error: {err}") from None
    except EvaluationInterrupted as err:
        correct = sum(bool(r["correct"]) for r in err.rows)
        print(f"interrupted: {len(err.rows)} of {err.total} turns scored ({correct} exact); "
              f"no summary{' and no --output' if output else ''} written", file=sys.stderr)
        return 130
    except KeyboardInterrupt:
        print("interrupted while reading the data; nothing was evaluated", file=sys.stderr)
        return 130
    for row in rows[:args.show]:
        mark = "ok " if row["correct"] else "BAD"
        last = row["prompt"][-1]["content"] if row["prompt"] else ""
        print(f"{mark} {last!r} -> {row['prediction']!r} "
              f"(want {row['reference']!r})")
    print(f"{source}  n: {len(rows)}  sampler: {config.sampler}")
    print(f"forwards: {totals.forwards}  tokens/forward: {totals.tokens_per_forward:.2f}  "
          f"tokens/s: {totals.tokens_per_second:.1f}")
    _print_speculative(loaded.model)
    for line in format_summary(summarize(rows)):
        print(line)
    if output is not None:  # after the scores: a failing write must not lose them
        try:
            with open(output, "w", encoding="utf-8") as f:
                for row in rows:
                    f.write(json.dumps(row, ensure_ascii=False) + "\n")
        except OSError as err:
            print(f"error: --output {output}: {err.strerror or err}; the scores above are "
                  "complete, the per-turn rows were not written", file=sys.stderr)
            return 1
    return 0
