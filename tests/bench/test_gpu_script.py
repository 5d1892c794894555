"""bench/gpu.py: its CPU mode (forward-only flex vs SDPA for every registered strategy) runs
and passes, and its padded batches have the padding they claim."""

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import torch

from dlmkit import strategies
from dlmkit.data import Collator
from tests.scripts import bench_script

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "gpu.py"




def test_padded_batches():
    gpu = bench_script("gpu")
    collator = Collator(pad_token_id=0, eos_token_id=1, max_seq_len=32)
    none = gpu.padded_batch(collator, 32, "none")
    assert bool((none["attention_valid"] == 1).all())
    right = gpu.padded_batch(collator, 32, "right")
    assert right["attention_valid"][1].tolist() == [1] * 24 + [0] * 8
    left = gpu.padded_batch(collator, 32, "left")
    assert left["attention_valid"][1].tolist() == [0] * 8 + [1] * 24
    # the same tokens, moved: real content and supervision travel with the validity
    assert torch.equal(left["input_ids"][1, 8:], right["input_ids"][1, :24])
    assert torch.equal(left["loss_mask"][1, 8:], right["loss_mask"][1, :24])
    empty = gpu.padded_batch(collator, 32, "all")
    assert int(empty["attention_valid"][1].sum()) == 0 and int(empty["loss_mask"][1].sum()) == 0
    assert int(empty["attention_valid"][0].sum()) == 32


def test_cpu_mode_covers_every_strategy(tmp_path):
    out = tmp_path / "gpu.json"
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    done = subprocess.run([sys.executable, str(SCRIPT), "--cpu", "--dtypes", "fp32,bf16",
                           "--paddings", "left,all", "--json", str(out)],
                          capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads(out.read_text())
    assert results["mode"] == "cpu" and results["all_passed"]
    assert {s["section"] for s in results["skipped_sections"]} == {"attention", "build", "train"}
    records = results["correctness"]
    assert {r["strategy"] for r in records} == set(strategies.names())
    ran = set()
    for r in records:
        if "skipped" in r:
            assert r["skipped"]  # a reason, printed in the table
            continue
        ran.add(r["strategy"])
        assert r["passed"] and not r["nonfinite_steps"]
        assert all(math.isfinite(x) for x in r["sdpa_loss"] + r["flex_loss"])
        assert r["loss_rel"] <= r["tolerance"]["loss_rel"]
    # the families this script must always handle (HF causal LMs with a dLLM mask)
    assert {"mdlm", "bd3lm", "idlm"} <= ran
    assert "## correctness" in done.stderr


def test_a_wrong_block_mask_fails_the_check(monkeypatch):
    """The flex side must really use the BlockMask: swapping it for a bidirectional one (same
    shape) has to fail the comparison, not pass silently."""
    import dlmkit.masks.core as core
    from dlmkit.masks import bidirectional

    gpu = bench_script("gpu")
    right = core.Mask.block_mask

    def wrong(self, block_size=128):
        return right(bidirectional(self.q_len), block_size)

    monkeypatch.setattr(core.Mask, "block_mask", wrong)
    records = []
    with gpu.eager_flex_attention():
        gpu.check_strategy("bd3lm", torch.device("cpu"), records.append, seq_len=32, steps=1,
                           dtypes=["fp32"], paddings=["left"], model=None)
    (record,) = records
    assert record["flex_calls"] > 0
    assert record["passed"] is False and record["loss_rel"] > record["tolerance"]["loss_rel"]


def test_train_section_fits_each_family_in_its_models_positions(tmp_path):
    """A family whose own model holds fewer positions than --train-seq-len (the tiny
    DiffusionGemma, 1024) trains at what it can take instead of failing (as it did on the
    first CUDA run); the others keep the length asked for."""
    gpu = bench_script("gpu")
    assert gpu.preset_max_positions("tiny-diffusion-gemma") == 1024
    assert gpu.preset_max_positions("small-llama") == 2048
    assert gpu.preset_max_positions("/some/model/dir") is None
    out = tmp_path / "train.json"
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    done = subprocess.run([sys.executable, str(SCRIPT), "--cpu", "--sections", "train",
                           "--strategies", "block_diffusion,mdlm", "--model", "small-llama",
                           "--train-seq-len", "1536", "--train-steps", "1", "--train-batch", "2",
                           "--json", str(out)], capture_output=True, text=True, env=env,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = {r["strategy"]: r for r in json.loads(out.read_text())["train"]}
    assert "error" not in rows["block_diffusion"], rows["block_diffusion"]
    assert rows["block_diffusion"]["seq_len"] == 1024
    assert rows["mdlm"]["seq_len"] == 1536 and rows["mdlm"]["model"] == "small-llama"
    assert math.isfinite(rows["mdlm"]["final_loss"])
