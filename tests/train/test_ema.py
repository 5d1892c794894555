"""``train.ema_decay``: the weight average (dlmkit.train.ema) by hand, and in the recipe —
validation and exports use it, training does not, and a resume continues it bit for bit."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from dlmkit.cli import main
from dlmkit.train import load_config
from dlmkit.train.config import ConfigError, load_yaml
from dlmkit.train.ema import WeightAverage
from dlmkit.train.recipe import resolve_ema
from dlmkit.train.resume import plan_resume

from .helpers import (
    cli_args,
    copy_as_crashed_at,
    losses,
    overrides,
    rewrite_checkpoint_config,
)


def _linear(value: float) -> torch.nn.Linear:
    layer = torch.nn.Linear(2, 1, bias=False)
    with torch.no_grad():
        layer.weight.fill_(value)
    return layer


def test_average_by_hand():
    layer = _linear(1.0)
    ema = WeightAverage(layer, 0.5)
    with torch.no_grad():
        layer.weight.fill_(3.0)
    ema.update()  # rate min(0.5, 1/10) = 0.1: 0.1 * 1 + 0.9 * 3
    assert torch.allclose(ema.shadow["weight"], torch.full((1, 2), 2.8))
    with torch.no_grad():
        layer.weight.fill_(5.0)
    ema.update()  # rate min(0.5, 2/11)
    r = 2 / 11
    assert torch.allclose(ema.shadow["weight"], torch.full((1, 2), r * 2.8 + (1 - r) * 5.0))
    for _ in range(20):
        ema.update()
    assert ema.rate() == 0.5  # warm-up over: the configured decay


def test_applied_swaps_in_and_always_restores():
    layer = _linear(1.0)
    ema = WeightAverage(layer, 0.9)
    with torch.no_grad():
        layer.weight.fill_(2.0)
    ema.update()
    with ema.applied():
        assert torch.equal(layer.weight, ema.shadow["weight"])
    assert torch.equal(layer.weight, torch.full((1, 2), 2.0))
    with pytest.raises(RuntimeError, match="boom"), ema.applied():
        raise RuntimeError("boom")
    assert torch.equal(layer.weight, torch.full((1, 2), 2.0))


def test_state_round_trip_and_a_mismatch_is_named():
    a = WeightAverage(_linear(1.0), 0.9)
    a.update()
    b = WeightAverage(_linear(7.0), 0.9)
    b.load_state_dict(a.state_dict())
    assert torch.equal(b.shadow["weight"], a.shadow["weight"]) and b.updates == 1
    other = WeightAverage(torch.nn.Linear(2, 1), 0.9)  # has a bias too
    with pytest.raises(ValueError, match="missing.*bias"):
        other.load_state_dict(a.state_dict())


@pytest.mark.parametrize("bad", [1.0, -0.1, "0.9x"])
def test_bad_decay_is_a_config_error(bad):
    with pytest.raises(ConfigError, match=r"train\.ema_decay must be a number in \[0, 1\)"):
        load_config(None, overrides(f"train.ema_decay={bad}"))


@pytest.mark.parametrize("strategy, extra, decay, said", [
    ("block_diffusion", (), 0.999, "train.ema_decay=0.999: the block_diffusion default"),
    ("block_diffusion", ("train.ema_decay=0",), 0.0, None),
    ("scdd", (), 0.999, "train.ema_decay=0.999: the scdd default"),
    ("bd3lm", (), 0.999, "train.ema_decay=0.999: the bd3lm default"),
    ("mdlm", (), 0.0, None),
    ("mdlm", ("train.ema_decay=0.99",), 0.99, None)])
def test_an_unset_decay_is_the_familys_default(strategy, extra, decay, said):
    """``train.ema_decay: null`` (the default) becomes the strategy's ``default_ema_decay``
    (0.999 for block_diffusion, scdd and bd3lm, 0 = none for the others), said when it turns the
    average on; a set value, 0 included, is kept."""
    from dlmkit import strategies

    cfg = load_config(None, [f"strategy.name={strategy}", *extra])
    line = resolve_ema(cfg, strategies.get(strategy))
    assert cfg["train"]["ema_decay"] == decay
    assert (line is None) == (said is None)
    if said is not None:
        assert line.startswith(said) and "train.ema_decay=0 to turn it off" in line


STEPS = ["train.steps=8", "train.save_every=4", "train.val_every=4", "train.final_model=last"]


def test_validation_and_final_use_the_average_and_resume_continues_it(tmp_path):
    plain, averaged, resumed = tmp_path / "plain", tmp_path / "ema", tmp_path / "resumed"
    main(cli_args(plain, *STEPS))
    main(cli_args(averaged, *STEPS, "train.ema_decay=0.9"))
    # Training steps the raw weights: the same losses; validation sees the average.
    assert losses(averaged) == losses(plain)
    assert losses(averaged, "validation") != losses(plain, "validation")
    # final/ (the last step here) holds the averaged weights the checkpoint carries.
    state = torch.load(averaged / "checkpoints" / "step_0000008" / "state.pt",
                       weights_only=False)
    exported = load_file(averaged / "final" / "model.safetensors")
    shadow = state["ema"]["shadow"]
    assert int(state["ema"]["updates"]) == 8
    assert set(exported) <= set(shadow)
    assert all(torch.equal(exported[k], shadow[k]) for k in exported)
    assert not all(torch.equal(exported[k], state["model"][k]) for k in exported)
    assert json.loads((averaged / "final" / "dlmkit.json").read_text())["ema_decay"] == 0.9
    assert "ema_decay" not in json.loads((plain / "final" / "dlmkit.json").read_text())
    # As if it had crashed just after the step-4 checkpoint, resumed: the same validation
    # losses and final weights.
    copy_as_crashed_at(averaged, resumed, 4)
    main([*cli_args(resumed, *STEPS, "train.ema_decay=0.9"), "--resume"])
    assert losses(resumed, "validation") == losses(averaged, "validation")
    again = load_file(resumed / "final" / "model.safetensors")
    assert all(torch.equal(again[k], exported[k]) for k in exported)


def test_turning_the_average_on_at_a_resume_starts_it_from_the_restored_weights(tmp_path):
    plain, later = tmp_path / "plain", tmp_path / "later"
    main(cli_args(plain, *STEPS))
    copy_as_crashed_at(plain, later, 4)
    args = [*cli_args(later, *STEPS, "train.ema_decay=0.9"), "--resume"]
    with pytest.raises(SystemExit):  # a changed key is refused without the flag
        main(args)
    main([*args, "--allow-config-change"])
    state = torch.load(later / "checkpoints" / "step_0000008" / "state.pt", weights_only=False)
    assert int(state["ema"]["updates"]) == 4  # restarted at step 4, updated at steps 5-8
    assert losses(later) == losses(plain)


def test_a_checkpoint_from_before_the_key_resumes_without_an_average(tmp_path):
    """A checkpoint whose config.yaml has no ``train.ema_decay`` (written before it existed)
    was trained without a weight average: resuming it must not turn on the family's default."""
    plain, old = tmp_path / "plain", tmp_path / "old"
    main(cli_args(plain, *STEPS))
    copy_as_crashed_at(plain, old, 4)
    checkpoint = old / "checkpoints" / "step_0000004"
    stored = load_yaml((checkpoint / "config.yaml").read_text())
    del stored["train"]["ema_decay"]
    rewrite_checkpoint_config(checkpoint, stored)
    cfg = load_config(None, [*overrides(*STEPS), f"output_dir={old}"])
    assert cfg["train"]["ema_decay"] is None  # unset now: would be the family's default
    plan = plan_resume(cfg, explicit=[])
    assert plan.config["train"]["ema_decay"] == 0.0 and not plan.forced
