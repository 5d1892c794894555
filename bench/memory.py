"""Training-step memory and speed with gradient checkpointing and LoRA, on long sequences.

    python bench/memory.py [--seq 2048] [--batch 2] [--strategy mdlm] [--threads 2]
                           [--model small-llama] [--config '{hidden_size: 512}']
                           [--cases plain,checkpointing,lora,lora+checkpointing]

Each case runs in its own process (a fresh peak): build the run's components from a JSONL file
of records ``seq`` tokens long, one warm-up step (creates the optimizer state), then
``--steps`` measured steps. Prints one JSON object per case: ``step_peak_mib`` (peak resident
memory of a step above what the process held before it: activations, gradients, temporaries;
Linux VmHWM reset through /proc/self/clear_refs), ``held_mib`` (resident between steps, above
the process before the build: weights, optimizer state, data), ``trainable_params``,
``tokens_per_s``. Large allocations go through mmap (``MALLOC_MMAP_THRESHOLD_``) so freed
memory leaves the resident size at once. Compare ratios within one
run; absolute times on a shared machine are noisy.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CASES = {
    "plain": [],
    "checkpointing": ["model.gradient_checkpointing=true"],
    "lora": ["model.lora={r: 8, target_modules: all-linear}"],
    "lora+checkpointing": ["model.lora={r: 8, target_modules: all-linear}",
                           "model.gradient_checkpointing=true"],
}


def run_case(args, case: str, data: Path) -> dict:
    import torch

    from dlmkit.masks.benchmark import _status_kib, _timed
    from dlmkit.train import load_config
    from dlmkit.train.distributed import World
    from dlmkit.train.recipe import build_components, train_step

    torch.set_num_threads(args.threads)
    overrides = [
        "data.task=null", f"data.train_files=[{data}]", f"data.max_seq_len={args.seq + 64}",
        f"model.name={args.model}", f"model.config={args.config}",
        f"strategy.name={args.strategy}", f"train.global_batch_size={args.batch}",
        "train.warmup_steps=1", "train.progress=false", *CASES[case]]
    if args.strategy in ("bd3lm", "hybrid", "idlm"):
        overrides.append("strategy.block_size=16")
    config = load_config(None, overrides)
    world = World(0, 1, 0, torch.device("cpu"))
    before_build = _status_kib("VmRSS") / 1024
    c = build_components(config, world)

    def step(i):
        return train_step(i, c.step_context(config, world))

    step(0)  # optimizer state exists from here on
    held = _status_kib("VmRSS") / 1024
    peaks, seconds, tokens = [], 0.0, 0
    for i in range(1, args.steps + 1):
        took, peak, stats = _timed(lambda i=i: step(i))
        peaks.append(peak)
        seconds += took
        tokens += stats["tokens"]
    return {"case": case, "strategy": args.strategy, "model": args.model, "seq": args.seq,
            "batch": args.batch, "threads": args.threads,
            "trainable_params": sum(p.numel() for p in c.model.parameters() if p.requires_grad),
            "params": sum(p.numel() for p in c.model.parameters()),
            "held_mib": round(held - before_build, 1), "step_peak_mib": round(max(peaks), 1),
            "tokens_per_s": round(tokens / seconds, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seq", type=int, default=2048, help="tokens per record")
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--strategy", default="mdlm")
    parser.add_argument("--model", default="small-llama")
    parser.add_argument("--config", default="{}", help="model.config overrides (YAML)")
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--case", help=argparse.SUPPRESS)  # internal: one case, this process
    parser.add_argument("--data", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.case:
        print(json.dumps(run_case(args, args.case, Path(args.data))))
        return
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "long.jsonl"
        # Byte tokenizer: one token per character; half prompt, half response.
        half = args.seq // 2
        data.write_text("".join(json.dumps({"prompt": "p" * half, "response": "r" * half})
                                + "\n" for _ in range(4 * args.batch)))
        for case in args.cases.split(","):
            if case not in CASES:
                raise SystemExit(f"unknown case {case!r}; cases: {', '.join(CASES)}")
            cmd = [sys.executable, __file__, "--case", case, "--data", str(data)]
            for flag in ("seq", "batch", "steps", "threads", "strategy", "model", "config"):
                cmd += [f"--{flag}", str(getattr(args, flag))]
            start = time.perf_counter()
            # Large blocks through mmap: freed memory goes back to the OS at once, so the
            # resident size follows what is live instead of what malloc keeps cached.
            env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "131072"}
            out = subprocess.run(cmd, capture_output=True, text=True, env=env)
            if out.returncode:
                raise SystemExit(f"case {case} failed:\n{out.stderr[-3000:]}")
            row = json.loads(out.stdout.strip().splitlines()[-1])
            row["wall_s"] = round(time.perf_counter() - start, 1)
            print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
