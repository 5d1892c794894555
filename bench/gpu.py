#!/usr/bin/env python
"""The FlexAttention path on a GPU, checked and timed in one prepared run (JSON + tables).

Sections (``--sections``, default all on CUDA, run in the order correctness, build, attention,
train so that a run cut short keeps the checks; the ``--json`` file is rewritten after every
record):

* ``correctness`` — for every strategy in ``dlmkit.strategies.names()`` (so families added
  later are covered without editing this file), a few training steps of a small model with
  ``flex_attention`` + our ``BlockMask`` against ``sdpa`` + our dense mask, from the same
  weights, batch and noise: loss agreement (relative difference) and gradient agreement
  (relative norm of the difference), in fp32 and under bf16 autocast, with no padding, right
  padding, left padding and a row that is all padding; any NaN/inf in a loss or gradient fails.
  Pass: fp32 loss within 1e-3 relative and gradients within 1e-2 relative norm; bf16 loss
  within 1e-2 and gradients within 1e-2. A strategy whose model or inputs cannot be built
  generically (no switchable Hugging Face attention, a build error) is skipped with the reason.
* ``attention``   — fwd+bwd time and peak memory of compiled ``flex_attention`` with our
  ``BlockMask`` against SDPA with the dense bool mask, at 2L = 8k, 16k, 32k for the idlm and
  bd3lm masks (bf16, one sequence), beside the mask's density (ideal speed-up ~ 1/density).
* ``build``       — ``BlockMask`` build time on the GPU: ours against ``create_block_mask``
  eager and ``torch.compile``d (first call and steady state) at 2L = 32k and 128k; eager is
  skipped, with the reason, where its grid would not fit.
* ``train``       — tokens/s of a real ``dlmkit train`` run (the recipe, ``attention: auto``,
  so FlexAttention on CUDA; bf16 autocast) per strategy at ``--train-seq-len`` tokens.

``--cpu`` (automatic without CUDA) runs the correctness section only, forward-only (CPU
FlexAttention has no backward) at small sizes; by default with eager FlexAttention (which
applies ``mask_mod`` to the whole score grid), ``--compile`` uses the compiled CPU kernel,
which reads the block lists (a compile per shape: slow). ``--cpu --sections build,train``
smoke-tests those two sections on CPU at the sizes given. The exit status is 1 when a check
failed. ``bench/gpu_run.sh`` is the prepared GPU command (this script, then ``pytest -m
cuda``, each under its own time limit, output under ``$OUT``).

    python bench/gpu.py --json gpu.json                  # on a CUDA machine (~6-8 min,
                                                         # mostly flex compiles)
    python bench/gpu.py --sections correctness,build     # a part
    python bench/gpu.py --cpu --strategies mdlm,bd3lm    # CPU smoke (seconds)
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import statistics
import sys
import tempfile
import time
import traceback
from contextlib import contextmanager, nullcontext
from pathlib import Path

import torch

# In order of importance: a run cut short keeps the checks first.
SECTIONS = ("correctness", "build", "attention", "train")
PADDINGS = ("none", "right", "left", "all")
# (loss relative difference, gradient relative norm) allowed per dtype.
TOLERANCE = {"fp32": (1e-3, 1e-2), "bf16": (1e-2, 1e-2)}
# The forward-only CPU check compares the loss only; eager flex and SDPA differ by rounding.
CPU_TOLERANCE = {"fp32": 1e-4, "bf16": 2e-2}


# ------------------------------------------------------------------------------ helpers
def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _empty_cache(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.empty_cache()


def _free_bytes(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    from dlmkit.masks.benchmark import available_bytes

    return available_bytes()


def _timed(fn, device: torch.device) -> tuple[float, object]:
    _sync(device)
    start = time.perf_counter()
    out = fn()
    _sync(device)
    return time.perf_counter() - start, out


def _relative(a: float, b: float) -> float:
    return abs(a - b) / max(abs(b), 1e-12)


def _fmt_s(seconds) -> str:
    if not isinstance(seconds, (int, float)):
        return str(seconds)
    return f"{1e3 * seconds:.1f} ms" if seconds < 1 else f"{seconds:.2f} s"


def _table(header: list[str], rows: list[list]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def _compile_count() -> int:
    """Graphs dynamo has compiled so far in this process (recompiles included)."""
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


@contextmanager
def eager_flex_attention():
    """transformers' flex path with the uncompiled ``flex_attention`` (CPU mode): its wrapper
    compiles flex on first use, 6-14 s per shape on CPU, which the smoke test cannot afford.
    The kernel then applies ``mask_mod`` to the whole grid; ``--compile`` keeps the kernel."""
    from torch.nn.attention.flex_attention import flex_attention
    from transformers.integrations import flex_attention as integration

    original = integration.compile_friendly_flex_attention

    def uncompiled(query, key, value, training=False, **kwargs):
        return flex_attention(query, key, value, **kwargs)

    integration.compile_friendly_flex_attention = uncompiled
    try:
        yield
    finally:
        integration.compile_friendly_flex_attention = original


# ------------------------------------------------------------------------- correctness
def strategy_overrides(name: str, items: list[str]) -> list[str]:
    """The ``--set STRATEGY:key=value`` items for strategy ``name`` (e.g. a DFlash target
    directory made earlier in the same command), as config overrides."""
    out = []
    for item in items:
        target, sep, override = item.partition(":")
        if not sep or "=" not in override:
            raise ValueError(f"--set must be STRATEGY:key=value, got {item!r}")
        if target == name:
            out.append(override)
    return out


def _components(name: str, device: torch.device, seq_len: int, model: str | None,
                attention: str = "sdpa", extra: list[str] = ()):
    """The recipe's own components for strategy ``name`` (model, strategy, collator)."""
    from dlmkit import strategies
    from dlmkit.models import PRESETS
    from dlmkit.train import load_config
    from dlmkit.train.distributed import World
    from dlmkit.train.recipe import build_components

    overrides = [f"strategy.name={name}", f"model.attention={attention}",
                 f"train.device={device.type}", "data.num_train=4", "data.num_validation=2",
                 f"data.max_seq_len={seq_len}", "train.progress=false",
                 "train.global_batch_size=2"]
    default = getattr(strategies.get(name), "default_model", "tiny-llama")
    # A bigger preset replaces the family's own only when both are the same architecture.
    if model and default in PRESETS and model in PRESETS and \
            PRESETS[default]["model_type"] == PRESETS[model]["model_type"]:
        overrides.append(f"model.name={model}")
    config = load_config(None, [*overrides, *extra])
    return config, build_components(config, World(0, 1, 0, device))


def _synthetic_samples(seq_len: int, lengths: list[int], seed: int) -> list[dict]:
    """Random printable-byte samples, the second half of each supervised."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for i, n in enumerate(lengths):
        ids = torch.randint(32, 127, (n,), generator=g)
        out.append({"input_ids": ids, "loss_mask": (torch.arange(n) >= n // 2).long(),
                    "sample_index": i})
    return out


def padded_batch(collator, seq_len: int, padding: str, seed: int = 0) -> dict:
    """A two-row batch with the given padding: none, right (row 1 shorter), left (row 1's
    real tokens moved to the end of the row) or all (row 1 holds no real token)."""
    if padding not in PADDINGS:
        raise ValueError(f"padding must be one of {PADDINGS}, got {padding!r}")
    short = seq_len if padding == "none" else (3 * seq_len) // 4
    batch = collator(_synthetic_samples(seq_len, [seq_len, short], seed))
    length = batch["input_ids"].shape[1]
    rows = [k for k, v in batch.items()
            if isinstance(v, torch.Tensor) and v.dim() == 2 and v.shape[1] == length]
    if padding == "left":
        for row in range(batch["input_ids"].shape[0]):
            shift = int(length - batch["attention_valid"][row].sum())
            for key in rows:
                batch[key][row] = batch[key][row].roll(shift)
    elif padding == "all":
        batch["input_ids"][1] = collator.pad_token_id
        for key, value in (("loss_mask", 0), ("attention_valid", 0), ("doc_ids", -1)):
            if key in batch:
                batch[key][1] = value
        if "lengths" in batch:
            batch["lengths"][1] = 0
    return batch


@contextmanager
def counting_flex_calls():
    """Counts FlexAttention calls made meanwhile (``calls[0]``): through transformers' flex
    integration and through ``torch.nn.attention.flex_attention.flex_attention`` looked up at
    call time (a custom model's attention). A "flex" run that made none tested nothing."""
    import torch.nn.attention.flex_attention as module
    from transformers.integrations import flex_attention as integration

    calls = [0]
    # (module, attribute) pairs to hook; a transformers version without the helper leaves
    # HF models uncounted, and then no count is reported (None) rather than a false zero.
    hooks = [(module, "flex_attention")]
    if hasattr(integration, "compile_friendly_flex_attention"):
        hooks.append((integration, "compile_friendly_flex_attention"))
    originals = [getattr(owner, name) for owner, name in hooks]

    def counted(fn):
        def wrapper(*args, **kwargs):
            calls[0] += 1
            return fn(*args, **kwargs)
        return wrapper

    for (owner, name), fn in zip(hooks, originals):
        setattr(owner, name, counted(fn))
    try:
        yield calls
    finally:
        for (owner, name), fn in zip(hooks, originals):
            setattr(owner, name, fn)
        if len(hooks) == 1 and calls[0] == 0:
            calls[0] = None


def _loss_and_grads(model, strategy, prepared, denominators, autocast, backward: bool):
    params = [p for p in model.parameters() if p.requires_grad]
    model.zero_grad(set_to_none=True)
    grad_context = nullcontext() if backward else torch.no_grad()
    with grad_context, autocast():
        total = strategy.loss(model, prepared, denominators).total.float()
    if not backward:
        return float(total), None
    total.backward()
    grads = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).flatten().float()
                       for p in params])
    return float(total), grads


def check_strategy(name: str, device: torch.device, emit, *, seq_len: int, steps: int,
                   dtypes: list[str], paddings: list[str], model: str | None,
                   extra: list[str] = (), lr: float = 1e-3) -> None:
    """flex + BlockMask against sdpa + dense mask for one strategy; ``emit``s one record per
    (dtype, padding). Forward-only on CPU."""
    from dlmkit.data.seeds import sample_generators

    backward = device.type == "cuda"
    # Both sides come from the public config path (``model.attention``), as a user runs them:
    # the same seed gives the same initial weights, copied across to be sure.
    try:
        config, sdpa_side = _components(name, device, seq_len, model, "sdpa", extra)
        _, flex_side = _components(name, device, seq_len, model, "flex_attention", extra)
        flex_side.model.load_state_dict(sdpa_side.model.state_dict())
    except Exception as err:  # a family this script cannot build generically
        return emit({"strategy": name, "skipped": f"components: {type(err).__name__}: {err}"})
    for dtype in dtypes:
        def autocast(dtype=dtype):
            return (torch.autocast(device.type, dtype=torch.bfloat16) if dtype == "bf16"
                    else nullcontext())

        for padding in paddings:
            sides = [(side.strategy, copy.deepcopy(side.model), side.collator)
                     for side in (sdpa_side, flex_side)]
            optimizers = [torch.optim.SGD(m.parameters(), lr=lr) for _, m, _ in sides]
            record = {"strategy": name, "dtype": dtype, "padding": padding,
                      "seq_len": seq_len, "steps": steps, "backward": backward}
            compiles = _compile_count()
            try:
                losses, grad_rels, nonfinite = [], [], []
                flex_calls = 0
                for step in range(steps):
                    out = []
                    for i, (strategy, side_model, collator) in enumerate(sides):
                        batch = padded_batch(collator, seq_len, padding, seed=step)
                        batch = {k: v.to(device) if isinstance(v, torch.Tensor) else v
                                 for k, v in batch.items()}
                        generators = sample_generators(config["seed"], step,
                                                       batch["sample_index"].tolist(), device)
                        prepared = strategy.prepare(batch, generators)
                        denominators = {k: float(v)
                                        for k, v in strategy.counts(prepared).items()}
                        with counting_flex_calls() as calls:
                            out.append(_loss_and_grads(side_model, strategy, prepared,
                                                       denominators, autocast, backward))
                        if i == 1:
                            flex_calls = None if calls[0] is None or flex_calls is None \
                                else flex_calls + calls[0]
                    (s_loss, s_grad), (f_loss, f_grad) = out
                    losses.append((s_loss, f_loss))
                    finite = math.isfinite(s_loss) and math.isfinite(f_loss)
                    if backward:
                        finite = finite and bool(torch.isfinite(s_grad).all()) \
                            and bool(torch.isfinite(f_grad).all())
                        grad_rels.append(float((f_grad - s_grad).norm()
                                               / s_grad.norm().clamp_min(1e-30)))
                        for opt in optimizers:
                            opt.step()
                    if not finite:
                        nonfinite.append(step)
                record["sdpa_loss"] = [s for s, _ in losses]
                record["flex_loss"] = [f for _, f in losses]
                record["loss_rel"] = max(_relative(f, s) for s, f in losses)
                record["nonfinite_steps"] = nonfinite
                record["flex_calls"] = flex_calls
                if backward:
                    record["grad_rel"] = max(grad_rels)
                    loss_tol, grad_tol = TOLERANCE[dtype]
                    record["passed"] = (not nonfinite and record["loss_rel"] <= loss_tol
                                        and record["grad_rel"] <= grad_tol)
                    record["tolerance"] = {"loss_rel": loss_tol, "grad_rel": grad_tol}
                else:
                    record["passed"] = not nonfinite and record["loss_rel"] <= CPU_TOLERANCE[dtype]
                    record["tolerance"] = {"loss_rel": CPU_TOLERANCE[dtype]}
                if flex_calls == 0:
                    record["passed"] = False
                    record["error"] = ("flex path not exercised: the flex_attention model made "
                                       "no FlexAttention call")
            except Exception as err:
                record["passed"] = False
                record["error"] = f"{type(err).__name__}: {err}"
                record["traceback"] = traceback.format_exc(limit=6)
            record["compiles"] = _compile_count() - compiles
            emit(record)


def correctness(args, device, emit) -> None:
    from dlmkit import strategies

    for name in [n for n in args.strategies.split(",") if n] or strategies.names():
        check_strategy(name, device, emit, seq_len=args.seq_len, steps=args.steps,
                       dtypes=args.dtypes.split(","), paddings=args.paddings.split(","),
                       model=args.model, extra=strategy_overrides(name, args.set))


# ---------------------------------------------------------------------------- attention
def _mask(family: str, seq_len: int, block: int, device):
    from dlmkit.masks import block_diffusion, idlm

    factory = {"idlm": idlm, "bd3lm": block_diffusion}[family]
    return factory(seq_len, block, device=device)


def _peak(fn, device, repeats: int) -> tuple[float, float]:
    """(median seconds, peak extra MiB above what was allocated before) of ``fn``."""
    fn()
    fn()  # warm-up: compile, autotune, allocator
    torch.cuda.reset_peak_memory_stats(device)
    base = torch.cuda.memory_allocated(device)
    times = [_timed(fn, device)[0] for _ in range(repeats)]
    return statistics.median(times), (torch.cuda.max_memory_allocated(device) - base) / 2**20


def attention(args, device, emit) -> None:
    import torch.nn.functional as F
    from torch.nn.attention.flex_attention import flex_attention

    flex = torch.compile(flex_attention, dynamic=False)
    for family in ("idlm", "bd3lm"):
        for tokens in (int(t) for t in args.attention_lens.split(",")):
            mask = _mask(family, tokens // 2, args.block, device)
            rec = {"mask": family, "tokens_2L": tokens, "block": args.block,
                   "heads": args.heads, "head_dim": args.head_dim, "dtype": "bf16"}
            try:
                dense = mask.dense()
                rec["density"] = float(dense.sum()) / dense.numel()
                tiles = mask.tile_map(128)
                rec["tile_density"] = float((tiles > 0).sum()) / tiles.numel()
                rec["dense_mask_mib"] = dense.numel() / 2**20
                block_mask = mask.block_mask(128)
                shape = (1, args.heads, tokens, args.head_dim)

                qkv = [torch.randn(shape, device=device, dtype=torch.bfloat16,
                                   requires_grad=True) for _ in range(3)]
                grad = torch.randn(shape, device=device, dtype=torch.bfloat16)
                runs = {
                    "flex": lambda qkv=qkv, bm=block_mask, g=grad:
                        flex(*qkv, block_mask=bm).backward(g),
                    "sdpa": lambda qkv=qkv, m=dense, g=grad:
                        F.scaled_dot_product_attention(*qkv, attn_mask=m).backward(g),
                }
                with torch.no_grad():
                    diff = (flex(*qkv, block_mask=block_mask)
                            - F.scaled_dot_product_attention(*qkv, attn_mask=dense))
                    rec["max_abs_out_diff"] = float(diff.abs().max())
                for label, fn in runs.items():
                    rec[f"{label}_s"], rec[f"{label}_peak_mib"] = _peak(fn, device, args.repeats)
                rec["speedup"] = rec["sdpa_s"] / rec["flex_s"]
                rec["ideal_speedup"] = 1 / rec["density"]
            except Exception as err:
                rec["error"] = f"{type(err).__name__}: {err}"
            _empty_cache(device)
            emit(rec)


# -------------------------------------------------------------------------------- build
def build(args, device, emit) -> None:
    from torch.nn.attention.flex_attention import create_block_mask

    from dlmkit.masks.benchmark import FIELDS

    # Static shapes: each size gets its own specialised kernel (its compile is the first
    # call), as a user building one length would; dynamic shapes would time a generic kernel.
    compiled = torch.compile(create_block_mask, dynamic=False)
    for family in ("idlm", "bd3lm"):
        for tokens in (int(t) for t in args.build_lens.split(",")):
            L = tokens // 2
            rec = {"mask": family, "tokens_2L": tokens, "block": args.block, "tile": 128}
            try:
                def ours_fn(family=family, L=L):
                    return _mask(family, L, args.block, device).block_mask(128)

                times = [_timed(ours_fn, device)[0] for _ in range(args.repeats + 1)]
                rec["ours_first_s"], rec["ours_s"] = times[0], statistics.median(times[1:])
                ours = ours_fn()
                mod = _mask(family, L, args.block, device).mask_mod

                def eager_fn(mod=mod, n=tokens):
                    return create_block_mask(mod, 1, None, n, n, device=device, BLOCK_SIZE=128)

                def compiled_fn(mod=mod, n=tokens):
                    return compiled(mod, 1, None, n, n, device=device, BLOCK_SIZE=128)
                free = _free_bytes(device)
                need = 11 * tokens * tokens
                theirs = {}
                if need > 0.8 * free:
                    rec["eager"] = (f"skipped: needs ~{need / 2**30:.0f} GiB, "
                                    f"{free / 2**30:.0f} GiB free")
                else:
                    seconds = []
                    for _ in range(2):
                        s, theirs["eager"] = _timed(eager_fn, device)
                        seconds.append(s)
                        _empty_cache(device)
                    rec["eager_first_s"], rec["eager_s"] = seconds
                seconds = []
                for _ in range(args.repeats + 1):
                    s, theirs["compiled"] = _timed(compiled_fn, device)
                    seconds.append(s)
                rec["compiled_first_s"] = seconds[0]
                rec["compiled_s"] = statistics.median(seconds[1:])
                rec["speedup_vs_compiled"] = rec["compiled_s"] / rec["ours_s"]
                if "eager_s" in rec:
                    rec["speedup_vs_eager"] = rec["eager_s"] / rec["ours_s"]
                for label, other in theirs.items():
                    rec[f"equal_to_{label}"] = all(
                        torch.equal(getattr(ours, f), getattr(other, f)) for f in FIELDS)
                del theirs
            except Exception as err:
                rec["error"] = f"{type(err).__name__}: {err}"
            _empty_cache(device)
            emit(rec)


# -------------------------------------------------------------------------------- train
def preset_max_positions(name: str) -> int | None:
    """``max_position_embeddings`` of a built-in model preset (None for a path or unknown)."""
    from dlmkit.models import PRESETS
    from dlmkit.models.diffusion_gemma import PRESETS as DIFFUSION_GEMMA

    if name in PRESETS:
        return PRESETS[name].get("max_position_embeddings")
    if name in DIFFUSION_GEMMA:
        return DIFFUSION_GEMMA[name]["text"].get("max_position_embeddings")
    return None


def _long_data(folder: Path, T: int, rows: int) -> Path:
    """``rows`` random-letter prompt/response records of ~T byte tokens (written once per T)."""
    data = folder / f"long{T}.jsonl"
    if data.exists():
        return data
    g = torch.Generator().manual_seed(0)
    letters = "abcdefghijklmnopqrstuvwxyz "
    with data.open("w") as f:
        for _ in range(rows):
            # Byte tokenizer: ~1 token per character; prompt + response fill ~T tokens.
            text = "".join(letters[int(i)] for i in torch.randint(0, 27, (T,), generator=g))
            f.write(json.dumps({"prompt": text[: T // 2 - 16],
                                "response": text[T // 2: T - 16]}) + "\n")
    return data


def train(args, device, emit) -> None:
    from dlmkit import strategies
    from dlmkit.models import PRESETS
    from dlmkit.train import load_config
    from dlmkit.train.recipe import run

    names = [n for n in args.strategies.split(",") if n] or strategies.names()
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            default = getattr(strategies.get(name), "default_model", "tiny-llama")
            # --model replaces the family's own preset only when both are the same architecture.
            swap = default in PRESETS and args.model in PRESETS and \
                PRESETS[default]["model_type"] == PRESETS[args.model]["model_type"]
            model = args.model if swap else default
            # That model may hold fewer positions than --train-seq-len (the tiny
            # DiffusionGemma: 1024): its run uses what the model can take, and says so.
            T = min(args.train_seq_len, preset_max_positions(model) or args.train_seq_len)
            data = _long_data(Path(tmp), T, 4 * args.train_batch)
            rec = {"strategy": name, "seq_len": T, "global_batch_size": args.train_batch,
                   "steps": args.train_steps}
            overrides = [
                f"strategy.name={name}", "data.task=null", f"data.train_files=[{data}]",
                f"data.max_seq_len={T}", "model.attention=auto", f"train.device={device.type}",
                f"train.steps={args.train_steps}", f"train.global_batch_size={args.train_batch}",
                f"train.log_every={max(1, args.train_steps // 2)}", "train.val_every=1000000",
                "train.save_every=1000000", "train.warmup_steps=1", "train.progress=false",
                f"output_dir={Path(tmp) / name}"]
            if swap:
                overrides.append(f"model.name={args.model}")
            try:
                config = load_config(None, [*overrides, *strategy_overrides(name, args.set)])
                start = time.perf_counter()
                run_dir = Path(run(config))
                rec["wall_s"] = time.perf_counter() - start
                lines = (run_dir / "metrics.jsonl").read_text().splitlines()
                train_lines = [json.loads(x) for x in lines if '"train"' in x]
                # The last window is steady state (the first holds the flex compile).
                rec["tokens_per_s"] = train_lines[-1]["tokens_per_s"]
                rec["first_window_tokens_per_s"] = train_lines[0]["tokens_per_s"]
                rec["final_loss"] = train_lines[-1]["loss"]
                rec["model"] = config["model"]["name"] or default
            except Exception as err:
                rec["error"] = f"{type(err).__name__}: {err}"
            _empty_cache(device)
            emit(rec)


# --------------------------------------------------------------------------------- main
def tables(results: dict) -> str:
    out = [f"# bench/gpu.py on {results['device']} (torch {results['torch']}, "
           f"mode {results['mode']})"]
    rows = results.get("correctness")
    if rows:
        body = []
        for r in rows:
            if "skipped" in r:
                body.append([r["strategy"], "-", "-", "-", "-", "-", "skipped: " + r["skipped"]])
                continue
            status = "pass" if r.get("passed") else \
                "FAIL " + r.get("error", f"outside tolerance {r.get('tolerance')}")
            grad = f"{r['grad_rel']:.2e}" if "grad_rel" in r else "fwd only"
            loss = f"{r['loss_rel']:.2e}" if "loss_rel" in r else "-"
            body.append([r["strategy"], r["dtype"], r["padding"], loss, grad,
                         r.get("compiles", "-"), status])
        out += ["", "## correctness: flex + BlockMask vs sdpa + dense",
                _table(["strategy", "dtype", "padding", "loss rel", "grad rel", "compiles",
                        "status"], body)]
    rows = results.get("attention")
    if rows:
        body = [[r["mask"], r["tokens_2L"], f"{r.get('density', float('nan')):.3f}",
                 _fmt_s(r.get("flex_s", r.get("error", "-"))),
                 f"{r.get('flex_peak_mib', 0):.0f} MiB", _fmt_s(r.get("sdpa_s", "-")),
                 f"{r.get('sdpa_peak_mib', 0):.0f} MiB",
                 f"{r['speedup']:.1f}x" if "speedup" in r else "-",
                 f"{r['ideal_speedup']:.1f}x" if "ideal_speedup" in r else "-"] for r in rows]
        out += ["", "## attention fwd+bwd, bf16 (flex + BlockMask vs SDPA + dense bool mask)",
                _table(["mask", "2L", "density", "flex", "flex peak", "sdpa", "sdpa peak",
                        "speed-up", "1/density"], body)]
    rows = results.get("build")
    if rows:
        body = [[r["mask"], r["tokens_2L"], _fmt_s(r.get("ours_s", r.get("error", "-"))),
                 _fmt_s(r.get("eager_s", r.get("eager", "-"))),
                 _fmt_s(r.get("compiled_first_s", "-")), _fmt_s(r.get("compiled_s", "-")),
                 f"{r['speedup_vs_compiled']:.0f}x" if "speedup_vs_compiled" in r else "-"]
                for r in rows]
        out += ["", f"## BlockMask build on {results['device']}",
                _table(["mask", "2L", "ours", "eager", "compiled first", "compiled steady",
                        "vs compiled"], body)]
    rows = results.get("train")
    if rows:
        body = [[r["strategy"], r.get("model", "-"), r["seq_len"],
                 f"{r['tokens_per_s']:.0f}" if "tokens_per_s" in r else r.get("error", "-"),
                 f"{r['final_loss']:.3f}" if "final_loss" in r else "-"] for r in rows]
        out += ["", f"## dlmkit train on {results['device']} "
                    "(attention auto: flex and bf16 autocast on CUDA)",
                _table(["strategy", "model", "seq len", "tokens/s", "final loss"], body)]
    for s in results.get("skipped_sections", []):
        out.append(f"\nskipped section {s['section']}: {s['reason']}")
    return "\n".join(out)


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cpu", action="store_true", help="CPU mode (automatic without CUDA)")
    p.add_argument("--compile", action="store_true",
                   help="CPU mode: compiled FlexAttention kernel instead of eager")
    p.add_argument("--sections", default="", help=f"comma-separated of {', '.join(SECTIONS)}")
    p.add_argument("--strategies", default="", help="comma-separated (default: all registered)")
    p.add_argument("--model", default=None,
                   help="model preset for the HF causal-LM families (default: small-llama on "
                        "CUDA, the family's own preset on CPU)")
    p.add_argument("--seq-len", type=int, default=None,
                   help="correctness: tokens per row (default 1024 CUDA, 32 CPU)")
    p.add_argument("--steps", type=int, default=None,
                   help="correctness: training steps (default 2 CUDA, 1 CPU)")
    p.add_argument("--dtypes", default="fp32,bf16")
    p.add_argument("--paddings", default=",".join(PADDINGS))
    p.add_argument("--block", type=int, default=16, help="diffusion block of the timed masks")
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--attention-lens", default="8192,16384,32768", help="2L values")
    p.add_argument("--build-lens", default="32768,131072", help="2L values")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--train-seq-len", type=int, default=2048)
    p.add_argument("--train-batch", type=int, default=8)
    p.add_argument("--train-steps", type=int, default=8)
    p.add_argument("--set", action="append", default=[], metavar="STRATEGY:KEY=VALUE",
                   help="a config override for one strategy, e.g. dflash:strategy.target=DIR "
                        "(repeatable)")
    p.add_argument("--json", help="write the results here too")
    args = p.parse_args(argv)
    for item in args.set:
        try:
            strategy_overrides("", [item])
        except ValueError as err:
            p.error(str(err))
    bad = [s for s in args.sections.split(",") if s and s not in SECTIONS]
    if bad:
        p.error(f"unknown section(s) {bad}; choose from {', '.join(SECTIONS)}")
    for key, values in (("dtypes", TOLERANCE), ("paddings", PADDINGS)):
        wrong = [v for v in getattr(args, key).split(",") if v not in values]
        if wrong:
            p.error(f"--{key}: unknown {wrong}; choose from {', '.join(values)}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    cuda = torch.cuda.is_available() and not args.cpu
    device = torch.device("cuda" if cuda else "cpu")
    args.seq_len = args.seq_len or (1024 if cuda else 32)
    args.steps = args.steps or (2 if cuda else 1)
    if cuda and args.model is None:
        args.model = "small-llama"
    # Every (strategy, dtype, shape) is a new flex graph; the default recompile limit (8) would
    # silently fall back to eager flex and stop testing the kernel.
    limit = "recompile_limit" if hasattr(torch._dynamo.config, "recompile_limit") \
        else "cache_size_limit"  # the older name (torch < 2.7)
    setattr(torch._dynamo.config, limit, 256)
    wanted = [s for s in args.sections.split(",") if s] or list(SECTIONS)
    results: dict = {"device": torch.cuda.get_device_name(device) if cuda else "cpu",
                     "torch": torch.__version__, "mode": "cuda" if cuda else "cpu",
                     "skipped_sections": []}
    eager_flex = not cuda and not args.compile
    results["flex"] = "eager" if eager_flex else "compiled"

    def save() -> None:
        # Rewritten after every record: a run cut short by a time limit keeps what it measured.
        failed = [r for r in results.get("correctness", []) if r.get("passed") is False]
        results["all_passed"] = not failed
        if args.json:
            Path(args.json).write_text(json.dumps(results, indent=1) + "\n")

    for section in (s for s in SECTIONS if s in wanted):
        # On CPU the timing sections run only when asked for by name (a smoke test of the
        # script at small sizes), and never the attention one: CPU flex has no backward.
        if not cuda and section != "correctness" and (section == "attention"
                                                      or not args.sections):
            results["skipped_sections"].append(
                {"section": section, "reason": "timing sections need CUDA"})
            continue
        records = results[section] = []

        def emit(record, records=records):
            records.append(record)
            print(json.dumps({k: v for k, v in record.items() if k != "traceback"}),
                  file=sys.stderr, flush=True)
            save()

        context = eager_flex_attention() if eager_flex else nullcontext()
        start = time.perf_counter()
        with context:
            globals()[section](args, device, emit)
        results.setdefault("section_s", {})[section] = time.perf_counter() - start
    save()
    failed = not results["all_passed"]
    print(json.dumps(results, indent=1))
    print(tables(results), file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
