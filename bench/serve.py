"""Serving throughput: concurrent clients against a live `dlmkit serve` on localhost.

    python bench/serve.py --clients 1 4 16 64 --requests 64 --max-tokens 16 --threads 1 \\
        --output docs/results/serve.jsonl --markdown

For each family (``--family``: a tiny random-weight export of that family is made, or
``--model LABEL=RUN/final`` for a trained one) a server runs in a subprocess; for each client
count ``C``, ``C`` threads send the same fixed set of ``--requests`` completion requests
(greedy, ``max_tokens`` each, request ``i`` with seed ``i``) and wait for each answer before the
next, each client on a keep-alive connection (as the ``openai`` client's pool keeps one),
opened before the clock starts (the clients are coroutines of one event loop).
Per (family, clients): generated tokens per second of wall time (a stop token ends an
answer, so only real tokens count), p50/p99 request latency, failed requests (any non-200
answer or connection error), and the ratio to **serial decoding** of the same requests
(``generate`` on one prompt at a time in this process, the same threads), measured in the same
run (decoded again right before each client count, as the machine's load drifts). The load
average of the machine before and after each family is recorded: this machine is shared, and
figures only compare within one run.

``--task NAME``: the requests are the first ``--requests`` problems of the bundled task's
*test* split, and each row also reports the **exact match** of the served answers against the
task's references (``exact_match``), the serial decode's (``serial_exact_match``) and the
fraction of requests whose served tokens equal the serial decode's (``agree_serial``: batching
must not change a request's tokens). Without ``--task`` the prompts are a fixed mix of task
prompts and nothing is scored (random weights: tokens/s compares decoding cost only).

``--option LABEL:KEY=VALUE`` sets a sampler option (``threshold``, ``cache``, ``steps``...) for
one served model: it travels in each request's ``dlmkit`` extension field and configures the
serial decode the same way. A ``LABEL`` is a family name, or ``FAMILY/TAG`` to serve the same
family twice with different options (``--model bd3lm/fast=runs/bd3lm/final --option
bd3lm/fast:threshold=0.9 --option bd3lm/fast:cache=prefix``).
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PROMPTS = ["rev abc", "sort 3142", "9+1=", "copy abcdefgh", "rev hello", "sort 987123",
           "copy xyz", "12+30="]
BLOCKS = {"bd3lm": 4, "hybrid": 4, "idlm": 4, "mdlm": None, "scdd": None, "ar": None}


def tiny_export(family: str, root: Path) -> Path:
    """The tiny-llama preset with random weights, exported as `dlmkit train` exports it."""
    import torch

    from dlmkit.data import ByteTokenizer
    from dlmkit.models import build_model

    tokenizer = ByteTokenizer()
    torch.manual_seed(0)
    path = root / family / "final"
    build_model("tiny-llama", tokenizer.vocab_size, attention="sdpa").save_pretrained(path)
    tokenizer.save_pretrained(path)
    (path / "dlmkit.json").write_text(json.dumps({
        "strategy": family, "block_size": BLOCKS[family], "task": "reverse",
        "mask_token_id": tokenizer.mask_token_id, "options": {}, "max_new_tokens": 16}))
    return path


def requests(count: int, max_tokens: int, task: str | None = None,
             options: dict | None = None) -> tuple[list[dict], list[str] | None]:
    """The request bodies, and with ``task`` the reference answer of each."""
    references = None
    if task is None:
        prompts = [PROMPTS[i % len(PROMPTS)] for i in range(count)]
    else:
        from dlmkit.data.tasks import get_task

        records = get_task(task).records("test", n=count)
        prompts = [r["prompt"] for r in records]
        references = [r["response"] for r in records]
    bodies = []
    for i, prompt in enumerate(prompts):
        body = {"model": "bench", "prompt": prompt, "max_tokens": max_tokens, "seed": i,
                "temperature": 0}
        if options:
            body["dlmkit"] = dict(options)
        bodies.append(body)
    return bodies, references


def option_value(text: str):
    """A sampler option's value from the command line: a number when it reads as one."""
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return {"true": True, "false": False, "null": None}.get(text, text)


def family_of(label: str) -> str:
    return label.partition("/")[0]


def post(port: int, body: dict, connection: http.client.HTTPConnection | None = None
         ) -> tuple[int, dict]:
    """One completion request; on ``connection`` (kept open for the next, as the openai
    client's connection pool does) or on a connection of its own."""
    own = connection is None
    if own:
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    try:
        connection.request("POST", "/v1/completions", body=json.dumps(body),
                           headers={"Content-Type": "application/json"})
        response = connection.getresponse()
        return response.status, json.loads(response.read())
    except OSError:
        connection.close()  # the next request opens a fresh connection
        raise
    finally:
        if own:
            connection.close()


def serial_decoder(path: Path, bodies: list[dict]):
    """``decode() -> (tokens/s, tokens, texts)``: the requests decoded one at a time in this
    process (no server), each request's tokens and text."""
    from dlmkit.generate import generate, load

    loaded = load(path)
    config = loaded.config(None, max_new_tokens=bodies[0]["max_tokens"],
                           **bodies[0].get("dlmkit", {}))
    generate(loaded.model, loaded.tokenizer, [bodies[0]["prompt"]], config)  # warm-up
    return lambda: _serial(loaded, config, bodies)


def _serial(loaded, config, bodies: list[dict]) -> tuple[float, list[list[int]], list[str]]:
    from dlmkit.generate import generate

    tokens, ids, texts = 0, [], []
    start = time.perf_counter()
    for body in bodies:
        # the server seeds request i's choice 0 with (seed, 0): the same generator here
        result = generate(loaded.model, loaded.tokenizer, [body["prompt"]], config,
                          prompt_seeds=[(body["seed"], 0)])
        tokens += result.generated
        ids.append(result.tokens[0])
        texts.append(result.texts[0])
    return tokens / (time.perf_counter() - start), ids, texts


def profile_batch(path: Path, bodies: list[dict], rows: int = 16, repeats: int = 3) -> dict:
    """Where one batch's time goes, in process: the first ``rows`` requests decoded as one
    batch and one at a time (best of ``repeats`` each, interleaved), each split into the time
    inside the model's forward (hooks on the model) and the rest (masks, sampling, per-row
    bookkeeping, caches)."""
    from dlmkit.generate import generate, load

    loaded = load(path)
    config = loaded.config(None, max_new_tokens=bodies[0]["max_tokens"],
                           **bodies[0].get("dlmkit", {}))
    chosen = bodies[:rows]
    inside = {"s": 0.0, "start": 0.0}

    def before(module, args, kwargs):
        inside["start"] = time.perf_counter()

    def after(module, args, kwargs, output):
        inside["s"] += time.perf_counter() - inside["start"]

    hooks = [loaded.model.register_forward_pre_hook(before, with_kwargs=True),
             loaded.model.register_forward_hook(after, with_kwargs=True)]

    def timed(groups):
        inside["s"], forwards = 0.0, 0
        start = time.perf_counter()
        for group in groups:
            result = generate(loaded.model, loaded.tokenizer, [b["prompt"] for b in group],
                              config, prompt_seeds=[(b["seed"], 0) for b in group])
            forwards += result.forwards
        return time.perf_counter() - start, inside["s"], forwards, result

    try:
        timed([chosen])  # warm-up
        batch, alone = [], []
        for _ in range(repeats):
            batch.append(timed([chosen]))
            alone.append(timed([[b] for b in chosen]))
    finally:
        for hook in hooks:
            hook.remove()
    best, single = min(batch, key=lambda t: t[0]), min(alone, key=lambda t: t[0])
    return {"rows": len(chosen), "batch_ms": round(1000 * best[0], 1),
            "batch_model_ms": round(1000 * best[1], 1), "batch_forwards": best[2],
            "model_share": round(best[1] / best[0], 3),
            "tokens": best[3].generated, "alone_ms": round(1000 * single[0], 1),
            "alone_model_ms": round(1000 * single[1], 1), "alone_forwards": single[2],
            "batch_gain": round(single[0] / best[0], 2)}


def start_server(path: Path, port: int, threads: int, max_batch: int,
                 log: Path, access_log: bool = True,
                 wait_ms: float | None = None) -> subprocess.Popen:
    """The server, its output (an access line per request) into ``log``: a pipe nobody
    reads would fill and stall it."""
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    with open(log, "w") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "dlmkit.cli", "serve", "--model", str(path), "--port",
             str(port), "--threads", str(threads), "--device", "cpu", "--model-name", "bench",
             "--batch-size", str(max_batch), "--max-queue", "1024",
             "--access-log" if access_log else "--no-access-log",
             *(["--batch-wait-ms", str(wait_ms)] if wait_ms is not None else [])],
            env=env, stdout=out, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"error: the server for {path} exited: {log.read_text()}")
        try:
            connection = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            connection.request("GET", "/health")
            if connection.getresponse().status == 200:
                return process
        except OSError:
            time.sleep(0.2)
    process.kill()
    raise SystemExit(f"error: the server for {path} did not start in 300 s")


async def _request(reader, writer, port: int, body: dict) -> tuple[int, dict]:
    """One POST /v1/completions on an open connection; ``(status, JSON answer)``."""
    data = json.dumps(body).encode()
    writer.write(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1:%d\r\n"
                 b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
                 % (port, len(data), data))
    await writer.drain()
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = dict(line.lower().split(": ", 1) for line in lines[1:] if ": " in line)
    if "content-length" not in headers:
        raise OSError(f"an answer without Content-Length: {lines[0]}")
    return status, json.loads(await reader.readexactly(int(headers["content-length"])))


async def _clients(port: int, bodies: list[dict], clients: int, answers: list,
                   latencies: list, clock: list) -> None:
    connections = await asyncio.gather(*(asyncio.open_connection("127.0.0.1", port)
                                         for _ in range(min(clients, len(bodies)))))

    async def client(first: int, reader, writer) -> None:
        for i in range(first, len(bodies), clients):
            start = time.perf_counter()
            try:
                if reader is None:
                    reader, writer = await asyncio.open_connection("127.0.0.1", port)
                status, answer = await _request(reader, writer, port, bodies[i])
                answers[i] = answer if status == 200 else None
            except (OSError, asyncio.IncompleteReadError, ValueError):
                if writer is not None:
                    writer.close()
                reader = writer = None  # the next request reconnects
            latencies[i] = time.perf_counter() - start
        if writer is not None:
            writer.close()

    clock.append(time.perf_counter())
    await asyncio.gather(*(client(c, *connection) for c, connection in enumerate(connections)))


def run_clients(port: int, bodies: list[dict], clients: int,
                references: list[str] | None = None,
                serial_tokens: list[list[int]] | None = None) -> dict:
    from dlmkit.generate.evaluation import exact_match

    answers: list = [None] * len(bodies)
    latencies: list[float] = [0.0] * len(bodies)
    # The clients are coroutines of one event loop, each on its own keep-alive connection,
    # opened before the clock starts: the load generator shares the server's two cores, so it
    # should cost as little as it can (no thread per client contending for the GIL).
    clock: list[float] = []
    asyncio.run(_clients(port, bodies, clients, answers, latencies, clock))
    failed, tokens, correct, agree = 0, 0, 0, 0
    rows = []  # the size of the batch each answered request was decoded in
    for i, answer in enumerate(answers):
        if answer is None:
            failed += 1
            continue
        tokens += answer["usage"]["completion_tokens"]
        rows.append(answer["dlmkit"]["batch_rows"])
        if references is not None:
            correct += exact_match(answer["choices"][0]["text"], references[i])
        if serial_tokens is not None:
            agree += answer["dlmkit"]["tokens"][0] == serial_tokens[i]
    start = clock[0]
    wall = time.perf_counter() - start
    latencies.sort()
    row = {"tokens": tokens, "seconds": round(wall, 3),
           "tokens_per_s": round(tokens / wall, 1),
           "p50_s": round(statistics.median(latencies), 4),
           "p99_s": round(latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))], 4),
           "failed": failed,
           "batch_rows": round(statistics.mean(rows), 2) if rows else None}
    if references is not None:
        row["exact_match"] = round(correct / len(bodies), 4)
    if serial_tokens is not None:
        row["agree_serial"] = round(agree / len(bodies), 4)
    return row


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def markdown(rows: list[dict]) -> str:
    scored = any("exact_match" in r for r in rows)
    head = ["family", "options", "clients", "tokens/s", "× serial", "p50 s", "p99 s", "failed"]
    if scored:
        head += ["exact match", "= serial tokens"]
    head.append("load")
    lines = ["| " + " | ".join(head) + " |",
             "|---|---|" + "---:|" * (len(head) - 3) + "---|"]
    for r in rows:
        options = ", ".join(f"{k}={v}" for k, v in r.get("options", {}).items()) or "defaults"
        cells = [r["family"], options, r["clients"], r["tokens_per_s"], f"{r['vs_serial']:.2f}",
                 r["p50_s"], r["p99_s"], r["failed"]]
        if scored:
            cells += [f"{100 * r['exact_match']:.1f}%" if "exact_match" in r else "-",
                      f"{100 * r['agree_serial']:.0f}%" if "agree_serial" in r else "-"]
        cells.append(f"{r['load_before']:.1f} → {r['load_after']:.1f}")
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    return "\n".join(lines)


def git_commit() -> str | None:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, check=True, cwd=Path(__file__).parent).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--family", nargs="*", default=None, choices=sorted(BLOCKS),
                        help="families to serve as tiny random exports (default: bd3lm mdlm "
                             "idlm ar when no --model is given, else none)")
    parser.add_argument("--model", action="append", default=[], metavar="LABEL=PATH",
                        help="serve this export; LABEL is a family or FAMILY/TAG")
    parser.add_argument("--option", action="append", default=[], metavar="LABEL:KEY=VALUE",
                        help="a sampler option for LABEL's requests and its serial decode")
    parser.add_argument("--task", help="requests from this bundled task's test split, scored "
                                       "by exact match")
    parser.add_argument("--clients", nargs="+", type=int, default=[1, 4, 16, 64])
    parser.add_argument("--requests", type=int, default=64, help="requests per client count")
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--threads", type=int, default=1, help="torch threads, server and serial")
    parser.add_argument("--max-batch", type=int, default=64, help="dlmkit serve --batch-size")
    parser.add_argument("--batch-wait-ms", type=float, default=None,
                        help="dlmkit serve --batch-wait-ms (default: the server's)")
    parser.add_argument("--access-log", action=argparse.BooleanOptionalAction, default=True,
                        help="dlmkit serve --access-log / --no-access-log (uvicorn's line per "
                             "request)")
    parser.add_argument("--profile", action="store_true",
                        help="also time one batch of the first 16 requests in process against "
                             "the same requests one at a time, model forward vs the rest "
                             "(a 'serve_profile' line per served model)")
    parser.add_argument("--output", help="append the JSON lines to this file")
    parser.add_argument("--markdown", action="store_true", help="print a table at the end")
    args = parser.parse_args(argv)
    for name in ("requests", "max_tokens", "threads", "max_batch"):
        if getattr(args, name) < 1:
            raise SystemExit(f"error: --{name.replace('_', '-')} must be >= 1, got "
                             f"{getattr(args, name)}")
    if args.batch_wait_ms is not None and not args.batch_wait_ms >= 0:
        raise SystemExit(f"error: --batch-wait-ms must be >= 0, got {args.batch_wait_ms}")
    if any(c < 1 for c in args.clients):
        raise SystemExit(f"error: --clients must all be >= 1, got {args.clients}")
    if args.task is not None:
        from dlmkit.data.tasks import task_names

        if args.task not in task_names():
            raise SystemExit(f"error: --task must be one of {task_names()}, got {args.task!r}")
    given = {}
    for spec in args.model:
        label, sep, path = spec.partition("=")
        if not sep or family_of(label) not in BLOCKS:
            raise SystemExit(f"error: --model takes LABEL=PATH with LABEL a family of "
                             f"{sorted(BLOCKS)} or FAMILY/TAG, got {spec!r}")
        given[label] = Path(path)
    families = args.family if args.family is not None else (
        [] if given else ["bd3lm", "mdlm", "idlm", "ar"])
    labels = list(dict.fromkeys([*families, *given]))
    options: dict[str, dict] = {label: {} for label in labels}
    for spec in args.option:
        label, sep, setting = spec.partition(":")
        key, eq, value = setting.partition("=")
        if not sep or not eq or not key:
            raise SystemExit(f"error: --option takes LABEL:KEY=VALUE, got {spec!r}")
        if label not in options:
            raise SystemExit(f"error: --option {spec!r}: no served model is labelled "
                             f"{label!r}; the labels are {labels}")
        options[label][key] = option_value(value)
    import torch

    torch.set_num_threads(args.threads)
    run = time.strftime("%Y-%m-%d %H:%M:%S")
    rows = []
    with tempfile.TemporaryDirectory() as root:
        for label in labels:
            family = family_of(label)
            path = given.get(label) or tiny_export(family, Path(root) / label.replace("/", "-"))
            bodies, references = requests(args.requests, args.max_tokens, args.task,
                                          options[label])
            load_before = os.getloadavg()[0]
            if args.profile:
                row = {"bench": "serve_profile", "run": run, "family": family, "label": label,
                       "model": str(given.get(label, "tiny-llama random weights")),
                       "options": options[label], "task": args.task,
                       "max_tokens": args.max_tokens, **profile_batch(path, bodies),
                       "load": os.getloadavg()[0], "threads": args.threads,
                       "torch": torch.__version__, "commit": git_commit(),
                       "date": time.strftime("%Y-%m-%d %H:%M:%S")}
                print(json.dumps(row), flush=True)
                if args.output:
                    with open(args.output, "a") as out:
                        out.write(json.dumps(row) + "\n")
            decode_serially = serial_decoder(path, bodies)
            serial_tps, serial_tokens, serial_texts = decode_serially()
            serial_exact = None
            if references is not None:
                from dlmkit.generate.evaluation import exact_match

                serial_exact = round(sum(map(exact_match, serial_texts, references))
                                     / len(bodies), 4)
            port = free_port()
            server = start_server(path, port, args.threads, args.max_batch,
                                  Path(root) / f"server-{label.replace('/', '-')}.log",
                                  access_log=args.access_log, wait_ms=args.batch_wait_ms)
            try:
                post(port, bodies[0])  # warm-up
                for number, clients in enumerate(args.clients):
                    if number:  # serial again next to each client count: the load drifts
                        serial_tps = decode_serially()[0]
                    row = {"bench": "serve", "run": run, "family": family, "label": label,
                           "model": str(given.get(label, "tiny-llama random weights")),
                           "options": options[label], "task": args.task, "clients": clients,
                           "access_log": args.access_log,
                           "batch_wait_ms": args.batch_wait_ms,
                           "requests": args.requests, "max_tokens": args.max_tokens,
                           **run_clients(port, bodies, clients, references, serial_tokens),
                           "serial_tokens_per_s": round(serial_tps, 1)}
                    if serial_exact is not None:
                        row["serial_exact_match"] = serial_exact
                    row["vs_serial"] = round(row["tokens_per_s"] / serial_tps, 2)
                    row.update(load_before=load_before, load_after=os.getloadavg()[0],
                               cpus=os.cpu_count(), threads=args.threads,
                               torch=torch.__version__, commit=git_commit(),
                               command="python bench/serve.py " + " ".join(
                                   sys.argv[1:] if argv is None else argv),
                               date=time.strftime("%Y-%m-%d %H:%M:%S"))
                    rows.append(row)
                    print(json.dumps(row), flush=True)
                    if args.output:
                        with open(args.output, "a") as out:
                            out.write(json.dumps(row) + "\n")
            finally:
                server.send_signal(signal.SIGTERM)
                server.wait(120)
    if args.markdown:
        print(markdown(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
