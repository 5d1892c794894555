"""Issue 52's other suspects for what bd3lm loses of a causal checkpoint, measured on the runs
``bench/adapt.py`` left in ``--work`` (no training):

* ``order``: bd3lm's sampler commits the most confident masked position of a block first. An AR
  checkpoint knows the token right after what is clean; does committing the leftmost masked
  position first (one token a step, as AR decodes) recall the memorised probe entries?
  Measured as exact recall of the probe entries, the confidence order against left to right.
* ``clean_attention``: bd3lm's clean stream attends within a block both ways (block-causal),
  where the checkpoint was trained token-causal. Measured as the block ELBO's bits/byte on the
  held-out and probe entries with bd3lm's mask against the same mask whose clean stream is
  token-causal (:func:`token_causal_clean`); the noisy stream is unchanged.

Both are read on the runs named by ``--runs`` (their ``final/``); the meaningful one is step 0
(``adapt-bd3lm-shift-train.lr=1e-12-1steps``: the checkpoint's weights read as bd3lm before any
update), since a run trained with bd3lm's own mask is out of its distribution under the other
one. One JSON line per run, suspect and variant to ``--results``::

    python bench/adapt_suspects.py --work RUNS --runs adapt-bd3lm-shift-train.lr=1e-12-1steps \\
        adapt-bd3lm-noshift-train.lr=1e-12-1steps adapt-bd3lm-shift-train.steps=200
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "docs" / "results" / "adapt_suspects.jsonl"


def _adapt():
    """bench/adapt.py as a module (its scorer and its recall)."""
    if "bench_adapt" not in sys.modules:
        spec = importlib.util.spec_from_file_location("bench_adapt", ROOT / "bench" / "adapt.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules["bench_adapt"] = module
        spec.loader.exec_module(module)
    return sys.modules["bench_adapt"]


def token_causal_clean(seq_len: int, block_size: int, *, device=None):
    """bd3lm's ``[x_t | x_0]`` mask (:func:`dlmkit.masks.block_diffusion`) with a token-causal
    clean stream: ``x_t`` rows see their own block of ``x_t`` and the strictly earlier blocks
    of ``x_0`` (as bd3lm's); ``x_0`` rows see ``x_0`` up to their own position (bd3lm's: up to
    the end of their block)."""
    import torch

    from dlmkit.masks.core import Mask

    L = seq_len

    def rule(b, q, kv):
        q_noisy, kv_noisy = q < L, kv < L
        q_pos, kv_pos = torch.where(q_noisy, q, q - L), torch.where(kv_noisy, kv, kv - L)
        same_block = q_pos // block_size == kv_pos // block_size
        earlier_block = kv_pos // block_size < q_pos // block_size
        return ((q_noisy & kv_noisy & same_block) | (q_noisy & ~kv_noisy & earlier_block)
                | (~q_noisy & ~kv_noisy & (kv_pos <= q_pos)))

    return Mask.from_rule(rule, 2 * L, 2 * L, device=device, name="block_diffusion_token_clean")


@contextlib.contextmanager
def clean_attention(kind: str):
    """Within the block the likelihood scorers lay out bd3lm's rows with a ``block``-causal
    (bd3lm's) or ``token``-causal clean stream."""
    from dlmkit.decoding import likelihood

    original = likelihood.layout_attention

    def token(layout, length, *, block_size=None, device=None):
        mask, positions = original(layout, length, block_size=block_size, device=device)
        if layout == "block":
            mask = token_causal_clean(length, block_size, device=device)
        return mask, positions

    likelihood.layout_attention = original if kind == "block" else token
    try:
        yield
    finally:
        likelihood.layout_attention = original


@contextlib.contextmanager
def commit_order(kind: str):
    """Within the block the samplers commit masked positions by ``confidence`` (their own
    rule) or ``left_to_right`` (the leftmost first: a score falling with the position)."""
    import torch

    from dlmkit.decoding import commit

    original = commit.confidence

    def leftmost(logits, tokens, remasking, generator):
        width = tokens.shape[-1]
        score = 1.0 - torch.arange(width, device=tokens.device, dtype=torch.float32) / (width + 1)
        return score.expand(tokens.shape).contiguous()

    commit.confidence = original if kind == "confidence" else leftmost
    try:
        yield
    finally:
        commit.confidence = original


def measure(work: Path, runs: list[str], mc_samples: int) -> list[dict]:
    from dlmkit.generate.api import load

    adapt = _adapt()
    data = {name: [json.loads(x) for x in (work / "data" / f"{name}.jsonl").open()]
            for name in ("held_out", "probe")}
    size = adapt.SIZES["documented"]
    held, probe = data["held_out"][:size.eval_entries], data["probe"][:size.probe_entries]
    ar_recalled = adapt.recall(load(work / "pretrain-ar" / "final"), probe)
    lines = []
    for run in runs:
        loaded = load(work / run / "final")
        if loaded.meta.get("strategy") != "bd3lm":
            raise SystemExit(f"bench/adapt_suspects.py: {run} is a {loaded.meta.get('strategy')} "
                             "run; the suspects are bd3lm's")
        for kind in ("confidence", "left_to_right"):
            with commit_order(kind):
                ok = adapt.recall(loaded, probe)
            lines.append({"run": run, "suspect": "order", "variant": kind,
                          "recalled": sum(ok),
                          "retained": sum(a and b for a, b in zip(ar_recalled, ok)),
                          "ar_recalled": sum(ar_recalled)})
        for kind in ("block", "token"):
            with clean_attention(kind):
                lines.append({"run": run, "suspect": "clean_attention", "variant": kind,
                              "held_out_bpb": round(adapt.bits_per_byte(loaded, held,
                                                                        mc_samples), 4),
                              "probe_bpb": round(adapt.bits_per_byte(loaded, probe,
                                                                     mc_samples), 4)})
    return lines


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--work", required=True, help="bench/adapt.py's run directories")
    p.add_argument("--runs", nargs="+", required=True, metavar="RUN",
                   help="bd3lm run directories in --work (their final/)")
    p.add_argument("--mc-samples", type=int, default=8,
                   help="Monte-Carlo draws per entry (bench/adapt.py's documented size: 8)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--results", default=str(RESULTS), help="append the JSON lines here")
    args = p.parse_args(argv)
    if args.mc_samples < 1:
        p.error(f"--mc-samples must be >= 1, got {args.mc_samples}")
    work = Path(args.work).expanduser()
    missing = [r for r in args.runs if not (work / r / "final").is_dir()]
    if missing:
        p.error(f"no final/ in {work} for {missing}")
    import torch

    torch.set_num_threads(args.threads)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                            capture_output=True, text=True).stdout.strip()
    for line in measure(work, args.runs, args.mc_samples):
        line.update(commit=commit, mc_samples=args.mc_samples, threads=args.threads,
                    load_avg=[round(x, 2) for x in os.getloadavg()])
        print(json.dumps(line), flush=True)
        if args.results:
            with open(args.results, "a") as f:
                f.write(json.dumps(line) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
