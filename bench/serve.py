"""Serving throughput: concurrent clients against a live `dlmkit serve` on localhost.

    python bench/serve.py --clients 1 4 16 64 --requests 64 --max-tokens 16 --threads 1 \\
        --output docs/results/serve.jsonl --markdown

For each family (``--family``: a tiny random-weight export of that family is made, or
``--model FAMILY=RUN/final`` for a trained one) a server runs in a subprocess; for each client
count ``C``, ``C`` threads send the same fixed set of ``--requests`` completion requests
(greedy, ``max_tokens`` each, prompt ``i`` with seed ``i``) and wait for each answer before the
next. Per (family, clients): generated tokens per second of wall time, p50/p99 request latency,
failed requests (any non-200 answer or connection error), and the ratio to **serial decoding**
of the same requests (``generate`` on one prompt at a time in this process, the same threads),
measured in the same run. The load average of the machine before and after each family is
recorded: this machine is shared, and figures only compare within one run.

Random weights decode as fast as trained ones (the same forwards), so tokens/s compares the
families' decoding cost; they say nothing about exact match (train real models and pass
``--model`` for that).
"""

from __future__ import annotations

import argparse
import concurrent.futures
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


def requests(count: int, max_tokens: int) -> list[dict]:
    return [{"model": "bench", "prompt": PROMPTS[i % len(PROMPTS)], "max_tokens": max_tokens,
             "seed": i, "temperature": 0} for i in range(count)]


def post(port: int, body: dict) -> tuple[int, dict]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    try:
        connection.request("POST", "/v1/completions", body=json.dumps(body),
                           headers={"Content-Type": "application/json"})
        response = connection.getresponse()
        return response.status, json.loads(response.read())
    finally:
        connection.close()


def serial(path: Path, bodies: list[dict]) -> float:
    """Tokens/s of decoding the requests one at a time in this process (no server)."""
    from dlmkit.generate import generate, load

    loaded = load(path)
    config = loaded.config(None, max_new_tokens=bodies[0]["max_tokens"])
    generate(loaded.model, loaded.tokenizer, [bodies[0]["prompt"]], config)  # warm-up
    tokens, start = 0, time.perf_counter()
    for body in bodies:
        result = generate(loaded.model, loaded.tokenizer, [body["prompt"]], config,
                          first_index=body["seed"])
        tokens += result.generated
    return tokens / (time.perf_counter() - start)


def start_server(path: Path, port: int, threads: int, max_batch: int) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    process = subprocess.Popen(
        [sys.executable, "-m", "dlmkit.cli", "serve", "--model", str(path), "--port",
         str(port), "--threads", str(threads), "--device", "cpu", "--model-name", "bench",
         "--batch-size", str(max_batch), "--max-queue", "1024"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"error: the server for {path} exited: {process.stderr.read()}")
        try:
            connection = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            connection.request("GET", "/health")
            if connection.getresponse().status == 200:
                return process
        except OSError:
            time.sleep(0.2)
    process.kill()
    raise SystemExit(f"error: the server for {path} did not start in 300 s")


def run_clients(port: int, bodies: list[dict], clients: int) -> dict:
    latencies: list[float] = []
    failed, tokens = 0, 0

    def one(body):
        start = time.perf_counter()
        try:
            status, answer = post(port, body)
        except OSError:
            return None, time.perf_counter() - start
        return (answer if status == 200 else None), time.perf_counter() - start

    start = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(clients) as pool:
        for answer, seconds in pool.map(one, bodies):
            latencies.append(seconds)
            if answer is None:
                failed += 1
            else:
                tokens += answer["usage"]["completion_tokens"]
    wall = time.perf_counter() - start
    latencies.sort()
    return {"tokens": tokens, "seconds": round(wall, 3),
            "tokens_per_s": round(tokens / wall, 1),
            "p50_s": round(statistics.median(latencies), 4),
            "p99_s": round(latencies[min(len(latencies) - 1,
                                         int(0.99 * len(latencies)))], 4),
            "failed": failed}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def markdown(rows: list[dict]) -> str:
    lines = ["| family | clients | tokens/s | × serial | p50 s | p99 s | failed | load |",
             "|---|---:|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        lines.append(f"| {r['family']} | {r['clients']} | {r['tokens_per_s']} | "
                     f"{r['vs_serial']:.2f} | {r['p50_s']} | {r['p99_s']} | {r['failed']} | "
                     f"{r['load_before']:.1f} → {r['load_after']:.1f} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--family", nargs="+", default=["bd3lm", "mdlm", "idlm", "ar"],
                        choices=sorted(BLOCKS), help="families to serve (tiny random exports)")
    parser.add_argument("--model", action="append", default=[], metavar="FAMILY=PATH",
                        help="serve this export for FAMILY instead of a tiny random one")
    parser.add_argument("--clients", nargs="+", type=int, default=[1, 4, 16, 64])
    parser.add_argument("--requests", type=int, default=64, help="requests per client count")
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--threads", type=int, default=1, help="torch threads, server and serial")
    parser.add_argument("--max-batch", type=int, default=64, help="dlmkit serve --batch-size")
    parser.add_argument("--output", help="append the JSON lines to this file")
    parser.add_argument("--markdown", action="store_true", help="print a table at the end")
    args = parser.parse_args(argv)
    for name in ("requests", "max_tokens", "threads", "max_batch"):
        if getattr(args, name) < 1:
            raise SystemExit(f"error: --{name.replace('_', '-')} must be >= 1, got "
                             f"{getattr(args, name)}")
    if any(c < 1 for c in args.clients):
        raise SystemExit(f"error: --clients must all be >= 1, got {args.clients}")
    given = {}
    for spec in args.model:
        family, sep, path = spec.partition("=")
        if not sep or family not in BLOCKS:
            raise SystemExit(f"error: --model takes FAMILY=PATH with FAMILY one of "
                             f"{sorted(BLOCKS)}, got {spec!r}")
        given[family] = Path(path)
    import torch

    torch.set_num_threads(args.threads)
    bodies = requests(args.requests, args.max_tokens)
    rows = []
    with tempfile.TemporaryDirectory() as root:
        for family in dict.fromkeys([*args.family, *given]):
            path = given.get(family) or tiny_export(family, Path(root))
            load_before = os.getloadavg()[0]
            serial_tps = serial(path, bodies)
            port = free_port()
            server = start_server(path, port, args.threads, args.max_batch)
            try:
                post(port, bodies[0])  # warm-up
                for clients in args.clients:
                    row = {"bench": "serve", "family": family, "model": str(given.get(
                        family, "tiny-llama random weights")), "clients": clients,
                        "requests": args.requests, "max_tokens": args.max_tokens,
                        **run_clients(port, bodies, clients),
                        "serial_tokens_per_s": round(serial_tps, 1)}
                    row["vs_serial"] = round(row["tokens_per_s"] / serial_tps, 2)
                    row.update(load_before=load_before, load_after=os.getloadavg()[0],
                               cpus=os.cpu_count(), threads=args.threads,
                               torch=torch.__version__,
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
