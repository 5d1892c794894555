"""DFlash on CPU: speculative vs target-only decoding, transformers' own DFlash generate, the
target's share of a training step, and the drafter's per-offset accuracy curves.

    .venv/bin/python bench/dflash.py --target runs/dflash-target/final \\
        --draft runs/dflash-drafter/final -n 50 --out docs/dflash

Prints one JSON object:

* ``decode``: per prompt, one at a time: target-only greedy (the ``ar`` sampler) and
  speculative greedy — tokens/s of each, their ratio, ``tau`` (tokens per verification
  forward, bonus included), target forwards per generated token (prefill included), and
  whether every output is identical;
* ``batched``: the same prompts in batches of ``--batch-size``, target-only against
  speculative (every row of a batch verified in one target forward): tokens/s, their ratio,
  batched target forwards of each and whether every output is identical;
* ``transformers``: ``target.generate(assistant_model=drafter, speculation_type="dflash")`` on
  the same prompts: identical tokens to ours, its tokens/s;
* ``train_step``: a few drafter training steps (the drafter run's config): seconds per step and
  the frozen target's share of it;
* ``draft_acc_k``: the last logged per-offset draft accuracy of the drafter's run (and a PNG of
  the curves with ``--out``).

Timings are wall-clock on a shared machine: compare the ratios within one run.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch


def decode(target_dir: str, draft_dir: str, task: str, n: int) -> tuple[dict, dict]:
    from transformers import GenerationConfig

    from dlmkit.data import get_task
    from dlmkit.families.dflash.pair import attach_draft
    from dlmkit.generate import generate, load
    from dlmkit.generate.api import encode_prompt

    loaded = load(target_dir)
    tok = loaded.tokenizer
    prompts = [r["prompt"] for r in get_task(task).records("test", n)]
    plain_cfg = loaded.config("ar")
    pair_loaded = attach_draft(loaded, draft_dir)
    spec_cfg = pair_loaded.config()
    plain_s = spec_s = hf_s = 0.0
    plain_tokens = spec_tokens = 0
    same = hf_same = 0
    for i, prompt in enumerate(prompts):
        a = generate(loaded.model, tok, [prompt], plain_cfg, first_index=i)
        b = generate(pair_loaded.model, tok, [prompt], spec_cfg, first_index=i)
        plain_s, spec_s = plain_s + a.seconds, spec_s + b.seconds
        plain_tokens, spec_tokens = plain_tokens + a.generated, spec_tokens + b.generated
        same += a.tokens == b.tokens
        ids = encode_prompt(tok, prompt)
        x = torch.tensor([ids])
        config = GenerationConfig(max_new_tokens=spec_cfg.max_new_tokens, do_sample=False,
                                  speculation_type="dflash", pad_token_id=tok.pad_token_id,
                                  eos_token_id=list(tok.stop_token_ids))
        start = time.perf_counter()
        with torch.no_grad():
            out = loaded.model.generate(x, attention_mask=torch.ones_like(x),
                                        generation_config=config,
                                        assistant_model=pair_loaded.model.drafter)
        hf_s += time.perf_counter() - start
        theirs = out[0, len(ids):].tolist()
        if theirs and theirs[-1] in tok.stop_token_ids:
            theirs = theirs[:-1]
        hf_same += theirs == b.tokens[0]
    st = pair_loaded.model.stats
    result = {
        "task": task, "prompts": len(prompts), "block_size": spec_cfg.block_size,
        "identical_outputs": same,
        "target_only_tokens_per_s": plain_tokens / plain_s,
        "speculative_tokens_per_s": spec_tokens / spec_s,
        "speedup": (spec_tokens / spec_s) / (plain_tokens / plain_s),
        "tau": st["verified_tokens"] / max(st["verify_forwards"], 1),
        "target_forwards_per_token": st["target_forwards"] / max(st["generated"], 1),
        "target_only_forwards_per_token": 1.0,
        "draft_forwards": st["draft_forwards"], "generated": st["generated"],
    }
    hf = {"identical_to_ours": hf_same, "prompts": len(prompts),
          "tokens_per_s": spec_tokens / hf_s}
    return result, hf


def batched(target_dir: str, draft_dir: str, task: str, n: int, batch_size: int) -> dict:
    """Target-only against speculative greedy decoding, ``batch_size`` prompts per call."""
    from dlmkit.data import get_task
    from dlmkit.families.dflash.pair import attach_draft
    from dlmkit.generate import generate, load

    loaded = load(target_dir)
    prompts = [r["prompt"] for r in get_task(task).records("test", n)]
    pair_loaded = attach_draft(loaded, draft_dir)
    result = {"batch_size": batch_size}
    outputs = {}
    for name, model, cfg in (("target_only", loaded.model, loaded.config("ar")),
                             ("speculative", pair_loaded.model, pair_loaded.config())):
        seconds = generated = forwards = 0
        tokens = []
        for i in range(0, len(prompts), batch_size):
            out = generate(model, loaded.tokenizer, prompts[i:i + batch_size], cfg,
                           first_index=i)
            seconds, generated = seconds + out.seconds, generated + out.generated
            forwards += out.forwards
            tokens += out.tokens
        outputs[name] = tokens
        result[f"{name}_tokens_per_s"] = generated / seconds
        result[f"{name}_forwards"] = forwards
    result["speedup"] = result["speculative_tokens_per_s"] / result["target_only_tokens_per_s"]
    result["identical_outputs"] = sum(a == b for a, b in zip(outputs["target_only"],
                                                             outputs["speculative"]))
    return result


def train_share(draft_dir: str, steps: int) -> dict:
    """Seconds per drafter training step and the frozen target's share (the drafter run's
    config, a few steps from a fresh drafter)."""
    import yaml

    from dlmkit.train.config import RunConfig, with_defaults
    from dlmkit.train.distributed import World
    from dlmkit.train.recipe import build_components, train_step

    run = Path(draft_dir).parent
    config = RunConfig.from_dict(with_defaults(yaml.safe_load((run / "config.yaml").read_text())))
    world = World(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"))
    c = build_components(config, world)
    ctx = c.step_context(config, world)
    train_step(0, ctx)  # warm-up
    c.strategy.target_seconds = 0.0
    start = time.perf_counter()
    for step in range(1, steps + 1):
        train_step(step, ctx)
    total = time.perf_counter() - start
    return {"steps": steps, "seconds_per_step": total / steps,
            "target_seconds_per_step": c.strategy.target_seconds / steps,
            "target_share": c.strategy.target_seconds / total,
            "global_batch_size": config["train"]["global_batch_size"],
            "num_blocks_per_sample": config["strategy"]["num_blocks_per_sample"]}


def acc_curves(draft_dir: str, out: Path | None) -> dict:
    records = [json.loads(line) for line in
               (Path(draft_dir).parent / "metrics.jsonl").read_text().splitlines() if line]
    train = [r for r in records if r.get("split") == "train" and "draft_acc" in r]
    keys = sorted((k for k in train[-1] if k.startswith("draft_acc_")),
                  key=lambda k: int(k.rsplit("_", 1)[1]))
    if out is not None:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        out.mkdir(parents=True, exist_ok=True)
        fig, ax = plt.subplots(figsize=(6, 4))
        for k in keys:
            ax.plot([r["step"] for r in train], [r[k] for r in train], label=k, linewidth=1)
        ax.set_xlabel("step")
        ax.set_ylabel("draft top-1 accuracy")
        ax.set_ylim(0, 1.02)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(out / "draft_acc_k.png", dpi=110)
        plt.close(fig)
    first = {k: train[0][k] for k in keys}
    return {"first_step": train[0]["step"], "first": first, "last_step": train[-1]["step"],
            "last": {k: train[-1][k] for k in keys}, "draft_acc": train[-1]["draft_acc"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", required=True)
    parser.add_argument("--draft", required=True)
    parser.add_argument("--task", default="copy")
    parser.add_argument("-n", type=int, default=50)
    parser.add_argument("--batch-size", type=int, default=32,
                        help="prompts per call in the batched comparison (0: skip it)")
    parser.add_argument("--train-steps", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, help="directory for draft_acc_k.png")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    spec, hf = decode(args.target, args.draft, args.task, args.n)
    print(json.dumps({"threads": args.threads, "decode": spec, "transformers": hf,
                      "batched": batched(args.target, args.draft, args.task, args.n,
                                         args.batch_size) if args.batch_size else None,
                      "train_step": train_share(args.draft, args.train_steps)
                      if args.train_steps else None,
                      "draft_acc_k": acc_curves(args.draft, args.out)}, indent=1))


if __name__ == "__main__":
    main()
