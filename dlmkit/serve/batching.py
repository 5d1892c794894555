"""Batching across requests: one decoding thread collects the queued requests for a few
milliseconds (or until ``max_batch`` rows), decodes those that share sampler options together
and answers each.

A request's tokens never depend on its companions: every row of a batch draws from its own
generator, seeded from the request's ``(seed, choice index)``
(:func:`dlmkit.generate.generate`'s ``prompt_seeds``), and the samplers are batch invariant
(tests/generate/test_batch_invariance.py). Requests whose options differ (other than the seed)
decode in separate batches, one after the other.
"""

from __future__ import annotations

import asyncio
import dataclasses
import queue
import threading
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field

from dlmkit.generate import SamplerConfig, generate


class QueueFull(Exception):
    """The bounded queue holds ``max_queue`` requests already (the client should retry)."""


class Draining(Exception):
    """The server is shutting down and takes no new requests."""


@dataclass
class Decoded:
    """One request's answer: per choice the response ids (stop token removed) and whether a
    stop token ended it; ``batch_rows``: rows in the batch it was decoded in."""

    tokens: list[list[int]]
    stopped: list[bool]
    batch_rows: int


@dataclass
class Job:
    """One request: ``n`` rows (choices) of ``prompt``, choice ``j`` seeded ``(seed, j)``.

    ``on_tokens(choice, tokens)`` runs on the event loop as a choice's committed tokens grow
    (streaming); ``cancelled`` (a client that went away) makes the worker skip the job.
    """

    config: SamplerConfig
    prompt: list[int]
    seed: int
    n: int
    width: int  # tokens decoded at most per choice (the canvas)
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future
    on_tokens: Callable[[int, list[int]], None] | None = None
    cancelled: bool = False
    key: Hashable = field(init=False)

    def __post_init__(self) -> None:
        # A canvas sized from the batch's widest prompt (pad_to): only requests of the same
        # canvas width may share a batch, or a companion would change it.
        self.key = (dataclasses.replace(self.config, seed=0),
                    self.width if self.config.canvas_from_batch() else None)

    def _call(self, fn, *args) -> None:
        self.loop.call_soon_threadsafe(fn, *args)

    def resolve(self, decoded: Decoded) -> None:
        self._call(_settle, self.future, decoded, None)

    def fail(self, error: BaseException) -> None:
        self._call(_settle, self.future, None, error)


def _settle(future: asyncio.Future, value, error) -> None:
    if future.done():  # the request was cancelled (client gone)
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(value)


class Batcher:
    """The decoding thread and its bounded queue.

    Args:
        loaded: a :class:`dlmkit.generate.LoadedModel`.
        max_batch: most rows (choices of all requests) decoded together.
        wait_ms: how long the first request of a batch waits for companions.
        max_queue: most requests waiting; :meth:`submit` raises :class:`QueueFull` past it.
    """

    def __init__(self, loaded, *, max_batch: int, wait_ms: float, max_queue: int) -> None:
        for name, value, low in (("max_batch", max_batch, 1), ("max_queue", max_queue, 1)):
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"{name} must be an int >= {low}, got {value!r}")
        if isinstance(wait_ms, bool) or not isinstance(wait_ms, (int, float)) or wait_ms < 0:
            raise ValueError(f"wait_ms must be a number >= 0, got {wait_ms!r}")
        self.loaded = loaded
        self.max_batch = max_batch
        self.wait = wait_ms / 1000
        self._queue: queue.Queue[Job | None] = queue.Queue(maxsize=max_queue)
        self._held: list[Job] = []  # collected for the next batch but of other options
        self._draining = False
        self._thread = threading.Thread(target=self._run, name="dlmkit-serve-decoder",
                                        daemon=True)
        self.batches = 0  # decoded batches, for /health
        self.decoding = 0  # rows of the batch being decoded now, for /health
        self._thread.start()

    @property
    def queued(self) -> int:
        return self._queue.qsize() + len(self._held)

    def submit(self, job: Job) -> None:
        if self._draining:
            raise Draining
        try:
            self._queue.put_nowait(job)
        except queue.Full:
            raise QueueFull from None

    def close(self) -> None:
        """Decode what is queued, then stop the thread."""
        self._draining = True
        self._queue.put(None)
        self._thread.join()

    def _collect(self) -> tuple[list[Job], bool]:
        """The next batch's jobs (same options, at most ``max_batch`` rows when there are
        several) and whether the stop sentinel was seen."""
        pending = self._held
        self._held = []
        stop = False
        if not pending:
            first = self._queue.get()
            if first is None:
                return [], True
            pending = [first]
        deadline = time.monotonic() + self.wait
        key = pending[0].key
        rows = sum(j.n for j in pending if j.key == key)
        while rows < self.max_batch:
            timeout = deadline - time.monotonic()
            try:
                job = self._queue.get(timeout=timeout) if timeout > 0 else \
                    self._queue.get_nowait()
            except queue.Empty:
                break
            if job is None:
                stop = True
                break
            pending.append(job)
            if job.key == key:
                rows += job.n
        batch, rows = [], 0
        for job in pending:
            if job.key == key and (not batch or rows + job.n <= self.max_batch):
                batch.append(job)
                rows += job.n
            else:
                self._held.append(job)
        return batch, stop

    def _run(self) -> None:
        stop = False
        while True:
            if stop and not self._held:
                # drain what arrived before the sentinel was queued behind it
                rest = []
                while True:
                    try:
                        job = self._queue.get_nowait()
                    except queue.Empty:
                        break
                    if job is not None:
                        rest.append(job)
                if not rest:
                    return
                self._held = rest
            batch, seen = self._collect()
            stop = stop or seen
            batch = [j for j in batch if not j.cancelled]
            if batch:
                self._decode(batch)

    def _decode(self, jobs: list[Job]) -> None:
        prompts = [job.prompt for job in jobs for _ in range(job.n)]
        seeds = [(job.seed, j) for job in jobs for j in range(job.n)]
        owners = [(job, j) for job in jobs for j in range(job.n)]

        def on_commit(row: int, tokens: list[int]) -> None:
            job, choice = owners[row]
            if job.on_tokens is not None and not job.cancelled:
                job._call(job.on_tokens, choice, tokens)

        loaded = self.loaded
        self.decoding = len(prompts)
        try:
            result = generate(loaded.model, loaded.tokenizer, prompts, jobs[0].config,
                              prompt_seeds=seeds, on_commit=on_commit)
        except Exception as err:  # noqa: BLE001 - every waiting request must hear of it
            for job in jobs:
                job.fail(err)
            return
        finally:
            self.decoding = 0
        self.batches += 1
        at = 0
        for job in jobs:
            tokens = result.tokens[at:at + job.n]
            at += job.n
            job.resolve(Decoded(tokens, [len(t) < job.width for t in tokens], len(prompts)))
