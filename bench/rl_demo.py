"""What RL can lift: greedy exact match, sampled pass@1 and pass@G of an export on a task split.

GRPO learns only from prompts whose G sampled completions disagree on the reward, so the
starting point worth an RL run is one whose samples are often right where its greedy answer is
wrong: ``pass@G`` (any of G completions at temperature 1 exact) well above greedy exact match.
This measures the three with the rollouts ``dlmkit rl`` itself draws (the family's sampler,
completion ``c`` of problem ``p`` seeded from ``(seed, 0, p, c)``), and with ``--record``
appends the measurement as one JSON line (command, commit, load average, seconds) to a results
file such as ``docs/results/rl.jsonl``.

    python bench/rl_demo.py measure --model RUN/final --split validation -n 256 -G 8 \
        --record docs/results/rl.jsonl --note "SFT start candidate"

``mixed-data`` writes the demonstration's SFT data: bundled ``addition`` problems whose answer
is written zero-padded to three digits (``"027"`` for ``"27"``) in a given share of the
records. Both spellings are the right number, so SFT on them learns the arithmetic and a coin
flip between the spellings, and no amount of further SFT on that data prefers one; the reward
(``exact_answer`` against the task's own answer, ``"27"``) does. What RL then has to find is
exactly what its samples already show: the unpadded spelling, drawn about half the time.

    python bench/rl_demo.py mixed-data --split train -n 7000 --out train.jsonl
    python bench/rl_demo.py mixed-data --split validation -n 256 --seed 1 --out val.jsonl
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path


def commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, check=True,
                              cwd=Path(__file__).resolve().parent).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def measure(model_dir: str, split: str, n: int, group: int, seed: int, batch: int,
            task: str | None) -> dict:
    import torch

    from dlmkit.data.tasks import get_task
    from dlmkit.generate import api
    from dlmkit.generate.evaluation import evaluate
    from dlmkit.rl.rewards import exact_answer, numeric_answer
    from dlmkit.rl.rollout import rollout

    loaded = api.load(model_dir)
    name = task or loaded.meta.get("task")
    if not name:
        raise SystemExit(f"--task: {model_dir} names no bundled task in its dlmkit.json")
    records = get_task(name).records(split, n=n)  # as `dlmkit eval` draws them
    start = time.perf_counter()
    greedy, rows, _ = evaluate(loaded.model, loaded.tokenizer, records, loaded.config(),
                                   batch_size=batch)
    # the right number, however written ("027" for "27" counts): arithmetic apart from format
    value = sum(numeric_answer("", r["output"], r) for r in rows) / len(rows)
    greedy_s = time.perf_counter() - start
    start = time.perf_counter()
    sampler = loaded.config(temperature=1.0)
    hits = torch.zeros(len(records), group)
    for at in range(0, len(records), max(batch // group, 1)):
        chunk = list(enumerate(records))[at:at + max(batch // group, 1)]
        done = rollout(loaded.model, loaded.tokenizer, [(i, r["prompt"]) for i, r in chunk],
                       group, sampler, seed=seed, step=0)
        for c in done:
            hits[c.prompt_index, c.completion] = exact_answer("", c.text,
                                                              records[c.prompt_index])
    sampled_s = time.perf_counter() - start
    per_problem = hits.mean(1)
    return {"task": name, "split": split, "n": len(records), "group_size": group,
            "greedy_exact_match": round(greedy, 4), "greedy_value_match": round(value, 4),
            "sampled_pass@1": round(float(per_problem.mean()), 4),
            f"pass@{group}": round(float((per_problem > 0).float().mean()), 4),
            # problems whose G samples disagree: the ones a GRPO step learns from
            "mixed_groups": round(float(((per_problem > 0) & (per_problem < 1)).float().mean()),
                                  4),
            "greedy_s": round(greedy_s, 1), "sampled_s": round(sampled_s, 1)}


SPELLINGS = {"dot": lambda answer: answer + ".", "pad": lambda answer: answer.zfill(3)}


def mixed_data(split: str, n: int, share: float, seed: int, out: str, spelling: str,
               even_only: bool = False) -> int:
    """Write ``n`` ``addition`` problems of ``split`` as prompt/response JSONL, a ``share`` of
    the answers (of the even answers only with ``even_only``) in the other ``spelling``
    (:data:`SPELLINGS`); returns how many changed."""
    import random

    from dlmkit.data.tasks import get_task

    rng = random.Random(seed)
    count = 0
    with open(out, "w") as f:
        for record in get_task("addition").records(split, n=n, seed=0):
            response = record["response"]
            if rng.random() < share and (not even_only or int(response) % 2 == 0):
                response = SPELLINGS[spelling](response)
                count += response != record["response"]
            f.write(json.dumps({"prompt": record["prompt"], "response": response}) + "\n")
    return count


def run_summary(run_dir: str) -> dict:
    """An ``dlmkit rl`` run directory in one record: the options that matter, the steps done,
    its seconds in rollouts and updates (``metrics.jsonl``'s sums) and the sampled reward over
    its first and last fifth of logged steps."""
    from dlmkit.train.config import load_yaml

    run = Path(run_dir)
    config = load_yaml((run / "config.yaml").read_text())
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()
            if line.strip()]
    rows = [r for r in rows if r.get("split") == "train"]
    if not rows:
        raise SystemExit(f"{run}/metrics.jsonl: no train records")
    fifth = max(len(rows) // 5, 1)
    ro, o, t = config["rollout"], config["objective"], config["train"]
    return {"run": str(run.resolve()), "policy": config["policy"],
            "estimator": o["estimator"], "lr": t["lr"], "warmup_steps": t["warmup_steps"],
            "prompts_per_step": ro["prompts_per_step"], "group_size": ro["group_size"],
            "samples": o["samples"], "updates_per_rollout": o["updates_per_rollout"],
            "clip_epsilon": o["clip_epsilon"], "kl_beta": o["kl_beta"],
            "sampler": {k: v for k, v in ro["sampler"].items() if v is not None},
            "steps_done": rows[-1]["step"],
            "rollout_s": round(sum(r["rollout_s"] for r in rows), 1),
            "update_s": round(sum(r["update_s"] for r in rows), 1),
            "reward_first_fifth": round(sum(r["reward"] for r in rows[:fifth]) / fifth, 3),
            "reward_last_fifth": round(sum(r["reward"] for r in rows[-fifth:]) / fifth, 3)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    m = commands.add_parser("measure", help="greedy exact match, sampled pass@1 and pass@G")
    m.add_argument("--model", required=True, help="an export (RUN/final)")
    m.add_argument("--split", default="validation", choices=("train", "validation", "test"))
    m.add_argument("-n", type=int, default=256, help="problems (the split's first n)")
    m.add_argument("-G", dest="group", type=int, default=8,
                   help="sampled completions per problem (temperature 1)")
    m.add_argument("--seed", type=int, default=0)
    m.add_argument("--batch-size", type=int, default=64, help="rows per sampler call")
    m.add_argument("--task", help="bundled task (default: the model's)")
    m.add_argument("--record", metavar="FILE", help="append the result as a JSON line")
    m.add_argument("--note", default="", help="stored with --record")
    d = commands.add_parser("mixed-data", help="addition records, a share zero-padded")
    d.add_argument("--split", default="train", choices=("train", "validation", "test"))
    d.add_argument("-n", type=int, required=True, help="problems")
    d.add_argument("--share", type=float, default=0.5,
                   help="share of the answers written in the other spelling")
    d.add_argument("--spelling", choices=sorted(SPELLINGS), default="dot",
                   help="dot: '27.' for '27'; pad: zero-padded to three digits, '027'")
    d.add_argument("--even-only", action="store_true",
                   help="respell only answers that are even numbers (a share of those)")
    d.add_argument("--seed", type=int, default=0, help="which answers are padded")
    d.add_argument("--out", required=True, help="the JSONL file to write")
    r = commands.add_parser("run", help="summarise a dlmkit rl run directory as one record")
    r.add_argument("run_dir", help="the run directory (--output-dir of dlmkit rl)")
    r.add_argument("--record", metavar="FILE", help="append the result as a JSON line")
    r.add_argument("--note", default="", help="stored with --record")
    args = parser.parse_args(argv)
    if args.command == "run":
        line = {"date": time.strftime("%Y-%m-%d"), "arm": "rl", **run_summary(args.run_dir),
                "commit": commit(), "note": args.note}
        print(json.dumps(line))
        if args.record:
            with open(args.record, "a") as f:
                f.write(json.dumps(line) + "\n")
        return 0
    if args.command == "mixed-data":
        if args.n < 1 or not 0 <= args.share <= 1:
            parser.error(f"-n must be positive and --share in [0, 1], got {args.n}, "
                         f"{args.share}")
        count = mixed_data(args.split, args.n, args.share, args.seed, args.out, args.spelling,
                           args.even_only)
        print(f"{args.out}: {args.n} records, {count} answers spelled {args.spelling!r}")
        return 0
    if args.n < 1 or args.group < 1 or args.batch_size < 1:
        parser.error(f"-n, -G and --batch-size must be positive, got {args.n}, {args.group}, "
                     f"{args.batch_size}")
    load = os.getloadavg()[0]
    result = {"model": os.path.abspath(args.model),
              **measure(args.model, args.split, args.n, args.group, args.seed,
                        args.batch_size, args.task)}
    line = {"date": time.strftime("%Y-%m-%d"), "arm": "measure", **result,
            "command": "python " + shlex.join(sys.argv), "commit": commit(),
            "load_average_1min": round(load, 2), "note": args.note}
    print(json.dumps(line))
    if args.record:
        with open(args.record, "a") as f:
            f.write(json.dumps(line) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
