"""dlmkit rl with LoRA on the policy (``lora: {r, ...}``): only the adapters train, the KL
reference is the policy's own base (its adapters off, no second copy), and RUN/final is a
plain model directory of the family, the adapters merged."""

from __future__ import annotations

import json

import pytest
import torch

from dlmkit.generate import api
from dlmkit.rl import run
from dlmkit.rl.loop import build_policy, resume_config
from dlmkit.train.config import ConfigError
from dlmkit.train.distributed import World

from .test_loop import check_resume_is_bit_exact, config_for, records, weights

pytest.importorskip("peft")
CPU = World(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"))
LORA = "lora={r: 4, alpha: 8, target_modules: [q_proj, v_proj]}"


def test_adapters_disabled_computes_the_base_and_restores_training():
    from dlmkit.models.lora import adapters_disabled, apply_lora
    from tests.generate.helpers import tiny_model

    base = tiny_model()
    model = apply_lora(tiny_model(), {"r": 4, "alpha": 8, "target_modules": ["q_proj"],
                                      "modules_to_save": ["lm_head"]})
    with torch.no_grad():  # adapters that change the output
        for name, q in model.named_parameters():
            if "lora_B" in name or "modules_to_save" in name:
                q.add_(0.05)
    ids = torch.tensor([[5, 6, 7, 8]])
    plain = base(input_ids=ids).logits
    adapted = model(input_ids=ids).logits
    assert not torch.allclose(adapted, plain)
    trainable = {n for n, q in model.named_parameters() if q.requires_grad}
    assert trainable and all("lora_" in n or "modules_to_save" in n for n in trainable)
    with adapters_disabled(model):
        assert torch.equal(model(input_ids=ids).logits, plain)
    assert torch.equal(model(input_ids=ids).logits, adapted)
    assert {n for n, q in model.named_parameters() if q.requires_grad} == trainable


def test_a_lora_policy_trains_only_its_adapters_and_exports_merged(policy, tmp_path):
    path = policy("mdlm")
    config = config_for(path, tmp_path / "run", LORA, "objective.kl_beta=0.5")
    p = build_policy(config, CPU)
    assert p.reference is None and p.base_reference  # no second copy of the model
    names = [n for n, q in p.model.named_parameters() if q.requires_grad]
    assert names and all("lora_" in n for n in names)
    assert p.trainable == sum(q.numel() for q in p.model.parameters() if q.requires_grad)
    run_dir = run(config)
    log = records(run_dir)
    # step 1 scores the policy before any update: adapters at init (B = 0) = its base
    assert log[0]["kl"] == 0 and log[-1]["kl"] > 0 and log[-1]["grad_norm"] > 0
    final = run_dir / "final"
    merged = weights(run_dir)
    assert not any("lora" in k for k in merged)  # a plain model directory
    start = api.load(path).model.state_dict()
    assert merged.keys() == start.keys()
    changed = [k for k in merged if not torch.equal(merged[k], start[k])]
    # only what the adapters touch moved: the q and v projections
    assert changed and all(k.endswith(("q_proj.weight", "v_proj.weight")) for k in changed)
    meta = json.loads((final / "dlmkit.json").read_text())
    assert meta["strategy"] == "mdlm" and meta["rl"]["policy"] == str(path)
    loaded = api.load(final)
    assert loaded.meta["strategy"] == "mdlm"


def test_a_lora_run_resumes_bit_exactly(policy, tmp_path):
    path = policy("bd3lm", 2)
    extra = [LORA, "objective.kl_beta=0.1", "objective.updates_per_rollout=2"]
    _, first = check_resume_is_bit_exact(path, tmp_path, extra)
    with pytest.raises(ConfigError, match=r"--set lora.r would change what the run trains"):
        resume_config(first, ["lora.r=8"])


def test_lora_config_errors_name_the_key(policy, tmp_path):
    path = policy("mdlm")
    with pytest.raises(ConfigError, match=r"lora.r must be an int >= 1, got 0"):
        config_for(path, tmp_path, "lora={r: 0}")
    with pytest.raises(ConfigError, match=r"lora.export: rl writes the trained policy as a "
                                          r"model directory of its family.*got export='adapter'"):
        config_for(path, tmp_path, "lora={r: 4, export: adapter}")
    with pytest.raises(ConfigError, match=r"lora.target_modules: .* has no linear layer named "
                                          r"\['nope'\]"):
        run(config_for(path, tmp_path / "x", "lora={r: 4, target_modules: [nope]}"))
