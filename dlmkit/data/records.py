"""SFT records from local files, validated up front, and their tokenization.

Accepted record shapes (one per JSONL line, per element of a JSON list, per Parquet / CSV /
Arrow row or per row of a saved Hugging Face dataset)::

    {"prompt": str, "response": str, "system": str (optional)}
    {"messages": [{"role": str, "content": str}, ...]}   # at least one "assistant" turn
    {"conversations": [{"from": str, "value": str}, ...], "system": str (optional)}  # ShareGPT
    {"instruction": str, "input": str (optional), "output": str}                     # Alpaca

Other field names are mapped with ``fields`` (``data.fields`` in a config), e.g.
``{"prompt": "question", "response": "answer"}`` or ``{"role": "speaker"}``.

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
    "check_fields",
    "load_records",
    "records_from_dicts",
    "tokenize_record",
]

SUPPORTED_SUFFIXES = (".jsonl", ".json", ".parquet", ".csv", ".tsv", ".arrow")


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


# Field names the formats use (the keys of a field mapping). role/content, from/value name the
# keys inside each message of 'messages' / 'conversations'.
FIELDS = ("prompt", "response", "system", "messages", "role", "content", "conversations",
          "from", "value", "instruction", "input", "output")
_NESTED = ("role", "content", "from", "value")

# Record formats: name -> the keys that identify it.
FORMATS = {
    "prompt/response": ("prompt", "response"),
    "messages": ("messages",),
    "sharegpt": ("conversations",),
    "alpaca": ("instruction", "output"),
}
_FORMAT_HELP = ("expected 'prompt' + 'response' (optional 'system'), 'messages' "
                "[{role, content}], 'conversations' [{from, value}] (ShareGPT) or 'instruction' "
                "+ 'output' (optional 'input'; Alpaca); map other names with data.fields, e.g. "
                "{prompt: question, response: answer}")

# ShareGPT speaker names -> chat roles.
SHAREGPT_ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant",
                  "chatgpt": "assistant", "model": "assistant", "system": "system"}


def check_fields(fields: Any, name: str = "fields") -> dict[str, str]:
    """Validate a field mapping ``{format field: the name in your data}``; returns it."""
    if fields is None:
        return {}
    if not isinstance(fields, Mapping):
        raise ValueError(f"{name} must be a mapping {{field: name in the data}}, got {fields!r}")
    for key, value in fields.items():
        if key not in FIELDS:
            raise ValueError(f"{name}: unknown field {key!r}; fields that can be mapped: "
                             f"{', '.join(FIELDS)}")
        if not isinstance(value, str) or not value:
            raise ValueError(f"{name}.{key} must be a non-empty string (the name in the "
                             f"data), got {value!r}")
    return dict(fields)


def _rename(obj: Mapping, mapping: Mapping[str, str]) -> dict:
    """``obj`` with each mapped name replaced by its format field (the original name of a
    mapped field, if also present, is dropped: the mapping says which one is meant)."""
    if not mapping:
        return dict(obj)
    sources = set(mapping.values())
    out = {k: v for k, v in obj.items() if k not in sources and k not in mapping}
    for field, source in mapping.items():
        if source in obj:
            out[field] = obj[source]
    return out


def _string(obj: Mapping, key: str, where: str, fmt: str) -> str:
    if key not in obj:
        raise DataError(where, f"missing key {key!r} (a {fmt} record needs "
                               f"{' and '.join(repr(k) for k in FORMATS[fmt])})")
    if not isinstance(obj[key], str):
        raise DataError(where, f"{key!r} must be a string, got {type(obj[key]).__name__}")
    return obj[key]


def _system(obj: Mapping, where: str) -> list[dict[str, str]]:
    system = obj.get("system")
    if system is None:
        return []
    if not isinstance(system, str):
        raise DataError(where, f"'system' must be a string, got {type(system).__name__}")
    return [{"role": "system", "content": system}]


def _turns(obj: Mapping, where: str, key: str, role_key: str, content_key: str,
           nested: Mapping[str, str]) -> list[dict[str, str]]:
    """The list under ``key`` as ``{"role", "content"}`` dicts (roles as written)."""
    msgs = obj[key]
    if not isinstance(msgs, list) or not msgs:
        raise DataError(where, f"{key!r} must be a non-empty list, got {msgs!r:.80}")
    out = []
    for i, m in enumerate(msgs):
        if not isinstance(m, Mapping):
            raise DataError(where, f"{key}[{i}] must be an object, got {m!r:.80}")
        m = _rename(m, nested)
        role, content = m.get(role_key), m.get(content_key)
        if not isinstance(role, str) or not role:
            raise DataError(
                where, f"{key}[{i}].{role_key} must be a non-empty string, got {role!r}"
            )
        if not isinstance(content, str):
            raise DataError(
                where, f"{key}[{i}].{content_key} must be a string, got {type(content).__name__}"
            )
        out.append({"role": role, "content": content})
    return out


def _shape(obj: Mapping, where: str) -> str:
    """The record's format. A key holding ``None`` (a Parquet/datasets column this row does
    not use) identifies a format only when no key with a value does."""
    def matching(present) -> list[str]:
        return [name for name, keys in FORMATS.items() if any(k in present for k in keys)]

    found = matching({k for k, v in obj.items() if v is not None}) or matching(set(obj))
    if len(found) > 1:
        keys = " and ".join("/".join(repr(k) for k in FORMATS[f]) for f in found[:2])
        raise DataError(where, f"a record has either {keys}, not both (one format per record)")
    if not found:
        raise DataError(where, f"unknown record shape with keys {sorted(obj)}; {_FORMAT_HELP}")
    return found[0]


def as_record(obj: Any, where: str, fields: Mapping[str, str] | None = None) -> Record:
    """Validate one record (a dict from a file) of any format in :data:`FORMATS`; ``where``
    names it in errors. ``fields`` maps format fields to the names the data uses (see
    :func:`check_fields`), e.g. ``{"prompt": "question", "response": "answer"}``."""
    if not isinstance(obj, Mapping):
        raise DataError(where, f"a record must be a JSON object, got {type(obj).__name__}")
    fields = fields or {}
    nested = {k: v for k, v in fields.items() if k in _NESTED}
    obj = _rename(obj, {k: v for k, v in fields.items() if k not in _NESTED})
    fmt = _shape(obj, where)
    if fmt == "messages":
        msgs = _turns(obj, where, "messages", "role", "content", nested)
    elif fmt == "sharegpt":
        msgs = _system(obj, where)
        for i, m in enumerate(_turns(obj, where, "conversations", "from", "value", nested)):
            role = SHAREGPT_ROLES.get(m["role"].lower())
            if role is None:
                raise DataError(where, f"conversations[{i}].from is {m['role']!r}; ShareGPT "
                                       f"speakers: {', '.join(SHAREGPT_ROLES)}")
            msgs.append({"role": role, "content": m["content"]})
    elif fmt == "prompt/response":
        msgs = _system(obj, where) + [
            {"role": "user", "content": _string(obj, "prompt", where, fmt)},
            {"role": "assistant", "content": _string(obj, "response", where, fmt)},
        ]
    else:  # alpaca: the input, when there is one, follows the instruction
        instruction = _string(obj, "instruction", where, fmt)
        extra = obj.get("input")
        if extra is not None and not isinstance(extra, str):
            raise DataError(where, f"'input' must be a string, got {type(extra).__name__}")
        prompt = f"{instruction}\n\n{extra}" if extra else instruction
        msgs = _system(obj, where) + [
            {"role": "user", "content": prompt},
            {"role": "assistant", "content": _string(obj, "output", where, fmt)},
        ]
    if not any(m["role"] == "assistant" for m in msgs):
        raise DataError(where, "no 'assistant' message, so nothing would be supervised")
    return Record(tuple(msgs), where)


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


def _import_datasets():
    try:
        import datasets
    except ImportError:
        raise ImportError(
            "reading Hugging Face datasets directories and .csv/.tsv/.arrow files needs "
            "datasets: pip install dlmkit[datasets]"
        ) from None
    return datasets


def _rows(path: Path, dataset) -> Iterable[tuple[Any, str]]:
    for n, row in enumerate(dataset, start=1):
        yield row, f"{path}:row {n}"


def _read_saved_dataset(path: Path) -> Iterable[tuple[Any, str]]:
    """A directory written by ``Dataset.save_to_disk`` (or one split of a ``DatasetDict``)."""
    if (path / "dataset_dict.json").is_file():
        splits = sorted(p.name for p in path.iterdir() if (p / "state.json").is_file())
        if len(splits) != 1:
            raise DataError(str(path), f"a DatasetDict with splits {splits}; pass one split's "
                                       f"directory, e.g. {path / (splits or ['train'])[0]}")
        path = path / splits[0]
    if not (path / "state.json").is_file():
        raise DataError(str(path), "a directory that is not a saved Hugging Face dataset (no "
                                   "state.json or dataset_dict.json; write it with "
                                   "Dataset.save_to_disk)")
    datasets = _import_datasets()
    try:
        dataset = datasets.load_from_disk(str(path))
    except (OSError, ValueError) as e:
        raise DataError(str(path), f"cannot load the saved dataset ({e})") from None
    yield from _rows(path, dataset)


def _read_with_datasets(path: Path) -> Iterable[tuple[Any, str]]:
    """``.csv`` / ``.tsv`` / ``.arrow`` through ``datasets``' own loaders; rows numbered from 1
    after the header."""
    datasets = _import_datasets()
    builder, options = {".csv": ("csv", {}), ".tsv": ("csv", {"delimiter": "\t"}),
                        ".arrow": ("arrow", {})}[path.suffix.lower()]
    try:
        dataset = datasets.load_dataset(builder, data_files=str(path), split="train", **options)
    except Exception as e:  # the loaders raise many types (pandas, pyarrow, DatasetGenerationError)
        cause = e.__cause__ or e
        raise DataError(str(path), f"cannot read it as {builder} ({cause})") from None
    yield from _rows(path, dataset)


READERS = {".jsonl": _read_jsonl, ".json": _read_json_list, ".parquet": _read_parquet,
           ".csv": _read_with_datasets, ".tsv": _read_with_datasets,
           ".arrow": _read_with_datasets}


def load_records(paths: str | os.PathLike | Sequence[str | os.PathLike],
                 fields: Mapping[str, str] | None = None) -> list[Record]:
    """Read and validate SFT records from ``.jsonl`` / ``.json`` / ``.parquet`` files,
    ``.csv`` / ``.tsv`` / ``.arrow`` files and directories written by a Hugging Face
    ``Dataset.save_to_disk`` (these three need ``datasets``).

    Blank JSONL lines are skipped. Parquet needs ``pyarrow`` (``pip install dlmkit[parquet]``).
    ``fields`` maps format fields to the names in the data (:func:`check_fields`).

    Raises:
        DataError: a malformed line or record (names file and line or row), or no records.
        FileNotFoundError: a path does not exist.
        ValueError: an unsupported file extension, or a bad ``fields`` mapping.
    """
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    if not paths:
        raise ValueError("paths must name at least one data file, got an empty list")
    fields = check_fields(fields)
    records: list[Record] = []
    for p in paths:
        path = Path(p)
        if path.is_dir():
            reader = _read_saved_dataset
        elif not path.is_file():
            raise FileNotFoundError(f"data file {str(path)!r} does not exist")
        else:
            suffix = path.suffix.lower()
            if suffix not in READERS:
                raise ValueError(
                    f"data file {str(path)!r} has extension {suffix!r}; supported: "
                    f"{list(SUPPORTED_SUFFIXES)} or a saved Hugging Face dataset directory"
                )
            reader = READERS[suffix]
        records.extend(as_record(obj, where, fields) for obj, where in reader(path))
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
