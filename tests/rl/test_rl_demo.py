"""bench/rl_demo.py: the demonstration's SFT data (which answers are respelled) and a run's
summary record."""

import json

import pytest

from tests.scripts import bench_script


def read(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_mixed_data_respells_only_even_answers_and_keeps_the_problems(tmp_path):
    from dlmkit.data.tasks import get_task

    demo = bench_script("rl_demo")
    out = tmp_path / "even.jsonl"
    changed = demo.mixed_data("train", 400, 0.75, 0, str(out), "dot", even_only=True)
    rows = read(out)
    task = get_task("addition").records("train", n=400, seed=0)
    assert [r["prompt"] for r in rows] == [t["prompt"] for t in task]
    dotted = [r for r in rows if r["response"].endswith(".")]
    assert len(dotted) == changed
    for row, record in zip(rows, task):
        plain = row["response"].removesuffix(".")
        assert plain == record["response"]
        assert not row["response"].endswith(".") or int(plain) % 2 == 0
    evens = sum(int(t["response"]) % 2 == 0 for t in task)
    assert 0.65 * evens < changed < 0.85 * evens  # ~3/4 of the even answers
    again = tmp_path / "again.jsonl"
    demo.mixed_data("train", 400, 0.75, 0, str(again), "dot", even_only=True)
    assert again.read_text() == out.read_text()  # a pure function of the arguments


def test_mixed_data_pad_spelling_and_argument_errors(tmp_path, capsys):
    demo = bench_script("rl_demo")
    out = tmp_path / "pad.jsonl"
    demo.mixed_data("validation", 50, 1.0, 0, str(out), "pad")
    assert all(len(r["response"]) >= 3 and r["response"].isdigit() for r in read(out))
    with pytest.raises(SystemExit):
        demo.main(["mixed-data", "-n", "5", "--share", "1.5", "--out", str(out)])
    assert "--share in [0, 1], got 5, 1.5" in capsys.readouterr().err


def test_run_summary_reads_config_and_metrics(tmp_path):
    from dlmkit.rl import DEFAULTS
    from dlmkit.train.config import dump_yaml

    demo = bench_script("rl_demo")
    config = json.loads(json.dumps(DEFAULTS))
    config["policy"] = "somewhere/final"
    (tmp_path / "config.yaml").write_text(dump_yaml(config))
    lines = [{"split": "train", "step": 5 * (i + 1), "reward": r, "rollout_s": 1.0,
              "update_s": 3.0} for i, r in enumerate([0.1, 0.2, 0.3, 0.4, 0.5])]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    summary = demo.run_summary(str(tmp_path))
    assert summary["steps_done"] == 25 and summary["rollout_s"] == 5.0
    assert summary["update_s"] == 15.0
    assert summary["reward_first_fifth"] == 0.1 and summary["reward_last_fifth"] == 0.5
    assert summary["estimator"] == "elbo" and summary["policy"] == "somewhere/final"
