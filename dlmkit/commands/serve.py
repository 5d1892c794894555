"""``dlmkit serve``: an OpenAI-compatible HTTP server over an exported model (docs/serving.md)."""

from __future__ import annotations

import argparse
from pathlib import Path

from .generate import DefaultsHelpFormatter, add_sampler_arguments

EPILOG = """\
endpoints:
  POST /v1/completions       {"model", "prompt", "max_tokens", "temperature", "seed", "stop",
                              "stream", "n", "dlmkit": {sampler options}}
  POST /v1/chat/completions  the same with "messages" (rendered as training rendered them)
  GET  /v1/models, GET /health

The sampler options above are the server's defaults; a request overrides them in its "dlmkit"
object ({"steps": 8, "threshold": 0.9, ...}), checked as `dlmkit generate` checks its flags.
Concurrent requests with the same options decode in one batch; a request's tokens depend on
its own prompt, options and seed only. SIGTERM (or Ctrl-C) stops taking connections,
finishes the requests in flight, then exits by that signal (status 143 for SIGTERM).

examples:
  dlmkit serve --model runs/x/final
  dlmkit serve --model runs/x/final --threshold 0.9 --port 8001 --api-key secret
  curl http://127.0.0.1:8000/v1/chat/completions -H 'Content-Type: application/json' \\
    -d '{"model": "x", "messages": [{"role": "user", "content": "rev abc"}]}'
"""


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser(
        "serve", help="serve an exported model over an OpenAI-compatible HTTP API",
        description="Serve a model exported by `dlmkit train` (RUN/final) over an "
                    "OpenAI-compatible HTTP API, batching concurrent requests.",
        formatter_class=_Formatter, epilog=EPILOG)
    add_sampler_arguments(parser)
    server = parser.add_argument_group("server")
    server.add_argument("--host", default="127.0.0.1",
                        help="address to bind (0.0.0.0 exposes the server to the network)")
    server.add_argument("--port", type=int, default=8000, help="TCP port")
    server.add_argument("--api-key",
                        help="require 'Authorization: Bearer KEY' on /v1/* (default: no key)")
    server.add_argument("--model-name",
                        help="the model id clients send as 'model' (default: the run "
                             "directory's name, RUN of RUN/final)")
    server.add_argument("--max-queue", type=int, default=256,
                        help="most requests waiting; past it a request gets 429")
    server.add_argument("--batch-wait-ms", type=float, default=1.0,
                        help="how long a batch's first request waits for companions (requests "
                             "that arrive while a batch decodes join the next one anyway; "
                             "the default's measurement: docs/serving.md)")
    server.add_argument("--threads", type=int,
                        help="torch intra-op threads (default: torch's choice)")
    server.add_argument("--access-log", action=argparse.BooleanOptionalAction, default=True,
                        help="log one line per request (uvicorn's access log; "
                             "--no-access-log saves its cost on every request, the largest "
                             "left on the event loop: docs/serving.md)")
    parser.set_defaults(func=run)


class _Formatter(DefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    pass


def model_id(path: str) -> str:
    """``RUN`` for ``RUN/final``, else the directory's own name."""
    resolved = Path(path).resolve()
    return resolved.parent.name if resolved.name == "final" else resolved.name


def run(args) -> int:
    try:
        import uvicorn

        from dlmkit.serve import Service, create_app
    except ModuleNotFoundError as err:
        raise SystemExit(f"error: dlmkit serve needs {err.name}: pip install 'dlmkit[serve]'"
                         ) from None
    from .generate import load_and_configure, sampler_options

    for name, value, low in (("--port", args.port, 0), ("--max-queue", args.max_queue, 1),
                             ("--threads", args.threads, 1)):
        if value is not None and value < low:
            raise SystemExit(f"error: {name} must be >= {low}, got {value}")
    if args.port > 65535:
        raise SystemExit(f"error: --port must be <= 65535, got {args.port}")
    if args.batch_wait_ms < 0:
        raise SystemExit(f"error: --batch-wait-ms must be >= 0, got {args.batch_wait_ms}")
    if args.api_key is not None and not args.api_key.strip():
        raise SystemExit("error: --api-key is empty; give a key or omit the option")
    if args.threads is not None:
        import torch

        torch.set_num_threads(args.threads)
    loaded, config = load_and_configure(args)
    name = args.model_name or model_id(args.model)
    service = Service(loaded, sampler=config.sampler, options=sampler_options(args),
                      model_id=name, max_batch=args.batch_size, wait_ms=args.batch_wait_ms,
                      max_queue=args.max_queue, api_key=args.api_key)
    print(f"dlmkit serve: model {name!r} ({config.sampler} sampler) on "
          f"http://{args.host}:{args.port}  (Ctrl-C or SIGTERM: finish the requests in flight, "
          "then exit)", flush=True)
    # timeout_graceful_shutdown=None: on SIGTERM, wait for every request in flight
    uvicorn.Server(uvicorn.Config(create_app(service), host=args.host, port=args.port,
                                  log_level="info", access_log=args.access_log,
                                  timeout_graceful_shutdown=None)).run()
    return 0
