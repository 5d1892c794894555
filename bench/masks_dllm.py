"""Benchmark: ``.block_mask()`` of the dLLM / chunk-causal masks vs torch ``create_block_mask``.

For every case (the issue's sizes: DFlash up to 512 anchors at ctx 4096, canvas at enc_len 4096,
chunk-causal at 64k tokens, plus packed block diffusion / I-DLM and the decode masks) this
measures, each in its own fresh subprocess:

* ``ours``: building the mask (factory + row intervals) and its ``.block_mask(128)``;
* ``torch``: ``create_block_mask(mask.mask_mod, B, None, Q, KV, BLOCK_SIZE=128)`` eager (the
  full token grid), skipped when its grid would not fit in half the available memory.

Time: ours is the best of 5 fresh builds after a cold one (median and cold also printed; the
machine is shared and noisy), torch one build (seconds per call, too slow to repeat).

Peak extra memory: on Linux the subprocess resets its peak RSS (``echo 5 >
/proc/self/clear_refs``) right before the measured call and reports ``VmHWM - VmRSS``: peak
resident memory above the baseline, inputs already built. Elsewhere it falls back to the
``ru_maxrss`` delta. Prints one JSON object per line and a summary JSON list at the end.

    python bench/masks_dllm.py            # all cases
    python bench/masks_dllm.py --only dflash_n512
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time

from dlmkit.masks.benchmark import available_bytes

BLOCK = 128
# Bytes per grid entry create_block_mask needs at its peak (bool grid + int64 index/compare
# temporaries of the vmapped rule); measured ~10 on torch 2.13 CPU (dflash n512: 1.0 GiB
# for 1.0e8 entries), rounded up.
TORCH_BYTES_PER_ENTRY = 16


def _cases():
    import torch

    from dlmkit.masks import block_diffusion, idlm
    from dlmkit.masks.canvas import canvas
    from dlmkit.masks.chunk_causal import chunk_causal, expert_cross, expert_self
    from dlmkit.masks.decode import block_diffusion_decode, dflash_decode
    from dlmkit.masks.dflash import dflash
    from dlmkit.masks.tags import KIND_CLEAN, KIND_GLOBAL, KIND_NOISED, Slot, window_tags

    g = torch.Generator().manual_seed(0)
    ctx, bs = 4096, 16

    def dflash_case(n, **kwargs):
        anchors = torch.randint(0, ctx - bs, (1, n), generator=g)
        keep = torch.rand(1, n, generator=g) > 0.1
        extra = {}
        if kwargs.pop("docs", False):
            ctx_doc = torch.bucketize(torch.arange(ctx), torch.arange(0, ctx, 700)[1:])
            extra = dict(ctx_doc_id=ctx_doc.unsqueeze(0),
                         anchor_doc_id=ctx_doc[anchors.clamp(max=ctx - 1)])
        return lambda: dflash(anchors, keep, ctx, bs, **kwargs, **extra)

    enc, resp = 4096, 2048
    prefix = torch.tensor([512, 1024, 2048, 100])
    response = torch.tensor([2048, 1500, 2000, 64])

    # 64k-token video layout: 512 globals, clean and noised copies of 32 frames x 1016 tokens,
    # chunks of 4 frames; the action expert has 32 tokens per frame.
    video = [Slot(KIND_GLOBAL, 1, 512), Slot(KIND_CLEAN, 32, 1016), Slot(KIND_NOISED, 32, 1016)]
    tags = window_tags(video, chunk_size=4)
    expert = window_tags([Slot(KIND_NOISED, 32, 32)], chunk_size=4)

    L = 8192
    docs = torch.bucketize(torch.arange(L), torch.tensor([900, 2100, 2500, 5000, 7000]))
    docs = docs.unsqueeze(0)

    return {
        "dflash_n64": dflash_case(64),
        "dflash_n128": dflash_case(128),
        "dflash_n256": dflash_case(256),
        "dflash_n512": dflash_case(512),
        "dflash_n512_causal_window": dflash_case(512, causal=True, sliding_window=1024),
        "dflash_n512_docs": dflash_case(512, docs=True),
        "canvas_full_b4": lambda: canvas(prefix, response, enc, 256, canvas_length=resp),
        "canvas_sliding_b4": lambda: canvas(prefix, response, enc, 256, 1024,
                                            canvas_length=resp),
        "chunk_causal_64k": lambda: chunk_causal(tags, cache=None),
        "expert_cross_64k": lambda: expert_cross(expert, tags, window=8, cache=None),
        "expert_self_1k": lambda: expert_self(expert, cache=None),
        "block_diffusion_packed_8k": lambda: block_diffusion(L, 16, doc_ids=docs),
        "idlm_packed_8k": lambda: idlm(L, 4, doc_ids=docs),
        "block_diffusion_decode_64k": lambda: block_diffusion_decode(65536, 32, 4),
        "dflash_decode_64k": lambda: dflash_decode(65536, 16),
    }


def _rss_kib(field: str) -> int | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def _reset_peak() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _measure(fn):
    """Run ``fn`` once; return (seconds, peak extra MiB, method)."""
    if _reset_peak() and _rss_kib("VmRSS") is not None:
        base = _rss_kib("VmRSS")
        start = time.perf_counter()
        fn()
        elapsed = time.perf_counter() - start
        return elapsed, (_rss_kib("VmHWM") - base) / 1024, "VmHWM-after-clear_refs"
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    start = time.perf_counter()
    fn()
    elapsed = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return elapsed, (peak - base) / 1024, "ru_maxrss-delta"


def run_one(name: str, method: str, threads: int | None) -> dict:
    import torch
    from torch.nn.attention.flex_attention import create_block_mask

    if threads:
        torch.set_num_threads(threads)
    build = _cases()[name]
    probe = build()
    shape = {"batch": probe.batch, "q_len": probe.q_len, "kv_len": probe.kv_len}
    result = {"case": name, "method": method, "threads": torch.get_num_threads(), **shape}
    if method == "ours":
        cold, extra, how = _measure(lambda: build().block_mask(BLOCK))
        warm = [_measure(lambda: build().block_mask(BLOCK))[0] for _ in range(5)]
        tiles = build().tile_map(BLOCK)
        result.update(seconds=min(warm), median_seconds=statistics.median(warm),
                      cold_seconds=cold, peak_extra_mib=extra, memory=how,
                      tiles=int(tiles.numel()))
    else:
        mod = probe.mask_mod
        seconds, extra, how = _measure(lambda: create_block_mask(
            mod, probe.batch, None, probe.q_len, probe.kv_len, device="cpu", BLOCK_SIZE=BLOCK))
        result.update(seconds=seconds, peak_extra_mib=extra, memory=how)
    return result


def _subprocess(name: str, method: str, threads: int | None) -> dict:
    command = [sys.executable, __file__, "--one", name, "--method", method]
    if threads:
        command += ["--threads", str(threads)]
    out = subprocess.run(command, capture_output=True, text=True, env={**os.environ})
    if out.returncode != 0:
        return {"case": name, "method": method, "error": out.stderr.strip().splitlines()[-1:]}
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--one", help=argparse.SUPPRESS)
    parser.add_argument("--method", default="ours", help=argparse.SUPPRESS)
    parser.add_argument("--only", nargs="*", help="case names (default: all)")
    parser.add_argument("--no-torch", action="store_true", help="skip create_block_mask")
    parser.add_argument("--threads", type=int, help="torch intra-op threads for both sides "
                        "(1 avoids OpenMP stalls on shared, oversubscribed CPUs)")
    args = parser.parse_args()
    if args.one:
        print(json.dumps(run_one(args.one, args.method, args.threads)))
        return
    names = args.only or list(_cases())
    summary = []
    for name in names:
        ours = _subprocess(name, "ours", args.threads)
        print(json.dumps(ours), flush=True)
        row = {"case": name, **{k: ours.get(k) for k in ("batch", "q_len", "kv_len", "tiles")},
               "ours_s": ours.get("seconds"), "ours_peak_mib": ours.get("peak_extra_mib")}
        grid = (ours.get("batch") or 1) * (ours.get("q_len") or 0) * (ours.get("kv_len") or 0)
        need = grid * TORCH_BYTES_PER_ENTRY
        if args.no_torch:
            row["torch"] = "skipped (--no-torch)"
        elif need > available_bytes() // 2:
            row["torch"] = (f"skipped: needs ~{need / 2**30:.1f} GiB for the {grid:.2e}-entry "
                            f"grid, {available_bytes() / 2**30:.1f} GiB available")
        else:
            theirs = _subprocess(name, "torch", args.threads)
            print(json.dumps(theirs), flush=True)
            row.update(torch_s=theirs.get("seconds"), torch_peak_mib=theirs.get("peak_extra_mib"))
            if theirs.get("seconds") and ours.get("seconds"):
                row["speedup"] = round(theirs["seconds"] / ours["seconds"], 1)
        summary.append(row)
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
