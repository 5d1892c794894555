"""Peak memory and time of loss forward+backward: chunked vs unchunked vs F.cross_entropy.

Run: ``python bench/losses.py [--rows 16384] [--vocab 32000] [--hidden 256]`` (prints JSON).

Method: every variant runs in its own fresh subprocess. Memory is the growth of the process's
peak resident set size (``resource.getrusage(RUSAGE_SELF).ru_maxrss``) during the first
forward+backward, over the peak measured once the inputs exist ("extra" memory: what the loss
and its backward add). Large CPU tensors come from mmap and go back to the OS when freed, so
RSS follows live tensor memory (``MALLOC_MMAP_THRESHOLD_`` is set low in the subprocesses so
glibc serves every large block by mmap instead of keeping freed ones in its heap). A small
warm-up run first keeps one-time library set-up out of the figure. Time is the median of
``--reps`` further forward+backward runs.
Ratios are formed within one run (this machine is noisy; never compare across runs).

Variants (fp32, ``N = rows`` positions, ``V = vocab``):
* ``fused_chunked`` / ``fused_unchunked``: :class:`DFlashDecayLoss` on hidden ``[N, D]`` with an
  LM head ``[V, D]`` (the logits exist only chunk by chunk in the first, in full in the second);
* ``fused_torch_ce``: ``F.cross_entropy(hidden @ W.T, targets)`` — the plain baseline;
* ``logits_chunked`` / ``logits_unchunked`` / ``logits_torch_ce``: the same on a given logits
  leaf ``[N, V]`` (:class:`MDLMLoss` with every position corrupted, p = 1). The logits'
  gradient ``[N, V]`` is unavoidable there, so the saving is smaller.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

VARIANTS = ["fused_chunked", "fused_unchunked", "fused_torch_ce",
            "logits_chunked", "logits_unchunked", "logits_torch_ce"]


def _peak_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # Linux: KiB


def _make(name: str, rows: int, vocab: int, hidden: int, chunk: int):
    """Inputs and a forward function for one variant: ``(step, leaves)``."""
    import torch
    import torch.nn.functional as F

    from dlmkit.diffusion import DFlashDecayLoss, MDLMLoss

    torch.manual_seed(0)
    targets = torch.randint(0, vocab, (1, rows))
    ones = torch.ones(1, rows)
    if name.startswith("fused"):
        h = torch.randn(1, rows, hidden, requires_grad=True)
        w = (torch.randn(vocab, hidden) / hidden**0.5).requires_grad_()
        leaves = [h, w]
        if name == "fused_torch_ce":
            def step():
                return F.cross_entropy((h[0] @ w.T), targets[0])
        else:
            loss = DFlashDecayLoss(block_size=17, gamma=None,
                                   chunk_size=chunk if name == "fused_chunked" else None)

            def step():
                return loss(hidden=h, lm_head_weight=w, target_ids=targets, block_mask=ones).total
    else:
        logits = torch.randn(1, rows, vocab, requires_grad=True)
        leaves = [logits]
        if name == "logits_torch_ce":
            def step():
                return F.cross_entropy(logits[0], targets[0])
        else:
            loss = MDLMLoss(chunk_size=chunk if name == "logits_chunked" else None)
            noise = ones.bool()

            def step():
                return loss(logits=logits, target_ids=targets, noise_mask=noise, p_mask=ones,
                            loss_mask=ones).total
    return step, leaves


def _fwd_bwd(step, leaves) -> float:
    for t in leaves:
        t.grad = None
    start = time.perf_counter()
    step().backward()
    return time.perf_counter() - start


def _run_variant(name: str, rows: int, vocab: int, hidden: int, chunk: int, reps: int) -> dict:
    _fwd_bwd(*_make(name, 64, 512, 16, 16))  # warm up kernels and thread pools, small
    step, leaves = _make(name, rows, vocab, hidden, chunk)

    def fwd_bwd():
        return _fwd_bwd(step, leaves)

    base = _peak_mib()
    first = fwd_bwd()
    extra = _peak_mib() - base
    times = [fwd_bwd() for _ in range(reps)]
    return {"variant": name, "extra_peak_mib": round(extra, 1), "baseline_mib": round(base, 1),
            "first_s": round(first, 3), "median_s": round(statistics.median(times), 3),
            "times_s": [round(t, 3) for t in times]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=16384, help="B*L positions")
    p.add_argument("--vocab", type=int, default=32000)
    p.add_argument("--hidden", type=int, default=256, help="D of the fused LM head")
    p.add_argument("--chunk", type=int, default=1024, help="rows per chunk")
    p.add_argument("--reps", type=int, default=3, help="timed runs after the measured one")
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--only", help=argparse.SUPPRESS)  # internal: run one variant here
    a = p.parse_args()
    if a.only:
        print(json.dumps(_run_variant(a.only, a.rows, a.vocab, a.hidden, a.chunk, a.reps)))
        return
    root = Path(__file__).resolve().parents[1]
    results = {}
    for name in a.variants.split(","):
        cmd = [sys.executable, __file__, "--only", name, "--rows", str(a.rows), "--vocab",
               str(a.vocab), "--hidden", str(a.hidden), "--chunk", str(a.chunk),
               "--reps", str(a.reps)]
        out = subprocess.run(cmd, capture_output=True, text=True, check=True, cwd=root,
                             env={"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin",
                                  "MALLOC_MMAP_THRESHOLD_": "65536"})
        results[name] = json.loads(out.stdout.strip().splitlines()[-1])
    summary = {"config": {"rows": a.rows, "vocab": a.vocab, "hidden": a.hidden,
                          "chunk": a.chunk, "dtype": "float32", "reps": a.reps},
               "results": results, "ratios": {}}
    for kind in ("fused", "logits"):
        c, u, t = (results.get(f"{kind}_{s}") for s in ("chunked", "unchunked", "torch_ce"))
        if c and u:
            summary["ratios"][f"{kind}_chunked_over_unchunked_memory"] = round(
                c["extra_peak_mib"] / u["extra_peak_mib"], 3)
            summary["ratios"][f"{kind}_chunked_over_unchunked_time"] = round(
                c["median_s"] / u["median_s"], 3)
        if c and t:
            summary["ratios"][f"{kind}_chunked_over_torch_ce_memory"] = round(
                c["extra_peak_mib"] / t["extra_peak_mib"], 3)
            summary["ratios"][f"{kind}_chunked_over_torch_ce_time"] = round(
                c["median_s"] / t["median_s"], 3)
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
