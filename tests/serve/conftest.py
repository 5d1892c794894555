"""A real server on localhost (uvicorn in a thread, on a socket bound to a free port) over tiny
exported models, and the official ``openai`` client pointed at it."""

from __future__ import annotations

import json
import socket
import threading
import time

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
pytest.importorskip("openai")

from tests.generate.conftest import one_thread  # noqa: F401 (autouse: one intra-op thread)
from tests.generate.helpers import TOK, tiny_model  # noqa: E402

BLOCK = {"bd3lm": 4, "hybrid": 4, "idlm": 3, "mdlm": None, "scdd": None, "ar": None}




@pytest.fixture(scope="session")
def export(tmp_path_factory):
    """``export(strategy)``: the tiny model saved as `dlmkit train` exports it (``ar``: a plain
    causal LM directory decoded with the ar sampler, as `dlmkit train` exports ar runs)."""
    made = {}

    def save(strategy):
        if strategy not in made:
            path = tmp_path_factory.mktemp(strategy) / "final"
            tiny_model().save_pretrained(path)
            TOK.save_pretrained(path)
            (path / "dlmkit.json").write_text(json.dumps({
                "strategy": strategy, "block_size": BLOCK[strategy], "task": "reverse",
                "mask_token_id": TOK.mask_token_id, "options": {}, "max_new_tokens": 8}))
            made[strategy] = path
        return made[strategy]

    return save


class Running:
    """A server in a thread: ``url``, ``service``, ``client`` (openai), ``stop()``."""

    def __init__(self, service):
        import openai
        import uvicorn

        from dlmkit.serve import create_app

        self.service = service
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        config = uvicorn.Config(create_app(service), log_level="warning",
                                timeout_graceful_shutdown=None)
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [sock]},
                                       daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 60
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the test server did not start")
            time.sleep(0.01)
        self.client = openai.OpenAI(base_url=f"{self.url}/v1",
                                    api_key=service.api_key or "unused", max_retries=0,
                                    timeout=120)

    def stop(self):
        self.server.should_exit = True
        self.thread.join(timeout=60)


@pytest.fixture(scope="session")
def serve(export):
    """``serve(strategy, **service options)``: a running server over that family's tiny
    export (one per distinct argument set, stopped at the end of the session)."""
    from dlmkit.generate import load
    from dlmkit.serve import Service

    running: dict = {}

    def start(strategy, draft=False, **kw):
        """``draft=True``: the export as the target of a DFlash drafter (`--draft`)."""
        key = (strategy, draft, tuple(sorted(kw.items())))
        if key not in running:
            loaded = load(export(strategy))
            if draft:
                from dlmkit.families.dflash.pair import attach_draft
                from tests.generate.test_cli_checks import save_drafter

                drafter = save_drafter(export(strategy).parent / "drafter", export(strategy))
                loaded = attach_draft(loaded, drafter)
            options = {"max_batch": 16, "wait_ms": 5, "max_queue": 64, "model_id": "tiny",
                       "sampler": None, "options": {}} | kw
            running[key] = Running(Service(loaded, **options))
        return running[key]

    yield start
    for server in running.values():
        server.stop()


class Reply:
    """A raw HTTP answer: ``status_code``, ``headers``, ``text``, ``json()``."""

    def __init__(self, status: int, headers: dict, text: str):
        self.status_code, self.headers, self.text = status, headers, text

    def json(self):
        return json.loads(self.text)


def request(url: str, method: str, path: str, body=None, headers=None) -> Reply:
    """One raw request with the standard library (bad bodies the openai client cannot send)."""
    import http.client
    from urllib.parse import urlsplit

    where = urlsplit(url)
    connection = http.client.HTTPConnection(where.hostname, where.port, timeout=120)
    try:
        if body is not None and not isinstance(body, (bytes, str)):
            body = json.dumps(body)
        connection.request(method, path, body=body,
                           headers={"Content-Type": "application/json", **(headers or {})})
        response = connection.getresponse()
        return Reply(response.status, {k.lower(): v for k, v in response.getheaders()},
                     response.read().decode())
    finally:
        connection.close()


def stream_lines(url: str, body, stop_after: int | None = None) -> tuple[Reply, list[str]]:
    """POST ``body`` and read its server-sent events' data lines (hang up after
    ``stop_after`` of them)."""
    import http.client
    from urllib.parse import urlsplit

    where = urlsplit(url)
    connection = http.client.HTTPConnection(where.hostname, where.port, timeout=120)
    try:
        connection.request("POST", "/v1/completions", body=json.dumps(body),
                           headers={"Content-Type": "application/json"})
        response = connection.getresponse()
        head = Reply(response.status, {k.lower(): v for k, v in response.getheaders()}, "")
        lines = []
        for raw in response:
            line = raw.decode().strip()
            if line.startswith("data: "):
                lines.append(line.removeprefix("data: "))
                if stop_after is not None and len(lines) >= stop_after:
                    break
        return head, lines
    finally:
        connection.close()
