"""python -m minillm.serve [MODEL] [--host H] [--port P] [engine flags]: the OpenAI-compatible server.

Binds the port first (a busy port fails fast), builds the engine (user errors: one line, exit 2),
then serves the Quart app with Hypercorn and logs one line with the URL when it is ready.
SIGTERM or SIGINT: stop admitting (503), let open requests finish for --shutdown-grace seconds,
cut the rest with an error event, exit 0 (at most graceful_timeout + HARD_EXIT_MARGIN seconds later, even
with clients that stopped reading); a second signal cuts them at once. SIGUSR1 prints every
thread's Python stack to stderr and serves on; a native crash (SIGSEGV, SIGABRT, SIGBUS, SIGFPE,
SIGILL) prints them before the process dies (faulthandler), so no death is silent.
Engine flags are EngineArgs' under vLLM's names (see `--help`). Test hooks: minillm/server/__init__.py.
"""

from __future__ import annotations

import argparse
import asyncio
import faulthandler
import ipaddress
import json
import logging
import math
import os
import re
import signal
import sys
from urllib.parse import urlsplit

from minillm.args import STARTUP_ERRORS, CliParser, EngineArgs, add_engine_args
from minillm.backends.compile import env_flag
from minillm.server.reasoning import PARSERS as REASONING_PARSERS
from minillm.server.tools import TOOL_CALL_PARSERS

log = logging.getLogger("minillm.server")


def _json_strings(flag: str, check=None):
    """An argparse type: a JSON list of strings (vLLM's spelling of its CORS flags); check(item) says
    what is wrong with one item, or None."""
    def parse(text: str) -> list[str]:
        try:
            value = json.loads(text)
        except json.JSONDecodeError:
            value = None
        if not (isinstance(value, list) and value and all(isinstance(v, str) and v for v in value)):
            raise argparse.ArgumentTypeError(f"{flag} takes a JSON list of strings, e.g. "
                                             f"'[\"http://localhost:3000\"]'; got {text!r}")
        for item in value:
            if check is not None and (problem := check(item)):
                raise argparse.ArgumentTypeError(problem)  # argparse names the flag before it
        return value
    return parse


def origin_problem(origin: str) -> str | None:
    """What keeps an --allowed-origins entry from ever matching a browser's Origin header, or None.
    The match is exact, and a browser sends scheme://host[:port], lowercase, without a path or the
    scheme's default port: 'http://localhost:3000/' (copied from the address bar) would silently
    never match, and every page's call would fail its CORS check."""
    if origin in ("*", "null"):
        return None
    how = ("an origin is scheme://host[:port] as the browser sends it, e.g. 'http://localhost:3000': lowercase, "
           "without a path, a trailing slash or the scheme's default port")
    try:
        u = urlsplit(origin)
        host, port = u.hostname, u.port
    except ValueError:  # a bad port or IPv6 literal
        return f"{origin!r} is not an origin; {how}"
    if not (u.scheme and host) or u.username is not None or u.password is not None:
        return f"{origin!r} is not an origin; {how}"
    if ":" in host:
        host = f"[{host}]"
    default = {"http": 80, "https": 443}.get(u.scheme.lower())
    canonical = f"{u.scheme}://{host}".lower() + (f":{port}" if port is not None and port != default else "")
    if origin != canonical:
        return (f"{origin!r} would never match: a browser sends that page's origin as {canonical!r} "
                "(scheme://host[:port], lowercase, without a path or the scheme's default port); give that")
    return None


_HOST_NAME = re.compile(r"[A-Za-z0-9._-]+")


def host_problem(host: str) -> str | None:
    """What is wrong with --host, or None. Hypercorn reads a bind string's own syntax into it: a host
    such as 'fd://3' became an unbound socket that listened on every interface at a random port,
    and '0.0.0.0:8080' or 'http://localhost' only failed name resolution."""
    if not host.strip():
        return "--host is empty: give an address (127.0.0.1 for this machine, 0.0.0.0 for every interface)"
    bare = host[1:-1] if host.startswith("[") and host.endswith("]") else host  # [::1] as in a URL
    if ":" in bare:
        try:
            ipaddress.IPv6Address(bare)
            return None
        except ValueError:
            pass
    elif _HOST_NAME.fullmatch(bare):
        return None
    return (f"--host {host!r} is not an address or host name: give one alone, e.g. 127.0.0.1, 0.0.0.0, ::1 or "
            "localhost, without a scheme or a port (the port is --port)")


def step_delay() -> float:
    """$MINILLM_TEST_STEP_DELAY (a test hook: seconds each engine step sleeps; 0 unset), nan if not a number."""
    try:
        return float(os.environ.get("MINILLM_TEST_STEP_DELAY") or 0)
    except ValueError:
        return math.nan


def step_delay_problem() -> str | None:
    """What is wrong with $MINILLM_TEST_STEP_DELAY, or None. Checked before the model loads: time.sleep
    would otherwise raise in the engine thread at the first request ('abc': a traceback after the
    load; -1, nan, 1e300: the engine dies)."""
    if not 0 <= step_delay() <= 3600:
        raw = os.environ.get("MINILLM_TEST_STEP_DELAY")
        return (f"MINILLM_TEST_STEP_DELAY={raw!r}: give seconds from 0 to 3600 (a test hook that slows each "
                "engine step), or unset it")
    return None


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = CliParser(prog="python -m minillm.serve", description=__doc__.split("\n")[0])
    add_engine_args(p)
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (0.0.0.0: every interface)")
    p.add_argument("--port", type=int, default=8000, help="port to listen on (0: any free port)")
    # extend: a second --served-model-name adds its names rather than silently dropping the first's
    p.add_argument("--served-model-name", nargs="+", action="extend", default=None,
                   help="model name(s) clients use; the first is reported in responses (default: MODEL)")
    p.add_argument("--api-key", default=os.environ.get("MINILLM_API_KEY"),
                   help="require 'Authorization: Bearer KEY' on /v1/* (default: $MINILLM_API_KEY)")
    p.add_argument("--shutdown-grace", type=float, default=30.0,
                   help="seconds open requests get to finish after SIGTERM before they are cut")
    p.add_argument("--step-timeout", type=float, default=120.0,
                   help="seconds one engine step may take before the engine counts as hung: open streams "
                        "get an error event, /health turns 503, and the log shows where the engine was")
    p.add_argument("--reasoning-parser", default=None, choices=REASONING_PARSERS,
                   help="return chat outputs' <think>...</think> text apart from the answer, as "
                        "reasoning_content (qwen3: an output that opens with <think> thinks, any other is the "
                        "answer; deepseek_r1: every output starts in thinking, its <think> in the prompt)")
    p.add_argument("--tool-call-parser", default="hermes", choices=TOOL_CALL_PARSERS,
                   help="how tool_choice \"auto\" reads the model's calls: hermes, <tool_call>{...}</tool_call> "
                        "(Qwen2.5 / Qwen3 / Hermes templates); llama3_json, an output of {\"name\", \"parameters\"} "
                        "objects separated by ; (Llama 3.1-3.3 templates)")
    p.add_argument("--enable-auto-tool-choice", action="store_true",
                   help="accepted for vLLM's command lines: tool_choice \"auto\" is always on here")
    p.add_argument("--log-level", "--uvicorn-log-level", default="info",
                   choices=["trace", "debug", "info", "warning", "error", "critical"],
                   help="the server's log level (--uvicorn-log-level: vLLM's name; trace is debug here)")
    p.add_argument("--enable-prompt-tokens-details", action="store_true",
                   help="chat and completions usage carries prompt_tokens_details.cached_tokens: the prompt tokens "
                        "the prefix cache held (vLLM's flag)")
    p.add_argument("--disable-log-stats", action="store_true",
                   help="no periodic stats line (throughput, running / waiting, KV cache use, speculation)")
    p.add_argument("--log-stats-interval", type=float, default=10.0,
                   help="seconds between stats lines while the server has work (default 10)")
    p.add_argument("--enable-log-requests", action="store_true",
                   help="log each request as it is admitted (id, prompt length, sampling settings; never its "
                        "text) and as it ends")
    p.add_argument("--disable-log-requests", action="store_true",
                   help="accepted for vLLM's older command lines: requests are not logged unless "
                        "--enable-log-requests")
    p.add_argument("--allowed-origins", type=_json_strings("--allowed-origins", origin_problem), default=None,
                   help='origins whose browser pages may call the API (CORS), as a JSON list, e.g. '
                        '\'["http://localhost:3000"]\' or \'["*"]\' (default: none, no CORS headers; vLLM allows any)')
    # default None, so that one given without --allowed-origins (no CORS at all) is refused, not ignored
    p.add_argument("--allowed-methods", type=_json_strings("--allowed-methods"), default=None,
                   help='with --allowed-origins: the methods a preflight allows, as a JSON list (default ["*"])')
    p.add_argument("--allowed-headers", type=_json_strings("--allowed-headers"), default=None,
                   help='with --allowed-origins: the request headers a preflight allows (default ["*"])')
    p.add_argument("--allow-credentials", action="store_true",
                   help="with --allowed-origins: allow cookies and HTTP auth (not with the origin \"*\")")
    ns = p.parse_args(argv)
    if ns.allow_credentials and (ns.allowed_origins is None or "*" in ns.allowed_origins):
        p.error("--allow-credentials needs --allowed-origins naming the origins: browsers refuse credentials "
                "with the wildcard origin \"*\"")
    for flag in ("allowed_methods", "allowed_headers"):
        if getattr(ns, flag) is None:
            setattr(ns, flag, ["*"])
        elif ns.allowed_origins is None:
            p.error(f"--{flag.replace('_', '-')} needs --allowed-origins: without it the server sends no CORS "
                    "headers, so the flag would do nothing")
    if not (math.isfinite(ns.log_stats_interval) and ns.log_stats_interval > 0):
        p.error(f"--log-stats-interval must be a positive number of seconds, got {ns.log_stats_interval}")
    if ns.enable_log_requests and ns.disable_log_requests:
        p.error("--enable-log-requests and --disable-log-requests contradict each other; give one")
    names = ns.served_model_name or []
    if ns.model is None and any(os.path.exists(n) for n in names[1:]):
        # `--served-model-name NAME MODEL` swallows MODEL as a second name (nargs="+", as in vLLM)
        p.error("MODEL was read as a --served-model-name; put MODEL before the flags")
    return ns


def server_flag_problem(ns: argparse.Namespace) -> str | None:
    """What is wrong with the server's own flags (the engine's are EngineArgs' to check), or None."""
    if not (math.isfinite(ns.step_timeout) and ns.step_timeout > 0):
        return f"--step-timeout must be a positive number of seconds, got {ns.step_timeout}"
    if not (math.isfinite(ns.shutdown_grace) and ns.shutdown_grace >= 0):
        return f"--shutdown-grace must be a number of seconds >= 0, got {ns.shutdown_grace}"
    if ns.api_key is not None and not ns.api_key.strip():
        return ("--api-key (or $MINILLM_API_KEY) is empty: give a key, or leave both out to serve without one")
    if ns.api_key is not None and (ns.api_key != ns.api_key.strip()
                                   or not (ns.api_key.isascii() and ns.api_key.isprintable())):
        # no request could match it: HTTP strips a header value's outer spaces (a key read from a file
        # keeps its newline), and clients refuse, or the server misreads, non-ASCII header bytes
        return ("--api-key (or $MINILLM_API_KEY) has spaces or a newline at an end, or characters other than "
                "printable ASCII: no client could send it in an Authorization header; give the key alone")
    if ns.served_model_name is not None and not all(n.strip() for n in ns.served_model_name):
        return "--served-model-name takes non-empty names"
    if problem := host_problem(ns.host):
        return problem
    return step_delay_problem()


def install_stack_dumps() -> None:
    """Every thread's Python stack to stderr on a native crash, and on SIGUSR1 on demand (the
    process goes on). A crash inside CuPy, a driver or an injected tool otherwise kills the server
    with no trace of where each thread was (../shared/field-report.md); SIGUSR1 is for a hang:
    `kill -USR1 PID` shows the engine thread's frame without stopping anything."""
    faulthandler.enable(file=sys.stderr, all_threads=True)
    if hasattr(signal, "SIGUSR1"):  # not on Windows
        faulthandler.register(signal.SIGUSR1, file=sys.stderr, all_threads=True)


HARD_EXIT_MARGIN = 3.0  # s past hypercorn's graceful_timeout before a drained server exits regardless


def _hypercorn_config(host: str, port: int):
    from hypercorn.config import Config

    config = Config()
    host = host[1:-1] if host.startswith("[") else host  # [::1]: host_problem let only an IPv6 address through
    config.bind = [f"[{host}]:{port}" if ":" in host else f"{host}:{port}"]
    # after our own drain, idle keep-alive connections remain, and those of clients still uploading or no
    # longer reading: hypercorn waits this long for them, then cancels them (see _serve's hard exit)
    config.graceful_timeout = 5.0
    config.errorlog = logging.getLogger("hypercorn.error")
    logging.getLogger("hypercorn.error").setLevel(logging.WARNING)  # our ready line replaces its banner
    return config


async def _serve(app, aeng, config, sockets, grace: float) -> None:
    from hypercorn.asyncio.run import worker_serve
    from hypercorn.utils import wrap_app

    loop = asyncio.get_running_loop()
    stop, force = asyncio.Event(), asyncio.Event()
    drained = False
    # a connection cancelled mid-upload logs its cancelled callback as an ERROR traceback on Python < 3.12
    # (CPython gh-113538): it is the shutdown's doing, not a failure
    loop.set_exception_handler(lambda lp, ctx: None if isinstance(ctx.get("exception"), asyncio.CancelledError)
                               else lp.default_exception_handler(ctx))

    def exit_now(why: str) -> None:
        log.warning("%s: exiting without waiting for the connections still open", why)
        logging.shutdown()
        os._exit(0)  # the requests are settled (drained or cut); only sockets are left

    def on_signal(name: str) -> None:
        if drained:  # a second signal cuts at once (the module's promise), after the drain too
            exit_now(f"second {name} after the drain")
        if stop.is_set():
            log.warning("second %s: cutting open requests now", name)
            force.set()
        stop.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal, sig.name)

    async def shutdown_trigger() -> None:
        nonlocal drained
        await stop.wait()
        log.info("shutting down: admitting no new requests; %d open, %.0f s grace", aeng.num_open, grace)
        await aeng.drain(grace, force)
        drained = True
        # hypercorn now waits graceful_timeout for the connections, then cancels them; one whose client stopped
        # reading never finishes closing (its unsent data: hypercorn waits on wait_closed() for good), and held
        # the process until the client went away
        loop.call_later(config.graceful_timeout + HARD_EXIT_MARGIN, exit_now,
                        f"connections open {config.graceful_timeout + HARD_EXIT_MARGIN:.0f} s after the drain")

    await worker_serve(wrap_app(app, config.wsgi_max_body_size, "asgi"), config, sockets=sockets,
                       shutdown_trigger=shutdown_trigger)


def main(argv: list[str] | None = None) -> int:
    ns = parse_args(argv)
    if problem := server_flag_problem(ns):
        print(f"error: {problem}", file=sys.stderr)
        return 2
    level = "DEBUG" if ns.log_level == "trace" else ns.log_level.upper()
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    install_stack_dumps()
    config = _hypercorn_config(ns.host, ns.port)
    try:
        sockets = config.create_sockets()
    except (OSError, OverflowError, ValueError) as e:
        where = f"[{ns.host.strip('[]')}]" if ":" in ns.host else ns.host
        print(f"error: cannot listen on {where}:{ns.port}: {e}", file=sys.stderr)
        return 2

    from minillm.engine.engine import LLMEngine
    from minillm.server import AsyncEngine, build_app
    from minillm.server.stats_log import log_stats_forever

    try:
        args = EngineArgs.from_cli(ns)
        if args.async_scheduling is None:  # the default here too: no step waits on the host
            args.async_scheduling = True
        engine = LLMEngine(args)
    # user and environment errors (flags, model path, sizing, no GPU, no memory): one line, no traceback
    except STARTUP_ERRORS as e:
        log.debug("engine construction failed", exc_info=True)
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130

    aeng = AsyncEngine(engine, step_delay=step_delay(),
                       step_timeout=ns.step_timeout, log_requests=ns.enable_log_requests)
    names = ns.served_model_name or [engine.model_name]
    app = build_app(aeng, names, ns.api_key, test_hooks=env_flag("MINILLM_TEST_FAULTS", False, "fault hooks"),
                    reasoning_parser=ns.reasoning_parser, tool_call_parser=ns.tool_call_parser,
                    prompt_tokens_details=ns.enable_prompt_tokens_details,
                    cors=None if ns.allowed_origins is None else dict(
                        allow_origin=ns.allowed_origins, allow_methods=ns.allowed_methods,
                        allow_headers=ns.allowed_headers, allow_credentials=ns.allow_credentials))
    for sock in sockets.insecure_sockets:
        sock.listen(config.backlog)  # connections queue from here on, so the ready line is true at once
    host, port = sockets.insecure_sockets[0].getsockname()[:2]
    url = f"http://{f'[{host}]' if ':' in host else host}:{port}"

    @app.before_serving
    async def ready() -> None:
        log.info("minillm ready: serving %s at %s/v1 (health %s/health, metrics %s/metrics)",
                 names[0], url, url, url)
        if not ns.disable_log_stats:
            app.extensions["minillm"]["stats_log"] = asyncio.get_running_loop().create_task(
                log_stats_forever(lambda: aeng.stats, ns.log_stats_interval))

    @app.after_serving
    async def stop_stats_log() -> None:
        task = app.extensions["minillm"].get("stats_log")
        if task is not None:
            task.cancel()

    asyncio.run(_serve(app, aeng, config, sockets, ns.shutdown_grace))
    log.info("minillm stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
