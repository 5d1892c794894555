"""Build-time and peak-memory measurements of mask construction, ours against torch's.

A *case* is a named example (:mod:`dlmkit.masks.catalog`: the engine's masks and the
catalogue's, sized by ``seq_len`` and the structural ``block``) or one of the fixed-size
scenarios of :func:`scenario_names` (the dLLM layouts at their real sizes, and VSA's direct
block-mask builders, which are not ``Mask`` factories). Each measurement runs in a fresh
subprocess so that its peak resident memory belongs to that measurement alone. Methods:

* ``ours``           — the factory plus ``mask.block_mask(tile)`` (nothing cached between calls);
* ``eager``          — ``create_block_mask(mask.mask_mod, ...)`` as shipped (full token grid);
  the record says whether all eight index tensors equal ours;
* ``compiled``       — ``torch.compile(create_block_mask)``: the first call (compile) is
  reported apart from the steady-state calls;
* ``additive``       — ``mask.additive(torch.bfloat16)``;
* ``additive_naive`` — the broadcast builder most code uses: the rule on the whole index grid,
  then ``torch.where`` into bf16.

Peak extra memory: on Linux the peak RSS is reset (``/proc/self/clear_refs``) right before each
measured call and ``VmHWM - VmRSS`` read after it; elsewhere the ``ru_maxrss`` growth.
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
from collections.abc import Callable
from dataclasses import dataclass

METHODS = ("ours", "eager", "compiled", "additive", "additive_naive")
FIELDS = ("kv_num_blocks", "kv_indices", "full_kv_num_blocks", "full_kv_indices",
          "q_num_blocks", "q_indices", "full_q_num_blocks", "full_q_indices")

# Peak bytes per Q x KV grid element: eager create_block_mask ~10 (platform notes; up to 16 with
# a batch or per-row data), the naive additive builder a bool grid, an index grid broadcast and
# the output. Used only to skip what cannot fit.
_BYTES_PER_ELEMENT = {"eager": 16, "additive_naive": 6, "additive": 2.2, "compiled": 1.0}


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


def _status_kib(field: str) -> int | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def _timed(fn) -> tuple[float, float, object]:
    """Run ``fn`` once: (seconds, peak extra MiB above the memory held before, result)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # resets VmHWM to the current RSS
        base = _status_kib("VmRSS")
    except OSError:
        base = None
    if base is None:
        before = peak_rss_bytes()
    start = time.perf_counter()
    out = fn()
    seconds = time.perf_counter() - start
    if base is not None:
        extra = (_status_kib("VmHWM") - base) / 1024
    else:
        extra = (peak_rss_bytes() - before) / 2**20
    return seconds, max(0.0, extra), out


# ------------------------------------------------------------------------------------ cases
@dataclass
class Target:
    """What one case measures: a fresh build of ours, and torch's equivalent inputs."""

    name: str
    shape: tuple[int, int, int, int]  # (batch, heads, q_len, kv_len); heads 1 = broadcast
    block: tuple[int, int]            # BlockMask (q, kv) tile
    build: Callable[[], object]       # -> BlockMask, factory included
    mask_mod: Callable
    mask: Callable[[], object] | None = None  # -> Mask, for the dense methods
    structured: bool = True


def _mask_target(name: str, factory: Callable[[], object], tile: int) -> Target:
    probe = factory()
    return Target(name, (probe.batch, 1, probe.q_len, probe.kv_len), (tile, tile),
                  lambda: factory().block_mask(tile), probe.mask_mod, factory,
                  probe.structured)


def _dllm_scenarios() -> dict[str, Callable[[], object]]:
    """The dLLM and chunk-causal layouts at their real sizes: DFlash up to 512 anchors over a
    4096-token context, a batch of 4 canvases at enc_len 4096, 64k-token video windows, packed
    8k block diffusion / I-DLM and 64k decode masks."""
    import torch

    from .canvas import canvas
    from .catalogue.chunk_causal import chunk_causal, expert_cross, expert_self
    from .catalogue.tags import KIND_CLEAN, KIND_GLOBAL, KIND_NOISED, Slot, window_tags
    from .decode import block_diffusion_decode, dflash_decode
    from .dflash import dflash
    from .diffusion import block_diffusion, idlm

    ctx, bs = 4096, 16

    def dflash_case(n, seed=0, docs=False, **kwargs):
        def build():
            g = torch.Generator().manual_seed(seed)
            anchors = torch.randint(0, ctx - bs, (1, n), generator=g)
            keep = torch.rand(1, n, generator=g) > 0.1
            extra = {}
            if docs:
                ctx_doc = torch.bucketize(torch.arange(ctx), torch.arange(0, ctx, 700)[1:])
                extra = dict(ctx_doc_id=ctx_doc.unsqueeze(0),
                             anchor_doc_id=ctx_doc[anchors.clamp(max=ctx - 1)])
            return dflash(anchors, keep, ctx, bs, **kwargs, **extra)
        return build

    enc, resp = 4096, 2048
    prefix = torch.tensor([512, 1024, 2048, 100])
    response = torch.tensor([2048, 1500, 2000, 64])
    # 64k-token video layout: 512 globals, clean and noised copies of 32 frames x 1016 tokens,
    # chunks of 4 frames; the action expert has 32 tokens per frame.
    video = [Slot(KIND_GLOBAL, 1, 512), Slot(KIND_CLEAN, 32, 1016), Slot(KIND_NOISED, 32, 1016)]
    L = 8192
    cuts = torch.tensor([900, 2100, 2500, 5000, 7000])

    def tags():
        return window_tags(video, chunk_size=4)

    def expert():
        return window_tags([Slot(KIND_NOISED, 32, 32)], chunk_size=4)

    def docs():
        return torch.bucketize(torch.arange(L), cuts).unsqueeze(0)

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
        "chunk_causal_64k": lambda: chunk_causal(tags(), cache=None),
        "expert_cross_64k": lambda: expert_cross(expert(), tags(), window=8, cache=None),
        "expert_self_1k": lambda: expert_self(expert(), cache=None),
        "block_diffusion_packed_8k": lambda: block_diffusion(L, 16, doc_ids=docs()),
        "idlm_packed_8k": lambda: idlm(L, 4, doc_ids=docs()),
        "block_diffusion_decode_64k": lambda: block_diffusion_decode(65536, 32, 4),
        "dflash_decode_64k": lambda: dflash_decode(65536, 16),
    }


def _vsa_target(name: str, seq_len: int, heads: int = 2) -> Target:
    """VSA's direct builders for ``heads`` heads, per-head top-k at 87.5% sparsity."""
    import torch

    from .catalogue.vsa import (
        _topk_from_scores,
        create_vsa_block_mask,
        create_vsa_flash_block_mask,
        vsa_topk_from_sparsity,
    )

    tile, kv_block = (64, 64) if name == "vsa_direct" else (256, 128)
    n = max(1, seq_len // tile)
    top_k = vsa_topk_from_sparsity(n * tile, tile, n, 0.875)
    scores = torch.rand(1, heads, n, n, generator=torch.Generator().manual_seed(0))
    topk = _topk_from_scores(scores, top_k, True, True)

    def build():
        if name == "vsa_direct":
            return create_vsa_block_mask(topk, tile, n)
        return create_vsa_flash_block_mask(topk, tile, n, kv_block)

    return Target(name, (1, heads, n * tile, n * tile), (tile, kv_block), build,
                  build().mask_mod)


VSA_DIRECT = ("vsa_direct", "vsa_flash")


def scenario_names() -> list[str]:
    return [*_dllm_scenarios(), *VSA_DIRECT]


def target(name: str, seq_len: int, block: int, tile: int) -> Target:
    """The case ``name``: a named example at ``(seq_len, block)`` or a fixed scenario (whose
    own sizes ignore ``seq_len``/``block``, except VSA's direct builders, sized by seq_len)."""
    from .catalog import examples

    known = examples()
    if name in known:
        return _mask_target(name, lambda: known[name](seq_len, block), tile)
    if name in VSA_DIRECT:
        return _vsa_target(name, seq_len)
    scenarios = _dllm_scenarios()
    if name in scenarios:
        return _mask_target(name, scenarios[name], tile)
    raise ValueError(f"unknown case {name!r}; examples: {', '.join(known)}; "
                     f"scenarios: {', '.join(scenario_names())}")


# ------------------------------------------------------------------------------ measuring
def _warm_up(name: str, seq_len: int, block: int, tile: int, method: str) -> None:
    """Lazy imports, vmap and dispatcher set-up on a tiny instance, so that the figures are
    the steady cost of one build (the compile of ``compiled`` is its first call, kept)."""
    if name in VSA_DIRECT:
        tiny = target(name, 1024, block, tile)
    elif name in scenario_names():
        return  # fixed sizes: the first of the repeats is reported apart as first_s
    else:
        tiny = target(name, min(seq_len, 64), min(block, 8), 16)
    tiny.build()
    if method == "eager":
        from torch.nn.attention.flex_attention import create_block_mask

        B, H, Q, KV = tiny.shape
        create_block_mask(tiny.mask_mod, B, H if H > 1 else None, Q, KV, device="cpu",
                          BLOCK_SIZE=tiny.block)
    if method == "additive" and tiny.mask is not None:
        import torch

        tiny.mask().additive(torch.bfloat16)


def run_case(name: str, seq_len: int, block: int, tile: int, method: str, repeats: int,
             threads: int | None = None) -> dict:
    """Measure one (case, method) in this process; returns a JSON-able record.

    ``threads``: torch intra-op threads (None keeps torch's default, one per core)."""
    import torch
    from torch.nn.attention.flex_attention import create_block_mask, create_mask

    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    if threads:
        torch.set_num_threads(threads)
    case = target(name, seq_len, block, tile)
    B, H, Q, KV = case.shape
    heads = H if H > 1 else None
    if method in ("additive", "additive_naive") and case.mask is None:
        raise ValueError(f"{name}: method {method!r} needs a Mask (not a direct BlockMask)")

    if method == "ours":
        build = case.build
    elif method == "eager":
        def build():
            return create_block_mask(case.mask_mod, B, heads, Q, KV, device="cpu",
                                     BLOCK_SIZE=case.block)
    elif method == "compiled":
        compiled = torch.compile(create_block_mask)

        def build():
            return compiled(case.mask_mod, B, heads, Q, KV, device="cpu",
                            BLOCK_SIZE=case.block)
    elif method == "additive":
        def build():
            return case.mask().additive(torch.bfloat16)
    else:
        def build():
            allowed = create_mask(case.mask_mod, B, None, Q, KV, device="cpu")
            return torch.where(allowed, 0.0, torch.finfo(torch.bfloat16).min).to(torch.bfloat16)
    _warm_up(name, seq_len, block, tile, method)

    times, peaks, out = [], [], None
    for _ in range(repeats):
        out = None  # never hold the previous result while building the next
        seconds, extra, out = _timed(build)
        times.append(seconds)
        peaks.append(extra)
    steady = times[1:] or times
    record = {
        "case": name, "seq_len": seq_len, "block": block, "tile": list(case.block),
        "shape": list(case.shape), "structured": case.structured, "method": method,
        "threads": torch.get_num_threads(), "repeats": repeats,
        "first_s": times[0], "steady_s": statistics.median(steady), "min_s": min(steady),
        "peak_extra_mib": max(peaks),
    }
    if method in ("additive", "additive_naive"):
        record["output_mib"] = B * Q * KV * 2 / 2**20
    else:
        record["partial_blocks"] = int(out.kv_num_blocks.sum())
        record["full_blocks"] = (int(out.full_kv_num_blocks.sum())
                                 if out.full_kv_num_blocks is not None else 0)
        record["tiles"] = int(out.kv_indices.numel())
    if method == "eager":
        ours = case.build()
        record["equal_to_ours"] = all(
            torch.equal(getattr(ours, f).expand_as(getattr(out, f)), getattr(out, f))
            for f in FIELDS)
    return record


def grid_elements(name: str, seq_len: int, block: int, tile: int) -> int:
    B, H, Q, KV = target(name, seq_len, block, tile).shape
    return B * H * Q * KV


def measure(name: str, seq_len: int, block: int, tile: int, method: str, repeats: int = 3,
            timeout: float = 900.0, q_len: int | None = None, kv_len: int | None = None,
            threads: int | None = None, memory_fraction: float = 0.8) -> dict:
    """Run :func:`run_case` in a subprocess, skipping what would not fit in
    ``memory_fraction`` of the available memory. ``q_len``/``kv_len`` (optional) save
    building the case here just to size it."""
    base = {"case": name, "seq_len": seq_len, "block": block, "tile": tile, "method": method}
    if method in _BYTES_PER_ELEMENT and method != "additive":
        grid = (q_len * kv_len if q_len is not None and kv_len is not None
                else grid_elements(name, seq_len, block, tile))
        need = _BYTES_PER_ELEMENT[method] * grid
        if need > memory_fraction * available_bytes():
            return {**base, "skipped": f"needs ~{need / 2**30:.0f} GiB for the {grid:.2e}-entry "
                                       f"grid, {available_bytes() / 2**30:.0f} GiB available"}
    code = ("import json; from dlmkit.masks.benchmark import run_case; "
            f"print(json.dumps(run_case({name!r}, {seq_len}, {block}, {tile}, {method!r}, "
            f"{repeats}, {threads!r})))")
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
