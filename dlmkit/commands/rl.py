"""``dlmkit rl``: group-relative policy optimisation of an SFT export with a reward."""

from __future__ import annotations

import argparse

EPILOG = """examples:
  dlmkit rl configs/rl-mdlm-addition.yaml --set policy=runs/sft/final
  dlmkit rl CONFIG --set objective.estimator=one_step --set objective.kl_beta=0.04
  dlmkit rl CONFIG --set reward.function=my_rewards:score   # f(prompt, completion, record)
  dlmkit rl CONFIG --set "lora={r: 16, alpha: 32}" --set objective.kl_beta=0.04   # adapters only
  dlmkit rl --output-dir runs/rl --resume --set train.steps=200   # continue, bit-exactly
  torchrun --nproc-per-node 2 -m dlmkit.cli rl CONFIG

keys (see docs/rl.md): policy (RUN/final of `dlmkit train`), reference (the KL term's model,
default the policy), data.task / data.files (records with a reference answer),
reward.function (exact_answer | numeric_answer | format | module:function), reward.pattern,
rollout.group_size (G), rollout.prompts_per_step, rollout.batch_size, rollout.sampler.<option>
(the `dlmkit generate` options; null = the export's default), objective.estimator (elbo |
one_step), objective.samples, objective.prompt_mask_prob, objective.clip_epsilon,
objective.kl_beta, objective.scale_rewards, objective.updates_per_rollout, lora (adapters on
the policy, merged into final/; the KL reference is then the policy with them off), train.steps, lr,
warmup_steps, micro_batch_size, max_grad_norm, save_every, log_every, threads, device.

run directory: config.yaml, metrics.jsonl (reward, advantage spread, KL, clip fraction, rollout
and update seconds per step), reward.png, checkpoints/step_N, final/ (a model directory of the
policy's family, for dlmkit eval / generate). A reward that raises or returns a non-finite
value stops the run naming the function and the prompt."""


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser(
        "rl", help="improve an SFT export with rewards (group-relative policy optimisation)",
        description="Reinforcement learning with verifiable rewards for a diffusion LM: G "
                    "completions per prompt from the family's sampler, group-normalised "
                    "advantages, a clipped policy-gradient objective with a sequence "
                    "log-probability estimator (the family's ELBO with noise shared between "
                    "the current and the rollout policy, or diffu-GRPO's one-step estimate), "
                    "optional KL to a frozen reference.",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("config", nargs="?", help="YAML config (see configs/rl-*.yaml)")
    parser.add_argument("--set", dest="overrides", action="append", default=[],
                        metavar="KEY.SUB=VALUE", help="override a config value (YAML syntax)")
    parser.add_argument("--output-dir", help="run directory (default: runs/rl-<time>)")
    existing = parser.add_mutually_exclusive_group()
    existing.add_argument("--resume", action="store_true",
                          help="continue the run in --output-dir from its newest complete "
                               "checkpoint with its own config; --set may change only "
                               "train.steps, the log/save intervals, threads, progress, device")
    existing.add_argument("--overwrite", action="store_true",
                          help="replace an existing run in --output-dir (deletes it first)")
    parser.set_defaults(func=run_rl)


def run_rl(args) -> int:
    from dlmkit.rl import load_rl_config, run
    from dlmkit.rl.loop import resume_config
    from dlmkit.train.checkpoint import CheckpointError
    from dlmkit.train.config import ConfigError

    try:
        if args.resume:
            if not args.output_dir:
                raise ConfigError("--resume needs --output-dir (the run to continue)")
            if args.config:
                raise ConfigError("--resume reads the run's own config.yaml; drop "
                                  f"{args.config} (change train.steps etc. with --set)")
            config = resume_config(args.output_dir, list(args.overrides))
        else:
            overrides = list(args.overrides)
            if args.output_dir:
                overrides.append(f"output_dir={args.output_dir}")
            config = load_rl_config(args.config, overrides)
        run(config, resume=args.resume, overwrite=args.overwrite)
    except KeyboardInterrupt:
        print("interrupted; resume from the last checkpoint with --resume", flush=True)
        return 130
    except (ValueError, FileNotFoundError, CheckpointError) as err:
        raise SystemExit(f"error: {err}") from None
    return 0
