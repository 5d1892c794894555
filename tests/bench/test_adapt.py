"""bench/adapt.py: the corpus parsing and split, the --logit-shift check, the table, and the
smoke size end to end (it fetches Debian's dict-devil package once into the cache)."""

import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.scripts import bench_script

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "adapt.py"




TEXT = """00-database-short
     The Devil's Dictionary

ABSURDITY, n.  A statement or belief manifestly inconsistent with
one's own opinion.

ACCOUNTABILITY, n.  The mother of caution.

    "My accountability, bear in mind,"
        Said the Grand Vizier:  "Yes, yes,"
                                                            Joram Tate

ACCUSE, v.t.  To affirm another's guilt or unworth; most commonly as a
justification of ourselves for having wronged him.
"""


def test_entries_pair_headword_and_definition():
    adapt = bench_script("adapt")
    got = adapt.entries(TEXT, max_bytes=1000)
    assert [h for h, _ in got] == ["ABSURDITY, n.", "ACCOUNTABILITY, n.", "ACCUSE, v.t."]
    assert got[0][1] == "A statement or belief manifestly inconsistent with one's own opinion."
    # A quotation paragraph belongs to the entry above it, on its own line.
    assert got[1][1] == ('The mother of caution.\n"My accountability, bear in mind," Said the '
                         'Grand Vizier: "Yes, yes," Joram Tate')


def test_entries_cut_at_a_word_boundary():
    adapt = bench_script("adapt")
    for max_bytes in (10, 23, 24, 40):
        for _, body in adapt.entries(TEXT, max_bytes):
            assert len(body.encode()) <= max_bytes
    (_, body), *_ = adapt.entries(TEXT, 24)
    assert body == "A statement or belief"  # not "... belief m"


def test_split_is_deterministic_and_sized():
    adapt = bench_script("adapt")
    heads = [f"WORD{i}, n." for i in range(4000)]
    first = [adapt.split_of(h) for h in heads]
    assert first == [adapt.split_of(h) for h in heads]
    share = {k: first.count(k) / len(first) for k in ("held_out", "probe", "train")}
    assert abs(share["held_out"] - 0.10) < 0.02
    assert abs(share["probe"] - 0.05) < 0.015


def test_probe_entries_are_pretrained_but_never_adapted(tmp_path):
    adapt = bench_script("adapt")
    text = tmp_path / "devil.txt"
    words = [f"WORD{i}, n.  Definition number {i} of many." for i in range(300)]
    text.write_text("\n\n".join(words))
    size = adapt.SIZES["smoke"]
    splits = adapt.write_data(text, size, tmp_path / "data")
    read = {name: [json.loads(x) for x in (tmp_path / "data" / f"{name}.jsonl").open()]
            for name in ("pretrain", "adapt", "held_out", "probe")}
    probe = {r["prompt"] for r in read["probe"]}
    assert probe and probe == {r["prompt"] for r in splits["probe"]}
    assert not probe & {r["prompt"] for r in read["adapt"]}
    assert not probe & {r["prompt"] for r in read["held_out"]}
    counts = [r["prompt"] for r in read["pretrain"]]
    assert all(counts.count(p) == size.probe_repeat for p in probe)
    held = {r["prompt"] for r in read["held_out"]}
    assert held and not held & set(counts)
    # The memorising phase: the training entries and the probe entries, never the held-out.
    memorise = [json.loads(x)["prompt"] for x in (tmp_path / "data" / "memorise.jsonl").open()]
    assert all(memorise.count(p) == size.memorise_repeat for p in probe)
    assert set(memorise) == probe | {r["prompt"] for r in read["adapt"]}
    assert not list((tmp_path / "data").glob("*.tmp"))


def test_logit_shift_off_is_set_explicitly():
    """An adapted run "off" must say strategy.logit_shift=false: left unset, fine-tuning a
    causal checkpoint turns it on (such "off" runs once trained with the shift)."""
    adapt = bench_script("adapt")
    assert adapt.shifts_of("bd3lm", "both") == [False, True]
    assert adapt.shifts_of("mdlm", "off") == [False]
    assert adapt.shifts_of("idlm", "both") == [None]  # no such option
    assert adapt.shifts_of("bd3lm", None) == [None]
    tag, settings = adapt.adapted_run("bd3lm", False, {})
    assert (tag, settings) == ("adapt-bd3lm-noshift", {"strategy.logit_shift": False})
    tag, settings = adapt.adapted_run("bd3lm", True, {"train.lr": 1e-4})
    assert tag == "adapt-bd3lm-shift-train.lr=0.0001"
    assert settings == {"strategy.logit_shift": True, "train.lr": 1e-4}
    assert adapt.adapted_run("idlm", None, {}) == ("adapt-idlm", {})


def test_arguments_that_contradict_are_refused(capsys):
    adapt = bench_script("adapt")
    for argv, message in [
        (["--logit-shift", "on", "--adapt-set", "strategy.logit_shift=false"],
         "--logit-shift on and --adapt-set strategy.logit_shift=False both set the shift"),
        (["--no-adapt", "--no-scratch"], "--no-adapt and --no-scratch together leave nothing"),
        (["--reuse-base", "--reuse-pretrain"], "--reuse-base pretrains again"),
        (["--logit-shift", "sometimes"], "argument --logit-shift: invalid choice: 'sometimes'"),
        (["--budget", "0"], "--budget must be >= 1 step, got 0"),
    ]:
        with pytest.raises(SystemExit):
            adapt.parse_args(argv)
        assert message in capsys.readouterr().err
    assert adapt.parse_args(["--logit-shift"]).logit_shift == "both"


def test_keep_trained_scores_a_finished_run_without_training(tmp_path, monkeypatch):
    adapt = bench_script("adapt")
    calls = []

    def fake_run(args, **kw):
        calls.append(args)
        return subprocess.CompletedProcess(args, 0)

    monkeypatch.setattr(adapt.subprocess, "run", fake_run)
    run_dir = tmp_path / "scratch-mdlm"
    (run_dir / "final").mkdir(parents=True)
    settings = {"strategy.name": "mdlm", "train.lr": 1e-3}
    adapt.train(run_dir, settings, 1, tmp_path / "log")
    assert len(calls) == 1
    saved = json.loads((run_dir / adapt.TRAINED).read_text())
    assert saved["settings"]["train.lr"] == 1e-3 and len(saved["load_avg"]) == 3
    assert adapt.train(run_dir, settings, 1, tmp_path / "log", keep=True) == saved["wall_s"]
    assert len(calls) == 1  # not trained again
    # Another setting, another thread count or no keep: trained again.
    adapt.train(run_dir, {**settings, "train.lr": 1e-4}, 1, tmp_path / "log", keep=True)
    adapt.train(run_dir, settings, 2, tmp_path / "log", keep=True)
    adapt.train(run_dir, settings, 1, tmp_path / "log")
    assert len(calls) == 4


def test_logit_shift_flag_needs_the_option(monkeypatch):
    adapt = bench_script("adapt")
    from dlmkit import strategies

    cls = strategies.get("mdlm")
    monkeypatch.setattr(cls, "options", {k: v for k, v in cls.options.items()
                                         if k != "logit_shift"})
    with pytest.raises(SystemExit, match=r"--logit-shift: .*\['mdlm'\] have no option "
                                         r"logit_shift .*issue 52 item 4"):
        adapt.check_logit_shift(["ar", "mdlm"])
    adapt.check_logit_shift(["ar", "idlm"])  # families it does not apply to need nothing


def _line(adapt, **kw):
    base = {"bench": "adapt", "size": "smoke", "batch_id": "B2", "commit": "abc",
            "corpus": "c", "model": "tiny-llama", "model_config": {}, "threads": 1,
            "entries": {"train": 3}, "held_out_scored": 2, "probe_scored": 2, "mc_samples": 2,
            "budget": 8, "params": 1000, "steps": 8, "final_step": 8, "recalled": 1,
            "train_wall_s": 1.0, "score_wall_s": 0.1, "load_avg": [1.0, 1.0, 1.0],
            "logit_shift": None}
    return {**base, **kw}


def test_table_renders_the_newest_batch(tmp_path):
    adapt = bench_script("adapt")
    lines = [
        _line(adapt, batch_id="B1", run="pretrain", family="ar", bpb=9.0, curve=[[8, 9.0]]),
        _line(adapt, run="pretrain", family="ar", bpb=2.0, curve=[[4, 2.0]], steps=12,
              probe_bpb=0.25,
              probe_repeat=2, memorise_steps=4, memorise_repeat=3, memorise_lr=0.001,
              base={"steps": 8, "bpb": 1.9, "curve": [[8, 1.9]], "recalled": 0,
                    "train_wall_s": 5.0}),
        _line(adapt, run="adapted", family="mdlm", logit_shift=True, bpb=2.1, ar_bpb=2.0,
              curve=[[4, 2.3], [8, 2.1]], retained=1, ar_recalled=1, steps_within_10pct=8,
              probe_bpb=1.5, tokens_per_forward=2.345),
        _line(adapt, run="adapted", family="hybrid", bpb=2.2, ar_bpb=2.0, curve=[[8, 2.2]],
              retained=0, retained_causal=1, ar_recalled=1, steps_within_10pct=8),
        _line(adapt, run="scratch", family="mdlm", bpb=4.0, ar_bpb=2.0,
              curve=[[4, 5.0], [8, 4.0]], steps_within_10pct=None),
        _line(adapt, run="adapted", family="mdlm", bpb=3.0, ar_bpb=2.0, curve=[[8, 3.0]],
              retained=0, ar_recalled=1, steps_within_10pct=None,
              overrides={"train.lr": 0.001}),
    ]
    results = tmp_path / "adapt.jsonl"
    results.write_text("".join(json.dumps(x) + "\n" for x in lines))
    doc = tmp_path / "adapt.md"
    doc.write_text(f"intro\n{adapt.TABLE_BEGIN}\nold\n{adapt.TABLE_END}\noutro\n")
    text = adapt.write_table(results, doc)
    assert "9.000" not in text  # batch B1 is older
    assert "### size `smoke` (batch B2, commit abc)" in text
    lines[-1]["commit"] = "def"  # a run added to the batch by later code
    results.write_text("".join(json.dumps(x) + "\n" for x in lines))
    assert "### size `smoke` (batch B2, commits abc, def)" in adapt.write_table(results, doc)
    assert ("The 12 steps: 8 from scratch on the training entries and each probe entry x2 "
            "(then 1.900 bits/byte, 0 probe entries recalled; 5 s), then 4 on the training "
            "entries and each probe entry x3 (lr 0.001, no weight decay)") in text
    assert "recalls 1 of 2 probe entries (their bits/byte 0.250); entries {'train': 3}, 2 " in text
    assert ("| mdlm | adapted | on | 8 | 2.100 | 1.05 | 8 | 1 / 1 | 1.500 | 2.35 | 4: 2.30, "
            "8: 2.10 |" in text)
    # A line from before the probe's bits/byte and the decoding speed were measured: empty
    # cells.
    assert ("| mdlm | adapted, train.lr=0.001 | n/a | 8 | 3.000 | 1.50 | never | 0 / 1 |  |  | "
            "8: 3.00 |") in text
    assert "| mdlm | scratch | n/a | 8 | 4.000 | 2.00 | never | (1 recalled) |  |" in text
    # hybrid: its own sampler kept nothing, its causal stream (read by `ar`) one entry
    assert "| 8 | 0 / 1 (causal stream: 1) |" in text
    rows = [row.split(" | ")[1] for row in text.splitlines() if row.startswith("| mdlm |")]
    assert rows == ["adapted", "adapted, train.lr=0.001", "scratch"]
    page = doc.read_text()
    assert page.startswith("intro\n") and page.endswith("outro\n") and "old" not in page

    doc.write_text("no markers")
    with pytest.raises(SystemExit, match="no .*adapt-table.* section to replace"):
        adapt.write_table(results, doc)


@pytest.mark.slow
def test_smoke_size_end_to_end(tmp_path):
    """Pretrain, adapt and train from scratch at the smoke size: a line per run, finite
    bits/byte at every checkpoint, the probe scored against the pretrained model's recall."""
    if shutil.which("apt-get") is None or shutil.which("dpkg-deb") is None:
        pytest.skip("the corpus is a Debian package: needs apt-get and dpkg-deb")
    cache = Path(os.environ.get("DLMKIT_BENCH_CACHE", "~/.cache/dlmkit-bench")).expanduser()
    try:  # a machine without Debian's package lists or network cannot fetch it: not a failure
        bench_script("adapt").fetch_corpus(cache)
    except SystemExit as err:
        pytest.skip(f"the corpus could not be fetched here: {str(err)[:300]}")
    results = tmp_path / "adapt.jsonl"

    def bench(*args):
        done = subprocess.run(
            [sys.executable, str(SCRIPT), "--size", "smoke", "--threads", "1", "--cache",
             str(cache), "--work", str(tmp_path / "runs"), "--results", str(results), *args],
            capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
        assert done.returncode == 0, done.stderr[-3000:] + done.stdout[-2000:]
        return [json.loads(x) for x in results.read_text().splitlines()]

    lines = bench("--families", "mdlm")
    assert [(x["run"], x["family"]) for x in lines] == [
        ("pretrain", "ar"), ("adapted", "mdlm"), ("scratch", "mdlm")]
    pre, adapted, scratch = lines
    # Pretraining: 8 steps from scratch, then 4 memorising the probe entries.
    assert [s for s, _ in pre["base"]["curve"]] == [4, 8] and pre["base"]["steps"] == 8
    assert [s for s, _ in pre["curve"]] == [4] and pre["steps"] == 12
    for line in lines:
        assert all(math.isfinite(b) and b > 0 for _, b in line["curve"])
        assert line["bpb"] > 0 and math.isfinite(line["probe_bpb"]) and line["probe_bpb"] > 0
    for line in (adapted, scratch):
        assert [s for s, _ in line["curve"]] == [4, 8] and line["steps"] == 8
    assert adapted["ar_bpb"] == scratch["ar_bpb"] == pre["bpb"]
    assert adapted["ar_recalled"] == pre["recalled"]
    assert 0 <= adapted["retained"] <= adapted["ar_recalled"]
    assert "dict-devil" in pre["corpus"]

    # A second invocation adds a family to the same batch, against the same AR reference, at
    # a shorter budget.
    *_, more = bench("--families", "idlm", "--no-scratch", "--reuse-pretrain", "--budget", "4")
    assert (more["run"], more["family"], more["batch_id"]) == ("adapted", "idlm",
                                                               pre["batch_id"])
    assert (more["steps"], more["budget"], more["run_dir"]) == (4, 4, "adapt-idlm-4steps")
    assert more["ar_bpb"] == pre["bpb"] and more["ar_recalled"] == pre["recalled"]

    # --keep-trained scores the run already trained with these settings, without training.
    *_, kept = bench("--families", "mdlm", "--no-adapt", "--reuse-pretrain", "--keep-trained")
    assert (kept["run"], kept["bpb"], kept["train_wall_s"]) == ("scratch", scratch["bpb"],
                                                                scratch["train_wall_s"])
    results.write_text("".join(json.dumps(x) + "\n" for x in [*lines, more]))

    # --score-probe fills in the probe's bits/byte of lines written without it, the same
    # number the run's own scoring gave.
    stripped = [{k: v for k, v in x.items() if k != "probe_bpb"} if x is adapted else x
                for x in [*lines, more]]
    results.write_text("".join(json.dumps(x) + "\n" for x in stripped))
    filled = bench("--score-probe")
    assert [x.get("probe_bpb") for x in filled] == [x["probe_bpb"] for x in [*lines, more]]

    # --rescore scores the batch's runs again in place: the same draws, the same numbers.
    again = bench("--rescore")
    assert len(again) == len(lines) + 1
    for old, new in zip([*lines, more], again):
        assert new["rescored_commit"]
        assert (new["bpb"], new["curve"], new["recalled"]) == (old["bpb"], old["curve"],
                                                               old["recalled"])


def test_elbo_reads_the_trained_logit_shift(monkeypatch):
    """A model trained with strategy.logit_shift is scored with the shifted ELBO (the scores
    of such runs were once read unshifted)."""
    import types

    import torch

    import dlmkit.decoding.likelihood as likelihood
    from dlmkit.data import load_tokenizer

    adapt = bench_script("adapt")
    seen = []

    def fake_elbo(scorer, runner, prompt, cont, **kw):
        seen.append((scorer, kw.get("logit_shift", False)))  # elbo's default
        return -float(len(cont))

    monkeypatch.setattr(likelihood, "elbo", fake_elbo)
    for shift in (True, False):
        loaded = types.SimpleNamespace(
            tokenizer=load_tokenizer("byte"), meta={"strategy": "mdlm"},
            model=torch.nn.Linear(1, 1),
            config=lambda sampler, shift=shift: types.SimpleNamespace(logit_shift=shift))
        bpb = adapt.bits_per_byte(loaded, [{"prompt": "A, n.", "response": "abcd"}], 2)
        assert bpb == pytest.approx(1 / math.log(2))  # 1 nat per byte
    assert seen == [("masked_elbo", True), ("masked_elbo", False)]


def test_the_causal_sampler_of_a_family_with_a_causal_stream():
    adapt = bench_script("adapt")
    assert adapt.causal_sampler("hybrid") == "ar" and adapt.causal_sampler("idlm") == "ar"
    assert adapt.causal_sampler("bd3lm") is None and adapt.causal_sampler("ar") is None


def test_training_runs_the_dlmkit_of_the_bench_s_own_tree(tmp_path, monkeypatch):
    """Started from another directory that has a ``dlmkit`` package (another checkout), the
    child must still train with the code of the tree whose commit the results name."""
    adapt = bench_script("adapt")
    calls = []
    monkeypatch.setattr(adapt.subprocess, "run", lambda args, **kw: calls.append(args) or
                        subprocess.CompletedProcess(args, 0))
    (tmp_path / "run").mkdir()
    adapt.train(tmp_path / "run", {}, 1, tmp_path / "log")
    code = calls[0][2]
    decoy = tmp_path / "elsewhere"
    (decoy / "dlmkit").mkdir(parents=True)
    (decoy / "dlmkit" / "__init__.py").write_text("")
    probe = code.replace("from dlmkit.cli import main; sys.exit(main())",
                         "import dlmkit; print(dlmkit.__file__)")
    assert probe != code
    monkeypatch.undo()  # the real subprocess.run again
    out = subprocess.run([sys.executable, "-c", probe], cwd=decoy, capture_output=True,
                         text=True, check=True).stdout.strip()
    assert Path(out) == SCRIPT.parents[1] / "dlmkit" / "__init__.py"
