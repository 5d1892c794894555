"""Packed rows behave, document by document, like the unpacked samples: the shifted losses score
no pair across a document boundary, and per-block noise levels follow each document's own
blocks (the mask's), whatever the documents' offsets."""

from __future__ import annotations

import pytest
import torch

from dlmkit import strategies
from dlmkit.data import ByteTokenizer, Collator
from dlmkit.data.seeds import document_generators
from dlmkit.masks.diffusion import Documents

TOK = ByteTokenizer()
V, MASK = TOK.vocab_size, TOK.mask_token_id


def samples(lengths):
    g = torch.Generator().manual_seed(0)
    # No loss_mask: every token is supervised, the first one of each document included.
    return [{"input_ids": torch.randint(10, 100, (n,), generator=g).tolist(), "sample_index": i}
            for i, n in enumerate(lengths)]


@pytest.mark.parametrize("name", ["idlm", "hybrid"])
def test_packed_shifted_losses_score_no_pair_across_documents(name):
    from dlmkit.models import build_model

    torch.manual_seed(0)
    model = build_model("tiny-llama", V, attention="sdpa").eval()
    strategy = strategies.get(name)({"block_size": 2}, mask_token_id=MASK, vocab_size=V)
    data = samples([5, 3, 6, 2])
    results = []
    for pack in (True, False):
        collator = Collator(pad_token_id=TOK.pad_token_id, eos_token_id=TOK.eos_token_id,
                            block_size=2, max_seq_len=32, pack=pack)
        batch = collator(data)
        assert (batch["input_ids"].shape[0] == 1) == pack  # packed: all four in one row
        prepared = strategy.prepare(batch, document_generators(0, 0, batch))
        counts = {k: int(v) for k, v in strategy.counts(prepared).items()}
        with torch.no_grad():
            loss = strategy.loss(model, prepared, counts)
        results.append((counts, loss))
    (packed_counts, packed), (single_counts, single) = results
    # Aligned lengths 6, 4, 6, 2: 14 pairs inside documents; the 3 across them are not scored.
    assert packed_counts == single_counts
    assert packed.total.item() == pytest.approx(single.total.item(), rel=1e-5)
    for key in packed.extras:
        assert packed.extras[key].item() == pytest.approx(single.extras[key].item(), rel=1e-5)


def test_packed_noise_blocks_follow_each_documents_mask_blocks_without_block_alignment():
    # block_align=false: no EOS fill, so documents start at offsets 0, 5, 12 (not multiples
    # of the block size 4). A BD3-LM mask block is (document, rank // 4); it must carry one
    # noise level, not the two of a row-aligned noise block straddling it.
    strategy = strategies.get("bd3lm")({"block_size": 4}, mask_token_id=MASK, vocab_size=V)
    collator = Collator(pad_token_id=TOK.pad_token_id, eos_token_id=TOK.eos_token_id,
                        block_size=None, max_seq_len=32, pack=True)
    batch = collator(samples([5, 7, 6]))
    docs = Documents(batch["doc_ids"].clamp_min(0), batch["doc_ids"].shape[1])
    real = batch["doc_ids"][0] >= 0
    block = (docs.doc[0] * 100 + docs.rank[0] // 4)[real]
    for step in range(5):
        p = strategy.prepare(batch, document_generators(0, step, batch))["p_mask"][0][real]
        for b in block.unique():
            assert p[block == b].unique().numel() == 1, (step, int(b))
        # ... and each document's levels are its own: the same as unpacked.
        for i, n in enumerate([5, 7, 6]):
            alone = Collator(pad_token_id=TOK.pad_token_id, max_seq_len=32)
            one = alone([samples([5, 7, 6])[i]])
            q = strategy.prepare(one, document_generators(0, step, one))["p_mask"][0, :n]
            torch.testing.assert_close(p[batch["doc_ids"][0][real] == i], q)
