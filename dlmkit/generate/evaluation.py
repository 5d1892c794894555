"""Exact-match evaluation of a model on conversations: every assistant turn is a test case.

A conversation ``[u1, a1, u2, a2]`` gives two cases: ``a1`` generated from ``[u1]`` and ``a2``
from ``[u1, a1, u2]`` where ``a1`` is the *reference* (teacher-forced history: each turn is
judged on its own, not on the model's earlier mistakes), or only the last one
(``last_turn_only``). A prediction is correct when it equals the reference after stripping
surrounding whitespace. :func:`summarize` reports the per-turn rate, the rate by turn position
and the per-conversation rate (every scored turn of it correct).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from dlmkit.decoding.options import SamplerConfig

from . import api
from .api import GenerationResult, check_prompt_lengths, encode_prompt


@dataclass(frozen=True)
class Turn:
    """One scored assistant turn.

    Attributes:
        prompt: the conversation before the turn (``{"role", "content"}`` dicts).
        reference: the turn's reference content.
        source: where the conversation came from (``path:line``).
        conversation: index of the conversation in the input.
        position: 1-based index of this turn among the conversation's assistant turns.
    """

    prompt: tuple[Mapping[str, str], ...]
    reference: str
    source: str
    conversation: int
    position: int


def conversation_turns(records: Sequence, *, last_turn_only: bool = False) -> list[Turn]:
    """The scored turns of ``records`` (:class:`~dlmkit.data.Record` objects)."""
    turns: list[Turn] = []
    for index, record in enumerate(records):
        messages = tuple(record.messages)
        assistant = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
        chosen = list(enumerate(assistant, 1))
        if last_turn_only:
            chosen = chosen[-1:]
        for position, i in chosen:
            turns.append(Turn(messages[:i], messages[i]["content"], record.source, index,
                              position))
    return turns


def exact_match(prediction: str, reference: str) -> bool:
    return prediction.strip() == reference.strip()


class EvaluationInterrupted(KeyboardInterrupt):
    """Ctrl-C during :func:`score_turns`: ``rows`` holds the turns scored before it (a
    KeyboardInterrupt still, for callers that only know that)."""

    def __init__(self, rows: list[dict], total: int) -> None:
        super().__init__(f"interrupted after {len(rows)} of {total} turns")
        self.rows, self.total = rows, total


def score_turns(model, tokenizer, turns: Sequence[Turn], config: SamplerConfig, *,
                batch_size: int = 32, progress: bool = False):
    """Generate every turn's response; returns ``(rows, totals)``.

    ``rows[i]`` = ``{"source", "conversation", "turn", "prompt", "reference", "prediction",
    "correct", "forwards"}`` where ``forwards`` counts the model forwards of the batch that
    decoded the turn (with ``batch_size=1``: exactly this turn's). ``totals`` is a
    :class:`~dlmkit.generate.GenerationResult` over all batches. ``progress`` reports on
    stderr after each batch (see :class:`TurnProgress`). Every turn's length is checked
    before the first is decoded (:func:`~dlmkit.generate.api.check_prompt_lengths`); Ctrl-C
    raises :class:`EvaluationInterrupted` with the rows scored so far.
    """
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be an int >= 1, got {batch_size!r}")
    encoded = [encode_prompt(tokenizer, list(t.prompt)) for t in turns]
    lengths = [len(e) for e in encoded]
    check_prompt_lengths(model, lengths, config.resolved().canvas_widths(lengths),
                         [f"{t.source} (assistant turn {t.position})" for t in turns])
    rows: list[dict] = []
    tokens: list[list[int]] = []
    forwards = generated = row_forwards = 0
    seconds = 0.0
    bar = TurnProgress(len(turns), enabled=progress)
    try:
        for at in range(0, len(turns), batch_size):
            chunk = turns[at:at + batch_size]
            result = api.generate(model, tokenizer, encoded[at:at + batch_size], config,
                              first_index=at)  # the same samples whatever the batch size
            forwards += result.forwards
            generated += result.generated
            row_forwards += result.row_forwards
            seconds += result.seconds
            tokens += result.tokens
            for turn, text in zip(chunk, result.texts):
                rows.append({"source": turn.source, "conversation": turn.conversation,
                             "turn": turn.position, "prompt": [dict(m) for m in turn.prompt],
                             "reference": turn.reference, "prediction": text,
                             "correct": exact_match(text, turn.reference),
                             "forwards": result.forwards})
            bar.update(len(chunk), sum(r["correct"] for r in rows))
    except KeyboardInterrupt:
        raise EvaluationInterrupted(rows, len(turns)) from None
    finally:
        bar.close()
    totals = GenerationResult(tokens, [r["prediction"] for r in rows], forwards, generated,
                              seconds, row_forwards)
    return rows, totals


class TurnProgress:
    """Turns done so far on stderr: a tqdm bar on a terminal; in a log file (stderr not a
    terminal, where a bar is one line of ``\\r``-joined updates) a plain line per batch with the
    running exact match and the time left."""

    def __init__(self, total: int, *, enabled: bool, stream=None) -> None:
        self.total, self.done = total, 0
        self.stream = stream or sys.stderr
        self.started = time.perf_counter()
        self.bar = None
        self.lines = enabled and not self.stream.isatty()
        if enabled and not self.lines:
            from tqdm import tqdm

            self.bar = tqdm(total=total, desc="eval", unit="turn", file=self.stream,
                            dynamic_ncols=True)

    def update(self, n: int, correct: int) -> None:
        self.done += n
        if self.bar is not None:
            self.bar.update(n)
            self.bar.set_postfix(exact=f"{100.0 * correct / max(self.done, 1):.1f}%")
        elif self.lines:
            elapsed = time.perf_counter() - self.started
            left = elapsed / self.done * (self.total - self.done)
            print(f"eval: {self.done}/{self.total} turns  exact so far "
                  f"{100.0 * correct / max(self.done, 1):.1f}%  elapsed {elapsed:.0f} s  "
                  f"left ~{left:.0f} s", file=self.stream, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def summarize(rows: Sequence[dict]) -> dict:
    """``{"turns", "turns_correct", "by_turn": {position: (correct, total)},
    "conversations", "conversations_correct"}`` (a conversation is correct when every one of
    its scored turns is)."""
    by_turn: dict[int, list[int]] = {}
    conversations: dict[int, bool] = {}
    for row in rows:
        hit = by_turn.setdefault(row["turn"], [0, 0])
        hit[0] += bool(row["correct"])
        hit[1] += 1
        conversations[row["conversation"]] = (conversations.get(row["conversation"], True)
                                              and bool(row["correct"]))
    return {"turns": len(rows), "turns_correct": sum(bool(r["correct"]) for r in rows),
            "by_turn": {k: tuple(v) for k, v in sorted(by_turn.items())},
            "conversations": len(conversations),
            "conversations_correct": sum(conversations.values())}


def format_summary(summary: dict) -> list[str]:
    """Summary lines for the terminal; the last is ``exact_match: NN.N%`` (per turn)."""
    def pct(correct: int, total: int) -> str:
        return f"{100.0 * correct / max(total, 1):.1f}% ({correct}/{total})"

    lines = [f"turn {k}: {pct(*v)}" for k, v in summary["by_turn"].items()] \
        if len(summary["by_turn"]) > 1 else []
    lines.append(f"conversations: {pct(summary['conversations_correct'], summary['conversations'])}"
                 " with every scored turn exact")
    lines.append(f"turns: {pct(summary['turns_correct'], summary['turns'])} exact")
    lines.append(f"exact_match: {100.0 * summary['turns_correct'] / max(summary['turns'], 1):.1f}%")
    return lines


def evaluate(model, tokenizer, records: Sequence[dict], config: SamplerConfig,
             batch_size: int = 32) -> tuple[float, list[dict], GenerationResult]:
    """Exact match of generated responses against ``records`` (``{"prompt", "response"}``).

    Returns ``(accuracy in [0, 1], per-record rows {prompt, response, output, correct},
    totals as a GenerationResult over all batches)``. Conversations (``{"messages"}``
    records, several turns each) go through :func:`score_turns` directly.
    """
    from dlmkit.data import records_from_dicts

    turns = conversation_turns(records_from_dicts(records, "evaluate"))
    scored, totals = score_turns(model, tokenizer, turns, config, batch_size=batch_size)
    rows = [{"prompt": record["prompt"], "response": record["response"],
             "output": row["prediction"], "correct": row["correct"]}
            for record, row in zip(records, scored)]
    accuracy = sum(r["correct"] for r in rows) / max(len(rows), 1)
    return accuracy, rows, totals
