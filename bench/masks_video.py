"""Canvas/video masks: BlockMask build time and peak memory, ours vs torch ``create_block_mask``.

    .venv/bin/python bench/masks_video.py                         # 16k and 64k tokens
    .venv/bin/python bench/masks_video.py --seq-lens 16384 --cases natten,vsa_direct
    .venv/bin/python bench/masks_video.py --json out.json --markdown

Cases (about ``seq_len`` tokens each):

* the ``EXAMPLES`` of ``dlmkit.masks.natten`` / ``video`` / ``vsa`` (``natten``,
  ``natten_tiled``, ``natten_morton``, ``sta_2d``, ``sta_3d``, ``svg_spatial``,
  ``svg_temporal``, ``vsa``), measured as ``mask.block_mask(flex_block)``. All but
  ``natten_morton`` have row intervals (O(rows * runs + tiles)); Morton uses the engine's
  tile-row fallback, whose memory is O(flex_block * seq_len) -- the point of measuring it;
* ``vsa_direct`` / ``vsa_flash``: ``create_vsa_block_mask`` (tile 64) and
  ``create_vsa_flash_block_mask`` (tile 256, KV sub-block 128) for ``--heads`` heads with a
  per-head top-k at 87.5% sparsity (``include_self``).

Each measurement runs in its own fresh subprocess: warm-up on a tiny instance, then peak extra
memory = ``ru_maxrss`` after the build minus ``ru_maxrss`` after imports and warm-up (for
``torch``, also after building the mask object / top-k table). ``torch`` is eager
``create_block_mask(mask_mod, B, H, Q, KV, BLOCK_SIZE=..., device="cpu")`` on our mask_mod; it
materialises the token grid (~10 bytes per ``B * H * Q * KV`` element) and is skipped -- the
skip is reported -- when that estimate exceeds ``--memory-budget`` (default 50% of
MemAvailable). Workers run ``--threads`` torch threads (default 1: on a loaded 2-core machine
more threads mostly add contention). After timing, the torch worker also builds ours and
records whether all eight index tensors are equal. Output: one JSON object per measurement
on stdout.
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
EXAMPLE_CASES = ("natten", "natten_tiled", "natten_morton", "sta_2d", "sta_3d", "svg_spatial",
                 "svg_temporal", "vsa")
DIRECT_CASES = ("vsa_direct", "vsa_flash")
FIELDS = ("kv_num_blocks", "kv_indices", "full_kv_num_blocks", "full_kv_indices",
          "q_num_blocks", "q_indices", "full_q_num_blocks", "full_q_indices")


class Case:
    """One benchmark case at one size: how to build ours, and torch's equivalent inputs."""

    def __init__(self, name: str, seq_len: int, flex_block: int, heads: int) -> None:
        self.name, self.seq_len, self.flex_block, self.heads = name, seq_len, flex_block, heads

    def prepare(self):
        """Cheap inputs built before the memory baseline (the Mask closure / top-k table)."""
        import torch

        if self.name in EXAMPLE_CASES:
            from dlmkit.masks.catalog import examples

            mask = examples()[self.name](self.seq_len, self.flex_block)
            self.shape = (mask.batch, 1, mask.q_len, mask.kv_len)
            self.block = (self.flex_block, self.flex_block)
            self.structured = mask.has_intervals
            return mask
        from dlmkit.masks.vsa import _topk_from_scores, vsa_topk_from_sparsity

        tile, kvb = (64, 64) if self.name == "vsa_direct" else (256, 128)
        n = max(1, self.seq_len // tile)
        top_k = vsa_topk_from_sparsity(n * tile, tile, n, 0.875)
        g = torch.Generator().manual_seed(0)
        scores = torch.rand(1, self.heads, n, n, generator=g)
        topk = _topk_from_scores(scores, top_k, True, True)
        self.shape = (1, self.heads, n * tile, n * tile)
        self.block = (tile, kvb)
        self.structured = True
        self.top_k = top_k
        return topk

    def ours(self, prepared):
        from dlmkit.masks.vsa import create_vsa_block_mask, create_vsa_flash_block_mask

        if self.name in EXAMPLE_CASES:
            return prepared.block_mask(self.block)
        n = self.shape[2] // self.block[0]
        if self.name == "vsa_direct":
            return create_vsa_block_mask(prepared, self.block[0], n)
        return create_vsa_flash_block_mask(prepared, self.block[0], n, self.block[1])

    def mask_mod(self, prepared):
        if self.name in EXAMPLE_CASES:
            return prepared.mask_mod
        return self.ours(prepared).mask_mod  # the whole pattern (tile table + padding)


def worker(kind: str, name: str, seq_len: int, flex_block: int, heads: int,
           threads: int) -> dict:
    import torch
    from torch.nn.attention.flex_attention import create_block_mask

    def run(case: Case, which: str):
        prepared = case.prepare()
        if which == "torch":
            mod = case.mask_mod(prepared)
        base = peak_rss_bytes()
        start = time.perf_counter()
        if which == "ours":
            block = case.ours(prepared)
        else:
            B, H, Q, KV = case.shape
            block = create_block_mask(mod, B, H, Q, KV, device="cpu", BLOCK_SIZE=case.block)
        return block, time.perf_counter() - start, peak_rss_bytes() - base, prepared

    torch.set_num_threads(threads)
    tiny_len = 1024 if name in DIRECT_CASES else 256
    run(Case(name, tiny_len, flex_block, heads), kind)  # warm-up
    case = Case(name, seq_len, flex_block, heads)
    block, seconds, extra, prepared = run(case, kind)
    B, H, Q, KV = case.shape
    result = {
        "case": name, "impl": kind, "seq_len": seq_len, "shape": [B, H, Q, KV],
        "block": list(case.block), "structured": case.structured,
        "threads": torch.get_num_threads(), "seconds": round(seconds, 4),
        "peak_extra_mib": round(extra / 2**20, 1),
        "partial_blocks": int(block.kv_num_blocks.sum()),
        "full_blocks": int(block.full_kv_num_blocks.sum()),
    }
    if kind == "torch":
        ours = case.ours(prepared)
        result["equal_to_ours"] = all(torch.equal(getattr(ours, f), getattr(block, f))
                                      for f in FIELDS)
    return result


def _estimate(name: str, seq_len: int, flex_block: int, heads: int) -> tuple[int, list[int]]:
    case = Case(name, seq_len, flex_block, heads)
    case.prepare()
    B, H, Q, KV = case.shape
    return BYTES_PER_GRID_ELEMENT * B * H * Q * KV, [B, H, Q, KV]


def _run(kind: str, name: str, seq_len: int, args) -> dict:
    cmd = [sys.executable, __file__, "--worker", kind, name, str(seq_len),
           str(args.flex_block), str(args.heads), str(args.threads)]
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout,
                              cwd=ROOT, env=env)
    except subprocess.TimeoutExpired:
        return {"case": name, "impl": kind, "seq_len": seq_len,
                "skipped": f"timeout after {args.timeout:.0f} s"}
    if proc.returncode != 0:
        tail = (proc.stderr.strip().splitlines() or [f"exit {proc.returncode}"])[-1]
        return {"case": name, "impl": kind, "seq_len": seq_len, "error": tail}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _table(results: list[dict]) -> str:
    rows: dict[tuple[str, int], dict[str, dict]] = {}
    for r in results:
        rows.setdefault((r["case"], r["seq_len"]), {})[r["impl"]] = r
    lines = ["| case | B x H x Q x KV | block | ours s | ours MiB | torch s | torch MiB | "
             "speed-up | equal |", "|---|---|---|---|---|---|---|---|---|"]
    for (name, _), pair in rows.items():
        ours, theirs = pair.get("ours", {}), pair.get("torch", {})
        shape = " x ".join(map(str, ours["shape"])) if "shape" in ours else "-"
        block = "x".join(map(str, ours.get("block", []))) or "-"
        tag = "" if ours.get("structured", True) else " (fallback)"
        o_s = ours.get("seconds", ours.get("error", ours.get("skipped", "-")))
        o_m = ours.get("peak_extra_mib", "-")
        if "seconds" in theirs:
            t_s, t_m = theirs["seconds"], theirs["peak_extra_mib"]
            speed = f"{theirs['seconds'] / max(ours.get('seconds', 1e-9), 1e-9):.0f}x"
            equal = str(theirs.get("equal_to_ours", "-"))
        else:
            t_s = theirs.get("skipped", theirs.get("error", "-"))
            t_m, speed, equal = "-", "-", "-"
        lines.append(f"| {name}{tag} | {shape} | {block} | {o_s} | {o_m} | {t_s} | {t_m} | "
                     f"{speed} | {equal} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    if argv is None and len(sys.argv) > 1 and sys.argv[1] == "--worker":
        kind, name, seq_len, flex_block, heads, threads = sys.argv[2:8]
        print(json.dumps(worker(kind, name, int(seq_len), int(flex_block), int(heads),
                                int(threads))))
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seq-lens", default="16384,65536")
    parser.add_argument("--cases", default=",".join(EXAMPLE_CASES + DIRECT_CASES))
    parser.add_argument("--flex-block", type=int, default=128)
    parser.add_argument("--heads", type=int, default=2, help="heads for the direct VSA cases")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch intra-op threads per worker (1: stable on a shared machine)")
    parser.add_argument("--memory-budget", type=float, default=None,
                        help="GiB allowed for eager create_block_mask (default 50%% of free)")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds per measurement")
    parser.add_argument("--no-torch", action="store_true")
    parser.add_argument("--json", type=Path, help="also write all results to this file")
    parser.add_argument("--markdown", action="store_true", help="summary table on stderr")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(ROOT))

    names = [c for c in args.cases.split(",") if c]
    unknown = set(names) - set(EXAMPLE_CASES + DIRECT_CASES)
    if unknown:
        parser.error(f"unknown cases {sorted(unknown)}")
    budget = (args.memory_budget * 2**30 if args.memory_budget is not None
              else 0.5 * available_bytes())
    results = []
    for seq_len in (int(s) for s in args.seq_lens.split(",")):
        for name in names:
            runs = [_run("ours", name, seq_len, args)]
            estimate, shape = _estimate(name, seq_len, args.flex_block, args.heads)
            if args.no_torch:
                runs.append({"case": name, "impl": "torch", "seq_len": seq_len,
                             "skipped": "--no-torch"})
            elif estimate > budget:
                runs.append({"case": name, "impl": "torch", "seq_len": seq_len, "skipped": (
                    f"skipped: needs ~{estimate / 2**30:.0f} GiB "
                    f"(10 B x {'x'.join(map(str, shape))}) > budget {budget / 2**30:.0f} GiB")})
            else:
                runs.append(_run("torch", name, seq_len, args))
            for run in runs:
                print(json.dumps(run), flush=True)
            results.extend(runs)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1) + "\n")
    if args.markdown:
        print(_table(results), file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
