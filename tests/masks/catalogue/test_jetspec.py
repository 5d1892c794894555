import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dlmkit.masks.catalogue.jetspec import jetspec_training, jetspec_tree, tree_ancestor_matrix
from tests.masks.compare import (
    assert_flex_matches_sdpa,
    assert_matches_create_block_mask,
    full_check,
)
from tests.masks.reference import grid
from tests.masks.reference_catalog import ancestor_sets, jetspec_training_ref, jetspec_tree_ref
from tests.masks.strategies import block_sizes


@st.composite
def trees(draw, max_nodes=10):
    n = draw(st.integers(1, max_nodes))
    return [-1] + [draw(st.integers(0, i - 1)) for i in range(1, n)]


@settings(max_examples=30, deadline=None)
@given(data=st.data(), prefix=st.integers(0, 6), parents=trees())
def test_tree_matches_reference_and_torch(data, prefix, parents):
    mask = jetspec_tree(prefix, parents)
    n = len(parents)
    assert (mask.q_len, mask.kv_len) == (n, prefix + n) and mask.has_intervals
    expected = grid(1, n, prefix + n, jetspec_tree_ref(prefix, parents))
    full_check(mask, expected, block_sizes=(data.draw(block_sizes), data.draw(block_sizes)))
    sets = ancestor_sets(parents)
    A = tree_ancestor_matrix(parents)
    assert A.tolist() == [[j in sets[i] for j in range(n)] for i in range(n)]


def test_paper_tree_depths_and_default_device():
    parents = [-1, 0, 1, 1, 3, 3, 0]
    A = tree_ancestor_matrix(parents)
    assert A.device.type == "cpu"
    assert (A.sum(1) - 1).tolist() == [0, 1, 2, 2, 3, 3, 1]
    assert jetspec_tree(3, parents).device.type == "cpu"


def test_two_roots_rejected_regression():
    # attention-gym silently mis-builds [-1, 0, -1, 2] (node 2 "inherits" node 3 through
    # Python negative indexing); a forest is not a tree.
    with pytest.raises(ValueError, match="single root"):
        tree_ancestor_matrix([-1, 0, -1, 2])
    with pytest.raises(ValueError, match="single root"):
        jetspec_tree(4, [-1, 0, -1, 2])


def test_tree_bad_input():
    with pytest.raises(ValueError, match=r"parent_indices\[2\] = 2"):
        jetspec_tree(0, [-1, 0, 2])  # self-parent
    with pytest.raises(ValueError, match="parent-before-child"):
        jetspec_tree(0, [-1, 2, 0])  # parent after child
    with pytest.raises(ValueError, match=r"parent_indices\[0\] must be -1"):
        jetspec_tree(0, [0, 0])
    with pytest.raises(ValueError, match="at least the root"):
        jetspec_tree(0, [])
    with pytest.raises(ValueError, match="prefix_length"):
        jetspec_tree(-1, [-1])
    with pytest.raises(TypeError, match="parent_indices"):
        jetspec_tree(0, "abc")
    with pytest.raises(TypeError, match=r"parent_indices\[1\]"):
        jetspec_tree(0, [-1, 0.0])
    with pytest.raises(ValueError, match="single root"):
        jetspec_tree(0, [-1, -2])


@settings(max_examples=30, deadline=None)
@given(data=st.data(), prefix=st.integers(0, 6), block=st.integers(1, 4),
       n=st.integers(1, 4), anchored=st.sampled_from(["none", "one", "rows"]))
def test_training_matches_reference_and_torch(data, prefix, block, n, anchored):
    rows = None
    if anchored != "none":
        batch = 1 if anchored == "one" else data.draw(st.integers(1, 3))
        rows = [data.draw(st.lists(st.integers(0, prefix), min_size=n, max_size=n))
                for _ in range(batch)]
    anchors = None if rows is None else torch.tensor(rows[0] if anchored == "one" else rows)
    mask = jetspec_training(prefix, block, n, anchors)
    assert (mask.q_len, mask.kv_len) == (n * block, prefix + n * block) and mask.has_intervals
    expected = grid(mask.batch, n * block, prefix + n * block,
                    jetspec_training_ref(prefix, block, rows))
    full_check(mask, expected, block_sizes=(data.draw(block_sizes), data.draw(block_sizes)))


def test_training_anchor_equal_to_prefix_is_attention_gym():
    assert torch.equal(jetspec_training(5, 3, 4, [5, 5, 5, 5]).dense(),
                       jetspec_training(5, 3, 4).dense())


def test_large_and_flex():
    parents = [-1] + [(i - 1) // 3 for i in range(1, 200)]
    assert_matches_create_block_mask(jetspec_tree(150, parents), (64, 128))
    anchors = torch.tensor([[0, 40, 90, 120, 150], [150, 10, 20, 30, 40]])
    assert_matches_create_block_mask(jetspec_training(150, 37, 5, anchors), (128, 64))
    assert_flex_matches_sdpa(jetspec_tree(5, [-1, 0, 0, 1, 2, 2]), block_size=4)
    assert_flex_matches_sdpa(jetspec_training(5, 3, 3, torch.tensor([1, 3, 5])), block_size=4)


def test_training_bad_input():
    with pytest.raises(ValueError, match="block_size"):
        jetspec_training(4, 0, 2)
    with pytest.raises(ValueError, match="num_blocks"):
        jetspec_training(4, 2, 0)
    with pytest.raises(ValueError, match="prefix_length"):
        jetspec_training(-1, 2, 2)
    with pytest.raises(ValueError, match="anchors"):
        jetspec_training(4, 2, 2, [1, 5])
    with pytest.raises(ValueError, match="anchors"):
        jetspec_training(4, 2, 2, [1, 2, 3])
    with pytest.raises(TypeError, match="anchors"):
        jetspec_training(4, 2, 2, torch.tensor([1.0, 2.0]))
