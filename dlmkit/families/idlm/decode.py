"""I-DLM introspective strided decoding (ISD).

I-DLM is trained on ``[x_t | x_0]`` under ``idlm(L, S)`` with both halves shifted (position
``i`` predicts token ``i + 1``): the clean stream is an ordinary causal LM, and a noisy block of
MASK tokens starting at ``B`` (seeing the clean tokens before ``B``, causal inside) predicts
tokens ``B + 1 .. B + N``. One forward therefore both *verifies* and *proposes*:

    queries  [anchor, d_1 .. d_V  (clean, to verify) | N MASK (noisy, to propose)]
    keys     [cache | the same]        mask: causal (``idlm_decode``)

* the anchor (the token the clean stream predicted last time) is already exact;
* proposal ``d_i`` is accepted while the clean logits before it agree (greedy: it equals their
  argmax; sampling: accepted with probability ``min(1, p(d)/q(d))``, a rejection resamples from
  ``max(0, p - q)``), so the committed tokens are exactly what autoregressive decoding of the
  clean stream would produce (greedy: token for token);
* the clean logits after the last accepted token give the next anchor;
* if every proposal was accepted, the noisy block (which sat right after them) holds valid
  proposals for the ``N`` tokens after the anchor; otherwise the next forward proposes afresh.

Each forward commits between 1 and ``N + 1`` tokens per row. Rejected proposals stay in the KV
cache as holes the mask blocks (:mod:`.stream`), so rows of a batch advance independently.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from dlmkit.decoding.primitives import gumbel, sample_tokens
from dlmkit.decoding.stream import CausalStream, exclude, pad_chunks
from dlmkit.diffusion import rng
from dlmkit.diffusion.rng import Generators

from .options import IDLMSampling


def _draw(probs: torch.Tensor, generator: torch.Generator) -> int:
    """One sample of a float64 probability vector (Gumbel-max on its log)."""
    return int((probs.log() + gumbel(probs.shape, generator, probs.device)).argmax())


def sample_isd(runner, prompts: Sequence[Sequence[int]], *, max_new_tokens: int, stride: int,
               temperature: float, mask_id: int, pad_id: int, stop_ids: Sequence[int],
               generator: Generators) -> list[list[int]]:
    """Each row's tokens, up to and including its first stop token (at most
    ``max_new_tokens``)."""
    batch = len(prompts)
    if any(len(p) == 0 for p in prompts):
        raise ValueError("every prompt needs at least one token")
    stream = CausalStream(runner, batch)
    stops = set(stop_ids)
    out: list[list[int]] = [[] for _ in range(batch)]
    active = [True] * batch
    feed = [list(p) for p in prompts]  # clean tokens of the next forward
    known = [len(p) for p in prompts]  # how many of them are already committed
    draft_q: list[torch.Tensor | None] = [None] * batch  # proposal distributions (sampling)
    greedy = temperature == 0
    while any(active):
        ids, valid = pad_chunks([f if a else [] for f, a in zip(feed, active)], pad_id,
                                runner.device)
        clean, noisy = stream.forward(ids, valid, stride, mask_id)
        clean, noisy = exclude(clean, mask_id), exclude(noisy, mask_id)
        width = ids.shape[1]
        if greedy:
            # Greedy needs only each position's argmax: two batched ops and plain lists, not
            # a few small tensor ops per row and token (most of the non-model time of a
            # batched forward).
            clean_best = clean.argmax(-1).tolist()
            noisy_best = noisy.argmax(-1).tolist()
        kept = [[0, 0] for _ in range(batch)]  # per row: the kept columns [lo, hi)
        for row in range(batch):
            if not active[row]:
                continue
            fed, a = feed[row], known[row]
            gen = rng.for_row(generator, row)  # a row's draws never depend on the others
            col0 = width - len(fed)  # column of fed[0]
            accepted, anchor = 0, None
            for i in range(a, len(fed)):
                if greedy:
                    if clean_best[row][col0 + i - 1] != fed[i]:
                        break
                else:
                    p = torch.softmax(clean[row, col0 + i - 1].double() / temperature, -1)
                    q = draft_q[row][i - a]
                    ratio = (p[fed[i]] / q[fed[i]]).clamp(max=1.0)
                    if float(torch.rand((), generator=gen, dtype=torch.float64)) >= ratio:
                        residual = (p - q).clamp(min=0)
                        anchor = _draw(residual / residual.sum(), gen)
                        break
                accepted += 1
            last = col0 + a - 1 + accepted
            kept[row] = [col0, last + 1]
            if anchor is None:
                anchor = clean_best[row][last] if greedy else \
                    int(sample_tokens(clean[row, last], temperature, gen))
            new = fed[a:a + accepted] + [anchor]
            for token in new:
                out[row].append(token)
                if token in stops or len(out[row]) >= max_new_tokens:
                    active[row] = False
                    break
            runner.committed(row, out[row])
            if accepted == len(fed) - a:
                proposals = noisy_best[row] if greedy else \
                    sample_tokens(noisy[row], temperature, gen).tolist()
                if temperature > 0:
                    draft_q[row] = torch.softmax(noisy[row].double() / temperature, -1)
                feed[row] = [anchor, *proposals]
            else:
                feed[row] = [anchor]
            known[row] = 1
        kept = torch.tensor(kept, device=runner.device)
        columns = torch.arange(width, device=runner.device)
        stream.commit((columns >= kept[:, :1]) & (columns < kept[:, 1:]))
    return out


def decode(runner, encoded, cfg: IDLMSampling, **ids) -> list[list[int]]:
    """The idlm sampler (:class:`~dlmkit.families.family.Family` ``decode``)."""
    return sample_isd(runner, encoded, max_new_tokens=cfg.max_new_tokens, stride=cfg.block_size,
                      temperature=cfg.temperature, **ids)
