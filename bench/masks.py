#!/usr/bin/env python
"""Mask construction benchmarks: dlmkit against torch, over the mask catalogue, in one driver.

Suites (default: all of them, in this order):

* ``training``  — ``idlm`` and ``block_diffusion`` (diffusion block 16) at 2L = 2048 ... 131072,
  BlockMask tile 128: ``.block_mask()`` against eager ``create_block_mask`` and
  ``torch.compile(create_block_mask)`` (steady state; the compiling first call apart), then
  ``idlm(...).additive(torch.bfloat16)`` against the naive broadcast builder at 2L = 32768.
* ``catalogue`` — every example of ``dlmkit.masks.catalog`` (the engine's masks and those of
  ``dlmkit.masks.catalogue``) at ``--catalogue-seq-lens`` tokens (structural block 128), ours
  against eager ``create_block_mask`` (skipped where its grid would not fit), with a check
  that all eight index tensors are equal.
* ``scenarios`` — the dLLM layouts at their real sizes (DFlash up to 512 anchors over a
  4096-token context, batch-4 canvases, 64k video windows, packed 8k, 64k decode) and VSA's
  direct builders, ours against eager.
* ``threads``   — ``.block_mask(128)`` of ``idlm`` / ``block_diffusion`` at 2L = 32768 and
  131072 with torch's default thread count beside one thread. ``--load N`` runs N busy
  processes (one spinning core each) during this suite; the builder must stay within a small
  factor of its one-thread time when the machine is busy.

Every measurement runs in its own subprocess (``dlmkit.masks.benchmark``). Catalogue, scenario
and training comparisons pin ``--threads`` (default 1) on both sides: on a shared 2-core machine
more threads mostly add contention, which would turn the comparison into noise; the ``threads``
suite is where the default is measured. Output: one JSON document (records + summary rows) on
stdout, readable tables on stderr. Timings on shared machines are noisy: compare ratios from
one run.

    python bench/masks.py                                  # everything (~30-60 min)
    python bench/masks.py threads --load 1                 # the busy-machine check (~1 min)
    python bench/masks.py training --seq-lens 1024,4096    # quicker
    python bench/masks.py catalogue --masks causal,natten --catalogue-seq-lens 16384
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from contextlib import contextmanager

from dlmkit.masks.benchmark import measure, scenario_names

SUITES = ("training", "catalogue", "scenarios", "threads")


@contextmanager
def busy_processes(count: int):
    """``count`` processes spinning one core each, for as long as the block runs."""
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]
    try:
        yield
    finally:
        for p in procs:
            p.kill()
            p.wait()


class Run:
    def __init__(self, args) -> None:
        self.args = args
        self.records: list[dict] = []

    def __call__(self, name, seq_len, method, *, block=None, repeats=None, threads="pinned",
                 **kwargs) -> dict:
        block = self.args.block if block is None else block
        threads = self.args.threads if threads == "pinned" else threads
        print(f"# {name} seq_len={seq_len} {method} threads={threads or 'default'}",
              file=sys.stderr, flush=True)
        rec = measure(name, seq_len, block, self.args.tile, method,
                      repeats=repeats or self.args.repeats, timeout=self.args.timeout,
                      threads=threads, **kwargs)
        self.records.append(rec)
        print(json.dumps(rec), file=sys.stderr, flush=True)
        return rec


def _ms(rec: dict, key: str = "steady_s") -> str:
    if "skipped" in rec:
        return f"skipped ({rec['skipped']})"
    s = rec[key]
    return f"{1e3 * s:.1f} ms" if s < 1 else f"{s:.2f} s"


def _mib(rec: dict) -> str:
    return "-" if "skipped" in rec else f"{rec['peak_extra_mib']:.1f} MiB"


def _ratio(theirs: dict, ours: dict) -> float | None:
    if "skipped" in theirs or "skipped" in ours:
        return None
    return theirs["steady_s"] / max(ours["steady_s"], 1e-9)


def _x(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}x"


def training(run: Run, args) -> tuple[list[dict], list[str]]:
    rows, lines = [], ["| mask | 2L | ours | peak extra | eager | vs eager | compiled | "
                       "vs compiled | compile (first call) |", "|---" * 9 + "|"]
    for name in args.masks.split(","):
        for seq_len in (int(s) for s in args.seq_lens.split(",")):
            side = dict(q_len=2 * seq_len, kv_len=2 * seq_len)
            ours = run(name, seq_len, "ours", **side)
            eager = run(name, seq_len, "eager", repeats=2, **side)
            compiled = run(name, seq_len, "compiled", **side)
            row = {"mask": name, "tokens_2L": 2 * seq_len, "ours_s": ours.get("steady_s"),
                   "ours_peak_extra_mib": ours.get("peak_extra_mib")}
            for label, rec in (("eager", eager), ("compiled", compiled)):
                if "skipped" in rec:
                    row[label] = "skipped: " + rec["skipped"]
                    continue
                row[f"{label}_s"] = rec["steady_s"]
                row[f"{label}_peak_extra_mib"] = rec["peak_extra_mib"]
                row[f"speedup_vs_{label}"] = _ratio(rec, ours)
            if "first_s" in compiled:
                row["compiled_first_call_s"] = compiled["first_s"]
            if "equal_to_ours" in eager:
                row["equal_to_eager"] = eager["equal_to_ours"]
            rows.append(row)
            lines.append(f"| {name} | {2 * seq_len} | {_ms(ours)} | {_mib(ours)} | "
                         f"{_ms(eager)} / {_mib(eager)} | {_x(_ratio(eager, ours))} | "
                         f"{_ms(compiled)} | {_x(_ratio(compiled, ours))} | "
                         f"{_ms(compiled, 'first_s')} |")
    if args.dense_seq_len:
        side = dict(q_len=2 * args.dense_seq_len, kv_len=2 * args.dense_seq_len)
        ours = run("idlm", args.dense_seq_len, "additive", repeats=3, **side)
        naive = run("idlm", args.dense_seq_len, "additive_naive", repeats=2, **side)
        rows.append({
            "mask": "idlm additive bf16", "tokens_2L": 2 * args.dense_seq_len,
            "ours_s": ours.get("steady_s"), "ours_peak_extra_mib": ours.get("peak_extra_mib"),
            "output_mib": ours.get("output_mib"),
            "naive_s": naive.get("steady_s", naive.get("skipped")),
            "naive_peak_extra_mib": naive.get("peak_extra_mib"),
        })
        lines += ["", "| dense idlm bf16, 2L | ours | peak extra | naive | peak extra |",
                  "|---|---|---|---|---|",
                  f"| {2 * args.dense_seq_len} | {_ms(ours)} | {_mib(ours)} | {_ms(naive)} | "
                  f"{_mib(naive)} |"]
    return rows, lines


def _versus_eager(run: Run, cases, seq_len: int, block: int) -> tuple[list[dict], list[str]]:
    rows, lines = [], []
    for name in cases:
        ours = run(name, seq_len, "ours", block=block)
        eager = run(name, seq_len, "eager", block=block, repeats=1, memory_fraction=0.5)
        shape = " x ".join(map(str, ours.get("shape", []))) or "-"
        rows.append({"case": name, "seq_len": seq_len, "shape": ours.get("shape"),
                     "structured": ours.get("structured"), "ours_s": ours.get("steady_s"),
                     "ours_first_s": ours.get("first_s"),
                     "ours_peak_extra_mib": ours.get("peak_extra_mib"),
                     "eager_s": eager.get("steady_s", eager.get("skipped")),
                     "eager_peak_extra_mib": eager.get("peak_extra_mib"),
                     "speedup_vs_eager": _ratio(eager, ours),
                     "equal_to_eager": eager.get("equal_to_ours")})
        tag = "" if ours.get("structured", True) else " (rule fallback)"
        lines.append(f"| {name}{tag} | {shape} | {_ms(ours)} | {_mib(ours)} | {_ms(eager)} | "
                     f"{_mib(eager)} | {_x(_ratio(eager, ours))} | "
                     f"{eager.get('equal_to_ours', '-')} |")
    return rows, lines


_EAGER_HEADER = ["| case | B x H x Q x KV | ours | peak extra | eager | peak extra | speed-up | "
                 "equal |", "|---" * 8 + "|"]


def catalogue(run: Run, args) -> tuple[list[dict], list[str]]:
    from dlmkit.masks.catalog import examples

    names = [n for n in args.catalogue_masks.split(",") if n] or list(examples())
    rows, lines = [], []
    for seq_len in (int(s) for s in args.catalogue_seq_lens.split(",")):
        r, t = _versus_eager(run, names, seq_len, args.catalogue_block)
        rows += r
        lines += [f"seq_len {seq_len}, structural block {args.catalogue_block}:",
                  *_EAGER_HEADER, *t, ""]
    return rows, lines


def scenarios(run: Run, args) -> tuple[list[dict], list[str]]:
    names = [n for n in args.scenarios.split(",") if n] or scenario_names()
    rows, table = _versus_eager(run, names, args.vsa_seq_len, args.block)
    return rows, [*_EAGER_HEADER, *table]


def threads(run: Run, args) -> tuple[list[dict], list[str]]:
    rows = []
    lines = [f"busy processes: {args.load}",
             "| mask | 2L | default threads | one thread | default / one |", "|---" * 5 + "|"]
    with busy_processes(args.load):
        for name in args.masks.split(","):
            for seq_len in (int(s) for s in args.threads_seq_lens.split(",")):
                default = run(name, seq_len, "ours", threads=None, repeats=9)
                one = run(name, seq_len, "ours", threads=1, repeats=9)
                ratio = _ratio(default, one)
                rows.append({"mask": name, "tokens_2L": 2 * seq_len, "load": args.load,
                             "default_threads": default.get("threads"),
                             "default_s": default.get("steady_s"),
                             "one_thread_s": one.get("steady_s"),
                             "default_over_one": ratio})
                lines.append(f"| {name} | {2 * seq_len} | {_ms(default)} "
                             f"({default.get('threads')} threads) | {_ms(one)} | "
                             f"{'-' if ratio is None else f'{ratio:.2f}'} |")
    return rows, lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("suites", nargs="*",
                        help=f"which suites to run (default all: {', '.join(SUITES)})")
    parser.add_argument("--masks", default="idlm,block_diffusion",
                        help="training and threads suites: masks over [x_t | x_0]")
    parser.add_argument("--seq-lens", default="1024,4096,16384,65536",
                        help="training suite: L per stream (the mask is 2L x 2L)")
    parser.add_argument("--dense-seq-len", type=int, default=16384,
                        help="training suite: L for the additive-mask comparison (0 to skip)")
    parser.add_argument("--block", type=int, default=16, help="diffusion block size")
    parser.add_argument("--tile", type=int, default=128, help="BlockMask tile")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads pinned on both sides outside the threads suite "
                             "(0 = torch's default)")
    parser.add_argument("--catalogue-seq-lens", default="16384,65536")
    parser.add_argument("--catalogue-block", type=int, default=128,
                        help="structural block of the catalogue examples")
    parser.add_argument("--catalogue-masks", default="", help="comma-separated (default all)")
    parser.add_argument("--scenarios", default="", help="comma-separated (default all)")
    parser.add_argument("--vsa-seq-len", type=int, default=16384,
                        help="tokens of the direct VSA scenarios")
    parser.add_argument("--threads-seq-lens", default="16384,65536",
                        help="threads suite: L per stream")
    parser.add_argument("--load", type=int, default=0,
                        help="threads suite: busy processes running meanwhile")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds per measurement")
    parser.add_argument("--json", help="also write the JSON document to this file")
    args = parser.parse_args(argv)
    unknown = [s for s in args.suites if s not in SUITES]
    if unknown:
        parser.error(f"unknown suite(s) {unknown}; choose from {', '.join(SUITES)}")
    args.threads = args.threads or None

    run = Run(args)
    out, tables = {}, []
    for suite in args.suites or SUITES:
        rows, lines = globals()[suite](run, args)
        out[suite] = rows
        tables += [f"## {suite}", *lines, ""]
    document = json.dumps({"summary": out, "records": run.records}, indent=1)
    print(document)
    if args.json:
        with open(args.json, "w") as f:
            f.write(document + "\n")
    print("\n".join(tables), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
