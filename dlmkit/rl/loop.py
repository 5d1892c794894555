"""The ``dlmkit rl`` loop: rollouts, rewards, advantages, clipped policy-gradient updates.

One step (:func:`rl_step`) over all ranks: the step's prompts (a pure function of the step,
:class:`~dlmkit.data.GlobalBatchSampler`) are shared out; each rank decodes ``G`` completions
of each of its prompts with the family's sampler (:mod:`.rollout`), scores them with the
reward, normalises the rewards within each prompt's group, draws each completion's estimator
noise and takes ``objective.updates_per_rollout`` optimizer steps of the clipped objective
(:mod:`.objective`) over its completions in micro-batches, with the number of completions over
all ranks as the denominator. Everything random is a function of ``(seed, step, prompt,
completion)``, so a resumed run repeats the steps it redoes bit for bit. The SFT recipe's
machinery does the rest: the process group and DDP or FSDP2, the run directory's lock, atomic
checkpoints, ``metrics.jsonl``, the progress display.
"""

from __future__ import annotations

import json
import math
import sys
import time
from contextlib import contextmanager, nullcontext
from pathlib import Path

import torch

from dlmkit.train.checkpoint import find_resume_point, load_checkpoint, save_checkpoint
from dlmkit.train.config import ConfigError, dump_yaml
from dlmkit.train.distributed import (
    World,
    all_reduce_sum,
    barrier,
    init_world,
    shutdown,
    wrap_model,
)
from dlmkit.train.metrics import MetricsLog, plot_curves
from dlmkit.train.precision import Precision, autocast
from dlmkit.train.preflight import check_device
from dlmkit.train.progress import Progress
from dlmkit.train.rundir import check_new_run_dir, check_writable, create_run_dir, lock_run_dir

from .config import sampler_options
from .estimators import estimator_for
from .objective import clipped_surrogate, group_advantages, k3
from .rewards import resolve_reward, score
from .rollout import NOISE_STREAM, completion_generator, rollout


def load_prompts(config: dict) -> list[dict]:
    """The prompt records: ``{"prompt": text or conversation, "text": the last user turn,
    "response": the reference answer, "source": where it came from}`` (+ a task's fields)."""
    d = config["data"]
    if d["task"]:
        from dlmkit.data.tasks import get_task

        try:
            task = get_task(d["task"], **(d["task_options"] or {}))
        except (TypeError, ValueError) as err:
            raise ConfigError(f"data.task {d['task']!r}: {err}") from None
        records = task.records(d["split"], n=d["num_prompts"], seed=config["seed"])
        return [{**r, "text": r["prompt"], "source": f"{d['task']}[{i}]"}
                for i, r in enumerate(records)]
    from dlmkit.data.records import load_records

    out = []
    for record in load_records(d["files"], d["fields"] or None):
        messages = list(record.messages)
        last = max(i for i, m in enumerate(messages) if m["role"] == "assistant")
        prompt = [dict(m) for m in messages[:last]]
        users = [m["content"] for m in prompt if m["role"] == "user"]
        if not users:
            raise ConfigError(f"{record.source}: no user turn before the answer to prompt with")
        out.append({"prompt": prompt, "text": users[-1],
                    "response": messages[last]["content"], "source": record.source})
    return out


def lr_factor(step: int, warmup: int) -> float:
    return (step + 1) / warmup if step < warmup else 1.0


class Policy:
    """Everything the loop trains with (see :func:`build_policy`)."""

    def __init__(self, **parts) -> None:
        self.__dict__.update(parts)


def build_policy(config: dict, world: World) -> Policy:
    """Load the SFT export (model, tokenizer, family), the reference, data, reward, sampler
    and optimizer; every input error surfaces here, before any step."""
    from dlmkit import strategies
    from dlmkit.data import GlobalBatchSampler
    from dlmkit.generate import api

    try:
        loaded = api.load(config["policy"], device=world.device, what="policy")
    except ValueError as err:
        raise ConfigError(str(err)) from None
    family = loaded.meta.get("strategy")
    if family not in strategies.names():
        raise ConfigError(f"policy {config['policy']}: its dlmkit.json names no dlmkit family "
                          f"(strategy {family!r}); rl starts from an export of `dlmkit train`")
    strategy_cls = strategies.get(family)
    try:
        estimator = estimator_for(strategy_cls, loaded.meta, config, loaded.tokenizer)
        reward = resolve_reward(config["reward"]["function"], config["reward"]["pattern"])
    except ValueError as err:
        raise ConfigError(str(err)) from None
    try:
        name, sampler_opts = sampler_options(config)
        sampler_cfg = loaded.config(name, **sampler_opts)
    except ValueError as err:  # the rollout's seed is not an option there (see rollout.py)
        raise ConfigError(f"rollout.sampler: {err}") from None
    records = load_prompts(config)
    ro = config["rollout"]
    if ro["prompts_per_step"] % world.world_size:
        raise ConfigError(f"rollout.prompts_per_step={ro['prompts_per_step']} must be a multiple "
                          f"of the number of ranks ({world.world_size})")
    sampler = GlobalBatchSampler(len(records), ro["prompts_per_step"], rank=world.rank,
                                 world_size=world.world_size, seed=config["seed"])
    model = loaded.model.float()
    lora = config["lora"]
    if lora is not None:  # adapters injected in place; everything else frozen
        from dlmkit.models.lora import apply_lora

        try:
            # the adapters' random initialisation from the run's seed: the same on every rank
            # (FSDP2 broadcasts nothing) and in every run of this config
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(config["seed"])
                apply_lora(model, {**lora, "export": "merged"}, key="lora")
        except (ValueError, ImportError) as err:
            raise ConfigError(str(err)) from None
    else:
        for p in model.parameters():
            p.requires_grad_(True)
    t = config["train"]
    reference = None
    # A LoRA policy's own base is its reference: scored with the adapters off, no copy
    base_reference = lora is not None and config["reference"] is None
    if config["objective"]["kl_beta"] > 0 and not base_reference:
        try:
            reference = api.load(config["reference"] or config["policy"], device=world.device,
                                 what="reference").model.float().eval()
        except ValueError as err:
            raise ConfigError(str(err)) from None
        reference.requires_grad_(False)
        if t["distributed"] == "fsdp2":  # sharded like the policy; frozen, so never updated
            reference = wrap_model(reference, world, "fsdp2")
    # No MixedPrecisionPolicy under FSDP2: the weights are gathered in fp32, so rollouts decode
    # with the very weights of one process, and the updates compute in bf16 through autocast,
    # as under DDP.
    model = wrap_model(model, world, t["distributed"])
    trainable = [q for q in model.parameters() if q.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=t["lr"], betas=tuple(t["betas"]),
                                  weight_decay=t["weight_decay"])
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: lr_factor(s, t["warmup_steps"]))
    mode = t["autocast"]
    if mode == "auto":
        mode = "bf16" if world.device.type == "cuda" else "none"
    precision = Precision(master=torch.float32, storage=torch.float32,
                          compute=torch.bfloat16 if mode == "bf16" else None)
    return Policy(model=model, tokenizer=loaded.tokenizer, meta=loaded.meta, family=family,
                  fixed_length=bool(strategy_cls.fixed_length), estimator=estimator,
                  # the block family's rows end in whole blocks (the collator's EOS fill)
                  block_fill=estimator.block_size if estimator.layout == "block" else None,
                  sampler_cfg=sampler_cfg, reward=reward, records=records, sampler=sampler,
                  reference=reference, optimizer=optimizer, scheduler=scheduler,
                  precision=precision,
                  base_reference=base_reference and config["objective"]["kl_beta"] > 0,
                  trainable=sum(q.numel() for q in trainable),
                  parameters=sum(q.numel() for q in model.parameters()))


def rl_step(step: int, p: Policy, config: dict, world: World) -> dict:
    """One rollout batch and its ``updates_per_rollout`` optimizer steps; returns its metrics
    (``rollout_s``, ``update_s``: this rank's seconds; ``tokens``: completion tokens, all
    ranks)."""
    ro, o, t = config["rollout"], config["objective"], config["train"]
    G = ro["group_size"]
    model = p.model
    inner = getattr(model, "module", model)
    start = time.perf_counter()
    indices = p.sampler.local_batch(step)
    with gathered(model):
        completions = rollout(inner, p.tokenizer,
                              [(i, p.records[i]["prompt"]) for i in indices], G, p.sampler_cfg,
                              seed=config["seed"], step=step, batch_size=ro["batch_size"],
                              fixed_length=p.fixed_length, block_fill=p.block_fill)
    rewards = torch.tensor([
        score(p.reward, p.records[c.prompt_index]["text"], c.text, p.records[c.prompt_index],
              where=f"prompt {c.prompt_index} ({p.records[c.prompt_index]['source']}: "
                    f"{p.records[c.prompt_index]['text']!r})")
        for c in completions], dtype=torch.float64).view(len(indices), G)
    advantages = group_advantages(rewards, o["scale_rewards"]).reshape(-1)
    rollout_s = time.perf_counter() - start

    start = time.perf_counter()
    items = [(c.prompt_ids, c.ids) for c in completions]
    noises = [p.estimator.draw(len(c.prompt_ids), len(c.ids), completion_generator(
        config["seed"], step, c.prompt_index, c.completion, NOISE_STREAM)) for c in completions]
    lengths = torch.tensor([len(c.ids) for c in completions], dtype=torch.float64,
                           device=world.device)
    advantages = advantages.to(world.device)
    total = float(all_reduce_sum(torch.tensor([float(len(items))], device=world.device), world))
    micro = t["micro_batch_size"] or len(items)
    chunks = [range(a, min(a + micro, len(items))) for a in range(0, len(items), micro)]
    # Every rank has as many chunks (the same number of completions), but a chunk makes one
    # forward per row length, so under FSDP2 (a collective all-gather in every forward) each
    # chunk makes as many forwards as its counterpart with the most on any rank.
    forwards = [0] * len(chunks)
    if world.distributed and t["distributed"] == "fsdp2":
        import torch.distributed as dist

        counts = torch.tensor([p.estimator.forwards([items[i] for i in c],
                                                    [noises[i] for i in c]) for c in chunks],
                              device=world.device)
        dist.all_reduce(counts, op=dist.ReduceOp.MAX)
        forwards = counts.tolist()

    def scores(net, j):
        chunk = chunks[j]
        with autocast(p.precision, world.device):
            return p.estimator.score(net, [items[i] for i in chunk], [noises[i] for i in chunk],
                                     forwards[j])

    old = ref = None
    with torch.no_grad():
        if o["updates_per_rollout"] > 1:  # the rollout policy's scores, under the same noise
            old = torch.cat([scores(inner, j) for j in range(len(chunks))])
        if p.reference is not None:
            ref = torch.cat([scores(p.reference, j) for j in range(len(chunks))])
        elif p.base_reference:  # the LoRA policy's base: the same weights, adapters off
            from dlmkit.models.lora import adapters_disabled

            with adapters_disabled(inner):
                ref = torch.cat([scores(inner, j) for j in range(len(chunks))])
    sums = torch.zeros(4, dtype=torch.float64)  # loss, kl, clipped, ratio sum
    grad_norm = float("nan")
    model.train()
    for _ in range(o["updates_per_rollout"]):
        for j, chunk in enumerate(chunks):
            last = j == len(chunks) - 1
            # DDP skips the gradient all-reduce inside no_sync(); FSDP2 has a switch instead
            sync = model.no_sync() if world.distributed and not last \
                and hasattr(model, "no_sync") else nullcontext()
            if world.distributed and hasattr(model, "set_requires_gradient_sync"):
                model.set_requires_gradient_sync(last)
            with sync:
                logp = scores(model, j)
                sel = torch.tensor(list(chunk), device=world.device)
                before = logp.detach() if old is None else old[sel]
                surrogate, clipped = clipped_surrogate(logp, before, advantages[sel],
                                                       lengths[sel], o["clip_epsilon"])
                loss = -surrogate.sum() / total
                kl = torch.zeros_like(surrogate)
                if ref is not None:
                    kl = k3(logp, ref[sel], lengths[sel])
                    loss = loss + o["kl_beta"] * kl.sum() / total
                # DDP and FSDP2 average gradients over ranks; ours is a global sum
                (loss * world.world_size).backward()
            sums += torch.stack([loss.detach().cpu(), kl.detach().sum().cpu(),
                                 clipped.sum().double().cpu(),
                                 torch.exp((logp.detach() - before) / lengths[sel]).sum().cpu()])
        if t["max_grad_norm"]:
            grad_norm = float(torch.nn.utils.clip_grad_norm_(model.parameters(),
                                                             t["max_grad_norm"]))
        p.optimizer.step()
        p.optimizer.zero_grad(set_to_none=True)
    p.scheduler.step()
    update_s = time.perf_counter() - start

    local = torch.cat([sums, torch.tensor([
        float(rewards.sum()), float((rewards ** 2).sum()), float(advantages.abs().sum()),
        float(rewards.std(1).sum()), float((rewards.std(1) == 0).sum()), float(lengths.sum()),
        float(rewards.shape[0])], dtype=torch.float64)])
    g = all_reduce_sum(local.to(world.device), world).cpu().tolist()
    updates = o["updates_per_rollout"]
    loss = g[0] / updates
    if not math.isfinite(loss):
        raise FloatingPointError(f"step {step}: loss is {loss}; stopping (check train.lr)")
    n, prompts = total, g[10]
    return {"loss": loss, "reward": g[4] / n,
            "reward_std": math.sqrt(max(g[5] / n - (g[4] / n) ** 2, 0.0)),
            "group_reward_std": g[7] / prompts, "zero_spread_groups": g[8] / prompts,
            "advantage_abs": g[6] / n, "kl": g[1] / (n * updates),
            "clip_fraction": g[2] / (n * updates), "ratio": g[3] / (n * updates),
            "completion_tokens": g[9] / n, "grad_norm": grad_norm,
            "rollout_s": rollout_s, "update_s": update_s, "tokens": g[9]}


@contextmanager
def gathered(model):
    """Under FSDP2: the whole model unsharded for the block (one all-gather per shard group,
    in the same order on every rank) and kept so through every forward, which then makes no
    collective. Rollouts need it: each rank decodes its own prompts and a sampler stops when
    its rows finish, so ranks make different numbers of forwards. Anything else: no-op."""
    from torch.distributed.fsdp import FSDPModule

    if not isinstance(model, FSDPModule):
        yield
        return
    units = [m for m in model.modules() if isinstance(m, FSDPModule)]
    model.set_reshard_after_forward(False)
    try:
        for unit in units:
            unit.unshard()
        yield
    finally:
        for unit in units:
            unit.reshard()
        # fully_shard's defaults: every unit but the root reshards after its forward
        model.set_reshard_after_forward(True)
        model.set_reshard_after_forward(False, recurse=False)


def export_policy(run_dir: Path, p: Policy, config: dict, world: World) -> Path:
    """``RUN/final``: the trained policy as a model directory of the same family, its
    ``dlmkit.json`` the SFT export's plus ``rl`` (the policy it started from)."""
    from dlmkit.models import make_readable, write_token_ids

    final = run_dir / "final"
    state = None
    if config["train"]["distributed"] == "fsdp2" and world.distributed:  # gather the shards
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        state = get_model_state_dict(p.model, options=StateDictOptions(full_state_dict=True,
                                                                       cpu_offload=True))
    if world.is_main:
        inner = getattr(p.model, "module", p.model)
        if config["lora"] is not None:  # the adapters merged into a plain copy of the policy
            from dlmkit.generate import api
            from dlmkit.models.lora import apply_lora, save_lora_export

            options = {**config["lora"], "export": "merged"}
            fresh = apply_lora(api.load(config["policy"], what="policy").model.float(), options)
            save_lora_export(final, fresh, inner.state_dict() if state is None else state,
                             options)
        else:
            inner.save_pretrained(final, state_dict=state)
        p.tokenizer.save_pretrained(final)
        write_token_ids(final, p.tokenizer)
        meta = {**p.meta, "rl": {"policy": config["policy"],
                                 "estimator": config["objective"]["estimator"],
                                 "steps": config["train"]["steps"]}}
        (final / "dlmkit.json").write_text(json.dumps(meta, indent=1))
        make_readable(final)
    barrier(world)
    return final


def plot_rl_curves(metrics_path: Path, out_path: Path) -> Path | None:
    """Reward and KL per step (``RUN/reward.png``)."""
    return plot_curves(metrics_path, out_path,
                       [("train", "reward", "mean reward", {}),
                        ("train", "kl", "KL (k3, per token)", {})])


def default_run_dir() -> Path:
    return Path("runs") / f"rl-{time.strftime('%Y%m%d-%H%M%S')}"


def run(config: dict, *, resume: bool = False, overwrite: bool = False) -> Path:
    """Train as configured; returns the run directory. ``resume``: continue
    ``config["output_dir"]`` from its newest complete checkpoint (``config`` is then the run's
    own, see :func:`resume_config`)."""
    check_device(config["train"]["device"])
    world = init_world(config["train"]["device"])
    held: dict = {}
    try:
        run_dir = _run(config, world, resume, overwrite, held)
    except BaseException:
        shutdown(world, clean=False)
        raise
    finally:
        if held.get("metrics") is not None:
            held["metrics"].close()
        if held.get("lock") is not None:
            held["lock"].release()
    shutdown(world)
    return run_dir


def _run(config: dict, world: World, resume: bool, overwrite: bool, held: dict) -> Path:
    t = config["train"]
    if t["threads"]:
        torch.set_num_threads(int(t["threads"]))
    run_dir = Path(config["output_dir"] or default_run_dir())
    if world.distributed:
        import torch.distributed as dist

        shared = [str(run_dir)]
        dist.broadcast_object_list(shared, src=0)
        run_dir = Path(shared[0])
    check_writable(run_dir)
    held["lock"] = lock_run_dir(run_dir, world)
    if not resume:
        check_new_run_dir(run_dir, overwrite=overwrite)
    messages = Progress(enabled=world.is_main, show_steps=False, total=t["steps"], initial=0,
                        desc="")
    p = build_policy(config, world)
    start = 0
    if resume:
        point = find_resume_point(run_dir)
        start = load_checkpoint(point.path, p.model, p.optimizer, p.scheduler, world)
        if start > t["steps"]:
            raise ConfigError(f"--resume: {point.path} is at step {start}, beyond train.steps="
                              f"{t['steps']}; set train.steps >= {start}")
        messages.message(f"resuming from step {start} of {t['steps']} ({point.path})")
    elif world.is_main:
        create_run_dir(run_dir, overwrite=overwrite)
    barrier(world)
    messages.message(f"rl: {p.family} policy {config['policy']}, {len(p.records)} prompts, "
                     f"{config['rollout']['group_size']} completions each, estimator "
                     f"{config['objective']['estimator']}, sampler {p.sampler_cfg.sampler}")
    if config["lora"] is not None:
        lora = config["lora"]
        messages.message(
            f"rl: LoRA r={lora['r']} alpha={lora['alpha']} on {lora['target_modules']}: "
            f"{p.trainable:,} of {p.parameters:,} parameters train"
            + ("; the KL reference is the policy with its adapters off" if p.base_reference
               else ""))
    if world.is_main:
        (run_dir / "config.yaml").write_text(dump_yaml(config))
    metrics = held["metrics"] = MetricsLog(run_dir / "metrics.jsonl", world.is_main,
                                           resume_step=start)
    progress = Progress(enabled=world.is_main, show_steps=t["progress"], total=t["steps"],
                        initial=start, desc=f"rl {p.family}")
    window = dict.fromkeys(("rollout_s", "update_s", "tokens"), 0.0)
    for step in range(start, t["steps"]):
        stats = rl_step(step, p, config, world)
        for key in window:  # the record's seconds and throughput: since the previous record
            window[key] += stats.pop(key)
        done = step + 1
        if done % t["log_every"] == 0 or done == t["steps"]:
            seconds = window["rollout_s"] + window["update_s"]
            record = {"split": "train", "step": done, "lr": p.scheduler.get_last_lr()[0],
                      **stats, "rollout_s": window["rollout_s"],
                      "update_s": window["update_s"],
                      "tokens_per_s": window["tokens"] / max(seconds, 1e-9)}
            metrics.write(record)
            progress.logged(done, record)
            window = dict.fromkeys(window, 0.0)
        if done % t["save_every"] == 0 or done == t["steps"]:
            save_checkpoint(run_dir, done, p.model, p.optimizer, p.scheduler, world,
                            config=config)
        progress.advance()
    progress.close()
    if not sys.stderr.isatty():  # transformers' shard-writing bar: \r-joined junk in a log
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
    final = export_policy(run_dir, p, config, world)
    if world.is_main:
        plot_rl_curves(run_dir / "metrics.jsonl", run_dir / "reward.png")
        print(f"run directory: {run_dir}\nfinal model: {final}")
    return run_dir


def resume_config(run_dir: str | Path, overrides: list[str]) -> dict:
    """The config of the run in ``run_dir`` (its ``config.yaml``) with ``overrides`` applied;
    only :data:`~.config.RESUMABLE_KEYS` may change."""
    from dlmkit.train.config import _merge, flatten, load_yaml, parse_override

    from .config import RESUMABLE_KEYS, validate

    saved = Path(run_dir) / "config.yaml"
    if not saved.is_file():
        raise ConfigError(f"--resume: {saved} does not exist (not a dlmkit rl run directory)")
    config = load_yaml(saved.read_text())
    for item in overrides:
        keys, value = parse_override(item)
        key = ".".join(keys)
        update: dict = value  # type: ignore[assignment]
        for part in reversed(keys):
            update = {part: update}
        changed = [k for k in flatten(update) if k not in RESUMABLE_KEYS]
        if changed:
            raise ConfigError(f"--resume: --set {key} would change what the run trains; a "
                              f"resume may change only {', '.join(RESUMABLE_KEYS)}")
        config = _merge(config, update)
    config["output_dir"] = str(run_dir)
    return validate(config)
