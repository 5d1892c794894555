"""Data for dlmkit: tokenizers, SFT records, bundled synthetic tasks, the collator, the
dataset wrapper, the rank-independent sampler and per-sample seeds."""

from __future__ import annotations

import importlib
import importlib.util

from dlmkit.data.collate import Collator
from dlmkit.data.dataset import SFTDataset
from dlmkit.data.records import (
    DataError,
    DataWarning,
    Record,
    TokenizedRecord,
    load_records,
    records_from_dicts,
    tokenize_record,
)
from dlmkit.data.sampler import GlobalBatchSampler, eval_batches
from dlmkit.data.tasks import SPLITS, SyntheticTask, get_task, task_names
from dlmkit.data.tokenizer import (
    ByteTokenizer,
    ChatEncoding,
    HFTokenizer,
    Tokenizer,
    load_tokenizer,
)

_SEED_NAMES = ("sample_seed", "validation_seed")

__all__ = [
    "SPLITS",
    "ByteTokenizer",
    "ChatEncoding",
    "Collator",
    "DataError",
    "DataWarning",
    "GlobalBatchSampler",
    "HFTokenizer",
    "Record",
    "SFTDataset",
    "SyntheticTask",
    "TokenizedRecord",
    "Tokenizer",
    "eval_batches",
    "get_task",
    "load_records",
    "load_tokenizer",
    "records_from_dicts",
    "task_names",
    "tokenize_record",
]
if importlib.util.find_spec("dlmkit.data.seeds") is not None:
    __all__ += list(_SEED_NAMES)


def __getattr__(name: str):
    # seeds.py is imported lazily so this package works while it is absent or being written.
    if name in _SEED_NAMES:
        return getattr(importlib.import_module("dlmkit.data.seeds"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
