"""bench/serve.py: option parsing and errors, the task's requests, and a small run end to end
(a live server, scored answers, a profile line)."""

import json

import pytest

from tests.scripts import bench_script


def test_option_values_and_labels():
    bench = bench_script("serve")
    assert [bench.option_value(v) for v in ("0.9", "4", "prefix", "true", "null")] == [
        0.9, 4, "prefix", True, None]
    assert bench.family_of("bd3lm/fast") == "bd3lm" and bench.family_of("ar") == "ar"


def test_task_requests_carry_their_references_and_options():
    bench = bench_script("serve")
    bodies, references = bench.requests(5, 8, "reverse", {"threshold": 0.9})
    from dlmkit.data.tasks import get_task

    records = get_task("reverse").records("test", n=5)
    assert [b["prompt"] for b in bodies] == [r["prompt"] for r in records]
    assert references == [r["response"] for r in records]
    assert [b["seed"] for b in bodies] == list(range(5))
    assert all(b["dlmkit"] == {"threshold": 0.9} and b["temperature"] == 0 for b in bodies)
    plain, none = bench.requests(3, 8)
    assert none is None and "dlmkit" not in plain[0]


@pytest.mark.parametrize("argv, message", [
    (["--model", "ar=x", "--option", "idlm:threshold=0.9"], "no served model is labelled 'idlm'"),
    (["--model", "ar=x", "--option", "ar:threshold"], "--option takes LABEL:KEY=VALUE"),
    (["--model", "gpt=x"], "--model takes LABEL=PATH"),
    (["--family", "ar", "--task", "poetry"], "--task must be one of"),
])
def test_bad_arguments_are_named(argv, message):
    with pytest.raises(SystemExit, match=message):
        bench_script("serve").main(argv)


@pytest.mark.slow
def test_a_small_scored_run_end_to_end(tmp_path):
    """Two client counts against a live server over a tiny random-weight ar export: every
    request answered, the served tokens equal serial decoding's, a profile line first."""
    out = tmp_path / "serve.jsonl"
    assert bench_script("serve").main([
        "--family", "ar", "--clients", "1", "3", "--requests", "6", "--max-tokens", "4",
        "--task", "reverse", "--profile", "--batch-wait-ms", "0", "--output", str(out)]) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["bench"] for r in rows] == ["serve_profile", "serve", "serve"]
    profile = rows[0]
    assert profile["rows"] == 6 and 0 < profile["batch_model_ms"] <= profile["batch_ms"]
    assert profile["alone_forwards"] >= profile["batch_forwards"]
    for row in rows[1:]:
        assert row["failed"] == 0 and row["requests"] == 6 and row["task"] == "reverse"
        assert row["agree_serial"] == 1.0  # batching changed no request's tokens
        assert 0 <= row["exact_match"] <= 1 and row["tokens"] > 0
    assert [r["clients"] for r in rows[1:]] == [1, 3]
    assert rows[1]["batch_rows"] == 1 and 1 <= rows[2]["batch_rows"] <= 3  # one client: alone
    assert all(r["batch_wait_ms"] == 0 for r in rows[1:])
