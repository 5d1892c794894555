"""torchrun with 2 gloo ranks, under DDP and FSDP2: the same rollouts (rewards) and, up to the
order of float reductions, the same update as one process; an FSDP2 run resumes bit-exactly."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.train.helpers import env, run_cli

pytestmark = pytest.mark.slow  # torchrun runs: 11-22 s per test on 2 cores
ROOT = Path(__file__).resolve().parents[2]


def run_ranks(args: list[str], timeout: float = 120) -> str:
    """``dlmkit ARGS`` on 2 torchrun ranks. A hang (ranks making different numbers of FSDP2
    collectives) fails after ``timeout`` seconds: torchrun is sent SIGTERM, which stops its
    ranks (they run in sessions of their own, out of reach of a process-group kill); the
    output goes to a file, which a leftover rank cannot hold open as it would a pipe."""
    log_path = Path(args[args.index("--output-dir") + 1]).with_suffix(".log")
    with open(log_path, "w") as log_file:
        proc = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--standalone",
                                 "--nproc-per-node", "2", "-m", "dlmkit.cli", *args],
                                env=env(), cwd=ROOT, stdout=log_file, stderr=subprocess.STDOUT)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            raise AssertionError(f"2 ranks timed out after {timeout}s:\n"
                                 f"{log_path.read_text()[-4000:]}") from None
    out = log_path.read_text()
    assert proc.returncode == 0, out[-4000:]
    return out


def args(policy, out, *extra):
    items = [f"policy={policy}", "data.task=addition", "data.num_prompts=16",
             "reward.function=tests.rl.reward_helpers:length", "rollout.group_size=3",
             "rollout.prompts_per_step=4", "train.steps=2", "train.lr=1e-3", "train.threads=1",
             "train.progress=false", "objective.kl_beta=0.1", "objective.updates_per_rollout=2",
             "train.micro_batch_size=2", *extra]
    return ["rl", "--output-dir", str(out)] + [a for item in items for a in ("--set", item)]


def log(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def weights(run_dir):
    from safetensors.torch import load_file

    return load_file(str(run_dir / "final" / "model.safetensors"))


# With a 16-token budget: idlm's sampler stops when its rows are complete, so the ranks'
# rollouts make different numbers of forwards (6 to 10 per prompt here); hybrid's completions
# differ in length (cut at their stop token), so a micro-batch's scores make one forward per
# length, at step 1 two on rank 0 and one on rank 1. Either would leave FSDP2's all-gathers
# unmatched.
LONG = ["rollout.sampler.max_new_tokens=16"]


# LoRA on the policy: adapters initialised alike on both ranks (FSDP2 broadcasts nothing),
# the KL reference scored with the adapters off on the sharded model, a merged export from the
# gathered state dict.
LORA = ["lora={r: 4, alpha: 8, target_modules: [q_proj, v_proj]}"]


@pytest.mark.parametrize("strategy,block,kind,extra", [
    ("mdlm", None, "ddp", []), ("mdlm", None, "fsdp2", []), ("idlm", 2, "fsdp2", LONG),
    ("hybrid", 2, "fsdp2", LONG), ("bd3lm", 2, "fsdp2", LORA)])
def test_two_ranks_match_one_process(policy, tmp_path, strategy, block, kind, extra):
    path = policy(strategy, block)
    run_cli(args(path, tmp_path / "one", *extra), cwd=ROOT)
    run_ranks(args(path, tmp_path / "two", *extra, f"train.distributed={kind}"))
    one, two = log(tmp_path / "one"), log(tmp_path / "two")
    # step 1 decodes with the same weights: identical completions, so identical rewards
    assert one[0]["reward"] == two[0]["reward"]
    assert one[0]["completion_tokens"] == two[0]["completion_tokens"]
    assert one[0]["loss"] == pytest.approx(two[0]["loss"], rel=1e-5, abs=1e-9)
    assert one[0]["kl"] == pytest.approx(two[0]["kl"], rel=1e-5, abs=1e-9)
    a, b = weights(tmp_path / "one"), weights(tmp_path / "two")
    assert a.keys() == b.keys()
    assert all(torch.allclose(a[k], b[k], rtol=0, atol=1e-5) for k in a)
    start = weights_of(path)
    assert any(not torch.equal(start[k], a[k]) for k in a)  # the update moved the weights


def weights_of(model_dir):
    from safetensors.torch import load_file

    return load_file(str(Path(model_dir) / "model.safetensors"))


def test_fsdp2_resume_is_bit_exact(policy, tmp_path):
    """Two FSDP2 ranks resumed from their step-2 checkpoint (torch.distributed.checkpoint, the
    SFT recipe's) redo step 3 exactly as the uninterrupted run did."""
    path = policy("idlm", 2)
    fsdp = [*LONG, "train.distributed=fsdp2", "train.save_every=2"]
    run_ranks(args(path, tmp_path / "straight", *fsdp, "train.steps=3"))
    run_ranks(args(path, tmp_path / "resumed", *fsdp))
    run_ranks(["rl", "--output-dir", str(tmp_path / "resumed"), "--resume", "--set",
               "train.steps=3"])
    timing = ("rollout_s", "update_s", "tokens_per_s")
    straight, resumed = ([{k: v for k, v in r.items() if k not in timing} for r in log(d)]
                         for d in (tmp_path / "straight", tmp_path / "resumed"))
    assert [r["step"] for r in straight] == [1, 2, 3] and straight == resumed
    a, b = weights(tmp_path / "straight"), weights(tmp_path / "resumed")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
