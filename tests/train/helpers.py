"""Tiny CPU runs of the SFT recipe for the tests."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from dlmkit.train import RunConfig, load_config

TINY = [
    "model.config={hidden_size: 64, intermediate_size: 128, num_hidden_layers: 2, "
    "num_attention_heads: 4, num_key_value_heads: 4}",
    "data.num_train=64",
    "data.num_validation=16",
    "train.global_batch_size=8",
    "train.micro_batch_size=8",
    "train.warmup_steps=2",
    "train.log_every=1",
    "train.val_every=1000",
    "train.save_every=1000",
    "train.progress=false",
    "train.threads=1",
]


_TARGETS: dict[str, Path] = {}


def tiny_target(hidden_size: int = 64, num_layers: int = 3) -> Path:
    """A randomly initialised tiny causal LM directory (byte tokenizer vocabulary), made once
    per process: the frozen target a ``dflash`` run drafts for."""
    import tempfile

    key = f"{hidden_size}x{num_layers}"
    if key not in _TARGETS:
        import torch

        from dlmkit.data import load_tokenizer
        from dlmkit.models import build_model

        path = Path(tempfile.mkdtemp(prefix="dlmkit-target-")) / key
        tokenizer = load_tokenizer("byte")
        torch.manual_seed(1234)
        model = build_model("tiny-llama", tokenizer.vocab_size, attention="sdpa",
                            overrides={"hidden_size": hidden_size, "num_hidden_layers": num_layers,
                                       "intermediate_size": 2 * hidden_size})
        model.save_pretrained(path)
        tokenizer.save_pretrained(path)
        _TARGETS[key] = path
    return _TARGETS[key]


def overrides(*extra: str, strategy: str = "mdlm") -> list[str]:
    opts = [f"strategy.name={strategy}"]
    if strategy in ("bd3lm", "hybrid", "idlm", "dflash", "block_diffusion"):
        opts.append("strategy.block_size=4")
    if strategy == "dflash":  # a drafter needs a frozen target (the TINY hidden size, 64)
        opts += [f"strategy.target={tiny_target()}", "strategy.num_blocks_per_sample=3"]
    return TINY + opts + list(extra)


def config(*extra: str, strategy: str = "mdlm", output_dir: Path | None = None) -> RunConfig:
    items = overrides(*extra, strategy=strategy)
    if output_dir is not None:
        items.append(f"output_dir={output_dir}")
    return load_config(None, items)


def cli_args(run_dir: Path, *extra: str, strategy: str = "mdlm") -> list[str]:
    args = ["train", "--output-dir", str(run_dir)]
    for item in overrides(*extra, strategy=strategy):
        args += ["--set", item]
    return args


def copy_as_crashed_at(run_dir: Path, copy: Path, step: int) -> None:
    """``copy`` = ``run_dir`` as after a crash just past the step-``step`` checkpoint: no
    ``final/``, no later checkpoint, ``latest`` naming that one."""
    name = f"step_{step:07d}"
    shutil.copytree(run_dir, copy)
    shutil.rmtree(copy / "final")
    for path in (copy / "checkpoints").iterdir():
        if path.name not in (name, "latest"):
            shutil.rmtree(path) if path.is_dir() else path.unlink()
    (copy / "checkpoints" / "latest").write_text(name)


def rewrite_checkpoint_config(checkpoint: Path, config: dict) -> None:
    """Replace ``checkpoint/config.yaml`` (as an older dlmkit would have written it), with its
    size in ``manifest.json`` updated so the checkpoint still reads as complete."""
    from dlmkit.train.config import dump_yaml

    saved = checkpoint / "config.yaml"
    saved.write_text(dump_yaml(config))
    manifest = checkpoint / "manifest.json"
    listed = json.loads(manifest.read_text())
    listed["files"]["config.yaml"] = saved.stat().st_size
    manifest.write_text(json.dumps(listed))


def records(run_dir: Path, split: str = "train") -> list[dict]:
    lines = (Path(run_dir) / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["split"] == split]


def losses(run_dir: Path, split: str = "train") -> list[float]:
    return [r["loss"] for r in records(run_dir, split)]


def env() -> dict:
    e = dict(os.environ, OMP_NUM_THREADS="1", TQDM_DISABLE="1")
    e.pop("WORLD_SIZE", None)
    return e


def cli_subprocess(args: list[str], *, nproc: int = 0, **kwargs) -> subprocess.Popen:
    """``python -m dlmkit.cli ARGS`` (or under torchrun with ``nproc`` ranks)."""
    if nproc:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               "--nproc-per-node", str(nproc), "-m", "dlmkit.cli", *args]
    else:
        cmd = [sys.executable, "-m", "dlmkit.cli", *args]
    return subprocess.Popen(cmd, env=env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, **kwargs)


def run_cli(args: list[str], *, nproc: int = 0, timeout: float = 300, **kwargs) -> str:
    proc = cli_subprocess(args, nproc=nproc, **kwargs)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
        raise AssertionError(f"timed out after {timeout}s:\n{out[-4000:]}") from None
    assert proc.returncode == 0, out[-4000:]
    return out
