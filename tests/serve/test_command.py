"""`dlmkit serve` as a command: --help, option errors, and SIGTERM draining a live server."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest

from dlmkit.cli import main

from .conftest import request


def test_help_lists_endpoints_and_options(capsys):
    with pytest.raises(SystemExit) as done:
        main(["serve", "--help"])
    assert done.value.code == 0
    out = capsys.readouterr().out
    for words in ("POST /v1/chat/completions", "--api-key", "--max-queue", "--batch-wait-ms",
                  "--threshold", "default: 127.0.0.1", '"dlmkit": {sampler options}'):
        assert words in out, words


@pytest.mark.parametrize("flags,message", [
    (["--port", "70000"], "--port must be <= 65535, got 70000"),
    (["--max-queue", "0"], "--max-queue must be >= 1, got 0"),
    (["--batch-wait-ms", "-1"], "--batch-wait-ms must be >= 0, got -1.0"),
    (["--api-key", " "], "--api-key is empty"),
    (["--threshold", "2"], "threshold must be a number in (0, 1], got 2.0"),
])
def test_bad_options_fail_before_serving(export, flags, message):
    with pytest.raises(SystemExit) as failed:
        main(["serve", "--model", str(export("bd3lm")), "--device", "cpu", *flags])
    assert message in str(failed.value)



@pytest.mark.parametrize("flags,logged", [([], True), (["--no-access-log"], False)])
def test_access_log_is_on_unless_turned_off(export, monkeypatch, flags, logged):
    import uvicorn

    seen = {}

    class Server:  # records the config instead of serving
        def __init__(self, config):
            seen["access_log"] = config.access_log

        def run(self):
            seen["ran"] = True

    monkeypatch.setattr(uvicorn, "Server", Server)
    main(["serve", "--model", str(export("ar")), "--device", "cpu", *flags])
    assert seen == {"access_log": logged, "ran": True}

def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.slow
def test_sigterm_finishes_requests_in_flight(export):
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    process = subprocess.Popen(
        [sys.executable, "-m", "dlmkit.cli", "serve", "--model", str(export("ar")), "--port",
         str(port), "--threads", "1", "--device", "cpu", "--model-name", "tiny"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                if request(url, "GET", "/health").status_code == 200:
                    break
            except OSError:
                pass
            assert process.poll() is None and time.monotonic() < deadline, process.stdout.read()
            time.sleep(0.2)
        answers = []
        body = {"model": "tiny", "prompt": "rev abc", "max_tokens": 900}
        asker = threading.Thread(target=lambda: answers.append(
            request(url, "POST", "/v1/completions", body)))
        asker.start()
        while request(url, "GET", "/health").json()["decoding"] == 0:
            assert asker.is_alive(), answers[0].text
            time.sleep(0.02)
        process.send_signal(signal.SIGTERM)
        asker.join(120)
        assert answers and answers[0].status_code == 200, answers and answers[0].text
        reply = answers[0].json()
        assert reply["usage"]["completion_tokens"] >= 1
        # uvicorn re-raises the signal once drained: the status says SIGTERM ended it
        assert process.wait(60) == -signal.SIGTERM
        with pytest.raises(OSError):  # gone: nothing listens any more
            request(url, "GET", "/health")
    finally:
        if process.poll() is None:
            process.kill()
        process.wait()
    output = process.stdout.read()
    assert "dlmkit serve: model 'tiny' (ar sampler)" in output, output
    assert "Finished server process" in output or "Shutting down" in output, output
