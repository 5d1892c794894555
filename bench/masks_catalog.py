"""BlockMask build time and peak memory: ``Mask.block_mask()`` vs torch ``create_block_mask``.

    .venv/bin/python bench/masks_catalog.py                        # 64k tokens, every example
    .venv/bin/python bench/masks_catalog.py --seq-len 16384 --masks causal,prefix_lm
    .venv/bin/python bench/masks_catalog.py --json out.json --markdown

For every example of ``dlmkit.masks.catalog.examples()`` at ``--seq-len`` tokens (structural
block ``--block-size``, FlexAttention ``--flex-block`` tiles) two measurements run, each in
its own fresh subprocess so peak memory is not polluted by earlier work:

* ``ours``: the example factory plus ``mask.block_mask(flex_block)``;
* ``torch``: eager ``create_block_mask(mask.mask_mod, batch, None, q_len, kv_len,
  BLOCK_SIZE=flex_block, device="cpu")`` (the mask object is built before the baseline).

Each worker repeats the build ``--repeat`` times (min and median reported; ``ours`` calls
the factory afresh each time, so no cached intervals are reused). Both first build and
convert a tiny instance (warm-up), so times are steady-state.
Peak extra memory = ``resource.getrusage(RUSAGE_SELF).ru_maxrss`` after the measurement minus
the same figure taken after imports (and, for ``torch``, after building the mask object).
Eager ``create_block_mask`` materialises the whole grid (about 10 bytes per ``batch * q_len *
kv_len`` element, attn_gym_spec.md §7.2); it is skipped, and the skip reported, when that
estimate exceeds ``--memory-budget`` (default: 60% of MemAvailable).

Workers run with ``--threads`` torch threads (default 1, for both sides): building a
BlockMask from intervals is a chain of small tensor ops, and on a shared 2-vCPU machine with
other load an OpenMP barrier per op made them up to 100x slower with 2 threads (measured),
which would turn the comparison into noise.

Prints one JSON object per measurement (and the whole list with ``--json``); ``--markdown``
adds a summary table on stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from dlmkit.masks.benchmark import available_bytes, peak_rss_bytes

ROOT = Path(__file__).resolve().parents[1]
BYTES_PER_GRID_ELEMENT = 10


def worker(kind: str, name: str, seq_len: int, block_size: int, flex_block: int,
           repeat: int) -> dict:
    import torch

    torch.set_num_threads(int(os.environ.get("BENCH_THREADS", "1")))
    from torch.nn.attention.flex_attention import create_block_mask

    from dlmkit.masks.catalog import examples

    builder = examples()[name]
    # Warm up both paths on a tiny instance (lazy imports, vmap/dispatcher set-up) so that
    # the figures are the steady-state cost of one build, not one-time start-up.
    tiny = builder(min(seq_len, 64), min(block_size, 8))
    tiny.block_mask(16)
    if kind == "torch":
        create_block_mask(tiny.mask_mod, tiny.batch, None, tiny.q_len, tiny.kv_len,
                          device="cpu", BLOCK_SIZE=16)
    times = []
    if kind == "torch":
        mask = builder(seq_len, block_size)
    base = peak_rss_bytes()
    block = None
    for _ in range(repeat):
        block = None  # never hold the previous result while building the next
        start = time.perf_counter()
        if kind == "ours":  # a fresh mask each time: nothing cached between repeats
            mask = builder(seq_len, block_size)
            block = mask.block_mask(flex_block)
        else:
            block = create_block_mask(mask.mask_mod, mask.batch, None, mask.q_len,
                                      mask.kv_len, device="cpu", BLOCK_SIZE=flex_block)
        times.append(time.perf_counter() - start)
    partial = int(block.kv_num_blocks.sum())
    full = int(block.full_kv_num_blocks.sum()) if block.full_kv_num_blocks is not None else 0
    return {
        "mask": name, "impl": kind, "batch": mask.batch, "q_len": mask.q_len,
        "kv_len": mask.kv_len, "flex_block": flex_block, "structured": mask.has_intervals,
        "seconds": round(min(times), 4), "median_seconds": round(sorted(times)[len(times) // 2], 4),
        "repeat": repeat, "peak_extra_mib": round((peak_rss_bytes() - base) / 2**20, 1),
        "partial_blocks": partial, "full_blocks": full,
    }


def _shape(name: str, seq_len: int, block_size: int) -> tuple[int, int, int]:
    from dlmkit.masks.catalog import examples

    mask = examples()[name](seq_len, block_size)
    return mask.batch, mask.q_len, mask.kv_len


def _run(kind, name, args) -> dict:
    cmd = [sys.executable, __file__, "--worker", kind, name, str(args.seq_len),
           str(args.block_size), str(args.flex_block), str(args.repeat)]
    env = dict(os.environ, BENCH_THREADS=str(args.threads))
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout,
                              cwd=ROOT, env=env)
    except subprocess.TimeoutExpired:
        return {"mask": name, "impl": kind, "skipped": f"timeout after {args.timeout} s"}
    if proc.returncode != 0:
        tail = proc.stderr.strip().splitlines()[-1:] or [f"exit {proc.returncode}"]
        return {"mask": name, "impl": kind, "error": tail[0]}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    if argv is None and len(sys.argv) > 1 and sys.argv[1] == "--worker":
        kind, name, seq_len, block_size, flex_block, repeat = sys.argv[2:8]
        print(json.dumps(worker(kind, name, int(seq_len), int(block_size), int(flex_block),
                                int(repeat))))
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seq-len", type=int, default=65536)
    parser.add_argument("--block-size", type=int, default=128, help="structural block")
    parser.add_argument("--flex-block", type=int, default=128, help="BlockMask tile size")
    parser.add_argument("--masks", default="", help="comma-separated example names")
    parser.add_argument("--memory-budget", type=float, default=None,
                        help="GiB allowed for eager create_block_mask (default 60%% of free)")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch intra-op threads in each worker (default 1, see above)")
    parser.add_argument("--repeat", type=int, default=3,
                        help="builds per measurement; the minimum time is reported")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per measurement")
    parser.add_argument("--no-torch", action="store_true", help="only measure ours")
    parser.add_argument("--json", type=Path, help="also write all results to this file")
    parser.add_argument("--markdown", action="store_true", help="summary table on stderr")
    args = parser.parse_args(argv)

    from dlmkit.masks.catalog import examples

    names = [n for n in args.masks.split(",") if n] or list(examples())
    budget = (args.memory_budget * 2**30 if args.memory_budget is not None
              else 0.6 * available_bytes())
    results = []
    for name in names:
        batch, q_len, kv_len = _shape(name, args.seq_len, args.block_size)
        runs = [_run("ours", name, args)]
        estimate = BYTES_PER_GRID_ELEMENT * batch * q_len * kv_len
        if args.no_torch:
            runs.append({"mask": name, "impl": "torch", "skipped": "--no-torch"})
        elif estimate > budget:
            runs.append({"mask": name, "impl": "torch", "skipped": (
                f"needs ~{estimate / 2**30:.1f} GiB (10 B x {batch}x{q_len}x{kv_len} grid) "
                f"> budget {budget / 2**30:.1f} GiB")})
        else:
            runs.append(_run("torch", name, args))
        for run in runs:
            print(json.dumps(run), flush=True)
        results.extend(runs)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1) + "\n")
    if args.markdown:
        print(_table(results), file=sys.stderr)
    return 0


def _table(results: list[dict]) -> str:
    by_mask: dict[str, dict[str, dict]] = {}
    for r in results:
        by_mask.setdefault(r["mask"], {})[r["impl"]] = r
    lines = ["| mask | B x Q x KV | ours s (min) | ours MiB | torch s (min) | torch MiB "
             "| speed-up |",
             "|---|---|---|---|---|---|---|"]
    for name, pair in by_mask.items():
        ours, theirs = pair.get("ours", {}), pair.get("torch", {})
        shape = (f"{ours['batch']} x {ours['q_len']} x {ours['kv_len']}"
                 if "q_len" in ours else "-")
        o_s = ours.get("seconds", ours.get("error", "-"))
        o_m = ours.get("peak_extra_mib", "-")
        if "seconds" in theirs:
            t_s, t_m = theirs["seconds"], theirs["peak_extra_mib"]
            ratio = f"{theirs['seconds'] / max(ours.get('seconds', 1e-9), 1e-9):.0f}x"
        else:
            t_s, t_m, ratio = theirs.get("skipped", theirs.get("error", "-")), "-", "-"
        lines.append(f"| {name} | {shape} | {o_s} | {o_m} | {t_s} | {t_m} | {ratio} |")
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
