"""``dlmkit generate``: decode prompts with an exported model and report the speed."""

from __future__ import annotations

import argparse
import json
import sys
import warnings
from pathlib import Path


def add_sampler_arguments(parser: argparse.ArgumentParser) -> None:
    """The model and sampler options shared by ``generate`` and ``eval``."""
    from dlmkit.generate import SAMPLERS

    parser.add_argument("--model", required=True, help="exported model directory (RUN/final)")
    parser.add_argument("--draft", metavar="DRAFTER",
                        help="DFlash drafter export (RUN/final of strategy dflash): speculative "
                             "decoding of --model, the target (sampler dflash; greedy output "
                             "equals the target's own)")
    parser.add_argument("--device", default="auto",
                        help="torch device: auto (the GPU when there is one, else the CPU, as "
                             "`dlmkit train` picks), cpu, cuda or cuda:N")
    parser.add_argument("--attention", default="sdpa",
                        choices=("sdpa", "flex_attention", "eager"), help="attention backend")
    parser.add_argument("--batch-size", type=int, default=32, help="prompts per batch")
    group = parser.add_argument_group(
        "sampler options", "Defaults come from the sampler and the model's dlmkit.json; setting "
                           "an option the sampler does not use is an error.")
    group.add_argument("--sampler", choices=SAMPLERS,
                       help="decoder (default: the model's training strategy)")
    add_option_flags(group)


def sampler_fields() -> dict[str, list]:
    """Option name -> ``[(family, dataclass field, options class), ...]`` over the registry's
    samplers, in the order the classes declare them (the common options first)."""
    import dataclasses

    from dlmkit import families

    found: dict[str, list] = {}
    for name in families.names():
        cls = families.get(name).sampling
        for f in dataclasses.fields(cls):
            found.setdefault(f.name, []).append((name, f, cls))
    return found


def add_option_flags(group) -> None:
    """One ``--flag`` per sampler option of any family, generated from the options classes:
    type from the annotation, help from the field, the families that take it named when not
    all do. Every flag defaults to unset, so the model's dlmkit.json and the sampler decide."""
    import typing

    from dlmkit import families

    every = len(families.names())
    for option, uses in sampler_fields().items():
        name, field, cls = uses[0]
        hint = typing.get_type_hints(cls)[option]
        kinds = [t for t in typing.get_args(hint) if t is not type(None)] or [hint]
        kind = kinds[0]
        helps = {f.metadata.get("help", "") for _, f, _ in uses}
        if len(helps) == 1:
            text = helps.pop()
            if len(uses) < every:
                text = f"{'/'.join(n for n, _, _ in uses)}: {text}"
        else:
            text = "; ".join(f"{n}: {f.metadata.get('help', '')}" for n, f, _ in uses)
        if field.default is not None and "default" not in text:
            shown = {True: "on", False: "off"}.get(field.default, field.default)
            text += f" (default: {shown})"
        kwargs: dict = {"help": text.replace("%", "%%")}
        choices = list(dict.fromkeys(c for _, f, k in uses for c in choices_of(f, k)))
        if kind is bool:
            kwargs["action"] = argparse.BooleanOptionalAction
        else:
            kwargs["type"] = kind
            if choices:
                kwargs["choices"] = choices
            const = field.metadata.get("flag_const")
            if const is not None:
                kwargs.update(nargs="?", const=const)
        group.add_argument("--" + option.replace("_", "-"), **kwargs)


def choices_of(field, cls) -> tuple:
    """The values an option allows, where they are a fixed list (``choices`` in the field's
    metadata, or the name of a class attribute that holds them)."""
    choices = field.metadata.get("choices", ())
    return getattr(cls, choices) if isinstance(choices, str) else tuple(choices)


class DefaultsHelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Appends ``(default: X)`` only where a value has a fixed default: the sampler options
    default to the model's dlmkit.json (their help says so), not to ``None``."""

    def _get_help_string(self, action):
        # Flags (nargs 0) have no value to show: "--no-progress (default: True)" misleads.
        if action.default is None or action.nargs == 0 or "default" in (action.help or ""):
            return action.help
        return super()._get_help_string(action)


def _check_exported(args) -> None:
    """Before loading: without dlmkit.json the sampler cannot default to the training one."""
    from dlmkit.models import check_model_directory

    try:  # first: a run directory or a checkpoint gets its own advice, not --sampler's
        check_model_directory(args.model, "--model")
    except ValueError as err:
        raise SystemExit(f"error: {err}") from None
    model = Path(args.model)
    if args.draft is not None:  # the sampler is dflash; the pair is checked before loading
        _check_draft(args)
    elif args.sampler is None and model.is_dir() and not (model / "dlmkit.json").is_file():
        from dlmkit import families

        plain = families.plain_causal()
        others = [n for n in families.names()
                  if n != plain and families.get(n).drafting is None]
        raise SystemExit(
            f"error: --model {model} has no dlmkit.json, so it is not a model exported by "
            f"`dlmkit train` (RUN/final) and the sampler to decode it with is unknown; pass "
            f"--sampler: {plain} for a plain causal LM, or {', '.join(others[:-1])} or "
            f"{others[-1]} for a diffusion model trained that way (a block sampler also needs "
            f"--block-size, its trained block)")


def _check_draft(args) -> None:
    from dlmkit import families

    sampler, drafting = families.drafting()
    if args.sampler not in (None, sampler):
        raise SystemExit(f"error: --draft is speculative decoding (sampler {sampler}); --sampler "
                         f"{args.sampler} decodes --model alone: drop --draft or --sampler")
    meta_file = Path(args.model) / "dlmkit.json"
    try:
        meta = json.loads(meta_file.read_text()) if meta_file.is_file() else {}
        drafting.check(args.model, meta, args.draft)
    except ValueError as err:
        raise SystemExit(f"error: {err}") from None


def resolve_device(spec: str) -> str:
    """``--device`` checked as ``dlmkit train`` checks ``train.device``; ``auto`` is, as in
    training, CUDA when there is a GPU, else the CPU."""
    import torch

    from dlmkit.train.preflight import check_device

    try:
        check_device(spec, "--device")
    except ValueError as err:
        raise SystemExit(f"error: {err}") from None
    if spec == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return spec


def sampler_options(args) -> dict:
    """The sampler options set on the command line (the others stay the sampler's defaults)."""
    return {k: getattr(args, k) for k in sampler_fields() if getattr(args, k) is not None}


def load_and_configure(args, **extra):
    """``(LoadedModel, SamplerConfig)``; bad input becomes ``SystemExit('error: ...')``."""
    from dlmkit.generate import load
    from dlmkit.generate.api import SamplerFamilyWarning

    if args.batch_size < 1:
        raise SystemExit(f"error: --batch-size must be >= 1, got {args.batch_size}")
    device = resolve_device(args.device)
    _check_exported(args)
    try:
        loaded = load(args.model, device=device, attention=args.attention)
        if args.draft is not None:
            from dlmkit import families

            loaded = families.drafting()[1].attach(loaded, args.draft, device=device)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", SamplerFamilyWarning)
            config = loaded.config(args.sampler, **sampler_options(args), **extra)
    except ValueError as err:
        raise SystemExit(f"error: {err}") from None
    for warning in caught:
        if issubclass(warning.category, SamplerFamilyWarning):
            print(f"warning: {warning.message}", file=sys.stderr)
        else:  # not ours: shown as Python would have
            warnings.warn_explicit(warning.message, warning.category, warning.filename,
                                   warning.lineno)
    try:
        loaded.check_block_size(config, args.block_size)
    except ValueError as err:
        raise SystemExit(f"error: {err}") from None
    return loaded, config


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser(
        "generate", help="decode prompts with an exported model",
        description="Decode prompts with a model exported by `dlmkit train` (RUN/final). Prints "
                    "each response, then forwards, tokens per forward and tokens/s.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="examples:\n  dlmkit generate --model runs/x/final --prompt 'rev abc'\n"
               "  dlmkit generate --model runs/x/final --file prompts.jsonl --threshold 0.9\n"
               "  dlmkit generate --model runs/x/final --prompt 'rev abc' --infill 'c[MASK]a'")
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--prompt", action="append",
                        help="a user message (repeat for a batch)")
    source.add_argument("--file", help="JSONL: per line a {\"prompt\": ...} object, a "
                                       "{\"messages\": [...]} conversation or a JSON string")
    parser.add_argument("--infill", metavar="TEMPLATE",
                        help="fill each [MASK] of this response template (mdlm/scdd models)")
    parser.add_argument("--span-length", type=int, default=4,
                        help="mask tokens per [MASK] span with --infill")
    parser.add_argument("--json", action="store_true", help="print one JSON object per prompt")
    add_sampler_arguments(parser)
    parser.set_defaults(func=run)


def read_prompts(path: str) -> list:
    """Prompts of a ``--file``: per line a JSON string, ``{"prompt": str}`` or
    ``{"messages": [{"role", "content"}, ...]}`` (a conversation to continue)."""
    from dlmkit.data.tokenizer import _check_messages

    file = Path(path)
    if not file.is_file():
        raise SystemExit(f"error: --file {path}: no such file")
    prompts: list = []
    for number, line in enumerate(file.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except json.JSONDecodeError as err:
            raise SystemExit(f"error: {path}:{number}: not valid JSON ({err})") from None
        if isinstance(item, dict) and "messages" in item:
            try:
                item = _check_messages(item["messages"])
            except (TypeError, ValueError) as err:
                raise SystemExit(f"error: {path}:{number}: {err}") from None
            if not item or item[-1]["role"] == "assistant":
                raise SystemExit(f"error: {path}:{number}: 'messages' must be a non-empty list "
                                 "ending with a non-assistant turn (the reply is generated)")
        elif isinstance(item, dict):
            item = item.get("prompt")
        if not isinstance(item, (str, list)):
            raise SystemExit(f"error: {path}:{number}: expected a JSON string or an object with "
                             "a string 'prompt' or a 'messages' list")
        prompts.append(item)
    if not prompts:
        raise SystemExit(f"error: {path}: no prompts")
    return prompts


def run(args) -> int:
    from dlmkit.generate import GenerationResult, encode_infill, generate, infill

    prompts = args.prompt if args.prompt is not None else read_prompts(args.file)
    if args.infill is not None and not all(isinstance(p, str) for p in prompts):
        raise SystemExit("error: --infill takes text prompts, not 'messages' conversations")
    if args.infill is not None and args.pad_to is not None:
        raise SystemExit("error: --pad-to sets the length of a generated canvas; --infill fills "
                         "the masks of the given template at its own length (drop one)")
    try:
        loaded, config = load_and_configure(args)
    except KeyboardInterrupt:
        print("interrupted while loading the model; nothing was decoded", file=sys.stderr)
        return 130
    stats = sys.stderr if args.json else sys.stdout
    results: list[GenerationResult] = []
    done = 0
    try:
        for at in range(0, len(prompts), args.batch_size):
            chunk = prompts[at:at + args.batch_size]
            try:
                if args.infill is not None:
                    sequences = [encode_infill(loaded.tokenizer, p, args.infill,
                                               args.span_length) for p in chunk]
                    result = infill(loaded.model, loaded.tokenizer, sequences, config)
                else:  # first_index: a prompt's samples do not depend on its batch
                    result = generate(loaded.model, loaded.tokenizer, chunk, config,
                                      first_index=at)
            except ValueError as err:
                raise SystemExit(f"error: {err}") from None
            results.append(result)
            _print_responses(chunk, result.texts, args.json)  # each batch as it is done
            done += len(chunk)
    except KeyboardInterrupt:
        shown = " (their responses are above)" if done else ""
        print(f"interrupted: {done} of {len(prompts)} prompts decoded{shown}", file=sys.stderr)
        return 130
    forwards = sum(r.forwards for r in results)
    row_forwards = sum(r.row_forwards for r in results)
    generated = sum(r.generated for r in results)
    seconds = sum(r.seconds for r in results)
    print(f"sampler: {config.sampler}  forwards: {forwards}  tokens: {generated}  "
          f"tokens/forward: {generated / max(row_forwards, 1):.2f} (per sequence)  "
          f"tokens/s: {generated / max(seconds, 1e-9):.1f}", file=stats)
    _print_speculative(loaded.model, stats)
    return 0


def _print_responses(prompts: list, texts: list[str], as_json: bool) -> None:
    for prompt, text in zip(prompts, texts):
        if as_json:
            key = "prompt" if isinstance(prompt, str) else "messages"
            print(json.dumps({key: prompt, "output": text}))
        else:
            shown = prompt if isinstance(prompt, str) else prompt[-1]["content"]
            print(f"> {shown}\n{text}")
    sys.stdout.flush()


def _print_speculative(model, file=sys.stdout) -> None:
    from dlmkit import families

    line = families.drafting()[1].summary(model)
    if line:
        print(line, file=file)
