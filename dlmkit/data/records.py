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
JSONL) or row (Parquet) and what is wrong, before any training starts. Records that train, but
not as their author probably meant (an empty answer, turns after the last answer), are counted
in a :class:`DataWarning` naming the file and their lines.
"""

from __future__ import annotations

import json
import os
import warnings
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dlmkit.data.tokenizer import Tokenizer

__all__ = [
    "DataError",
    "DataWarning",
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


class DataWarning(UserWarning):
    """Data that trains, but not as its author probably meant (e.g. empty responses): the
    message names the file, how many records and their lines."""


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

# The roles of a 'messages' turn; only 'assistant' turns are supervised.
CHAT_ROLES = ("system", "user", "assistant")

# ShareGPT speaker names -> chat roles.
SHAREGPT_SHAPE = '{"conversations": [{"from": ..., "value": ...}]}'
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
        for field in (role_key, content_key):
            _need_key(m, field, nested, where, f"{key}[{i}]",
                      other=content_key if field == role_key else role_key)
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


def _need_key(m: Mapping, field: str, nested: Mapping[str, str], where: str, name: str,
              other: str) -> None:
    """A DataError when turn ``m`` (named ``name``) lacks ``field`` (or the name ``nested``
    maps it to): its keys, and how to map the one the data uses."""
    written = nested.get(field, field)
    if written in m:
        return
    keys = ", ".join(repr(k) for k in m)
    if field in nested:
        fix = f"data.fields maps {field!r} to {written!r}"
    else:
        taken = nested.get(other, other)
        candidates = [k for k, v in m.items() if isinstance(v, str) and k != taken]
        example = candidates[0] if len(candidates) == 1 else "NAME"
        fix = (f"map the name your data uses with data.fields, e.g. "
               f"{{{field}: {example}}}")
    raise DataError(where, f"{name} has no {written!r} key (its keys: {keys}); {fix}")


def _no_answer(roles: list[str], fmt: str) -> str:
    """Why a record has no 'assistant' turn, from the roles (or ShareGPT speakers) written."""
    found = ", ".join(repr(r) for r in dict.fromkeys(roles))
    if fmt == "sharegpt":
        answers = [n for n, r in SHAREGPT_ROLES.items() if r == "assistant"]
        return (f"no 'assistant' message, so nothing would be supervised: speakers ('from') "
                f"found: {found}; an answer's speaker is one of "
                f"{', '.join(repr(a) for a in answers)}")
    allowed = ", ".join(repr(r) for r in CHAT_ROLES)
    text = (f"no 'assistant' message, so nothing would be supervised: roles found: {found}; "
            f"roles allowed: {allowed} (the 'assistant' turns are the answers learned)")
    sharegpt = [r for r in dict.fromkeys(roles)
                if r.lower() in SHAREGPT_ROLES and r.lower() not in CHAT_ROLES]
    if sharegpt:
        names = ", ".join(repr(r) for r in sharegpt)
        text += (f"; {names} {'is a' if len(sharegpt) == 1 else 'are'} ShareGPT speaker "
                 f"name{'s' * (len(sharegpt) > 1)}: rename to 'user' / 'assistant', or write "
                 f"the record as ShareGPT {SHAREGPT_SHAPE}, which maps them")
    cased = [r for r in dict.fromkeys(roles) if r.lower() in CHAT_ROLES and r not in CHAT_ROLES]
    if cased:
        text += "; roles are lowercase: " + ", ".join(f"{r!r} should be {r.lower()!r}"
                                                      for r in cased)
    return text


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
        written = [m["role"] for m in msgs]
    elif fmt == "sharegpt":
        msgs = _system(obj, where)
        turns = _turns(obj, where, "conversations", "from", "value", nested)
        written = [m["role"] for m in turns]
        for i, m in enumerate(turns):
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
        # prompt/response and Alpaca records always have their answer turn
        raise DataError(where, _no_answer(written, fmt))
    return Record(tuple(msgs), where)


def records_from_dicts(items: Iterable[Mapping[str, Any]], source: str = "records") -> list[Record]:
    """Validate in-memory records (e.g. a bundled task); errors name them ``source[index]``,
    and a :class:`DataWarning` says how many have an empty answer or end after it (see
    :func:`warn_unanswered`)."""
    records = [as_record(obj, f"{source}[{i}]") for i, obj in enumerate(items)]
    if not records:
        raise DataError(source, "no records")
    warn_unanswered(records, source, stacklevel=3)
    return records


def warn_unanswered(records: Sequence[Record], source: str, stacklevel: int = 2) -> None:
    """A :class:`DataWarning` naming ``source`` (a file, or the name of in-memory records) and
    the records of it that train other than meant: an empty (or blank) answer, which teaches
    the model to answer nothing, and turns after the last answer, which are never trained on
    (only 'assistant' turns are supervised)."""
    empty = [r.source for r in records
             if any(m["role"] == "assistant" and not m["content"].strip() for m in r.messages)]
    trailing = [r for r in records if r.messages[-1]["role"] != "assistant"]
    problems = []
    if empty:
        problems.append(f"{_count(empty, 'has', 'have')} an empty response "
                        f"({_places(empty, source)}): it teaches the model to answer nothing")
    if trailing:
        roles = " / ".join(repr(r) for r in dict.fromkeys(r.messages[-1]["role"]
                                                          for r in trailing))
        problems.append(f"{_count(trailing, 'ends', 'end')} with a {roles} turn after the last "
                        f"answer ({_places([r.source for r in trailing], source)}): nothing is "
                        "trained on it (only 'assistant' turns are supervised)")
    for problem in problems:
        warnings.warn(f"{source}: {problem}", DataWarning, stacklevel=stacklevel + 1)


def _count(items: Sequence, one: str, several: str) -> str:
    return f"1 record {one}" if len(items) == 1 else f"{len(items)} records {several}"


def _places(sources: Sequence[str], source: str, shown: int = 10) -> str:
    """``lines 4, 9, 12`` (or ``rows ...``) for records of file ``source``, else their names;
    at most ``shown`` of them."""
    prefix = f"{source}:"
    local = [s[len(prefix):] if s.startswith(prefix) else s for s in sources]
    rows = all(s.startswith("row ") for s in local)
    lines = all(s.isdigit() for s in local)
    if rows:
        local = [s[len("row "):] for s in local]
    more = f", ... ({len(local) - shown} more)" if len(local) > shown else ""
    text = ", ".join(local[:shown]) + more
    if rows or lines:
        return f"{'row' if rows else 'line'}{'s' * (len(local) > 1)} {text}"
    return text


def _not_utf8(path: Path, error: UnicodeDecodeError) -> DataError:
    """The DataError for the first byte of ``path`` that is not UTF-8: its line, where in the
    line, and how to convert the file."""
    data = path.read_bytes()
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as e:  # the text reader's error gives no position in the file
        error = e
    line = data.count(b"\n", 0, error.start) + 1
    column = error.start - (data.rfind(b"\n", 0, error.start) + 1) + 1
    return DataError(f"{path}:{line}",
                     f"not UTF-8 text: byte 0x{data[error.start]:02x} at byte {column} of the "
                     f"line ({error.reason}); data files are read as UTF-8, so convert it, "
                     f"e.g. with `iconv -f latin1 -t utf-8` if it is Latin-1")


def _read_jsonl(path: Path) -> Iterable[tuple[Any, str]]:
    first = True
    try:
        with path.open(encoding="utf-8") as f:
            for n, line in enumerate(f, start=1):
                if not line.strip():
                    continue
                where = f"{path}:{n}"
                try:
                    obj = json.loads(line.rstrip("\r\n"))  # errors at the end: its column
                except json.JSONDecodeError as e:
                    raise DataError(where, f"malformed JSON ({e.msg} at column {e.colno})"
                                           f"{_jsonl_hint(line, first)}") from None
                if isinstance(obj, list):
                    raise DataError(where, f"a JSON list, not a record{_ONE_PER_LINE}")
                first = False
                yield obj, where
    except UnicodeDecodeError as e:
        raise _not_utf8(path, e) from None


_ONE_PER_LINE = ("; a .jsonl file holds one record (a JSON object) per line: rename it to .json "
                 "(a JSON list of records) or write one record per line")


def _jsonl_hint(line: str, first: bool) -> str:
    """Why a .jsonl line may not parse: the file is a JSON list, or a record spread over
    several lines (pretty-printed JSON)."""
    text = line.strip()
    if first and text.startswith("["):
        return f"; the file looks like a JSON list (it starts with '['){_ONE_PER_LINE}"
    if text == "{":  # how json.dump(..., indent=...) opens a record
        return ("; the line looks like part of pretty-printed JSON (a record spread over "
                f"several lines){_ONE_PER_LINE}")
    return ""


def _read_json_list(path: Path) -> Iterable[tuple[Any, str]]:
    """Elements of a top-level JSON list, each with the line where it starts."""
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise _not_utf8(path, e) from None
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
        found = [as_record(obj, where, fields) for obj, where in reader(path)]
        warn_unanswered(found, str(path), stacklevel=3)
        records.extend(found)
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
