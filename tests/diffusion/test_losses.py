"""Losses: hand-computed values, denominators, chunking, grad accumulation, errors."""

from __future__ import annotations

import math

import pytest
import torch

from dlmkit.diffusion import (
    BlockDiffusionLoss,
    DFlashDecayLoss,
    HybridLoss,
    IDLMLoss,
    MDLMLoss,
    SCDDLoss,
    corrupt_scdd,
    encoder_ar_loss,
    scdd_schedule,
)
from tests.diffusion.reference import ce, grads, scdd_step_kl

# A fixed tiny example: B=1, L=4, V=5.
LOGITS = torch.tensor([[[2.0, 0.5, -1.0, 0.0, 0.3],
                        [0.1, 1.5, 0.2, -0.5, 0.0],
                        [-1.0, 0.0, 3.0, 0.5, 0.2],
                        [0.0, 0.0, 0.0, 2.0, -2.0]]])
CAUSAL = torch.tensor([[[0.3, 2.0, 0.1, 0.0, -1.0],
                        [1.0, 0.0, -0.5, 0.2, 0.4],
                        [0.0, 0.1, 0.2, 0.3, 0.4],
                        [2.0, 1.0, 0.0, -1.0, -2.0]]])
TARGET = torch.tensor([[0, 1, 3, 3]])


def test_mdlm_hand_value():
    noise = torch.tensor([[True, False, True, True]])
    sup = torch.tensor([[1, 1, 1, 0]])
    p = torch.tensor([[0.5, 0.5, 0.25, 0.5]])
    out = MDLMLoss()(logits=LOGITS, target_ids=TARGET, noise_mask=noise, p_mask=p, loss_mask=sup)
    num = ce(LOGITS[0, 0], 0) / 0.5 + ce(LOGITS[0, 2], 3) / 0.25  # position 3 unsupervised
    assert out.total.item() == pytest.approx(num / 3, rel=1e-5)  # / supervised count
    glob = MDLMLoss()(logits=LOGITS, target_ids=TARGET, noise_mask=noise, p_mask=p,
                      loss_mask=sup, num_tokens=10)
    assert glob.total.item() == pytest.approx(num / 10, rel=1e-5)
    assert not glob.dllm.requires_grad


def test_hybrid_hand_value_with_shift_aware_ar_denominator():
    noise = torch.tensor([[False, True, False, True]])
    sup = torch.tensor([[1, 1, 0, 1]])  # position 0 supervised: AR cannot score it
    p = torch.full((1, 4), 0.25)
    out = HybridLoss(alpha=0.3)(logits=LOGITS, target_ids=TARGET, noise_mask=noise, p_mask=p,
                                loss_mask=sup, causal_logits=CAUSAL)
    diffusion = (ce(LOGITS[0, 1], 1) / 0.25 + ce(LOGITS[0, 3], 3) / 0.25) / 2  # / corrupted
    ar = (ce(CAUSAL[0, 0], 1) + ce(CAUSAL[0, 2], 3)) / 2  # pairs (0->1), (2->3): 2, not 3
    assert out.total.item() == pytest.approx(0.3 * diffusion + ar, rel=1e-5)
    assert out.dllm.item() == pytest.approx(0.3 * diffusion, rel=1e-5)
    assert out.extras["ar"].item() == pytest.approx(ar, rel=1e-5)
    no_ar = HybridLoss(alpha=0.3)(logits=LOGITS, target_ids=TARGET, noise_mask=noise, p_mask=p,
                                  loss_mask=sup)
    assert no_ar.total.item() == pytest.approx(0.3 * diffusion, rel=1e-5)


def test_block_diffusion_and_encoder_ar_hand_values():
    sup = torch.tensor([[0, 1, 1, 1]])
    out = BlockDiffusionLoss()(logits=LOGITS, target_ids=TARGET, loss_mask=sup)
    flat = (ce(LOGITS[0, 1], 1) + ce(LOGITS[0, 2], 3) + ce(LOGITS[0, 3], 3)) / 3
    assert out.total.item() == pytest.approx(flat, rel=1e-5)
    valid = torch.tensor([[1, 1, 1, 0]])
    ar = encoder_ar_loss(CAUSAL, TARGET, valid)
    assert ar.item() == pytest.approx((ce(CAUSAL[0, 0], 1) + ce(CAUSAL[0, 1], 3)) / 2, rel=1e-5)
    everything = encoder_ar_loss(CAUSAL, TARGET)
    ref = sum(ce(CAUSAL[0, i], int(TARGET[0, i + 1])) for i in range(3)) / 3
    assert everything.item() == pytest.approx(ref, rel=1e-5)
    # target_mask: only pairs whose *target* is marked (here the response tokens 2, 3)
    response = encoder_ar_loss(CAUSAL, TARGET, torch.tensor([[1, 1, 1, 1]]),
                               target_mask=torch.tensor([[0, 0, 1, 1]]))
    want = (ce(CAUSAL[0, 1], int(TARGET[0, 2])) + ce(CAUSAL[0, 2], int(TARGET[0, 3]))) / 2
    assert response.item() == pytest.approx(want, rel=1e-5)
    # ... and still only valid pairs: the invalid last token is no target
    assert encoder_ar_loss(CAUSAL, TARGET, valid, target_mask=torch.tensor([[0, 0, 1, 1]])
                           ).item() == pytest.approx(ce(CAUSAL[0, 1], int(TARGET[0, 2])),
                                                     rel=1e-5)


@pytest.mark.parametrize("auto", [False, True])
def test_idlm_hand_value(auto):
    logits = torch.cat([LOGITS[:, :3], CAUSAL[:, :3]], 1)  # [1, 2L, V] with L = 3
    target = TARGET[:, :3]
    sup = torch.tensor([[0, 1, 1]])
    out = IDLMLoss(clean_loss_weight=0.2, auto_balance=auto)(
        logits=logits, target_ids=target, loss_mask=sup)
    noisy = (ce(LOGITS[0, 0], 1) + ce(LOGITS[0, 1], 3)) / 2  # first response token scored
    clean = (ce(CAUSAL[0, 0], 1) + ce(CAUSAL[0, 1], 3)) / 2
    alpha = noisy / clean if auto else 0.2
    assert out.total.item() == pytest.approx(noisy + alpha * clean, rel=1e-5)
    assert out.dllm.item() == pytest.approx(noisy, rel=1e-5)
    assert out.extras["alpha"].item() == pytest.approx(alpha, rel=1e-5)
    valid = torch.tensor([[1, 1, 0]])  # an unattended last token is not scored
    masked = IDLMLoss()(logits=logits, target_ids=target, loss_mask=sup, valid_mask=valid)
    assert masked.dllm.item() == pytest.approx(ce(LOGITS[0, 0], 1), rel=1e-5)


@pytest.mark.parametrize("normalize", ["tokens", "mean"])
def test_dflash_hand_value_and_accuracy(normalize):
    # block_size 3: offsets 1, 2 per block; two blocks over T = 4.
    mask = torch.tensor([[1, 1, 0, 1]])
    loss = DFlashDecayLoss(block_size=3, gamma=2.0, normalize=normalize)
    out = loss(logits=LOGITS, target_ids=TARGET, block_mask=mask)
    w = math.exp(-0.5)
    num = ce(LOGITS[0, 0], 0) + w * ce(LOGITS[0, 1], 1) + w * ce(LOGITS[0, 3], 3)
    den = 3 if normalize == "tokens" else 1 + 2 * w
    assert out.total.item() == pytest.approx(num / den, rel=1e-5)
    # argmax per position: 0, 1, 2, 3 -> hits at 0, 1, 3 (position 2 unscored anyway)
    assert out.extras["draft_correct"].tolist() == [1.0, 2.0]
    assert out.extras["draft_count"].tolist() == [1.0, 2.0]
    assert loss.local_denominator(mask).item() == pytest.approx(den, rel=1e-6)


@pytest.mark.parametrize("chunk", [1, 4, 15])
def test_dflash_accuracy_does_not_depend_on_chunking_when_decay_weights_underflow(chunk):
    # gamma 0.05: exp(-(k - 1) / gamma) is 0 in float32 from offset 6 on, so whole chunks carry
    # weight 0; their positions are still scored and must still be counted as hits.
    g = torch.Generator().manual_seed(0)
    target = torch.randint(0, VOC, (2, 15), generator=g)
    logits = torch.randn(2, 15, VOC, generator=g)
    logits.scatter_(-1, target[..., None], 10.0)  # every position predicts its target
    mask = torch.ones(2, 15, dtype=torch.long)
    loss = DFlashDecayLoss(block_size=16, gamma=0.05, chunk_size=chunk)
    assert bool((loss.weights(15) == 0).any())
    out = loss(logits=logits, target_ids=target, block_mask=mask)
    whole = DFlashDecayLoss(block_size=16, gamma=0.05, chunk_size=None)(
        logits=logits, target_ids=target, block_mask=mask)
    assert out.extras["draft_correct"].tolist() == [2.0] * 15
    assert torch.equal(out.extras["draft_correct"], whole.extras["draft_correct"])
    assert out.total.item() == pytest.approx(whole.total.item(), rel=1e-6)


@pytest.mark.parametrize("combo", [(0, 4, 0.5), (0, 0, 0.3), (0, 2, 0.7), (1, 4, 0.1),
                                   (2, 2, 0.1), (3, 1, 0.9), (0, 4, 1.0)])
def test_scdd_matches_brute_force_posterior_kl(combo):
    x, z, t = combo
    T, mask = 10, 4
    kw = {"max_ratio": 0.3, "gamma_shape": 1.0, "t_peak": 0.5}

    def sched(u):
        m = scdd_schedule(torch.tensor(u), **kw)
        return m.gamma.item(), m.rho.item()

    row = LOGITS[0, 1]
    out = SCDDLoss(mask, num_timesteps=T, **kw)(
        logits=row.view(1, 1, -1), target_ids=torch.tensor([[x]]), noisy_ids=torch.tensor([[z]]),
        p_mask=torch.tensor([[t]]), loss_mask=torch.ones(1, 1))
    assert out.total.item() == pytest.approx(scdd_step_kl(row, x, z, mask, t, T, sched),
                                             rel=1e-4, abs=1e-5)


def test_scdd_is_nonnegative_and_ignores_the_mask_logit():
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 9, (8, 16), generator=g)
    noisy, _, p = corrupt_scdd(ids, torch.ones(8, 16), 9, 10, num_timesteps=50, max_ratio=0.2,
                               generator=g)
    logits = torch.randn(8, 16, 10, generator=g)
    loss = SCDDLoss(9, num_timesteps=50, max_ratio=0.2, chunk_size=None)
    per_row = [loss(logits=logits[i:i + 1], target_ids=ids[i:i + 1], noisy_ids=noisy[i:i + 1],
                    p_mask=p[i:i + 1], loss_mask=torch.ones(1, 16)).total for i in range(8)]
    assert min(v.item() for v in per_row) > -1e-4
    bumped = logits.clone()
    bumped[..., 9] += 100.0  # the MASK logit never matters
    a = loss(logits=logits, target_ids=ids, noisy_ids=noisy, p_mask=p, loss_mask=torch.ones(8, 16))
    b = loss(logits=bumped, target_ids=ids, noisy_ids=noisy, p_mask=p, loss_mask=torch.ones(8, 16))
    assert a.total.item() == pytest.approx(b.total.item(), rel=1e-5)


def test_scdd_ratio_zero_reduces_to_mdlm():
    g = torch.Generator().manual_seed(1)
    V, mask, T = 12, 11, 100
    ids = torch.randint(0, mask, (6, 20), generator=g)
    lm = (torch.rand(6, 20, generator=g) > 0.3).long()
    noisy, noise, t = corrupt_scdd(ids, lm, mask, V, num_timesteps=T, max_ratio=0.0, generator=g)
    assert torch.equal(noisy[noise], torch.full_like(noisy[noise], mask))  # absorbing only
    logits = torch.randn(6, 20, V, generator=g)
    scdd = SCDDLoss(mask, num_timesteps=T, max_ratio=0.0)(
        logits=logits, target_ids=ids, noisy_ids=noisy, p_mask=t, loss_mask=lm)
    subs = logits.clone()
    subs[..., mask] = float("-inf")  # MDLM's SUBS: the MASK logit is excluded
    mdlm = MDLMLoss()(logits=subs, target_ids=ids, noise_mask=noise, p_mask=t, loss_mask=lm)
    assert scdd.total.item() == pytest.approx(mdlm.total.item(), rel=1e-5)
    ratio = SCDDLoss(mask, num_timesteps=T, max_ratio=0.1)(
        logits=logits, target_ids=ids, noisy_ids=noisy, p_mask=t, loss_mask=lm)
    assert abs(ratio.total.item() - mdlm.total.item()) > 1e-3  # the test can tell them apart


# ---- chunked == unchunked, grad accumulation, zero denominators ----------------------------

B, L, VOC = 4, 9, 13


def inputs(seed=0):
    g = torch.Generator().manual_seed(seed)
    return {
        "logits": torch.randn(B, L, VOC, generator=g, requires_grad=True),
        "causal": torch.randn(B, L, VOC, generator=g, requires_grad=True),
        "idlm": torch.randn(B, 2 * L, VOC, generator=g, requires_grad=True),
        "target": torch.randint(0, VOC - 1, (B, L), generator=g),
        "noise": torch.rand(B, L, generator=g) < 0.5,
        "p": torch.rand(B, L, generator=g) * 0.9 + 0.1,
        "sup": (torch.rand(B, L, generator=g) < 0.8).long(),
        "noisy": torch.where(torch.rand(B, L, generator=g) < 0.5,
                             torch.randint(0, VOC, (B, L), generator=g), VOC - 1),
        "t": (torch.randint(1, 11, (B, 1), generator=g) / 10.0).expand(B, L),
        "hidden": torch.randn(B, 6, 7, generator=g, requires_grad=True),
        "weight": torch.randn(VOC, 7, generator=g, requires_grad=True),
        "bias": torch.randn(VOC, generator=g, requires_grad=True),
        "bmask": (torch.rand(B, 6, generator=g) < 0.8).long(),
    }


def run(name, d, rows=slice(None), denoms=None, chunk=None):
    """Loss ``name`` on rows ``rows`` of the batch ``d``; ``denoms``: global denominators."""
    dn = denoms or {}
    r = rows
    if name == "mdlm":
        return MDLMLoss(chunk)(logits=d["logits"][r], target_ids=d["target"][r],
                               noise_mask=d["noise"][r], p_mask=d["p"][r], loss_mask=d["sup"][r],
                               num_tokens=dn.get("main")).total
    if name == "hybrid":
        return HybridLoss(0.3, chunk)(logits=d["logits"][r], target_ids=d["target"][r],
                                      noise_mask=d["noise"][r], p_mask=d["p"][r],
                                      loss_mask=d["sup"][r], causal_logits=d["causal"][r],
                                      num_tokens=dn.get("main"), num_ar_tokens=dn.get("ar")).total
    if name == "block":
        return BlockDiffusionLoss(chunk)(logits=d["logits"][r], target_ids=d["target"][r],
                                         loss_mask=d["sup"][r], num_tokens=dn.get("main")).total
    if name == "encoder_ar":
        return encoder_ar_loss(d["causal"][r], d["target"][r], d["sup"][r],
                               num_tokens=dn.get("main"), chunk_size=chunk)
    if name == "idlm":
        return IDLMLoss(0.2, chunk_size=chunk)(logits=d["idlm"][r], target_ids=d["target"][r],
                                               loss_mask=d["sup"][r],
                                               num_tokens=dn.get("main")).total
    if name == "dflash":
        return DFlashDecayLoss(3, gamma=4.0, normalize="mean", chunk_size=chunk)(
            hidden=d["hidden"][r], lm_head_weight=d["weight"], lm_head_bias=d["bias"],
            target_ids=d["target"][r][:, :6], block_mask=d["bmask"][r],
            num_tokens=dn.get("main")).total
    if name == "dflash_logits":
        return DFlashDecayLoss(4, gamma=None, chunk_size=chunk)(
            logits=d["logits"][r], target_ids=d["target"][r], block_mask=d["sup"][r],
            num_tokens=dn.get("main")).total
    if name == "scdd":
        return SCDDLoss(VOC - 1, num_timesteps=10, max_ratio=0.2, chunk_size=chunk)(
            logits=d["logits"][r], target_ids=d["target"][r], noisy_ids=d["noisy"][r],
            p_mask=d["t"][r], loss_mask=d["sup"][r], num_tokens=dn.get("main")).total
    raise KeyError(name)


LOSSES = ["mdlm", "hybrid", "block", "encoder_ar", "idlm", "dflash", "dflash_logits", "scdd"]
LEAVES = ["logits", "causal", "idlm", "hidden", "weight", "bias"]


def global_denominators(name, d):
    sup = d["sup"] != 0
    if name == "hybrid":
        return {"main": (d["noise"] & sup).sum(), "ar": sup[:, 1:].sum()}
    if name == "encoder_ar":
        return {"main": (sup[:, :-1] & sup[:, 1:]).sum()}
    if name == "idlm":
        return {"main": sup[:, 1:].sum()}
    if name == "dflash":
        return {"main": DFlashDecayLoss(3, gamma=4.0, normalize="mean").local_denominator(
            d["bmask"])}
    return {"main": sup.sum()}


@pytest.mark.parametrize("name", LOSSES)
def test_chunked_equals_unchunked(name):
    d = inputs()
    leaves = [d[k] for k in LEAVES]
    v0, g0 = grads(lambda: run(name, d, chunk=None), *leaves)
    v1, g1 = grads(lambda: run(name, d, chunk=5), *leaves)
    assert v0.item() == pytest.approx(v1.item(), rel=1e-6, abs=1e-7)
    for a, b in zip(g0, g1):
        assert torch.allclose(a, b, rtol=1e-5, atol=1e-7)
    assert any(g.abs().sum() > 0 for g in g0)


@pytest.mark.parametrize("name", LOSSES)
def test_micro_batches_with_global_denominators_match_the_whole_batch(name):
    d = inputs(seed=2)
    leaves = [d[k] for k in LEAVES]
    whole, g_whole = grads(lambda: run(name, d, chunk=4), *leaves)
    dn = global_denominators(name, d)
    split = [slice(0, 1), slice(1, 3), slice(3, 4)]
    _, g_split = grads(lambda: sum(run(name, d, rows=r, denoms=dn, chunk=4) for r in split),
                       *leaves)
    total = sum(run(name, d, rows=r, denoms=dn).item() for r in split)
    assert total == pytest.approx(whole.item(), rel=1e-5)
    for a, b in zip(g_whole, g_split):
        assert torch.allclose(a, b, rtol=1e-5, atol=1e-7)
    # local denominators would not add up: the test distinguishes the two
    local = sum(run(name, d, rows=r).item() for r in split)
    assert local != pytest.approx(whole.item(), rel=1e-3)


@pytest.mark.parametrize("name", LOSSES)
@pytest.mark.parametrize("chunk", [None, 3])
def test_nothing_scored_gives_zero_loss_and_zero_grad(name, chunk):
    d = inputs(seed=3)
    d["sup"] = torch.zeros_like(d["sup"])
    d["bmask"] = torch.zeros_like(d["bmask"])
    leaves = [d[k] for k in LEAVES]
    value, gs = grads(lambda: run(name, d, chunk=chunk), *leaves)
    assert value.item() == 0.0
    assert all(torch.isfinite(g).all() and (g == 0).all() for g in gs)


def test_logits_are_not_modified():
    d = inputs()
    before = d["logits"].detach().clone()
    run("scdd", d, chunk=None)
    run("scdd", d, chunk=4)
    assert torch.equal(before, d["logits"].detach())


@pytest.mark.parametrize(
    "make, match",
    [
        (lambda: DFlashDecayLoss(3, normalize="sum"), "normalize"),
        (lambda: DFlashDecayLoss(1), "block_size"),
        (lambda: DFlashDecayLoss(3, gamma=0.0), "gamma"),
        (lambda: SCDDLoss(3, num_timesteps=1), "num_timesteps"),
        (lambda: SCDDLoss(3, max_ratio=1.5), "max_ratio"),
        (lambda: MDLMLoss(chunk_size=0), "chunk_size"),
        (lambda: HybridLoss(alpha=-1.0), "alpha"),
        (lambda: IDLMLoss(clean_loss_weight=float("nan")), "clean_loss_weight"),
    ],
)
def test_bad_constructor_arguments(make, match):
    with pytest.raises((ValueError, TypeError), match=match):
        make()


def test_bad_call_arguments():
    d = inputs()
    with pytest.raises(ValueError, match="p_mask"):
        MDLMLoss()(logits=d["logits"], target_ids=d["target"], noise_mask=d["noise"],
                   p_mask=d["p"][:, :3], loss_mask=d["sup"])
    with pytest.raises(ValueError, match="logits"):
        MDLMLoss()(logits=d["logits"][:, :3], target_ids=d["target"], noise_mask=d["noise"],
                   p_mask=d["p"], loss_mask=d["sup"])
    with pytest.raises(ValueError, match="mask_token_id"):
        SCDDLoss(VOC, num_timesteps=10)(logits=d["logits"], target_ids=d["target"],
                                        noisy_ids=d["noisy"], p_mask=d["t"], loss_mask=d["sup"])
    with pytest.raises(ValueError, match="vocab_size"):
        SCDDLoss(0, num_timesteps=10)(logits=d["logits"][..., :2], target_ids=d["target"],
                                      noisy_ids=d["noisy"], p_mask=d["t"], loss_mask=d["sup"])
    with pytest.raises(ValueError, match="multiple of block_size"):
        DFlashDecayLoss(3)(logits=d["logits"], target_ids=d["target"], block_mask=d["sup"])
    with pytest.raises(ValueError, match="exactly one"):
        DFlashDecayLoss(3)(target_ids=d["target"][:, :6], block_mask=d["bmask"])
    with pytest.raises(ValueError, match="2L"):
        IDLMLoss()(logits=d["logits"], target_ids=d["target"], loss_mask=d["sup"])
    with pytest.raises(ValueError, match="num_tokens"):
        MDLMLoss()(logits=d["logits"], target_ids=d["target"], noise_mask=d["noise"],
                   p_mask=d["p"], loss_mask=d["sup"], num_tokens=-1)


def test_vocab_sharded_dtensor_logits_are_rejected_with_a_clear_message(tmp_path):
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    from dlmkit.diffusion import IDLMLoss, MDLMLoss

    assert not dist.is_initialized()
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0,
                            world_size=1)
    try:
        mesh = init_device_mesh("cpu", (1,))
        target = torch.randint(0, VOC, (2, 3))
        ones = torch.ones(2, 3)
        sharded = distribute_tensor(torch.randn(2, 3, VOC), mesh, [Shard(2)])
        with pytest.raises(TypeError, match=r"logits is a DTensor .*full_tensor\(\)"):
            MDLMLoss(None)(logits=sharded, target_ids=target, noise_mask=ones.bool(),
                           p_mask=ones, loss_mask=ones)
        doubled = distribute_tensor(torch.randn(2, 6, VOC), mesh, [Shard(2)])
        with pytest.raises(TypeError, match=r"logits is a DTensor .*full_tensor\(\)"):
            IDLMLoss()(logits=doubled, target_ids=target, loss_mask=ones)
    finally:
        dist.destroy_process_group()


def test_scdd_loss_uses_the_tokenizers_vocabulary_when_the_embedding_table_is_padded():
    # One K = V - 1 for corruption, loss and sampler: columns past the tokenizer's vocabulary
    # (a padded embedding table) must not enter the softmax, whatever they hold.
    from dlmkit.diffusion import corrupt_scdd

    vocab, mask_id = 11, 10
    g = torch.Generator().manual_seed(0)
    target = torch.randint(0, mask_id, (3, 8), generator=g)
    sup = torch.ones(3, 8)
    noisy, _, t = corrupt_scdd(target, sup, mask_id, vocab, num_timesteps=20, max_ratio=0.3,
                               generator=torch.Generator().manual_seed(1))
    logits = torch.randn(3, 8, vocab, generator=g)
    wide = torch.cat([logits, torch.full((3, 8, 5), 30.0)], -1).requires_grad_(True)
    kw = dict(target_ids=target, noisy_ids=noisy, p_mask=t, loss_mask=sup)
    for chunk in (None, 7):
        loss = SCDDLoss(mask_id, num_timesteps=20, max_ratio=0.3, chunk_size=chunk,
                        vocab_size=vocab)
        expected = loss(logits=logits, **kw).total
        got = loss(logits=wide, **kw).total
        assert got.item() == pytest.approx(expected.item(), rel=1e-6)
        (grad,) = torch.autograd.grad(got, wide)
        assert not grad[..., vocab:].any()
    with pytest.raises(ValueError, match="fewer than vocab_size 11"):
        SCDDLoss(mask_id, num_timesteps=20, vocab_size=vocab)(logits=logits[..., :9], **kw)


def test_scdd_strategy_gives_its_loss_the_tokenizers_vocabulary():
    from dlmkit import strategies

    strategy = strategies.get("scdd")({}, mask_token_id=5, vocab_size=8)
    assert strategy.loss_fn.vocab_size == 8


@pytest.mark.parametrize("t_min, first", [(0.0, 1), (0.4, 2), (0.5, 3)])
def test_scdd_expected_loss_is_the_scaled_sum_of_the_kept_steps(monkeypatch, t_min, first):
    """corrupt_scdd + SCDDLoss, in expectation (enumerated exactly over the times and the
    corrupted tokens), is ``T / (T - first + 1)`` times the sum of the bound's steps ``i/T``
    from ``first`` on; each step from the forward marginal ``q(z_t | x)`` and the brute-force
    KL. ``t_min = 0``: the whole NELBO."""
    from dlmkit.diffusion import corruption

    T, V, mask, x = 5, 4, 3, 0
    kw = {"max_ratio": 0.3, "gamma_shape": 1.0, "t_peak": 0.5}
    points = T - first + 1
    channels = []  # corrupt_mix's (mask_prob, uniform_prob) per row, as corrupt_scdd sets them
    mix = corruption.corrupt_mix

    def recording(*args, mask_prob, uniform_prob, **rest):
        channels.append((torch.as_tensor(mask_prob).reshape(-1).tolist(),
                         torch.as_tensor(uniform_prob).reshape(-1).tolist()))
        return mix(*args, mask_prob=mask_prob, uniform_prob=uniform_prob, **rest)

    monkeypatch.setattr(corruption, "corrupt_mix", recording)
    # The time is floor(u * points) + first with u uniform: `points` rows in `points` strata
    # draw each kept grid time once, i.e. its exact distribution (mass 1 / points each).
    ids = torch.full((points, 1), x)
    _, _, t = corrupt_scdd(ids, torch.ones(points, 1), mask, V, num_timesteps=T, t_min=t_min,
                           stratum=torch.arange(points, dtype=torch.float64) / points,
                           num_strata=points, generator=torch.Generator().manual_seed(0), **kw)
    times = t[:, 0].tolist()
    assert sorted(times) == pytest.approx([i / T for i in range(first, T + 1)])
    (absorbed, changed), = channels
    row = LOGITS[0, 1, :V]
    loss = SCDDLoss(mask, num_timesteps=T, chunk_size=None, **kw)

    def loss_at(z, time):
        return loss(logits=row.view(1, 1, -1), target_ids=torch.tensor([[x]]),
                    noisy_ids=torch.tensor([[z]]), p_mask=torch.tensor([[time]]),
                    loss_mask=torch.ones(1, 1)).total.item()

    others = [v for v in range(V) if v not in (x, mask)]
    expected = sum((absorbed[r] * loss_at(mask, time)
                    + (1 - absorbed[r] - changed[r]) * loss_at(x, time)
                    + sum(changed[r] / len(others) * loss_at(z, time) for z in others))
                   / points for r, time in enumerate(times))

    def sched(u):
        m = scdd_schedule(torch.tensor(u, dtype=torch.float64), **kw)
        return m.gamma.item(), m.rho.item()

    def step(i):  # the bound's step i/T: E over z ~ q(z_t | x) of KL(q(z_s | z_t, x) || p)
        gamma, rho = sched(i / T)
        k = V - 1
        marginal = {mask: 1 - gamma, x: gamma * (rho + (1 - rho) / k),
                    **{z: gamma * (1 - rho) / k for z in others}}
        return sum(q * scdd_step_kl(row, x, z, mask, i / T, T, sched) / T
                   for z, q in marginal.items() if q > 0)

    kept = sum(step(i) for i in range(first, T + 1))
    assert expected == pytest.approx(T / points * kept, rel=1e-4)
    if first > 1:  # the scale is there: the expectation is not the partial sum itself
        assert abs(expected - kept) > 0.1 * kept
