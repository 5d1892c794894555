"""block_diffusion on DiffusionGemma: what the strategy feeds the model (hand-checked canvas
blocks, positions, masks, self-conditioning gates, ragged prompts, left and right padding,
multi-turn), the selected-block computation against NeMo's all-blocks one, and bad input."""

from __future__ import annotations

import json
import math

import pytest
import torch

from dlmkit import strategies
from dlmkit.data import load_tokenizer
from dlmkit.data.seeds import sample_generators
from dlmkit.diffusion.rng import draw_rows
from dlmkit.families.block_diffusion.strategy import BlockDiffusionStrategy
from dlmkit.masks import canvas_encoder

S = 2
VOCAB = 64
TINY = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
        "moe_intermediate_size": 32}
P = 0  # padding id of the hand-made batch

# Three rows of 10 columns (v = real, p = prompt, r = supervised response, u = user turn):
#   row 0  p p p r r r r . . .   right padding, prompt 3, response 4   -> blocks (3,2) (5,2)
#   row 1  . . p p p r r r r r   left padding,  prompt 3, response 5   -> (5,2) (7,2) (9,1)
#   row 2  p p r r u u r r r .   two assistant turns                   -> (2,2) (6,2) (8,1)
IDS = torch.tensor([[10, 11, 12, 20, 21, 22, 23, P, P, P],
                    [P, P, 13, 14, 15, 30, 31, 32, 33, 34],
                    [16, 17, 40, 41, 18, 19, 42, 43, 44, P]])
SUP = torch.tensor([[0, 0, 0, 1, 1, 1, 1, 0, 0, 0],
                    [0, 0, 0, 0, 0, 1, 1, 1, 1, 1],
                    [0, 0, 1, 1, 0, 0, 1, 1, 1, 0]])
VALID = torch.tensor([[1, 1, 1, 1, 1, 1, 1, 0, 0, 0],
                      [0, 0, 1, 1, 1, 1, 1, 1, 1, 1],
                      [1, 1, 1, 1, 1, 1, 1, 1, 1, 0]])
POS = torch.tensor([[0, 1, 2, 3, 4, 5, 6, 7, 8, 9],
                    [0, 0, 0, 1, 2, 3, 4, 5, 6, 7],
                    [0, 1, 2, 3, 4, 5, 6, 7, 8, 9]])
BLOCKS = [[(3, 2), (5, 2)], [(5, 2), (7, 2), (9, 1)], [(2, 2), (6, 2), (8, 1)]]


def hand_batch(rows=(0, 1, 2)) -> dict:
    rows = list(rows)
    return {"input_ids": IDS[rows], "loss_mask": SUP[rows], "attention_valid": VALID[rows],
            "position_ids": POS[rows], "sample_index": torch.tensor(rows)}


def strategy(**options):
    options.setdefault("block_size", S)
    return strategies.get("block_diffusion")(options, mask_token_id=VOCAB - 1, vocab_size=VOCAB)


def generators(batch, step=0):
    return sample_generators(0, step, batch["sample_index"].tolist())


def model_for(s, seed=0):
    torch.manual_seed(seed)
    return s.build_model(s.default_model, vocab_size=VOCAB, attention="sdpa",
                         dtype=torch.float32, overrides=TINY)


@pytest.mark.parametrize("step", [0, 1, 2, 3])
def test_canvas_block_positions_and_masks_by_hand(step):
    batch = hand_batch()
    s = strategy(self_conditioning_p=0.5)
    p = s.prepare(batch, generators(batch, step))
    u = draw_rows(generators(batch, step), 3, 2, "cpu")  # the same per-sample streams
    for row in range(3):
        n = len(BLOCKS[row])
        chosen = min(int(u[row, 0] * n), n - 1)
        start, length = BLOCKS[row][chosen]
        assert (int(p["starts"][row]), int(p["lengths"][row])) == (start, length)
        assert bool(p["self_condition"][row]) == bool(u[row, 1] < 0.5)
        # canvas = the block's clean tokens (then padding), positions continue the row's
        assert p["target_ids"][row, :length].tolist() == IDS[row, start:start + length].tolist()
        assert p["loss_mask"][row].tolist() == [j < length for j in range(S)]
        assert p["canvas_positions"][row].tolist() == [int(POS[row, start]) + j for j in range(S)]
        # the encoder sees the clean row; the canvas rows see the real columns before the block
        assert torch.equal(p["input_ids"][row], IDS[row])
        dense = p["mask"].dense()[row, 0]
        visible = [c for c in range(start) if VALID[row, c]]
        for j in range(S):
            seen = torch.nonzero(dense[j]).flatten().tolist()
            if j < length:
                assert seen == visible + [10 + k for k in range(length)]
            else:  # a padded canvas position: only its own diagonal
                assert seen == [10 + j]


def test_each_turn_of_a_multi_turn_record_gets_trained():
    batch = hand_batch([2])
    s = strategy()
    starts = {int(s.prepare(batch, generators(batch, step))["starts"][0]) for step in range(40)}
    assert starts == {2, 6, 8}  # both assistant turns, every block
    p = next(q for q in (s.prepare(batch, generators(batch, k)) for k in range(40))
             if int(q["starts"][0]) == 6)
    # the second turn's block sees the first turn and the user turn in between, clean
    assert torch.nonzero(p["mask"].dense()[0, 0, 0]).flatten().tolist() == [0, 1, 2, 3, 4, 5,
                                                                            10, 11]
    with pytest.raises(ValueError, match="decode='all'.*single-turn"):
        strategy(decode="all").prepare(batch, generators(batch))


def test_corruption_is_uniform_and_only_on_the_block():
    batch = hand_batch()
    s = strategy(eps=0.999)  # (almost) every supervised canvas token resampled
    p = s.prepare(batch, generators(batch))
    assert p["noise_mask"].tolist() == p["loss_mask"].tolist()
    assert not (p["canvas_ids"] != p["target_ids"])[~p["loss_mask"]].any()
    assert ((p["canvas_ids"] >= 0) & (p["canvas_ids"] < VOCAB)).all()


def record_calls(model):
    calls = []

    def hook(module, args, kwargs):
        calls.append({"grad": torch.is_grad_enabled(), **kwargs})

    model.register_forward_pre_hook(hook, with_kwargs=True)
    return calls


@pytest.mark.parametrize("p_sc", [0.0, 0.5, 1.0])
def test_model_gets_the_canvas_masks_and_self_conditioning_gates(p_sc):
    batch = hand_batch()
    s = strategy(self_conditioning_p=p_sc)
    model = model_for(s)
    calls = record_calls(model)
    p = s.prepare(batch, generators(batch))
    out = s.loss(model, p, {k: float(v) for k, v in s.counts(p).items()})
    assert math.isfinite(float(out.total.detach()))
    assert len(calls) == (2 if p_sc > 0 else 1)
    last = calls[-1]
    assert last["grad"] and torch.equal(last["decoder_input_ids"], p["canvas_ids"])
    assert torch.equal(last["decoder_position_ids"], p["canvas_positions"])
    assert torch.equal(last["input_ids"], IDS) and torch.equal(last["position_ids"], POS)
    enc = last["attention_mask"]
    assert torch.equal(enc["full_attention"], canvas_encoder(10, VALID).dense())
    assert torch.equal(last["decoder_attention_mask"]["full_attention"], p["mask"].dense())
    if p_sc == 0:
        assert last.get("self_conditioning_logits") is None
        return
    first = calls[0]
    assert not first["grad"], "pass 1 must run under no_grad"
    assert first.get("self_conditioning_logits") is None
    assert last["self_conditioning_logits"].shape == (3, S, VOCAB)
    assert torch.equal(last["self_conditioning_mask"], p["self_condition"])
    if p_sc == 1.0:
        assert bool(p["self_condition"].all())


def test_selected_block_equals_all_blocks_loss_and_gradients():
    """Only the drawn block decoded == NeMo's whole-response canvas scored on that block."""
    tokenizer = load_tokenizer("byte")
    from dlmkit.data import Collator, SFTDataset

    data = SFTDataset.from_task("reverse", "train", tokenizer, n=8, seed=0)
    collate = Collator(pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
                       block_size=S, fill_from_response=True)
    batch = collate([data[i] for i in range(8)])
    results = []
    for decode in ("selected", "all"):
        s = strategies.get("block_diffusion")(
            {"block_size": S, "decode": decode, "self_conditioning_p": 0.5},
            mask_token_id=tokenizer.mask_token_id, vocab_size=tokenizer.vocab_size)
        torch.manual_seed(0)
        model = s.build_model(s.default_model, vocab_size=tokenizer.vocab_size,
                              attention="sdpa", dtype=torch.float32, overrides=TINY)
        p = s.prepare(batch, generators(batch))
        out = s.loss(model, p, {k: float(v) for k, v in s.counts(p).items()})
        out.total.backward()
        grads = {n: q.grad.clone() for n, q in model.named_parameters() if q.grad is not None}
        results.append((p, float(out.total.detach()), grads))
    (sel, loss_sel, g_sel), (full, loss_all, g_all) = results
    assert full["canvas_ids"].shape[1] > S, "the batch needs responses of several blocks"
    assert loss_sel == pytest.approx(loss_all, rel=1e-5)
    assert g_sel.keys() == g_all.keys() and len(g_sel) > 10
    for name in g_sel:
        torch.testing.assert_close(g_sel[name], g_all[name], rtol=1e-4, atol=1e-6,
                                   msg=lambda m, k=name: f"{k}: {m}")


def test_bad_options_are_errors():
    for bad in (1.5, -0.1, "half", True):
        with pytest.raises(ValueError, match="self_conditioning_p must be a number in"):
            strategy(self_conditioning_p=bad)
    with pytest.raises(ValueError, match="encoder_loss_weight must be a finite number"):
        strategy(encoder_loss_weight=-1)
    with pytest.raises(ValueError, match="decode must be one of"):
        strategy(decode="some")
    with pytest.raises(ValueError, match=r"encoder_loss_targets must be one of \('all', "
                                         r"'response'\), got 'prompt'"):
        strategy(encoder_loss_targets="prompt")
    with pytest.raises(ValueError, match="max_blocks must be a positive int"):
        strategy(max_blocks=0)


def test_a_model_directory_that_is_not_diffusion_gemma_is_an_error(tmp_path):
    from dlmkit.models import build_model

    build_model("tiny-llama", VOCAB, attention="sdpa",
                overrides={"num_hidden_layers": 1}).save_pretrained(tmp_path / "llama")
    s = strategy()
    with pytest.raises(ValueError, match="is not a DiffusionGemma model.*model_type 'llama'"):
        s.build_model(str(tmp_path / "llama"), vocab_size=VOCAB, attention="sdpa",
                      dtype=torch.float32)
    with pytest.raises(ValueError, match="not a directory"):
        s.build_model(str(tmp_path / "missing"), vocab_size=VOCAB, attention="sdpa",
                      dtype=torch.float32)


def test_local_directory_loads_as_is_and_a_block_it_cannot_hold_is_an_error(tmp_path):
    s = strategy(block_size=4)
    model_for(s).save_pretrained(tmp_path / "dg")  # canvas_length 4
    loaded = strategy(block_size=2).build_model(str(tmp_path / "dg"), vocab_size=VOCAB,
                                                attention="sdpa", dtype=torch.float32)
    assert loaded.config.canvas_length == 2  # its own generate decodes the trained blocks
    with pytest.raises(ValueError, match="block_size=8 does not fit the model's canvas"):
        strategy(block_size=8).build_model(str(tmp_path / "dg"), vocab_size=VOCAB,
                                           attention="sdpa", dtype=torch.float32)


def test_a_response_longer_than_the_canvas_budget_fails_before_training():
    from dlmkit.train.distributed import World
    from dlmkit.train.recipe import build_components
    from tests.train.helpers import config

    cpu = World(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"))
    # reverse responses: up to 5 letters + end of turn = 2 blocks of 4; the budget is 1
    cfg = config("strategy.max_blocks=1", strategy="block_diffusion")
    with pytest.raises(ValueError, match=r"canvas blocks of 4, more than the canvas budget"):
        build_components(cfg, cpu)


def test_the_canvas_budget_is_checked_on_the_data_as_truncated():
    """Responses of 6 tokens (5 letters + end of turn) need 2 blocks of 4; a 16-token cap cuts
    every response to at most 4 (prompts take 11-13 tokens), so as trained a budget of one
    block is met: the check must see the records after ``data.truncation``."""
    from dlmkit.train.distributed import World
    from dlmkit.train.recipe import build_components
    from tests.train.helpers import config

    cpu = World(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"))
    cfg = config("strategy.max_blocks=1", "data.max_seq_len=16", "data.truncation=truncate",
                 strategy="block_diffusion")
    c = build_components(cfg, cpu)
    assert c.cap_reports[0].cut > 0



def test_the_canvas_budget_counts_only_the_blocks_the_collator_keeps(tmp_path):
    """Under a cap a response keeps only its whole blocks (``Collator.keeps``): one starting 6
    tokens before a 16-token cap keeps one block of 4, so a budget of one block is met as
    trained, although the first 16 tokens hold 6 of it (two blocks' worth)."""
    from dlmkit.data import Collator, SFTDataset, load_tokenizer

    tok = load_tokenizer("byte")
    head = {n: len(tok.apply_chat_template([{"role": "user", "content": "x" * n}],
                                           add_generation_prompt=True).input_ids)
            for n in range(1, 12)}
    n = next(n for n, length in head.items() if length == 10)
    data = tmp_path / "d.jsonl"
    data.write_text(json.dumps({"prompt": "x" * n, "response": "abcdefghij"}) + "\n")
    dataset = SFTDataset.from_files(data, tok)
    strategy = BlockDiffusionStrategy({"block_size": 4, "max_blocks": 1},
                                      mask_token_id=tok.mask_token_id, vocab_size=tok.vocab_size)

    def collator(cap):
        return Collator(pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id,
                        block_size=4, max_seq_len=cap, fill_from_response=True)

    assert int(dataset[0]["loss_mask"][:16].sum()) == 6  # what the first 16 tokens hold
    strategy.check_dataset(dataset, collator(16))  # the collator keeps one block: fits
    with pytest.raises(ValueError, match=r"needs 2 canvas blocks of 4, more than the canvas "
                                         r"budget strategy.max_blocks=1"):
        strategy.check_dataset(dataset, collator(20))  # it keeps two
