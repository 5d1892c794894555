"""Mixed precision (dlmkit.train.precision): fp32 master weights, optimizer state and weight
average under bf16 compute, the export in the storage dtype, FSDP2's mixed-precision policy."""

from __future__ import annotations

import json
import warnings

import pytest
import torch

from dlmkit.train.distributed import World
from dlmkit.train.ema import WeightAverage
from dlmkit.train.precision import resolve_precision, source_dtype
from dlmkit.train.recipe import build_components, train_step

from .helpers import cli_args, config, losses, overrides, run_cli

CPU = World(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"))
CONSTANT_LR = ("train.warmup_steps=0", "train.min_lr_ratio=1", "train.ema_decay=0")


def train(steps: int, *extra: str) -> tuple[dict, dict, list[float]]:
    """(weights before, weights after, losses) of ``steps`` steps at a constant lr."""
    cfg = config(*CONSTANT_LR, f"train.steps={steps}", *extra)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # the pure-bf16 opt-in's warning
        c = build_components(cfg, CPU)
    before = {n: p.detach().float().clone() for n, p in c.model.named_parameters()}
    out = [train_step(s, c.step_context(cfg, CPU))["loss"] for s in range(steps)]
    after = {n: p.detach().float().clone() for n, p in c.model.named_parameters()}
    return before, after, out


def update_ratios(reference, other) -> dict[str, tuple[float, int]]:
    """Per tensor: ||update of other|| / ||update of reference|| and the number of entries the
    reference run changed that the other run left exactly as they were."""
    (b0, a0, _), (b1, a1, _) = reference, other
    out = {}
    for name in b0:
        d0, d1 = a0[name] - b0[name], a1[name] - b1[name]
        out[name] = (float(d1.norm() / d0.norm()), int(((d0 != 0) & (d1 == 0)).sum()))
    return out


@pytest.fixture(scope="module")
def fp32_run():
    return train(10, "train.lr=1e-5", "train.autocast=none")


def test_bf16_compute_at_lr_1e5_moves_every_weight_fp32_moves(fp32_run):
    """10 AdamW steps at lr 1e-5 (a fine-tuning rate): bf16 autocast over fp32 masters changes
    every weight the fp32 run changes, by the same relative amount within 5% per tensor."""
    bf16 = train(10, "train.lr=1e-5", "model.dtype=bfloat16")
    assert torch.equal(bf16[0]["lm_head.weight"], fp32_run[0]["lm_head.weight"])  # same start
    for name, (ratio, frozen) in update_ratios(fp32_run, bf16).items():
        assert frozen == 0, f"{name}: {frozen} weights never moved under bf16 compute"
        assert ratio == pytest.approx(1.0, abs=0.05), name


def test_pure_bf16_parameters_lose_the_updates(fp32_run):
    """The control: with bf16 parameters (the explicit opt-in) most weights never move at lr
    1e-5 and norm weights near 1.0 not at all — what fp32 masters prevent. The opt-in warns."""
    with pytest.warns(UserWarning, match="master_dtype=bfloat16"):
        build_components(config("model.dtype=bfloat16", "train.master_dtype=bfloat16"), CPU)
    pure = train(10, "train.lr=1e-5", "model.dtype=bfloat16", "train.master_dtype=bfloat16")
    ratios = update_ratios(fp32_run, pure)
    assert ratios["model.norm.weight"][0] == 0.0
    moved = [1 - frozen / fp32_run[0][n].numel() for n, (_, frozen) in ratios.items()]
    assert max(moved) < 0.5


def test_bf16_autocast_tracks_fp32_losses_over_50_steps():
    """50 steps at the family's lr: bf16 compute (fp32 masters) stays within 0.5% of the fp32
    loss at every step (measured: at most 0.06%)."""
    *_, fp32 = train(50, "train.autocast=none")
    *_, bf16 = train(50, "model.dtype=bfloat16")
    assert fp32[-1] < 0.7 * fp32[0]  # it learned something: the comparison is not of noise
    assert bf16 == pytest.approx(fp32, rel=5e-3)


def exact_average(trajectory: list[torch.Tensor], decay: float) -> torch.Tensor:
    """The weight average's recurrence (warm-up included) in float64."""
    shadow = trajectory[0].double()
    for n, w in enumerate(trajectory[1:]):
        r = min(decay, (1 + n) / (10 + n))
        shadow = r * shadow + (1 - r) * w.double()
    return shadow


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_weight_average_is_the_exact_average_whatever_the_parameter_dtype(dtype):
    """4000 updates at decay 0.999 of weights that drift by ~1e-4 a step: the fp32 shadow
    equals the float64 recurrence to 1e-6 for fp32 and for bf16 parameters (a shadow kept in
    bf16 stalls: its increment is below half an ulp)."""
    torch.manual_seed(0)
    layer = torch.nn.Linear(32, 32, bias=False).to(dtype)
    average = WeightAverage(layer, 0.999)
    assert average.shadow["weight"].dtype == torch.float32
    trajectory = [layer.weight.detach().clone()]
    with torch.no_grad():
        for _ in range(4000):
            layer.weight.add_(1e-4 * torch.randn_like(layer.weight) + 2e-5)
            average.update()
            trajectory.append(layer.weight.detach().clone())
    exact = exact_average(trajectory, 0.999)
    assert (average.shadow["weight"].double() - exact).abs().max() < 1e-6
    with average.applied():  # what validation and the exports see
        assert (layer.weight.double() - exact).abs().max() <= exact.abs().max() * 2 ** -8


def test_weight_average_under_bf16_compute_in_training():
    """The recipe's average under bf16 autocast: fp32, and the exact average of the fp32
    master weights it saw."""
    cfg = config("model.dtype=bfloat16", "train.ema_decay=0.9", "train.steps=6")
    c = build_components(cfg, CPU)
    average = WeightAverage(c.model, 0.9)
    name = "model.layers.0.mlp.up_proj.weight"
    param = dict(c.model.named_parameters())[name]
    assert param.dtype == torch.float32
    trajectory = [param.detach().clone()]
    for s in range(6):
        train_step(s, c.step_context(cfg, CPU))
        average.update()
        trajectory.append(param.detach().clone())
    assert (average.shadow[name].double() - exact_average(trajectory, 0.9)).abs().max() < 1e-6


def test_precision_resolution_and_the_export_dtype(tmp_path):
    """model.dtype null = the source's dtype (float32 for a preset, the directory's config.json
    otherwise): trained weights fp32, frozen weights and the export in that dtype."""
    cpu = torch.device("cpu")
    preset = resolve_precision(config(), cpu)
    assert (preset.master, preset.compute, preset.storage) == (torch.float32, None,
                                                               torch.float32)
    bf16 = resolve_precision(config("model.dtype=bfloat16"), cpu)
    assert (bf16.master, bf16.compute, bf16.storage) == (torch.float32, torch.bfloat16,
                                                         torch.bfloat16)
    assert resolve_precision(config(), torch.device("cuda")).compute == torch.bfloat16
    (tmp_path / "config.json").write_text(json.dumps({"dtype": "bfloat16"}))
    assert source_dtype(str(tmp_path)) == "bfloat16"
    assert source_dtype("tiny-llama") == "float32"


@pytest.mark.slow
def test_bf16_run_exports_bf16_and_a_bf16_checkpoint_keeps_its_dtype(tmp_path):
    """A run with model.dtype bfloat16 trains fp32 masters and exports bf16 weights (config.json
    says so); fine-tuning that export with model.dtype unset exports bf16 again (its source's
    dtype, recorded in config.yaml) while its trained weights are fp32."""
    from safetensors import safe_open

    first = tmp_path / "first"
    run_cli(cli_args(first, "train.steps=2", "model.dtype=bfloat16"))

    def dtypes(final):
        with safe_open(final / "model.safetensors", "pt") as f:
            return {f.get_slice(k).get_dtype() for k in f.keys()}

    assert dtypes(first / "final") == {"BF16"}
    assert json.loads((first / "final" / "config.json").read_text())["dtype"] == "bfloat16"
    second = tmp_path / "second"
    args = ["train", "--output-dir", str(second)]
    for item in overrides("train.steps=2", f"model.name={first / 'final'}"):
        if not item.startswith("model.config="):  # a directory takes no preset overrides
            args += ["--set", item]
    out = run_cli(args)
    assert "model.dtype=bfloat16: the dtype of" in out
    assert "trainable weights, optimizer state and weight average float32" in out
    assert dtypes(second / "final") == {"BF16"}
    assert "dtype: bfloat16" in (second / "config.yaml").read_text()


@pytest.mark.slow
def test_fsdp2_mixed_precision_two_ranks_match_one_process(tmp_path):
    """FSDP2 with the mixed-precision policy (bf16 parameters gathered, fp32 reduction, fp32
    master shards) on 2 gloo ranks gives the losses of one process under bf16 autocast. Not to
    1e-4 as in fp32 (test_distributed): the policy also runs the norm weights and embeddings in
    bf16, which autocast leaves in fp32, so the two differ by bf16 rounding (~0.4% per value);
    1% relative over 4 steps."""
    settings = ["train.steps=4", "train.global_batch_size=16", "train.micro_batch_size=4",
                "train.val_every=4", "model.dtype=bfloat16"]
    single, fsdp = tmp_path / "single", tmp_path / "fsdp2"
    run_cli(cli_args(single, *settings, strategy="hybrid"))
    run_cli(cli_args(fsdp, *settings, "train.distributed=fsdp2", strategy="hybrid"), nproc=2)
    assert losses(fsdp) == pytest.approx(losses(single), rel=1e-2)
    assert losses(fsdp, "validation") == pytest.approx(losses(single, "validation"), rel=1e-2)


def test_fsdp2_wrap_gathers_bf16_parameters_over_fp32_shards(tmp_path):
    """The policy reaches every FSDP2 unit: the forward sees bf16 weights, the sharded
    parameters the optimizer steps stay fp32, and gradients arrive in fp32 (a 1-rank gloo group:
    the policy is per module, not per rank count)."""
    import torch.distributed as dist

    from dlmkit.models import build_model
    from dlmkit.train.distributed import wrap_model
    from dlmkit.train.precision import fsdp_policy

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0,
                            world_size=1)
    try:
        model = build_model("tiny-llama", 300, attention="sdpa",
                            overrides={"hidden_size": 32, "intermediate_size": 64,
                                       "num_hidden_layers": 2})
        seen = []
        for layer in model.model.layers:
            layer.mlp.up_proj.register_forward_pre_hook(
                lambda m, args: seen.append(m.weight.dtype))
        precision = resolve_precision(config("model.dtype=bfloat16"), torch.device("cpu"))
        world = World(rank=0, world_size=2, local_rank=0, device=torch.device("cpu"))
        model = wrap_model(model, world, "fsdp2", mp_policy=fsdp_policy(precision))
        model(torch.randint(0, 300, (2, 8))).logits.float().sum().backward()
        assert seen == [torch.bfloat16, torch.bfloat16]
        assert {p.dtype for p in model.parameters()} == {torch.float32}
        assert {p.grad.dtype for p in model.parameters()} == {torch.float32}
    finally:
        dist.destroy_process_group()


def test_lora_keeps_its_frozen_base_in_bf16_and_its_adapters_in_fp32(tmp_path):
    """model.dtype bfloat16 with LoRA: the frozen base is stored in bf16 (half the memory),
    the adapters it trains are fp32 masters; the merged export is bf16."""
    from safetensors import safe_open

    from dlmkit.train.recipe import export_final

    cfg = config("model.lora={r: 4, alpha: 8, target_modules: [q_proj, v_proj]}",
                 "model.dtype=bfloat16", "train.lr=1e-2", output_dir=tmp_path / "run")
    c = build_components(cfg, CPU)
    dtypes = {(p.requires_grad, p.dtype) for p in c.model.parameters()}
    assert dtypes == {(True, torch.float32), (False, torch.bfloat16)}
    before = {n: p.detach().clone() for n, p in c.model.named_parameters() if p.requires_grad}
    for s in range(2):
        train_step(s, c.step_context(cfg, CPU))
    assert all(not torch.equal(p, before[n]) for n, p in c.model.named_parameters()
               if p.requires_grad and "lora_B" in n)
    final = export_final(tmp_path / "run", c.model, c.tokenizer, cfg, c.strategy, CPU,
                         c.train_set)
    with safe_open(final / "model.safetensors", "pt") as f:
        assert {f.get_slice(k).get_dtype() for k in f.keys()} == {"BF16"}
