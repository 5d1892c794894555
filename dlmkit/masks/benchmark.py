"""Build-time and peak-memory measurements of mask construction, ours against torch's.

Each measurement runs in a fresh subprocess so that its peak resident memory (``ru_maxrss``,
taken after imports and a warm-up build) belongs to that measurement alone. Methods:

* ``ours``          — ``mask.block_mask(tile)`` (tile map -> both index sides);
* ``eager``         — ``create_block_mask(mask.mask_mod, ...)`` as shipped (full token grid);
* ``compiled``      — ``torch.compile(create_block_mask)``: first call (compile) reported apart
  from the steady-state calls;
* ``additive``      — ``mask.additive(torch.bfloat16)``;
* ``additive_naive`` — the broadcast builder most code uses: the rule on the whole index grid,
  then ``torch.where`` into bf16.

Competitors that would not fit in memory are skipped with the reason in the record.
"""

from __future__ import annotations

import json
import os
import resource
import statistics
import subprocess
import sys
import time

METHODS = ("ours", "eager", "compiled", "additive", "additive_naive")

# Measured cost of eager create_block_mask: ~10 bytes per grid element (platform notes);
# the naive additive builder keeps a bool grid, an index grid broadcast and the output.
_BYTES_PER_ELEMENT = {"eager": 11, "additive_naive": 6, "additive": 2.2, "compiled": 1.0}


def available_bytes() -> int:
    """``MemAvailable`` from /proc/meminfo (a huge number where it cannot be read)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 1 << 62


def peak_rss_bytes() -> int:
    """This process's peak resident set size so far (``ru_maxrss`` is KiB on Linux)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _maxrss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def run_case(name: str, seq_len: int, block: int, tile: int, method: str, repeats: int) -> dict:
    """Measure one (mask, method) in this process; returns a JSON-able record."""
    import torch
    from torch.nn.attention.flex_attention import create_block_mask, create_mask

    from .catalog import example

    mask = example(name, seq_len, block)
    q_len, kv_len = mask.q_len, mask.kv_len

    # Our timings include building the mask from its factory: nothing is cached between calls.
    if method == "ours":
        def build():
            return example(name, seq_len, block).block_mask(tile)
        warm = example(name, 4, block)
        warm.block_mask(tile)
    elif method == "eager":
        def build():
            return create_block_mask(mask.mask_mod, mask.batch, None, q_len, kv_len,
                                     device="cpu", BLOCK_SIZE=tile)
    elif method == "compiled":
        compiled = torch.compile(create_block_mask)

        def build():
            return compiled(mask.mask_mod, mask.batch, None, q_len, kv_len, device="cpu",
                            BLOCK_SIZE=tile)
    elif method == "additive":
        def build():
            return example(name, seq_len, block).additive(torch.bfloat16)
        example(name, 4, block).additive(torch.bfloat16)
    elif method == "additive_naive":
        def build():
            allowed = create_mask(mask.mask_mod, mask.batch, None, q_len, kv_len, device="cpu")
            return torch.where(allowed, 0.0, torch.finfo(torch.bfloat16).min).to(torch.bfloat16)
    else:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")

    baseline = _maxrss_mib()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        out = build()
        times.append(time.perf_counter() - start)
        del out
    record = {
        "mask": name, "seq_len": seq_len, "q_len": q_len, "kv_len": kv_len,
        "block": block, "tile": tile, "method": method,
        "first_s": times[0],
        "steady_s": statistics.median(times[1:]) if len(times) > 1 else times[0],
        "peak_extra_mib": max(0.0, _maxrss_mib() - baseline),
    }
    if method in ("additive", "additive_naive"):
        record["output_mib"] = q_len * kv_len * mask.batch * 2 / 2**20
    return record


def measure(name: str, seq_len: int, block: int, tile: int, method: str, repeats: int = 3,
            timeout: float = 900.0, q_len: int | None = None, kv_len: int | None = None) -> dict:
    """Run :func:`run_case` in a subprocess (skipping what would not fit in memory)."""
    base = {"mask": name, "seq_len": seq_len, "block": block, "tile": tile, "method": method}
    if q_len is not None and kv_len is not None and method in _BYTES_PER_ELEMENT:
        need = _BYTES_PER_ELEMENT[method] * q_len * kv_len
        if method != "additive" and need > 0.8 * available_bytes():
            return {**base, "skipped": f"needs ~{need / 2**30:.0f} GiB, "
                                       f"{available_bytes() / 2**30:.0f} GiB available"}
    code = ("import json, sys; from dlmkit.masks.benchmark import run_case; "
            f"print(json.dumps(run_case({name!r}, {seq_len}, {block}, {tile}, {method!r}, "
            f"{repeats})))")
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    try:
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                              timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return {**base, "skipped": f"timed out after {timeout:.0f} s"}
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["?"]
        return {**base, "skipped": f"failed (exit {done.returncode}): {tail[0][:200]}"}
    return json.loads(done.stdout.strip().splitlines()[-1])
