"""Training-step cost per strategy on the tiny CPU model: tokens/s, and the share of the step
spent building/fetching masks (MaskCache) and in the loss (forward of the loss function).

    python bench/train_step.py [--steps 20] [--strategies mdlm,bd3lm] [--threads 2]
    python bench/train_step.py --canvas-blocks 1,2,4,8 [--threads 1]

Prints one JSON object per strategy. Shares are ratios measured in the same run; absolute
times on a shared machine are noisy.

``--canvas-blocks``: block_diffusion (tiny DiffusionGemma) with responses of that many canvas
blocks, decoding only the drawn block (``decode=selected``) against NeMo's scheme that forwards
the whole response canvas and scores one block (``decode=all``): decoder forward time (both
self-conditioning passes, from forward hooks on the decoder), decoder and step forward FLOPs
(``FlopCounterMode``: the noise-free measure of work; it books the projections, MLPs, MoE and
self-conditioning, not the masked SDPA, whose share would only raise the ratio), whole step
time (forward +
backward), and their all/selected ratios (``num_blocks`` is the ideal decoder ratio).
"""

from __future__ import annotations

import argparse
import json
import time

import torch

import dlmkit.models.attention as attention
from dlmkit import strategies
from dlmkit.train import load_config
from dlmkit.train.distributed import World
from dlmkit.train.recipe import build_components, train_step

TINY = ["model.config={hidden_size: 64, intermediate_size: 128, num_hidden_layers: 2}",
        "data.num_train=512", "data.num_validation=16", "train.global_batch_size=16",
        "train.micro_batch_size=16", "train.progress=false"]


MASK_ARGUMENT = attention.mask_argument


class Timer:
    def __init__(self) -> None:
        self.seconds = 0.0
        self.calls = 0

    def wrap(self, fn):
        def timed(*args, **kwargs):
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.seconds += time.perf_counter() - start
                self.calls += 1
        return timed


def bench(name: str, steps: int, warmup: int) -> dict:
    extra = ["strategy.block_size=4"] if name in ("bd3lm", "hybrid", "idlm",
                                                  "block_diffusion") else []
    config = load_config(None, [*TINY, f"strategy.name={name}", f"train.steps={steps}", *extra])
    world = World(0, 1, 0, torch.device("cpu"))
    c = build_components(config, world)
    strategy = c.strategy
    mask_get, mask_build, render, loss = Timer(), Timer(), Timer(), Timer()
    # Masks build lazily: rendering for the backend (dense/additive/BlockMask) happens per
    # forward, inside forward_logits.
    attention.mask_argument = render.wrap(MASK_ARGUMENT)
    get = strategy.masks.get
    strategy.masks.get = mask_get.wrap(lambda key, build: get(key, mask_build.wrap(build)))
    strategy.loss_fn = loss.wrap(strategy.loss_fn)

    def step(s):
        return train_step(s, c.step_context(config, world))

    for s in range(warmup):
        step(s)
    for t in (mask_get, mask_build, render, loss):
        t.seconds, t.calls = 0.0, 0
    hits0, misses0 = strategy.masks.hits, strategy.masks.misses
    tokens, start = 0, time.perf_counter()
    for s in range(warmup, warmup + steps):
        tokens += step(s)["tokens"]
    total = time.perf_counter() - start
    return {
        "strategy": name,
        "steps": steps,
        "step_ms": 1000 * total / steps,
        "tokens_per_s": tokens / total,
        "mask_share": mask_get.seconds / total,        # cache lookups + builds on a miss
        "mask_build_share": mask_build.seconds / total,
        "mask_render_share": render.seconds / total,   # Mask -> backend argument, per forward
        "loss_share": loss.seconds / total,            # loss forward (logits -> scalar)
        "mask_cache_hits": strategy.masks.hits - hits0,
        "mask_cache_misses": strategy.masks.misses - misses0,
    }


class HookTimer(Timer):
    """Seconds spent in ``module``'s forwards (pre/post forward hooks)."""

    def __init__(self, module: torch.nn.Module) -> None:
        super().__init__()
        self._start = 0.0
        module.register_forward_pre_hook(self._begin)
        module.register_forward_hook(self._end)

    def _begin(self, *args) -> None:
        self._start = time.perf_counter()

    def _end(self, *args) -> None:
        self.seconds += time.perf_counter() - self._start
        self.calls += 1


def canvas_bench(num_blocks: int, steps: int, warmup: int, block: int = 16, batch: int = 16,
                 prompt: int = 16, overrides: dict | None = None) -> dict:
    """Selected-block vs all-blocks block_diffusion steps on responses of ``num_blocks``."""
    from dlmkit.data.seeds import sample_generators

    vocab, length = 264, prompt + num_blocks * block
    g = torch.Generator().manual_seed(0)
    rows = {"input_ids": torch.randint(0, vocab - 8, (batch, length), generator=g),
            "loss_mask": (torch.arange(length) >= prompt).long().expand(batch, length),
            "attention_valid": torch.ones(batch, length, dtype=torch.long),
            "position_ids": torch.arange(length).expand(batch, length),
            "sample_index": torch.arange(batch)}
    out = {"num_blocks": num_blocks, "block_size": block, "batch": batch, "seq_len": length}
    for decode in ("selected", "all"):
        strategy = strategies.get("block_diffusion")(
            {"block_size": block, "decode": decode}, mask_token_id=vocab - 1, vocab_size=vocab)
        torch.manual_seed(0)
        model = strategy.build_model(strategy.default_model, vocab_size=vocab,
                                     attention="sdpa", dtype=torch.float32, overrides=overrides)
        decoder = HookTimer(model.model.decoder)
        total = 0.0
        for s in range(warmup + steps):
            if s == warmup:
                decoder.seconds, total = 0.0, 0.0
            p = strategy.prepare(rows, sample_generators(0, s, range(batch)))
            counts = {k: float(v) for k, v in strategy.counts(p).items()}
            start = time.perf_counter()
            strategy.loss(model, p, counts).total.backward()
            total += time.perf_counter() - start
            model.zero_grad(set_to_none=True)
        # decoder work, noise-free: forward FLOPs of one step (FlopCounterMode; forward only
        # because the backward through the cached encoder keys is booked to the decoder's
        # attention modules, which would mix the encoder's work in)
        from torch.utils.flop_counter import FlopCounterMode

        p = strategy.prepare(rows, sample_generators(0, 0, range(batch)))
        counts = {k: float(v) for k, v in strategy.counts(p).items()}
        with FlopCounterMode(display=False) as flops, torch.no_grad():
            strategy.loss(model, p, counts)
        per_module = flops.get_flop_counts()
        out[f"{decode}_decoder_gflop"] = sum(
            per_module[f"{type(model).__name__}.model.decoder"].values()) / 1e9
        out[f"{decode}_step_gflop"] = flops.get_total_flops() / 1e9
        out[f"{decode}_decoder_ms"] = 1000 * decoder.seconds / steps
        out[f"{decode}_step_ms"] = 1000 * total / steps
    out["decoder_flop_ratio"] = out["all_decoder_gflop"] / out["selected_decoder_gflop"]
    out["decoder_ratio"] = out["all_decoder_ms"] / out["selected_decoder_ms"]
    out["step_ratio"] = out["all_step_ms"] / out["selected_step_ms"]
    out["target_decoder_ratio"] = 0.7 * num_blocks
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--strategies", default=",".join(strategies.names()))
    parser.add_argument("--canvas-blocks", default=None,
                        help="comma-separated block counts: the block_diffusion canvas bench")
    parser.add_argument("--canvas-batch", type=int, default=16)
    parser.add_argument("--canvas-hidden", type=int, default=None,
                        help="hidden size of the tiny DiffusionGemma (default: the preset's)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.canvas_blocks:
        for n in args.canvas_blocks.split(","):
            hidden = args.canvas_hidden
            overrides = None if hidden is None else {
                "hidden_size": hidden, "intermediate_size": 2 * hidden,
                "moe_intermediate_size": hidden}
            print(json.dumps(canvas_bench(int(n), args.steps, args.warmup,
                                          batch=args.canvas_batch, overrides=overrides)),
                  flush=True)
        return
    for name in args.strategies.split(","):
        print(json.dumps(bench(name, args.steps, args.warmup)), flush=True)


if __name__ == "__main__":
    main()
