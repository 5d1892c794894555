"""A run's strategy options are its own: config.yaml records every one (defaults included), so
a resume after a family's default has changed trains with the values the run started with; and
its model preset, the family's when ``model.name`` is unset."""

from __future__ import annotations

from dlmkit.cli import main
from dlmkit.families.scdd.strategy import SCDDStrategy
from dlmkit.train import load_config
from dlmkit.train.config import load_yaml
from dlmkit.train.resume import plan_resume

from .helpers import cli_args, copy_as_crashed_at, losses, overrides, rewrite_checkpoint_config

STEPS = ["train.steps=4", "train.save_every=2", "train.val_every=2"]


def _checkpoint(run_dir, step):
    return run_dir / "checkpoints" / f"step_{step:07d}"


def _with_strategy(checkpoint, section: dict) -> None:
    """The checkpoint's config.yaml with ``section`` as its strategy (as an older dlmkit wrote)."""
    stored = load_yaml((checkpoint / "config.yaml").read_text())
    rewrite_checkpoint_config(checkpoint, {**stored, "strategy": section})


def test_config_yaml_records_every_strategy_option_and_the_model(tmp_path):
    run = tmp_path / "run"
    main(cli_args(run, "train.steps=1", "strategy.max_ratio=0.05", strategy="scdd"))
    recorded = load_yaml((run / "config.yaml").read_text())
    # logit_shift null is resolved: false from scratch (dlmkit.train.regime)
    assert recorded["strategy"] == {"name": "scdd", **SCDDStrategy.options, "max_ratio": 0.05,
                                    "logit_shift": False}
    assert recorded["model"]["name"] == SCDDStrategy.default_model == "tiny-llama"
    in_checkpoint = load_yaml((_checkpoint(run, 1) / "config.yaml").read_text())
    assert in_checkpoint["strategy"] == recorded["strategy"]
    assert in_checkpoint["model"] == recorded["model"]


def test_a_changed_default_does_not_change_a_resumed_run(tmp_path, monkeypatch):
    straight, crashed = tmp_path / "straight", tmp_path / "crashed"
    main(cli_args(straight, *STEPS, strategy="scdd"))
    copy_as_crashed_at(straight, crashed, 2)
    # dlmkit upgraded between the crash and the resume: scdd's t_min default moved.
    monkeypatch.setattr(SCDDStrategy, "options", {**SCDDStrategy.options, "t_min": 0.5})
    cfg = load_config(None, [*overrides(*STEPS, strategy="scdd"), f"output_dir={crashed}"])
    plan = plan_resume(cfg, explicit=[])
    assert plan.config["strategy"]["t_min"] == 0.2 and not plan.forced and not plan.former
    main([*cli_args(crashed, *STEPS, strategy="scdd"), "--resume"])
    assert losses(crashed) == losses(straight)  # bit-identical: the run's own t_min
    assert losses(crashed, "validation") == losses(straight, "validation")


def test_a_checkpoint_that_records_no_options_resumes_with_what_it_trained_with(tmp_path):
    """config.yaml from before dlmkit recorded the options holds only the name: scdd then
    trained with t_min 0 and iid times (its former defaults), not today's."""
    run, old = tmp_path / "run", tmp_path / "old"
    main(cli_args(run, *STEPS, "strategy.t_min=0.0", "strategy.time_sampling=iid",
                  strategy="scdd"))
    copy_as_crashed_at(run, old, 2)
    _with_strategy(_checkpoint(old, 2), {"name": "scdd"})
    cfg = load_config(None, [*overrides(*STEPS, strategy="scdd"), f"output_dir={old}"])
    plan = plan_resume(cfg, explicit=[])
    assert plan.former == {"t_min": 0.0, "time_sampling": "iid", "logit_shift": False} \
        == SCDDStrategy.former_defaults
    assert plan.config["strategy"] == {**SCDDStrategy.options, "name": "scdd", **plan.former}
    assert not plan.forced
    assert any("does not record strategy.t_min=0.0, strategy.time_sampling='iid'" in line
               for line in plan.summary())
    main([*cli_args(old, *STEPS, strategy="scdd"), "--resume"])
    assert losses(old) == losses(run)


def test_an_older_checkpoint_with_an_option_set_keeps_the_former_defaults_of_the_rest(tmp_path):
    run, old = tmp_path / "run", tmp_path / "old"
    main(cli_args(run, *STEPS[:2], "strategy.max_ratio=0.05", "strategy.t_min=0.0",
                  "strategy.time_sampling=iid", strategy="scdd"))
    copy_as_crashed_at(run, old, 2)
    _with_strategy(_checkpoint(old, 2), {"name": "scdd", "max_ratio": 0.05})
    cfg = load_config(None, [*overrides(*STEPS[:2], "strategy.max_ratio=0.05",
                                        strategy="scdd"), f"output_dir={old}"])
    plan = plan_resume(cfg, explicit=["strategy.max_ratio"])
    assert plan.former == {"t_min": 0.0, "time_sampling": "iid", "logit_shift": False}
    assert not plan.forced
    assert plan.config["strategy"]["max_ratio"] == 0.05


def test_a_family_whose_defaults_never_changed_resumes_an_old_checkpoint_silently(tmp_path):
    run, old = tmp_path / "run", tmp_path / "old"
    main(cli_args(run, *STEPS[:2], strategy="hybrid"))
    copy_as_crashed_at(run, old, 2)
    _with_strategy(_checkpoint(old, 2), {"name": "hybrid", "block_size": 4})
    cfg = load_config(None, [*overrides(*STEPS[:2], strategy="hybrid"), f"output_dir={old}"])
    plan = plan_resume(cfg, explicit=[])
    assert not plan.former and not plan.forced
    assert plan.config["strategy"] == load_yaml((run / "config.yaml").read_text())["strategy"]


def test_an_idlm_checkpoint_without_its_clean_loss_weight_resumes_with_1(tmp_path):
    """clean_loss_weight became null (1.0 from scratch, 4.0 adapting a causal checkpoint): a
    checkpoint whose config.yaml does not record it trained with 1.0 and resumes with 1.0,
    whatever its regime would resolve to today."""
    from dlmkit.families.idlm.strategy import IDLMStrategy

    run, old = tmp_path / "run", tmp_path / "old"
    main(cli_args(run, *STEPS[:2], strategy="idlm"))
    copy_as_crashed_at(run, old, 2)
    _with_strategy(_checkpoint(old, 2), {"name": "idlm", "block_size": 4})
    cfg = load_config(None, [*overrides(*STEPS[:2], strategy="idlm"), f"output_dir={old}"])
    plan = plan_resume(cfg, explicit=[])
    assert plan.former == {"clean_loss_weight": 1.0} == IDLMStrategy.former_defaults
    assert plan.config["strategy"]["clean_loss_weight"] == 1.0
