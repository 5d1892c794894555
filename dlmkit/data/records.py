"""SFT records from local files, validated up front, and their tokenization.

Accepted record shapes (one per JSONL line, per element of a JSON list, or per Parquet row)::

    {"prompt": str, "response": str, "system": str (optional)}
    {"messages": [{"role": str, "content": str}, ...]}   # at least one "assistant" turn

Every problem is reported as a :class:`DataError` naming the file, the 1-based line (JSON /
JSONL) or row (Parquet) and what is wrong, before any training starts.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dlmkit.data.tokenizer import Tokenizer

__all__ = [
    "DataError",
    "Record",
    "TokenizedRecord",
    "as_record",
    "load_records",
    "records_from_dicts",
    "tokenize_record",
]

SUPPORTED_SUFFIXES = (".jsonl", ".json", ".parquet")


class DataError(ValueError):
    """A bad data file or record. ``where`` is ``"file:line"`` (or a source name)."""

    def __init__(self, where: str, problem: str) -> None:
        super().__init__(f"{where}: {problem}")
        self.where = where
        self.problem = problem


@dataclass(frozen=True)
class Record:
    """One conversation and where it came from.

    Attributes:
        messages: ``({"role", "content"}, ...)``, with at least one assistant turn.
        source: ``"path:line"``, ``"path:row N"`` or ``"name[index]"``, for error messages.
    """

    messages: tuple[Mapping[str, str], ...]
    source: str


@dataclass(frozen=True)
class TokenizedRecord:
    """``input_ids`` (unshifted) and ``loss_mask`` (1 = supervised), both of length ``L``."""

    input_ids: list[int]
    loss_mask: list[int]


def as_record(obj: Any, where: str) -> Record:
    """Validate one record (a dict from a file); ``where`` names it in errors."""
    if not isinstance(obj, Mapping):
        raise DataError(where, f"a record must be a JSON object, got {type(obj).__name__}")
    has_pr = "prompt" in obj or "response" in obj
    if "messages" in obj and has_pr:
        raise DataError(where, "a record has either 'messages' or 'prompt'/'response', not both")
    if "messages" in obj:
        msgs = obj["messages"]
        if not isinstance(msgs, list) or not msgs:
            raise DataError(where, f"'messages' must be a non-empty list, got {msgs!r:.80}")
        out = []
        for i, m in enumerate(msgs):
            if not isinstance(m, Mapping):
                raise DataError(where, f"messages[{i}] must be an object, got {m!r:.80}")
            role, content = m.get("role"), m.get("content")
            if not isinstance(role, str) or not role:
                raise DataError(
                    where, f"messages[{i}].role must be a non-empty string, got {role!r}"
                )
            if not isinstance(content, str):
                raise DataError(
                    where, f"messages[{i}].content must be a string, got {type(content).__name__}"
                )
            out.append({"role": role, "content": content})
        if not any(m["role"] == "assistant" for m in out):
            raise DataError(where, "no 'assistant' message, so nothing would be supervised")
        return Record(tuple(out), where)
    if has_pr:
        for key in ("prompt", "response"):
            if key not in obj:
                raise DataError(where, f"missing key {key!r} (a prompt/response record needs both)")
            if not isinstance(obj[key], str):
                raise DataError(where, f"{key!r} must be a string, got {type(obj[key]).__name__}")
        msgs = []
        system = obj.get("system")
        if system is not None:
            if not isinstance(system, str):
                raise DataError(where, f"'system' must be a string, got {type(system).__name__}")
            msgs.append({"role": "system", "content": system})
        msgs += [
            {"role": "user", "content": obj["prompt"]},
            {"role": "assistant", "content": obj["response"]},
        ]
        return Record(tuple(msgs), where)
    raise DataError(
        where,
        f"unknown record shape with keys {sorted(obj)}; expected 'prompt' + 'response' or "
        "'messages'",
    )


def records_from_dicts(items: Iterable[Mapping[str, Any]], source: str = "records") -> list[Record]:
    """Validate in-memory records (e.g. a bundled task); errors name them ``source[index]``."""
    records = [as_record(obj, f"{source}[{i}]") for i, obj in enumerate(items)]
    if not records:
        raise DataError(source, "no records")
    return records


def _read_jsonl(path: Path) -> Iterable[tuple[Any, str]]:
    with path.open(encoding="utf-8") as f:
        for n, line in enumerate(f, start=1):
            if not line.strip():
                continue
            where = f"{path}:{n}"
            try:
                yield json.loads(line), where
            except json.JSONDecodeError as e:
                raise DataError(where, f"malformed JSON ({e.msg} at column {e.colno})") from None


def _read_json_list(path: Path) -> Iterable[tuple[Any, str]]:
    """Elements of a top-level JSON list, each with the line where it starts."""
    text = path.read_text(encoding="utf-8")
    decoder = json.JSONDecoder()

    def line_of(pos: int) -> int:
        return text.count("\n", 0, pos) + 1

    def skip_ws(pos: int) -> int:
        while pos < len(text) and text[pos] in " \t\r\n":
            pos += 1
        return pos

    pos = skip_ws(0)
    if pos >= len(text) or text[pos] != "[":
        raise DataError(f"{path}:{line_of(pos)}", "a .json data file must hold a list of records")
    pos = skip_ws(pos + 1)
    if pos < len(text) and text[pos] == "]":
        return
    while True:
        where = f"{path}:{line_of(pos)}"
        try:
            obj, pos = decoder.raw_decode(text, pos)
        except json.JSONDecodeError as e:
            raise DataError(f"{path}:{e.lineno}", f"malformed JSON ({e.msg})") from None
        yield obj, where
        pos = skip_ws(pos)
        if pos < len(text) and text[pos] == ",":
            pos = skip_ws(pos + 1)
            continue
        if pos < len(text) and text[pos] == "]":
            if skip_ws(pos + 1) != len(text):
                raise DataError(f"{path}:{line_of(pos)}", "unexpected text after the list")
            return
        raise DataError(f"{path}:{line_of(pos)}", "malformed JSON (expected ',' or ']')")


def _import_pyarrow_parquet():
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise ImportError(
            "reading Parquet files needs pyarrow: pip install dlmkit[parquet]"
        ) from None
    return pq


def _read_parquet(path: Path) -> Iterable[tuple[Any, str]]:
    pq = _import_pyarrow_parquet()
    table = pq.read_table(path)
    for n, row in enumerate(table.to_pylist(), start=1):
        yield row, f"{path}:row {n}"


def load_records(paths: str | os.PathLike | Sequence[str | os.PathLike]) -> list[Record]:
    """Read and validate SFT records from one or more ``.jsonl`` / ``.json`` / ``.parquet`` files.

    Blank JSONL lines are skipped. Parquet needs ``pyarrow`` (``pip install dlmkit[parquet]``).

    Raises:
        DataError: a malformed line or record (names file and line), or no records at all.
        FileNotFoundError: a path does not exist.
        ValueError: an unsupported file extension.
    """
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    if not paths:
        raise ValueError("paths must name at least one data file, got an empty list")
    records: list[Record] = []
    for p in paths:
        path = Path(p)
        if not path.is_file():
            raise FileNotFoundError(f"data file {str(path)!r} does not exist")
        suffix = path.suffix.lower()
        readers = {".jsonl": _read_jsonl, ".json": _read_json_list, ".parquet": _read_parquet}
        if suffix not in readers:
            raise ValueError(
                f"data file {str(path)!r} has extension {suffix!r}; supported: "
                f"{list(SUPPORTED_SUFFIXES)}"
            )
        records.extend(as_record(obj, where) for obj, where in readers[suffix](path))
    if not records:
        raise DataError(", ".join(str(p) for p in paths), "the dataset is empty (no records)")
    return records


def tokenize_record(record: Record, tokenizer: Tokenizer) -> TokenizedRecord:
    """Render ``record`` with the tokenizer's chat template.

    Raises:
        DataError: the template fails on this record, or nothing in it is supervised.
    """
    try:
        enc = tokenizer.apply_chat_template(list(record.messages))
    except (ValueError, TypeError) as e:
        raise DataError(record.source, str(e)) from None
    if not any(enc.loss_mask):
        raise DataError(record.source, "no supervised tokens after applying the chat template")
    return TokenizedRecord(enc.input_ids, enc.loss_mask)
