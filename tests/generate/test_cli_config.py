"""`dlmkit generate` / `dlmkit eval` smoke tests and bad-input errors."""

import json

import pytest

from dlmkit.cli import main
from dlmkit.generate import load, sampler_config

from .helpers import TOK, tiny_model


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    def save(strategy, block_size=None, tokenizer=True):
        path = tmp_path_factory.mktemp(strategy)
        tiny_model().save_pretrained(path)
        if tokenizer:
            TOK.save_pretrained(path)
        meta = {"strategy": strategy, "block_size": block_size, "task": "reverse",
                "mask_token_id": TOK.mask_token_id, "options": {}}
        (path / "dlmkit.json").write_text(json.dumps(meta))
        return path

    return save


@pytest.mark.parametrize("strategy,block,extra", [
    ("mdlm", None, ["--threshold", "0.9", "--block-size", "4"]),
    ("bd3lm", 4, ["--cache"]),
    ("idlm", 2, []),
    ("hybrid", 4, ["--mode", "ar"]),
    ("scdd", None, ["--steps", "2"]),
    ("scdd", None, ["--revise"]),
])
def test_generate_prints_text_and_speed(model_dir, capsys, strategy, block, extra):
    path = model_dir(strategy, block)
    assert main(["generate", "--model", str(path), "--prompt", "rev abc", "--prompt", "x",
                 "--max-new-tokens", "8", *extra]) == 0
    out = capsys.readouterr().out
    assert "> rev abc" in out and "> x" in out
    assert f"sampler: {strategy}" in out and "tokens/forward:" in out and "tokens/s:" in out


def test_generate_file_infill_and_eval(model_dir, capsys, tmp_path):
    path = model_dir("mdlm")
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "rev ab"}\n"sort 21"\n')
    assert main(["generate", "--model", str(path), "--file", str(prompts), "--json",
                 "--max-new-tokens", "4"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert [json.loads(line)["prompt"] for line in lines] == ["rev ab", "sort 21"]
    assert main(["generate", "--model", str(path), "--prompt", "rev abc", "--infill",
                 "c[MASK]a", "--span-length", "2"]) == 0
    assert main(["eval", "--model", str(path), "-n", "3", "--max-new-tokens", "8",
                 "--threshold", "0.5", "--show", "1"]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert out[-1].startswith("exact_match: ") and out[-1].endswith("%")


@pytest.mark.parametrize("args,message", [
    (["--steps", "0"], "steps must be an int >= 1"),
    (["--block-size", "3"], "must divide max_new_tokens"),
    (["--sampler", "scdd", "--threshold", "0.9"], "does not use option(s) ['threshold']"),
    (["--sampler", "idlm", "--cache"], "does not use option(s) ['cache']"),
    (["--threshold", "1.5"], "threshold must be a number in (0, 1]"),
    (["--remasking", "random", "--threshold", "0.5"], "needs a model confidence"),
    (["--factor", "0"], "factor must be a finite number > 0"),
    (["--threshold", "0.9", "--factor", "1"], "two parallel commit rules; set one"),
    (["--sampler", "bd3lm", "--block-size", "4", "--cache", "dual"],
     "cache must be one of ('none', 'prefix') for the bd3lm sampler, got 'dual'"),
    (["--block-size", "3"], "(valid: [1, 2, 4, 8])"),
    (["--pad-to", "0"], "pad_to must be an int >= 1"),
    (["--revise"], "does not use option(s) ['revise']"),
    (["--sampler", "bd3lm", "--block-size", "4", "--pad-to", "30"],
     "does not use option(s) ['pad_to']"),
    (["--pad-to", "30", "--infill", "c[MASK]a"], "--pad-to sets the length of a generated"),
])
def test_bad_sampler_options(model_dir, capsys, args, message):
    # a --sampler decodes a model of its own family (another family's is a separate error)
    strategy = args[args.index("--sampler") + 1] if "--sampler" in args else "mdlm"
    path = model_dir(strategy, 4 if strategy == "bd3lm" else None)
    with pytest.raises(SystemExit) as err:
        main(["generate", "--model", str(path), "--prompt", "a", "--max-new-tokens", "8", *args])
    assert message in str(err.value)


def test_unknown_flag_and_bad_model_dirs(model_dir, tmp_path, capsys):
    with pytest.raises(SystemExit) as err:
        main(["generate", "--model", str(tmp_path), "--prompt", "a", "--no-such-option", "1"])
    assert err.value.code == 2 and "--no-such-option" in capsys.readouterr().err
    bare = model_dir("mdlm", tokenizer=False)
    with pytest.raises(SystemExit, match="no tokenizer in the model directory"):
        main(["generate", "--model", str(bare), "--prompt", "a"])
    with pytest.raises(SystemExit, match="not a directory"):
        main(["eval", "--model", str(tmp_path / "missing")])
    with pytest.raises(SystemExit, match="needs block_size"):
        main(["generate", "--model", str(model_dir("bd3lm")), "--prompt", "a"])


def test_config_errors_and_defaults(model_dir):
    with pytest.raises(ValueError, match="unknown sampler option"):
        sampler_config("mdlm", stepz=3)
    with pytest.raises(ValueError, match="sampler must be one of"):
        sampler_config("llada")
    with pytest.raises(ValueError, match="number of blocks"):
        sampler_config("mdlm", max_new_tokens=8, block_size=2, steps=3)
    with pytest.raises(ValueError, match="temperature"):
        sampler_config("ar", temperature=-1.0)
    loaded = load(model_dir("bd3lm", 4))
    cfg = loaded.config()
    assert (cfg.sampler, cfg.block_size, cfg.steps) == ("bd3lm", 4, 32)
    assert cfg.resolved() == cfg
    assert load(model_dir("hybrid", 4)).config("hybrid", mode="ar").block_size is None


@pytest.mark.parametrize("option", [dict(cache="prefix"), dict(steps=4), dict(threshold=0.9),
                                    dict(factor=1.0), dict(remasking="margin")])
def test_hybrid_ar_mode_rejects_the_diffusion_options_it_would_ignore(option):
    (name,) = option
    with pytest.raises(ValueError, match=rf"mode='ar' .* \['{name}'\]"):
        sampler_config("hybrid", mode="ar", max_new_tokens=8, **option)
    sampler_config("hybrid", max_new_tokens=8, block_size=4, **option)  # diffusion
