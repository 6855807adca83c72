"""OpenAI tool calling on the chat endpoint: the request's `tools` / `tool_choice` /
`parallel_tool_calls` checked, the constraint that forces a call, and the model's output turned back
into tool calls, whole or as it streams.

- "none": the tools are still rendered into the prompt (as vLLM does); the output is plain content.
- "auto": the model decides; its output is read for calls in the format `--tool-call-parser` names
  (vLLM's flag): `hermes` (the default), `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`
  (Qwen2.5 / Qwen3 / Hermes chat templates); `llama3_json`, an output that is one or more
  `{"name": ..., "parameters": {...}}` objects separated by `;`, optionally after `<|python_tag|>`
  (Llama 3.1-3.3 templates with JSON tool calling).
- "required" and a named function: the output is forced with a JSON schema (structured outputs):
  a named function's output is its arguments object; "required" gives an array of
  {"name", "arguments"} objects, one a call.

Every parser takes text as it arrives (`feed`) and says what it adds to the reply: content to
show and tool-call deltas (OpenAI's streamed `delta.tool_calls` entries). A reply that is not
streamed is the same parser fed the whole text, so both forms always agree.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, field

from minillm.sampling_params import StructuredOutputsParams

TOOL_CHOICES = ("none", "auto", "required")
TOOL_CALL_PARSERS = ("hermes", "llama3_json")
PYTHON_TAG = "<|python_tag|>"
MAX_TOOLS = 128  # OpenAI's limit
NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")  # OpenAI's rule for function names
OPEN, CLOSE = "<tool_call>", "</tool_call>"
# forced calls are written as json.dumps writes JSON (and Hermes templates show calls): no free
# whitespace, which a model can otherwise repeat until max_tokens (llguidance's schema extension)
COMPACT = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


class ToolError(ValueError):
    """A client error in the tool fields: protocol.py turns it into a 400 naming `param`."""

    def __init__(self, message: str, param: str):
        super().__init__(message)
        self.message, self.param = message, param


def _shown(v) -> str:
    return json.dumps(v)[:80]


# ---- the request ---------------------------------------------------------------------------
def parse_tools(body: dict) -> list[dict] | None:
    """body['tools'] checked: a list of {"type": "function", "function": {"name", "description"?,
    "parameters"? (an object schema)}} with distinct names; None when absent, null or empty. The
    list is what the chat template gets (HF templates take these dicts as `tools`)."""
    tools = body.get("tools")
    if tools is None or tools == []:
        return None
    if not isinstance(tools, list):
        raise ToolError(f"'tools' must be an array of {{\"type\": \"function\", \"function\": {{...}}}} objects, "
                        f"got {_shown(tools)}", "tools")
    if len(tools) > MAX_TOOLS:
        raise ToolError(f"'tools' may list at most {MAX_TOOLS} functions, got {len(tools)}", "tools")
    seen: set[str] = set()
    out = []
    for i, t in enumerate(tools):
        where = f"tools[{i}]"
        if not isinstance(t, dict):
            raise ToolError(f"{where} must be an object {{\"type\": \"function\", \"function\": {{\"name\": ...}}}}, "
                            f"got {_shown(t)}", "tools")
        if t.get("type", "function") != "function":
            raise ToolError(f"{where}.type must be \"function\" (the only kind of tool served), got "
                            f"{_shown(t.get('type'))}", "tools")
        f = t.get("function")
        if not isinstance(f, dict):
            raise ToolError(f"{where}.function must be an object {{\"name\": ..., \"description\": ..., "
                            f"\"parameters\": {{a JSON schema}}}}, got {_shown(f)}", "tools")
        name = f.get("name")
        if not isinstance(name, str) or not NAME.fullmatch(name):
            raise ToolError(f"{where}.function.name must be 1-64 letters, digits, underscores or dashes, got "
                            f"{_shown(name)}", "tools")
        if name in seen:
            raise ToolError(f"{where}.function.name {name!r} is listed twice: each function needs its own name",
                            "tools")
        seen.add(name)
        if f.get("description") is not None and not isinstance(f["description"], str):
            raise ToolError(f"{where}.function.description must be a string, got {_shown(f['description'])}", "tools")
        params = f.get("parameters")
        if params is not None and not (isinstance(params, dict) and params.get("type", "object") == "object"):
            raise ToolError(f"{where}.function.parameters must be a JSON schema of an object ({{\"type\": \"object\", "
                            f"\"properties\": {{...}}}}): a function's arguments are a JSON object; got "
                            f"{_shown(params)}", "tools")
        if f.get("strict") is not None and not isinstance(f["strict"], bool):
            raise ToolError(f"{where}.function.strict must be true or false, got {_shown(f['strict'])}", "tools")
        out.append({"type": "function", "function": f})
    return out


@dataclass
class ToolRequest:
    """A chat request's tool calling: its tools (as the template gets them), and how it calls them."""

    tools: list[dict]
    choice: str  # "none", "auto", "required", or "function" (the named `function`)
    function: str | None = None
    parallel: bool = True
    auto_parser: str = "hermes"  # TOOL_CALL_PARSERS: how "auto" reads the output (the server's flag)

    @property
    def parses(self) -> bool:
        """Whether the output is read for tool calls ("none": it is plain content)."""
        return self.choice != "none"

    def schema(self, name: str) -> dict:
        """The named function's parameters schema ({"type": "object"} when it has none)."""
        f = next(t["function"] for t in self.tools if t["function"]["name"] == name)
        return f.get("parameters") or {"type": "object"}

    def constraint(self) -> StructuredOutputsParams | None:
        """The JSON schema that forces the output ("required" and named functions), else None."""
        if self.choice == "function":
            schema = dict(self.schema(self.function))
        elif self.choice == "required":
            schema = self._array_schema()
        else:
            return None
        extra = schema.get("x-guidance")
        schema["x-guidance"] = {**COMPACT, **(extra if isinstance(extra, dict) else {})}  # the caller's win
        return StructuredOutputsParams(json=schema)

    def alone(self) -> list[tuple[str, StructuredOutputsParams]]:
        """For "required": each function whose parameters hold a local $ref, and the constraint a
        named tool_choice of it gives, to be compiled before the array's. A reference with nothing
        to write ({"$ref": "#"}) fails a named call's first token, but only mid-output inside the
        array, once a call of that function is written. (Cached as a named call's constraint.)"""
        if self.choice != "required":
            return []
        out = []
        for t in self.tools:
            name = t["function"]["name"]
            try:  # (a "$ref": "#..." inside a string is taken too: one compile more, nothing wrong)
                refers = '"$ref": "#' in json.dumps(self.schema(name))
            except RecursionError:
                refers = True  # the compile says it is too deep
            if refers:
                out.append((name, ToolRequest(self.tools, "function", name).constraint()))
        return out

    def _array_schema(self) -> dict:
        """[{"name": f, "arguments": f's parameters}, ...]: anyOf over the tools, at least one call
        (exactly one without parallel_tool_calls). Each function's parameters schema sits under the
        wrapper's $defs, by the function's name (letters, digits, _ and -: nothing to escape in a
        JSON pointer), and its arguments are a $ref to it: the schema's own local references ("#",
        "#/$defs/X", "#/definitions/X", any "#/..." pointer) are rebased onto that copy, so each
        resolves as it does against the schema alone (inlined, they would point into the wrapper)."""
        defs: dict[str, dict] = {}
        items = []
        for t in self.tools:
            name = t["function"]["name"]
            params = self.schema(name)
            for key in ("$defs", "definitions"):
                if not isinstance(params.get(key) or {}, dict):
                    raise ToolError(f"function {name!r}'s parameters: {key} must be an object of named schemas, "
                                    f"got {_shown(params[key])}", "tools")
            try:
                defs[name] = _rebased(params, f"#/$defs/{name}")
            except RecursionError:
                raise ToolError(f"function {name!r}'s parameters are nested too deeply (llguidance takes at most "
                                "~100 levels)", "tools") from None
            items.append({"type": "object", "additionalProperties": False, "required": ["name", "arguments"],
                          "properties": {"name": {"enum": [name]}, "arguments": {"$ref": f"#/$defs/{name}"}}})
        schema: dict = {"type": "array", "minItems": 1, "items": {"anyOf": items}}
        if not self.parallel:
            schema["maxItems"] = 1
        return {**schema, "$defs": defs}

    def parser(self) -> ToolCallParser | None:
        """A fresh parser for one choice's output (None: "none", the output is content)."""
        if self.choice == "function":
            return NamedParser(self.function)
        if self.choice == "required":
            return RequiredParser()
        if self.choice == "auto":
            return Llama3JsonParser(self.parallel) if self.auto_parser == "llama3_json" else HermesParser(self.parallel)
        return None


# a schema's keywords whose values are data, not schemas (a "$ref" key there is not a reference),
# and those whose values map names to schemas (a property may be named "$ref" or "enum")
_DATA_KEYWORDS = frozenset({"const", "enum", "default", "examples"})
_SCHEMA_MAPS = frozenset({"properties", "patternProperties", "$defs", "definitions", "dependentSchemas"})


def _rebased(schema, base: str):
    """A copy of schema whose local references ("#" and "#/...") point into base (a JSON pointer
    fragment, "#/$defs/f") instead of the document's root; other references are left as they are."""
    if isinstance(schema, list):
        return [_rebased(s, base) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {}
    for k, v in schema.items():
        if k == "$ref" and isinstance(v, str) and (v == "#" or v.startswith("#/")):
            out[k] = base + v[1:]
        elif k in _DATA_KEYWORDS:
            out[k] = v
        elif k in _SCHEMA_MAPS and isinstance(v, dict):
            out[k] = {name: _rebased(s, base) for name, s in v.items()}
        else:
            out[k] = _rebased(v, base)
    return out


def parse_tool_request(body: dict) -> ToolRequest | None:
    """A chat body's tools, tool_choice and parallel_tool_calls, checked; None without tools (and a
    tool_choice of "none" or null). tool_choice defaults to "auto" when tools are given."""
    tools = parse_tools(body)
    choice = body.get("tool_choice")
    parallel = body.get("parallel_tool_calls")
    if parallel is not None and not isinstance(parallel, bool):
        raise ToolError(f"'parallel_tool_calls' must be true or false, got {_shown(parallel)}", "parallel_tool_calls")
    if tools is None:
        if choice is None or choice == "none":
            return None
        raise ToolError(f"'tool_choice' {_shown(choice)} needs 'tools': list the functions the model may call, or "
                        "leave tool_choice out", "tool_choice")
    named = None
    if choice is None:
        choice = "auto"
    elif isinstance(choice, dict):
        f = choice.get("function")
        if choice.get("type") != "function" or not isinstance(f, dict) or not isinstance(f.get("name"), str):
            raise ToolError("'tool_choice' must be \"none\", \"auto\", \"required\" or {\"type\": \"function\", "
                            f"\"function\": {{\"name\": ...}}}}, got {_shown(choice)}", "tool_choice")
        names = [t["function"]["name"] for t in tools]
        if f["name"] not in names:
            raise ToolError(f"'tool_choice' names function {f['name']!r}, which is not in 'tools' (it lists "
                            f"{', '.join(names)})", "tool_choice")
        choice, named = "function", f["name"]
    elif choice not in TOOL_CHOICES:
        raise ToolError("'tool_choice' must be \"none\", \"auto\", \"required\" or {\"type\": \"function\", "
                        f"\"function\": {{\"name\": ...}}}}, got {_shown(choice)}", "tool_choice")
    return ToolRequest(tools, choice, named, True if parallel is None else parallel)


def history_fields(m: dict, i: int) -> dict:
    """The tool fields of chat history message i, as templates read them: an assistant's
    `tool_calls` (each call's arguments as an object: HF templates write them with `| tojson`), a
    tool message's `tool_call_id` (required, as OpenAI's) and `name`."""
    where = f"messages[{i}]"
    if m["role"] == "tool":
        tcid = m.get("tool_call_id")
        if not isinstance(tcid, str):
            raise ToolError(f"{where}.tool_call_id must be a string, the id of the call this message answers; got "
                            f"{_shown(tcid)}", f"{where}.tool_call_id")
        out = {"tool_call_id": tcid}
        if m.get("name") is not None:
            if not isinstance(m["name"], str):
                raise ToolError(f"{where}.name must be a string, got {_shown(m['name'])}", f"{where}.name")
            out["name"] = m["name"]
        return out
    calls = m.get("tool_calls")
    if m["role"] != "assistant" or calls is None or calls == []:
        if calls is not None and calls != []:
            raise ToolError(f"{where}.tool_calls: only assistant messages carry tool calls", f"{where}.tool_calls")
        return {}
    if not isinstance(calls, list):
        raise ToolError(f"{where}.tool_calls must be an array of {{\"id\", \"type\": \"function\", \"function\": "
                        f"{{\"name\", \"arguments\"}}}} objects, got {_shown(calls)}", f"{where}.tool_calls")
    out_calls = []
    for j, c in enumerate(calls):
        at = f"{where}.tool_calls[{j}]"
        f = c.get("function") if isinstance(c, dict) else None
        if not isinstance(f, dict) or not isinstance(f.get("name"), str) or not f["name"]:
            raise ToolError(f"{at} must be {{\"id\", \"type\": \"function\", \"function\": {{\"name\", "
                            f"\"arguments\"}}}}, got {_shown(c)}", at)
        if c.get("type", "function") != "function":
            raise ToolError(f"{at}.type must be \"function\", got {_shown(c.get('type'))}", at)
        if not isinstance(c.get("id"), str):
            raise ToolError(f"{at}.id must be a string (the id a tool message answers), got {_shown(c.get('id'))}", at)
        args = f.get("arguments")
        if isinstance(args, str):
            try:
                args = json.loads(args) if args.strip() else {}
            except (ValueError, RecursionError) as e:
                raise ToolError(f"{at}.function.arguments is not JSON ({e}): give the arguments object as a JSON "
                                "string, as the API returned it", at) from None
        elif args is None:
            args = {}
        elif not isinstance(args, dict):
            raise ToolError(f"{at}.function.arguments must be a JSON string (or an object), got {_shown(args)}", at)
        out_calls.append({"id": c["id"], "type": "function", "function": {"name": f["name"], "arguments": args}})
    return {"tool_calls": out_calls}


# ---- the output ----------------------------------------------------------------------------
def call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


@dataclass
class ToolCallDelta:
    """One streamed `delta.tool_calls` entry: a call's first carries its id and name."""

    index: int
    arguments: str = ""
    id: str | None = None
    name: str | None = None

    def body(self) -> dict:
        if self.id is None:
            return {"index": self.index, "function": {"arguments": self.arguments}}
        return {"index": self.index, "id": self.id, "type": "function",
                "function": {"name": self.name, "arguments": self.arguments}}


@dataclass
class Piece:
    """What some output adds to the reply: content text and tool-call deltas."""

    content: str = ""
    calls: list[ToolCallDelta] = field(default_factory=list)

    def __add__(self, other: Piece) -> Piece:
        return Piece(self.content + other.content, _merge(self.calls + other.calls))


def _merge(deltas: list[ToolCallDelta]) -> list[ToolCallDelta]:
    """Adjacent deltas of one call as one (its arguments joined)."""
    out: list[ToolCallDelta] = []
    for d in deltas:
        if out and out[-1].index == d.index and d.id is None:
            out[-1] = ToolCallDelta(d.index, out[-1].arguments + d.arguments, out[-1].id, out[-1].name)
        else:
            out.append(ToolCallDelta(d.index, d.arguments, d.id, d.name))
    return out


class ToolCallParser:
    """Output text in (`feed`, as it arrives, then `finish`), reply pieces out."""

    forced = False  # the whole output is the calls' JSON ("required", a named function)

    def __init__(self):
        self.calls = 0  # tool calls begun so far

    def feed(self, text: str) -> Piece:
        raise NotImplementedError

    def finish(self) -> Piece:
        return Piece()


class NamedParser(ToolCallParser):
    """A named tool_choice: the whole output is the function's arguments object."""

    forced = True

    def __init__(self, name: str):
        super().__init__()
        self.name = name

    def feed(self, text: str) -> Piece:
        if not text:
            return Piece()
        if self.calls:
            return Piece(calls=[ToolCallDelta(0, text)])
        self.calls = 1
        return Piece(calls=[ToolCallDelta(0, text, call_id(), self.name)])

    def finish(self) -> Piece:
        if self.calls:
            return Piece()
        self.calls = 1  # nothing was written (max_tokens ran out first): the call, with no arguments yet
        return Piece(calls=[ToolCallDelta(0, "", call_id(), self.name)])


class _JsonDepth:
    """Nesting depth of JSON text read one character at a time (strings and escapes skipped)."""

    def __init__(self):
        self.depth, self.in_string, self.escaped = 0, False, False

    def step(self, ch: str) -> None:
        if self.in_string:
            if self.escaped:
                self.escaped = False
            elif ch == "\\":
                self.escaped = True
            elif ch == '"':
                self.in_string = False
        elif ch == '"':
            self.in_string = True
        elif ch in "[{":
            self.depth += 1
        elif ch in "]}":
            self.depth -= 1

    def scan(self, text: str) -> None:
        for ch in text:
            self.step(ch)


def _json_str(text: str) -> str | None:
    """A JSON string literal's value; None when it is not one (a bad escape: "\\q")."""
    try:
        return json.loads(text)
    except ValueError:
        return None


# an array element's text up to its arguments' value (the schema puts "name" first)
_HEAD = re.compile(r'\{\s*"name"\s*:\s*("(?:[^"\\]|\\.)*")\s*,\s*"arguments"\s*:\s*', re.S)


class RequiredParser(ToolCallParser):
    """tool_choice "required": the output is [{"name": ..., "arguments": {...}}, ...]. A call's
    header goes out once its name is read, its arguments as they are written."""

    forced = True

    def __init__(self):
        super().__init__()
        self.json = _JsonDepth()
        # the array element's text, kept only while it is needed ("head", "whole"): a list, as adding
        # to a str a character at a time copied it each time (quadratic in huge arguments)
        self.element: list[str] = []
        self.state = ""  # "" (between elements), "head" (before the arguments), "args", "tail", "whole"

    def feed(self, text: str) -> Piece:
        deltas: list[ToolCallDelta] = []
        run: list[str] = []  # the arguments' characters read in this feed: one delta, not one a character
        for ch in text:
            before = self.json.depth
            self.json.step(ch)
            if not self.state:
                if before == 1 and ch == "{":
                    self.element, self.state = ["{"], "head"
                continue
            if self.state in ("head", "whole"):
                self.element.append(ch)
            if self.state == "head" and ch == "{" and before == 2 and self.json.depth == 3:
                m = _HEAD.fullmatch("".join(self.element[:-1]))
                name = _json_str(m.group(1)) if m else None
                if name is not None:
                    deltas.append(ToolCallDelta(self.calls, "{", call_id(), name))
                    self.calls += 1
                    self.state, self.element = "args", []
                else:
                    self.state = "whole"
            elif self.state == "args":
                run.append(ch)
                if self.json.depth == 2:
                    deltas.append(ToolCallDelta(self.calls - 1, "".join(run)))
                    run, self.state = [], "tail"
            if self.json.depth == 1 and ch == "}":  # the element ends
                if self.state in ("head", "whole"):
                    deltas += self._whole("".join(self.element))
                self.element, self.state = [], ""
        if run:
            deltas.append(ToolCallDelta(self.calls - 1, "".join(run)))
        return Piece(calls=_merge(deltas))

    def _whole(self, text: str) -> list[ToolCallDelta]:
        try:
            v = json.loads(text)
        except (ValueError, RecursionError):
            return []
        if not isinstance(v, dict) or not isinstance(v.get("name"), str):
            return []
        args = _args_json(v.get("arguments", {}))
        if args is None:
            return []
        self.calls += 1
        return [ToolCallDelta(self.calls - 1, args, call_id(), v["name"])]


def _args_json(args) -> str | None:
    """args written back as JSON; None when that cannot be strict JSON (NaN / Infinity, which
    json.loads takes but clients' JSON.parse rejects) or nests too deeply to write. A lone surrogate
    the model wrote escaped ("\\ud800") stays escaped: written raw, the reply's own JSON holds an
    unpaired surrogate escape, which strict parsers refuse."""
    try:
        text = json.dumps(args, ensure_ascii=False, allow_nan=False)
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            text = json.dumps(args, allow_nan=False)  # every non-ASCII character escaped, as it came
        return text
    except (ValueError, RecursionError):  # (dumps can fail a little shallower than loads did)
        return None


def _parse_call(text: str) -> tuple[str, str] | None:
    """(name, arguments JSON) of the JSON inside a <tool_call> tag; None when it is not a call."""
    try:
        v = json.loads(text)
    except (ValueError, RecursionError):  # (nested past Python's limit: not a call either)
        return None
    if not isinstance(v, dict) or not isinstance(v.get("name"), str) or not v["name"]:
        return None
    # some models write "parameters" (Llama's key): without this their arguments were silently {}
    args = v["arguments"] if "arguments" in v else v.get("parameters", {})
    if isinstance(args, str):  # some models write the arguments as a JSON string
        try:
            args = json.loads(args)
        except (ValueError, RecursionError):
            return None
    if not isinstance(args, dict):
        return None
    written = _args_json(args)
    return None if written is None else (v["name"], written)


def _tag_prefix(text: str) -> int:
    """Length of the longest end of text that could be the start of OPEN."""
    for k in range(min(len(OPEN) - 1, len(text)), 0, -1):
        if OPEN.startswith(text[-k:]):
            return k
    return 0


class HermesParser(ToolCallParser):
    """tool_choice "auto": content streams as it comes, except text that may be the start of a
    <tool_call> tag (held until it is clear) and whitespace that may come before a tag. A call goes
    out when its closing tag arrives (or the output ends with it open; a closing tag inside one of
    its JSON strings is an argument's text); one whose JSON is not a call stays in the content,
    verbatim. The whitespace around calls is dropped, but for the whitespace before a run of calls
    when text follows them ("Before. <tool_call>..</tool_call> after." gives "Before. after."). Without
    parallel_tool_calls, calls after the first are dropped. When no call is read, the content is
    exactly the output."""

    def __init__(self, parallel: bool = True):
        super().__init__()
        self.parallel = parallel
        self.buf = ""  # text not yet given out
        self.inside = False  # buf is a call's text, after its opening tag
        self.lead = ""  # the whitespace before the open tag (content again if the call is malformed)
        self.after_call = False  # whitespace right after a call is dropped
        self.shown = False  # whether any content went out
        self.sep: str | None = None  # the whitespace before the calls since the last content, if any
        self.scan = 0  # inside: where in buf a close tag may start that was not searched for yet
        # inside, past a close tag that fell inside a JSON string of the call (an argument holding
        # "</tool_call>"): that tag's place in buf, and the JSON read up to self.read
        self.first_close: int | None = None
        self.json = _JsonDepth()
        self.read = 0
        # after a call that went on past a close tag turned out not to be one: close tags end calls
        # again, as without this (its text read again, once: never again, so never quadratic)
        self.plain = False
        # text held after buf, in pieces: adding each piece to one str copied it all each time, quadratic
        # in a huge call or a long run of whitespace (a model stuck writing newlines). Inside, the pieces
        # that cannot hold a close tag (self.tail: the held text's last characters); outside, whitespace
        # after whitespace (held whole, as a tag may follow it)
        self.parts: list[str] = []
        self.tail = ""

    def _text(self, text: str) -> str:
        """Content going out, after the separator that the calls before it took the place of."""
        if not text:
            return ""
        sep, self.sep, self.shown = self.sep or "", None, True
        return sep + text

    def feed(self, text: str) -> Piece:
        if self.inside and CLOSE not in self.tail + text:
            self.parts.append(text)
            self.tail = (self.tail + text)[1 - len(CLOSE):]
            return Piece()
        # (outside, buf ends with whitespace only when it is all whitespace: no prefix of the tag ends so)
        if not self.inside and text.isspace() and (self.parts or self.buf[-1:].isspace()):
            self.parts.append(text)
            return Piece()
        self.buf += "".join(self.parts) + text
        self.parts = []
        out = Piece()
        while True:
            if self.inside:
                # (searched from where the last search stopped: from 0 each time was quadratic in huge arguments)
                j = self.buf.find(CLOSE, self.scan)
                if j < 0:
                    self.scan = max(self.scan, len(self.buf) - len(CLOSE) + 1)
                    self.tail = self.buf[1 - len(CLOSE):]
                    return out
                raw = self.buf[:j]
                if self.first_close is None:
                    call = _parse_call(raw.strip())
                    if call is None and not self.plain and raw.lstrip().startswith("{") and self._in_string(j):
                        self.first_close, self.scan = j, j + len(CLOSE)  # the tag may be an argument's text
                        continue
                else:  # (a close tag inside a string cannot end the call: not parsed)
                    if self._in_string(j):
                        self.scan = j + len(CLOSE)
                        continue
                    call = _parse_call(raw.strip())
                    if call is None:  # not a call after all: it ended at its first close tag, as without this
                        j, self.plain = self.first_close, True
                        raw = self.buf[:j]
                self.buf = self.buf[j + len(CLOSE):]
                self._outside()
                out += self._call(raw, CLOSE, call)
                continue
            if self.after_call:
                self.buf = self.buf.lstrip()
                if not self.buf:
                    return out
                self.after_call = False
            j = self.buf.find(OPEN)
            if j >= 0:
                before = self.buf[:j]
                text_part = before.rstrip()
                out.content += self._text(text_part)
                self.lead, self.buf, self.inside = before[len(text_part):], self.buf[j + len(OPEN):], True
                continue
            keep = _tag_prefix(self.buf)
            shown = self.buf[:len(self.buf) - keep].rstrip()  # trailing whitespace waits: a tag may follow it
            out.content += self._text(shown)
            self.buf = self.buf[len(shown):]
            return out

    def _in_string(self, j: int) -> bool:
        """Whether the close tag at buf[j] falls inside a JSON string of the call's text
        ({"name": "f", "arguments": {"s": "</tool_call>"}}); if so the tag is read as that text."""
        self.json.scan(self.buf[self.read:j])  # (read on from the last tag: linear in the call's text)
        self.read = j
        if not self.json.in_string:
            return False
        self.json.scan(CLOSE)
        self.read = j + len(CLOSE)
        return True

    def _outside(self) -> None:
        self.inside, self.scan, self.first_close, self.json, self.read = False, 0, None, _JsonDepth(), 0

    def _call(self, raw: str, close: str, call: tuple[str, str] | None) -> Piece:
        if call is None:  # not a call: the text as it was
            return Piece(self._text(self.lead + OPEN + raw + close))
        if self.sep is None:
            self.sep = self.lead if self.shown else ""
        self.after_call = True
        if self.calls and not self.parallel:
            return Piece()
        self.calls += 1
        return Piece(calls=[ToolCallDelta(self.calls - 1, call[1], call_id(), call[0])])

    def finish(self) -> Piece:
        self.buf += "".join(self.parts)
        self.parts = []
        if self.inside:  # the output ended inside a tag: a call if its JSON is one (some models stop there)
            raw, self.buf, first = self.buf, "", self.first_close
            self._outside()
            call = _parse_call(raw.strip())
            if call is None and first is not None:
                # not a call: it ended at its first close tag, and the text after that is read again
                self.plain = True
                return self._call(raw[:first], CLOSE, None) + self.feed(raw[first + len(CLOSE):]) + self.finish()
            return self._call(raw, "", call)
        rest, self.buf = ("" if self.after_call else self.buf), ""
        return Piece(self._text(rest))


def _llama3_calls(text: str) -> list[tuple[str, str]] | None:
    """The calls of a whole llama3_json output (after its <|python_tag|>): JSON objects with a string
    "name" and an object "parameters" (or "arguments"), separated by ";" and whitespace; None when
    any part is not such a call."""
    decoder, calls, at = json.JSONDecoder(), [], 0
    while True:
        while at < len(text) and (text[at].isspace() or (calls and text[at] == ";")):
            at += 1
        if at == len(text):
            return calls or None
        try:
            v, at = decoder.raw_decode(text, at)
        except (ValueError, RecursionError):
            return None
        args = v.get("parameters", v.get("arguments")) if isinstance(v, dict) else None
        if isinstance(args, str):  # some models write the arguments as a JSON string
            try:
                args = json.loads(args)
            except (ValueError, RecursionError):
                return None
        if not (isinstance(v, dict) and isinstance(v.get("name"), str) and v["name"] and isinstance(args, dict)):
            return None
        written = _args_json(args)
        if written is None:
            return None
        calls.append((v["name"], written))


class Llama3JsonParser(ToolCallParser):
    """tool_choice "auto" with `--tool-call-parser llama3_json`: decided at the output's start. One
    that opens with `{` or `<|python_tag|>` (after whitespace) is read as calls when it ends (held
    until then); if any part is not a call it is all content, verbatim. Any other output is content,
    streamed as it comes. Without parallel_tool_calls, calls after the first are dropped."""

    def __init__(self, parallel: bool = True):
        super().__init__()
        self.parallel = parallel
        self.buf = ""
        # text after buf, in pieces: the calls' text, or whitespace while undecided (one str grown a piece
        # at a time is quadratic in huge calls or a long run of whitespace)
        self.parts: list[str] = []
        self.mode = ""  # "" undecided, "content", "calls"

    def feed(self, text: str) -> Piece:
        if self.mode == "content":
            return Piece(text)
        # (undecided, buf ends with whitespace only when it is all whitespace)
        if self.mode == "calls" or (text.isspace() and (self.parts or self.buf[-1:].isspace())):
            self.parts.append(text)
            return Piece()
        self.buf += "".join(self.parts) + text
        self.parts = []
        head = self.buf.lstrip()
        if not head or (PYTHON_TAG.startswith(head) and head != PYTHON_TAG):
            return Piece()  # undecided: whitespace, or what may be the start of the tag
        if head.startswith(("{", PYTHON_TAG)):
            self.mode = "calls"
            return Piece()
        self.mode, out, self.buf = "content", self.buf, ""
        return Piece(out)

    def finish(self) -> Piece:
        text, self.buf, self.parts = self.buf + "".join(self.parts), "", []
        if self.mode != "calls":
            return Piece(text)
        head = text.lstrip()
        calls = _llama3_calls(head[len(PYTHON_TAG):] if head.startswith(PYTHON_TAG) else head)
        if calls is None:
            return Piece(text)
        calls = calls if self.parallel else calls[:1]
        self.calls = len(calls)
        return Piece(calls=[ToolCallDelta(i, args, call_id(), name) for i, (name, args) in enumerate(calls)])


# ---- the reply -----------------------------------------------------------------------------
def finish_reason(reason: str | None, called: bool, cut: bool = False) -> str | None:
    """"tool_calls" for an output that ended by itself with calls made; else the engine's reason
    (a call cut by max_tokens is "length", as OpenAI says). cut: a forced call ended by a stop string
    or token before its constraint did, so its arguments are not whole JSON: "stop", since "tool_calls"
    tells a client to run them."""
    return "tool_calls" if called and reason == "stop" and not cut else reason


def cut_call(parser: ToolCallParser, stop_reason: int | str | None) -> bool:
    """Whether a stop string or stop token ended a forced call (finish_reason's cut)."""
    return parser.forced and stop_reason is not None


def complete_message(parser: ToolCallParser, text: str, reason: str | None,
                     stop_reason: int | str | None = None) -> tuple[dict, str | None]:
    """The response message of a whole output and its finish reason (the parser fed it at once)."""
    piece = parser.feed(text) + parser.finish()
    calls = [{"id": d.id, "type": "function", "function": {"name": d.name, "arguments": d.arguments}}
             for d in piece.calls if d.id is not None]
    for d in piece.calls:  # (_merge joined each call's deltas into its first)
        if d.id is None:
            calls[d.index]["function"]["arguments"] += d.arguments
    message: dict = {"role": "assistant", "content": piece.content}
    if calls:
        message["content"] = piece.content if piece.content.strip() else None
        message["tool_calls"] = calls
    return message, finish_reason(reason, bool(calls), cut_call(parser, stop_reason))
