"""``train.epochs`` beside ``train.steps`` (exactly one decides) and ``RUN/final`` = the best
model by validation loss, with the last step in ``RUN/last`` (dlmkit.train.budget / best)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file

from dlmkit.train import load_config, run
from dlmkit.train.best import BestModel
from dlmkit.train.config import ConfigError

from .helpers import config, records


def test_the_later_of_steps_and_epochs_decides():
    file_steps = load_config("configs/bd3lm-tiny.yaml", ["train.epochs=2"])["train"]
    assert (file_steps["steps"], file_steps["epochs"]) == (None, 2)
    with pytest.raises(ConfigError, match="both set in the --set options"):
        load_config(None, ["train.epochs=2", "train.steps=7"])  # one place: no later one
    with pytest.raises(ConfigError, match="both set"):
        load_config(None, ["train={steps: 3, epochs: 2}"])
    with pytest.raises(ConfigError, match="train.epochs"):
        load_config(None, ["train.epochs=0"])
    with pytest.raises(ConfigError, match="train.steps must be a positive int, got 0"):
        load_config(None, ["train.steps=0"])


@pytest.mark.parametrize("name, extra, steps", [
    ("mdlm", (), 6000), ("scdd", (), 10000), ("idlm", (), 6000),
    ("block_diffusion", (), 6000), ("ar", (), 3000), ("hybrid", (), 3000), ("bd3lm", (), 6000),
    ("dflash", (), 1200),
    ("mdlm", ("train.steps=7",), 7), ("mdlm", ("train.epochs=1",), 8)])
def test_an_unset_budget_is_the_familys_default_steps(name, extra, steps):
    """Neither train.steps nor train.epochs set: the strategy's default_steps (the measured
    values of the README's tables); an explicit budget wins (1 epoch of 64 records, 8 a
    step)."""
    from dlmkit import strategies
    from dlmkit.train.budget import resolve_budget

    cfg = config(*extra, strategy=name)
    resolve_budget(cfg, 64, strategies.get(name))
    assert cfg["train"]["steps"] == steps


def test_epochs_set_the_step_count(tmp_path):
    # 64 records, 8 per step: 1.5 epochs = 12 steps; the run's config records them.
    run_dir = run(config("train.epochs=1.5", output_dir=tmp_path / "r"))
    assert [r["step"] for r in records(run_dir)][-1] == 12
    assert records(run_dir)[-1]["epoch"] == pytest.approx(1.5)
    saved = yaml.safe_load((run_dir / "config.yaml").read_text())["train"]
    assert (saved["steps"], saved["epochs"]) == (12, None)


def fake_export(run_dir: Path, weights: dict):
    """An export that writes the current step (``weights["step"]``) as the model."""
    def export(name: str, meta: dict) -> Path:
        out = run_dir / name
        out.mkdir(parents=True, exist_ok=True)
        (out / "dlmkit.json").write_text(json.dumps({"weights_of": weights["step"], **meta}))
        return out
    return export


def test_final_holds_the_best_validation_step_and_last_the_last(tmp_path):
    weights = {"step": 0}
    export = fake_export(tmp_path, weights)
    best = BestModel(tmp_path, enabled=True, is_main=True)
    for step, loss in [(1, 3.0), (2, 2.0), (3, 2.5), (4, float("nan"))]:
        weights["step"] = step
        best.offer(step, loss, export)
    final = best.finish(4, export)
    meta = json.loads((final / "dlmkit.json").read_text())
    assert meta["weights_of"] == 2
    assert meta["selected"] == {"by": "validation_loss", "step": 2, "validation_loss": 2.0,
                                "last_step": 4}
    assert json.loads((tmp_path / "last" / "dlmkit.json").read_text())["weights_of"] == 4
    assert not (tmp_path / "best").exists() and not (tmp_path / ".best.tmp").exists()


def test_a_resumed_run_keeps_its_best_so_far(tmp_path):
    weights = {"step": 1}
    export = fake_export(tmp_path, weights)
    first = BestModel(tmp_path, enabled=True, is_main=True)
    first.offer(1, 1.0, export)
    first.finish(1, export)  # the run ended: best/ became final/
    again = BestModel(tmp_path, enabled=True, is_main=True)  # resumed and extended
    weights["step"] = 2
    assert not again.offer(2, 1.5, export)  # worse than the step-1 model: kept
    final = again.finish(2, export)
    assert json.loads((final / "dlmkit.json").read_text())["weights_of"] == 1


def test_without_validation_or_with_final_model_last_final_is_the_last_step(tmp_path):
    export = fake_export(tmp_path, {"step": 7})
    best = BestModel(tmp_path, enabled=False, is_main=True)
    assert not best.offer(3, 0.1, export)
    final = best.finish(7, export)
    assert json.loads((final / "dlmkit.json").read_text()) == {"weights_of": 7}
    assert not (tmp_path / "last").exists()
    with pytest.raises(ConfigError, match="final_model"):
        load_config(None, ["train.final_model=first"])


def test_a_run_exports_its_lowest_validation_loss_as_final(tmp_path):
    run_dir = run(config("train.steps=6", "train.val_every=1", "train.lr=0.03",
                         output_dir=tmp_path / "r"))
    val = {r["step"]: r["loss"] for r in records(run_dir, "validation")}
    selected = json.loads((run_dir / "final" / "dlmkit.json").read_text())["selected"]
    assert selected["step"] == min(val, key=val.get) and selected["last_step"] == 6
    assert selected["validation_loss"] == pytest.approx(min(val.values()))
    final = load_file(run_dir / "final" / "model.safetensors")
    last = load_file(run_dir / "last" / "model.safetensors")
    same = all(torch.equal(final[k], last[k]) for k in final)
    assert same == (selected["step"] == 6)


CHANGE_IT = " (set train.warmup_steps to change it)"


@pytest.mark.parametrize("extra, steps, warmup, said", [
    ((), 6000, 600, "train.warmup_steps=600: 10% of the 6000 steps" + CHANGE_IT),
    (("train.steps=7",), 7, 1, "train.warmup_steps=1: 10% of the 7 steps" + CHANGE_IT),
    (("train.steps=3000", "train.warmup_steps=20"), 3000, 20, None),
    (("train.steps=4", "train.warmup_steps=10", "train.lr=1e-3"), 4, 10,
     "warning: train.warmup_steps=10 is longer than the run (train.steps=4): the learning "
     "rate reaches only 40% of train.lr=0.001"),
    (("strategy.name=block_diffusion",), 6000, 20,
     "train.warmup_steps=20: the block_diffusion default" + CHANGE_IT),
    (("strategy.name=block_diffusion", "train.steps=5"), 5, 5,
     "train.warmup_steps=5: the block_diffusion default" + CHANGE_IT)])
def test_an_unset_warmup_is_a_tenth_of_the_steps(extra, steps, warmup, said):
    """``train.warmup_steps: null`` (the default) becomes 10% of the resolved steps (the
    strategy's ``default_warmup_steps`` where it has one: block_diffusion 20, at most the
    run) and is written into the config; a set value is kept (a warning when it outlasts the
    run)."""
    from dlmkit import strategies
    from dlmkit.train.budget import resolve_budget, resolve_warmup

    cfg = load_config(None, ["strategy.name=bd3lm", "train.lr=3e-3", *extra])
    assert cfg["train"]["warmup_steps"] == (None if not any("warmup" in e for e in extra)
                                            else warmup)
    strategy = strategies.get(cfg["strategy"]["name"])
    resolve_budget(cfg, 64, strategy)
    assert resolve_warmup(cfg, strategy) == said
    assert (cfg["train"]["steps"], cfg["train"]["warmup_steps"]) == (steps, warmup)


def test_a_run_records_its_resolved_warmup(tmp_path):
    cfg = config("train.steps=10", output_dir=tmp_path / "r")
    cfg["train"]["warmup_steps"] = None  # the default (the helpers set 2)
    run_dir = run(cfg)
    saved = yaml.safe_load((run_dir / "config.yaml").read_text())["train"]
    assert (saved["steps"], saved["warmup_steps"]) == (10, 1)
    with pytest.raises(ConfigError, match=r"train.warmup_steps must be an int >= 0 or null"):
        load_config(None, ["train.warmup_steps=-1"])
