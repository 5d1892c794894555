"""Render every mask of ``dlmkit.masks.catalog.examples()`` to a small PNG and write the
gallery page.

    .venv/bin/python bench/gallery.py                  # docs/gallery/*.png + docs/gallery.md
    .venv/bin/python bench/gallery.py --seq-len 24 --block-size 4 --only causal,prefix_lm

Each picture shows batch row 0 of the example at ``--seq-len`` tokens (structural block
``--block-size``): dark = attend, white = blocked; thin red lines mark ``--block-size``
tiles. Masks wider than ``--max-cells`` tokens are drawn from their tile map (light = partly
allowed tile). A mask whose example fails to build is listed on the page with the error, so the
gallery never hides a broken example.
"""

from __future__ import annotations

import argparse
import inspect
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def render(mask, path: Path, block_size: int, max_cells: int) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from dlmkit.masks.render import mask_picture

    picture, q_step, kv_step = mask_picture(mask, 0, max_cells)
    rows, cols = picture.shape
    scale = 2.6 / max(rows, cols)
    fig, ax = plt.subplots(figsize=(max(1.2, cols * scale) + 0.5, max(1.2, rows * scale) + 0.6))
    ax.imshow(picture.numpy(), cmap="Blues", vmin=0, vmax=1.15, interpolation="nearest")
    ax.set_xticks([])
    ax.set_yticks([])
    if q_step == kv_step == 1 and block_size > 1:
        for edge in range(block_size, max(rows, cols), block_size):
            if edge < rows:
                ax.axhline(edge - 0.5, color="#d62728", linewidth=0.4, alpha=0.6)
            if edge < cols:
                ax.axvline(edge - 0.5, color="#d62728", linewidth=0.4, alpha=0.6)
    label = f"{mask.q_len} x {mask.kv_len}"
    if q_step > 1 or kv_step > 1:
        label += f" (cell {q_step}x{kv_step})"
    ax.set_xlabel(label, fontsize=6)
    fig.tight_layout(pad=0.2)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)


TITLES = {
    "engine": "## Engine: the masks the dLLM families train and decode with "
              "(`dlmkit.masks`)",
    "catalogue": "## Catalogue: the patterns no family uses (`dlmkit.masks.catalogue`)",
}


def picture_row(name: str, builder, args) -> tuple[str, int]:
    """The page's table row for one example, drawing its picture; ``(row, 1)`` when the
    example fails to build or draw (the row then names the error)."""
    module = inspect.getmodule(builder)
    module_name = module.__name__ if module else "?"
    try:
        mask = builder(args.seq_len, args.block_size)
        path = args.out / f"{name}.png"
        render(mask, path, args.block_size, args.max_cells)
    except Exception as err:  # noqa: BLE001 - report every broken example, keep going
        print(f"{name}: FAILED {type(err).__name__}: {err}", file=sys.stderr)
        return f"| `{name}` | `{module_name}` | - | - | failed: {type(err).__name__} |", 1
    density = float(mask.dense().float().mean())
    rel = path.relative_to(args.page.parent) if path.is_relative_to(args.page.parent) \
        else path
    print(f"{name}: {path}", file=sys.stderr)
    return (f"| `{name}` | `{module_name}` | {mask.batch} x {mask.q_len} x {mask.kv_len} | "
            f"{density:.0%} | ![{name}]({rel.as_posix()}) |"), 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seq-len", type=int, default=32)
    parser.add_argument("--block-size", type=int, default=4)
    parser.add_argument("--max-cells", type=int, default=96,
                        help="draw token by token up to this many rows/columns")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "gallery")
    parser.add_argument("--page", type=Path, default=ROOT / "docs" / "gallery.md")
    parser.add_argument("--only", default="", help="comma-separated example names")
    args = parser.parse_args(argv)

    from dlmkit.masks.catalog import PARTS, examples, part_of

    known = examples()
    names = [n for n in args.only.split(",") if n] or list(known)
    unknown = [n for n in names if n not in known]
    if unknown:
        parser.error(f"unknown example(s) {unknown}; available: {', '.join(known)}")
    lines = [
        "# Mask gallery",
        "",
        "Every mask in `dlmkit.masks.catalog.examples()`, drawn by `bench/gallery.py` at "
        f"`seq_len={args.seq_len}`, `block_size={args.block_size}` (batch row 0; dark = attend, "
        "white = blocked; red lines every `block_size` tokens; queries down, keys across). "
        "Regenerate after adding a mask:",
        "",
        "    .venv/bin/python bench/gallery.py",
        "",
        "`dlmkit mask show NAME` prints the same examples in the terminal.",
    ]
    failures = 0
    for part in PARTS:
        in_part = [n for n in names if part_of(n) == part]
        if not in_part:
            continue
        lines += ["", TITLES[part], "",
                  "| mask | module | batch x queries x keys | density | picture |",
                  "|---|---|---|---|---|"]
        for name in in_part:
            row, failed = picture_row(name, known[name], args)
            lines.append(row)
            failures += failed
    args.page.parent.mkdir(parents=True, exist_ok=True)
    args.page.write_text("\n".join(lines) + "\n")
    print(f"wrote {args.page} ({len(names) - failures} pictures, {failures} failed)",
          file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
