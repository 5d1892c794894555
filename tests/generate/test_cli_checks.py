"""`dlmkit generate` says what is wrong before decoding, and its help tells the truth.

Before: `--block-size 8` on a model trained with blocks of 4 (bd3lm/hybrid) decoded garbage
without a word; a plain Hugging Face directory got an error naming `dlmkit.json` as if it
existed; `eval --help` printed "(default: None)" after options whose default comes from the
model's dlmkit.json, and "most tokens per response (32)" although dlmkit.json sets it.
"""

import json

import pytest

from dlmkit.cli import build_parser, main

from .helpers import TOK, tiny_model


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    def save(strategy, block_size=None, meta=True):
        path = tmp_path_factory.mktemp(strategy)
        tiny_model().save_pretrained(path)
        TOK.save_pretrained(path)
        if meta:
            (path / "dlmkit.json").write_text(json.dumps({
                "strategy": strategy, "block_size": block_size, "task": "reverse",
                "mask_token_id": TOK.mask_token_id, "options": {}, "max_new_tokens": 8}))
        return path

    return save


@pytest.mark.parametrize("strategy", ["bd3lm", "hybrid"])
def test_block_size_other_than_trained_is_an_error(exported, strategy):
    path = exported(strategy, 4)
    with pytest.raises(SystemExit, match=r"--block-size 8 differs from the block size the model "
                                         r"was trained with \(4, in .*dlmkit.json\).*omit "
                                         r"--block-size"):
        main(["generate", "--model", str(path), "--prompt", "rev ab", "--block-size", "8"])
    # the trained size itself is fine, and so is any size for hybrid's AR mode (no blocks)
    assert main(["generate", "--model", str(path), "--prompt", "rev ab", "--block-size", "4",
                 "--max-new-tokens", "4"]) == 0


def test_hybrid_ar_mode_has_no_block(exported):
    path = exported("hybrid", 4)
    with pytest.raises(SystemExit, match=r"--block-size is not used by the hybrid sampler in "
                                         r"--mode ar"):
        main(["generate", "--model", str(path), "--prompt", "rev ab", "--mode", "ar",
              "--block-size", "8", "--max-new-tokens", "4"])


def test_plain_hf_directory_says_how_to_pick_a_sampler(exported):
    path = exported("plain", meta=False)
    with pytest.raises(SystemExit, match=r"has no dlmkit.json, so it is not a model exported by "
                                         r"`dlmkit train`.*pass --sampler: ar for a plain "
                                         r"causal LM"):
        main(["generate", "--model", str(path), "--prompt", "hi"])
    assert main(["generate", "--model", str(path), "--prompt", "hi", "--sampler", "ar",
                 "--max-new-tokens", "2"]) == 0


@pytest.mark.parametrize("command", ["generate", "eval"])
def test_help_defaults_are_the_real_ones(command, capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args([command, "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "(default: None)" not in text and "(default: True)" not in text
    assert "most tokens per response (default: max_new_tokens of the model's dlmkit.json" in text
    assert "block_size of dlmkit.json" in text
