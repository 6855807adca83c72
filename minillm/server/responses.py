"""OpenAI's Responses API (POST /v1/responses) over the chat path.

A Responses body is rewritten as the chat body it means: `instructions` and `input` items become
messages, `max_output_tokens` max_completion_tokens, `text.format` response_format, the flat
function tools chat's nested ones, `reasoning.effort` reasoning_effort, logprobs asked through
`include` chat's logprobs. So it is validated, templated and sampled exactly as
/v1/chat/completions is, and an error that chat's parser raises is renamed into the Responses
fields the client sent (`input[2]`, not `messages[3]`).

The output goes through the same reasoning splitter and tool-call parser; ResponseBuilder turns
what they give into output items (a reasoning item, a message, function calls) and, streamed, into
the typed events OpenAI's SDK reads (response.created ... response.completed), numbered in order.

Nothing is stored: `previous_response_id` and `conversation` are refused (send the conversation as
`input`, as a client with store false does), and the response says `"store": false`.
"""

from __future__ import annotations

import copy
import json
import re
import uuid
from dataclasses import dataclass, field

from minillm.server.protocol import (
    ModelInfo,
    ParsedRequest,
    ProtocolError,
    RequestBody,
    clipped,
    error_body,
    parse_request,
)
from minillm.server.reasoning import Delta, ReasoningSplitter
from minillm.server.tools import Piece, ToolCallDelta, ToolCallParser, _shown, cut_call

INPUT_ROLES = ("user", "system", "developer", "assistant")
# fields a Responses body passes to chat as they are: model, stream, OpenAI's sampling fields and
# vLLM's sampling extensions (which its Responses endpoint takes too)
PASSED_FIELDS = ("temperature", "top_p", "top_k", "min_p", "seed", "stop", "presence_penalty", "frequency_penalty",
                 "repetition_penalty", "logit_bias", "min_tokens", "bad_words", "allowed_token_ids",
                 "include_stop_str_in_output", "ignore_eos", "skip_special_tokens", "stop_token_ids",
                 "structured_outputs", "chat_template_kwargs", "include_reasoning", "priority",
                 "parallel_tool_calls", "stream", "model")
# OpenAI fields that ask for what a stateless text server does not do: refused unless neutral
REFUSED = {
    "previous_response_id": ((None,), "this server stores no responses; send the whole conversation as 'input'"),
    "conversation": ((None,), "this server stores no conversations; send the whole conversation as 'input'"),
    "background": ((None, False), "background responses (this server answers each request on its connection)"),
    "prompt": ((None,), "stored prompt templates; send the text as 'instructions' and 'input'"),
    "truncation": ((None, "disabled"), "only \"disabled\" is served (\"auto\" would drop the conversation's start)"),
    "max_tool_calls": ((None,), "a limit on tool calls; parallel_tool_calls false allows one"),
    "context_management": ((None,), "context management"),
}
# of REFUSED, the fields whose value is an object or array: empty (or all null), it asks for nothing
CONTAINER_FIELDS = ("conversation", "prompt", "context_management")
# OpenAI's include values (an unknown one is a typo, refused as OpenAI does)
INCLUDE_VALUES = ("code_interpreter_call.outputs", "computer_call_output.output.image_url", "file_search_call.results",
                  "message.input_image.image_url", "message.output_text.logprobs", "reasoning.encrypted_content",
                  "web_search_call.action.sources", "web_search_call.results")
# OpenAI's metadata limits: the Response object echoes it, typed as string keys to string values
METADATA_PAIRS, METADATA_KEY_CHARS, METADATA_VALUE_CHARS = 16, 64, 512
SCHEMA_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
# chat's names in its parser's errors -> the Responses fields they came from
RENAMED = (("'max_completion_tokens'", "'max_output_tokens'"), ("max_completion_tokens", "max_output_tokens"),
           ("'response_format'", "'text.format'"), ("response_format", "text.format"), (".function.", "."),
           ("reasoning_effort", "reasoning.effort"))


@dataclass
class ResponsesRequest:
    """A Responses body as chat sees it, and what the response object echoes back."""

    chat: RequestBody  # the chat body it means
    where: list[str]  # where chat message i came from: "instructions" or "input[k]"
    echo: dict  # the request's settings as the response object repeats them
    parsed: ParsedRequest | None = None
    ignored: list[str] = field(default_factory=list)  # nested settings taken but not acted on

    def rename_text(self, text: str) -> str:
        """A text of chat's in the Responses fields the client sent."""
        text = re.sub(r"messages\[(\d+)\]", lambda m: self.where[int(m.group(1))]
                      if int(m.group(1)) < len(self.where) else m.group(0), text)
        for old, new in RENAMED:
            text = text.replace(old, new)
        return text.replace("'messages'", "'input'")

    def rename(self, e: ProtocolError) -> ProtocolError:
        """chat's error in the Responses fields the client sent."""
        param = "input" if e.param == "messages" else self.rename_text(e.param) if e.param else None
        return ProtocolError(self.rename_text(e.message), param, e.status, e.type, e.code)


def _text_parts(content, where: str, kinds: tuple[str, ...]) -> list[dict] | str:
    """An input message's content (where: "input[k].content"), or a call output's: a string, or its
    text parts as chat's text parts."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise ProtocolError(f"{where} must be a string or an array of text parts, got {_shown(content)}", where)
    parts = []
    for j, p in enumerate(content):
        kind = p.get("type") if isinstance(p, dict) else None
        if kind == "refusal" and isinstance(p.get("refusal"), str):
            parts.append({"type": "text", "text": p["refusal"]})
        elif kind in kinds and isinstance(p.get("text"), str):
            parts.append({"type": "text", "text": p["text"]})
        else:
            raise ProtocolError(f"{where}[{j}]: only text parts ({' or '.join(kinds)}, with 'text') are "
                                f"supported, got {_shown(p)}", where)
    return parts


def _messages(body: RequestBody) -> tuple[list[dict], list[str]]:
    """instructions + input as chat messages, and where each came from. Consecutive function_call
    items join the assistant message before them (chat holds a turn's calls in one message);
    reasoning items are left out, as chat templates drop earlier turns' thinking."""
    msgs: list[dict] = []
    where: list[str] = []
    instructions = body.get("instructions")
    if instructions is not None:
        if not isinstance(instructions, str):
            raise ProtocolError(f"'instructions' must be a string, got {_shown(instructions)}", "instructions")
        msgs.append({"role": "system", "content": instructions})
        where.append("instructions")
    given = body.get("input")
    if given is None:
        raise ProtocolError("'input' is required: a string, or an array of input items", "input")
    if isinstance(given, str):
        return msgs + [{"role": "user", "content": given}], where + ["input"]
    if not isinstance(given, list) or not given:
        raise ProtocolError("'input' must be a string or a non-empty array of input items "
                            "({\"role\": \"user\", \"content\": ...}, function_call, function_call_output)", "input")
    calls: set[str] = set()  # the call_ids of the function_call items so far
    for k, item in enumerate(given):
        at = f"input[{k}]"
        if not isinstance(item, dict):
            raise ProtocolError(f"{at} must be an object, got {_shown(item)}", at)
        kind = item.get("type", "message" if "role" in item else None)
        if kind == "message":
            role = item.get("role")
            if role not in INPUT_ROLES:
                raise ProtocolError(f"{at}.role must be one of {', '.join(INPUT_ROLES)}, got {_shown(role)}",
                                    f"{at}.role")
            msgs.append({"role": role, "content": _text_parts(item.get("content"), f"{at}.content",
                                                              ("input_text", "output_text", "text"))})
            where.append(at)
        elif kind == "function_call":
            for key in ("call_id", "name", "arguments"):
                if not isinstance(item.get(key), str):
                    raise ProtocolError(f"{at}.{key} must be a string, got {_shown(item.get(key))}", f"{at}.{key}")
            if not item["name"]:  # (chat's check would name a tool_calls entry the client never sent)
                raise ProtocolError(f"{at}.name must be the name of the function called, got \"\"", f"{at}.name")
            try:
                args = json.loads(item["arguments"]) if item["arguments"].strip() else {}
            except (ValueError, RecursionError) as e:
                raise ProtocolError(f"{at}.arguments is not JSON ({e}): give the call's arguments as the JSON string "
                                    "the response had", f"{at}.arguments") from None
            if not isinstance(args, dict):  # templates read a call's arguments as a mapping
                raise ProtocolError(f"{at}.arguments must be a JSON object (a function's arguments by name), got "
                                    f"{_shown(item['arguments'])}", f"{at}.arguments")
            calls.add(item["call_id"])
            call = {"id": item["call_id"], "type": "function",
                    "function": {"name": item["name"], "arguments": item["arguments"]}}
            if msgs and msgs[-1]["role"] == "assistant":
                msgs[-1].setdefault("tool_calls", []).append(call)
            else:
                msgs.append({"role": "assistant", "content": None, "tool_calls": [call]})
                where.append(at)
        elif kind == "function_call_output":
            if not isinstance(item.get("call_id"), str):
                raise ProtocolError(f"{at}.call_id must be a string, the call_id of the call it answers; got "
                                    f"{_shown(item.get('call_id'))}", f"{at}.call_id")
            output = _text_parts(item.get("output"), f"{at}.output", ("input_text",))
            if item["call_id"] not in calls:  # nothing is stored: the call must be in this input, before its output
                raise ProtocolError(f"{at}.call_id {_shown(item['call_id'])} matches no function_call before it in "
                                    "'input': send the function_call item (as the response gave it) ahead of its "
                                    "output", f"{at}.call_id")
            msgs.append({"role": "tool", "tool_call_id": item["call_id"], "content": output})
            where.append(at)
        elif kind == "reasoning":
            continue
        elif kind == "item_reference":
            raise ProtocolError(f"{at}: item references need stored responses, and this server stores none; send "
                                "the item itself", at)
        else:
            raise ProtocolError(f"{at}.type {_shown(kind)} is not supported: input items are messages, "
                                "function_call, function_call_output and reasoning", f"{at}.type")
    if not msgs:  # reasoning items alone: chat's "must be a non-empty array" would read as wrong
        raise ProtocolError("'input' holds no message, only reasoning items (which are left out of the prompt): add "
                            "the conversation's messages, e.g. {\"role\": \"user\", \"content\": ...}", "input")
    return msgs, where


def _tools(body: RequestBody) -> tuple[list | None, object]:
    """The flat function tools and tool_choice as chat's: {"type": "function", "function": {...}}."""
    tools = body.get("tools")
    choice = body.get("tool_choice")
    out = None
    if tools is not None:
        if not isinstance(tools, list):
            raise ProtocolError(f"'tools' must be an array of function tools, got {_shown(tools)}", "tools")
        out = []
        for i, t in enumerate(tools):
            if not isinstance(t, dict) or t.get("type") != "function":
                kind = t.get("type") if isinstance(t, dict) else t
                raise ProtocolError(f"tools[{i}]: only function tools ({{\"type\": \"function\", \"name\": ..., "
                                    f"\"parameters\": {{...}}}}) are served, got type {_shown(kind)}", "tools")
            out.append({"type": "function",
                        "function": {k: t[k] for k in ("name", "description", "parameters", "strict") if k in t}})
    shape = "\"none\", \"auto\", \"required\" or {\"type\": \"function\", \"name\": ...}"
    if isinstance(choice, dict):
        if choice.get("type") != "function" or not isinstance(choice.get("name"), str):
            raise ProtocolError(f"'tool_choice' must be {shape}, got {_shown(choice)}", "tool_choice")
    elif choice is not None and choice not in ("none", "auto", "required"):  # (chat's message has chat's shape)
        raise ProtocolError(f"'tool_choice' must be {shape}, got {_shown(choice)}", "tool_choice")
    if not out:
        # "auto" is the default the Response object echoes: with no tools it asks for nothing, as at OpenAI
        if choice in (None, "none", "auto"):
            return out, None
        raise ProtocolError(f"'tool_choice' {_shown(choice)} needs 'tools': list the functions the model may call, or "
                            "leave tool_choice out", "tool_choice")
    if isinstance(choice, dict):
        choice = {"type": "function", "function": {"name": choice["name"]}}
    return out, choice


def _text_format(body: RequestBody) -> dict | None:
    """text.format as chat's response_format (None: plain text)."""
    text = body.get("text")
    if text is None:
        return None
    if not isinstance(text, dict):
        raise ProtocolError(f"'text' must be an object {{\"format\": {{...}}}}, got {_shown(text)}", "text")
    if text.get("verbosity") not in (None, "medium"):
        raise ProtocolError(f"'text.verbosity' {_shown(text['verbosity'])} is not supported yet: the model writes "
                            "as it does", "text.verbosity")
    fmt = text.get("format")
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if fmt is None or kind == "text":
        return None
    if kind == "json_object":
        return {"type": "json_object"}
    if kind == "json_schema":
        # (chat's own check would ask for a 'json_schema' key: the Responses format is flat)
        shape = "{\"type\": \"json_schema\", \"name\": ..., \"schema\": {...}}"
        name, schema, strict = fmt.get("name"), fmt.get("schema"), fmt.get("strict")
        if not (isinstance(name, str) and SCHEMA_NAME.fullmatch(name)):
            raise ProtocolError(f"'text.format' of type json_schema needs 'name': 1-64 letters, digits, underscores or "
                                f"dashes (give {shape}), got {_shown(name)}", "text.format")
        if not isinstance(schema, dict):
            raise ProtocolError(f"'text.format' of type json_schema needs 'schema': a JSON schema object (give "
                                f"{shape}), got {_shown(schema)}", "text.format")
        if strict is not None and not isinstance(strict, bool):
            raise ProtocolError(f"'text.format' 'strict' must be true or false, got {_shown(strict)}", "text.format")
        return {"type": "json_schema", "json_schema": {"name": name, "schema": schema, "strict": strict}}
    raise ProtocolError("'text.format' must be {\"type\": \"text\"}, {\"type\": \"json_object\"} or {\"type\": "
                        f"\"json_schema\", \"name\": ..., \"schema\": {{...}}}}, got {_shown(fmt)}", "text.format")


LOGPROBS = "message.output_text.logprobs"


def _include(body: RequestBody, chat: dict) -> list[str]:
    """include's values, checked. message.output_text.logprobs (or top_logprobs above 0) asks chat
    for logprobs; those that ask for nothing this server makes are named as ignored (results of
    hosted tools and image URLs: no such items are ever made; reasoning's encrypted content:
    reasoning items carry their text, nothing is encrypted)."""
    include = body.get("include")
    if include is not None and not (isinstance(include, list) and all(isinstance(x, str) for x in include)):
        raise ProtocolError(f"'include' must be an array of strings, got {_shown(include)}", "include")
    include = include or []
    for x in include:
        if x not in INCLUDE_VALUES:
            raise ProtocolError(f"'include' value {_shown(x)} is not one of OpenAI's: {', '.join(INCLUDE_VALUES)}",
                                "include")
    top = body.get("top_logprobs")
    if LOGPROBS in include or (top is not None and top != 0):
        chat["logprobs"] = True
        if top is not None:
            chat["top_logprobs"] = top
    return [f"include: {x}" for x in include if x != LOGPROBS]


def _reasoning(body: RequestBody) -> tuple[object, list[str]]:
    """reasoning {effort, summary}: the effort is chat's reasoning_effort (a chat template variable,
    named as ignored where the template does not read it); no summaries are written, so a summary
    setting is named as ignored."""
    reasoning = body.get("reasoning")
    if reasoning is None:
        return None, []
    if not isinstance(reasoning, dict):
        raise ProtocolError(f"'reasoning' must be an object {{\"effort\": ..., \"summary\": ...}}, got "
                            f"{_shown(reasoning)}", "reasoning")
    return reasoning.get("effort"), [f"reasoning.{k}" for k, v in reasoning.items() if k != "effort" and v is not None]


def _bookkeeping(body: RequestBody) -> None:
    """metadata, user and store: chat ignores them, but the Response object echoes the first two
    (typed strings: a client reading it back breaks on anything else), so they are checked as
    OpenAI checks them."""
    metadata = body.get("metadata")
    if metadata is not None:
        if not isinstance(metadata, dict):
            raise ProtocolError(f"'metadata' must be an object of string keys to string values, got "
                                f"{_shown(metadata)}", "metadata")
        if len(metadata) > METADATA_PAIRS:
            raise ProtocolError(f"'metadata' holds {len(metadata)} pairs: give at most {METADATA_PAIRS}", "metadata")
        for k, v in metadata.items():
            if len(k) > METADATA_KEY_CHARS:
                raise ProtocolError(f"'metadata' key {clipped(k)!r} has {len(k)} characters: keys take at most "
                                    f"{METADATA_KEY_CHARS}", "metadata")
            if not isinstance(v, str) or len(v) > METADATA_VALUE_CHARS:
                got = f"{len(v)} characters" if isinstance(v, str) else _shown(v)
                raise ProtocolError(f"'metadata.{clipped(k)}' must be a string of at most {METADATA_VALUE_CHARS} "
                                    f"characters, got {got}", "metadata")
    if body.get("user") is not None and not isinstance(body["user"], str):
        raise ProtocolError(f"'user' must be a string, got {_shown(body['user'])}", "user")
    if body.get("store") is not None and not isinstance(body["store"], bool):
        # (true is taken, as the default: the response says "store": false, and nothing is kept)
        raise ProtocolError(f"'store' must be true or false, got {_shown(body['store'])}", "store")


def chat_request(body: RequestBody) -> ResponsesRequest:
    """The chat body a Responses body means (its Responses-only fields checked here)."""
    for name, (neutral, what) in REFUSED.items():
        v = body.get(name)
        empty = name in CONTAINER_FIELDS and (isinstance(v, list) and not v or
                                              isinstance(v, dict) and all(x is None for x in v.values()))
        # by identity for null and booleans: 0 == False, but 'background': 0 is a wrong type, not "no"
        if not (empty or any(v is n if n is None or isinstance(n, bool) else v == n for n in neutral)):
            # the value named: what is refused may be a wrong type, not the feature the message explains
            raise ProtocolError(f"'{name}' {_shown(v)} is not supported: {what}", name)
    opts = body.get("stream_options")
    if opts is not None and not (isinstance(opts, dict) and set(opts) <= {"include_obfuscation"}):
        raise ProtocolError(f"'stream_options' takes only include_obfuscation, got {_shown(opts)}", "stream_options")
    if opts and opts.get("include_obfuscation") is not None and not isinstance(opts["include_obfuscation"], bool):
        raise ProtocolError("'stream_options.include_obfuscation' must be true or false, got "
                            f"{_shown(opts['include_obfuscation'])}", "stream_options.include_obfuscation")
    _bookkeeping(body)
    msgs, where = _messages(body)
    tools, choice = _tools(body)
    chat = {k: body[k] for k in PASSED_FIELDS if body.get(k) is not None}
    chat["messages"] = msgs
    if body.get("max_output_tokens") is not None:
        chat["max_completion_tokens"] = body["max_output_tokens"]
    if (fmt := _text_format(body)) is not None:
        chat["response_format"] = fmt
    if tools is not None:
        chat["tools"] = tools
    if choice is not None:
        chat["tool_choice"] = choice
    ignored = _include(body, chat)
    effort, unused = _reasoning(body)
    if effort is not None:
        chat["reasoning_effort"] = effort
    metadata = body.get("metadata")
    echo = {"instructions": body.get("instructions"), "max_output_tokens": body.get("max_output_tokens"),
            "metadata": metadata if isinstance(metadata, dict) else {},
            "text": {"format": (body.get("text") or {}).get("format") or {"type": "text"}},
            "tool_choice": body.get("tool_choice") or "auto", "tools": body.get("tools") or [],
            "parallel_tool_calls": body.get("parallel_tool_calls") is not False, "user": body.get("user"),
            "reasoning": body.get("reasoning") or None, "top_logprobs": body.get("top_logprobs") or 0}
    return ResponsesRequest(RequestBody(chat), where, echo, ignored=ignored + unused)


def parse(body: RequestBody, info: ModelInfo) -> ResponsesRequest:
    """Validate a whole /v1/responses body: its own fields here, the rest as chat's parser does."""
    req = chat_request(body)
    try:
        req.parsed = parse_request(req.chat, info, chat=True)
    except ProtocolError as e:
        raise req.rename(e) from None
    req.parsed.ignored = sorted(body.unread() + [req.rename_text(x) for x in req.parsed.ignored]) + req.ignored
    return req


def usage(n_prompt: int, n_cached: int, n_out: int, n_reasoning: int) -> dict:
    return {"input_tokens": n_prompt, "input_tokens_details": {"cached_tokens": n_cached},
            "output_tokens": n_out, "output_tokens_details": {"reasoning_tokens": n_reasoning},
            "total_tokens": n_prompt + n_out}


def event_bytes(event: dict) -> bytes:
    """One SSE event as OpenAI sends them: its type as the event name, then the JSON."""
    return f"event: {event['type']}\ndata: {json.dumps(event)}\n\n".encode()


@dataclass
class _Item:
    body: dict  # the output item as it ends up (its text or arguments written in by sync)
    index: int  # its place in the response's output
    pieces: list[str] = field(default_factory=list)  # its text so far (joined once, not grown: that is quadratic)

    def sync(self) -> dict:
        """The body with its text (a message's or reasoning's part) or arguments (a call's) so far."""
        text = "".join(self.pieces)
        if self.body["type"] == "function_call":
            self.body["arguments"] = text
        else:
            self.body["content"][0]["text"] = text
        return self.body


@dataclass
class ResponseBuilder:
    """One output in (`feed` each RequestOutput, then the finish), output items and stream events out.

    Items open as their first text arrives and close when another kind begins: reasoning (from the
    splitter), a message (content; blank content between items is held until something else is
    known, so it opens no item of its own), function calls (one item a call). `events` collects
    what a stream sends, each numbered; a response that is not streamed reads `output`."""

    rid: str
    splitter: ReasoningSplitter | None = None
    parser: ToolCallParser | None = None
    output: list[dict] = field(default_factory=list)
    events: list[dict] = field(default_factory=list)
    seq: int = 0
    _open: _Item | None = None
    _blank: str = ""  # content held back: blank text outside a message
    _logprobs: list[dict] = field(default_factory=list)  # tokens' logprobs not given out yet

    def emit(self, kind: str, **fields) -> None:
        """An event; what it holds must not change after (items go on growing: their added events
        hold copies)."""
        self.events.append({"type": kind, "sequence_number": self.seq, **fields})
        self.seq += 1

    def take_events(self) -> list[dict]:
        out, self.events = self.events, []
        return out

    def feed(self, text: str, finished: bool, logprobs: list[dict] | None = None) -> None:
        """Output text in (and, when asked, its tokens' logprobs as the API's entries: only for output
        that is neither split nor parsed, so that every token is the message's); the items it adds
        (or extends) out, as events."""
        self._logprobs += logprobs or []
        d = Delta(content=text)
        if self.splitter is not None:
            d = self.splitter.feed(text) + (self.splitter.finish() if finished else Delta())
        if d.reasoning:
            self._reasoning(d.reasoning)
        piece = Piece(d.content)
        if self.parser is not None:
            piece = self.parser.feed(d.content) + (self.parser.finish() if finished else Piece())
        if piece.content:
            self._content(piece.content)
        for call in piece.calls:
            self._call(call)

    def reasoning_tokens(self, out_ids: list[int], end_id: int | None, tokenizer) -> int:
        """How many output tokens were thinking: those up to the end tag where it is one token (end_id),
        else the reasoning text's tokens."""
        thought = [p["text"] for item in self.items() if item["type"] == "reasoning" for p in item["content"]]
        if not thought:
            return 0
        if end_id is not None:
            return out_ids.index(end_id) + 1 if end_id in out_ids else len(out_ids)
        return len(tokenizer.encode("".join(thought), add_special_tokens=False))

    def items(self) -> list[dict]:
        """The output items so far (the open one's text written in)."""
        if self._open is not None:
            self._open.sync()
        return self.output

    # ---- items -----------------------------------------------------------------------------
    def _begin(self, body: dict, part: dict | None) -> _Item:
        self._close("completed")
        item = self._open = _Item(body, len(self.output))
        self.output.append(body)
        self.emit("response.output_item.added", output_index=item.index, item=copy.deepcopy(body))
        if part is not None:
            body["content"].append(part)
            self.emit("response.content_part.added", item_id=body["id"], output_index=item.index, content_index=0,
                      part=copy.deepcopy(part))
        return item

    def _reasoning(self, text: str) -> None:
        item = self._open
        if item is None or item.body["type"] != "reasoning":
            item = self._begin({"id": f"rs_{uuid.uuid4().hex}", "type": "reasoning", "summary": [], "content": [],
                                "status": "in_progress"}, {"type": "reasoning_text", "text": ""})
        item.pieces.append(text)
        self.emit("response.reasoning_text.delta", item_id=item.body["id"], output_index=item.index, content_index=0,
                  delta=text)

    def _content(self, text: str, force: bool = False) -> None:
        item = self._open
        if item is None or item.body["type"] != "message":
            if not (text.strip() or force):
                self._blank += text
                return
            text, self._blank = self._blank + text, ""
            item = self._begin({"id": f"msg_{uuid.uuid4().hex}", "type": "message", "status": "in_progress",
                                "role": "assistant", "content": []},
                               {"type": "output_text", "text": "", "annotations": [], "logprobs": []})
        if not text:
            return
        lps, self._logprobs = self._logprobs, []
        item.pieces.append(text)
        item.body["content"][0]["logprobs"] += lps
        self.emit("response.output_text.delta", item_id=item.body["id"], output_index=item.index, content_index=0,
                  delta=text, logprobs=lps)

    def _call(self, call: ToolCallDelta) -> None:
        item = self._open
        if call.id is not None:  # a call's first delta: its own item
            self._blank = ""
            item = self._begin({"id": f"fc_{uuid.uuid4().hex}", "type": "function_call", "status": "in_progress",
                                "call_id": call.id, "name": call.name, "arguments": ""}, None)
        if call.arguments and item is not None and item.body["type"] == "function_call":
            item.pieces.append(call.arguments)
            self.emit("response.function_call_arguments.delta", item_id=item.body["id"], output_index=item.index,
                      delta=call.arguments)

    def _close(self, status: str) -> None:
        item, self._open = self._open, None
        if item is None:
            return
        body = item.sync()
        body["status"] = status
        if body["type"] == "function_call":
            self.emit("response.function_call_arguments.done", item_id=body["id"], output_index=item.index,
                      name=body["name"], arguments=body["arguments"])
        else:
            part = body["content"][0]
            kind = "response.reasoning_text.done" if part["type"] == "reasoning_text" else "response.output_text.done"
            extra = {}
            if part["type"] == "output_text":  # tokens whose text was held back and dropped (a stop string) too
                part["logprobs"] += self._logprobs
                self._logprobs, extra = [], {"logprobs": part["logprobs"]}
            self.emit(kind, item_id=body["id"], output_index=item.index, content_index=0, text=part["text"], **extra)
            self.emit("response.content_part.done", item_id=body["id"], output_index=item.index, content_index=0,
                      part=part)
        self.emit("response.output_item.done", output_index=item.index, item=body)  # (done: it changes no more)

    def finish(self, complete: bool, stop_reason: int | str | None = None) -> None:
        """The output ended (complete: by itself, not cut by max_output_tokens). An output with no
        item at all still gets its (empty, or blank) message, as a chat reply has its content; one
        that only thought has its reasoning item alone, as OpenAI's cut short while reasoning. A forced
        call that a stop string or token ended (stop_reason) is incomplete: its arguments are not whole."""
        if not self.output:
            self._content("", force=True)  # (with the blank text held back, if any)
        if self.parser is not None and cut_call(self.parser, stop_reason):
            complete = False
        self._close("completed" if complete else "incomplete")


def response_object(rid: str, created: int, model: str, req: ResponsesRequest, status: str,
                    output: list[dict], usage: dict | None, error: dict | None = None) -> dict:
    """The Response object: the request's settings, its output items and usage."""
    params = req.parsed.choices[0][1] if req.parsed is not None else None
    return {"id": rid, "object": "response", "created_at": created, "status": status,
            "background": False, "error": error,
            "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
            "model": model, "output": copy.deepcopy(output),  # (the items may grow after)
            "temperature": params.temperature if params else None, "top_p": params.top_p if params else None,
            "previous_response_id": None, "store": False, "truncation": "disabled",
            "max_tool_calls": None, "usage": usage, **req.echo}


def failure(message: str, code: str = "server_error") -> dict:
    """A failed response's error field, and the body a request that is not streamed gets."""
    return error_body(message, "internal_server_error", None, code)["error"]
