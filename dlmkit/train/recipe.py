"""The SFT recipe: one function per phase, the whole training step in ``train_step``.

Written for torchrun from the start: with ``WORLD_SIZE=1`` it is the same code without a
process group. Per optimizer step, every rank takes its share of the global batch (a pure
function of the step), splits it into micro-batches, corrupts each with per-sample generators
seeded from ``(seed, step, global sample index)``, sums the loss denominators over micro-batches
and ranks, and only then runs the forwards — so the gradient is the whole-batch token mean
whatever the split, and resuming at a step reproduces its noise exactly.
"""

from __future__ import annotations

import json
import math
import signal
import sys
import threading
import time
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path

import torch

from dlmkit import strategies
from dlmkit.data import (
    Collator,
    GlobalBatchSampler,
    SFTDataset,
    eval_batches,
    load_tokenizer,
)
from dlmkit.data.collate import Batch
from dlmkit.data.seeds import document_generators, split_generators
from dlmkit.data.slots import doc_slots
from dlmkit.data.split_tokens import piece_splits, split_sample
from dlmkit.models import resolve_attention

from .best import BestModel
from .budget import resolve_budget, resolve_warmup
from .checkpoint import load_checkpoint, newest_complete_checkpoint, save_checkpoint
from .config import ConfigError, RunConfig, dump_yaml
from .distributed import World, all_reduce_sum, barrier, init_world, shutdown, wrap_model
from .early_stopping import EarlyStopping
from .ema import WeightAverage
from .metrics import MetricsLog, plot_loss_curve
from .precision import autocast as precision_autocast
from .precision import (
    export_state,
    fsdp_policy,
    place_parameters,
    record_export_dtype,
    resolve_precision,
    resolve_storage_dtype,
    warn_pure_bf16,
)
from .preflight import check_attention, check_device, check_model_overrides
from .progress import Progress, data_summary
from .regime import lora_warning, resolve_regime, resolve_regime_options, small_checkpoint_warning
from .resume import ResumePlan, data_fingerprints, plan_resume, record_data_files
from .rundir import check_new_run_dir, check_writable, create_run_dir, lock_run_dir
from .truncation import apply_length_cap


def build_datasets(config: RunConfig, tokenizer):
    d = config.data
    if d.train_files:
        train = SFTDataset.from_files(d.train_files, tokenizer, d.fields)
        val = SFTDataset.from_files(d.validation_files, tokenizer, d.fields) \
            if d.validation_files else None
    else:
        opts = d.task_options or {}
        train = SFTDataset.from_task(d.task, "train", tokenizer, n=d.num_train,
                                     seed=config.seed, **opts)
        val = SFTDataset.from_task(d.task, "validation", tokenizer, n=d.num_validation,
                                   seed=config.seed, **opts)
    return train, val


def build_collator(config: RunConfig, tokenizer, strategy,
                   pad_to: int | None = None) -> Collator:
    """The collator of this run; ``pad_to``: :func:`trained_row_length`."""
    d = config.data
    block = strategy.config.get("block_size") if d.block_align else None
    if d.pack and not strategy.supports_packing:
        packing = [n for n in strategies.names() if strategies.get(n).supports_packing]
        raise ConfigError(f"data.pack is not supported by strategy {strategy.name!r}; "
                          f"use one of {packing}")
    return Collator(pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
                    block_size=block, pad_seq_len_divisible=d.pad_seq_len_divisible,
                    max_seq_len=d.max_seq_len,
                    supervise_padding=supervises_padding(config, strategy),
                    pack=d.pack, fill_from_response=strategy.fill_from_response,
                    pad_to=pad_to)


def supervises_padding(config: RunConfig, strategy) -> bool:
    chosen = config.data.supervise_padding
    return strategy.supervise_padding if chosen is None else chosen


def trained_row_length(config: RunConfig, strategy, train_set, cap: int | None) -> int | None:
    """The length every training row is padded to (the longest training example, at most the
    collator's ``cap``) for the ``fixed_length`` families whose padding is supervised, else
    None. The export records it (``dlmkit.json`` ``pad_to``) so that the sampler pads each
    prompt's canvas to it."""
    if not (strategy.fixed_length and supervises_padding(config, strategy)):
        return None
    longest = int(train_set.lengths.max())
    return longest if cap is None else min(longest, cap)


def response_canvas(train_set, strategy) -> int:
    """The longest response (one assistant turn) of the training set, rounded up to the
    strategy's block: the decoders' default ``max_new_tokens``."""
    return _round_up(int(train_set.longest_responses.max()),
                     strategy.config.get("block_size") or 1)


def sampler_micro_batch(config: RunConfig, world: World) -> int:
    """Rows per forward on one rank: ``train.micro_batch_size``, or the rank's whole share."""
    t = config.train
    return t.micro_batch_size or max(1, t.global_batch_size // world.world_size)


def build_sampler(config: RunConfig, world: World, num_samples: int) -> GlobalBatchSampler:
    return GlobalBatchSampler(num_samples, config.train.global_batch_size,
                              rank=world.rank, world_size=world.world_size,
                              micro_batch_size=sampler_micro_batch(config, world),
                              seed=config.seed)


def lr_at(step: int, config: RunConfig) -> float:
    """Linear warmup then cosine decay to ``min_lr_ratio * lr`` (multiplier of lr)."""
    t = config.train
    warmup, total = t.warmup_steps, t.steps
    if step < warmup:
        return (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    floor = t.min_lr_ratio
    return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))


def autocast_context(config: RunConfig, device: torch.device):
    """The compute dtype of every training and validation forward (see :mod:`.precision`)."""
    return precision_autocast(resolve_precision(config, device), device)


def to_device(batch: dict, device: torch.device) -> dict:
    return {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}


class StepBatch(Batch):
    """A collated micro-batch (:class:`~dlmkit.data.collate.Batch`) on the run's device, plus
    the two keys the recipe adds for the strategies' stratified noise levels
    (:mod:`dlmkit.diffusion.timesteps`)."""

    doc_slot: torch.Tensor  # [B, D]: each document's slot in the global batch, -1 = none
    num_slots: int  # the slots there are: the global batch size (validation: the set's size)


@dataclass
class StepContext:
    """What an optimizer step reads and updates: the components of a run
    (:meth:`Components.step_context`), its config and where it runs."""

    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    strategy: strategies.Strategy
    dataset: SFTDataset  # the training set
    collator: Collator
    sampler: GlobalBatchSampler
    config: RunConfig
    world: World


def prepare_micro_batches(step: int, ctx: StepContext) -> list[dict]:
    """This rank's micro-batches of ``step``, collated (:class:`StepBatch`) and prepared
    (corrupted, laid out) by the strategy; no forward. Every random number is a function of
    ``(seed, step, sample)`` and of the sample's slot in the global batch, never of the
    rank/micro-batch split."""
    sampler, seed = ctx.sampler, ctx.config.seed
    prepared = []
    for indices, repeats, first_slot in zip(sampler.micro_batches(step),
                                            sampler.micro_batch_repeats(step),
                                            sampler.micro_batch_slots()):
        samples = [ctx.dataset[i] for i in indices]
        if ctx.config.data.split_tokens:
            samples = split_training_tokens(samples, indices, repeats, step, ctx)
        collated = to_device(ctx.collator(samples), ctx.world.device)
        batch = StepBatch(**collated,
                          doc_slot=doc_slots(collated["doc_sample_index"], indices, first_slot),
                          num_slots=sampler.global_batch_size)
        # One generator per document (per row unless packed), each seeded from its own
        # (seed, step, sample, repeat): the noise does not depend on packing or the split.
        generators = document_generators(seed, step, batch, list(zip(indices, repeats)),
                                         ctx.world.device)
        prepared.append(ctx.strategy.prepare(batch, generators))
    return prepared


def split_training_tokens(samples, indices, repeats, step: int, ctx: StepContext) -> list[dict]:
    """``data.split_tokens`` applied to a micro-batch's samples (see
    :mod:`dlmkit.data.split_tokens`): each sample draws from its own ``(seed, step, sample,
    repeat)`` stream and grows at most to the row length (``pad_to``) or the length cap."""
    d = ctx.config.data
    limit = ctx.collator.pad_to or ctx.collator.max_seq_len
    generators = split_generators(ctx.config.seed, step, zip(indices, repeats))
    splits = piece_splits(ctx.dataset.tokenizer)
    return [split_sample(s, splits, d.split_tokens, g, limit, d.split_responses)
            for s, g in zip(samples, generators)]


def accumulate_gradients(step: int, ctx: StepContext,
                         extras: dict | None = None) -> tuple[float, int]:
    """Forward and backward over this rank's micro-batches of ``step``; leaves the whole-batch
    gradient in ``.grad``. Returns (global loss, tokens fed on this rank); ``extras``, when
    given, receives the loss extras summed over micro-batches and ranks."""
    model, strategy, world = ctx.model, ctx.strategy, ctx.world
    prepared = prepare_micro_batches(step, ctx)

    # Global denominators: summed over micro-batches and ranks before any forward.
    keys = sorted(strategy.counts(prepared[0]))
    local = torch.stack([torch.stack([strategy.counts(p)[k] for k in keys]).double()
                         for p in prepared]).sum(0)
    total = all_reduce_sum(local.to(world.device), world)
    denominators = dict(zip(keys, total.tolist()))

    model.train()
    loss_sum = torch.zeros((), dtype=torch.float64)
    tokens = 0
    for i, p in enumerate(prepared):
        last = i == len(prepared) - 1
        # DDP must skip the gradient all-reduce for the forward *and* backward of every
        # micro-batch but the last (one context: no_sync() cannot be entered twice); FSDP2
        # has a switch instead of a context.
        sync = model.no_sync() if world.distributed and not last and hasattr(model, "no_sync") \
            else nullcontext()
        if world.distributed and hasattr(model, "set_requires_gradient_sync"):
            model.set_requires_gradient_sync(last)
        with sync:
            with autocast_context(ctx.config, world.device):
                out = strategy.loss(model, p, denominators)
            # DDP/FSDP average gradients over ranks; our losses are already global means.
            (out.total * world.world_size).backward()
        loss_sum += out.total.detach().double().cpu()
        tokens += int(p["input_ids"].numel())
        if extras is not None:
            for name, value in out.extras.items():
                value = value.detach().double().cpu()
                extras[name] = extras[name] + value if name in extras else value
    loss = float(all_reduce_sum(loss_sum.to(world.device), world))
    if extras:  # one collective for all of them (every rank has the same names)
        names = sorted(extras)
        flat = torch.cat([extras[n].reshape(-1) for n in names])
        flat = all_reduce_sum(flat.to(world.device), world).cpu()
        for n, part in zip(names, flat.split([extras[n].numel() for n in names])):
            extras[n] = part.reshape(extras[n].shape)
    return loss, tokens


def train_step(step: int, ctx: StepContext) -> dict:
    """One optimizer step over this rank's micro-batches; returns its metrics (``loss``,
    ``grad_norm``, ``tokens`` over every rank, the strategy's ``metrics``)."""
    extras: dict = {}
    loss, tokens = accumulate_gradients(step, ctx, extras)
    if not math.isfinite(loss):
        raise FloatingPointError(f"step {step}: loss is {loss}; stopping (check lr and data)")
    max_norm = ctx.config.train.max_grad_norm
    grad_norm = float(torch.nn.utils.clip_grad_norm_(ctx.model.parameters(), max_norm)) \
        if max_norm else float("nan")
    ctx.optimizer.step()
    ctx.scheduler.step()
    ctx.optimizer.zero_grad(set_to_none=True)
    return {"loss": loss, "grad_norm": grad_norm, "tokens": tokens * ctx.world.world_size,
            "metrics": ctx.strategy.metrics(extras)}


@torch.no_grad()
def validate(model, strategy, dataset, collator, config: RunConfig, world: World) -> float:
    """The validation loss as one whole-set token mean: the same global-denominator rule as a
    training step, over every validation sample. Noise is seeded per sample only (never by the
    step), so successive evaluations are comparable."""
    model.eval()
    micro = sampler_micro_batch(config, world)
    shards = [ix for ix in eval_batches(len(dataset), micro * world.world_size, rank=world.rank,
                                        world_size=world.world_size) if ix]

    def prepared(indices):
        collated = to_device(collator([dataset[i] for i in indices]), world.device)
        # Validation strata: the whole set, one slot per sample (its index).
        batch = StepBatch(**collated, doc_slot=collated["doc_sample_index"],
                          num_slots=len(dataset))
        return strategy.prepare(batch, document_generators(config.seed, None, batch,
                                                           device=world.device))

    # Pass 1: global denominators. Pass 2 re-derives the same inputs (deterministic seeds)
    # instead of keeping every prepared batch alive.
    keys = None
    total = None
    for indices in shards:
        counts = strategy.counts(prepared(indices))
        keys = keys or sorted(counts)
        row = torch.stack([counts[k] for k in keys]).double().cpu()
        total = row if total is None else total + row
    if keys is None:  # an empty shard on this rank still joins the collectives
        keys = sorted(strategy.counts(prepared([0])))
        total = torch.zeros(len(keys), dtype=torch.float64)
    total = all_reduce_sum(total.to(world.device), world)
    denominators = dict(zip(keys, total.tolist()))
    loss = torch.zeros((), dtype=torch.float64)
    if all(v > 0 for v in denominators.values()):
        for indices in shards:
            with autocast_context(config, world.device):
                loss += float(strategy.loss(model, prepared(indices), denominators).total)
    loss = all_reduce_sum(loss.to(world.device), world)
    return float(loss) if all(v > 0 for v in denominators.values()) else float("nan")


def export_final(run_dir: Path, model, tokenizer, config: RunConfig, strategy, world: World,
                 train_set, name: str = "final", meta: dict | None = None,
                 pad_to: int | None = None) -> Path:
    """``RUN/final`` (or ``RUN/<name>``): a Hugging Face directory (safetensors, config,
    tokenizer) + dlmkit.json (with ``meta`` added).

    ``dlmkit.json`` records the strategy and its options (the samplers' defaults) and
    ``max_new_tokens``: the longest response (one assistant turn) seen in training, rounded up
    to the strategy's block (:func:`response_canvas`), the default generation length, and
    ``pad_to``: the length the collator padded the training rows to (its ``pad_to``,
    :func:`trained_row_length`; null unless the family trains fixed-length rows).
    """
    from dlmkit.models import make_readable, write_token_ids

    final = run_dir / name
    if world.distributed:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True,
                                                                     cpu_offload=True))
    else:
        state = None
    if world.is_main:
        inner = getattr(model, "module", model)
        lora = config.model.lora
        dtype = getattr(torch, config.model.dtype or "float32")
        if lora:  # merged weights or the adapter alone, from a fresh copy of the model
            from dlmkit.models.lora import save_lora_export

            fresh = build_trained_model(config, strategy, tokenizer.vocab_size,
                                        inner.config._attn_implementation, "cpu")
            save_lora_export(final, fresh, inner.state_dict() if state is None else state,
                             lora, base=config.model.name, dtype=dtype)
        else:
            if dtype != inner.dtype:  # fp32 masters written as the source's (or asked) dtype
                state = export_state(inner.state_dict() if state is None else state, dtype)
            inner.save_pretrained(final, state_dict=state)
            record_export_dtype(final, dtype)
        tokenizer.save_pretrained(final)
        write_token_ids(final, tokenizer)  # plain transformers generate() stops at a turn's end
        (final / "dlmkit.json").write_text(json.dumps({
            "strategy": strategy.name,
            "block_size": strategy.config.get("block_size"),
            "task": config.data.task if not config.data.train_files else None,
            "fields": config.data.fields or None,  # `dlmkit eval --data` reads it
            "mask_token_id": tokenizer.mask_token_id,
            "options": strategy.config,
            "max_seq_len": config.data.max_seq_len,
            "max_new_tokens": response_canvas(train_set, strategy),
            "pad_to": pad_to,
            **strategy.export_meta(),
            **(meta or {}),
        }, indent=1))
        make_readable(final)
    barrier(world)
    return final


class TrainingInterrupted(KeyboardInterrupt):
    """Ctrl-C (SIGINT) or SIGTERM during a run: where it stopped, what survives and which
    signal (the CLI prints it and exits with 128 + ``signal``). Still a KeyboardInterrupt, so
    code that calls :func:`run` handles it as before."""

    def __init__(self, run_dir: Path | None, step: int | None, checkpoint: Path | None,
                 signum: int = signal.SIGINT) -> None:
        self.run_dir, self.step, self.checkpoint = run_dir, step, checkpoint
        self.signal = signum
        super().__init__(f"interrupted at step {step}")


class _Terminated(KeyboardInterrupt):
    """SIGTERM (a scheduler preempting the job, ``kill``), raised where the run is so that it
    unwinds like Ctrl-C: lock released, the resume command printed."""

    signal = signal.SIGTERM


class _StopRequest:
    """SIGINT / SIGTERM during a run. Before the step loop (building data and model: nothing to
    save) it raises at once; inside it the first signal only asks the loop to stop after the
    step in progress, which saves a checkpoint there (:func:`_stop_asked`); a second
    signal raises at once."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self.deferred = False  # set while the step loop runs

    def handler(self, signum, frame) -> None:
        if self.deferred and self.signum is None:
            self.signum = signum
            name = signal.Signals(signum).name
            print(f"\n{name}: stopping after the step in progress (a checkpoint is saved "
                  f"there); {name} again stops at once", file=sys.stderr, flush=True)
            return
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a second one must not cut the clean-up
        raise _Terminated() if signum == signal.SIGTERM else KeyboardInterrupt()


def _stop_asked(stop: _StopRequest | None, world: World) -> int:
    """After a step: the signal any rank received (0: none), the same on every rank (one
    all-reduce), so that all of them save that step and unwind together."""
    asked = stop.signum if stop is not None and stop.signum is not None else 0
    if world.distributed:  # the highest signal number wins: SIGTERM (15) over SIGINT (2)
        import torch.distributed as dist

        flag = torch.tensor([asked], device=world.device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        asked = int(flag.item())
    return asked


@dataclass
class _Status:
    """How far ``_run`` got, for the message after Ctrl-C."""

    run_dir: Path | None = None
    step: int | None = None
    lock: object | None = None     # the run directory's RunLock, released by run()
    metrics: MetricsLog | None = None
    stop: _StopRequest | None = None  # a SIGINT / SIGTERM the step loop has yet to act on


def run(config: RunConfig, *, resume: bool = False, overwrite: bool = False,
        explicit: list[str] | None = None, allow_config_change: bool = False) -> Path:
    """Train as configured (:func:`~dlmkit.train.config.load_config`); returns the run directory.

    ``resume``: continue ``config.output_dir`` from its newest complete checkpoint, with the
    checkpoint's config; of ``config``, only the ``explicit`` keys (None: all) are applied, and
    only :data:`~dlmkit.train.config.RESUMABLE_KEYS` may differ unless
    ``allow_config_change`` (see :mod:`dlmkit.train.resume`). ``overwrite``: a new run may
    replace an existing run directory (it is deleted first)."""
    _check_run_config(config, "run")
    plan = None
    if resume:
        plan = plan_resume(config, explicit=explicit, allow_config_change=allow_config_change)
        config = plan.config
    check_device(config.train.device)  # before torch.cuda is touched
    world = init_world(config.train.device)
    status = _Status(stop=_StopRequest())
    # SIGTERM ends a run like Ctrl-C: inside the step loop after the step in progress, with a
    # checkpoint there (only the main thread may set a handler).
    on_term = threading.current_thread() is threading.main_thread()
    previous = {sig: signal.signal(sig, status.stop.handler)
                for sig in (signal.SIGTERM, signal.SIGINT)} if on_term else {}
    try:
        run_dir = _run(config, world, plan, overwrite, status)
    except KeyboardInterrupt as err:
        shutdown(world, clean=False)
        # What is on disk, not what the loop last recorded: Ctrl-C can land after a
        # checkpoint's rename but before save_checkpoint returns, and a message saying "no
        # checkpoint" would then suggest --overwrite, which deletes it.
        raise TrainingInterrupted(status.run_dir, status.step,
                                  newest_complete_checkpoint(status.run_dir),
                                  getattr(err, "signal", signal.SIGINT)) from None
    except BaseException:
        shutdown(world, clean=False)
        raise
    finally:
        if status.metrics is not None:
            status.metrics.close()
        if status.lock is not None:
            status.lock.release()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    shutdown(world)
    return run_dir


@dataclass
class Components:
    """Everything a run trains with, built from the config (see :func:`build_components`)."""

    tokenizer: object
    strategy: strategies.Strategy
    collator: Collator
    train_set: SFTDataset
    val_set: SFTDataset | None
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    sampler: GlobalBatchSampler
    cap_reports: tuple = ()  # what ``data.truncation`` cut, per split (see truncation.py)
    budget_report: tuple = ()  # how train.steps / warmup_steps / ema_decay were decided when unset

    def step_context(self, config: RunConfig, world: World) -> StepContext:
        """What :func:`train_step` takes: these components, ``config`` and ``world``."""
        return StepContext(self.model, self.optimizer, self.scheduler, self.strategy,
                           self.train_set, self.collator, self.sampler, config, world)


def build_trained_model(config: RunConfig, strategy, vocab_size: int, attention: str, device):
    """The model the run trains (``model.*``, its ``name`` resolved by
    :func:`build_components`): the strategy's, with gradient checkpointing and LoRA adapters
    when configured (see :mod:`dlmkit.models.checkpointing`, ``.lora``)."""
    from dlmkit.models.checkpointing import enable_gradient_checkpointing
    from dlmkit.models.lora import apply_lora

    m = config.model
    precision = resolve_precision(config, torch.device(device))
    # Built in the master dtype (a bf16 checkpoint loads exactly into fp32); the frozen parts
    # go to the storage dtype once LoRA has said which they are.
    model = strategy.build_model(m.name, vocab_size=vocab_size, attention=attention,
                                 dtype=precision.master, overrides=m.config).to(device)
    if m.gradient_checkpointing:
        enable_gradient_checkpointing(model)
    if m.lora:
        apply_lora(model, m.lora, base=m.name)
    return place_parameters(model, precision)


def build_components(config: RunConfig, world: World) -> Components:
    """Tokenizer, strategy, data, model (wrapped for DDP/FSDP2), optimizer, schedule, sampler.

    Every input error surfaces here, before any training step. The unset ``train`` keys are
    resolved in ``config``: the regime and its learning rate, weight decay (and, fine-tuning,
    weight average and epochs) (:func:`.regime.resolve_regime`), a step count
    (:func:`.budget.resolve_budget`), a warmup (:func:`.budget.resolve_warmup`), the family's
    ``default_ema_decay`` (:func:`resolve_ema`) and ``model.dtype``
    (:func:`.precision.resolve_storage_dtype`), so the schedule is complete and the run's
    config.yaml records them."""
    _check_run_config(config, "build_components")
    t, d = config.train, config.data
    strategy_options = {k: v for k, v in config.strategy.items() if k != "name"}
    strategy_cls = strategies.get(config.strategy["name"])
    try:  # the family's options whose default depends on the regime, before its loss is built
        adapted = resolve_regime_options(config, strategy_cls, strategy_options)
    except ValueError as err:
        raise ConfigError(str(err)) from None
    tokenizer = load_tokenizer(d.tokenizer, allow_eos_as_pad=d.allow_eos_as_pad)
    strategy = strategy_cls(strategy_options, mask_token_id=tokenizer.mask_token_id,
                            vocab_size=tokenizer.vocab_size, loss_chunk_size=t.loss_chunk_size)
    # Every option, defaults included, goes into config.yaml: a resume after a default has
    # changed still trains with the run's own values.
    config.strategy = {"name": strategy.name, **strategy.config}
    # The model too: ``model.name: null`` means the family's default preset, which may change.
    config.model.name = config.model.name or strategy.default_model
    lr_unset = t.lr is None
    try:
        regime_line = resolve_regime(config, strategy, adapted)  # lr, weight decay, ...
    except ValueError as err:
        raise ConfigError(str(err)) from None
    if d.split_tokens and not len(piece_splits(tokenizer)):
        raise ConfigError(f"data.split_tokens={d.split_tokens} would do nothing: no piece of "
                          f"tokenizer {d.tokenizer!r} is two others written together (the "
                          "byte tokenizer has one byte per piece); set it to 0 or use a BPE")
    collator = build_collator(config, tokenizer, strategy)
    train_set, val_set, cap_reports = apply_length_cap_policy(
        *build_datasets(config, tokenizer), collator, config)
    # Rebuilt with the row length now that the training set is known (the first one only had
    # to give the length cap).
    collator = build_collator(config, tokenizer, strategy,
                              trained_row_length(config, strategy, train_set,
                                                 collator.max_seq_len))
    sampler = build_sampler(config, world, len(train_set))
    budget_report = tuple(line for line in (regime_line, lora_warning(config),
                                            resolve_budget(config, len(train_set), strategy),
                                            resolve_warmup(config, strategy),
                                            resolve_ema(config, strategy),
                                            resolve_storage_dtype(config)) if line)
    warn_pure_bf16(config)
    precision = resolve_precision(config, world.device)
    if not precision.all_fp32:
        budget_report += (precision.describe(),)

    torch.manual_seed(config.seed)  # model initialisation
    attention = resolve_attention(config.model.attention, world.device)
    model = build_trained_model(config, strategy, tokenizer.vocab_size, attention,
                                world.device)
    strategy.setup(world.device)  # frozen auxiliary models: not wrapped, not optimised
    small = small_checkpoint_warning(config, model, lr_unset)
    if small:
        budget_report += (small,)
    for dataset in (train_set, val_set):  # as trained: after data.truncation
        if dataset is not None:
            strategy.check_dataset(dataset, collator)
    model = wrap_model(model, world, t.distributed, mp_policy=fsdp_policy(precision))
    # Frozen weights (LoRA's base) get no optimizer state.
    trainable = [p for p in model.parameters() if p.requires_grad]
    decay = [p for p in trainable if p.dim() >= 2]
    no_decay = [p for p in trainable if p.dim() < 2]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": t.weight_decay},
                                   {"params": no_decay, "weight_decay": 0.0}],
                                  lr=t.lr, betas=tuple(t.betas))
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: lr_at(s, config))
    return Components(tokenizer, strategy, collator, train_set, val_set, model, optimizer,
                      scheduler, sampler, cap_reports, budget_report)


def check_setup(config: RunConfig, device: torch.device) -> None:
    """What can be checked from the config and the machine alone, before any data or model is
    built: the attention backend against the device, ``model.config`` against the preset."""
    from dlmkit.models import PRESETS

    check_attention(config.model.attention, device)
    name = config.model.name or strategies.get(config.strategy["name"]).default_model
    if name in PRESETS:
        check_model_overrides(PRESETS[name], config.model.config)


def apply_length_cap_policy(train_set: SFTDataset, val_set: SFTDataset | None,
                            collator: Collator, config: RunConfig):
    """The data as ``data.truncation`` says it is trained, and what was cut of each split."""
    d = config.data
    train_set, report = apply_length_cap(train_set, collator, d.truncation, "training",
                                         d.max_seq_len)
    reports = [report]
    if val_set is not None:
        val_set, val_report = apply_length_cap(val_set, collator, d.truncation, "validation",
                                               d.max_seq_len)
        reports.append(val_report)
    return train_set, val_set, tuple(reports)


def _run(config: RunConfig, world: World, plan: ResumePlan | None, overwrite: bool,
         status: _Status) -> Path:
    t = config.train
    if t.threads:
        torch.set_num_threads(int(t.threads))
    check_setup(config, world.device)
    run_dir = Path(config.output_dir or default_run_dir(config))
    if world.distributed:  # every rank must agree on a timestamped default
        import torch.distributed as dist

        shared = [str(run_dir)]
        dist.broadcast_object_list(shared, src=0)
        run_dir = Path(shared[0])
    status.run_dir = run_dir
    check_writable(run_dir)
    # Held to the end (run() releases it): a second run into this directory is an error.
    status.lock = lock_run_dir(run_dir, world)
    if plan is None:
        check_new_run_dir(run_dir, overwrite=overwrite)
    # Messages (data and resume reports, validation losses) print whatever train.progress
    # says; the step display starts once the first step is known.
    messages = Progress(enabled=world.is_main, show_steps=False, total=t.steps, initial=0,
                        desc="")
    c = build_components(config, world)
    for report in c.cap_reports:
        if report.cut:
            messages.message(report.line(config.data.max_seq_len))
    for line in c.budget_report:
        messages.message(line)
    for line in data_summary(c.train_set, c.val_set, config):
        messages.message(line)
    ctx = c.step_context(config, world)
    model, optimizer, scheduler = c.model, c.optimizer, c.scheduler

    # The weight average that validation and the exports use (train.ema_decay; off at 0).
    ema = WeightAverage(model, t.ema_decay) if t.ema_decay else None
    averaged = ema.applied if ema is not None else nullcontext
    start = 0
    if plan is not None:
        for line in plan.summary():
            messages.message(line)
        start = load_checkpoint(plan.point.path, model, optimizer, scheduler, world, ema=ema)
        if start > t.steps:
            raise ConfigError(f"--resume: {plan.point.path} is at step {start}, beyond "
                              f"train.steps={t.steps}; set train.steps >= {start}")
        if start == t.steps:
            messages.message(f"resume: the run is already at train.steps={start}; nothing to "
                             "train (extend it with --set train.steps=N)")
        else:
            messages.message(f"resuming from step {start} of {t.steps} (checkpoint "
                             f"{plan.point.path})")
    elif world.is_main:
        create_run_dir(run_dir, overwrite=overwrite)
    barrier(world)
    if world.is_main:
        (run_dir / "config.yaml").write_text(dump_yaml(config))
        # What a resume checks the data files against (dlmkit.train.resume).
        record_data_files(run_dir, plan.data_files if plan is not None
                          else data_fingerprints(config))
        if plan is not None:
            plan.record(run_dir, start)
    metrics = status.metrics = MetricsLog(
        run_dir / "metrics.jsonl", world.is_main, resume_step=start,
        tensorboard=run_dir / "tensorboard" if t.tensorboard else None)
    barrier(world)  # every rank replays the validation losses rank 0 kept
    val_set = c.val_set
    stopper = EarlyStopping(t.early_stopping_patience, t.early_stopping_min_delta) \
        .replay(metrics.path, start) if val_set is not None else None
    if stopper is not None and stopper.exhausted:
        messages.message(f"resume: {stopper.reason()}")
    best = BestModel(run_dir, enabled=val_set is not None and t.final_model == "best",
                     is_main=world.is_main)
    if not sys.stderr.isatty():  # transformers' shard-writing bar (exports of best/, final/):
        from transformers.utils import logging as hf_logging  # \r-joined junk in a log

        hf_logging.disable_progress_bar()

    def export(name: str, meta: dict) -> Path:
        if ema is not None:  # dlmkit.json says the weights are the average, and of what decay
            meta = {**meta, "ema_decay": ema.decay}
        with averaged():
            return export_final(run_dir, model, c.tokenizer, config, c.strategy, world,
                                c.train_set, name=name, meta=meta, pad_to=c.collator.pad_to)

    def save(step: int) -> None:
        save_checkpoint(run_dir, step, model, optimizer, scheduler, world, config=config, ema=ema)

    progress = Progress(enabled=world.is_main, show_steps=t.progress, total=t.steps,
                        initial=start, desc=f"train {c.strategy.name}")
    status.step = start
    window_tokens, window_start = 0, time.perf_counter()
    last = start
    if status.stop is not None:
        status.stop.deferred = True
    for step in range(start, t.steps if not (stopper and stopper.exhausted) else start):
        stats = train_step(step, ctx)
        if ema is not None:
            ema.update()
        window_tokens += stats["tokens"]
        done = status.step = step + 1
        if done % t.log_every == 0 or done == t.steps:
            elapsed = time.perf_counter() - window_start
            record = {"split": "train", "step": done, "loss": stats["loss"],
                      "grad_norm": stats["grad_norm"], "lr": scheduler.get_last_lr()[0],
                      "tokens_per_s": window_tokens / max(elapsed, 1e-9),
                      "epoch": c.sampler.epoch_of(done), **stats["metrics"]}
            metrics.write(record)
            window_tokens, window_start = 0, time.perf_counter()
            progress.logged(done, record)
        stopped = False
        if val_set is not None and (done % t.val_every == 0 or done == t.steps):
            with averaged():
                val_loss = validate(model, c.strategy, val_set, c.collator, config, world)
            metrics.write({"split": "validation", "step": done, "loss": val_loss})
            progress.message(f"step {done}: validation loss {val_loss:.4f}")
            best.offer(done, val_loss, export)
            stopped = stopper is not None and stopper.observe(done, val_loss)
        # The last step is saved too: `--resume --set train.steps=N` extends a finished run.
        saved = done % t.save_every == 0 or done == t.steps or stopped
        if saved:
            save(done)
        progress.advance()
        asked = _stop_asked(status.stop, world)  # Ctrl-C / SIGTERM during the step or its save
        if asked:
            if not saved:
                save(done)
            raise _Terminated() if asked == signal.SIGTERM else KeyboardInterrupt()
        last = done
        if stopped:
            progress.message(f"step {done}: {stopper.reason()}")
            break
    if status.stop is not None:
        status.stop.deferred = False  # the exports below: a signal stops them at once
    progress.close()
    final = best.finish(last, export)  # RUN/final = the best by validation loss
    if world.is_main:
        plot_loss_curve(run_dir / "metrics.jsonl", run_dir / "loss.png")
        print(f"run directory: {run_dir}\nfinal model: {final}")
    return run_dir


def _round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def resolve_ema(config: RunConfig, strategy) -> str | None:
    """Write the strategy's ``default_ema_decay`` into ``config`` when ``train.ema_decay`` is
    unset; a line saying so when that turns the weight average on, else None."""
    t = config.train
    if t.ema_decay is not None:
        return None
    t.ema_decay = float(strategy.default_ema_decay)
    if not t.ema_decay:
        return None
    return (f"train.ema_decay={t.ema_decay:g}: the {strategy.name} default (validation and "
            "the exports use the weight average; set train.ema_decay=0 to turn it off)")


def default_run_dir(config: RunConfig) -> Path:
    task = config.data.task or "files"
    name = config.strategy["name"]
    return Path("runs") / f"{name}-{task}-{time.strftime('%Y%m%d-%H%M%S')}"


def _check_run_config(config, caller: str) -> None:
    """A RunConfig, not the nested mapping: a mapping would skip the checks and the
    resolved values would not reach the caller's object."""
    if not isinstance(config, RunConfig):
        raise TypeError(f"{caller}: config must be a RunConfig (dlmkit.train.load_config, or "
                        f"RunConfig.from_dict for a mapping), got {type(config).__name__}")
