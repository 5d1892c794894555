#!/usr/bin/env python
"""BlockMask and dense-mask construction: dlmkit against torch, in one run.

For ``idlm`` and ``block_diffusion`` (diffusion block 16) at 2L in {2048, 8192, 32768, 131072}
and BlockMask tile 128: build time and peak extra memory of ``.block_mask()`` against eager
``create_block_mask`` and ``torch.compile(create_block_mask)`` (steady state; the first call,
which compiles, is reported separately as ``first_s``). Competitors that would not fit in
memory are skipped and say so. Then ``idlm(...).additive(torch.bfloat16)`` against the naive
broadcast builder at 2L = 32768.

Every measurement runs in its own subprocess (see ``dlmkit.masks.benchmark``). Output: one JSON
document with the records and the speed-up ratios. Timings on shared machines are noisy: compare
ratios from one run, and keep the machine otherwise idle.

    python bench/masks.py                       # the full table (~5-10 min, mostly torch)
    python bench/masks.py --seq-lens 1024,4096  # quicker
"""

from __future__ import annotations

import argparse
import json
import sys

from dlmkit.masks.benchmark import measure


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--masks", default="idlm,block_diffusion")
    parser.add_argument("--seq-lens", default="1024,4096,16384,65536",
                        help="L per stream (the mask is 2L x 2L)")
    parser.add_argument("--dense-seq-len", type=int, default=16384,
                        help="L for the additive-mask comparison (0 to skip)")
    parser.add_argument("--block", type=int, default=16, help="diffusion block size")
    parser.add_argument("--tile", type=int, default=128, help="BlockMask tile")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()

    records = []

    def run(name, seq_len, method, repeats):
        print(f"# {name} 2L={2 * seq_len} {method}", file=sys.stderr, flush=True)
        rec = measure(name, seq_len, args.block, args.tile, method, repeats=repeats,
                      q_len=2 * seq_len, kv_len=2 * seq_len)
        records.append(rec)
        print(json.dumps(rec), file=sys.stderr, flush=True)
        return rec

    summary = []
    for name in args.masks.split(","):
        for seq_len in (int(s) for s in args.seq_lens.split(",")):
            ours = run(name, seq_len, "ours", args.repeats)
            eager = run(name, seq_len, "eager", 2)
            compiled = run(name, seq_len, "compiled", args.repeats)
            row = {"mask": name, "tokens_2L": 2 * seq_len, "ours_s": ours.get("steady_s"),
                   "ours_peak_extra_mib": ours.get("peak_extra_mib")}
            for label, rec in (("eager", eager), ("compiled", compiled)):
                if "skipped" in rec:
                    row[f"{label}"] = "skipped: " + rec["skipped"]
                    continue
                row[f"{label}_s"] = rec["steady_s"]
                row[f"{label}_peak_extra_mib"] = rec["peak_extra_mib"]
                row[f"speedup_vs_{label}"] = rec["steady_s"] / ours["steady_s"]
            if "first_s" in compiled:
                row["compiled_first_call_s"] = compiled["first_s"]
            summary.append(row)

    if args.dense_seq_len:
        ours = run("idlm", args.dense_seq_len, "additive", 3)
        naive = run("idlm", args.dense_seq_len, "additive_naive", 2)
        summary.append({
            "mask": "idlm additive bf16", "tokens_2L": 2 * args.dense_seq_len,
            "ours_s": ours.get("steady_s"), "ours_peak_extra_mib": ours.get("peak_extra_mib"),
            "output_mib": ours.get("output_mib"),
            "naive_s": naive.get("steady_s", naive.get("skipped")),
            "naive_peak_extra_mib": naive.get("peak_extra_mib"),
        })

    print(json.dumps({"summary": summary, "records": records}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
