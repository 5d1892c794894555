"""LoRA through peft: only adapters train (and get optimizer state), the merged export equals
base + adapter, the adapter export loads in peft and `dlmkit generate`, resume is exact, and
2 ranks (DDP, FSDP2) equal 1 process."""

from __future__ import annotations

import json

import pytest
import torch

pytest.importorskip("peft")

from dlmkit.cli import main  # noqa: E402
from dlmkit.train import ConfigError  # noqa: E402
from dlmkit.train.distributed import World  # noqa: E402
from dlmkit.train.recipe import build_components, export_final, train_step  # noqa: E402

from .helpers import cli_args, config, copy_as_crashed_at, losses, run_cli  # noqa: E402

CPU = World(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"))
LORA = "model.lora={r: 4, alpha: 8, target_modules: [q_proj, v_proj]}"


def train(cfg, steps: int = 3):
    c = build_components(cfg, CPU)
    for step in range(steps):
        train_step(step, c.step_context(cfg, CPU))
    return c


def logits(model, ids):
    model.eval()
    with torch.no_grad():
        return model(input_ids=ids, use_cache=False).logits


def test_only_adapters_train_and_get_optimizer_state(tmp_path):
    cfg = config(LORA, "train.lr=1e-2")
    before = {n: p.detach().clone() for n, p in build_components(cfg, CPU).model.named_parameters()}
    c = train(cfg)
    params = dict(c.model.named_parameters())
    adapters = {n for n in params if ".lora_" in n}
    assert adapters and {n for n, p in params.items() if p.requires_grad} == adapters
    assert len(adapters) == 2 * 2 * 2  # 2 layers x (q, v) x (A, B)
    for name, p in params.items():
        changed = not torch.equal(p.detach(), before[name])
        assert changed == (name in adapters), name
    state_params = {id(p) for p in c.optimizer.state}
    assert state_params == {id(params[n]) for n in adapters}


def test_merged_export_is_base_plus_adapter(tmp_path, capsys):
    from transformers import AutoModelForCausalLM

    cfg = config(LORA, "train.lr=1e-2", output_dir=tmp_path / "run")
    c = train(cfg)
    final = export_final(tmp_path / "run", c.model, c.tokenizer, cfg, c.strategy, CPU,
                         c.train_set)
    merged = AutoModelForCausalLM.from_pretrained(final, local_files_only=True)
    assert not any("lora" in n for n, _ in merged.named_parameters())
    q = c.model.model.layers[1].self_attn.q_proj
    by_hand = q.base_layer.weight + (q.lora_B["default"].weight @ q.lora_A["default"].weight) * 2
    torch.testing.assert_close(merged.model.layers[1].self_attn.q_proj.weight, by_hand)
    ids = torch.tensor([[1, 5, 7, 9, 11]])
    torch.testing.assert_close(logits(merged, ids), logits(c.model, ids), rtol=1e-5, atol=1e-5)
    meta = json.loads((final / "dlmkit.json").read_text())
    assert main(["generate", "--model", str(final), "--prompt", "rev ab", "--max-new-tokens",
                 "4", "--sampler", meta["strategy"]]) == 0
    assert "> rev ab" in capsys.readouterr().out


def test_modules_to_save_train_in_full_and_merge(tmp_path):
    from transformers import AutoModelForCausalLM

    cfg = config("model.lora={r: 4, target_modules: [q_proj], modules_to_save: [embed_tokens]}",
                 "train.lr=1e-2", output_dir=tmp_path / "run")
    start = build_components(cfg, CPU).model.model.embed_tokens.original_module.weight.clone()
    c = train(cfg, steps=2)
    wrapper = c.model.model.embed_tokens
    trained = wrapper.modules_to_save["default"].weight
    assert trained.requires_grad and not wrapper.original_module.weight.requires_grad
    assert not torch.equal(trained, start) and torch.equal(wrapper.original_module.weight, start)
    final = export_final(tmp_path / "run", c.model, c.tokenizer, cfg, c.strategy, CPU,
                         c.train_set)
    merged = AutoModelForCausalLM.from_pretrained(final, local_files_only=True)
    assert torch.equal(merged.model.embed_tokens.weight, trained.detach())
    ids = torch.tensor([[1, 5, 7, 9, 11]])
    torch.testing.assert_close(logits(merged, ids), logits(c.model, ids), rtol=1e-5, atol=1e-5)


def test_lora_with_gradient_checkpointing_gives_the_same_gradients():
    def grads(*extra):
        from dlmkit.train.recipe import accumulate_gradients

        cfg = config(LORA, *extra)
        c = build_components(cfg, CPU)
        loss, _ = accumulate_gradients(0, c.step_context(cfg, CPU))
        return loss, {n: p.grad for n, p in c.model.named_parameters() if p.grad is not None}

    loss, plain = grads()
    ckpt_loss, ckpt = grads("model.gradient_checkpointing=true")
    assert ckpt_loss == loss and plain.keys() == ckpt.keys() and len(plain) == 8
    for name, grad in plain.items():
        torch.testing.assert_close(ckpt[name], grad, rtol=0, atol=0, msg=name)


@pytest.fixture
def base_dir(tmp_path):
    """A local 'pretrained' model: the tiny preset saved once, as a user's base model."""
    from dlmkit.data import ByteTokenizer
    from dlmkit.models import build_model

    torch.manual_seed(1)
    path = tmp_path / "base"
    build_model("tiny-llama", ByteTokenizer().vocab_size, attention="sdpa").save_pretrained(path)
    return path


def test_adapter_export_loads_in_peft_and_generate(tmp_path, base_dir):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from dlmkit.generate import load
    from dlmkit.train import load_config

    from .helpers import overrides

    items = [o for o in overrides() if not o.startswith("model.config=")]  # a base dir, no preset
    cfg = load_config(None, [*items, f"model.name={base_dir}", f"output_dir={tmp_path / 'run'}",
                             "model.lora={r: 4, target_modules: all-linear, export: adapter}",
                             "train.lr=1e-2"])
    c = train(cfg, steps=2)
    final = export_final(tmp_path / "run", c.model, c.tokenizer, cfg, c.strategy, CPU,
                         c.train_set)
    assert (final / "adapter_config.json").is_file() and not (final / "config.json").exists()
    base = AutoModelForCausalLM.from_pretrained(base_dir, local_files_only=True)
    adapted = PeftModel.from_pretrained(base, final)
    ids = torch.tensor([[1, 5, 7, 9, 11]])
    torch.testing.assert_close(logits(adapted, ids), logits(c.model, ids), rtol=1e-5,
                               atol=1e-5)
    loaded = load(final)
    torch.testing.assert_close(logits(loaded.model, ids), logits(c.model, ids), rtol=1e-5,
                               atol=1e-5)


def test_resume_is_bit_exact(tmp_path):
    steps = ["train.steps=6", "train.save_every=3", LORA]
    full = tmp_path / "full"
    main(cli_args(full, *steps))
    resumed = tmp_path / "resumed"
    copy_as_crashed_at(full, resumed, 3)
    main([*cli_args(resumed, *steps), "--resume"])
    assert losses(resumed) == losses(full) and len(losses(full)) == 6


@pytest.mark.parametrize(("lora", "problem"), [
    ("{r: 4, target_modules: [q_proj, query]}",
     r"LlamaForCausalLM has no linear layer named \['query'\]; its linear layers: \['down_proj', "
     r"'gate_proj', 'k_proj', 'lm_head', 'o_proj', 'q_proj', 'up_proj', 'v_proj'\]"),
    ("{export: adapter}", "export=adapter needs model.name to be a local model directory"),
    ("{modules_to_save: [embeddings]}",
     r"modules_to_save: LlamaForCausalLM has no module named \['embeddings'\]; e.g. .*"
     "'embed_tokens'"),
])
def test_bad_lora_setup(lora, problem):
    with pytest.raises(ValueError, match=problem):
        build_components(config(f"model.lora={lora}"), CPU)


@pytest.mark.parametrize(("lora", "problem"), [
    ("{rank: 4}", r"model.lora: unknown key\(s\) \['rank'\]; valid: \['alpha', 'dropout', "
                  r"'export', 'modules_to_save', 'r', 'target_modules'\]"),
    ("{modules_to_save: embed_tokens}", "modules_to_save must be a list of module names"),
    ("{r: 0}", "model.lora.r must be an int >= 1"),
    ("{dropout: 1.5}", r"model.lora.dropout must be a number in \[0, 1\)"),
    ("{target_modules: q_proj}", "must be 'all-linear' or a non-empty list"),
    ("{export: full}", r"model.lora.export must be one of \('merged', 'adapter'\)"),
    ("8", "model.lora must be a mapping"),
])
def test_bad_lora_config(lora, problem):
    with pytest.raises(ConfigError, match=problem):
        config(f"model.lora={lora}")


SETTINGS = ["train.steps=3", "train.global_batch_size=16", "train.micro_batch_size=4",
            "train.val_every=3", "train.save_every=1000", LORA]


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["ddp", "fsdp2"])
def test_two_ranks_match_one_process(tmp_path, kind):
    from transformers import AutoModelForCausalLM

    single = tmp_path / "single"
    run_cli(cli_args(single, *SETTINGS))
    run_dir = tmp_path / kind
    run_cli(cli_args(run_dir, *SETTINGS, f"train.distributed={kind}"), nproc=2)
    assert losses(run_dir) == pytest.approx(losses(single), rel=1e-4)
    one = AutoModelForCausalLM.from_pretrained(single / "final", local_files_only=True)
    two = AutoModelForCausalLM.from_pretrained(run_dir / "final", local_files_only=True)
    for (name, a), (_, b) in zip(one.named_parameters(), two.named_parameters()):
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-5, msg=name)
