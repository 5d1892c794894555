"""Train one family on one suite task with the documented defaults and score it.

    python tests/suite/run.py FAMILY TASK [--tokenizer byte|bpe] [--out DIR] [--overwrite]
                              [--set k=v ...] [--decode k=v ...] [--record NAME]
    python tests/suite/run.py FAMILY TASK ... --resume      # continue a stopped run, same args
    python tests/suite/run.py FAMILY TASK --score-only RUN [--decode k=v ...]

Only the data files (and the tokenizer) are set, as a new user would, and early stopping is
off (each cell trains its family's whole budget, as measured); ``--set`` adds config
overrides (for controls), ``--decode`` sampler options for scoring (e.g. ``block_size=1``).
Prints one JSON line: family, task, tokenizer, steps, the last and best validation loss, exact
match of ``final/`` on the test split (last assistant turn, every earlier turn given as
written) and the wall time of training and of scoring; ``--record NAME`` also appends it, as
run ``NAME``, to ``docs/results/suite.jsonl``. An existing run directory is replaced only with
``--overwrite`` (as ``dlmkit train``). ``--resume``, with the arguments the run was started
with, continues a run that was stopped (a session's end, kill -9) from its newest checkpoint,
bit-exactly as ``dlmkit train --resume``; its line then says ``resumed_at`` (the checkpoint's
step) and ``train_s`` is the time of this last part only.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
RESULTS = HERE.parents[1] / "docs" / "results" / "suite.jsonl"
sys.path.insert(0, str(HERE))

import generate as suite  # noqa: E402  (run as a script, beside generate.py)


def score(model_dir: Path, test_file: Path, **sampler_options) -> dict:
    """Exact match of the export on ``test_file``'s last assistant turns (what
    ``dlmkit eval --model DIR --data FILE --last-turn`` prints)."""
    from dlmkit.data import load_records
    from dlmkit.generate import load
    from dlmkit.generate.evaluation import conversation_turns, score_turns

    loaded = load(model_dir)
    turns = conversation_turns(load_records(test_file), last_turn_only=True)
    start = time.perf_counter()
    rows, totals = score_turns(loaded.model, loaded.tokenizer, turns,
                               loaded.config(**sampler_options), batch_size=50)
    correct = sum(r["correct"] for r in rows)
    return {"exact_match": round(100.0 * correct / max(len(rows), 1), 1), "n": len(rows),
            "forwards": totals.forwards, "score_s": round(time.perf_counter() - start, 1),
            "examples": [(r["reference"], r["prediction"]) for r in rows[:3]]}


def main(argv: list[str]) -> int:
    from dlmkit import strategies

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("family", choices=strategies.names())
    parser.add_argument("task", choices=suite.TASKS)
    parser.add_argument("--tokenizer", choices=("byte", "bpe"), default="byte",
                        help="byte (default) or the suite's 384-token BPE")
    parser.add_argument("--data", type=Path, default=HERE / "data",
                        help="the suite's data directory (written by generate.py when missing; "
                             "default: %(default)s)")
    parser.add_argument("--out", type=Path, default=None,
                        help="run directory (default: runs/suite-FAMILY-TASK-TOKENIZER)")
    existing = parser.add_mutually_exclusive_group()
    existing.add_argument("--overwrite", action="store_true",
                          help="replace an existing run directory (deleted first)")
    existing.add_argument("--resume", action="store_true",
                          help="continue the run in --out from its newest checkpoint (give the "
                               "arguments it was started with)")
    parser.add_argument("--set", dest="overrides", action="append", default=[],
                        metavar="KEY.SUB=VALUE",
                        help="a config override, as dlmkit train --set (for controls)")
    parser.add_argument("--decode", action="append", default=[], metavar="K=V",
                        help="a sampler option for scoring (value read as --set reads it), "
                             "e.g. block_size=1")
    parser.add_argument("--score-only", type=Path, metavar="RUN",
                        help="score an existing run directory instead of training")
    parser.add_argument("--record", metavar="NAME",
                        help=f"append the result line, as run NAME, to {RESULTS}")
    args = parser.parse_args(argv)
    decode = sampler_options(parser, args.decode)

    from dlmkit.train import load_config, run
    from dlmkit.train.checkpoint import find_resume_point
    from dlmkit.train.config import explicit_keys

    if args.score_only:
        print(json.dumps({"decode": decode, **score(args.score_only / "final",
                                                    args.data / args.task / "test.jsonl",
                                                    **decode)}))
        return 0
    if not (args.data / args.task / "train.jsonl").is_file():
        suite.main([str(args.data)])
    data = args.data / args.task
    tokenizer = "byte" if args.tokenizer == "byte" else str(args.data / "bpe")
    out = args.out or Path("runs") / f"suite-{args.family}-{args.task}-{args.tokenizer}"
    overrides = [
        f"strategy.name={args.family}", "data.task=null",
        f"data.train_files=[{data / 'train.jsonl'}]",
        f"data.validation_files=[{data / 'validation.jsonl'}]",
        f"data.tokenizer={tokenizer}", f"output_dir={out}", "train.progress=false",
        # The cells were measured over each family's whole budget; early stopping (on by
        # default) would end some sooner (docs/finetuning.md). --set can turn it back on.
        "train.early_stopping_patience=0",
        *args.overrides]
    config = load_config(None, overrides)
    resumed_at = None
    if args.resume:
        try:  # the checkpoint run() will continue from (its error says why newer ones were not)
            resumed_at = find_resume_point(out).step
        except FileNotFoundError as err:
            parser.exit(2, f"error: {err}\n")
    start = time.perf_counter()
    try:
        # What the command line sets is checked against the checkpoint's config (a different
        # --set is an error naming the key), as dlmkit train --resume does.
        run(config, overwrite=args.overwrite, resume=args.resume,
            explicit=explicit_keys(None, overrides) if args.resume else None)
    except (ValueError, FileNotFoundError) as err:  # e.g. an existing run without --overwrite
        parser.exit(2, f"error: {err}\n")
    train_s = time.perf_counter() - start
    records = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    val = [r["loss"] for r in records if r["split"] == "validation"]
    steps = max((r["step"] for r in records), default=0)
    result = {"family": args.family, "task": args.task, "tokenizer": args.tokenizer,
              "steps": steps, "val_last": val[-1] if val else None,
              "val_best": min(val) if val else None, "train_s": round(train_s, 1),
              **({"resumed_at": resumed_at} if args.resume else {}),
              "overrides": args.overrides, **({"decode": decode} if decode else {}),
              **score(out / "final", data / "test.jsonl", **decode)}
    print(json.dumps(result))
    if args.record:
        with RESULTS.open("a") as fh:
            fh.write(json.dumps({"run": args.record, **result}) + "\n")
    return 0


def sampler_options(parser, pairs: list[str]) -> dict:
    """``["block_size=1", "remasking=margin"]`` -> ``{"block_size": 1, "remasking": "margin"}``
    (values read as ``--set`` reads them: :func:`dlmkit.train.config.parse_override`)."""
    from dlmkit.train.config import ConfigError, parse_override

    options = {}
    for pair in pairs:
        try:
            path, value = parse_override(pair)
        except ConfigError:
            path = None
        if path is None or len(path) != 1:
            parser.error(f"--decode takes K=V (a sampler option), got {pair!r}")
        options[path[0]] = value
    return options


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
