"""Decoding speed against accuracy: parallel commit rules and KV caches on a long-answer task.

    python bench/sampling.py --model runs/mdlm-copy/final --model runs/bd3lm-copy/final \\
        --ar-model runs/ar-copy/final --task copy -n 256 --threads 2 --markdown

For each exported model (``RUN/final`` of ``dlmkit train``) runs its family's settings on the
same problems (one JSON object per line on stdout):

* mdlm: one token per step, the confidence threshold and the factor rule, with no cache, the
  prefix cache or the dual cache (both approximate);
* bd3lm / hybrid: one token per step and the threshold, with and without the exact cache;
* idlm: introspective strided decoding and greedy AR on the same model (must agree);
* scdd: ancestral sampling with ``steps = max_new_tokens`` and half of it.

Per setting: exact match, forwards per generated token (per sequence: a row that finished
early does not count), forwards of the batches (what the wall clock pays for: a batch runs
until its slowest row is done), tokens/s, the tokens/s ratio to the family's first setting, one
token per step uncached (``speedup``) and to plain AR decoding of ``--ar-model`` (``vs_ar``);
for a cached or parallel setting, how far its output
moved from the setting it approximates (``agreement``: share of generated positions with the
same token; ``same_output``: share of responses identical). Greedy decoding everywhere, so
forwards, tokens and exact match are deterministic; wall-clock figures are only comparable
within one run (each setting is timed ``--repeat`` times, the fastest kept).
"""

from __future__ import annotations

import argparse
import json
import sys

import torch

# setting -> (options, the setting whose output it approximates or None).
SETTINGS = {
    "mdlm": {
        "one_per_step": ({}, None),
        "one_per_step+dual": ({"cache": "dual"}, "one_per_step"),
        "threshold_0.9": ({"threshold": 0.9}, "one_per_step"),
        "threshold_0.9+prefix": ({"threshold": 0.9, "cache": "prefix"}, "threshold_0.9"),
        "threshold_0.9+dual": ({"threshold": 0.9, "cache": "dual"}, "threshold_0.9"),
        "factor_1.0+dual": ({"factor": 1.0, "cache": "dual"}, "one_per_step"),
    },
    "bd3lm": {
        "one_per_step": ({}, None),
        "one_per_step+cache": ({"cache": "prefix"}, "one_per_step"),
        "threshold_0.9": ({"threshold": 0.9}, "one_per_step"),
        "threshold_0.9+cache": ({"threshold": 0.9, "cache": "prefix"}, "threshold_0.9"),
        "factor_1.0+cache": ({"factor": 1.0, "cache": "prefix"}, "one_per_step"),
    },
    "hybrid": {
        "one_per_step": ({}, None),
        "one_per_step+cache": ({"cache": "prefix"}, "one_per_step"),
        "threshold_0.9+cache": ({"threshold": 0.9, "cache": "prefix"}, "one_per_step"),
        "ar": ({"mode": "ar"}, None),
    },
    "idlm": {"ar": ({"sampler": "ar"}, None), "isd": ({}, "ar")},
    "scdd": {"steps_full": ({}, None), "steps_half": ({"half_steps": True}, "steps_full")},
    "ar": {"ar": ({}, None)},
}


def agreement(a: list[list[int]], b: list[list[int]], length: int) -> tuple[float, float]:
    """(share of the ``length`` generated positions with equal tokens, share of equal rows);
    a response shorter than ``length`` counts its missing positions as a stop token."""
    same = total = 0
    for x, y in zip(a, b):
        x, y = x + [-1] * (length - len(x)), y + [-1] * (length - len(y))
        same += sum(i == j for i, j in zip(x, y))
        total += length
    return same / max(total, 1), sum(x == y for x, y in zip(a, b)) / max(len(a), 1)


def run_setting(loaded, records, options, args):
    """``(exact match, GenerationResult totals)``; the fastest of ``--repeat`` runs."""
    from dlmkit.generate import evaluate

    options = dict(options)
    sampler = options.pop("sampler", None)
    if options.pop("half_steps", False):
        options["steps"] = max(1, args.max_new_tokens // 2)
    if loaded.meta.get("strategy") == "mdlm":  # the semi-AR block the caches refresh at
        options.setdefault("block_size", args.block_size)
    config = loaded.config(sampler, max_new_tokens=args.max_new_tokens, **options)
    best = None
    for _ in range(args.repeat):
        accuracy, rows, totals = evaluate(loaded.model, loaded.tokenizer, records, config,
                                          batch_size=args.batch_size)
        if best is None or totals.seconds < best[1].seconds:
            best = (accuracy, totals)
    return config, best[0], best[1]


def bench_model(path, args, ar_speed=None):
    from dlmkit.data import get_task
    from dlmkit.generate import load

    loaded = load(path)
    strategy = loaded.meta.get("strategy")
    task = args.task or loaded.meta.get("task")
    records = get_task(task).records(args.split, args.n)
    settings = SETTINGS.get(strategy, {"default": ({}, None)})  # the first is the baseline
    results, tokens = {}, {}
    for name, (options, reference) in settings.items():
        config, accuracy, totals = run_setting(loaded, records, options, args)
        tokens[name] = totals.tokens
        row = {"model": str(path), "strategy": strategy, "task": task, "n": len(records),
               "setting": name, "sampler": config.sampler, "block_size": config.block_size,
               "threads": torch.get_num_threads(), "exact_match": round(accuracy, 4),
               "forwards": totals.forwards, "row_forwards": totals.row_forwards,
               "tokens": totals.generated,
               "forwards_per_token": round(totals.row_forwards / max(totals.generated, 1), 4),
               "tokens_per_second": round(totals.tokens_per_second, 1)}
        if reference is not None and reference in tokens:
            agree, same = agreement(tokens[name], tokens[reference], args.max_new_tokens)
            row.update(reference=reference, agreement=round(agree, 4),
                       same_output=round(same, 4))
        base = next(iter(results.values()), row)["tokens_per_second"]
        row["speedup"] = round(row["tokens_per_second"] / max(base, 1e-9), 2)
        if ar_speed:
            row["vs_ar"] = round(row["tokens_per_second"] / ar_speed, 2)
        results[name] = row
        print(json.dumps(row), flush=True)
    return strategy, results


def markdown(all_rows) -> str:
    head = ("| family | setting | exact match | forwards / token | batch forwards | tokens/s | "
            "vs one/step | vs AR | agreement (same output) with |\n"
            "|---|---|---|---|---|---|---|---|---|")
    lines = [head]
    for row in all_rows:
        agree = (f"{100 * row['agreement']:.1f}% ({100 * row['same_output']:.1f}%) "
                 f"{row['reference']}" if "agreement" in row else "")
        lines.append(f"| {row['strategy']} | {row['setting']} | "
                     f"{100 * row['exact_match']:.1f}% | {row['forwards_per_token']:.3f} | "
                     f"{row['forwards']} | "
                     f"{row['tokens_per_second']:.0f} | {row['speedup']:.2f}x | "
                     f"{str(row.get('vs_ar', '')) + 'x' if 'vs_ar' in row else ''} | {agree} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", action="append", required=True, help="RUN/final (repeat)")
    parser.add_argument("--ar-model", help="an `ar` RUN/final: plain AR decoding to compare with")
    parser.add_argument("--task", help="bundled task (default: the model's)")
    parser.add_argument("--split", default="test")
    parser.add_argument("-n", type=int, default=256)
    parser.add_argument("--max-new-tokens", type=int, default=40)
    parser.add_argument("--block-size", type=int, default=8,
                        help="mdlm's semi-AR block (block samplers use their trained one)")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--repeat", type=int, default=1, help="timed runs per setting")
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads")
    parser.add_argument("--markdown", action="store_true", help="a table on stderr at the end")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)

    ar_speed, rows = None, []
    if args.ar_model:
        _, ar = bench_model(args.ar_model, args)
        ar_speed = ar["ar"]["tokens_per_second"]
        rows += ar.values()
    for path in args.model:
        strategy, results = bench_model(path, args, ar_speed)
        rows += results.values()
        if strategy == "idlm" and results["isd"]["same_output"] != 1.0:
            print(f"{path}: ISD output differs from greedy AR", file=sys.stderr)
            return 1
    if args.markdown:
        print(markdown(rows), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
