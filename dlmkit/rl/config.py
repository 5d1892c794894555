"""``dlmkit rl`` configuration: YAML + ``--set key.sub=value`` overrides, checked up front.

The same file format and override syntax as ``dlmkit train`` (the merge and the YAML reader
are :mod:`dlmkit.train.config`'s); unknown keys are errors that list the valid ones. The
sampler options under ``rollout.sampler`` are those of :mod:`dlmkit.decoding.options` (null =
the policy export's default), except ``seed``: every rollout is seeded from ``(seed, step,
prompt, completion)``.
"""

from __future__ import annotations

import copy
import os
from pathlib import Path

from dlmkit.generate import OPTIONS
from dlmkit.train.config import ConfigError, _layers, _merge

ESTIMATORS = ("elbo", "one_step")
BUNDLED_REWARDS = ("exact_answer", "numeric_answer", "format")
# Every sampler option but the seed (rollouts are seeded per completion): null = the export's.
SAMPLER_KEYS = ("sampler", *sorted(set().union(*OPTIONS.values()) - {"seed"}))

DEFAULTS: dict = {
    "seed": 0,
    "output_dir": None,          # default: runs/rl-<strategy>-<time>
    "policy": None,              # the SFT export to improve: RUN/final of `dlmkit train`
    "reference": None,           # frozen model of the KL term (null = the policy as loaded)
    # LoRA on the policy: {r, alpha, dropout, target_modules, modules_to_save} (model.lora's
    # keys but export: the adapters are merged into RUN/final). Only the adapters train; with
    # kl_beta > 0 and no reference, the reference is the policy with its adapters off (no
    # second copy of the model).
    "lora": None,
    "data": {
        "task": None,            # a bundled task (its prompt/response records), or files
        "task_options": {},
        "split": "train",
        "num_prompts": 2000,     # records drawn from the bundled task
        "files": [],             # records with a reference answer (the train formats)
        "fields": {},            # format field -> your name, e.g. {response: answer}
    },
    "reward": {
        # exact_answer | numeric_answer | format (dlmkit.rl.rewards), or module:function
        # called as f(prompt, completion, record) -> float
        "function": "exact_answer",
        "pattern": None,         # the format reward's regular expression (null: a number)
    },
    "rollout": {
        "group_size": 4,         # G completions per prompt
        "prompts_per_step": 8,   # prompts per optimizer step over all ranks
        "batch_size": None,      # completions per sampler call on a rank (null: all of them)
        # Rollouts sample (temperature 1: the policy's own distribution); a greedy sampler
        # would give a prompt G identical completions and no advantage to learn from.
        "sampler": {**{key: None for key in SAMPLER_KEYS}, "temperature": 1.0},
    },
    "objective": {
        "estimator": "elbo",     # elbo (the family's ELBO, shared noise) | one_step (d1)
        "samples": 1,            # noise draws per completion and step (elbo)
        "prompt_mask_prob": 0.15,  # one_step: share of prompt tokens masked
        "clip_epsilon": 0.2,
        "kl_beta": 0.0,          # > 0: k3 KL to the frozen reference
        "scale_rewards": True,   # divide the group-centred rewards by the group's std
        "updates_per_rollout": 1,  # optimizer steps on one batch of rollouts (GRPO's mu)
    },
    "train": {
        "steps": 100,            # rollout batches (each gives updates_per_rollout updates)
        "lr": 1.0e-5,
        "warmup_steps": 0,
        "weight_decay": 0.0,
        "betas": [0.9, 0.99],
        "max_grad_norm": 1.0,
        "micro_batch_size": None,  # completions per forward/backward (null: all of a rank's)
        "autocast": "auto",      # auto (bf16 on CUDA) | bf16 | none
        "distributed": "ddp",    # ddp | fsdp2 (under torchrun; fsdp2: the policy and the
        # reference sharded, the policy gathered whole for each step's rollouts)
        "device": "auto",
        "threads": None,
        "log_every": 1,
        "save_every": 50,
        "progress": True,
    },
}

# What a resumed run may change: nothing that alters what is trained.
RESUMABLE_KEYS = ("train.steps", "train.log_every", "train.save_every", "train.threads",
                  "train.progress", "train.device", "output_dir")


def load_rl_config(path: str | Path | None = None, overrides: list[str] | None = None) -> dict:
    """The default config updated by a YAML file and then by ``key.sub=value`` overrides."""
    config = copy.deepcopy(DEFAULTS)
    for _, layer in _layers(path, overrides):
        config = _merge(config, layer)
    for key in ("policy", "reference"):
        if isinstance(config[key], str) and os.path.exists(config[key]):
            config[key] = os.path.abspath(config[key])
    files = config["data"]["files"]
    if isinstance(files, list):
        config["data"]["files"] = [os.path.abspath(f) if isinstance(f, str)
                                   and os.path.exists(f) else f for f in files]
    return validate(config)


def _int(value, lo: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= lo


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def validate(config: dict) -> dict:
    """Check every value; a ConfigError names the key, the value and what is allowed."""
    def need(cond: bool, message: str) -> None:
        if not cond:
            raise ConfigError(message)

    d, r, ro, o, t = (config[k] for k in ("data", "reward", "rollout", "objective", "train"))
    need(_int(config["seed"], 0), f"seed must be an int >= 0, got {config['seed']!r}")
    need(isinstance(config["policy"], str),
         f"policy must be the SFT model directory to improve (RUN/final of `dlmkit train`), "
         f"got {config['policy']!r}")
    need(config["reference"] is None or isinstance(config["reference"], str),
         f"reference must be a model directory or null (the policy), got "
         f"{config['reference']!r}")
    if config["lora"] is not None:
        from dlmkit.models.lora import lora_options

        spec = config["lora"]
        export = spec.get("export", "merged") if isinstance(spec, dict) else "merged"
        need(export == "merged", f"lora.export: rl writes the trained policy as a model "
             f"directory of its family, the adapters merged into it; got export={export!r}")
        try:
            config["lora"] = {k: v for k, v in lora_options(spec, "lora").items()
                              if k != "export"}
        except ValueError as err:
            raise ConfigError(str(err)) from None
    need(isinstance(d["files"], list), f"data.files must be a list of paths, got {d['files']!r}")
    need(bool(d["task"]) != bool(d["files"]),
         f"data: give exactly one of data.task (a bundled task) and data.files, got "
         f"task={d['task']!r}, files={d['files']!r}")
    need(_int(d["num_prompts"], 1),
         f"data.num_prompts must be a positive int, got {d['num_prompts']!r}")
    from dlmkit.data.tasks import SPLITS

    need(d["split"] in SPLITS, f"data.split must be one of {', '.join(SPLITS)}, got "
         f"{d['split']!r}")
    need(isinstance(r["function"], str) and (r["function"] in BUNDLED_REWARDS
                                             or ":" in r["function"]),
         f"reward.function must be one of {', '.join(BUNDLED_REWARDS)} or 'module:function', "
         f"got {r['function']!r}")
    need(r["pattern"] is None or r["function"] == "format",
         f"reward.pattern is read by reward.function 'format' only, got pattern="
         f"{r['pattern']!r} with function {r['function']!r}")
    need(r["pattern"] is None or isinstance(r["pattern"], str),
         f"reward.pattern must be a regular expression string, got {r['pattern']!r}")
    need(_int(ro["group_size"], 2),
         f"rollout.group_size must be an int >= 2 (advantages compare a prompt's completions), "
         f"got {ro['group_size']!r}")
    need(_int(ro["prompts_per_step"], 1),
         f"rollout.prompts_per_step must be a positive int, got {ro['prompts_per_step']!r}")
    need(ro["batch_size"] is None or _int(ro["batch_size"], 1),
         f"rollout.batch_size must be a positive int or null, got {ro['batch_size']!r}")
    need(o["estimator"] in ESTIMATORS,
         f"objective.estimator must be one of {', '.join(ESTIMATORS)}, got {o['estimator']!r}")
    need(_int(o["samples"], 1),
         f"objective.samples must be a positive int, got {o['samples']!r}")
    need(_number(o["prompt_mask_prob"]) and 0 <= o["prompt_mask_prob"] < 1,
         f"objective.prompt_mask_prob must be a number in [0, 1), got {o['prompt_mask_prob']!r}")
    need(_number(o["clip_epsilon"]) and 0 < o["clip_epsilon"] < 1,
         f"objective.clip_epsilon must be a number in (0, 1), got {o['clip_epsilon']!r}")
    need(_number(o["kl_beta"]) and o["kl_beta"] >= 0,
         f"objective.kl_beta must be a number >= 0 (0 = no KL term), got {o['kl_beta']!r}")
    need(config["reference"] is None or o["kl_beta"] > 0,
         f"reference={config['reference']!r} is only read by the KL term: set objective.kl_beta "
         "> 0, or drop reference")
    need(isinstance(o["scale_rewards"], bool),
         f"objective.scale_rewards must be true or false, got {o['scale_rewards']!r}")
    need(_int(o["updates_per_rollout"], 1),
         f"objective.updates_per_rollout must be a positive int, got "
         f"{o['updates_per_rollout']!r}")
    for key in ("steps", "log_every", "save_every"):
        need(_int(t[key], 1), f"train.{key} must be a positive int, got {t[key]!r}")
    need(_int(t["warmup_steps"], 0),
         f"train.warmup_steps must be an int >= 0, got {t['warmup_steps']!r}")
    need(_number(t["lr"]) and t["lr"] > 0, f"train.lr must be > 0, got {t['lr']!r}")
    need(_number(t["weight_decay"]) and t["weight_decay"] >= 0,
         f"train.weight_decay must be a number >= 0, got {t['weight_decay']!r}")
    need(isinstance(t["betas"], (list, tuple)) and len(t["betas"]) == 2
         and all(_number(b) and 0 <= b < 1 for b in t["betas"]),
         f"train.betas must be two numbers in [0, 1), got {t['betas']!r}")
    need(t["max_grad_norm"] is None or (_number(t["max_grad_norm"]) and t["max_grad_norm"] > 0),
         f"train.max_grad_norm must be > 0 or null, got {t['max_grad_norm']!r}")
    need(t["micro_batch_size"] is None or _int(t["micro_batch_size"], 1),
         f"train.micro_batch_size must be a positive int or null, got "
         f"{t['micro_batch_size']!r}")
    need(t["autocast"] in ("auto", "bf16", "none"),
         f"train.autocast must be auto, bf16 or none, got {t['autocast']!r}")
    need(t["distributed"] in ("ddp", "fsdp2"),
         f"train.distributed must be ddp or fsdp2, got {t['distributed']!r}")
    need(t["threads"] is None or _int(t["threads"], 1),
         f"train.threads must be a positive int or null, got {t['threads']!r}")
    need(isinstance(t["progress"], bool),
         f"train.progress must be true or false, got {t['progress']!r}")
    return config


def sampler_options(config: dict) -> tuple[str | None, dict]:
    """``(sampler name or None, the options the user set)`` of ``rollout.sampler``."""
    options = {k: v for k, v in config["rollout"]["sampler"].items() if v is not None}
    return options.pop("sampler", None), options
