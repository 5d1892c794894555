"""The "adding a family" guide (docs/adding_a_family.md) walked through with its example:
Mask-Predict (tests/families/maskpredict/), one folder plus one registration. Everything else
(training, export, ``generate`` and its flags, ``eval``, the server's options) comes from the
registry."""

from __future__ import annotations

import json

import pytest
import torch

from dlmkit import families, strategies
from dlmkit.cli import main
from dlmkit.generate import generate, load, sampler_config
from tests.families.maskpredict import FAMILY
from tests.families.maskpredict.decode import sample_maskpredict
from tests.generate.helpers import MASK, TOK, tiny_model
from tests.train.helpers import TINY


@pytest.fixture
def registered():
    families.register(FAMILY)
    yield FAMILY
    del families._REGISTRY[FAMILY.name]


def test_register_checks_what_it_is_given(registered):
    with pytest.raises(ValueError, match="'maskpredict' is already registered"):
        families.register(FAMILY)
    with pytest.raises(TypeError, match="takes a dlmkit.families.Family, got dict"):
        families.register({"name": "x"})


def test_the_registered_family_trains_exports_and_decodes(registered, tmp_path, capsys):
    assert "maskpredict" in strategies.names() and "maskpredict" in families.names()
    run = tmp_path / "run"
    sets = [a for item in TINY + ["strategy.name=maskpredict", "train.steps=2"]
            for a in ("--set", item)]
    main(["train", *sets, "--output-dir", str(run)])
    meta = json.loads((run / "final" / "dlmkit.json").read_text())
    assert meta["strategy"] == "maskpredict"
    loaded = load(run / "final")
    config = loaded.config(max_new_tokens=6, steps=3)
    assert type(config).__name__ == "MaskPredictSampling" and config.sampler == "maskpredict"
    result = generate(loaded.model, loaded.tokenizer, ["rev abc"], config)
    assert result.forwards == 3
    capsys.readouterr()
    # the command line: its own option as a flag, generated from the dataclass
    with pytest.raises(SystemExit):
        main(["generate", "--help"])
    assert "--final-argmax" in capsys.readouterr().out
    assert main(["generate", "--model", str(run / "final"), "--prompt", "rev abc",
                 "--max-new-tokens", "4", "--steps", "2", "--no-final-argmax",
                 "--temperature", "1.0"]) in (0, None)
    with pytest.raises(SystemExit, match=r"does not use option\(s\) \['threshold'\]"):
        main(["generate", "--model", str(run / "final"), "--prompt", "rev abc",
              "--threshold", "0.9"])


def test_mask_predict_remasks_an_early_guess(registered):
    """Its reason to exist: a token committed at step 1 can change later (mdlm's cannot). With
    a model that is unsure of column 0 at first and sure of another token once the rest is
    filled, step 1 commits one token, step 2 re-masks it and writes the other."""

    class Flip(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.config = None
            self.weight = torch.nn.Parameter(torch.zeros(1))

        def forward(self, input_ids, attention_mask=None, position_ids=None, **kw):
            B, L = input_ids.shape
            logits = torch.zeros(B, L, TOK.vocab_size)
            masked = int((input_ids == MASK).sum())
            # while 2+ masks remain every column is unsure, token 70 slightly ahead; with one
            # mask left, the model is sure of token 71 everywhere
            logits[..., 70] = 0.1 if masked >= 2 else 0.0
            logits[..., 71] = 0.0 if masked >= 2 else 9.0
            return logits

    from dlmkit.decoding.runner import Runner

    cfg = sampler_config("maskpredict", max_new_tokens=2, steps=2)
    out = sample_maskpredict(Runner(Flip(), TOK.vocab_size), [[65, 66]], cfg, mask_id=MASK,
                             pad_id=TOK.pad_token_id, generator=[torch.Generator()])
    # step 1 wrote 70 in both columns and re-masked one (the least confident); step 2 saw one
    # mask and wrote 71 there, keeping the other 70
    assert sorted(out[0].tolist()) == [70, 71]


def test_mask_predict_is_batch_invariant(registered):
    model = tiny_model()
    cfg = sampler_config("maskpredict", max_new_tokens=6, steps=3, temperature=1.0,
                         final_argmax=False)
    prompts = ["rev abc", "rev hello", "rev x"]
    together = generate(model, TOK, prompts, cfg).tokens
    alone = [generate(model, TOK, [p], cfg, first_index=i).tokens[0]
             for i, p in enumerate(prompts)]
    assert together == alone


def _plugin_dir(root, entry: str):
    """A directory that, on sys.path, holds an installed distribution declaring ``entry`` in
    the ``dlmkit.families`` entry-point group (what ``pip install`` of a package with
    ``[project.entry-points."dlmkit.families"]`` leaves in site-packages)."""
    info = root / "maskpredict_plugin-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: maskpredict-plugin\n"
                                   "Version: 0.1\n")
    (info / "entry_points.txt").write_text(f"[{families.ENTRY_POINTS}]\n{entry}\n")
    return root


def test_an_installed_package_s_family_reaches_every_command(tmp_path):
    """Declared as an entry point, the family trains, exports and decodes from the command line
    in a fresh process, without any code calling register()."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    plugins = _plugin_dir(tmp_path / "site", "maskpredict = tests.families.maskpredict")
    env = dict(os.environ, OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join([str(plugins), str(root)]))
    run = tmp_path / "run"
    sets = [a for item in TINY + ["strategy.name=maskpredict", "train.steps=2"]
            for a in ("--set", item)]

    def cli(*args):
        return subprocess.run([sys.executable, "-m", "dlmkit.cli", *args], env=env, cwd=root,
                              capture_output=True, text=True, timeout=300)

    done = cli("train", *sets, "--output-dir", str(run))
    assert done.returncode == 0, done.stderr
    assert json.loads((run / "final" / "dlmkit.json").read_text())["strategy"] == "maskpredict"
    done = cli("generate", "--model", str(run / "final"), "--prompt", "rev abc",
               "--max-new-tokens", "4", "--steps", "2", "--no-final-argmax")
    assert done.returncode == 0, done.stderr
    # without the entry point the same command does not know the family
    env["PYTHONPATH"] = str(root)
    done = cli("generate", "--model", str(run / "final"), "--prompt", "rev abc")
    assert done.returncode != 0 and "maskpredict" in done.stderr


def test_a_broken_plugin_is_skipped_with_a_warning_naming_it(tmp_path, monkeypatch):
    import importlib

    plugins = _plugin_dir(tmp_path / "site", "broken = no_such_module_here:FAMILY\n"
                                             "notafamily = json:dumps")
    monkeypatch.syspath_prepend(str(plugins))
    importlib.invalidate_caches()
    before = dict(families._REGISTRY)
    try:
        with pytest.warns(UserWarning) as caught:
            assert families.load_entry_points() == []
        messages = [str(w.message) for w in caught]
        assert any("entry point 'broken' (no_such_module_here:FAMILY)" in m
                   and "ModuleNotFoundError" in m for m in messages), messages
        assert any("entry point 'notafamily'" in m and "not a dlmkit.families.Family" in m
                   for m in messages), messages
        assert families._REGISTRY == before  # the built-in families are all still there
    finally:
        families._REGISTRY.clear()
        families._REGISTRY.update(before)
