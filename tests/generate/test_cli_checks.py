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


# -- issue 51: the commands a newcomer runs after training --------------------------------------

def save_drafter(path, target_dir):
    """A DFlash drafter export for the tiny target, as `dlmkit train` writes it."""
    from dlmkit.models.dflash import DFlashDraftConfig, DFlashDrafter

    c = tiny_model().config
    config = DFlashDraftConfig(hidden_size=c.hidden_size, num_attention_heads=4,
                               intermediate_size=64, num_hidden_layers=1, block_size=4,
                               mask_token_id=TOK.mask_token_id, target_layer_ids=[0, 2],
                               target_hidden_size=c.hidden_size, vocab_size=c.vocab_size)
    DFlashDrafter(config).eval().save_pretrained(path)
    TOK.save_pretrained(path)
    (path / "dlmkit.json").write_text(json.dumps({
        "strategy": "dflash", "block_size": 4, "target": str(target_dir), "options": {},
        "mask_token_id": TOK.mask_token_id, "max_new_tokens": 8}))
    return path


def test_draft_must_be_a_drafter_export_and_the_target_causal(exported, tmp_path, capsys):
    """Before: `--model M --draft M` loaded an ar model as the drafter (every drafter weight
    random), decoded noise at tau 1.00 and exited 0; a bd3lm target was accepted too."""
    ar, bd3lm = exported("ar"), exported("bd3lm", 4)
    with pytest.raises(SystemExit, match=r"--draft .*: not a DFlash drafter export \(its "
                                         r"dlmkit.json says strategy 'ar'\); --draft takes "
                                         r"RUN/final of a run trained with strategy.name=dflash"):
        main(["generate", "--model", str(ar), "--draft", str(ar), "--prompt", "rev ab"])
    plain = exported("plain", meta=False)
    with pytest.raises(SystemExit, match=r"not a DFlash drafter export \(it has no dlmkit.json"):
        main(["generate", "--model", str(ar), "--draft", str(plain), "--prompt", "rev ab"])
    drafter = save_drafter(tmp_path / "draft", ar)
    with pytest.raises(SystemExit, match=r"--model .*: trained with strategy 'bd3lm', not a "
                                         r"causal LM; .* must be an ar export .* or a plain "
                                         r"Hugging Face causal LM \(this drafter was trained "
                                         r"against "):
        main(["generate", "--model", str(bd3lm), "--draft", str(drafter), "--prompt", "rev ab"])
    with pytest.raises(SystemExit, match=r"--draft is speculative decoding \(sampler dflash\); "
                                         r"--sampler ar decodes --model alone"):
        main(["generate", "--model", str(ar), "--draft", str(drafter), "--prompt", "rev ab",
              "--sampler", "ar"])
    # a real pair decodes: an ar export, and a plain causal LM (no dlmkit.json: no --sampler)
    for target in (ar, plain):
        assert main(["generate", "--model", str(target), "--draft", str(drafter), "--prompt",
                     "rev ab", "--max-new-tokens", "4"]) == 0
        assert "sampler: dflash" in capsys.readouterr().out


def test_drafter_with_missing_weights_is_an_error(exported, tmp_path):
    from safetensors.torch import load_file, save_file

    drafter = save_drafter(tmp_path / "draft", exported("ar"))
    weights = load_file(drafter / "model.safetensors")
    dropped = sorted(weights)[:2]
    save_file({k: v for k, v in weights.items() if k not in dropped},
              drafter / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(SystemExit, match=rf"--draft .*: the weights file lacks 2 of the "
                                         rf"drafter's {len(weights)} tensors .*{dropped[0]}.*they "
                                         r"would be random"):
        main(["generate", "--model", str(exported("ar")), "--draft", str(drafter), "--prompt",
              "rev ab"])


def test_prompt_longer_than_the_model_positions_is_an_error(exported):
    """Before: a 3,005-token prompt against 1,024 positions decoded without a word."""
    path = exported("ar")
    long = "x" * 1100  # byte tokenizer: one token a character, plus the chat template
    with pytest.raises(SystemExit, match=r"prompt 1 is 11\d\d tokens and 4 more are decoded "
                                         r"after it: 11\d\d positions, but the model has 1024 "
                                         r"\(max_position_embeddings in its config.json\); "
                                         r"shorten it to at most 1020 tokens"):
        main(["generate", "--model", str(path), "--prompt", "ok", "--prompt", long,
              "--max-new-tokens", "4"])
    with pytest.raises(SystemExit, match=r"prompt 0 is \d+ tokens and 2000 more .* decode "
                                         r"fewer than 1024 new tokens"):
        main(["generate", "--model", str(path), "--prompt", "ok", "--max-new-tokens", "2000"])


def test_sampler_of_another_family(exported, capsys):
    """Before: `--sampler mdlm` on a bd3lm model decoded an empty answer without a word."""
    with pytest.raises(SystemExit, match=r"sampler 'mdlm' does not decode this model \(.*"
                                         r"dlmkit.json says strategy 'bd3lm': trained for the "
                                         r"bd3lm sampler\); samplers for this model: bd3lm"):
        main(["generate", "--model", str(exported("bd3lm", 4)), "--prompt", "rev ab",
              "--sampler", "mdlm"])
    with pytest.raises(SystemExit, match=r"sampler 'mdlm' does not decode this model .*"
                                         r"samplers for this model: hybrid, ar"):
        main(["generate", "--model", str(exported("hybrid", 4)), "--prompt", "a", "--sampler",
              "mdlm"])
    # related families decode with a warning; a causal stream decodes with ar silently
    assert main(["generate", "--model", str(exported("mdlm")), "--prompt", "rev ab",
                 "--sampler", "scdd", "--max-new-tokens", "4"]) == 0
    err = capsys.readouterr().err
    assert "warning: sampler 'scdd' on a model trained as mdlm" in err
    assert "its own sampler is 'mdlm'" in err
    assert main(["generate", "--model", str(exported("idlm", 4)), "--prompt", "rev ab",
                 "--sampler", "ar", "--max-new-tokens", "4"]) == 0
    assert "warning" not in capsys.readouterr().err


def test_device_is_chosen_as_train_chooses_it(exported):
    import torch

    from dlmkit.commands.generate import resolve_device

    for command in (["generate", "--prompt", "a"], ["eval"]):
        assert build_parser().parse_args([*command, "--model", "m"]).device == "auto"
    assert resolve_device("auto") == ("cuda" if torch.cuda.is_available() else "cpu")
    path = str(exported("ar"))
    with pytest.raises(SystemExit, match=r"--device='bogus' is not a torch device; use auto, "
                                         r"cpu, cuda or cuda:N"):
        main(["generate", "--model", path, "--prompt", "a", "--device", "bogus"])
    with pytest.raises(SystemExit, match=r"--device=cuda:99 but "):
        main(["eval", "--model", path, "--device", "cuda:99"])
