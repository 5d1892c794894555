"""The rl loop on untrained tiny exports: rollouts independent of the batch split, a
bit-exact resume, reward failures named, config errors."""

from __future__ import annotations

import json

import pytest
import torch

from dlmkit.generate import api
from dlmkit.rl import load_rl_config, run
from dlmkit.rl.loop import resume_config
from dlmkit.rl.rewards import RewardError
from dlmkit.rl.rollout import rollout
from dlmkit.train.config import ConfigError


def config_for(path, out, *extra):
    return load_rl_config(None, [f"policy={path}", "data.task=addition", "data.num_prompts=16",
                                 "reward.function=tests.rl.reward_helpers:length",
                                 "rollout.group_size=2", "rollout.prompts_per_step=2",
                                 "train.steps=3", "train.lr=1e-3", "train.progress=false",
                                 "train.save_every=1", f"output_dir={out}", *extra])


@pytest.mark.parametrize("strategy,block", [("mdlm", None), ("bd3lm", 2)])
def test_rollouts_do_not_depend_on_the_batch_split(policy, strategy, block):
    loaded = api.load(policy(strategy, block))
    cfg = loaded.config(temperature=1.0)
    prompts = [(5, "12+7="), (9, "3+40="), (2, "8+8=")]
    runs = [rollout(loaded.model, loaded.tokenizer, prompts, 3, cfg, seed=1, step=4,
                    batch_size=size, fixed_length=strategy == "mdlm") for size in (None, 1, 4)]
    seen = [[(c.prompt_index, c.completion, c.ids, c.text) for c in r] for r in runs]
    assert seen[0] == seen[1] == seen[2]
    assert len({tuple(c.ids) for c in runs[0]}) > 1  # sampled, not one greedy answer
    # a prompt decoded alone (another rank's share) gives the same completions
    alone = rollout(loaded.model, loaded.tokenizer, prompts[1:2], 3, cfg, seed=1, step=4)
    assert [(c.ids, c.text) for c in alone] == [(c.ids, c.text) for c in runs[0][3:6]]
    other_step = rollout(loaded.model, loaded.tokenizer, prompts[1:2], 3, cfg, seed=1, step=5)
    assert [c.ids for c in other_step] != [c.ids for c in alone]


def test_block_family_completions_end_in_whole_blocks(policy):
    """bd3lm trains on rows whose last block the collator fills with EOS: a completion cut at
    its stop token gets that fill back, so the estimators never score a cut-off block."""
    loaded = api.load(policy("bd3lm", 4))
    tok, cfg = loaded.tokenizer, loaded.config(temperature=1.0)
    prompts = [(0, "12+7="), (1, "3+40="), (2, "8+8=")]
    plain = rollout(loaded.model, tok, prompts, 4, cfg, seed=1, step=0)
    filled = rollout(loaded.model, tok, prompts, 4, cfg, seed=1, step=0, block_fill=4)
    assert any((len(c.prompt_ids) + len(c.ids)) % 4 for c in plain)  # cut: part-blocks
    for a, b in zip(plain, filled):
        assert (len(b.prompt_ids) + len(b.ids)) % 4 == 0
        assert b.ids[:len(a.ids)] == a.ids and set(b.ids[len(a.ids):]) <= {tok.eos_token_id}
        assert b.text == a.text


def test_the_loop_fills_block_family_completions(policy, tmp_path, monkeypatch):
    import dlmkit.rl.loop as loop

    seen = []

    def spy(*args, **kwargs):
        out = rollout(*args, **kwargs)
        seen.append((kwargs["block_fill"], [len(c.prompt_ids) + len(c.ids) for c in out]))
        return out

    monkeypatch.setattr(loop, "rollout", spy)
    run(config_for(policy("bd3lm", 4), tmp_path / "b", "train.steps=1"))
    run(config_for(policy("mdlm"), tmp_path / "m", "train.steps=1"))
    (fill, lengths), (mdlm_fill, _) = seen
    assert fill == 4 and all(n % 4 == 0 for n in lengths) and mdlm_fill is None


def weights(run_dir):
    from safetensors.torch import load_file

    return load_file(str(run_dir / "final" / "model.safetensors"))


def records(run_dir):
    timing = ("rollout_s", "update_s", "tokens_per_s")
    return [{k: v for k, v in json.loads(line).items() if k not in timing}
            for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def check_resume_is_bit_exact(path, tmp_path, extra):
    """3 steps straight against 2 steps resumed to 3: the same final weights and metrics, bit
    for bit. Returns ``(straight run, the 2-step run)``."""
    straight = run(config_for(path, tmp_path / "straight", *extra))
    first = run(config_for(path, tmp_path / "resumed", *extra, "train.steps=2"))
    resumed = run(resume_config(first, ["train.steps=3"]), resume=True)
    a, b = weights(straight), weights(resumed)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert records(straight) == records(resumed)
    return straight, first


@pytest.mark.parametrize("estimator", ["elbo", "one_step"])
def test_resume_is_bit_exact(policy, tmp_path, estimator):
    path = policy("mdlm")
    extra = [f"objective.estimator={estimator}", "objective.kl_beta=0.1",
             "objective.updates_per_rollout=2", "train.micro_batch_size=3"]
    straight, _ = check_resume_is_bit_exact(path, tmp_path, extra)
    a = weights(straight)
    log = records(straight)
    assert [r["step"] for r in log] == [1, 2, 3]
    assert any(r["advantage_abs"] > 0 for r in log) and log[-1]["grad_norm"] > 0
    start = api.load(path).model.state_dict()
    assert any(not torch.equal(start[k], a[k]) for k in a)  # it trained


def test_micro_batch_split_gives_the_same_update(policy, tmp_path):
    path = policy("mdlm")
    one = run(config_for(path, tmp_path / "one", "train.steps=1"))
    split = run(config_for(path, tmp_path / "split", "train.steps=1", "train.micro_batch_size=1",
                           "rollout.batch_size=1"))
    a, b = weights(one), weights(split)
    assert all(torch.allclose(a[k], b[k], rtol=0, atol=1e-6) for k in a)
    assert records(one)[0]["reward"] == records(split)[0]["reward"]


@pytest.mark.parametrize("function,message", [
    ("raises", r"reward function tests\.rl\.reward_helpers:raises raised KeyError: 'answer' "
               r"on prompt \d+ \(addition\[\d+\]: '\d+\+\d+='\)"),
    ("not_a_number", r"reward function tests\.rl\.reward_helpers:not_a_number returned nan on "
                     r"prompt \d+ \(addition\[\d+\]: '\d+\+\d+='\).*must be finite numbers"),
])
def test_a_failing_reward_stops_the_run_naming_it(policy, tmp_path, function, message):
    config = config_for(policy("mdlm"), tmp_path / "r",
                        f"reward.function=tests.rl.reward_helpers:{function}")
    with pytest.raises(RewardError, match=message):
        run(config)
    assert not (tmp_path / "r" / "checkpoints").exists()


def test_config_errors_name_the_key(policy, tmp_path):
    path = policy("hybrid", 2)
    with pytest.raises(ConfigError, match=r"unknown config key 'objective.clip'"):
        config_for(path, tmp_path, "objective.clip=0.1")
    with pytest.raises(ConfigError, match=r"objective.estimator must be one of elbo, one_step, "
                                          r"got 'grpo'"):
        config_for(path, tmp_path, "objective.estimator=grpo")
    with pytest.raises(ConfigError, match=r"unknown config key 'rollout.sampler.seed'"):
        config_for(path, tmp_path, "rollout.sampler.seed=3")
    with pytest.raises(ConfigError, match=r"reference=.* is only read by the KL term"):
        config_for(path, tmp_path, f"reference={path}")
    with pytest.raises(ConfigError, match="'one_step' is for masked-diffusion families"):
        run(config_for(path, tmp_path / "h", "objective.estimator=one_step"))
    with pytest.raises(ConfigError, match=r"rollout.sampler: sampler 'bd3lm' does not use "
                                          r"option\(s\) \['pad_to'\]"):
        run(config_for(policy("bd3lm", 2), tmp_path / "b", "rollout.sampler.pad_to=12"))
    done = run(config_for(policy("mdlm"), tmp_path / "done", "train.steps=1"))
    with pytest.raises(ConfigError, match=r"--set objective.kl_beta would change what the run"):
        resume_config(done, ["objective.kl_beta=1"])
    with pytest.raises(ConfigError, match=r"--resume: .*config.yaml does not exist"):
        resume_config(tmp_path / "nowhere", [])


def test_cli_help(capsys):
    from dlmkit.cli import main

    with pytest.raises(SystemExit) as done:
        main(["rl", "--help"])
    assert done.value.code == 0
    out = capsys.readouterr().out
    for key in ("objective.estimator", "reward.function", "rollout.group_size", "--resume"):
        assert key in out


@pytest.mark.parametrize("strategy,block,estimator", [
    ("scdd", None, "elbo"), ("bd3lm", 2, "one_step"), ("hybrid", 2, "elbo"), ("idlm", 2, "elbo")])
def test_each_family_takes_a_step(policy, tmp_path, strategy, block, estimator):
    done = run(config_for(policy(strategy, block), tmp_path / strategy, "train.steps=1",
                          f"objective.estimator={estimator}", "objective.kl_beta=0.05"))
    (record,) = records(done)
    assert record["step"] == 1 and record["completion_tokens"] >= 1
    assert json.loads((done / "final" / "dlmkit.json").read_text())["strategy"] == strategy
    assert api.load(done / "final").meta["rl"]["estimator"] == estimator
