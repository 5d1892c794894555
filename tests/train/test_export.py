"""The exported model directory (RUN/final, `dlmkit export`) and loading model directories.

Before: final/ of the byte tokenizer had no tokenizer transformers could load and config.json /
generation_config.json kept a preset's `bos 1, eos 2, pad null` (ordinary byte tokens), so
plain transformers `generate()` never stopped at the end of a turn; model.safetensors was
written 0600; a run directory, a checkpoint or a model directory without weights passed as
--model / model.name failed with --sampler advice or transformers' OSError; a checkpoint step
could not be exported; transformers' "Loading weights" bar went into dlmkit's output.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import stat
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from dlmkit.cli import main
from dlmkit.data import ByteTokenizer, load_tokenizer
from dlmkit.models import build_model, check_model_directory, quiet_transformers
from dlmkit.train import run
from tests.data.helpers import build_hf_tokenizer

from .helpers import config


@pytest.fixture(scope="module")
def ar_run(tmp_path_factory) -> Path:
    """A 2-step `ar` run with a weight average, final/ = the last step, a checkpoint per step,
    written under the usual umask 022."""
    old = os.umask(0o022)
    try:
        return run(config("train.steps=2", "train.save_every=1", "train.ema_decay=0.9",
                          "train.final_model=last", strategy="ar",
                          output_dir=tmp_path_factory.mktemp("export") / "run"))
    finally:
        os.umask(old)


def weights(directory: Path) -> dict[str, torch.Tensor]:
    return load_file(directory / "model.safetensors")


class ForceAfter:
    """A logits processor: from the ``n``-th new token on, only ``token`` can be chosen."""

    def __init__(self, prompt_len: int, n: int, token: int) -> None:
        self.at, self.token = prompt_len + n - 1, token

    def __call__(self, input_ids, scores):
        if input_ids.shape[1] >= self.at:
            scores = torch.full_like(scores, -torch.inf)
            scores[:, self.token] = 0
        return scores


def test_final_is_a_model_directory_plain_transformers_generates_with(ar_run):
    from transformers import AutoModelForCausalLM, AutoTokenizer, LogitsProcessorList

    final, byte = ar_run / "final", ByteTokenizer()
    end = byte.token_to_id("<|end|>")
    tokenizer = AutoTokenizer.from_pretrained(str(final), local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(str(final), local_files_only=True)
    for file in ("config.json", "generation_config.json"):
        ids = json.loads((final / file).read_text())
        assert (ids["bos_token_id"], ids["eos_token_id"], ids["pad_token_id"]) == (
            byte.bos_token_id, [end, byte.eos_token_id], byte.pad_token_id), file
    msgs = [{"role": "user", "content": "rev abc"}]
    prompt = tokenizer.apply_chat_template(msgs, add_generation_prompt=True, return_dict=True,
                                           return_tensors="pt")
    assert prompt["input_ids"][0].tolist() == byte.apply_chat_template(msgs, True).input_ids
    n = prompt["input_ids"].shape[1]
    # The untrained model would not emit <|end|> by itself: force it as the 3rd new token and
    # after. generate() must stop there (before: it ran to max_new_tokens, eos being 2).
    out = model.generate(**prompt, max_new_tokens=20, do_sample=False,
                         logits_processor=LogitsProcessorList([ForceAfter(n, 3, end)]))
    assert out.shape[1] == n + 3 and out[0, -1].item() == end
    assert tokenizer.decode(out[0, n:], skip_special_tokens=True) == \
        byte.decode(out[0, n:].tolist(), skip_special_tokens=True)


def test_dlmkit_still_loads_its_export(ar_run, capsys):
    assert isinstance(load_tokenizer(ar_run / "final"), ByteTokenizer)
    assert main(["generate", "--model", str(ar_run / "final"), "--prompt", "rev ab",
                 "--max-new-tokens", "4"]) == 0
    assert "sampler: ar" in capsys.readouterr().out


def test_exported_files_are_readable_by_others(ar_run):
    # Before: model.safetensors was 0600 (safetensors writes through a private temporary file).
    modes = {f.name: stat.S_IMODE(f.stat().st_mode) for f in (ar_run / "final").iterdir()}
    assert modes == dict.fromkeys(modes, 0o644) and "model.safetensors" in modes


def test_bpe_tokenizer_export(tmp_path):
    """An HF (BPE, ChatML) tokenizer: final/ carries it with the chat template training used in
    tokenizer_config.json, and the end-of-turn token <|im_end|> as the first EOS."""
    from transformers import AutoTokenizer

    source = tmp_path / "tok"
    build_hf_tokenizer(pad=True).save_pretrained(str(source))
    run_dir = run(config("train.steps=1", f"data.tokenizer={source}", strategy="ar",
                         output_dir=tmp_path / "run"))
    final = run_dir / "final"
    ours = load_tokenizer(final)
    hf = AutoTokenizer.from_pretrained(str(final), local_files_only=True)
    assert json.loads((final / "tokenizer_config.json").read_text())["chat_template"]
    msgs = [{"role": "user", "content": "rev abc"}, {"role": "assistant", "content": "cba"}]
    assert hf.apply_chat_template(msgs, return_dict=True)["input_ids"] == \
        ours.apply_chat_template(msgs).input_ids
    im_end = hf.convert_tokens_to_ids("<|im_end|>")
    generation = json.loads((final / "generation_config.json").read_text())
    assert generation["eos_token_id"] == [im_end, ours.eos_token_id]
    assert (generation["bos_token_id"], generation["pad_token_id"]) == (
        ours.bos_token_id, ours.pad_token_id)


# ----------------------------------------------------------------------- dlmkit export


def test_export_a_checkpoint_step(ar_run, tmp_path, capsys):
    out = tmp_path / "step2"
    assert main(["export", str(ar_run), "--step", "2", "--output", str(out)]) == 0
    assert f"exported step 2 of {ar_run} (average weights) to {out}" in capsys.readouterr().out
    # The last step with its weight average is exactly what the run exported as final/.
    final, exported = weights(ar_run / "final"), weights(out)
    assert final.keys() == exported.keys()
    assert all(torch.equal(final[k], exported[k]) for k in final)
    meta = json.loads((out / "dlmkit.json").read_text())
    final_meta = json.loads((ar_run / "final" / "dlmkit.json").read_text())
    assert {k: v for k, v in meta.items() if k != "exported_from"} == final_meta
    assert meta["exported_from"] == {"run": str(ar_run), "step": 2, "weights": "average",
                                     "checkpoint": str(ar_run / "checkpoints" / "step_0000002")}
    assert {stat.S_IMODE(f.stat().st_mode) for f in out.iterdir()} == {
        0o666 & ~_umask()}
    assert main(["generate", "--model", str(out), "--prompt", "rev ab",
                 "--max-new-tokens", "2"]) == 0


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_export_raw_weights_an_earlier_step_and_a_checkpoint_path(ar_run, tmp_path, capsys):
    raw = tmp_path / "raw"
    assert main(["export", str(ar_run), "--output", str(raw), "--no-average"]) == 0
    assert "exported step 2" in capsys.readouterr().out  # default: the newest checkpoint
    final, got = weights(ar_run / "final"), weights(raw)
    assert not all(torch.equal(final[k], got[k]) for k in final)
    state = torch.load(ar_run / "checkpoints" / "step_0000002" / "state.pt")["model"]
    assert all(torch.equal(state[k], got[k]) for k in got)
    step1 = tmp_path / "step1"
    assert main(["export", str(ar_run / "checkpoints" / "step_0000001"),
                 "--output", str(step1)]) == 0
    assert json.loads((step1 / "dlmkit.json").read_text())["exported_from"]["step"] == 1


def test_export_errors(ar_run, tmp_path):
    with pytest.raises(SystemExit, match=r"--step 7: .* has no checkpoint of that step; its "
                                         r"steps: 1, 2"):
        main(["export", str(ar_run), "--step", "7", "--output", str(tmp_path / "x")])
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "keep.txt").write_text("mine")
    with pytest.raises(SystemExit, match="exists and is not empty; pass --overwrite"):
        main(["export", str(ar_run), "--output", str(taken)])
    assert main(["export", str(ar_run), "--output", str(taken), "--overwrite"]) == 0
    assert not (taken / "keep.txt").exists() and (taken / "model.safetensors").is_file()
    with pytest.raises(SystemExit, match=r"holds no checkpoints"):
        main(["export", str(ar_run / "final"), "--output", str(tmp_path / "y")])
    with pytest.raises(SystemExit, match=r"--step 1 contradicts"):
        main(["export", str(ar_run / "checkpoints" / "step_0000002"), "--step", "1",
              "--output", str(tmp_path / "z")])


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")
def test_export_a_distributed_checkpoint(ar_run, tmp_path):
    """A torchrun (DDP) checkpoint: torch.distributed.checkpoint files, the weight average
    named after the DDP wrapper's parameters ("module.<name>")."""
    import torch.distributed.checkpoint as dcp

    from dlmkit.train.checkpoint import MANIFEST, _files

    copy = tmp_path / "run"
    shutil.copytree(ar_run, copy, ignore=shutil.ignore_patterns("step_0000001", "final"))
    step = copy / "checkpoints" / "step_0000002"
    state = torch.load(step / "state.pt")
    shadow = {f"module.{k}": v for k, v in state["ema"]["shadow"].items()}
    dcp.save({"model": state["model"], "ema": {"updates": state["ema"]["updates"],
                                               "shadow": shadow}},
             checkpoint_id=str(step / "state"))
    (step / "state.pt").unlink()
    (step / MANIFEST).write_text(json.dumps({"step": 2, "files": _files(step)}))
    out = tmp_path / "out"
    assert main(["export", str(copy), "--output", str(out)]) == 0
    final, exported = weights(ar_run / "final"), weights(out)
    assert all(torch.equal(final[k], exported[k]) for k in final)


# ---------------------------------------------------------- what a model directory is


@pytest.mark.parametrize("command", [["generate", "--prompt", "a"], ["eval"],
                                     ["generate", "--prompt", "a", "--sampler", "ar"]])
def test_a_run_directory_or_checkpoint_as_model_says_what_to_pass(ar_run, command):
    # Before: "has no dlmkit.json ... pass --sampler", then a missing-tokenizer error.
    with pytest.raises(SystemExit, match=rf"--model {ar_run} is a training run directory, not a "
                                         rf"model directory; pass {ar_run / 'final'}; to use a "
                                         rf"checkpoint, export it with `dlmkit export {ar_run} "
                                         r"--step N --output DIR` \(steps: 1, 2\)"):
        main([command[0], "--model", str(ar_run), *command[1:]])
    step = ar_run / "checkpoints" / "step_0000001"
    with pytest.raises(SystemExit, match=rf"--model {step} is a training checkpoint \(step 1 of "
                                         rf"run {ar_run}: .*\), not a model directory \(the "
                                         r"run's exported model is .*final\)\. Export it as one "
                                         rf"with `dlmkit export {ar_run} --step 1 --output "
                                         r"DIR` and pass DIR\."):
        main([command[0], "--model", str(step), *command[1:]])


def test_run_directory_messages_name_best_and_a_run_without_final(tmp_path):
    run_dir = tmp_path / "r"
    (run_dir / "best").mkdir(parents=True)
    (run_dir / "config.yaml").write_text("{}")
    with pytest.raises(ValueError, match=r"has no exported model yet \(final/ is written when "
                                         r"training ends\)\.$"):
        check_model_directory(run_dir)
    for name in ("final", "best"):
        (run_dir / name).mkdir(exist_ok=True)
        (run_dir / name / "config.json").write_text("{}")
    (run_dir / "checkpoints").mkdir()
    for path in (run_dir, run_dir / "checkpoints"):
        with pytest.raises(ValueError, match=rf"--model {run_dir} is a training run directory, "
                                             r"not a model directory; pass .*final \(or .*best, "
                                             r"the best model by validation loss so far\)\.$"):
            check_model_directory(path)


def test_a_model_directory_without_weights(ar_run, tmp_path, capsys):
    bare = tmp_path / "bare"
    shutil.copytree(ar_run / "final", bare, ignore=shutil.ignore_patterns("model.safetensors"))
    held = "config.json, dlmkit.json, dlmkit_tokenizer.json, generation_config.json, " \
           "tokenizer.json, tokenizer_config.json"
    # Before: OSError: Error no file named model.safetensors ...
    with pytest.raises(SystemExit, match=rf"--model {bare} has config.json but no model "
                                         r"weights \(expected model.safetensors, "
                                         r"model.safetensors.index.json, pytorch_model.bin or "
                                         rf"pytorch_model.bin.index.json\); it holds: {held}\. "
                                         r"Copy the weights file\(s\) into it"):
        main(["generate", "--model", str(bare), "--prompt", "a"])
    with pytest.raises(SystemExit, match=rf"model.name {bare} has config.json but no model "
                                         r"weights"):
        main(["train", "--output-dir", str(tmp_path / "run"), "--set", "strategy.name=ar",
              "--set", f"model.name={bare}", "--set", "data.num_train=8", "--set",
              "train.threads=1"])
    (bare / "model.safetensors.index.json").write_text(json.dumps(
        {"weight_map": {"a": "model-00001-of-00002.safetensors",
                        "b": "model-00002-of-00002.safetensors"}}))
    shutil.copy(ar_run / "final" / "model.safetensors", bare / "model-00001-of-00002.safetensors")
    with pytest.raises(ValueError, match=r"1 of the 2 weight shards model.safetensors.index.json "
                                         r"lists are missing: model-00002-of-00002.safetensors"):
        check_model_directory(bare, "model.name")


class Keep(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record) -> None:
        self.lines.append(record.getMessage())


def test_loading_prints_no_progress_bar_but_keeps_warnings(ar_run, capfd):
    from transformers.utils import logging as hf_logging

    bars, level = hf_logging.is_progress_bar_enabled(), hf_logging.get_verbosity()
    hf_logging.enable_progress_bar()  # the recipe turns it off when stderr is not a terminal
    kept = Keep()
    logging.getLogger("transformers").addHandler(kept)
    try:
        capfd.readouterr()
        build_model(str(ar_run / "final"), 264, attention="sdpa")
        assert "Loading weights" not in capfd.readouterr().err
        hf_logging.set_verbosity_info()
        logger = hf_logging.get_logger("transformers.dlmkit_test")
        with quiet_transformers():
            logger.info("an info line")
            logger.warning("a real warning")
        logger.info("info after")
        assert kept.lines == ["a real warning", "info after"]  # the level is restored too
        assert hf_logging.is_progress_bar_enabled()
    finally:
        logging.getLogger("transformers").removeHandler(kept)
        hf_logging.set_verbosity(level)
        if not bars:
            hf_logging.disable_progress_bar()
