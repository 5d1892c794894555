"""What bf16 does to fine-tuning updates and to the weight average, measured in one run.

Size and budget, stated up front: the tests' tiny Llama (2 layers, hidden 64) trained by mdlm
on the bundled ``reverse`` task, 10 AdamW steps at a constant lr 1e-5 per precision; then a
4000-update weight average of a drifting 64x64 matrix. About 30 s on one CPU thread.

    python bench/precision.py [--out docs/results/precision.jsonl]

One JSON line per measurement (appended); ``docs/finetuning.md`` shows them.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path

import torch

TINY = ["model.config={hidden_size: 64, intermediate_size: 128, num_hidden_layers: 2, "
        "num_attention_heads: 4, num_key_value_heads: 4}", "data.num_train=64",
        "data.num_validation=16", "train.global_batch_size=8", "train.micro_batch_size=8",
        "train.warmup_steps=0", "train.min_lr_ratio=1", "train.ema_decay=0", "train.lr=1e-5",
        "train.progress=false", "strategy.name=mdlm"]
PRECISIONS = {  # name -> config overrides
    "fp32": ["train.autocast=none"],
    "bf16 compute, fp32 masters (default)": ["model.dtype=bfloat16"],
    "pure bf16 (train.master_dtype=bfloat16)": ["model.dtype=bfloat16",
                                                "train.master_dtype=bfloat16"],
}


def updates(overrides: list[str], steps: int) -> dict[str, torch.Tensor]:
    import warnings

    from dlmkit.train import load_config
    from dlmkit.train.distributed import World
    from dlmkit.train.recipe import build_components, train_step

    cpu = World(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"))
    cfg = load_config(None, [*TINY, f"train.steps={steps}", *overrides])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        c = build_components(cfg, cpu)
    before = {n: p.detach().float().clone() for n, p in c.model.named_parameters()}
    for s in range(steps):
        train_step(s, c.step_context(cfg, cpu))
    return {n: p.detach().float() - before[n] for n, p in c.model.named_parameters()}


def average_drift(shadow_dtype: torch.dtype, updates_n: int = 4000) -> dict:
    """A bf16 weight matrix drifting ~1e-4 a step, averaged at decay 0.999 with the shadow in
    ``shadow_dtype``: its distance to the exact (float64) average, relative to the raw
    weights' distance, and the share of shadow entries frozen over the last 1000 updates."""
    torch.manual_seed(0)
    w = (0.02 * torch.randn(64, 64)).to(torch.bfloat16)
    shadow = w.to(shadow_dtype)
    exact = w.double()
    late = None
    for n in range(updates_n):
        w = (w.float() + 1e-4 * torch.randn(64, 64) + 2e-5).to(torch.bfloat16)
        r = min(0.999, (1 + n) / (10 + n))
        shadow = shadow.lerp(w.to(shadow_dtype), 1 - r)
        exact = r * exact + (1 - r) * w.double()
        if n == updates_n - 1000:
            late = shadow.clone()
    return {"shadow_error_vs_raw": float((shadow.double() - exact).norm()
                                         / (w.double() - exact).norm()),
            "frozen_last_1000": float((shadow == late).float().mean())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="docs/results/precision.jsonl")
    parser.add_argument("--steps", type=int, default=10)
    args = parser.parse_args()
    torch.set_num_threads(1)
    meta = {"when": time.strftime("%Y-%m-%d"), "machine": platform.processor() or
            platform.machine(), "threads": 1, "load": os.getloadavg()[0],
            "torch": torch.__version__}
    lines = []
    reference = updates(PRECISIONS["fp32"], args.steps)
    for name, overrides in PRECISIONS.items():
        delta = reference if name == "fp32" else updates(overrides, args.steps)
        changed = sum(int((d != 0).sum()) for d in delta.values())
        total = sum(d.numel() for d in delta.values())
        ratio = [float(delta[n].norm() / reference[n].norm()) for n in reference]
        norms = [n for n in reference if n.endswith("norm.weight")]
        lines.append({"bench": "precision_updates", "precision": name, "steps": args.steps,
                      "lr": 1e-5, "changed": changed / total,
                      "update_norm_ratio_min": min(ratio), "update_norm_ratio_max": max(ratio),
                      "norm_weights_changed": sum(int((delta[n] != 0).sum()) for n in norms)
                      / sum(delta[n].numel() for n in norms), **meta})
    for dtype in (torch.bfloat16, torch.float32):
        lines.append({"bench": "precision_average", "shadow": str(dtype).removeprefix("torch."),
                      "decay": 0.999, "updates": 4000, **average_drift(dtype), **meta})
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("a") as f:
        for line in lines:
            f.write(json.dumps(line) + "\n")
            print(json.dumps(line))


if __name__ == "__main__":
    main()
