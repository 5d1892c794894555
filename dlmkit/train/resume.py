"""What a resumed run trains with: its checkpoint's config, plus the changes it may take.

A resume continues the run its checkpoint belongs to. The config comes from the checkpoint
(``step_N/config.yaml``); the keys the user sets explicitly (a config file, ``--set``) are
taken from the new config. Of those, :data:`~dlmkit.train.config.RESUMABLE_KEYS` (the step
count, intervals, threads, progress, device, output path) are applied and recorded; any other
difference would silently train something else than the config says (a new ``lr`` ignored by
the restored optimizer, a new strategy relabelling the export, a new model failing with a size
mismatch), so it is an error listing every such key with both values, unless
``allow_config_change`` is given, and then the differences are recorded too.

The data files are checked the same way: config.yaml names them by absolute path (see
:func:`~dlmkit.train.config.load_config`), and ``RUN/data_files.json`` records each one's size
and SHA-256 when the run starts (:func:`data_fingerprints`); a file that has changed or gone
since is listed with the config differences. A content hash rather than size + mtime: a run
and its data copied to another machine (``cp``, ``rsync`` without ``-t``) get new mtimes but
are the same data, and an edit that keeps the size within the clock's resolution is still
seen. It costs one read of the data per start (about 1 s per GB).
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from dlmkit import strategies

from .checkpoint import ResumePoint, find_resume_point
from .config import (
    RESUMABLE_KEYS,
    ConfigError,
    RunConfig,
    absolute_paths,
    check_packages,
    flatten,
    get_key,
    set_key,
    with_defaults,
)

CHANGES_FILE = "config_changes.jsonl"
DATA_FILES = "data_files.json"
_UNSET = "(unset)"


@dataclass
class ResumePlan:
    """A resume: where from, the config it trains with, what changed against the checkpoint."""

    point: ResumePoint
    config: RunConfig
    applied: dict[str, tuple] = field(default_factory=dict)   # resumable keys: (old, new)
    forced: dict[str, tuple] = field(default_factory=dict)    # other keys, allowed by the flag
    # Strategy options an older checkpoint does not record, kept at the values it trained with.
    former: dict = field(default_factory=dict)
    data_files: dict[str, str] = field(default_factory=dict)  # path -> fingerprint, now
    notes: list[str] = field(default_factory=list)  # what could not be checked, and why

    def record(self, run_dir: Path, step: int) -> None:
        """Append the changes to ``RUN/config_changes.jsonl`` (nothing when none)."""
        if not (self.applied or self.forced):
            return
        entry = {"time": time.strftime("%Y-%m-%dT%H:%M:%S"), "resumed_at_step": step,
                 "checkpoint": self.point.path.name,
                 "applied": {k: list(v) for k, v in self.applied.items()},
                 "forced": {k: list(v) for k, v in self.forced.items()}}
        with (Path(run_dir) / CHANGES_FILE).open("a") as f:
            f.write(json.dumps(entry) + "\n")

    def summary(self) -> list[str]:
        lines = [f"resume: {note}; resuming from {self.point.path} instead, the newest "
                 "complete checkpoint" for note in self.point.notes]
        lines += [f"resume: {note}" for note in self.notes]
        if self.former:
            kept = ", ".join(f"strategy.{k}={v!r}" for k, v in self.former.items())
            lines.append(f"resume: {self.point.path} does not record {kept} (older dlmkit); "
                         "continuing with these values, which it was trained with (the "
                         "family's defaults have changed since)")
        for key, (old, new) in self.applied.items():
            lines.append(f"resume: {key}: {old!r} -> {new!r}")
        for key, (old, new) in self.forced.items():
            lines.append(f"resume: {key}: {old!r} -> {new!r} (forced by --allow-config-change)")
        return lines


def data_files(config: RunConfig) -> list[str]:
    """The data files (or saved dataset directories) ``config`` trains and validates on."""
    return [str(p) for p in [*config.data.train_files, *config.data.validation_files]]


def _fingerprint(path: str) -> str:
    """``"<bytes> bytes, sha256 <hex>"`` of a file, or of every file under a directory (their
    relative names hashed too); ``"missing"`` when there is nothing at ``path``."""
    if os.path.isfile(path):
        with open(path, "rb") as f:
            digest = hashlib.file_digest(f, "sha256").hexdigest()
        return f"{os.path.getsize(path)} bytes, sha256 {digest}"
    if os.path.isdir(path):
        h, size = hashlib.sha256(), 0
        for root, dirs, files in os.walk(path):
            dirs.sort()
            for name in sorted(files):
                full = os.path.join(root, name)
                h.update(os.path.relpath(full, path).encode() + b"\0")
                with open(full, "rb") as f:
                    h.update(hashlib.file_digest(f, "sha256").digest())
                size += os.path.getsize(full)
        return f"{size} bytes, sha256 {h.hexdigest()}"
    return "missing"


def data_fingerprints(config: RunConfig) -> dict[str, str]:
    """Every data file of ``config`` -> its fingerprint (size and SHA-256)."""
    return {path: _fingerprint(path) for path in data_files(config)}


def record_data_files(run_dir: Path, fingerprints: dict[str, str]) -> None:
    """Write ``RUN/data_files.json``, what a resume checks the data files against."""
    (Path(run_dir) / DATA_FILES).write_text(json.dumps(fingerprints, indent=1) + "\n")


def _data_differences(run_dir: Path, config: RunConfig
                      ) -> tuple[dict[str, tuple], dict, list[str]]:
    """Data files of ``config`` whose fingerprint differs from the run's record: ``{"data file
    PATH": (then, now)}``, the fingerprints now, and notes on what could not be checked."""
    now = data_fingerprints(config)
    recorded = Path(run_dir) / DATA_FILES
    if not recorded.is_file():
        if not now:
            return {}, now, []
        return {}, now, [f"{recorded} does not exist (a run from an older dlmkit): the data files "
                         "are not checked against the ones it trained on"]
    then = json.loads(recorded.read_text())
    # A path the checkpoint's config does not name is a config difference already.
    return ({f"data file {p}": (then[p], now[p]) for p in now if p in then and then[p] != now[p]},
            now, [])


def _older_relative_paths(config: dict, point: ResumePoint) -> list[str]:
    """Make the checkpoint config's relative paths absolute (in place), from the current
    directory as an older dlmkit, which recorded them as written, did; and say so."""
    before = flatten(config)
    absolute_paths(config)
    after = flatten(config)
    moved = [f"{key}={value!r}" for key, value in before.items() if after[key] != value]
    if not moved:
        return []
    return [f"{point.path / 'config.yaml'} records paths relative to the directory the run was "
            f"started in (older dlmkit); reading them from {os.getcwd()}: {', '.join(moved)}"]


def _differences(old: dict, new: dict) -> dict[str, tuple]:
    a, b = flatten(old), flatten(new)
    return {k: (a.get(k, _UNSET), b.get(k, _UNSET)) for k in sorted(set(a) | set(b))
            if a.get(k, _UNSET) != b.get(k, _UNSET)}


def _complete_strategy(config: dict, *, from_checkpoint: bool) -> dict:
    """Give ``config["strategy"]`` (a nested mapping) every option of its family (in place),
    as the run's
    config.yaml records them. An option a checkpoint does not record (config.yaml from an
    older dlmkit, which wrote only the options set) takes the family's ``former_defaults``
    value if it has one (what the run trained with; returned), else today's default."""
    section = config.get("strategy")
    try:
        family = strategies.get(section["name"])
    except (TypeError, KeyError, ValueError):
        return {}  # RunConfig.from_dict names the bad strategy section
    former = {k: copy.deepcopy(v) for k, v in family.former_defaults.items()
              if from_checkpoint and k not in section}
    section.update(former)
    for key, value in family.defaults().items():
        section.setdefault(key, copy.deepcopy(value))
    return former


def plan_resume(config: RunConfig, *, explicit: list[str] | None = None,
                allow_config_change: bool = False) -> ResumePlan:
    """The resume of ``config.output_dir``.

    ``explicit``: dotted keys the user set (see :func:`~dlmkit.train.config.explicit_keys`);
    only they are taken from ``config``. ``None`` takes every key (the API: ``config`` is the
    whole intended config)."""
    run_dir = config.output_dir
    if not run_dir:
        raise ConfigError("--resume needs --output-dir (the run to continue)")
    point = find_resume_point(Path(run_dir))
    stored = point.config
    if stored is None:  # an older checkpoint: nothing to compare with
        point.notes.append(f"{point.path} stores no config (older dlmkit); the config is not "
                           "checked against it")
        return ResumePlan(point, config, data_files=data_fingerprints(config))
    try:  # keys added to dlmkit since the checkpoint was written take their defaults
        stored = with_defaults(stored)
    except ConfigError as err:
        raise ConfigError(f"--resume: {point.path / 'config.yaml'}: {err}") from None
    former = _complete_strategy(stored, from_checkpoint=True)
    notes = _older_relative_paths(stored, point)
    given = config.to_dict()
    resumed = copy.deepcopy(stored)
    if explicit is None:
        resumed = given
        _complete_strategy(resumed, from_checkpoint=False)
    else:
        for key in explicit:
            # An explicit key under a mapping replaces that leaf only (as --set merges).
            set_key(resumed, key, get_key(given, key))
    resumed["output_dir"] = config.output_dir  # the directory may have moved
    try:
        resumed = RunConfig.from_dict(resumed)
        check_packages(resumed)
    except ConfigError as err:
        raise ConfigError(f"--resume: the config of {point.path} with your changes is not "
                          f"valid: {err}") from None
    changes = _differences(stored, resumed.to_dict())
    applied = {k: v for k, v in changes.items() if k in RESUMABLE_KEYS}
    other = {k: v for k, v in changes.items() if k not in RESUMABLE_KEYS}
    changed_data, fingerprints, data_notes = _data_differences(Path(run_dir), resumed)
    other.update(changed_data)
    if other and not allow_config_change:
        listed = "\n".join(f"  {k}: {old!r} in the checkpoint, {new!r} now"
                           for k, (old, new) in other.items())
        data = (f"A data file that differs from the one the run trained on ({DATA_FILES}): "
                "restore it, or train on it as it is with --allow-config-change.\n"
                if changed_data else "")
        raise ConfigError(
            f"--resume: the config differs from the one {point.path} was trained with, in keys "
            f"a resumed run cannot change:\n{listed}\n{data}Resume without those settings (the "
            f"run keeps its own config; only {', '.join(RESUMABLE_KEYS)} may change), start a "
            f"new run with another --output-dir, or pass --allow-config-change to apply them "
            f"anyway (recorded in {Path(run_dir) / CHANGES_FILE}).")
    return ResumePlan(point, resumed, applied, other, former, fingerprints, notes + data_notes)
