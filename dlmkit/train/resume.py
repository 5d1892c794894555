"""What a resumed run trains with: its checkpoint's config, plus the changes it may take.

A resume continues the run its checkpoint belongs to. The config comes from the checkpoint
(``step_N/config.yaml``); the keys the user sets explicitly (a config file, ``--set``) are
taken from the new config. Of those, :data:`~dlmkit.train.config.RESUMABLE_KEYS` (the step
count, intervals, threads, progress, device, output path) are applied and recorded; any other
difference would silently train something else than the config says (a new ``lr`` ignored by
the restored optimizer, a new strategy relabelling the export, a new model failing with a size
mismatch), so it is an error listing every such key with both values, unless
``allow_config_change`` is given, and then the differences are recorded too.
"""

from __future__ import annotations

import copy
import json
import time
from dataclasses import dataclass, field
from pathlib import Path

from dlmkit import strategies

from .checkpoint import ResumePoint, find_resume_point
from .config import (
    RESUMABLE_KEYS,
    ConfigError,
    flatten,
    get_key,
    set_key,
    validate,
    with_defaults,
)

CHANGES_FILE = "config_changes.jsonl"
_UNSET = "(unset)"


@dataclass
class ResumePlan:
    """A resume: where from, the config it trains with, what changed against the checkpoint."""

    point: ResumePoint
    config: dict
    applied: dict[str, tuple] = field(default_factory=dict)   # resumable keys: (old, new)
    forced: dict[str, tuple] = field(default_factory=dict)    # other keys, allowed by the flag
    # Strategy options an older checkpoint does not record, kept at the values it trained with.
    former: dict = field(default_factory=dict)

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


def _differences(old: dict, new: dict) -> dict[str, tuple]:
    a, b = flatten(old), flatten(new)
    return {k: (a.get(k, _UNSET), b.get(k, _UNSET)) for k in sorted(set(a) | set(b))
            if a.get(k, _UNSET) != b.get(k, _UNSET)}


def _complete_strategy(config: dict, *, from_checkpoint: bool) -> dict:
    """Give ``config["strategy"]`` every option of its family (in place), as the run's
    config.yaml records them. An option a checkpoint does not record (config.yaml from an
    older dlmkit, which wrote only the options set) takes the family's ``former_defaults``
    value if it has one (what the run trained with; returned), else today's default."""
    section = config.get("strategy")
    try:
        family = strategies.get(section["name"])
    except (TypeError, KeyError, ValueError):
        return {}  # validate() names the bad strategy section
    former = {k: copy.deepcopy(v) for k, v in family.former_defaults.items()
              if from_checkpoint and k not in section}
    section.update(former)
    for key, value in family.options.items():
        section.setdefault(key, copy.deepcopy(value))
    return former


def plan_resume(config: dict, *, explicit: list[str] | None = None,
                allow_config_change: bool = False) -> ResumePlan:
    """The resume of ``config["output_dir"]``.

    ``explicit``: dotted keys the user set (see :func:`~dlmkit.train.config.explicit_keys`);
    only they are taken from ``config``. ``None`` takes every key (the API: ``config`` is the
    whole intended config)."""
    run_dir = config.get("output_dir")
    if not run_dir:
        raise ConfigError("--resume needs --output-dir (the run to continue)")
    point = find_resume_point(Path(run_dir))
    stored = point.config
    if stored is None:  # an older checkpoint: nothing to compare with
        point.notes.append(f"{point.path} stores no config (older dlmkit); the config is not "
                           "checked against it")
        return ResumePlan(point, config)
    try:  # keys added to dlmkit since the checkpoint was written take their defaults
        stored = with_defaults(stored)
    except ConfigError as err:
        raise ConfigError(f"--resume: {point.path / 'config.yaml'}: {err}") from None
    former = _complete_strategy(stored, from_checkpoint=True)
    resumed = copy.deepcopy(stored)
    if explicit is None:
        resumed = copy.deepcopy(config)
        _complete_strategy(resumed, from_checkpoint=False)
    else:
        for key in explicit:
            # An explicit key under a mapping replaces that leaf only (as --set merges).
            set_key(resumed, key, get_key(config, key))
    resumed["output_dir"] = config["output_dir"]  # the directory may have moved
    try:
        resumed = validate(resumed)
    except ConfigError as err:
        raise ConfigError(f"--resume: the config of {point.path} with your changes is not "
                          f"valid: {err}") from None
    changes = _differences(stored, resumed)
    applied = {k: v for k, v in changes.items() if k in RESUMABLE_KEYS}
    other = {k: v for k, v in changes.items() if k not in RESUMABLE_KEYS}
    if other and not allow_config_change:
        listed = "\n".join(f"  {k}: {old!r} in the checkpoint, {new!r} now"
                           for k, (old, new) in other.items())
        raise ConfigError(
            f"--resume: the config differs from the one {point.path} was trained with, in keys "
            f"a resumed run cannot change:\n{listed}\nResume without those settings (the run "
            f"keeps its own config; only {', '.join(RESUMABLE_KEYS)} may change), start a new "
            f"run with another --output-dir, or pass --allow-config-change to apply them anyway "
            f"(recorded in {Path(run_dir) / CHANGES_FILE}).")
    return ResumePlan(point, resumed, applied, other, former)
