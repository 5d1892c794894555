"""``dlmkit mask``: list, draw and benchmark masks."""

from __future__ import annotations

import argparse
import json
import sys


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser("mask", help="list, draw and benchmark attention masks",
                                   description="List, draw and benchmark attention masks.")
    sub = parser.add_subparsers(dest="mask_command", metavar="{list,show,bench}", required=True)

    listing = sub.add_parser(
        "list", help="list the masks that `show` and `bench` know, with their part: engine "
                     "(the masks dlmkit's families train and decode with) or catalogue (the "
                     "attention-gym patterns)")
    listing.add_argument("--part", choices=("engine", "catalogue"),
                         help="list only this part's masks")
    listing.set_defaults(func=run_list)

    show = sub.add_parser(
        "show", help="draw a mask in the terminal or to a PNG",
        description="Draw a named example mask. Sizes: --seq-len is the mask's sequence length "
                    "(for [x_t | x_0] layouts, L per stream), --block-size its structural block "
                    "(diffusion block, window, chunk...).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    show.add_argument("name", help="mask name (see `dlmkit mask list`); a factory name such as "
                                    "`sta` draws its first example")
    show.add_argument("--seq-len", type=int, default=16, help="sequence length")
    show.add_argument("--block-size", type=int, default=4, help="structural block size")
    show.add_argument("-o", "--output", help="write a PNG here instead of drawing in the terminal")
    show.add_argument("--tile", type=int, default=128,
                      help="FlexAttention tile size for the block-sparsity summary")
    show.set_defaults(func=run_show)

    bench = sub.add_parser(
        "bench", help="time BlockMask construction against torch's create_block_mask",
        description="Build time and peak extra memory of .block_mask() against eager (and "
                    "optionally compiled) create_block_mask, each in a fresh subprocess. "
                    "Prints one JSON record per measurement.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    bench.add_argument("--masks", default="idlm,block_diffusion", help="comma-separated names")
    bench.add_argument("--seq-lens", default="1024,4096",
                       help="comma-separated sequence lengths (L per stream for [x_t|x_0])")
    bench.add_argument("--block-size", type=int, default=16, help="structural block size")
    bench.add_argument("--tile", type=int, default=128, help="BlockMask tile size")
    bench.add_argument("--methods", default="ours,eager",
                       help="comma-separated: ours, eager, compiled, additive, additive_naive")
    bench.add_argument("--repeats", type=int, default=3, help="calls per measurement")
    bench.set_defaults(func=run_bench)


def _positive(name: str, value: int) -> int:
    if value < 1:
        raise SystemExit(f"error: {name} must be >= 1, got {value}")
    return value


def run_list(args) -> int:
    from dlmkit.masks.catalog import PARTS, examples

    parts = [args.part] if args.part else list(PARTS)
    names = {part: examples(part) for part in parts}
    width = max(len(n) for found in names.values() for n in found)
    for name in sorted(n for found in names.values() for n in found):
        part = next(p for p in parts if name in names[p])
        print(f"{name:<{width}}  {part}")
    return 0


def resolve_name(name: str) -> str:
    """An example name; a factory name (``sta``, ``document``: what the README and
    ``dlmkit.masks`` call a mask) stands for its first example, and the others are named."""
    from dlmkit.masks.catalog import examples

    known = examples()
    if name in known:
        return name
    related = [n for n in known if n.startswith(name + "_")]
    if not related:
        return name  # example() names the valid ones
    if len(related) > 1:
        print(f"{name}: drawing example {related[0]} (others: {', '.join(related[1:])})")
    return related[0]


def run_show(args) -> int:
    from dlmkit.masks.catalog import example

    _positive("--seq-len", args.seq_len)
    _positive("--block-size", args.block_size)
    _positive("--tile", args.tile)
    name = resolve_name(args.name)
    try:
        mask = example(name, args.seq_len, args.block_size)
    except ValueError as err:
        raise SystemExit(f"error: {err}") from None
    tiles = mask.tile_map(args.tile)
    total = tiles.numel()
    summary = (f"{mask!r}\nBlockMask at tile {args.tile}: {int((tiles == 2).sum())} full, "
               f"{int((tiles == 1).sum())} partial, {int((tiles == 0).sum())} empty of {total} "
               f"tiles ({100.0 * float((tiles == 0).sum()) / total:.1f}% skipped)")
    if args.output:
        path = mask.render(args.output)
        print(f"{summary}\nwrote {path}")
    else:
        print(mask)
        print(summary)
    return 0


def run_bench(args) -> int:
    from dlmkit.masks.benchmark import METHODS, measure
    from dlmkit.masks.catalog import example, examples

    names = [n for n in args.masks.split(",") if n]
    unknown = [n for n in names if n not in examples()]
    if unknown:
        raise SystemExit(f"error: unknown mask(s) {unknown}; see `dlmkit mask list`")
    methods = [m for m in args.methods.split(",") if m]
    bad = [m for m in methods if m not in METHODS]
    if bad:
        raise SystemExit(f"error: unknown method(s) {bad}; allowed: {', '.join(METHODS)}")
    try:
        seq_lens = [_positive("--seq-lens", int(s)) for s in args.seq_lens.split(",") if s]
    except ValueError:
        raise SystemExit(f"error: --seq-lens must be integers, got {args.seq_lens!r}") from None
    for name in names:
        for seq_len in seq_lens:
            shape = example(name, seq_len, args.block_size)
            for method in methods:
                print(f"# {name} seq_len={seq_len} ({shape.q_len}x{shape.kv_len}) {method} ...",
                      file=sys.stderr, flush=True)
                record = measure(name, seq_len, args.block_size, args.tile, method,
                                 repeats=args.repeats, q_len=shape.q_len, kv_len=shape.kv_len)
                print(json.dumps(record), flush=True)
    return 0
