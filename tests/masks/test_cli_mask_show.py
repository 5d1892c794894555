"""`dlmkit mask show`: the drawing is the mask, at the length asked for.

Before: `mask show causal --seq-len 5000` drew its last row of cells as partly allowed (`+`)
where every real token is allowed (the tile map counts the padding past the last token as
blocked, as `create_block_mask` does); `mask show sta --seq-len 32` drew 18 tokens (16 at
--seq-len 16: one tile plus text, whatever the length).
"""

import pytest
import torch

from dlmkit.cli import main
from dlmkit.masks import Mask, causal
from dlmkit.masks.catalog import example, examples
from dlmkit.masks.render import mask_picture


def downsampled(mask: Mask, batch_index: int, q_step: int, kv_step: int) -> torch.Tensor:
    """Brute force: each cell of the dense mask, 1 all allowed, 0.5 some, 0 none."""
    dense = mask.dense()[batch_index, 0]
    rows, cols = -(-mask.q_len // q_step), -(-mask.kv_len // kv_step)
    out = torch.zeros(rows, cols)
    for i in range(rows):
        for j in range(cols):
            cell = dense[i * q_step:(i + 1) * q_step, j * kv_step:(j + 1) * kv_step]
            out[i, j] = 1.0 if cell.all() else 0.5 if cell.any() else 0.0
    return out


def check_picture(mask: Mask, cells: int) -> None:
    for b in range(mask.batch):
        picture, q_step, kv_step = mask_picture(mask, b, cells)
        assert torch.equal(picture, downsampled(mask, b, q_step, kv_step)), (mask.name, b)


def test_causal_5000_last_row_of_cells():
    mask = causal(5000)
    check_picture(mask, 64)
    lines = str(mask).splitlines()
    # 64 cells of 79 tokens; the last row of cells holds the last 23 queries, which see every
    # key up to themselves: all allowed but the diagonal cell.
    assert lines[-1] == " ".join(["#"] * 63 + ["+"])


@pytest.mark.parametrize("seq_len,cells", [(37, 8), (50, 7), (23, 5)])
def test_every_example_picture_equals_brute_force(seq_len, cells):
    """Lengths that are not multiples of the cell: every mask's short last row and column."""
    for name in examples():
        check_picture(example(name, seq_len, 4), cells)


def test_rule_only_mask_with_batch_rows():
    lengths = torch.tensor([[9], [31]])

    def rule(b, q, kv):
        return (kv <= q) & (kv < lengths[b, 0])

    check_picture(Mask.from_rule(rule, 33, 35, batch=2), 6)


@pytest.mark.parametrize("name", ["sta_2d", "sta_3d"])
@pytest.mark.parametrize("seq_len", [1, 5, 16, 17, 32, 100, 1024])
def test_sta_example_is_seq_len_long(name, seq_len):
    mask = example(name, seq_len, 4)
    assert (mask.q_len, mask.kv_len) == (seq_len, seq_len)


def test_mask_show_sta_draws_the_length_asked(capsys):
    assert main(["mask", "show", "sta", "--seq-len", "32"]) == 0
    out = capsys.readouterr().out
    assert ": batch 1, 32 queries x 32 keys" in out
    assert "q_len=32, kv_len=32" in out


def test_mask_list_names_each_mask_with_its_part(capsys):
    from dlmkit.masks.catalog import part_of

    assert main(["mask", "list"]) == 0
    rows = [line.split() for line in capsys.readouterr().out.splitlines()]
    assert [name for name, _ in rows] == list(examples())
    assert all(part == part_of(name) for name, part in rows)
    assert main(["mask", "list", "--part", "engine"]) == 0
    engine = [line.split()[0] for line in capsys.readouterr().out.splitlines()]
    assert engine == list(examples("engine")) and "idlm" in engine and "vsa" not in engine
