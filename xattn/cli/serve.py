"""`xattn serve MODEL [MODEL ...]`: the HTTP API and the live attention page (needs the `serve` extra)."""
from __future__ import annotations

import dataclasses
import logging
import os
import socket
import sys
from urllib.parse import urlsplit

from xattn.checks import within
from xattn.cli.common import add_verb, path_arg
from xattn.errors import XattnError

LIMIT_FLAGS = {
    "--max-chars": ("max_chars", int, "characters per request, all texts together"),
    "--max-items": ("max_items", int, "texts per request"),
    "--max-source-tokens": ("max_source_tokens", int, "subword tokens of one sentence (a text is translated a "
                            "sentence at a time)"),
    "--max-beam": ("max_beam", int, "beam size"),
    "--max-n-best": ("max_n_best", int, "n-best hypotheses (and alternatives + 1)"),
    "--max-samples": ("max_samples", int, "samples per text"),
    "--max-output-tokens": ("max_output_tokens", int, "max_len_a * source tokens + max_len_b"),
    "--max-work": ("max_work", int, "a request's decoding work: over its texts, beam (or samples) x maximum output "
                   "tokens, a token at position t weighing 1 + t/64 (a step reads every position before it); bounds "
                   "how long one request can hold the model"),
    "--long-work": ("long_work", int, "decoding work above which a request is long: it runs alone, and the next "
                    "batches run beside it, taking turns step by step, instead of waiting for it"),
    "--long-after": ("long_after_s", float, "seconds per request it serves after which the next batches run "
                     "beside a running call instead of waiting for it, whatever its work"),
    "--max-attention-values": ("max_attention_values", int, "numbers in an attention response (full or mean)"),
    "--queue-size": ("queue_size", int, "requests waiting (or running beside the next batches) before 429"),
    "--timeout": ("timeout_s", float, "seconds before 504"),
    "--max-backlog": ("max_backlog_s", float, "while the server is behind, the seconds of translation that the "
                      "requests admitted would keep a request waiting (estimated from the server's measured rate), "
                      "beyond which it is refused with 429 at once rather than left to time out; default: half of "
                      "--timeout"),
    "--batch-size": ("max_batch", int, "sentences per translate call"),
    "--batch-wait-ms": ("batch_wait_ms", float, "milliseconds the batcher waits for more requests"),
}


def register(sub) -> None:
    from xattn.serve.limits import Limits

    defaults = Limits()
    p = add_verb(sub, "serve", "Serve models over HTTP: POST /translate (LibreTranslate-compatible, plus decoding "
                 "settings, cross-attention and word alignment; source auto checks the text's language), POST /detect, "
                 "POST /translate_file (a .txt file, line by line), GET /languages, /health, /info, /metrics, "
                 "/openapi.json, and at / a page that shows the cross-attention of each translation. Several models "
                 "(one per language pair) are routed to by source and target. Concurrent requests share batches. "
                 "Needs: pip install 'xattn[serve]'.",
                 "xattn serve runs/multi30k-de-en runs/multi30k-en-de --port 8000\n"
                 "  curl -s localhost:8000/translate -H 'Content-Type: application/json' "
                 "-d '{\"q\": \"Ein Hund rennt.\", \"source\": \"de\", \"target\": \"en\"}'", run)
    p.add_argument("models", nargs="+", metavar="MODEL", type=path_arg,
                   help="model directories, each its own language pair (from its config.yaml), loaded once")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1: this machine only)")
    p.add_argument("--port", type=int, default=8000,
                   help="port to listen on (default 8000; 0: any free one, printed with the address)")
    p.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N (default: cpu)")
    p.add_argument("--threads", type=int, help="PyTorch threads for translation (default: the CPU's cores)")
    p.add_argument("--api-key", help="require this key (api_key in the body, or Authorization: Bearer KEY)")
    p.add_argument("--cors-origin", help="allow browser requests from this origin, e.g. https://example.org:8443, or * "
                   "for any (default: none)")
    for flag, (name, kind, help) in LIMIT_FLAGS.items():
        default = getattr(defaults, name)
        p.add_argument(flag, type=kind, default=default,
                       help=help if default is None else f"{help} (default {default})")
    for flag, (_, kind, default, help) in CONNECTION_FLAGS.items():
        p.add_argument(flag, type=kind, default=default,
                       help=help if default is None else f"{help} (default {default})")
    p.add_argument("--no-access-log", action="store_true", help="no line per request on stderr (each line is JSON: "
                   "id, route, status, ms, texts, characters, output tokens, and whether it joined the continuous "
                   "batch or a translate call)")


def client_noise(record: logging.LogRecord) -> bool:
    """Whether uvicorn's log record is worth a line: not its warnings about one client's malformed request or upgrade
    (that client gets a JSON error; a crowd of them would flood the log)."""
    return not record.getMessage().startswith(("Invalid HTTP request received", "Unsupported upgrade request",
                                               "No supported WebSocket library"))


CONNECTION_FLAGS = {
    "--max-connections": ("max_connections", int, None, "open connections; one more takes the place of one quiet "
                          "for a second, or is held for a /health check only and anything else answered 503 "
                          "(default: 512, or fewer when the open-file limit leaves less room)"),
    "--max-header-bytes": ("h11_max_incomplete_event_size", int, 65536, "bytes of a request's head (request line "
                           "and headers); more is answered 431 and the connection closed"),
    "--read-timeout": ("read_timeout", float, 10.0, "seconds a request (head and body) may take to arrive from its "
                       "first byte; a slower client is closed"),
    "--write-timeout": ("write_timeout", float, 10.0, "seconds a client may take in none of its answer while the "
                        "server has more of it to send; a client that stops reading is cut off"),
    "--keep-alive": ("timeout_keep_alive", float, 5.0, "seconds an idle connection stays open between requests"),
}
"""How the HTTP server treats connections: uvicorn's settings and xattn's guards (xattn/serve/connections.py),
with the plain asyncio event loop (under a flood of open connections uvloop was slow to accept new ones, /health
included) and h11, whose head-size limit httptools lacks (the figures: benchmarks/README.md, Serving under
load)."""
MAX_CONNECTIONS = 512
FILES_SPARE = 128
"""Files the server keeps for itself beyond its connections (model files, logs, the listening socket, and the
connections held beyond the limit for health checks, serve/connections.RESERVE)."""
SWITCH_INTERVAL = 0.0001
"""Seconds a Python thread may hold the GIL while another waits (Python's default: 0.005). The translating thread
gives the GIL up at every PyTorch operation and waits for it after each while the event loop holds it: with the
default, up to 5 ms each time; many greedy clients got less at 0.5 ms than at this (the figures: benchmarks/README.md,
Serving under load: the switch interval)."""


def address(host: str, port: int) -> str:
    """Where to point a browser at a server listening on `host`, and what it serves there: one on every interface
    (0.0.0.0, ::) is reached on this machine at the loopback's (http://0.0.0.0:8000/ is no address to open)."""
    if host in ("0.0.0.0", "::"):
        return f"http://{'127.0.0.1' if host == '0.0.0.0' else '[::1]'}:{port}/ (the API and the attention page; on " \
            "every interface: from another machine, this one's name or address)"
    return f"http://{f'[{host}]' if ':' in host else host}:{port}/ (the API and the attention page)"


def run(args) -> int:
    try:
        import uvicorn

        from xattn.serve.app import create_app
    except ImportError as e:
        raise XattnError(f"xattn serve needs FastAPI and uvicorn ({e.name} is missing): pip install 'xattn[serve]'") \
            from None
    import torch

    from xattn.allocator import keep_freed_memory
    from xattn.devices import resolve_device
    from xattn.serve.connections import guarded
    from xattn.serve.limits import Limits

    values, connections = checked_flags(args)
    read_timeout, write_timeout = connections.pop("read_timeout"), connections.pop("write_timeout")
    limit = connection_limit(connections.pop("max_connections"))
    torch.set_num_threads(args.threads or os.cpu_count() or 1)
    keep_freed_memory()  # (xattn.allocator: the server's process is its own)
    device = str(resolve_device(args.device, "--device"))
    servers: list = []  # the uvicorn server, stopped if a model fails to load
    app = create_app(args.models, dataclasses.replace(Limits(), **values), args.api_key, args.cors_origin, device,
                     on_load_error=lambda message: setattr(servers[0], "should_exit", True))
    sock = listening_socket(args.host, args.port)
    port = sock.getsockname()[1]  # (--port 0: the one the system gave)
    log = logging.getLogger("xattn.serve")  # short lines on stderr: the access log, a client gone mid-body
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(message)s"))
    log.addHandler(handler)
    log.propagate = False
    log.setLevel(logging.INFO)
    logging.getLogger("xattn.serve.access").setLevel(logging.WARNING if args.no_access_log else logging.INFO)
    logging.getLogger("python_multipart").setLevel(logging.ERROR)  # a malformed upload is the client's 422 alone
    logging.getLogger("uvicorn.error").addFilter(client_noise)  # answered as JSON already (connections.py)
    sys.setswitchinterval(SWITCH_INTERVAL)
    http = guarded(read_timeout, write_timeout, limit, app.state.metrics)
    servers.append(uvicorn.Server(uvicorn.Config(app, host=args.host, port=port, log_level="warning",
                                                 loop="asyncio", http=http, ws="none", **connections)))
    models = ", ".join(f"{one.path} ({one.source}→{one.target})" for one in app.state.xattn.served)
    print(f"loading {models}; listening at {address(args.host, port)}; Ctrl+C stops", flush=True)
    try:
        servers[0].run(sockets=[sock])
    finally:
        sock.close()
    if (failed := app.state.xattn.failed) is not None:  # the server stops at the first model that cannot load
        raise XattnError(f"{failed.path}: the model failed to load: {failed.error}")
    return 0


def checked_flags(args) -> tuple[dict, dict]:
    """The limits (Limits' fields) and connection settings (CONNECTION_FLAGS' names) the flags give, checked."""
    values = {name: getattr(args, flag[2:].replace("-", "_")) for flag, (name, _, _) in LIMIT_FLAGS.items()}
    for flag, (name, _, _) in LIMIT_FLAGS.items():
        value = values[name]
        if value is None:  # (a default that follows another flag's)
            continue
        if problem := within(0, lo_open=name != "batch_wait_ms")(value):  # (inf: "must be a finite number > 0")
            raise XattnError(f"{flag}: {problem}")
    if values["max_backlog_s"] is not None and values["max_backlog_s"] > values["timeout_s"]:
        raise XattnError(f"--max-backlog: {values['max_backlog_s']:g} s is above --timeout "
                         f"({values['timeout_s']:g} s), so requests admitted would time out before their turn; "
                         "lower it")
    if values["batch_wait_ms"] / 1000 >= values["timeout_s"]:
        raise XattnError(f"--batch-wait-ms: {values['batch_wait_ms']:g} ms is not below --timeout "
                         f"({values['timeout_s']:g} s), so a request waiting for its batch would time out first; "
                         "lower it")
    if values["max_n_best"] > values["max_beam"]:
        raise XattnError(f"--max-n-best: {values['max_n_best']} is above --max-beam ({values['max_beam']}); n-best "
                         "hypotheses come from the beam, so lower it or raise --max-beam")
    if not 0 <= args.port < 65536:
        raise XattnError(f"--port: {args.port} is not a port (0 for any free one, or 1 to 65535)")
    if args.threads is not None and args.threads < 1:
        raise XattnError(f"--threads: must be >= 1, got {args.threads}")
    if args.api_key is not None and (not args.api_key.strip() or args.api_key != args.api_key.strip()):
        raise XattnError("--api-key: an empty key, or one with spaces around it, could never be given back")
    if args.cors_origin is not None:
        check_origin(args.cors_origin)
    connections = {name: getattr(args, flag[2:].replace("-", "_")) for flag, (name, _, _, _) in CONNECTION_FLAGS.items()}
    for flag, (name, _, _, _) in CONNECTION_FLAGS.items():
        if connections[name] is not None and (problem := within(0, lo_open=True)(connections[name])):
            raise XattnError(f"{flag}: {problem}")
    return values, connections


def connection_limit(asked: int | None) -> int:
    """--max-connections within what the open-file limit leaves (a flood beyond the files a process may open
    would make accept() fail for everyone): the default is lowered to fit; a value given that cannot is an error."""
    import resource

    files = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    room = files - FILES_SPARE if files != resource.RLIM_INFINITY else max(asked or 0, MAX_CONNECTIONS)
    if asked is None:
        return max(min(MAX_CONNECTIONS, room), 1)
    if asked > room:
        raise XattnError(f"--max-connections: {asked} connections need more files than the open-file limit "
                         f"({files}) leaves ({room}); lower it, or raise the limit (ulimit -n)")
    return asked


def check_origin(origin: str) -> None:
    """A CORS origin is `*` or scheme://host[:port], nothing after it (what browsers send in Origin)."""
    parts = urlsplit(origin)
    if origin != "*" and not (parts.scheme in ("http", "https") and parts.hostname and not parts.path
                              and not parts.query and not parts.fragment and not parts.username):
        raise XattnError(f"--cors-origin: {origin!r} is not an origin; give scheme://host[:port], e.g. "
                         "https://example.org, or *")
    try:
        parts.port
    except ValueError:
        raise XattnError(f"--cors-origin: {origin!r} has a bad port") from None


def listening_socket(host: str, port: int) -> socket.socket:
    """A socket bound to `host`:`port` before anything loads, so that an address that cannot be had is one
    error line naming --host and --port, not the server's log."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                                             flags=socket.AI_PASSIVE)[0]
    except socket.gaierror as e:
        raise XattnError(f"--host {host}: not an address to listen on ({e.strerror})") from None
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(address)
    except OSError as e:
        sock.close()
        raise XattnError(f"--host {host} --port {port}: cannot listen there ({e.strerror})") from None
    return sock
