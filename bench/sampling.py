"""Sampler speed/quality on a bundled task: exact match, forwards, tokens per forward, tokens/s.

    python bench/sampling.py --model runs/mdlm/final --model runs/idlm/final -n 200

For each exported model (``RUN/final`` from ``dlmkit train``) runs the settings that matter
for its family on the same problems and prints one JSON object per (model, setting):

* mdlm / bd3lm / hybrid: one token per step vs confidence-threshold decoding (0.9, 0.7),
  and the KV cache (exact for bd3lm/hybrid, the approximate prefix cache for mdlm);
  hybrid also in AR mode;
* idlm: introspective strided decoding vs greedy AR on the same model (must agree);
* scdd: ancestral sampling with ``steps = max_new_tokens`` and half of it.

Wall-clock figures are only comparable within one run (the machine is noisy); forwards and
exact match are deterministic.
"""

from __future__ import annotations

import argparse
import json
import sys

import torch

SETTINGS = {
    "mdlm": {"one_per_step": {}, "threshold_0.9": {"threshold": 0.9},
             "threshold_0.7": {"threshold": 0.7}, "prefix_cache": {"use_cache": True},
             "threshold_0.9_cache": {"threshold": 0.9, "use_cache": True}},
    "bd3lm": {"one_per_step": {}, "threshold_0.9": {"threshold": 0.9},
              "threshold_0.7": {"threshold": 0.7}, "kv_cache": {"use_cache": True}},
    "hybrid": {"one_per_step": {}, "threshold_0.9": {"threshold": 0.9},
               "kv_cache": {"use_cache": True}, "ar": {"mode": "ar"}},
    "idlm": {"isd": {}, "ar": {"sampler": "ar"}},
    "scdd": {"steps_full": {}, "steps_half": {"half_steps": True}},
}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", action="append", required=True, help="RUN/final (repeat)")
    parser.add_argument("--task", help="bundled task (default: the model's)")
    parser.add_argument("--split", default="test")
    parser.add_argument("-n", type=int, default=200)
    parser.add_argument("--max-new-tokens", type=int, default=16)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)

    from dlmkit.data import get_task
    from dlmkit.generate import evaluate, load

    for path in args.model:
        loaded = load(path)
        strategy = loaded.meta.get("strategy")
        task = args.task or loaded.meta.get("task")
        records = get_task(task).records(args.split, args.n)
        outputs = {}
        for name, options in SETTINGS.get(strategy, {"default": {}}).items():
            options = dict(options)
            sampler = options.pop("sampler", None)
            if options.pop("half_steps", False):
                options["steps"] = max(1, args.max_new_tokens // 2)
            config = loaded.config(sampler, max_new_tokens=args.max_new_tokens, **options)
            accuracy, rows, totals = evaluate(loaded.model, loaded.tokenizer, records, config,
                                              batch_size=args.batch_size)
            outputs[name] = [r["output"] for r in rows]
            print(json.dumps({
                "model": str(path), "strategy": strategy, "task": task, "n": len(rows),
                "setting": name, "sampler": config.sampler, "exact_match": round(accuracy, 4),
                "forwards": totals.forwards, "row_forwards": totals.row_forwards,
                "tokens": totals.generated,
                "tokens_per_forward": round(totals.tokens_per_forward, 3),
                "tokens_per_second": round(totals.tokens_per_second, 1)}), flush=True)
        if strategy == "idlm" and outputs["isd"] != outputs["ar"]:
            print(f"{path}: ISD output differs from greedy AR", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
