"""dlmkit's block_diffusion sampler against transformers' own ``DiffusionGemma.generate``.

    python bench/diffusion_gemma_generate.py --model runs/block_diffusion-reverse/final \\
        -n 256 --threads 1

On the same exported model and the same problems of its bundled task, prompts grouped into
batches of equal length (transformers gives left-padded rows other position ids than dlmkit,
so only unpadded batches are comparable), each batch seeded with ``--seed + batch number``:

* ``transformers``: ``model.generate(input_ids, max_new_tokens, max_denoising_steps,
  eos_token_id, pad_token_id, t_min, t_max, stability_threshold, confidence_threshold)`` after
  ``torch.manual_seed(seed)`` (its entropy-bound sampler, bound 0.1 by default);
* ``dlmkit_equivalent``: :func:`dlmkit.families.block_diffusion.decode.sample_canvas` with the same
  settings (``entropy_bound``, ``t_min``/``t_max``, adaptive stopping, steps per canvas) and one
  ``torch.Generator`` seeded the same: it draws in transformers' order, so the outputs must be
  the same (``same_output`` = share of responses identical to transformers');
* dlmkit's own commit rules: ``--steps`` greedy confidence schedule, and with a threshold.

Per setting (one JSON line each): exact match, decoder forwards (batch calls), tokens per
forward (per sequence), tokens/s. Wall-clock figures compare settings of one run only.
"""

from __future__ import annotations

import argparse
import json
import time
from collections import defaultdict

import torch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="export of a block_diffusion run")
    parser.add_argument("-n", type=int, default=256, help="problems of the test split")
    parser.add_argument("--denoising-steps", type=int, default=16,
                        help="max denoising steps per canvas (transformers' default is 48)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    from dlmkit.data.tasks import get_task
    from dlmkit.decoding.runner import Runner
    from dlmkit.families.block_diffusion.decode import sample_canvas
    from dlmkit.generate import load, sampler_config
    from dlmkit.generate.api import _strip, encode_prompt

    loaded = load(args.model)
    model, tok, meta = loaded.model, loaded.tokenizer, loaded.meta
    block, gen = int(meta["block_size"]), int(meta["max_new_tokens"])
    canvases = -(-gen // block)
    records = get_task(meta["task"]).records("test", n=args.n, seed=0)
    groups = defaultdict(list)
    for record in records:
        groups[len(encode_prompt(tok, record["prompt"]))].append(record)
    stop_ids = tuple(tok.stop_token_ids)
    shared = dict(t_min=0.4, t_max=0.8, stability_threshold=1, confidence_threshold=0.005)
    N = args.denoising_steps

    def ours(options):
        cfg = sampler_config("block_diffusion", max_new_tokens=gen,
                                         block_size=block, **options)

        def run(ids, seed):
            runner = Runner(model, vocab_size=tok.vocab_size)
            out = sample_canvas(runner, ids.tolist(), cfg, pad_id=tok.pad_token_id,
                                stop_ids=stop_ids, generator=torch.Generator().manual_seed(seed))
            return out.tolist(), runner.forwards, runner.row_forwards
        return run

    def theirs(ids, seed):
        calls = []
        hook = model.model.decoder.register_forward_hook(lambda *a: calls.append(1))
        torch.manual_seed(seed)
        out = model.generate(ids, max_new_tokens=gen, max_denoising_steps=N,
                             eos_token_id=list(stop_ids), pad_token_id=tok.pad_token_id,
                             **shared)
        hook.remove()
        new = out.sequences[:, ids.shape[1]:]
        valid = (new != tok.pad_token_id).sum(-1).float()
        tpf = out.tokens_per_forward
        rows = float(torch.where(tpf > 0, valid / tpf, 0).sum())  # per-row decoder passes
        return new.tolist(), len(calls), rows

    settings = {
        "transformers": theirs,
        "dlmkit_equivalent": ours({"entropy_bound": 0.1, "steps": N * canvases, **shared}),
        "dlmkit_confidence": ours({"steps": block * canvases}),
        "dlmkit_threshold_0.9": ours({"steps": 4 * block * canvases, "threshold": 0.9}),
    }
    first = torch.tensor([encode_prompt(tok, r["prompt"]) for r in min(groups.items())[1]])
    with torch.no_grad():  # warm-up: first calls pay one-off costs
        for run in settings.values():
            run(first, args.seed)
    outputs = {}
    for name, run in settings.items():
        correct = forwards = row_forwards = generated = 0
        texts = []
        start = time.perf_counter()
        for number, (_, group) in enumerate(sorted(groups.items())):
            ids = torch.tensor([encode_prompt(tok, r["prompt"]) for r in group])
            with torch.no_grad():
                rows, calls, per_row = run(ids, args.seed + number)
            forwards += calls
            row_forwards += per_row
            for record, row in zip(group, rows):
                tokens, count = _strip(row, stop_ids, tok.mask_token_id)
                text = tok.decode(tokens, skip_special_tokens=True)
                texts.append(text)
                generated += count
                correct += text == record["response"]
        seconds = time.perf_counter() - start
        outputs[name] = texts
        result = {"setting": name, "exact_match": correct / len(records),
                  "forwards": forwards, "tokens_per_forward": generated / max(row_forwards, 1),
                  "tokens_per_s": generated / seconds, "seconds": seconds}
        if name != "transformers":
            result["same_output"] = sum(a == b for a, b in zip(texts, outputs["transformers"])
                                        ) / len(texts)
        print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
