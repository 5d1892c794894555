"""A collated multi-turn BD3-LM batch, checked against a batch written out by hand: ids,
supervision (both assistant turns and their end-of-turn markers, the EOS block fill),
positions, padding, per-block noise and the ``[x_t | x_0]`` block-diffusion mask."""

from __future__ import annotations

import torch

from dlmkit import strategies
from dlmkit.data import Collator, SFTDataset, load_tokenizer
from dlmkit.data.seeds import document_generators

BLOCK = 4


def test_collated_multiturn_bd3lm_batch_matches_the_hand_built_one():
    tok = load_tokenizer("byte")
    bos, user, asst, end, eos, pad, mask = (tok.bos_token_id, tok.token_to_id("<|user|>"),
                                            tok.token_to_id("<|assistant|>"),
                                            tok.end_of_turn_token_id, tok.eos_token_id,
                                            tok.pad_token_id, tok.mask_token_id)
    a, b, c, d, e, f, x, y = (ord(ch) for ch in "abcdefxy")
    data = SFTDataset([
        {"messages": [{"role": "user", "content": "ab"}, {"role": "assistant", "content": "c"},
                      {"role": "user", "content": "d"}, {"role": "assistant", "content": "ef"}]},
        {"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}]},
    ], tok)
    collate = Collator(pad_token_id=pad, eos_token_id=eos, block_size=BLOCK,
                       fill_from_response=strategies.get("bd3lm").fill_from_response)
    batch = collate([data[0], data[1]])

    # By hand. Row 0: 15 tokens + one EOS to fill the 4th block. Row 1: 7 tokens, one EOS
    # fill, then padding to the batch length 16.
    ids = [[bos, user, a, b, end, asst, c, end, user, d, end, asst, e, f, end, eos],
           [bos, user, x, end, asst, y, end, eos] + [pad] * 8]
    sup = [[0, 0, 0, 0, 0, 0, 1, 1, 0, 0, 0, 0, 1, 1, 1, 1],
           [0, 0, 0, 0, 0, 1, 1, 1] + [0] * 8]
    valid = [[1] * 16, [1] * 8 + [0] * 8]
    assert batch["input_ids"].tolist() == ids
    assert batch["loss_mask"].tolist() == sup
    assert batch["attention_valid"].tolist() == valid
    assert batch["position_ids"].tolist() == [list(range(16)), list(range(16))]

    strategy = strategies.get("bd3lm")({"block_size": BLOCK}, mask_token_id=mask,
                                       vocab_size=tok.vocab_size)
    batch["doc_slot"], batch["num_slots"] = torch.tensor([[0], [1]]), 2
    prepared = strategy.prepare(batch, document_generators(0, 3, batch))
    noisy, clean = prepared["input_ids"][:, :16], prepared["input_ids"][:, 16:]
    assert clean.tolist() == ids
    sup_t = torch.tensor(sup, dtype=torch.bool)
    assert torch.equal(noisy != torch.tensor(ids), prepared["noise_mask"])
    assert not bool((prepared["noise_mask"] & ~sup_t).any())  # only answers are corrupted
    assert bool((noisy[prepared["noise_mask"]] == mask).all())
    p = prepared["p_mask"].reshape(2, 4, BLOCK)
    assert bool((p == p[..., :1]).all())  # one noise level per block
    assert prepared["position_ids"].tolist() == [list(range(16)) * 2] * 2

    # The BD3-LM mask by its definition: a noisy query sees its own noisy block and the
    # clean blocks before it; a clean query sees clean blocks up to its own; padded keys are
    # never seen and a padded query sees only itself.
    expected = torch.zeros(2, 32, 32, dtype=torch.bool)
    for row in range(2):
        for q in range(32):
            qi, q_clean = q % 16, q >= 16
            if not valid[row][qi]:
                expected[row, q, q] = True
                continue
            for k in range(32):
                ki, k_clean = k % 16, k >= 16
                if not valid[row][ki]:
                    continue
                same, earlier = ki // BLOCK == qi // BLOCK, ki // BLOCK < qi // BLOCK
                if not q_clean:
                    expected[row, q, k] = (not k_clean and same) or (k_clean and earlier)
                else:
                    expected[row, q, k] = k_clean and (same or earlier)
    assert torch.equal(prepared["mask"].dense()[:, 0], expected)
