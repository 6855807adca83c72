"""The Quart app: OpenAI-compatible routes over an AsyncEngine.

GET /v1/models, GET /v1/models/{id}, POST /v1/completions, POST /v1/chat/completions, POST
/v1/responses (responses.py: the chat path underneath; each streamed as SSE or not), GET /health
(200 while the engine loop runs and admits, 503 otherwise), GET /metrics, and vLLM's utility
routes POST /tokenize, POST /detokenize, GET /version (outside /v1, so, as in vLLM, they need no
API key).
With a reasoning parser (reasoning.py), chat replies carry the model's thinking apart from its
answer, as `reasoning_content`.
Every error, ours or the client's, is an OpenAI error body `{"error": {message, type, param, code}}`.
"""

from __future__ import annotations

import asyncio
import configparser
import dataclasses
import hmac
import importlib.metadata
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

from quart import Quart, Response, request
from werkzeug.exceptions import HTTPException
from werkzeug.routing import PathConverter

from minillm.server import protocol, responses, tools
from minillm.server.async_engine import AsyncEngine, EngineFailure, EngineUnavailable
from minillm.server.metrics import Metrics, RequestTimer, request_reason
from minillm.server.protocol import ModelInfo, ParsedRequest, ProtocolError, error_body, sse
from minillm.server.reasoning import Delta, ReasoningSplitter, split_reasoning, think_token_ids

log = logging.getLogger("minillm.server")

MAX_BODY_BYTES = 8 << 20


async def choice_outputs(streams: list) -> AsyncIterator[tuple]:
    """(choice index, RequestOutput) from the request streams of one HTTP request's n choices, in
    the order they arrive; the first failure of any stream is raised."""
    if len(streams) == 1:
        async for out in streams[0]:
            yield 0, out
        return
    waiting = {asyncio.ensure_future(s.__anext__()): i for i, s in enumerate(streams)}
    try:
        while waiting:
            done, _ = await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
            for fut in sorted(done, key=waiting.get):
                i = waiting.pop(fut)
                try:
                    out = fut.result()
                except StopAsyncIteration:
                    continue
                yield i, out
                waiting[asyncio.ensure_future(streams[i].__anext__())] = i
    finally:
        for fut in waiting:
            fut.cancel()


def choice_failed(out, index: int, n: int) -> EngineFailure:
    """A choice the engine ended with finish reason "error" (its structured output's matcher failed
    mid-output: a limit of llguidance's, RequestOutput.error says which), as the failure the
    response reports: a non-streamed response is a 500 with an OpenAI error body naming the
    problem, a stream sends it as an error event, then [DONE] (the paths an engine failure takes).

    vLLM does the same with a finish reason "error" (its serving layer raises GenerationError: a
    500 body, or an error event in a stream): an OpenAI client has no finish reason for it, and a
    200 whose choice stops early would be read as a complete output (with a constraint, one that
    fails to parse). A 500, not a 400: the request was valid and compiled; the limit was met while
    generating. The other choices of the request are aborted (their output is not returned)."""
    what = out.error or "structured output failed mid-output"
    if n > 1:
        what = f"choice {index}: {what}"
    return EngineFailure(f"{what} (after {len(out.token_ids)} output tokens)", "internal_server_error", 500)


def package_version() -> str:
    """minillm's version: the installed distribution's, else setup.cfg's beside the package (a
    source tree on sys.path), else the package's __version__."""
    try:
        return importlib.metadata.version("minillm")
    except importlib.metadata.PackageNotFoundError:
        pass
    cfg = configparser.ConfigParser()
    cfg.read(Path(__file__).resolve().parents[2] / "setup.cfg")
    if cfg.has_option("metadata", "version"):
        return cfg.get("metadata", "version")
    import minillm

    return minillm.__version__


class ModelIdConverter(PathConverter):
    """A URL segment that is a model id: any non-empty text, slashes included, a leading one too."""

    regex = ".+"
    part_isolating = False  # werkzeug infers it from a "/" in the regex: this one has none and spans parts


def _json(body: dict, status: int = 200) -> Response:
    return Response(json.dumps(body), status=status, mimetype="application/json")


def _error(status: int, message: str, type: str, param: str | None = None, code: str | None = None) -> Response:
    return _json(error_body(message, type, param, code), status)


CLIENT_GONE = "minillm.client_gone"  # the scope key of watch_disconnects' event


def watch_disconnects(asgi_app):
    """ASGI middleware: each HTTP request's scope gets an asyncio.Event (scope[CLIENT_GONE]) set
    when the server reports the client gone (`http.disconnect`). Quart cancels the handler then,
    but a cancellation that lands while the handler awaits the body as it completes is lost
    (Python 3.11's asyncio.wait_for returns the finished result and drops it): a client that
    sent a request and closed at once had it generate to the end. The handler checks the event
    before it hands the request to the engine."""

    async def app(scope, receive, send):
        if scope["type"] != "http":
            return await asgi_app(scope, receive, send)
        gone = scope[CLIENT_GONE] = asyncio.Event()

        async def watched_receive():
            message = await receive()
            if message["type"] == "http.disconnect":
                gone.set()
            return message

        return await asgi_app(scope, watched_receive, send)

    return app


def build_app(engine: AsyncEngine, served_model_names: list[str] | None = None, api_key: str | None = None,
              test_hooks: bool = False, max_body_bytes: int = MAX_BODY_BYTES,
              reasoning_parser: str | None = None, tool_call_parser: str = "hermes", cors: dict | None = None,
              prompt_tokens_details: bool = False) -> Quart:
    """reasoning_parser: "qwen3" or "deepseek_r1" (reasoning.PARSERS) to return chat outputs' thinking
    as reasoning_content; None leaves outputs whole (no reasoning_content key). tool_call_parser: how
    tool_choice "auto" reads calls (tools.TOOL_CALL_PARSERS). cors: quart_cors.cors's settings
    (allow_origin, allow_methods, allow_headers, allow_credentials) so browsers on those origins may
    call the API (vLLM's --allowed-origins); None sends no CORS headers. prompt_tokens_details: chat
    and completions usage carries prompt_tokens_details.cached_tokens, the prompt tokens the prefix
    cache held (vLLM's --enable-prompt-tokens-details; the Responses API's usage always does)."""
    if tool_call_parser not in tools.TOOL_CALL_PARSERS:
        raise ValueError(f"unknown tool call parser {tool_call_parser!r}; choose one of "
                         f"{', '.join(tools.TOOL_CALL_PARSERS)}")
    eng = engine.engine
    # structured outputs wait for the thinking to end when the tags are tokens (reasoning.think_token_ids)
    think_ids = think_token_ids(eng.tokenizer, reasoning_parser) if reasoning_parser is not None else None
    if reasoning_parser is not None:
        log.info("reasoning parser %s: output constraints hold %s", reasoning_parser,
                 f"after the thinking (token ids {think_ids})" if think_ids else
                 "from the first token (<think> / </think> are not one token each in this vocabulary)")
    info = ModelInfo(
        names=list(served_model_names or [eng.model_name]), max_model_len=eng.max_model_len,
        vocab_size=eng.config.vocab_size, tokenizer=eng.tokenizer,
        generation_defaults=dict(eng.generation_defaults),
        grammars=getattr(eng, "grammars", None), tool_call_parser=tool_call_parser,
        scheduling_policy=eng.scheduling_policy,
    )
    metrics = Metrics(engine, info.names[0])

    def token_text(token_id: int) -> str:  # a token as logprobs bodies name it
        return info.tokenizer.decode([token_id], skip_special_tokens=False)

    def token_id_text(token_id: int) -> str:  # vLLM's return_tokens_as_token_ids: one name per id
        return f"token_id:{token_id}"

    def with_cached(use: dict, cached: list[int], choices: range) -> dict:
        """usage with prompt_tokens_details (when served with it): the cached prompt tokens of the
        given choices (each prompt's first, as usage counts each prompt's tokens once)."""
        if prompt_tokens_details:
            use["prompt_tokens_details"] = {"cached_tokens": sum(cached[i] for i in choices)}
        return use

    app = Quart("minillm.server")
    app.url_map.converters["model_id"] = ModelIdConverter
    app.config["MAX_CONTENT_LENGTH"] = max_body_bytes
    app.extensions["minillm"] = {"engine": engine, "metrics": metrics, "info": info}
    app.asgi_app = watch_disconnects(app.asgi_app)

    @app.before_serving
    async def start_engine() -> None:
        engine.start()

    @app.after_serving
    async def stop_engine() -> None:
        await engine.stop()

    # ---- errors: everything leaves as an OpenAI error body --------------------------------------
    @app.errorhandler(ProtocolError)
    async def on_protocol_error(e: ProtocolError) -> Response:
        return _json(e.body(), e.status)

    @app.errorhandler(EngineUnavailable)
    async def on_unavailable(e: EngineUnavailable) -> Response:
        return _error(503, str(e), "service_unavailable", code="engine_unavailable")

    @app.errorhandler(HTTPException)
    async def on_http(e: HTTPException) -> Response:
        msg = (f"the request body is larger than {max_body_bytes} bytes" if e.code == 413
               else f"{e.name}: {request.method} {request.path}")
        resp = _error(e.code or 500, msg, "not_found_error" if e.code == 404 else "invalid_request_error")
        if getattr(e, "valid_methods", None):  # a 405 says what the route takes (RFC 9110)
            resp.headers["Allow"] = ", ".join(e.valid_methods)
        if e.code == 413:  # the body was left unread, so the server drops the connection: say so, or a
            resp.headers["Connection"] = "close"  # keep-alive client sends its next request on a dead socket
        return resp

    @app.errorhandler(Exception)
    async def on_bug(e: Exception) -> Response:
        log.exception("unhandled error in %s %s", request.method, request.path)
        return _error(500, f"internal error: {type(e).__name__}: {e}", "internal_server_error")

    if cors is not None:
        from quart_cors import cors as add_cors  # only a server that asks for CORS needs the package

        @app.after_request  # registered first, so it runs after quart_cors's (Quart runs them last first)
        async def drop_empty_expose_headers(resp: Response) -> Response:
            # quart_cors writes the header with no names as '""', which is no header name at all
            if resp.headers.get("Access-Control-Expose-Headers", "").strip('"') == "":
                resp.headers.pop("Access-Control-Expose-Headers", None)
            return resp

        add_cors(app, **cors)

    @app.before_request
    async def check_api_key() -> Response | None:
        # a browser's CORS preflight (OPTIONS) never carries the key: it is answered, the request after it checked
        if api_key is None or not request.path.startswith("/v1/") or request.method == "OPTIONS":
            return None
        auth = request.headers.get("Authorization", "")
        scheme, _, token = auth.partition(" ")
        token = token.strip() if scheme.lower() == "bearer" else ""  # the scheme is case-insensitive (RFC 9110)
        if not hmac.compare_digest(token.encode(), api_key.encode()):
            return _error(401, "invalid or missing API key: send 'Authorization: Bearer <key>'",
                          "invalid_request_error", code="invalid_api_key")
        return None

    # ---- routes --------------------------------------------------------------------------------
    @app.get("/health")
    async def health() -> Response:
        if engine.healthy and engine.accepting:
            return Response("", status=200)
        why = "shutting down" if engine.healthy else f"engine loop stopped: {engine.error!r}"
        return _error(503, why, "service_unavailable")

    @app.get("/metrics")
    async def metrics_route() -> Response:
        data, ctype = metrics.render()
        return Response(data, status=200, content_type=ctype)

    version = package_version()

    started = int(time.time())

    def model_card(name: str) -> dict:  # created: when this server started, as vLLM's cards give it
        return {"id": name, "object": "model", "created": started, "owned_by": "minillm", "root": eng.model_name,
                "max_model_len": info.max_model_len}

    @app.get("/v1/models")
    async def models() -> Response:
        return _json({"object": "list", "data": [model_card(n) for n in info.names]})

    # served names may hold slashes ("org/model") and start with one (a directory's absolute path,
    # the default name): werkzeug's path converter takes neither a leading "/" nor, with
    # merge_slashes on, the "//" after "models"
    @app.get("/v1/models/<model_id:model>", merge_slashes=False)
    async def model_route(model: str) -> Response:
        return _json(model_card(protocol.check_model({"model": model}, info.names)))

    @app.get("/version")
    async def version_route() -> Response:
        return _json({"version": version})

    @app.post("/tokenize")
    async def tokenize() -> Response:
        raw = await request.get_data()
        # a long text or chat takes a while to tokenise: off the event loop, as generation requests do
        return _json(await asyncio.to_thread(lambda: protocol.tokenize_response(protocol.parse_body(raw), info)))

    @app.post("/detokenize")
    async def detokenize() -> Response:
        raw = await request.get_data()
        return _json(await asyncio.to_thread(lambda: protocol.detokenize_response(protocol.parse_body(raw), info)))

    @app.post("/v1/completions")
    async def completions() -> Response:
        return await _generate(chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions() -> Response:
        return await _generate(chat=True)

    @app.post("/v1/responses")
    async def responses_route() -> Response:
        return await _respond()

    @app.route("/v1/responses/<path:response_id>", methods=["GET", "DELETE", "POST"])
    async def stored_response(response_id: str) -> Response:  # retrieve, delete, cancel, input_items
        if response_id == "input_tokens" and request.method == "POST":  # OpenAI's token count: not a response id
            return _error(404, "POST /v1/responses/input_tokens is not served: count a conversation's tokens with "
                          "POST /tokenize and its 'messages'", "not_found_error")
        # OpenAI's routes under a response are {id}, {id}/cancel and {id}/input_items: the id is the first part
        rid = response_id.split("/", 1)[0]
        return _error(404, f"response {protocol.clipped(rid)!r} not found: this server stores no responses (every "
                      "response says \"store\": false); send the whole conversation as 'input'", "not_found_error",
                      "response_id")

    if test_hooks:
        @app.post("/_test/fault")
        async def inject_fault() -> Response:
            raw = await request.get_data()
            body = protocol.parse_body(raw) if raw.strip() else {}
            engine.inject_fault(protocol._get(body, "after_steps", int, 0))
            return _json({"armed": True})

    # ---- generation ----------------------------------------------------------------------------
    async def _accept(parse, rid: str, chat: bool) -> tuple | Response:
        """A generation request's body parsed (parse: the body -> a ParsedRequest, or a request holding
        one as .parsed) -> (what parse gave, its ParsedRequest, a RequestTimer, the client-gone event);
        a 499 Response when the client closed while we parsed."""
        raw = await request.get_data()
        engine.check_admitting()  # 503 before any work when shutting down or failed
        # JSON, tokenising and templating can take a while for long inputs: keep them off the event loop
        got = await asyncio.to_thread(lambda: parse(protocol.parse_body(raw)))
        parsed = got if isinstance(got, ParsedRequest) else got.parsed
        if chat and think_ids and splits_reasoning(parsed):  # a constraint holds from the answer on
            parsed.choices = [(ids, dataclasses.replace(p, think_token_ids=think_ids) if p.structured_outputs else p)
                              for ids, p in parsed.choices]
        if parsed.ignored:  # as vLLM warns: a misspelt field would otherwise change nothing, unseen
            log.warning("%s: fields present in the request but ignored: %s", rid, ", ".join(parsed.ignored))
        timer = metrics.timer()
        gone = request.scope.get(CLIENT_GONE) or asyncio.Event()  # absent: not served through asgi_app
        if gone.is_set():  # closed while we parsed: no engine work, counted as an abort
            timer.done("abort")
            return Response(b"", status=499)  # nginx's "client closed request"; nobody reads it
        return got, parsed, timer, gone

    async def _generate(chat: bool) -> Response:
        rid = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
        accepted = await _accept(lambda body: protocol.parse_request(body, info, chat), rid, chat)
        if isinstance(accepted, Response):
            return accepted
        _, parsed, timer, gone = accepted
        if parsed.stream:
            resp = Response(_sse_events(parsed, rid, chat, timer, gone), mimetype="text/event-stream",
                            headers={"Cache-Control": "no-cache"})
            resp.timeout = None  # streams run as long as generation does
            return resp
        streams = add_choices(rid, parsed)
        n = len(streams)
        texts, reasons, n_outs, cached = [""] * n, ["abort"] * n, [0] * n, [0] * n
        stops: list[int | str | None] = [None] * n
        lps: list[list] = [[] for _ in range(n)]
        out_ids: list[list[int]] = [[] for _ in range(n)]
        prompt_lps: list[list] = [[] for _ in range(n)]
        try:
            async for i, out in choice_outputs(streams):
                timer.output(out)
                cached[i] = out.num_cached_tokens if out.num_cached_tokens is not None else cached[i]
                n_outs[i] = out.output_len
                if out.finished:  # (the whole text is joined once, at the end)
                    texts[i], stops[i] = out.text, out.stop_reason
                reasons[i] = out.finish_reason or reasons[i]
                if out.finish_reason == "error":  # the others are aborted below (finally)
                    raise choice_failed(out, i, n)
                if out.new_logprobs:
                    lps[i].extend(out.new_logprobs)
                    out_ids[i].extend(out.new_token_ids)
                if out.prompt_logprobs:
                    prompt_lps[i] = out.prompt_logprobs
        except EngineFailure as e:
            reasons[0] = "error"
            return _error(e.status, e.message, e.type)
        finally:
            for stream in streams:  # aborts what is unfinished if we were cancelled (client gone)
                stream.close()
            timer.done(request_reason(reasons))
        if parsed.echo_only:  # max_tokens 0: the token the engine generated is dropped
            texts, n_outs, lps, out_ids = [""] * n, [0] * n, [[] for _ in range(n)], [[] for _ in range(n)]
            reasons, stops = ["length" for _ in reasons], [None] * n
        bodies: list[dict | None] = [None] * n
        name = token_id_text if parsed.tokens_as_ids else token_text  # the sampled tokens in logprobs
        if parsed.logprobs:
            bodies = [protocol.chat_logprobs(lp, name) if chat else protocol.completion_logprobs(lp, name)
                      for lp in lps]
        if parsed.echo:  # the prompt first: its text, and its tokens' logprobs (the first one null)
            texts = [parsed.echo_texts[i] + texts[i] for i in range(n)]
            if parsed.logprobs:
                bodies = [protocol.completion_logprobs(prompt_lps[i] + lps[i], name,
                                                       token_ids=parsed.choices[i][0] + out_ids[i],
                                                       top=parsed.top_logprobs)
                          for i in range(n)]
        plps = None
        if parsed.prompt_logprobs is not None:  # chat: one prompt, in the response; completions: each choice's
            plps = [protocol.prompt_logprobs_body(prompt_lps[i], token_text, parsed.prompt_logprobs)
                    for i in range(1 if chat else n)]
        if chat:
            messages = None
            if parsed.tools or reasoning_parser:  # each choice's output read for reasoning and tool calls
                replies = [chat_message(parsed, texts[i], reasons[i], stops[i]) for i in range(n)]
                messages, reasons = [msg for msg, _ in replies], [why for _, why in replies]
            body = protocol.chat_response(rid, protocol.now(), parsed.model, list(zip(texts, reasons, bodies)),
                                          parsed.num_prompt_tokens, sum(n_outs), plps[0] if plps else None, messages,
                                          stops)
        else:
            body = protocol.completion_response(rid, protocol.now(), parsed.model, list(zip(texts, reasons, bodies)),
                                                parsed.num_prompt_tokens, sum(n_outs), plps, stops)
        with_cached(body["usage"], cached, range(0, n, parsed.n))
        return _json(body)

    def splits_reasoning(parsed: ParsedRequest) -> bool:
        """Whether a chat output is split into reasoning and content: with a parser, unless a forced
        tool call ("required", a named function) holds it to the call's JSON from its first token,
        where there is no thinking to find (and a "</think>" would be inside an argument)."""
        return reasoning_parser is not None and not (parsed.tools and parsed.tools.choice != "auto")

    def chat_message(parsed: ParsedRequest, text: str, reason: str | None,
                     stop: int | str | None) -> tuple[dict, str | None]:
        """A whole chat output's message and finish reason: its reasoning apart, tool calls read from
        the content alone (a <tool_call> written while thinking is not a call). stop: the stop string
        or token that ended it, if one did."""
        thought, content = split_reasoning(text, reasoning_parser) if splits_reasoning(parsed) else (None, text)
        if parsed.tools and content is not None:
            message, reason = tools.complete_message(parsed.tools.parser(), content, reason, stop)
        else:
            message = {"role": "assistant", "content": content}
        if reasoning_parser and parsed.include_reasoning:
            message["reasoning_content"] = thought
        return message, reason

    def add_choices(rid: str, parsed: ParsedRequest) -> list:
        """One engine request a choice (ids rid, or rid-0, rid-1, ... for several); all or none
        are added."""
        if len(parsed.choices) == 1:
            return [engine.add(rid, *parsed.choices[0], priority=parsed.priority)]
        streams = []
        try:
            for k, (ids, params) in enumerate(parsed.choices):
                streams.append(engine.add(f"{rid}-{k}", ids, params, priority=parsed.priority))
        except BaseException:
            for stream in streams:
                stream.close()
            raise
        return streams

    async def _sse_events(parsed: ParsedRequest, rid: str, chat: bool, timer: RequestTimer,
                          gone: asyncio.Event) -> AsyncIterator[bytes]:
        created, model, n_prompt = protocol.now(), parsed.model, parsed.num_prompt_tokens
        usage_null = {"usage": None} if parsed.include_usage else {}
        name = token_id_text if parsed.tokens_as_ids else token_text

        def usage_of(i: int) -> dict:
            """What choice i's chunk says of usage: with continuous_usage_stats (vLLM's) its prompt's
            tokens and its completion tokens so far, with include_usage alone null (the totals come
            in a chunk of their own at the end), else nothing."""
            if parsed.continuous_usage:
                return {"usage": with_cached(protocol.usage(len(parsed.choices[i][0]), n_outs[i]), cached, [i])}
            return usage_null

        want_logprobs = parsed.logprobs
        sent_chars = [0] * len(parsed.choices)  # completions' text_offset of each choice's next token

        def chunk(i: int, text: str | None, finish: str | None = None, lps: list | None = None,
                  ids: list[int] | None = None, plps: list | None = None, calls: list | None = None,
                  thought: str = "", stop: int | str | None = None) -> bytes:
            plp = None if plps is None else protocol.prompt_logprobs_body(plps, token_text, parsed.prompt_logprobs)
            if chat:
                delta = {} if text is None else {"content": text}
                if thought:
                    delta["reasoning_content"] = thought
                if calls:
                    delta["tool_calls"] = [c.body() for c in calls]
                lp = protocol.chat_logprobs(lps, name) if lps else None
                return sse({**protocol.chat_chunk(rid, created, model, delta, finish, i, lp, plp, stop), **usage_of(i)})
            lp = (protocol.completion_logprobs(lps, name, sent_chars[i], ids, parsed.top_logprobs)
                  if lps else None)
            if lp:
                sent_chars[i] = lp["text_offset"][-1] + len(lp["tokens"][-1])
            return sse({**protocol.completion_chunk(rid, created, model, text or "", finish, i, lp, plp, stop),
                        **usage_of(i)})

        # the request enters the engine only once the body is being sent: a client gone before that
        # (or a generator never started) leaves nothing running
        if gone.is_set():
            timer.done("abort")
            return
        try:
            streams = add_choices(rid, parsed)
        except EngineUnavailable as e:
            timer.done("error")
            yield sse(error_body(str(e), "service_unavailable", None, 503))
            yield sse("[DONE]")
            return
        n = len(streams)
        reasons, n_outs, cached = ["abort"] * n, [0] * n, [0] * n
        echoed = [not parsed.echo] * n  # whether choice i's prompt went out (in its first chunk)
        # whether choice i's prompt_logprobs went out (in its first chunk after the role's, as its first
        # output carries them; that chunk goes out even with no text, held back by a stop string)
        scored = [parsed.prompt_logprobs is None] * n
        # tool calling: each choice's output goes through its parser (content held back, calls as deltas)
        parsers = [parsed.tools.parser() for _ in range(n)] if parsed.tools else None
        # reasoning: each choice's output split first (the tool parser reads only the content)
        splitters = ([ReasoningSplitter(reasoning_parser) for _ in range(n)]
                     if chat and splits_reasoning(parsed) else None)
        try:
            if chat:  # the first chat chunk of each choice carries the role, as OpenAI's does
                for i in range(n):
                    yield sse({**protocol.chat_chunk(rid, created, model, {"role": "assistant", "content": ""},
                                                     None, i), **usage_of(i)})
            async for i, out in choice_outputs(streams):
                timer.output(out)
                n_outs[i] = out.output_len  # (not len(token_ids): that copies the ids)
                cached[i] = out.num_cached_tokens if out.num_cached_tokens is not None else cached[i]
                text, ids = out.new_text, out.new_token_ids
                lps = out.new_logprobs if want_logprobs else None
                if parsed.echo_only:  # max_tokens 0: the token the engine generated is dropped
                    text, ids, lps, n_outs[i] = "", [], [], 0
                calls, thought = None, ""
                if splitters:
                    delta = splitters[i].feed(text) + (splitters[i].finish() if out.finished else Delta())
                    text, thought = delta.content, delta.reasoning if parsed.include_reasoning else ""
                if parsers:
                    piece = parsers[i].feed(text) + (parsers[i].finish() if out.finished else tools.Piece())
                    text, calls = piece.content, piece.calls
                plps = None
                if not scored[i]:
                    scored[i], plps = True, out.prompt_logprobs or []
                if not echoed[i]:  # the first chunk: the prompt, then what this output adds (as vLLM)
                    echoed[i] = True
                    text = parsed.echo_texts[i] + text
                    if want_logprobs:
                        lps = (out.prompt_logprobs or []) + lps
                        ids = parsed.choices[i][0] + ids
                    yield chunk(i, text, None, lps, ids, plps)
                elif text or calls or thought or lps or plps is not None:  # held-back tokens still send logprobs
                    yield chunk(i, text if text or not (calls or thought) else None, None, lps, ids, plps, calls,
                                thought)
                if out.finished and out.finish_reason == "error":  # its text so far went out above
                    raise choice_failed(out, i, n)
                if out.finished:
                    reasons[i] = "length" if parsed.echo_only else out.finish_reason or "stop"
                    # (the metrics keep the engine's reason: "tool_calls" is the client's name for a stop)
                    why = tools.finish_reason(reasons[i], parsers[i].calls > 0, tools.cut_call(
                        parsers[i], out.stop_reason)) if parsers else reasons[i]
                    yield chunk(i, None, why, stop=None if parsed.echo_only else out.stop_reason)
            if parsed.include_usage:
                last = protocol.usage_chunk(rid, created, model, chat, n_prompt, sum(n_outs))
                with_cached(last["usage"], cached, range(0, n, parsed.n))
                yield sse(last)
            yield sse("[DONE]")
        except EngineFailure as e:
            reasons[0] = "error"
            yield sse(error_body(e.message, e.type, None, e.status))
            yield sse("[DONE]")
        except Exception as e:  # a bug of ours: the client still gets an error event, the log a traceback
            reasons[0] = "error"
            log.exception("stream %s failed", rid)
            yield sse(error_body(f"internal error: {type(e).__name__}: {e}", "internal_server_error", None, 500))
            yield sse("[DONE]")
        finally:
            for stream in streams:  # a client that went away aborts its requests here: blocks freed at once
                stream.close()
            timer.done(request_reason(reasons))

    # ---- the Responses API (responses.py) --------------------------------------------------------
    def response_builder(rid: str, parsed: ParsedRequest) -> responses.ResponseBuilder:
        return responses.ResponseBuilder(rid, ReasoningSplitter(reasoning_parser) if splits_reasoning(parsed) else None,
                                         parsed.tools.parser() if parsed.tools else None)

    def response_logprobs(out) -> list[dict] | None:
        """An output's tokens' logprobs as the Responses API's entries (chat's: token, logprob, bytes,
        top_logprobs), when asked."""
        return protocol.chat_logprobs(out.new_logprobs, token_text)["content"] if out.new_logprobs else None

    def response_body(req: responses.ResponsesRequest, rid: str, created: int, builder: responses.ResponseBuilder,
                      status: str, last=None, first=None, error: dict | None = None) -> dict:
        """The Response object now: its items so far, and with the last output its usage."""
        use = None
        if last is not None:
            ids = last.token_ids
            n_thought = builder.reasoning_tokens(ids, think_ids[1] if think_ids else None, info.tokenizer)
            use = responses.usage(req.parsed.num_prompt_tokens, first.num_cached_tokens or 0, len(ids), n_thought)
        return responses.response_object(rid, created, req.parsed.model, req, status, builder.items(), use, error)

    def parse_response_request(body: protocol.RequestBody) -> responses.ResponsesRequest:
        req = responses.parse(body, info)
        if req.parsed.logprobs and (splits_reasoning(req.parsed) or req.parsed.tools):
            raise ProtocolError("logprobs in a response are served for output that is all message text: this one "
                                "would be read for " + ("reasoning (--reasoning-parser)" if splits_reasoning(req.parsed)
                                                        else "tool calls") +
                                "; /v1/chat/completions returns every token's", "include")
        return req

    async def _respond() -> Response:
        rid = f"resp_{uuid.uuid4().hex}"
        accepted = await _accept(parse_response_request, rid, chat=True)
        if isinstance(accepted, Response):
            return accepted
        req, parsed, timer, gone = accepted
        builder, created = response_builder(rid, parsed), protocol.now()
        if parsed.stream:
            resp = Response(_response_events(req, rid, created, builder, timer, gone), mimetype="text/event-stream",
                            headers={"Cache-Control": "no-cache"})
            resp.timeout = None
            return resp
        streams = add_choices(rid, parsed)
        reason, first, last = "abort", None, None
        try:
            async for _, out in choice_outputs(streams):
                timer.output(out)
                first, last = first or out, out
                if out.finish_reason == "error":
                    raise choice_failed(out, 0, 1)
                builder.feed(out.new_text, out.finished, response_logprobs(out))
                reason = out.finish_reason or reason
        except EngineFailure as e:
            reason = "error"
            return _error(e.status, e.message, e.type)
        finally:
            for stream in streams:
                stream.close()
            timer.done(reason)
        builder.finish(reason != "length", last.stop_reason if last else None)
        status = "incomplete" if reason == "length" else "completed"
        return _json(response_body(req, rid, created, builder, status, last, first))

    async def _response_events(req: responses.ResponsesRequest, rid: str, created: int,
                               builder: responses.ResponseBuilder, timer: RequestTimer,
                               gone: asyncio.Event) -> AsyncIterator[bytes]:
        """A streamed response: response.created, in_progress, each item's events as its text comes,
        then response.completed (or .incomplete at max_output_tokens); a failure is an error event
        and response.failed, as OpenAI sends them."""
        if gone.is_set():
            timer.done("abort")
            return
        try:
            streams = add_choices(rid, req.parsed)
        except EngineUnavailable as e:
            timer.done("error")
            yield responses.event_bytes({"type": "error", "sequence_number": 0, "code": "engine_unavailable",
                                         "message": str(e), "param": None})
            return
        reason, first = "abort", None
        try:
            builder.emit("response.created", response=response_body(req, rid, created, builder, "in_progress"))
            builder.emit("response.in_progress", response=response_body(req, rid, created, builder, "in_progress"))
            for event in builder.take_events():  # at once: not held back until the first token (a long prefill)
                yield responses.event_bytes(event)
            async for _, out in choice_outputs(streams):
                timer.output(out)
                first = first or out
                if out.finish_reason == "error":  # its text so far went out before
                    raise choice_failed(out, 0, 1)
                builder.feed(out.new_text, out.finished, response_logprobs(out))
                if out.finished:
                    reason = out.finish_reason or "stop"
                    builder.finish(reason != "length", out.stop_reason)
                    status = "incomplete" if reason == "length" else "completed"
                    builder.emit(f"response.{status}", response=response_body(req, rid, created, builder, status,
                                                                             out, first))
                for event in builder.take_events():
                    yield responses.event_bytes(event)
        except Exception as e:
            if isinstance(e, EngineFailure):
                message, code = e.message, e.type
            else:  # a bug of ours: the client still gets the failure, the log a traceback
                log.exception("stream %s failed", rid)
                message, code = f"internal error: {type(e).__name__}: {e}", "internal_server_error"
            reason = "error"
            builder.emit("error", code=code, message=message, param=None)
            builder.emit("response.failed", response=response_body(req, rid, created, builder, "failed",
                                                                   error=responses.failure(message, code)))
            for event in builder.take_events():
                yield responses.event_bytes(event)
        finally:
            for stream in streams:
                stream.close()
            timer.done(reason)

    return app
