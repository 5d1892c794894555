"""Every ``configs/*-tiny.yaml`` still learns: a short run of each, against a measured loss.

The README and docs/benchmarks.md quote figures measured with these configs; a default that
moves under a config (a key the file does not set) changes what it trains. A few dozen steps
cannot show an exact-match figure, but they show a config that no longer learns, or learns
clearly worse than when :data:`MEASURED` was taken (e.g. bd3lm-tiny without its lr). A change
that shows only later in training does not show here (block_diffusion-tiny at weight decay
0.01: 42.5% exact match at step 400 against 97.5%, the same loss at step 40): docs/benchmarks.md
gives the commands that reproduce its figures.
"""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path

import pytest
import torch

from dlmkit.cli import main
from dlmkit.train import load_config
from dlmkit.train.distributed import World
from dlmkit.train.recipe import build_components, validate

from .helpers import tiny_target

CPU = World(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"))
ROOT = Path(__file__).resolve().parents[2]
TINY_CONFIGS = sorted(ROOT.glob("configs/*-tiny.yaml"))
STEPS = 40

# Validation loss after STEPS steps of :func:`short` runs, one thread, on the 2-core CPU
# machine (torch 2.13.0+cpu); `pytest tests/train/test_tiny_configs.py -m slow -s` prints
# each run's loss before and after.
MEASURED: dict[str, float] = {
    "bd3lm-tiny": 1.4726,            # from 6.0161 before the first step
    "block_diffusion-tiny": 1.1308,  # from 6.6037
    "dflash-tiny": 1.8497,           # from 2.9418 (against an untrained target: see short)
    "hybrid-tiny": 3.1669,           # from 14.7160
    "idlm-tiny": 0.9922,             # from 6.5828
    "mdlm-tiny": 1.4714,             # from 5.2436
    "scdd-tiny": 1.4094,             # from 4.6752
}
# A run must end at most this much above its measured loss (CPU instruction sets move float
# sums a little; a default that moves under a config, e.g. its lr or a weight average, moves
# it more) ...
MARGIN = 1.25
# ... and below this share of the untrained model's validation loss (the slowest, dflash,
# reaches 0.63 of it in STEPS steps; the others 0.32 or less).
LEARNS = 0.7


def short(config_path: Path, run_dir: Path) -> list[str]:
    """The overrides of a short run of ``config_path``: fewer steps and validation records,
    one thread; every other setting as the file (and today's defaults) says."""
    items = [f"train.steps={STEPS}", "data.num_validation=64", "train.threads=1",
             "train.progress=false", f"train.val_every={STEPS}", f"train.save_every={STEPS}",
             f"output_dir={run_dir}"]
    if config_path.stem == "dflash-tiny":
        # Its target is step 1 of the file's recipe (an ar run); an untrained tiny Llama of
        # the preset's width stands in: the drafter learns the data through the target's
        # frozen LM head either way.
        items.append(f"strategy.target={tiny_target(hidden_size=128, num_layers=3)}")
    return items


def initial_validation_loss(config: dict) -> float:
    """The validation loss of the run's model before its first step (same seed, same data)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(config["train"]["threads"])
    try:
        c = build_components(copy.deepcopy(config), CPU)
        return validate(c.model, c.strategy, c.val_set, c.collator, config, CPU)
    finally:
        torch.set_num_threads(threads)


def last_validation_loss(run_dir: Path) -> float:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    (loss,) = [r["loss"] for r in map(json.loads, lines)
               if r["split"] == "validation" and r["step"] == STEPS]
    return loss


def test_every_tiny_config_has_a_measured_loss():
    assert TINY_CONFIGS, f"no configs/*-tiny.yaml under {ROOT}"
    assert sorted(MEASURED) == [p.stem for p in TINY_CONFIGS], (
        "measure the new config's loss after a short run (see MEASURED) and record it")


@pytest.mark.slow
@pytest.mark.parametrize("path", TINY_CONFIGS, ids=lambda p: p.stem)
def test_tiny_config_still_learns(tmp_path, path):
    run_dir = tmp_path / "run"
    items = short(path, run_dir)
    start = initial_validation_loss(load_config(path, items))
    threads = torch.get_num_threads()
    try:
        main(["train", str(path)] + [arg for item in items for arg in ("--set", item)])
    finally:
        torch.set_num_threads(threads)  # the run set one thread for this process
    end = last_validation_loss(run_dir)
    print(f"{path.stem}: validation loss {start:.4f} -> {end:.4f} after {STEPS} steps")
    assert math.isfinite(start) and math.isfinite(end)
    assert end < LEARNS * start, (
        f"{path.name}: validation loss {start:.4f} -> {end:.4f} after {STEPS} steps: it no "
        f"longer learns (a default it does not set may have moved)")
    assert end <= MARGIN * MEASURED[path.stem], (
        f"{path.name}: validation loss {end:.4f} after {STEPS} steps, measured "
        f"{MEASURED[path.stem]:.4f}: a default it does not set may have moved (re-measure its "
        f"figures in docs/benchmarks.md before updating MEASURED)")
