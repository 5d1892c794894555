"""torchrun with 2 gloo ranks: the same rollouts (rewards) and, up to the order of float
reductions, the same update as one process."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tests.train.helpers import run_cli

pytestmark = pytest.mark.slow  # two torchrun ranks and one process: ~30 s on 2 busy cores
ROOT = Path(__file__).resolve().parents[2]


def args(policy, out):
    return ["rl", "--output-dir", str(out), "--set", f"policy={policy}",
            "--set", "data.task=addition", "--set", "data.num_prompts=16",
            "--set", "reward.function=tests.rl.reward_helpers:length",
            "--set", "rollout.group_size=3", "--set", "rollout.prompts_per_step=4",
            "--set", "train.steps=2", "--set", "train.lr=1e-3", "--set", "train.threads=1",
            "--set", "train.progress=false", "--set", "objective.kl_beta=0.1",
            "--set", "objective.updates_per_rollout=2", "--set", "train.micro_batch_size=2"]


def test_two_ranks_match_one_process(policy, tmp_path):
    from safetensors.torch import load_file

    path = policy("mdlm")
    run_cli(args(path, tmp_path / "one"), cwd=ROOT)
    run_cli(args(path, tmp_path / "two"), nproc=2, cwd=ROOT)
    logs = [[json.loads(line) for line in (tmp_path / d / "metrics.jsonl").read_text()
             .splitlines()] for d in ("one", "two")]
    # step 1 decodes with the same weights: identical completions, so identical rewards
    assert logs[0][0]["reward"] == logs[1][0]["reward"]
    assert logs[0][0]["completion_tokens"] == logs[1][0]["completion_tokens"]
    assert logs[0][0]["loss"] == pytest.approx(logs[1][0]["loss"], rel=1e-5, abs=1e-9)
    a, b = (load_file(str(tmp_path / d / "final" / "model.safetensors")) for d in ("one", "two"))
    assert all(torch.allclose(a[k], b[k], rtol=0, atol=1e-5) for k in a)
