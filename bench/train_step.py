"""Training-step cost per strategy on the tiny CPU model: tokens/s, and the share of the step
spent building/fetching masks (MaskCache) and in the loss (forward of the loss function).

    python bench/train_step.py [--steps 20] [--strategies mdlm,bd3lm] [--threads 2]

Prints one JSON object per strategy. Shares are ratios measured in the same run; absolute
times on a shared machine are noisy.
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
    extra = ["strategy.block_size=4"] if name in ("bd3lm", "hybrid", "idlm") else []
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
        return train_step(s, c.model, c.optimizer, c.scheduler, strategy, c.train_set,
                          c.collator, c.sampler, config, world)

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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--strategies", default=",".join(strategies.names()))
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    for name in args.strategies.split(","):
        print(json.dumps(bench(name, args.steps, args.warmup)), flush=True)


if __name__ == "__main__":
    main()
