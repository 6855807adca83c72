"""The OpenAI wire protocol: request bodies -> (prompt ids, SamplingParams), and response bodies.

Everything a client can get wrong is caught here and raised as ProtocolError (400/404 with the
OpenAI error body), so bad input never reaches the engine and never becomes a 5xx. Unknown
fields are ignored, as vLLM does, and named (ParsedRequest.ignored, which the server logs, as vLLM
does: a misspelt field otherwise changes nothing and goes unseen); known fields minillm cannot honour
yet are refused by name rather than silently dropped.
"""

from __future__ import annotations

import dataclasses
import json
import math
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import jinja2

from minillm.engine.logprobs import MAX_LOGPROBS, TokenLogprob
from minillm.engine.structured import compile_grammar
from minillm.models.tokenizer import content_text, final_message_text
from minillm.sampling_params import SamplingParams, StructuredOutputsParams, truncate_prompt
from minillm.server import tools as tool_calling
from minillm.server.tools import ToolRequest

CHAT_ROLES = ("system", "developer", "user", "assistant", "tool")
MAX_N = 64  # choices per request: each is its own engine request (its own prefill of the prompt,
# unless the prefix cache already holds it)
MAX_CHOICES = 256  # prompts x n of one completions request
# levels of arrays and objects in a request body (the body itself is level 1). json parses ~990
# (Python's recursion limit), but a value echoed back (the Responses API's metadata, tools) is
# encoded again deeper in the stack, where ~900 was a RecursionError: a 500 after the generation,
# or a stream cut off with no error event. 256 leaves room for any JSON schema a grammar compiles
# (llguidance stops near 100 schema levels, two JSON levels each)
MAX_DEPTH = 256


class ProtocolError(Exception):
    """A client error: becomes `{"error": {...}}` with this HTTP status."""

    def __init__(self, message: str, param: str | None = None, status: int = 400,
                 type: str = "invalid_request_error", code: str | None = None):
        super().__init__(message)
        self.message, self.param, self.status, self.type, self.code = message, param, status, type, code

    def body(self) -> dict:
        return error_body(self.message, self.type, self.param, self.code)


def error_body(message: str, type: str = "invalid_request_error", param: str | None = None,
               code: str | int | None = None) -> dict:
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


@dataclass
class ModelInfo:
    """What validation needs to know about the served model (read-only, safe off the engine thread)."""

    names: list[str]
    max_model_len: int
    vocab_size: int
    tokenizer: Any
    generation_defaults: dict = field(default_factory=dict)
    # the engine's GrammarCompiler (engine/structured.py, thread-safe): a request's constraint is
    # compiled in the request's thread, so the engine thread only copies it; None: checked alone
    grammars: Any = None
    # how tool_choice "auto" reads an output for calls (tools.TOOL_CALL_PARSERS; --tool-call-parser)
    tool_call_parser: str = "hermes"
    # --scheduling-policy: a request's priority field is taken under "priority" only
    scheduling_policy: str = "fcfs"


@dataclass
class ParsedRequest:
    model: str
    # every choice's (prompt ids, params), prompt by prompt, n each (SamplingParams.sample_params seeds them)
    choices: list[tuple[list[int], SamplingParams]]
    num_prompt_tokens: int  # every prompt's tokens, counted once (usage)
    stream: bool = False
    include_usage: bool = False
    # vLLM's stream_options.continuous_usage_stats: every chunk carries its choice's usage so far
    continuous_usage: bool = False
    # completions' echo: each choice's text (and, with logprobs, its logprobs) starts with its
    # prompt's; echo_texts[k] is choice k's prompt text. echo_only: max_tokens 0, the prompt alone
    # (the engine generates one token, which is dropped, as vLLM does)
    echo: bool = False
    echo_only: bool = False
    echo_texts: list[str] = field(default_factory=list)
    # vLLM's prompt_logprobs (completions and chat): each choice's prompt tokens' logprobs with the
    # N best (None: not asked). The engine computes max(N, logprobs) with echo (see sampling_params)
    prompt_logprobs: int | None = None
    # chat's tool calling, when its output is read for calls (tool_choice other than "none")
    tools: ToolRequest | None = None
    # vLLM's include_reasoning (chat): with a --reasoning-parser, false leaves reasoning_content out
    # of the reply (the content is still the answer alone)
    include_reasoning: bool = True
    # vLLM's return_tokens_as_token_ids: logprobs name each token "token_id:<id>" (tokens whose
    # text is not whole, e.g. byte pieces of one character, stay apart)
    tokens_as_ids: bool = False
    # vLLM's priority (--scheduling-policy priority): lower is admitted first and preempted last
    priority: int = 0
    n: int = 1  # choices per prompt (choices k*n .. k*n + n - 1 are prompt k's)
    # the body's top-level fields (and stream_options') the parser never looked at (RequestBody.unread)
    ignored: list[str] = field(default_factory=list)

    @property
    def logprobs(self) -> bool:
        """Whether the choices return logprobs (every choice asks alike)."""
        return self.choices[0][1].logprobs is not None

    @property
    def top_logprobs(self) -> int:
        """How many alternatives each logprobs entry lists (echoed prompt tokens included)."""
        return self.choices[0][1].logprobs or 0


# ---- typed field access -------------------------------------------------------------------
_KINDS = {int: "an integer", float: "a number", bool: "a boolean", str: "a string",
          list: "an array", dict: "an object"}


def _get(body: dict, name: str, kind: type, default: Any = None) -> Any:
    """body[name] checked against kind; null or absent gives default. bool is never a number."""
    v = body.get(name)
    if v is None:
        return default
    numeric = (int, float) if kind is float else kind
    ok = isinstance(v, numeric) and not (kind in (int, float) and isinstance(v, bool))
    if not ok:
        raise ProtocolError(f"'{name}' must be {_KINDS[kind]}, got {json.dumps(v)[:80]}", name)
    return float(v) if kind is float else v


def _refuse(body: dict, name: str, allowed: tuple = (None,), what: str | None = None) -> None:
    """Known OpenAI fields the engine cannot honour yet: fine at their neutral value, 400 otherwise."""
    v = body.get(name)
    if v in allowed or (isinstance(v, (dict, list)) and not v and None in allowed):
        return
    raise ProtocolError(f"'{name}' is not supported yet{': ' + what if what else ''}", name)


def clipped(text: str, limit: int = 100) -> str:
    """A client's text as an error message quotes it: a long one cut (an 8 MB name would make an 8 MB error)."""
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


def check_model(body: dict, names: list[str]) -> str:
    """The served name the request asked for (optional: defaults to the first served name)."""
    model = _get(body, "model", str, None)
    if model is None:
        return names[0]
    if model not in names:
        raise ProtocolError(f"The model `{clipped(model)}` does not exist. This server serves: {', '.join(names)}",
                            "model", status=404, code="model_not_found")
    return model


# OpenAI's fields that only label a request for the caller's own records: ignored without a word
BOOKKEEPING_FIELDS = frozenset({"user", "metadata", "store", "service_tier", "safety_identifier"})


class RequestBody(dict):
    """A request's JSON object that remembers which of its fields the parser looked at (get, [],
    in), so that the ones it ignored can be named."""

    def __init__(self, body: dict):
        super().__init__(body)
        self.looked_at: set = set()

    def get(self, key, default=None):
        self.looked_at.add(key)
        return super().get(key, default)

    def __getitem__(self, key):
        self.looked_at.add(key)
        return super().__getitem__(key)

    def __contains__(self, key):
        self.looked_at.add(key)
        return super().__contains__(key)

    def unread(self) -> list[str]:
        """The fields never looked at, bookkeeping ones aside, sorted."""
        return sorted(k for k in self.keys() if k not in self.looked_at and k not in BOOKKEEPING_FIELDS)


def parse_body(raw: bytes) -> RequestBody:
    def no_constants(c: str):
        raise ValueError(f"{c} is not valid JSON")

    try:
        body = json.loads(raw, parse_constant=no_constants)
    except (ValueError, UnicodeDecodeError) as e:
        if "integer string conversion" in str(e):  # Python's advice (sys.set_int_max_str_digits) is the server's
            raise ProtocolError(f"the request body holds an integer of more than {sys.get_int_max_str_digits()} "
                                "digits; no field takes one that large") from None
        raise ProtocolError(f"the request body is not valid JSON: {e}") from None
    except RecursionError:
        raise ProtocolError(f"the request body is nested too deeply to parse: send at most {MAX_DEPTH} levels of "
                            "arrays and objects") from None
    if not isinstance(body, dict):
        raise ProtocolError("the request body must be a JSON object")
    _check_values(body)
    return RequestBody(body)


def _check_values(body: dict) -> None:
    """Refuse strings with a lone surrogate (JSON's "\\ud800" escape unpaired): they are not text,
    and the tokenizer, templates and stop matching would fail on them deep inside the engine. And
    numbers beyond a double's range (1e999): json reads them as infinity, which parse_constant
    does not see, and a field echoed back (the Responses API's metadata, user, tools) would put a
    bare Infinity, which is not JSON, in a 200's body. And nesting deeper than MAX_DEPTH."""
    stack: list[tuple[str, Any, int]] = [(k, v, 1) for k, v in body.items()]
    stack += [(k, k, 1) for k in body]  # the keys too
    while stack:  # iterative: the parser takes ~990 levels, more than MAX_DEPTH
        where, v, depth = stack.pop()
        if depth >= MAX_DEPTH and isinstance(v, (dict, list)):  # (the body is level 1, its fields' values depth 1)
            raise ProtocolError(f"'{where}' is nested too deeply: send at most {MAX_DEPTH} levels of arrays and "
                                "objects", where)
        if isinstance(v, float) and not math.isfinite(v):
            raise ProtocolError(f"'{where}' holds a number beyond a double's range (it would be {v}); send numbers "
                                "within +-1.8e308", where)
        if isinstance(v, str):
            if not v.isascii():
                try:
                    v.encode("utf-8")
                except UnicodeEncodeError as e:
                    raise ProtocolError(f"'{where}' holds a string that is not valid Unicode (a lone surrogate "
                                        f"{v[e.start]!a} at character {e.start}); send text as UTF-8, or "
                                        "escape characters outside the BMP as surrogate pairs", where) from None
        elif isinstance(v, dict):
            stack += [(where, x, depth + 1) for x in v.values()] + [(where, k, depth) for k in v]
        elif isinstance(v, list):
            stack += [(where, x, depth + 1) for x in v]


# ---- prompts ------------------------------------------------------------------------------
def _check_ids(ids: list, info: ModelInfo, param: str) -> list[int]:
    for t in ids:
        if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < info.vocab_size:
            raise ProtocolError(f"'{param}' token ids must be integers in [0, {info.vocab_size}); got "
                                f"{json.dumps(t)[:40]}", param)
    return list(ids)


def completion_prompts(body: dict, info: ModelInfo) -> list[tuple[list[int], str | None]]:
    """'prompt': a string, an array of token ids, or a batch (an array of either): the ids of each,
    with its text where it was given as a string (tokenized with the tokenizer's special tokens, e.g.
    a BOS, unless vLLM's add_special_tokens is false)."""
    special = _get(body, "add_special_tokens", bool, True)
    p = body.get("prompt")
    batch = p if isinstance(p, list) and p and all(isinstance(x, (str, list)) for x in p) else [p]
    if len(batch) > MAX_CHOICES:
        raise ProtocolError(f"at most {MAX_CHOICES} prompts in one request, got {len(batch)}", "prompt")
    out = []
    for x in batch:
        if isinstance(x, str):
            ids = info.tokenizer.encode(x, add_special_tokens=special)
        elif isinstance(x, list):
            ids = _check_ids(x, info, "prompt")
        elif x is None:
            raise ProtocolError("'prompt' is required", "prompt")
        else:
            raise ProtocolError("'prompt' must be a string, an array of token ids, or an array of either",
                                "prompt")
        if not ids:
            raise ProtocolError("'prompt' is empty: give at least one token", "prompt")
        out.append((ids, x if isinstance(x, str) else None))
    return out


def _content(m: dict, i: int) -> str:
    c = m.get("content")
    if c is None and m["role"] == "assistant":
        return ""
    if (text := content_text(c)) is not None:
        return text
    if isinstance(c, list):
        raise ProtocolError(f"messages[{i}].content: only text parts ({{\"type\": \"text\", \"text\": ...}}) "
                            "are supported", f"messages[{i}].content")
    if c is None:
        raise ProtocolError(f"messages[{i}].content is missing (or null): a {m['role']} message needs its text, "
                            "a string or an array of text parts", f"messages[{i}].content")
    raise ProtocolError(f"messages[{i}].content must be a string or an array of text parts",
                        f"messages[{i}].content")


# what the chat template is rendered with already (and its globals): not for chat_template_kwargs
_TEMPLATE_RESERVED = ("messages", "add_generation_prompt", "bos_token", "eos_token", "raise_exception",
                      "strftime_now")


def chat_template_kwargs(body: dict) -> dict:
    """vLLM's chat_template_kwargs: extra variables for the chat template (Qwen3's
    {"enable_thinking": false}, ...), an object whose keys are identifiers the template does not
    already get."""
    kw = body.get("chat_template_kwargs")
    if kw is None:
        return {}
    if not isinstance(kw, dict):
        raise ProtocolError(f"'chat_template_kwargs' must be an object, got {json.dumps(kw)[:80]}",
                            "chat_template_kwargs")
    for k in kw:
        if not k.isidentifier() or k in _TEMPLATE_RESERVED:
            raise ProtocolError(f"'chat_template_kwargs' key {json.dumps(k)[:40]} is not allowed: keys are template "
                                f"variable names other than {', '.join(_TEMPLATE_RESERVED)}", "chat_template_kwargs")
    return kw


def tool_fields(fn, *args):
    """fn(*args) from minillm/server/tools.py, its ToolError as a ProtocolError."""
    try:
        return fn(*args)
    except tool_calling.ToolError as e:
        raise ProtocolError(e.message, e.param) from None


def chat_prompt(body: dict, info: ModelInfo, add_generation_prompt: bool = True,
                add_special_tokens: bool = False, tools: list[dict] | None = None) -> list[int]:
    """The ids of body['messages'] rendered by the chat template (what the chat endpoint prefills),
    with body's chat_template_kwargs and continue_final_message (vLLM's: the last message left open
    for the model to continue, no generation prompt; with add_generation_prompt given as true too, a
    400 as in vLLM), and `tools` (the checked function list) as the template's `tools`."""
    # vLLM refuses a request's own template unless started with --trust-request-chat-template; this
    # server has no such flag: its template is the model's or --chat-template's
    _refuse(body, "chat_template", (None,), "a request's own chat template; start the server with "
            "--chat-template to use another")
    cont = _get(body, "continue_final_message", bool, False)
    if cont and body.get("add_generation_prompt") is True:
        raise ProtocolError("'continue_final_message' and 'add_generation_prompt' cannot both be true: the "
                            "final message is either continued or answered; set add_generation_prompt to false",
                            "continue_final_message")
    msgs = body.get("messages")
    if msgs is None:
        raise ProtocolError("'messages' is required", "messages")
    if not isinstance(msgs, list) or not msgs:
        raise ProtocolError("'messages' must be a non-empty array of {role, content} objects", "messages")
    clean = []
    for i, m in enumerate(msgs):
        if not isinstance(m, dict):
            raise ProtocolError(f"messages[{i}] must be an object with 'role' and 'content'", f"messages[{i}]")
        if m.get("role") not in CHAT_ROLES:
            raise ProtocolError(f"messages[{i}].role must be one of {', '.join(CHAT_ROLES)}; got "
                                f"{json.dumps(m.get('role'))[:40]}", f"messages[{i}].role")
        clean.append({"role": m["role"], "content": _content(m, i), **tool_fields(tool_calling.history_fields, m, i)})
    if cont:
        try:
            final_message_text(clean)
        except ValueError as e:
            raise ProtocolError(f"{e}; messages[{len(clean) - 1}] has none", "continue_final_message") from None
    template_kwargs = chat_template_kwargs(body)
    if tools is not None:
        template_kwargs = {**template_kwargs, "tools": tools}
    effort = _get(body, "reasoning_effort", str, None)  # OpenAI's; a template variable, as vLLM gives it
    if effort is not None:
        template_kwargs = {"reasoning_effort": effort, **template_kwargs}
    try:
        ids = info.tokenizer.encode_chat(clean, add_generation_prompt, add_special_tokens, template_kwargs,
                                         continue_final_message=cont)
    except (jinja2.TemplateError, ValueError) as e:  # the template's own raise_exception, or no template
        raise ProtocolError(f"the chat template rejected the messages: {e}", "messages") from None
    if not ids:
        raise ProtocolError("the chat template produced an empty prompt", "messages")
    return ids


# ---- /tokenize and /detokenize (vLLM's utility endpoints) ---------------------------------
def tokenize_response(body: dict, info: ModelInfo) -> dict:
    """POST /tokenize, as vLLM's: {"prompt": str, "add_special_tokens" (default true)} or {"messages",
    "add_generation_prompt" (default true), "add_special_tokens" (default false: the template writes
    its own)}, both with "return_token_strs"; -> {"count", "max_model_len", "tokens"} (+ "token_strs",
    each id's vocabulary entry, when asked). With its defaults the chat form gives exactly the ids
    the chat endpoint prefills. No length limit: counting a prompt too long to serve is what clients ask this for."""
    check_model(body, info.names)
    has_prompt, has_messages = body.get("prompt") is not None, body.get("messages") is not None
    if has_prompt and has_messages:
        raise ProtocolError("give either 'prompt' (text) or 'messages' (a chat), not both", "prompt")
    if has_messages:
        _refuse(body, "chat_template", (None,), "a chat template given in the request")
        ids = chat_prompt(body, info, _get(body, "add_generation_prompt", bool, True),
                          _get(body, "add_special_tokens", bool, False), tool_fields(tool_calling.parse_tools, body))
    elif has_prompt:
        prompt = body["prompt"]
        if not isinstance(prompt, str):
            raise ProtocolError(f"'prompt' must be a string, got {json.dumps(prompt)[:80]}", "prompt")
        ids = info.tokenizer.encode(prompt, add_special_tokens=_get(body, "add_special_tokens", bool, True))
    else:
        raise ProtocolError("'prompt' (text) or 'messages' (a chat) is required", "prompt")
    out = {"count": len(ids), "max_model_len": info.max_model_len, "tokens": ids}
    if _get(body, "return_token_strs", bool, False):
        out["token_strs"] = info.tokenizer.convert_ids_to_tokens(ids)
    return out


def detokenize_response(body: dict, info: ModelInfo) -> dict:
    """POST /detokenize, as vLLM's: {"tokens": [ids]} -> {"prompt": text}, special tokens kept (as
    vLLM decodes them; "skip_special_tokens": true drops them), so tokenize then detokenize gives the
    text back. Every id must be one the tokenizer has a token for."""
    check_model(body, info.names)
    tokens = body.get("tokens")
    if tokens is None:
        raise ProtocolError("'tokens' is required: an array of token ids", "tokens")
    if not isinstance(tokens, list):
        raise ProtocolError(f"'tokens' must be an array of token ids, got {json.dumps(tokens)[:80]}", "tokens")
    ids = _check_ids(tokens, info, "tokens")
    _check_known_ids(ids, info)
    skip = _get(body, "skip_special_tokens", bool, False)
    return {"prompt": info.tokenizer.decode(ids, skip_special_tokens=skip)}


def _check_known_ids(ids: list[int], info: ModelInfo) -> None:
    """/detokenize: an id below the model's vocab_size that the tokenizer has no entry for (the
    embedding rows past the tokenizer's vocabulary, padded to a round size) has no text; decoding
    would drop it without a word."""
    hf = info.tokenizer.tok
    base = hf.get_vocab_size(with_added_tokens=False)
    for t in sorted({t for t in ids if t >= base}):
        if hf.id_to_token(t) is None:
            raise ProtocolError(f"'tokens' holds {t}, an id the tokenizer has no token for (its vocabulary has "
                                f"{hf.get_vocab_size(with_added_tokens=True)} entries; the model's "
                                f"{info.vocab_size})", "tokens")


# ---- sampling -----------------------------------------------------------------------------
def sampling_params(body: dict, n_prompt: int, info: ModelInfo, chat: bool,
                    index: int | None = None, tools: ToolRequest | None = None) -> SamplingParams:
    """The request's SamplingParams for one prompt of n_prompt tokens (index: its place in a batch of
    prompts, named in the errors that depend on its length); tools: chat's tool calling, whose
    "required" or named tool_choice constrains the output."""
    prompt_param = "messages" if chat else "prompt"
    the_prompt = "the prompt" if index is None else f"prompt {index} of the batch"
    room = info.max_model_len - n_prompt
    if room < 1:
        raise ProtocolError(f"{the_prompt} has {n_prompt} tokens; this model's maximum context length is "
                            f"{info.max_model_len} tokens, which leaves no room for output", prompt_param,
                            code="context_length_exceeded")
    name = "max_completion_tokens" if chat and body.get("max_completion_tokens") is not None else "max_tokens"
    max_tokens = _get(body, name, int, None)
    echo = not chat and _get(body, "echo", bool, False)
    if max_tokens is None:
        max_tokens = room  # vLLM's default: whatever the context has left
    elif max_tokens == 0 and echo:  # score the prompt, generate nothing (lm-evaluation-harness)
        if _get(body, "min_tokens", int, 0):
            raise ProtocolError("'min_tokens' must be 0 when 'max_tokens' is 0", "min_tokens")
        max_tokens = 1  # as vLLM does: one token is generated and dropped (ParsedRequest.echo_only)
    elif max_tokens < 1:
        raise ProtocolError(f"'{name}' must be >= 1{'' if chat else ' (or 0 with echo)'}, got {max_tokens}", name)
    elif max_tokens > room:
        raise ProtocolError(f"this model's maximum context length is {info.max_model_len} tokens; {the_prompt} "
                            f"has {n_prompt} and {name} asks for {max_tokens} more; lower {name} to at most "
                            f"{room}", name, code="context_length_exceeded")

    n = _get(body, "n", int, 1)
    if not 1 <= n <= MAX_N:
        raise ProtocolError(f"'n' must be between 1 and {MAX_N}, got {n}", "n")
    # checked as an integer first: _refuse alone takes true (== 1), 1.0 and empty arrays as neutral
    if _get(body, "best_of", int, None) not in (None, 1, n):
        _refuse(body, "best_of", (None,), "best_of other than n (choosing among more samples)")
    # vLLM's extensions that change what is sampled: refused by name rather than silently ignored
    _refuse(body, "use_beam_search", (None, False), "beam search")
    _refuse(body, "logits_processors", (None,), "custom logits processors")
    _refuse(body, "guided_whitespace_pattern", (None,), "a JSON whitespace pattern (disable_any_whitespace is)")
    if chat:
        # OpenAI's deprecated function calling: its functions would not reach the template, so refuse them
        _refuse(body, "functions", (None,), "the deprecated functions field; give them as 'tools'")
        _refuse(body, "function_call", (None, "none"), "the deprecated function_call field; use 'tool_choice'")
        _refuse(body, "echo", (None, False), "vLLM's chat echo (the last message prepended to the reply)")
        _refuse(body, "documents", (None,), "documents for the chat template")
    structured = structured_outputs(body, info.grammars)
    skip_special = True
    if tools is not None:
        structured = tool_constraint(tools, structured, info)
        skip_special = not (tools.choice == "auto" and _special_tag(info))
    if chat:
        top = _get(body, "top_logprobs", int, None)
        if _get(body, "logprobs", bool, False):
            logprobs = 0 if top is None else top
        elif top is not None:
            raise ProtocolError("'top_logprobs' needs 'logprobs': true", "top_logprobs")
        else:
            logprobs = None
        lp_name = "top_logprobs"
    else:
        logprobs = _get(body, "logprobs", int, None)
        lp_name = "logprobs"
        _refuse(body, "suffix", (None, ""))
    if logprobs is not None and not 0 <= logprobs <= MAX_LOGPROBS:
        raise ProtocolError(f"'{lp_name}' must be between 0 and {MAX_LOGPROBS}, got {logprobs}", lp_name)
    prompt_logprobs = _get(body, "prompt_logprobs", int, None)  # vLLM's extension field
    if prompt_logprobs is not None and not 0 <= prompt_logprobs <= MAX_LOGPROBS:
        raise ProtocolError(f"'prompt_logprobs' must be between 0 and {MAX_LOGPROBS}, got {prompt_logprobs}",
                            "prompt_logprobs")
    if echo and logprobs is not None:  # echo's logprobs are the prompt's too: one computation serves both
        prompt_logprobs = max(logprobs, prompt_logprobs or 0)
    adjust = dict(presence_penalty=_get(body, "presence_penalty", float, 0.0),
                  frequency_penalty=_get(body, "frequency_penalty", float, 0.0),
                  repetition_penalty=_get(body, "repetition_penalty", float, 1.0))
    bias = _get(body, "logit_bias", dict, None)
    if bias:
        if len(bias) > 300:
            raise ProtocolError(f"'logit_bias' may name at most 300 tokens, got {len(bias)}", "logit_bias")
        parsed_bias = {}
        for k, v in bias.items():
            # the digits counted before int(): CPython's int() refuses a string of over 4,300 digits
            digits = (k.lstrip("0") or "0") if isinstance(k, str) and k.isascii() and k.isdigit() else ""
            if not (digits and len(digits) <= len(str(info.vocab_size)) and int(digits) < info.vocab_size):
                raise ProtocolError(f"'logit_bias' keys must be token ids below {info.vocab_size}, got "
                                    f"{json.dumps(k)[:40]}", "logit_bias")
            if not (isinstance(v, (int, float)) and not isinstance(v, bool) and -100 <= v <= 100):
                raise ProtocolError(f"'logit_bias' values must be numbers in [-100, 100], got {json.dumps(v)[:40]}",
                                    "logit_bias")
            parsed_bias[int(digits)] = float(v)
        adjust["logit_bias"] = parsed_bias

    d = info.generation_defaults  # the model's generation_config fills what the request leaves out
    temperature = _get(body, "temperature", float, float(d.get("temperature", 1.0)))
    top_p = _get(body, "top_p", float, float(d.get("top_p", 1.0)))
    top_k = _get(body, "top_k", int, int(d.get("top_k", -1)))
    min_p = _get(body, "min_p", float, float(d.get("min_p") or 0.0))  # vLLM's extension field
    stop = body.get("stop")
    if stop is not None and not (isinstance(stop, str) or (isinstance(stop, list)
                                                           and all(isinstance(s, str) for s in stop))):
        raise ProtocolError("'stop' must be a string or an array of strings", "stop")
    stop_ids = _get(body, "stop_token_ids", list, [])
    _check_ids(stop_ids, info, "stop_token_ids")
    allowed = _get(body, "allowed_token_ids", list, None)  # vLLM's extension field
    if allowed is not None:
        if not allowed:
            raise ProtocolError("'allowed_token_ids' must name at least one token (leave it out to allow all)",
                                "allowed_token_ids")
        _check_ids(allowed, info, "allowed_token_ids")
    if top_k >= info.vocab_size:
        top_k = -1  # keeps every token anyway; and the engine holds top_k in an int32
    seed = _get(body, "seed", int, None)
    if seed is not None:
        if not -(1 << 63) <= seed < (1 << 64):
            raise ProtocolError(f"'seed' must be a 64-bit integer, got {seed}", "seed")
        seed &= (1 << 64) - 1  # the engine's sampler takes an unsigned 64-bit seed
    bad_words = _get(body, "bad_words", list, None) or None
    blank = next((w for w in bad_words or () if isinstance(w, str) and w and not w.strip()), None)
    if blank is not None:  # (SamplingParams' own message would call it empty)
        raise ProtocolError(f"'bad_words' holds {json.dumps(blank)[:40]}, which is only whitespace: a word is matched "
                            "with its leading whitespace stripped (as vLLM tokenizes it), which leaves nothing to ban; "
                            "give words with text", "bad_words")
    kwargs = dict(
        max_tokens=max_tokens, temperature=temperature, top_p=top_p, top_k=top_k, min_p=min_p,
        min_tokens=_get(body, "min_tokens", int, 0), stop=stop, stop_token_ids=stop_ids,
        ignore_eos=_get(body, "ignore_eos", bool, False), seed=seed,
        skip_special_tokens=_get(body, "skip_special_tokens", bool, skip_special), logprobs=logprobs,
        include_stop_str_in_output=_get(body, "include_stop_str_in_output", bool, False),
        prompt_logprobs=prompt_logprobs, structured_outputs=structured, allowed_token_ids=allowed,
        bad_words=bad_words, n=n, **adjust,
    )
    try:
        params = SamplingParams(**kwargs)
    except ValueError as e:  # SamplingParams names the field first: "top_p must be in (0, 1] ..."
        msg = str(e)
        param = msg.split(" ", 1)[0]
        raise ProtocolError(msg, param if param in kwargs else None) from None
    return params


def tool_constraint(tools: ToolRequest, structured: StructuredOutputsParams | None,
                    info: ModelInfo) -> StructuredOutputsParams | None:
    """The output constraint of a request with tools: a "required" or named tool_choice's JSON
    schema (compiled here, so a schema llguidance refuses is a 400 naming 'tools'), else the
    request's own (`structured`, which cannot be combined with a forced call)."""
    forced = tool_fields(tools.constraint)
    if forced is None:
        return structured
    if structured is not None:
        raise ProtocolError("a 'tool_choice' that forces a call (\"required\" or a named function) already constrains "
                            "the output: leave out response_format / structured_outputs, or use tool_choice \"auto\"",
                            "tool_choice")
    for function, so in tool_fields(tools.alone) + [(tools.function, forced)]:
        try:
            if info.grammars is not None:
                info.grammars.matcher(so)
            else:
                compile_grammar(so)
        except ValueError as e:
            what = f"function {function!r}'s parameters" if function else "the functions' parameters"
            raise ProtocolError(f"'tools': {what} cannot be used as a JSON schema: "
                                f"{str(e).removeprefix('structured_outputs: ')}", "tools") from None
    return forced


def _special_tag(info: ModelInfo) -> bool:
    """Whether the tokenizer has <tool_call> as one special token (Hermes-2-Pro), which decoding would
    drop by default: "auto" then keeps special tokens, as vLLM's Hermes parser does."""
    ids = info.tokenizer.encode(tool_calling.OPEN, add_special_tokens=False)
    return len(ids) == 1 and ids[0] in getattr(info.tokenizer, "special_token_ids", ())


# vLLM's older request fields for structured outputs, and the StructuredOutputsParams field each sets
GUIDED_FIELDS = {"guided_json": "json", "guided_regex": "regex", "guided_choice": "choice",
                 "guided_grammar": "grammar"}


def structured_outputs(body: dict, grammars=None) -> StructuredOutputsParams | None:
    """The request's output constraint, from whichever one of OpenAI's `response_format`
    ({"type": "json_object"} or {"type": "json_schema", "json_schema": {"schema": ...}}), vLLM's
    `structured_outputs` object or its older `guided_json` / `guided_regex` / `guided_choice` /
    `guided_grammar` it sets; checked here (the grammar compiled, with the model's tokenizer when
    `grammars`, the engine's GrammarCompiler, is given) so a bad one is a 400 naming it."""
    given = [name for name in ("response_format", "structured_outputs", *GUIDED_FIELDS)
             if body.get(name) is not None]
    rf = body.get("response_format")
    if isinstance(rf, dict) and rf.get("type") == "text" and set(rf) <= {"type"}:
        given.remove("response_format")  # the neutral value
    if not given:
        return None
    if len(given) > 1:
        raise ProtocolError(f"give one output constraint, not {' and '.join(given)}", given[1])
    name = given[0]
    if name == "response_format":
        kind = rf.get("type") if isinstance(rf, dict) else None
        if kind == "json_object":
            fields = {"json_object": True}
        elif kind == "json_schema":
            js = rf.get("json_schema")
            if not isinstance(js, dict) or not isinstance(js.get("schema"), dict):
                raise ProtocolError("'response_format' of type json_schema needs 'json_schema': {\"name\": ..., "
                                    "\"schema\": {a JSON schema object}}", name)
            fields = {"json": js["schema"]}
        else:
            raise ProtocolError("'response_format' must be {\"type\": \"text\"}, {\"type\": \"json_object\"} or "
                                "{\"type\": \"json_schema\", \"json_schema\": {...}}, got " + json.dumps(rf)[:80], name)
    elif name == "structured_outputs":
        so = body[name]
        if not isinstance(so, dict):
            raise ProtocolError(f"'structured_outputs' must be an object, got {json.dumps(so)[:80]}", name)
        known = {f.name for f in dataclasses.fields(StructuredOutputsParams)}
        unknown = sorted(set(so) - known)
        if unknown:
            raise ProtocolError(f"'structured_outputs' has unknown fields {unknown}; it takes one of "
                                f"{sorted(known)}", name)
        fields = {k: v for k, v in so.items() if v is not None and v is not False}
    else:
        fields = {GUIDED_FIELDS[name]: body[name]}
    try:
        params = StructuredOutputsParams(**fields)
        if grammars is not None:
            grammars.matcher(params)  # compiled into its cache: the engine thread copies it
        else:
            compile_grammar(params)
    except ValueError as e:  # the engine's message names structured_outputs; the request may not have
        raise ProtocolError(f"'{name}': {str(e).removeprefix('structured_outputs: ')}", name) from None
    return params


def parse_request(body: dict, info: ModelInfo, chat: bool) -> ParsedRequest:
    """Validate a whole /v1/completions or /v1/chat/completions body."""
    model = check_model(body, info.names)
    stream = _get(body, "stream", bool, False)
    opts = RequestBody(_get(body, "stream_options", dict, {}))
    include_usage = _get(opts, "include_usage", bool, False)
    continuous_usage = _get(opts, "continuous_usage_stats", bool, False)
    if (include_usage or continuous_usage) and not stream:
        raise ProtocolError("'stream_options' is only for streamed requests: set 'stream': true, or leave it out "
                            "(a response that is not streamed carries its usage anyway)", "stream_options")
    tools = tool_fields(tool_calling.parse_tool_request, body) if chat else None
    if tools is not None:
        tools.auto_parser = info.tool_call_parser
    given = ([(chat_prompt(body, info, _get(body, "add_generation_prompt", bool, True),
                           _get(body, "add_special_tokens", bool, False), tools=tools.tools if tools else None),
               None)] if chat
             else completion_prompts(body, info))
    prompts = truncated_prompts(body, [ids for ids, _ in given], info, chat)
    params = [sampling_params(body, len(ids), info, chat, k if len(prompts) > 1 else None, tools)  # each its own room
              for k, ids in enumerate(prompts)]
    n = _get(body, "n", int, 1)
    if len(prompts) * n > MAX_CHOICES:
        raise ProtocolError(f"{len(prompts)} prompts x n = {n} is more than {MAX_CHOICES} choices in one request",
                            "n")
    choices = [(ids, p.sample_params(i)) for ids, p in zip(prompts, params) for i in range(n)]
    parsed = ParsedRequest(model, choices, sum(len(ids) for ids in prompts), stream, include_usage,
                           continuous_usage, prompt_logprobs=_get(body, "prompt_logprobs", int, None),
                           tools=tools if tools is not None and tools.parses else None,
                           include_reasoning=_get(body, "include_reasoning", bool, True) if chat else True,
                           tokens_as_ids=_get(body, "return_tokens_as_token_ids", bool, False),
                           priority=request_priority(body, info), n=n)
    if not chat and _get(body, "echo", bool, False):  # (chat's echo, vLLM's other meaning, is refused above)
        parsed.echo = True
        parsed.echo_only = body.get("max_tokens") == 0
        # a prompt given as ids echoes as their text, special tokens included
        # (and a prompt truncate_prompt_tokens cut echoes what is left of it: the tokens that ran)
        texts = [text if text is not None and len(ids) == len(full) else
                 info.tokenizer.decode(ids, skip_special_tokens=False) for ids, (full, text) in zip(prompts, given)]
        parsed.echo_texts = [text for text in texts for _ in range(n)]
    if isinstance(body, RequestBody):
        parsed.ignored = body.unread() + [f"stream_options.{k}" for k in opts.unread()]
    if chat and body.get("reasoning_effort") is not None and not info.tokenizer.template_reads("reasoning_effort"):
        parsed.ignored.append("reasoning_effort (this model's chat template does not read it)")
    return parsed


def request_priority(body: dict, info: ModelInfo) -> int:
    """vLLM's priority field: any integer under --scheduling-policy priority; 0 or absent otherwise."""
    priority = _get(body, "priority", int, 0)
    if priority != 0 and info.scheduling_policy != "priority":
        raise ProtocolError(f"'priority' {priority} needs a server started with --scheduling-policy priority (this "
                            "one serves first come, first served); leave it out or send 0", "priority")
    return priority


def truncated_prompts(body: dict, prompts: list[list[int]], info: ModelInfo, chat: bool) -> list[list[int]]:
    """vLLM's truncate_prompt_tokens on each prompt's ids: k >= 1 keeps its last k tokens (a shorter
    prompt is kept whole), -1 the last max_model_len - max_tokens (max_model_len - 1 when max_tokens
    is not given, leaving room for one token: vLLM's -1 then keeps max_model_len and the request
    fails). Everything after sees the truncated prompt: the room left for max_tokens, usage, echo,
    prompt_logprobs. A value that is not an integer >= 1 or -1 is a 400 naming the field."""
    k = body.get("truncate_prompt_tokens")
    if k is None:
        return prompts
    if isinstance(k, bool) or not isinstance(k, int) or not (k >= 1 or k == -1):
        raise ProtocolError("'truncate_prompt_tokens' must be an integer >= 1 (keep the prompt's last k tokens) or "
                            f"-1 (as many as the context leaves beside max_tokens), got {json.dumps(k)[:40]}",
                            "truncate_prompt_tokens")
    name = "max_completion_tokens" if chat and body.get("max_completion_tokens") is not None else "max_tokens"
    max_tokens = _get(body, name, int, None)
    # not given, or 0 with echo (one token is generated and dropped): room for one token
    max_tokens = 1 if max_tokens is None or max_tokens < 1 else max_tokens
    try:
        return [truncate_prompt(ids, k, info.max_model_len, max_tokens, name) for ids in prompts]
    except ValueError as e:
        raise ProtocolError(str(e), name, code="context_length_exceeded") from None


# ---- responses ----------------------------------------------------------------------------
def usage(n_prompt: int, n_completion: int) -> dict:
    return {"prompt_tokens": n_prompt, "completion_tokens": n_completion, "total_tokens": n_prompt + n_completion}


def completion_response(rid: str, created: int, model: str, choices: list[tuple[str, str | None, dict | None]],
                        n_prompt: int, n_out: int, prompt_logprobs: list | None = None,
                        stop_reasons: list | None = None) -> dict:
    """choices: (text, finish reason, logprobs body or None) of each; n_out: completion tokens of all;
    prompt_logprobs: each choice's prompt_logprobs body (vLLM puts them in the choice), if asked;
    stop_reasons: each choice's stop string or stop token id (vLLM's stop_reason), None where none."""
    stops = stop_reasons or [None] * len(choices)
    body = {"id": rid, "object": "text_completion", "created": created, "model": model,
            "choices": [{"index": i, "text": text, "logprobs": lp, "finish_reason": finish, "stop_reason": stop}
                        for i, ((text, finish, lp), stop) in enumerate(zip(choices, stops))],
            "usage": usage(n_prompt, n_out)}
    for choice, plp in zip(body["choices"], prompt_logprobs or []):
        choice["prompt_logprobs"] = plp
    return body


def chat_response(rid: str, created: int, model: str, choices: list[tuple[str, str | None, dict | None]],
                  n_prompt: int, n_out: int, prompt_logprobs: list | None = None,
                  messages: list[dict] | None = None, stop_reasons: list | None = None) -> dict:
    """prompt_logprobs: the prompt_logprobs body of the (one) prompt, if asked: vLLM puts it in the
    response, beside the choices. messages: each choice's message, where it is not the plain text
    (tool calls: tools.complete_message). stop_reasons: as completion_response's."""
    messages = messages or [{"role": "assistant", "content": text} for text, _, _ in choices]
    stops = stop_reasons or [None] * len(choices)
    body = {"id": rid, "object": "chat.completion", "created": created, "model": model,
            "choices": [{"index": i, "message": msg, "logprobs": lp, "finish_reason": finish, "stop_reason": stop}
                        for i, ((_, finish, lp), msg, stop) in enumerate(zip(choices, messages, stops))],
            "usage": usage(n_prompt, n_out)}
    if prompt_logprobs is not None:
        body["prompt_logprobs"] = prompt_logprobs
    return body


def completion_chunk(rid: str, created: int, model: str, text: str, finish: str | None = None,
                     index: int = 0, logprobs: dict | None = None, prompt_logprobs: list | None = None,
                     stop_reason: int | str | None = None) -> dict:
    choice = {"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish, "stop_reason": stop_reason}
    if prompt_logprobs is not None:  # each choice's first chunk, where they were asked for
        choice["prompt_logprobs"] = prompt_logprobs
    return {"id": rid, "object": "text_completion", "created": created, "model": model, "choices": [choice]}


def chat_chunk(rid: str, created: int, model: str, delta: dict, finish: str | None = None,
               index: int = 0, logprobs: dict | None = None, prompt_logprobs: list | None = None,
               stop_reason: int | str | None = None) -> dict:
    body = {"id": rid, "object": "chat.completion.chunk", "created": created, "model": model,
            "choices": [{"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish,
                         "stop_reason": stop_reason}]}
    if prompt_logprobs is not None:  # each choice's first content chunk, where they were asked for
        body["prompt_logprobs"] = prompt_logprobs
    return body


def _json_logprob(v: float) -> float:
    """-inf (a token a logit transform ruled out) as -9999.0, as vLLM clamps it: JSON has no inf."""
    return max(v, -9999.0)


def completion_logprobs(lps: list[TokenLogprob | None], token_text, text_offset: int = 0,
                        token_ids: list[int] | None = None, top: int | None = None) -> dict:
    """The legacy completions API's logprobs body for these tokens; token_text(id) -> str. The
    sampled token is listed among its top alternatives too, as vLLM does. That body keys the
    alternatives by text, so tokens that read the same (byte pieces of one character) share a
    key: the first listed keeps it (the sampled token, then the best first). A None entry (the
    first prompt token, with echo: nothing predicts it) has null logprob and top_logprobs, as in
    OpenAI's and vLLM's bodies; token_ids names the tokens then. top: list at most that many
    alternatives (echoed prompt tokens may carry more, for prompt_logprobs)."""
    ids = token_ids if token_ids is not None else [lp.token_id for lp in lps]
    tokens = [token_text(i) for i in ids]
    offsets = []
    for t in tokens:
        offsets.append(text_offset)
        text_offset += len(t)
    tops: list[dict[str, float] | None] = []
    for lp in lps:
        if lp is None:
            tops.append(None)
            continue
        alts: dict[str, float] = {}
        for i, v in [(lp.token_id, lp.logprob), *lp.top[:top]]:
            alts.setdefault(token_text(i), _json_logprob(v))
        tops.append(alts)
    return {"tokens": tokens, "token_logprobs": [None if lp is None else _json_logprob(lp.logprob) for lp in lps],
            "top_logprobs": tops, "text_offset": offsets}


def prompt_logprobs_body(lps: list[TokenLogprob | None], token_text, top: int) -> list[dict | None]:
    """vLLM's `prompt_logprobs`: per prompt token None (the first: nothing predicts it) or
    {token id (a string, as JSON keys are): {"logprob", "rank", "decoded_token"}} for the token
    itself, then its `top` best alternatives (rank: their position, 1-based); a token among them is
    listed once, first. -inf becomes -9999.0, as vLLM's clamp_prompt_logprobs does (JSON has no inf)."""
    def entry(i: int, v: float, rank: int | None) -> dict:
        return {"logprob": _json_logprob(v), "rank": rank, "decoded_token": token_text(i)}

    out: list[dict | None] = []
    for lp in lps:
        if lp is None:
            out.append(None)
            continue
        d = {str(lp.token_id): entry(lp.token_id, lp.logprob, lp.rank)}
        for j, (i, v) in enumerate(lp.top[:top]):
            if str(i) not in d:
                d[str(i)] = entry(i, v, j + 1)
        out.append(d)
    return out


def chat_logprobs(lps: list[TokenLogprob], token_text) -> dict:
    """The chat API's logprobs body: {"content": [{token, logprob, bytes, top_logprobs}, ...]}."""
    def entry(i: int, v: float) -> dict:
        t = token_text(i)
        return {"token": t, "logprob": _json_logprob(v), "bytes": list(t.encode())}
    return {"content": [{**entry(lp.token_id, lp.logprob), "top_logprobs": [entry(i, v) for i, v in lp.top]}
                        for lp in lps]}


def usage_chunk(rid: str, created: int, model: str, chat: bool, n_prompt: int, n_out: int) -> dict:
    return {"id": rid, "object": "chat.completion.chunk" if chat else "text_completion", "created": created,
            "model": model, "choices": [], "usage": usage(n_prompt, n_out)}


def sse(data: dict | str) -> bytes:
    return f"data: {data if isinstance(data, str) else json.dumps(data)}\n\n".encode()


def now() -> int:
    return int(time.time())
