"""Regenerate the results tables of README.md and docs/ from docs/results/*.jsonl.

    python bench/tables.py            # rewrite every table in place
    python bench/tables.py --check    # exit 1 naming each table that differs from its data

A generated table sits between two markers in a Markdown page:

    <!-- table: NAME -->
    ...
    <!-- /table -->

NAME is a definition in ``TABLES`` below: which results file it reads, which rows, which
columns and how they are formatted. Edit the definition (or the results file), never the table:
the check fails on any hand edit between the markers. docs/adapt.md's table keeps the markers of
``bench/adapt.py --table``, which writes it; this script checks it with the same function.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import re
import statistics
import sys
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "docs" / "results"
BEGIN = re.compile(r"^<!-- table: (?P<name>[^ ]*) -->$", re.MULTILINE)
END = "<!-- /table -->"


def pages(root: Path = ROOT) -> list[Path]:
    """The Markdown pages that may hold generated tables: README.md and docs/**/*.md."""
    return [root / "README.md", *sorted((root / "docs").rglob("*.md"))]


def load(name: str, results: Path = RESULTS) -> list[dict]:
    """Every JSON line of ``results/name``; a bad line names the file and its line number."""
    path = results / name
    if not path.is_file():
        raise FileNotFoundError(f"results file {path} does not exist")
    rows = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as err:
                raise ValueError(f"{path}:{number}: not a JSON line ({err})") from None
    return rows


def by_key(rows: list[dict], key: str, file: str) -> dict[str, dict]:
    """Index ``rows`` by ``key``; a missing or repeated key is an error naming the file."""
    out: dict[str, dict] = {}
    for row in rows:
        value = row.get(key)
        if value is None:
            raise ValueError(f"{file}: a line has no {key!r}: {str(row)[:120]}")
        if value in out:
            raise ValueError(f"{file}: {key} {value!r} appears twice")
        out[value] = row
    return out


def markdown(header: list[str], rows: list[list[str]], align: str | None = None) -> str:
    """A Markdown table; ``align`` holds one of ``l`` / ``r`` per column (default: left)."""
    rule = {"l": "---", "r": "---:"}
    marks = [rule[a] for a in (align or "l" * len(header))]
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(marks) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def _bench_module(name: str):
    """``bench/<name>.py`` as a module (bench/ is a folder of scripts, not a package)."""
    key = f"bench_{name}"
    if key not in sys.modules:
        spec = importlib.util.spec_from_file_location(key, ROOT / "bench" / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        # dataclasses look their module up in sys.modules while the class is made
        sys.modules[key] = module
        spec.loader.exec_module(module)
    return sys.modules[key]


TABLES: dict[str, Callable[[Path], str]] = {}


def table(name: str):
    """Register a table definition: a function of the results folder returning Markdown."""
    def register(fn: Callable[[Path], str]) -> Callable[[Path], str]:
        TABLES[name] = fn
        return fn
    return register


# -- the user-like suite (docs/results/suite.jsonl; `python tests/suite/run.py ... --record`) ---
SUITE_FAMILIES = ("bd3lm", "idlm", "hybrid", "mdlm", "scdd", "block_diffusion", "ar", "dflash")
SUITE_TASKS = ("lookup", "transform", "arith", "chat")

# The run behind each cell at today's defaults (seed 0); a tuple is seeds 0 / 1 / 2.
SUITE_RUNS: dict[str, dict[str, dict[str, str | tuple[str, ...]]]] = {
    "byte": {
        "bd3lm": {"lookup": "bd3lm_byte_lookup_ema_s45",
                  "transform": "bd3lm_byte_transform_ema_s45",
                  "arith": "bd3lm_byte_arith_ema_s45", "chat": "bd3lm_byte_chat_s51"},
        "idlm": {"lookup": "idlm_byte_lookup_s40", "transform": "idlm_byte_transform_s40",
                 "arith": "b-idlm-arith-6000", "chat": "idlm_byte_chat_s41"},
        "hybrid": {"lookup": "hybrid_byte_lookup_s40", "transform": "hybrid_byte_transform_s40",
                   "arith": "z-hybrid-arith", "chat": "hybrid_byte_chat_s40"},
        "mdlm": {"lookup": "mdlm_byte_lookup_s39", "transform": "mdlm_byte_transform_s39",
                 "arith": "z-mdlm-arith-wd0.5", "chat": "mdlm_byte_chat_s39"},
        "scdd": {"lookup": "scdd_byte_lookup_s50", "transform": "scdd_byte_transform_tmin_s47",
                 "arith": "scdd_byte_arith_tmin_s47", "chat": "scdd_byte_chat_s51"},
        "block_diffusion": {"lookup": "bd_byte_lookup_6k_s50",
                            "transform": "bd_byte_transform_6k_s49",
                            "arith": "bd_byte_arith_6k_s48", "chat": "bd_byte_chat_6k_s50"},
        "ar": {"lookup": "ar_byte_lookup_s40", "transform": "ar_byte_transform_s40",
               "arith": "z-ar-arith", "chat": "ar_byte_chat_s40"},
        "dflash": {"lookup": "dflash_byte_lookup_s40", "transform": "dflash_byte_transform_s40",
                   "arith": "dflash_byte_arith_s40", "chat": "dflash_byte_chat_s40"},
    },
    "bpe": {
        "bd3lm": {"lookup": "bd3lm_bpe_lookup_ema_s45",
                  "transform": ("bd3lm_bpe_transform_ema_s45", "bd3lm_bpe_transform_seed1_ema_s45",
                                "bd3lm_bpe_transform_seed2_ema_s45"),
                  "arith": "bd3lm_bpe_arith_ema_s45", "chat": "bd3lm_bpe_chat_ema_s45"},
        "idlm": {"lookup": "d-idlm-lookup-bpe",
                 "transform": ("b-idlm-transform-bpe-6000", "idlm_bpe_transform_seed1_s43",
                               "idlm_bpe_transform_seed2_s46"),
                 "arith": "z-idlm-arith-bpe-6000", "chat": "g-idlm-chat-bpe"},
        "hybrid": {"lookup": "h-hybrid-lookup-bpe",
                   "transform": ("hybrid_bpe_transform_s39", "hybrid_bpe_transform_seed1_s42",
                                 "hybrid_bpe_transform_seed2_s46"),
                   "arith": "z-hybrid-arith-bpe", "chat": "g-hybrid-chat-bpe"},
        "mdlm": {"lookup": "b-mdlm-lookup-bpe",
                 "transform": ("z-mdlm-transform-bpe", "mdlm_bpe_transform_seed1_s42",
                               "mdlm_bpe_transform_seed2_s46"),
                 "arith": "z-mdlm-arith-bpe-wd0.5", "chat": "g-mdlm-chat-bpe"},
        "scdd": {"lookup": "scdd_bpe_lookup_tmin_s47",
                 "transform": ("scdd_bpe_transform_seed0_tmin_s47",
                               "scdd_bpe_transform_seed1_tmin_s47",
                               "scdd_bpe_transform_seed2_tmin_s47"),
                 "arith": "scdd_bpe_arith_tmin_s47", "chat": "scdd_bpe_chat_tmin_s47"},
        "block_diffusion": {"lookup": "bd_bpe_lookup_6k_s48",
                            "transform": ("bd_bpe_transform_seed0_6k_s48",
                                          "bd_bpe_transform_seed1_6k_s48",
                                          "bd_bpe_transform_seed2_6k_s48"),
                            "arith": "bd_bpe_arith_6k_s48", "chat": "bd_bpe_chat_6k_s49"},
        "ar": {"lookup": "ar_bpe_lookup_s40",
               "transform": ("z-ar-transform-bpe-wd0.5", "ar_bpe_transform_seed1_s42",
                             "ar_bpe_transform_seed2_s46"),
               "arith": "ar_bpe_arith_s40", "chat": "ar_bpe_chat_s39"},
        "dflash": {"lookup": "dflash_bpe_lookup_s40", "transform": "dflash_bpe_transform_s40",
                   "arith": "dflash_bpe_arith_s40", "chat": "dflash_bpe_chat_s40"},
    },
}

SUITE_LABELS = {"bd3lm": "bd3lm (the default)", "dflash": "dflash (drafter for that cell's ar)"}

# Byte `arith` on seeds 1 / 2 (the held-out check of the defaults chosen on seed 0).
SUITE_ARITH_SEEDS: dict[str, tuple[str, str]] = {
    "hybrid": ("hybrid_byte_arith_seed1_s46", "hybrid_byte_arith_seed2_s46"),
    "mdlm": ("mdlm_byte_arith_seed1_s46", "mdlm_byte_arith_seed2_s46"),
    "ar": ("v-ar-arith-warmup300-seed1", "v-ar-arith-warmup300-seed2"),
}


def _seed(run: dict) -> int:
    seeds = [int(o.split("=", 1)[1]) for o in run["overrides"] if o.startswith("seed=")]
    return seeds[-1] if seeds else 0


def _suite_run(runs: dict[str, dict], name: str, family: str, task: str, tokenizer: str,
               seed: int) -> dict:
    """The results line ``name``, checked to be the cell it is listed for."""
    if name not in runs:
        raise ValueError(f"suite.jsonl has no run {name!r} (listed for {family} {task} "
                         f"{tokenizer} seed {seed})")
    run = runs[name]
    found = (run["family"], run["task"], run["tokenizer"], _seed(run))
    if found != (family, task, tokenizer, seed):
        raise ValueError(f"suite.jsonl run {name!r} is {found}, listed for "
                         f"{(family, task, tokenizer, seed)}")
    return run


def _minutes(run: dict) -> str:
    return f"{run['train_s'] / 60:.0f} min"


def _suite_table(tokenizer: str, results: Path) -> str:
    runs = by_key(load("suite.jsonl", results), "run", "suite.jsonl")
    rows = []
    for family in SUITE_FAMILIES:
        cells = []
        for task in SUITE_TASKS:
            names = SUITE_RUNS[tokenizer][family][task]
            names = (names,) if isinstance(names, str) else names
            got = [_suite_run(runs, n, family, task, tokenizer, seed)
                   for seed, n in enumerate(names)]
            value = " / ".join(f"{r['exact_match']:.1f}" for r in got)
            cells.append(f"**{value}%** · {_minutes(got[0])}")
        label = SUITE_LABELS.get(family, family)
        page = f"[{family}.md](families/{family}.md#why-these-defaults)"
        rows.append([label, *cells, page])
    return markdown(["family", *SUITE_TASKS, "defaults"], rows)


@table("suite-byte")
def suite_byte(results: Path) -> str:
    """Exact match of `final/` on the 200 test problems, byte tokenizer, seed 0, and the wall
    time of training."""
    return _suite_table("byte", results)


@table("suite-bpe")
def suite_bpe(results: Path) -> str:
    """As ``suite-byte`` with the BPE tokenizer; `transform` on seeds 0 / 1 / 2 (wall time of
    seed 0)."""
    return _suite_table("bpe", results)


@table("suite-seeds")
def suite_seeds(results: Path) -> str:
    """BPE `transform` and byte `arith` on seeds 0 / 1 / 2 at today's defaults."""
    runs = by_key(load("suite.jsonl", results), "run", "suite.jsonl")
    rows = []
    for family in SUITE_FAMILIES[:-1]:
        names = SUITE_RUNS["bpe"][family]["transform"]
        transform = [_suite_run(runs, n, family, "transform", "bpe", s)
                     for s, n in enumerate(names)]
        arith = [_suite_run(runs, SUITE_RUNS["byte"][family]["arith"], family, "arith", "byte", 0)]
        arith += [_suite_run(runs, n, family, "arith", "byte", s)
                  for s, n in enumerate(SUITE_ARITH_SEEDS.get(family, ()), 1)]
        rows.append([family, " / ".join(f"{r['exact_match']:.1f}" for r in transform),
                     " / ".join([f"{r['exact_match']:.1f}" for r in arith]
                                + ["—"] * (3 - len(arith)))])
    return markdown(["family", "BPE `transform`, seeds 0 / 1 / 2",
                     "byte `arith`, seeds 0 / 1 / 2"], rows)


# -- the tiny DiffusionGemma (docs/results/block_diffusion_tiny.jsonl) -------------------------
def _bd_tiny(results: Path) -> dict:
    return by_key(load("block_diffusion_tiny.jsonl", results), "run",
                  "block_diffusion_tiny.jsonl")["bd-tiny-remeasure"]


def _seeds(values: dict[str, float], spec: str = "g", unit: str = "") -> str:
    """Seed 0's value, and seeds 1 / 2 in brackets where any differs from it."""
    first, *rest = (values[s] for s in sorted(values, key=int))
    text = f"{first:{spec}}{unit}"
    if any(v != first for v in rest):
        text += " (" + " / ".join(f"{v:{spec}}" for v in rest) + ")"
    return text


@table("bd-tiny-generate")
def bd_tiny_generate(results: Path) -> str:
    """`python bench/diffusion_gemma_generate.py` on the configs/block_diffusion-tiny.yaml
    export: seed 0, seeds 1 / 2 in brackets where they differ."""
    settings = _bd_tiny(results)["bench"]["settings"]
    labels = {
        "transformers": "transformers `generate` (entropy bound 0.1, t 0.8→0.4, adaptive "
                        "stopping, 16 steps)",
        "dlmkit_equivalent": "dlmkit `block_diffusion`, the same settings and seed",
        "dlmkit_confidence": "dlmkit confidence commits, 1 token/step",
        "dlmkit_threshold_0.9": "dlmkit threshold 0.9 (16 steps per canvas)",
    }
    rows = []
    for key, label in labels.items():
        per_seed = settings[key]

        def field(name, spec="g", unit="", per_seed=per_seed):
            return _seeds({s: v[name] for s, v in per_seed.items()}, spec, unit)
        same = field("same_output", ".1f", "%") if "same_output" in per_seed["0"] else "—"
        rows.append([label, field("exact_match", ".1f", "%"), field("forwards"),
                     f"{per_seed['0']['tokens_per_forward']:g}",
                     f"{per_seed['0']['tokens_per_s']:g}", same])
    return markdown(["setting", "exact match", "decoder forwards (batch)", "tokens/forward",
                     "tokens/s", "same output as transformers"], rows)


@table("bd-tiny-eval")
def bd_tiny_eval(results: Path) -> str:
    """`dlmkit eval` of the configs/block_diffusion-tiny.yaml export: 200 problems at seed 0,
    256 problems on sampler seeds 0 / 1 / 2."""
    run = _bd_tiny(results)
    ev, ev256 = run["eval"], run["eval_256"]
    forwards = ev256["threshold_0.9_forwards"]
    rows = [
        [f"`{ev['cmd']}`", "one token per step", f"{ev['n']}, seed {ev['seed']}",
         f"{ev['exact_match']:.1f}%", f"{ev['forwards']}"],
        ["`dlmkit eval --model runs/bd/final -n 256 --seed S`", "one token per step",
         "256, seeds 0 / 1 / 2",
         " / ".join(f"{ev256['one_per_step'][s]:.1f}" for s in "012") + "%",
         f"{ev256['one_per_step_forwards']}"],
        ["the same with `--threshold 0.9`", "threshold 0.9", "256, seeds 0 / 1 / 2",
         " / ".join(f"{ev256['threshold_0.9'][s]:.1f}" for s in "012") + "%",
         " / ".join(f"{forwards[s]}" for s in "012")],
    ]
    return markdown(["command", "decoding", "problems", "exact match", "forwards"], rows)


# -- fast decoding on `copy` (docs/results/sampling_copy.jsonl; `python bench/sampling.py`) ----
@table("sampling-copy")
def sampling_copy(results: Path) -> str:
    """Every row of the run, in bench/sampling.py's own table format."""
    return _bench_module("sampling").markdown(load("sampling_copy.jsonl", results))


@table("sampling-copy-summary")
def sampling_copy_summary(results: Path) -> str:
    """Pairs of settings: a decode without a cache, then the same decode with one."""
    rows = load("sampling_copy.jsonl", results)
    index = {(r["strategy"], r["setting"]): r for r in rows}
    pairs = [("mdlm", "one_per_step", "one_per_step+dual", "one token per step / + dual cache"),
             ("mdlm", "threshold_0.9", "threshold_0.9+dual", "threshold 0.9 / + dual cache"),
             ("bd3lm", "one_per_step", "one_per_step+cache", "one token per step / + exact cache"),
             ("bd3lm", "threshold_0.9", "threshold_0.9+cache", "threshold 0.9 / + exact cache")]
    out = []
    for family, plain, cached, label in pairs:
        a, b = index[family, plain], index[family, cached]
        exact = {f"{100 * r['exact_match']:.1f}%" for r in (a, b)}
        out.append([family, label, " / ".join(sorted(exact)),
                    f"{a['forwards_per_token']:.2f}",
                    f"{a['speedup']:.2f}x / {b['speedup']:.2f}x",
                    f"{100 * b['agreement']:.1f}%"])
    return markdown(["family", "decoding", "exact match", "forwards / token",
                     "tokens/s vs one token/step, uncached", "tokens agreeing with the uncached "
                     "decode"], out)


# -- serving (docs/results/serve.jsonl; `python bench/serve.py`) --------------------------------
@table("serve")
def serve(results: Path) -> str:
    """The newest run's rows of the results file (rows carry the run's start time; the oldest
    rows, from before runs were tagged, count as one run), in bench/serve.py's table format."""
    return _bench_module("serve").markdown(_newest_serve_run(results))


@table("serve-serial")
def serve_serial(results: Path) -> str:
    """The newest run's serial tokens/s per served model (the same requests one at a time, in
    process; measured before each client count, the median shown), with their exact match
    when the run was scored."""
    serial: dict[str, list[dict]] = {}
    for r in _newest_serve_run(results):
        serial.setdefault(r.get("label", r["family"]), []).append(r)
    rows = [["serial tokens/s", *(f"{statistics.median(x['serial_tokens_per_s'] for x in v):.1f}"
                                  for v in serial.values())]]
    if any("serial_exact_match" in v[0] for v in serial.values()):
        rows.append(["serial exact match", *(
            f"{100 * v[0]['serial_exact_match']:.1f}%" if "serial_exact_match" in v[0] else "-"
            for v in serial.values())])
    return markdown(["served model", *serial], rows)


def _median(values, fmt: str) -> str:
    return format(statistics.median(values), fmt)


def _range(values, fmt: str) -> str:
    """``lo–hi`` of ``values``, each written with ``fmt``."""
    v = sorted(values)
    return f"{format(v[0], fmt)}–{format(v[-1], fmt)}"


def _spread(values, fmt: str) -> tuple[str, str]:
    """The median of ``values`` and their range, the two cells of a table."""
    v = list(values)
    return _median(v, fmt), _range(v, fmt)


def _answered(rows: list[dict]) -> list[str]:
    """The failed requests of the runs ``rows``, summed, and their exact-match figures."""
    return [str(sum(r["failed"] for r in rows)),
            " / ".join(sorted({f"{100 * r['exact_match']:.1f}%" for r in rows}))]


@table("serve-repeats")
def serve_repeats(results: Path) -> str:
    """Every scored run (``--task``) of the results file, per served model at 16 and 64
    clients: the median and range of tokens/s and of the ratio to serial over the runs (the
    shared machine's load moves single figures by 2x)."""
    groups: dict[tuple, list[dict]] = {}
    for r in _serve_rows(results):
        if r.get("task") and r["clients"] in (16, 64):
            groups.setdefault((r["clients"], r.get("label", r["family"])), []).append(r)
    out = []
    for (clients, label), rows in sorted(groups.items()):
        out.append([label, str(clients), str(len(rows)),
                    *_spread((r["tokens_per_s"] for r in rows), ".0f"),
                    *_spread((r["vs_serial"] for r in rows), ".2f"), *_answered(rows)])
    return markdown(["served model", "clients", "runs", "tokens/s (median)", "range",
                     "× serial (median)", "range", "failed", "exact match"], out, "lrrrrrrrr")


@table("serve-quiet")
def serve_quiet(results: Path) -> str:
    """docs/results/serve_quiet.jsonl: the fastest setting of each family on a quiet machine,
    uvicorn's access log on and off alternately, per served model and client count: the
    median and range of tokens/s over the runs, the median ratio to serial."""
    groups: dict[tuple, list[dict]] = {}
    for r in load("serve_quiet.jsonl", results):
        groups.setdefault((r["clients"], r["label"], r["access_log"]), []).append(r)
    out = []
    for (clients, label, logged), rows in sorted(groups.items(), key=lambda g: (
            g[0][0], g[0][1], not g[0][2])):
        out.append([label, str(clients), "on" if logged else "off", str(len(rows)),
                    *_spread((r["tokens_per_s"] for r in rows), ".0f"),
                    _median((r["vs_serial"] for r in rows), ".2f"), *_answered(rows),
                    _range((r["load_before"] for r in rows), ".1f")])
    return markdown(["served model", "clients", "access log", "runs", "tokens/s (median)",
                     "range", "× serial (median)", "failed", "exact match", "load"], out,
                    "lrlrrrrrrl")


@table("serve-long")
def serve_long(results: Path) -> str:
    """docs/results/serve_long.jsonl: exports trained on the bundled ``copy`` task (answers of
    32 characters and the stop token), three runs, per served model and client count: the
    median and range of tokens/s, the median ratio to serial, batch rows per request."""
    groups: dict[tuple, list[dict]] = {}
    for r in load("serve_long.jsonl", results):
        if r["bench"] == "serve":  # not the profile lines (the prose cites them)
            groups.setdefault((r["clients"], r["label"]), []).append(r)
    out = []
    for (clients, label), rows in sorted(groups.items()):
        out.append([label, str(clients), str(len(rows)),
                    *_spread((r["tokens_per_s"] for r in rows), ".0f"),
                    *_spread((r["vs_serial"] for r in rows), ".2f"),
                    _median((r["serial_tokens_per_s"] for r in rows), ".0f"),
                    _median((r["batch_rows"] for r in rows), ".1f"), *_answered(rows),
                    _range((r["load_before"] for r in rows), ".1f")])
    return markdown(["served model", "clients", "runs", "tokens/s (median)", "range",
                     "× serial (median)", "range", "serial tokens/s", "batch rows", "failed",
                     "exact match", "load"], out, "lrrrrrrrrrrl")


@table("serve-wait")
def serve_wait(results: Path) -> str:
    """docs/results/serve_wait.jsonl: ``dlmkit serve --batch-wait-ms`` 5 (the former default),
    0, 1 and 2, alternating, per served model and client count: the median and range of
    tokens/s over the runs, the median ratio to serial, batch rows per request, p50 latency."""
    groups: dict[tuple, list[dict]] = {}
    for r in load("serve_wait.jsonl", results):
        groups.setdefault((r["clients"], r["label"], r["batch_wait_ms"]), []).append(r)
    out = []
    for (clients, label, wait), rows in sorted(groups.items()):
        out.append([label, str(clients), f"{wait:g}", str(len(rows)),
                    *_spread((r["tokens_per_s"] for r in rows), ".0f"),
                    _median((r["vs_serial"] for r in rows), ".2f"),
                    _median((r["batch_rows"] for r in rows), ".1f"),
                    f"{1000 * statistics.median(r['p50_s'] for r in rows):.1f}",
                    *_answered(rows),
                    _range((r["load_before"] for r in rows), ".1f")])
    return markdown(["served model", "clients", "wait ms", "runs", "tokens/s (median)", "range",
                     "× serial (median)", "batch rows", "p50 ms", "failed", "exact match",
                     "load"], out, "lrrrrrrrrrrl")


@table("serve-profile")
def serve_profile(results: Path) -> str:
    """The newest profiled run's batches (``bench/serve.py --profile``): one batch of 16
    requests against the same requests one at a time, in process, model forward vs the
    rest."""
    rows = [r for r in load("serve.jsonl", results) if r.get("bench") == "serve_profile"]
    newest = max(r["run"] for r in rows)
    out = []
    for r in rows:
        if r["run"] != newest:
            continue
        options = ", ".join(f"{k}={v}" for k, v in r["options"].items()) or "defaults"
        out.append([r["family"], options, str(r["tokens"]),
                    f"{r['batch_ms']:.1f} ({r['batch_forwards']})",
                    f"{100 * r['model_share']:.0f}%",
                    f"{r['alone_ms']:.1f} ({r['alone_forwards']})",
                    f"{100 * r['alone_model_ms'] / r['alone_ms']:.0f}%",
                    f"{r['batch_gain']:.2f}", f"{r['load']:.1f}"])
    return markdown(["family", "options", "tokens", "batch of 16: ms (forwards)",
                     "in the model", "one at a time: ms (forwards)", "in the model",
                     "batch gain", "load"], out, "llrrrrrrr")


def _serve_rows(results: Path) -> list[dict]:
    """The throughput rows (not the profiles) of the results file."""
    return [r for r in load("serve.jsonl", results) if r.get("bench", "serve") == "serve"]


def _newest_serve_run(results: Path) -> list[dict]:
    rows = _serve_rows(results)
    newest = max(r.get("run", "") for r in rows)
    return [r for r in rows if r.get("run", "") == newest]


# -- precision (docs/results/precision.jsonl; `python bench/precision.py`) ----------------------
@table("precision-updates")
def precision_updates(results: Path) -> str:
    """10 AdamW steps at lr 1e-5: which weights move, and how far against fp32's update."""
    rows = []
    for r in load("precision.jsonl", results):
        if r["bench"] != "precision_updates":
            continue
        low, high = r["update_norm_ratio_min"], r["update_norm_ratio_max"]
        ratio = f"{low:.4g}" if low == high else f"{low:.4g} - {high:.2g}" if low == 0 \
            else f"{low:.4g} - {high:.5g}"
        rows.append([r["precision"], f"{100 * r['changed']:.3g}%",
                     f"{100 * r['norm_weights_changed']:.3g}%", ratio])
    return markdown(["precision", "weights changed", "norm weights changed",
                     "update norm / fp32's, per tensor"], rows)


@table("precision-average")
def precision_average(results: Path) -> str:
    """The weight average's shadow in bf16 against fp32, on a drifting matrix."""
    rows = []
    for r in load("precision.jsonl", results):
        if r["bench"] != "precision_average":
            continue
        rows.append([r["shadow"], f"{r['decay']}", f"{r['updates']}",
                     f"{r['shadow_error_vs_raw']:.2g}", f"{100 * r['frozen_last_1000']:.3g}%"])
    return markdown(["shadow dtype", "decay", "updates",
                     "distance from the exact average / the raw weights'",
                     "entries frozen over the last 1000 updates"], rows)


# -- AR -> dLLM adaptation (docs/results/adapt.jsonl; `python bench/adapt.py --table`) ---------
@table("adapt")
def adapt(results: Path) -> str:
    """bench/adapt.py's own table (it writes docs/adapt.md between its markers)."""
    return _bench_module("adapt").table(load("adapt.jsonl", results))


# The settings an adapted idlm / ar run may vary in this table, and how a row names them.
ADAPT_SWEEP = ("train.lr", "strategy.clean_loss_weight", "strategy.auto_balance", "seed")


@table("adapt-retention")
def adapt_retention(results: Path) -> str:
    """docs/results/adapt.jsonl, the newest batch: idlm adapted at each learning rate and
    clean-stream weight (``strategy.auto_balance``: the paper's automatic weight), against
    ``ar`` continued at the same rate, whatever the seed: what each keeps of the memorised
    probe entries, the held-out and probe bits/byte (median over seeds) and the decoding speed
    adaptation left (greedy tokens per forward on held-out prompts)."""
    lines = load("adapt.jsonl", results)
    newest = max(r["batch_id"] for r in lines)
    groups: dict[tuple, list[dict]] = {}
    for r in lines:
        o = r.get("overrides") or {}
        if (r["batch_id"] != newest or r["run"] != "adapted" or r["family"] not in ("idlm", "ar")
                or "tokens_per_forward" not in r or set(o) - set(ADAPT_SWEEP)):
            continue
        # What the run trained with (newer lines record every option; the older ones
        # name what they set, the rest being 1.0 and no auto_balance, the defaults then)
        trained = r.get("strategy_options") or {
            "clean_loss_weight": o.get("strategy.clean_loss_weight", 1.0),
            "auto_balance": o.get("strategy.auto_balance", False)}
        weight = ("auto" if trained["auto_balance"] else f"{trained['clean_loss_weight']:g}") \
            if r["family"] == "idlm" else "n/a"
        steps = str(r["steps"]) if r["final_step"] == r["steps"] else \
            f"{r['steps']} (final/: {r['final_step']})"
        key = (r["family"], o.get("train.lr", 1e-5), steps, weight)
        groups.setdefault(key, []).append(r)

    def order(key):
        family, lr, steps, weight = key
        return (lr, int(steps.split()[0]), family != "ar", weight == "auto",
                float(weight) if weight not in ("auto", "n/a") else 0.0)

    out = []
    for key in sorted(groups, key=order):
        family, lr, steps, weight = key
        rows = sorted(groups[key], key=lambda r: (r.get("overrides") or {}).get("seed", 0))
        kept = ", ".join(str(r["retained"]) for r in rows)
        share = statistics.median(r["retained"] for r in rows) / rows[0]["ar_recalled"]
        out.append([family, f"{lr:g}", steps, weight, str(len(rows)),
                    f"{kept} of {rows[0]['ar_recalled']}", f"{100 * share:.0f}%",
                    f"{statistics.median(r['bpb'] for r in rows):.3f}",
                    f"{statistics.median(r['probe_bpb'] for r in rows):.3f}",
                    f"{statistics.median(r['tokens_per_forward'] for r in rows):.2f}"])
    return markdown(["family", "lr", "steps", "clean-loss weight", "seeds",
                     "retained (per seed)", "of AR's recall", "bits/byte", "probe bits/byte",
                     "tokens / forward"], out, "lrrlrrrrrr")


@table("adapt-suspects")
def adapt_suspects(results: Path) -> str:
    """docs/results/adapt_suspects.jsonl (``bench/adapt_suspects.py``): per bd3lm run, exact
    recall of the memorised entries by commit order, and the block ELBO's bits/byte with a
    block- or token-causal clean stream."""
    runs: dict[str, dict] = {}
    for r in load("adapt_suspects.jsonl", results):
        runs.setdefault(r["run"], {})[(r["suspect"], r["variant"])] = r
    out = []
    for run, got in runs.items():
        order = {k[1]: f"{v['retained']} / {v['ar_recalled']}" for k, v in got.items()
                 if k[0] == "order"}
        attn = {k[1]: v for k, v in got.items() if k[0] == "clean_attention"}
        out.append([f"`{run}`", order.get("confidence", ""), order.get("left_to_right", ""),
                    *(f"{attn[kind][field]:.3f}" if kind in attn else ""
                      for field in ("held_out_bpb", "probe_bpb") for kind in ("block", "token"))])
    return markdown(["bd3lm run", "kept: by confidence", "kept: left to right",
                     "held-out bits/byte: block-causal clean", "token-causal clean",
                     "probe bits/byte: block-causal clean", "token-causal clean"], out,
                    "lrrrrrr")


def _adapt_markers() -> tuple[str, str]:
    module = _bench_module("adapt")
    return module.TABLE_BEGIN, module.TABLE_END


# -- finding, checking and rewriting the tables -------------------------------------------------
def sections(text: str, where: str) -> list[tuple[str, int, int]]:
    """``(name, start, end)`` of each generated table's body in ``text``: the characters
    between the line after the begin marker and the end marker."""
    found = []
    for match in BEGIN.finditer(text):
        name, start = match.group("name"), match.end() + 1
        end = text.find(END, start)
        if end < 0:
            raise ValueError(f"{where}: table {name!r} has no {END!r} after it")
        found.append((name, start, end))
    begin, end_marker = _adapt_markers()
    if begin in text:
        start = text.index(begin) + len(begin) + 1
        found.append(("adapt", start, text.index(end_marker, start)))
    for name, _, _ in found:
        if name not in TABLES:
            raise ValueError(f"{where}: unknown table {name!r}; bench/tables.py defines: "
                             f"{', '.join(sorted(TABLES))}")
    return sorted(found, key=lambda s: s[1])


def regenerate(root: Path = ROOT, results: Path = RESULTS,
               write: bool = True) -> tuple[list[str], list[str]]:
    """Regenerate every table under ``root``; returns ``(stale, placed)``: the
    ``page: name`` of each table whose text differed from its data (rewritten when ``write``)
    and of every table found."""
    cache: dict[str, str] = {}
    stale, placed = [], []
    for page in pages(root):
        if not page.is_file():
            continue
        text = page.read_text()
        where = str(page.relative_to(root))
        found = sections(text, where)
        if not found:
            continue
        out, last = [], 0
        for name, start, end in found:
            if name not in cache:
                cache[name] = TABLES[name](results) + "\n"
            placed.append(f"{where}: {name}")
            if text[start:end] != cache[name]:
                stale.append(f"{where}: {name}")
            out += [text[last:start], cache[name]]
            last = end
        new = "".join(out) + text[last:]
        if write and new != text:
            page.write_text(new)
    return stale, placed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true",
                        help="rewrite nothing; exit 1 naming every table that differs from its "
                             "data")
    parser.add_argument("--root", type=Path, default=ROOT,
                        help="the checkout whose README.md and docs/ hold the tables (default: "
                             "this one); the results are always read from this checkout's "
                             "docs/results")
    args = parser.parse_args(argv)
    if not (args.root / "docs").is_dir():
        parser.error(f"--root {args.root}: no docs/ folder there")
    stale, placed = regenerate(args.root, write=not args.check)
    unused = sorted(set(TABLES) - {p.split(": ", 1)[1] for p in placed})
    if unused:
        print(f"bench/tables.py: defined but placed in no page: {', '.join(unused)}",
              file=sys.stderr)
    if args.check:
        if stale:
            print("stale tables (edited by hand, or their results changed); run "
                  "`python bench/tables.py` to regenerate them:\n  " + "\n  ".join(stale),
                  file=sys.stderr)
            return 1
        print(f"{len(placed)} tables match their results files")
        return 0
    print(f"{len(placed)} tables regenerated, {len(stale)} changed"
          + (":\n  " + "\n  ".join(stale) if stale else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
