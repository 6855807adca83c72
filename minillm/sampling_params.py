"""SamplingParams: how one request is decoded, validated before it reaches the engine."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

import numpy as np

# The runner holds temperature, top_p, min_p and the penalties as float32 (its per-row device
# buffers), so a value must survive that: a temperature past float32's largest turns infinite, a
# top_p or repetition_penalty under its smallest normal turns 0 (top-p then keeps no token; 1 / 0
# is an infinite logit scale), both giving NaN or arbitrary tokens rather than an error.
F32_MAX = 3.4028234663852886e38
F32_TINY = 1.1754943508222875e-38
# repetition_penalty divides positive logits: at 1e-30 a logit up to 3e8 stays finite in float32
MIN_REPETITION_PENALTY = 1e-30
# token ids travel as int32 (the runner's min_tokens ban list, its masks): an id at or past 2**31 is
# no token of any vocabulary, and numpy raised OverflowError on it mid-step (stop_token_ids with min_tokens)
TOKEN_ID_LIMIT = 2**31
# samples a prompt offline (SamplingParams.n): each is an engine request of its own, so a huge n is as many
# queued requests; the server's own limit is protocol.MAX_N
MAX_N = 1024
_INT_FIELDS = ("max_tokens", "top_k", "min_tokens", "seed", "logprobs", "prompt_logprobs", "truncate_prompt_tokens",
               "n")
_FLOAT_FIELDS = ("temperature", "top_p", "min_p", "presence_penalty", "frequency_penalty", "repetition_penalty")
_BOOL_FIELDS = ("ignore_eos", "skip_special_tokens", "include_stop_str_in_output")


def _py(v):
    """A NumPy scalar as the Python value it holds (np.int64 -> int, np.float32 -> float, np.bool_ ->
    bool), as vLLM takes them; anything else as it is (then validated as it is)."""
    return v.item() if isinstance(v, (np.integer, np.floating, np.bool_)) else v


def _id_list(v):
    """A list or tuple of token ids, or a 1-D NumPy array of them, as a list of Python values."""
    if isinstance(v, np.ndarray) and v.ndim == 1:
        return v.tolist()
    return [_py(t) for t in v] if isinstance(v, (list, tuple)) else v


def _is_token_id(t) -> bool:
    return isinstance(t, int) and not isinstance(t, bool) and 0 <= t < TOKEN_ID_LIMIT


def _bias_key(k):
    """A logit_bias key as a token id: vLLM takes {"50256": -100} (JSON's keys are strings) by int();
    only plain ASCII digits here (int() would also take " 5", "+5", "5_0" and other scripts' digits)."""
    k = _py(k)
    return int(k) if isinstance(k, str) and k.isascii() and k.isdigit() else k


@dataclass
class StructuredOutputsParams:
    """vLLM's structured outputs: exactly one constraint on what a request may generate, enforced
    token by token (minillm/engine/structured.py bans every token that would leave it)."""

    json: dict | str | None = None  # a JSON schema (an object, or its JSON text)
    regex: str | None = None  # a regular expression the whole output matches (Rust regex syntax)
    choice: list[str] | None = None  # the output is exactly one of these strings
    grammar: str | None = None  # a context-free grammar: Lark (llguidance's dialect) or GBNF
    json_object: bool = False  # any JSON object (OpenAI's response_format {"type": "json_object"})
    # JSON without whitespace between tokens (by default the model may put any between them)
    disable_any_whitespace: bool = False

    def __post_init__(self) -> None:
        for k in ("json_object", "disable_any_whitespace"):
            if not isinstance(getattr(self, k), bool):
                raise ValueError(f"structured_outputs {k} must be true or false, got {getattr(self, k)!r}")
        set_ = [k for k in ("json", "regex", "choice", "grammar") if getattr(self, k) is not None]
        set_ += ["json_object"] if self.json_object else []
        if len(set_) != 1:
            raise ValueError("structured_outputs must set exactly one of json, regex, choice, grammar, json_object; "
                             f"got {', '.join(set_) if set_ else 'none'}")
        if self.json is not None:
            if isinstance(self.json, str):
                try:
                    self.json = json.loads(self.json)
                except RecursionError:  # nested past Python's limit (~1,000 levels)
                    raise ValueError("structured_outputs json: the schema is nested too deeply") from None
                except ValueError as e:
                    raise ValueError(f"structured_outputs json must be a JSON schema; its text is not JSON: "
                                     f"{e}") from None
            if not isinstance(self.json, dict):
                raise ValueError(f"structured_outputs json must be a JSON schema object, got {self.json!r:.80}")
        for k in ("regex", "grammar"):
            v = getattr(self, k)
            if v is not None and not (isinstance(v, str) and v):
                raise ValueError(f"structured_outputs {k} must be a non-empty string, got {v!r:.80}")
        if self.disable_any_whitespace and self.json is None and not self.json_object:
            raise ValueError("structured_outputs disable_any_whitespace applies to json and json_object only")
        if self.choice is not None and not (isinstance(self.choice, (list, tuple)) and self.choice
                                            and all(isinstance(c, str) and c for c in self.choice)):
            raise ValueError(f"structured_outputs choice must be a non-empty list of non-empty strings, "
                             f"got {self.choice!r:.80}")

    def grammar_source(self) -> tuple[str, str]:
        """(llguidance's grammar format, its text) for llguidance.grammar_from."""
        if self.json is not None or self.json_object:
            schema = dict(self.json) if self.json is not None else {"type": "object"}
            if self.disable_any_whitespace:  # llguidance's own schema extension
                extra = schema.get("x-guidance")
                schema["x-guidance"] = {**(extra if isinstance(extra, dict) else {}), "whitespace_flexible": False}
            return "json_schema", json.dumps(schema)
        if self.regex is not None:
            return "regex", self.regex
        if self.choice is not None:
            return "choice", json.dumps(list(self.choice))
        return "grammar", self.grammar  # Lark, or GBNF converted to it


@dataclass
class SamplingParams:
    max_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1  # -1 or 0: no top-k
    # vLLM's min_p: after temperature, keep only tokens with p >= min_p * (the top token's p); 0: off
    min_p: float = 0.0
    min_tokens: int = 0
    stop: list[str] | str | None = None
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    seed: int | None = None
    skip_special_tokens: bool = True
    # vLLM's: a stop string that ends the output stays at the end of its text (default: cut off)
    include_stop_str_in_output: bool = False
    # None: no log probabilities; N >= 0: each output token's logprob and the N most likely
    # alternatives' (minillm/engine/logprobs.py)
    logprobs: int | None = None
    # None: none; N >= 0 (vLLM's name): each prompt token's logprob given the tokens before it, and
    # the N most likely alternatives' (the first prompt token has None: nothing predicts it)
    prompt_logprobs: int | None = None
    # OpenAI's penalties on tokens already in the output (subtract presence once, frequency per
    # occurrence) and vLLM's repetition_penalty on tokens in the prompt or output (a positive
    # logit divided by it, a negative one multiplied), applied in that order before sampling
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    # OpenAI's logit_bias: {token id: value in [-100, 100]} added to the logits before sampling
    logit_bias: dict[int, float] | None = None
    # vLLM's allowed_token_ids: sampling keeps only these tokens (every other is banned, EOS too
    # unless listed: the output then runs to max_tokens or a stop string)
    allowed_token_ids: list[int] | None = None
    # vLLM's bad_words: words the output may not contain. A word's last token is banned wherever the
    # output so far ends with the tokens before it (each word tokenized alone and after a space)
    bad_words: list[str] | None = None
    # vLLM's structured outputs (a JSON schema, regex, choice list or grammar the output must follow;
    # a dict is taken as StructuredOutputsParams' fields)
    structured_outputs: StructuredOutputsParams | None = None
    # (<think> id or None, </think> id): structured outputs hold only after a thinking model's thinking,
    # as vLLM's do with a reasoning parser (the server sets it from --reasoning-parser when both tags
    # are single tokens). None as the first: the output thinks from its first token (deepseek_r1);
    # an id: an output whose first token is that id thinks, any other is constrained from its start
    # (qwen3). The thinking ends with the </think> token; the constraint applies to what follows
    think_token_ids: tuple[int | None, int] | None = None
    # vLLM's truncate_prompt_tokens: None keeps the whole prompt; k >= 1 keeps only its last k tokens
    # (left truncation: the end, nearest the output, stays; a prompt of k tokens or fewer is kept
    # whole); -1 keeps as many as the context leaves room for beside max_tokens (the last
    # max_model_len - max_tokens), as vLLM's -1 does (its max_input_tokens). See truncated_prompt
    truncate_prompt_tokens: int | None = None
    # vLLM's n: samples of the prompt, each run as its own engine request with sample_params(i) (LLM.generate
    # returns them as the prompt's CompletionOutput.outputs; the server's n choices are the same)
    n: int = 1

    def __post_init__(self) -> None:
        self.validate()

    def sample_params(self, i: int) -> SamplingParams:
        """Sample i of the n's own parameters (n = 1): with a seed, seed + i, so the n samples differ and a
        repeated call gives the same n (sample 0 is what n = 1 gives); without one, each draws its own."""
        if not 0 <= i < self.n:
            raise ValueError(f"sample {i} of n = {self.n}")
        if self.n == 1:
            return self
        return replace(self, n=1, seed=self.seed if self.seed is None or i == 0 else (self.seed + i) % (1 << 64))

    def _normalize(self) -> None:
        """The accepted spellings as one form: a str stop as a list, tuples as lists, NumPy scalars and
        arrays as Python values, logit_bias's digit-string keys as ints, a structured_outputs dict as
        StructuredOutputsParams. Idempotent: validate() runs it again after fields were set by hand."""
        for name in (*_INT_FIELDS, *_FLOAT_FIELDS, *_BOOL_FIELDS):
            setattr(self, name, _py(getattr(self, name)))
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        if not isinstance(self.stop, (list, tuple, type(None))):
            raise ValueError(f"stop must be a non-empty string or a list of non-empty strings, got {self.stop!r:.80}")
        self.stop = list(self.stop or [])
        if not isinstance(self.stop_token_ids, (list, tuple, np.ndarray, type(None))):
            raise ValueError(f"stop_token_ids must be a list of token ids, got {self.stop_token_ids!r:.80}")
        self.stop_token_ids = _id_list(self.stop_token_ids) if self.stop_token_ids is not None else []
        # only None or a mapping ({} is none): 0, "" or [] was taken as no bias without a word
        if not isinstance(self.logit_bias, (Mapping, type(None))):
            raise ValueError(f"logit_bias must be a dict of token id -> bias, got {self.logit_bias!r:.80}")
        if self.logit_bias:
            bias = {_bias_key(k): _py(v) for k, v in self.logit_bias.items()}
            if len(bias) < len(self.logit_bias):
                raise ValueError(f"logit_bias names a token twice (as a number and as a string?): "
                                 f"{self.logit_bias!r:.80}")
            self.logit_bias = bias
        else:
            self.logit_bias = None
        if isinstance(self.bad_words, tuple):
            self.bad_words = list(self.bad_words)
        if self.allowed_token_ids is not None:
            self.allowed_token_ids = _id_list(self.allowed_token_ids)
        if isinstance(self.think_token_ids, (list, tuple)):
            self.think_token_ids = tuple(_py(t) for t in self.think_token_ids)
        if isinstance(self.structured_outputs, dict):
            fields = StructuredOutputsParams.__dataclass_fields__
            unknown = sorted(str(k) for k in self.structured_outputs if k not in fields)
            if unknown:
                raise ValueError(f"structured_outputs: unknown field(s) {', '.join(unknown)}; the fields are "
                                 f"{', '.join(fields)}")
            self.structured_outputs = StructuredOutputsParams(**self.structured_outputs)

    def validate(self) -> None:
        """Normalise the fields (_normalize) and raise ValueError naming the offending field and the
        accepted range. Runs at construction; run it again after setting fields by hand."""
        self._normalize()

        def need(cond: bool, msg: str) -> None:
            if not cond:
                raise ValueError(msg)

        need(isinstance(self.max_tokens, int) and not isinstance(self.max_tokens, bool)
             and self.max_tokens >= 1, f"max_tokens must be an integer >= 1, got {self.max_tokens!r}")
        need(isinstance(self.temperature, (int, float)) and not isinstance(self.temperature, bool)
             and 0 <= self.temperature <= F32_MAX,
             f"temperature must be a number in [0, {F32_MAX:.4g}] (float32's largest), got {self.temperature!r}")
        need(isinstance(self.top_p, (int, float)) and not isinstance(self.top_p, bool) and F32_TINY <= self.top_p <= 1,
             f"top_p must be in (0, 1] and at least {F32_TINY:.4g} (float32's smallest normal; for the top "
             f"token alone use top_k=1 or temperature=0), got {self.top_p!r}")
        need(isinstance(self.top_k, int) and not isinstance(self.top_k, bool) and -1 <= self.top_k < 2**31,
             f"top_k must be an integer in [-1, 2**31) (-1 or 0 disables it), got {self.top_k!r}")
        need(isinstance(self.min_p, (int, float)) and not isinstance(self.min_p, bool) and 0 <= self.min_p <= 1,
             f"min_p must be in [0, 1] (0 disables it), got {self.min_p!r}")
        need(isinstance(self.min_tokens, int) and not isinstance(self.min_tokens, bool)
             and 0 <= self.min_tokens <= self.max_tokens,
             f"min_tokens must be an integer in [0, max_tokens={self.max_tokens}], got {self.min_tokens!r}")
        need(all(isinstance(s, str) and s for s in self.stop),
             f"stop must be a non-empty string or a list of non-empty strings, got {self.stop!r:.80}")
        # (ids past the vocabulary are no-ops, as in vLLM; past 2**31 they are no token at all)
        need(all(_is_token_id(t) for t in self.stop_token_ids),
             f"stop_token_ids must be token ids (integers >= 0, below 2**31), got {self.stop_token_ids!r:.80}")
        # a truthy string such as "false" would otherwise turn the switch on
        for name in ("ignore_eos", "skip_special_tokens", "include_stop_str_in_output"):
            need(isinstance(getattr(self, name), bool), f"{name} must be True or False, got {getattr(self, name)!r}")
        need(isinstance(self.n, int) and not isinstance(self.n, bool) and 1 <= self.n <= MAX_N,
             f"n must be an integer in [1, {MAX_N}] (samples of the prompt), got {self.n!r}")
        need(self.logprobs is None or (isinstance(self.logprobs, int) and not isinstance(self.logprobs, bool)
                                       and 0 <= self.logprobs <= 20),
             f"logprobs must be None or an integer in [0, 20], got {self.logprobs!r}")
        need(self.prompt_logprobs is None or (isinstance(self.prompt_logprobs, int)
                                              and not isinstance(self.prompt_logprobs, bool)
                                              and 0 <= self.prompt_logprobs <= 20),
             f"prompt_logprobs must be None or an integer in [0, 20], got {self.prompt_logprobs!r}")
        for name in ("presence_penalty", "frequency_penalty"):
            v = getattr(self, name)
            need(isinstance(v, (int, float)) and not isinstance(v, bool) and -2 <= v <= 2,
                 f"{name} must be a number in [-2, 2], got {v!r}")
        need(isinstance(self.repetition_penalty, (int, float)) and not isinstance(self.repetition_penalty, bool)
             and MIN_REPETITION_PENALTY <= self.repetition_penalty <= F32_MAX,  # vLLM's: any above 0
             f"repetition_penalty must be a number in [{MIN_REPETITION_PENALTY:g}, {F32_MAX:.4g}] (1 is off), got "
             f"{self.repetition_penalty!r}")
        need(self.logit_bias is None or all(
            _is_token_id(t) and isinstance(v, (int, float)) and not isinstance(v, bool) and -100 <= v <= 100
            for t, v in self.logit_bias.items()),
            f"logit_bias must map token ids (integers >= 0, below 2**31, or their decimal strings) to numbers in "
            f"[-100, 100], got {self.logit_bias!r:.80}")
        need(self.seed is None or (isinstance(self.seed, int) and not isinstance(self.seed, bool)
                                   and -(2**63) <= self.seed < 2**64),
             f"seed must be a 64-bit integer, got {self.seed!r}")
        if not (self.structured_outputs is None or isinstance(self.structured_outputs, StructuredOutputsParams)):
            # (the message only when it fails: the repr of a large schema is long to build)
            need(False, f"structured_outputs must be a StructuredOutputsParams or a dict of its fields, got "
                        f"{type(self.structured_outputs).__name__}")
        a = self.allowed_token_ids
        need(a is None or (isinstance(a, list) and a and all(_is_token_id(t) for t in a)),
            f"allowed_token_ids must be None or a non-empty list of token ids (integers >= 0, below 2**31), got "
            f"{a!r:.80}")
        need(self.bad_words is None or (isinstance(self.bad_words, list)
                                        and all(isinstance(w, str) and w.strip() for w in self.bad_words)),
             f"bad_words must be None or a list of words with text (not empty, not only whitespace), got "
             f"{self.bad_words!r:.80}")
        need(not (self.bad_words and (self.structured_outputs or self.allowed_token_ids is not None)),
             "bad_words cannot be combined with structured_outputs or allowed_token_ids: a row could be left with "
             "no token to sample; leave the words out of the constraint or the list instead")
        t = self.think_token_ids
        need(t is None or (isinstance(t, tuple) and len(t) == 2 and all(
            (i is None and k == 0) or _is_token_id(i) for k, i in enumerate(t)) and t[0] != t[1]),
            f"think_token_ids must be None or (<think> id or None, </think> id), two different token ids, got {t!r}")
        need(self.truncate_prompt_tokens is None
             or (isinstance(self.truncate_prompt_tokens, int) and not isinstance(self.truncate_prompt_tokens, bool)
                 and (self.truncate_prompt_tokens >= 1 or self.truncate_prompt_tokens == -1)),
             f"truncate_prompt_tokens must be None, an integer >= 1 (keep the prompt's last k tokens) or -1 (as "
             f"many as max_model_len leaves beside max_tokens), got {self.truncate_prompt_tokens!r}")
        # a row whose grammar allows only tokens outside the list would have nothing left to sample
        need(not (self.structured_outputs and self.allowed_token_ids is not None),
             "allowed_token_ids cannot be combined with structured_outputs: write the restriction into the "
             "constraint (e.g. a regex or choice over the allowed text)")
        # the grammar decides when the output may end; min_tokens would ban the end it allows
        need(not (self.structured_outputs and self.min_tokens),
             "min_tokens cannot be combined with structured_outputs: the grammar decides where the output ends")

    def truncated_prompt(self, prompt_ids: list[int], max_model_len: int) -> list[int]:
        """prompt_ids as truncate_prompt_tokens leaves them (the list itself when it keeps all)."""
        return truncate_prompt(prompt_ids, self.truncate_prompt_tokens, max_model_len, self.max_tokens)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def penalized(self) -> bool:
        """Penalties: they depend on the tokens sampled so far."""
        return bool(self.presence_penalty or self.frequency_penalty or self.repetition_penalty != 1)

    @property
    def needs_history(self) -> bool:
        """Penalties, structured outputs or bad words: what a step may sample depends on the tokens so
        far, so its logit changes wait for the previous step's ids (async scheduling launches the
        forward first and defers the changes and the sampler: Runner.finish_sampling)."""
        return self.penalized or self.structured_outputs is not None or bool(self.bad_words)

    @property
    def adjusts_logits(self) -> bool:
        """Penalties, a logit bias, allowed token ids, bad words or structured outputs: the runner
        changes this request's logits before sampling (after a FORWARD_ONLY graph or an eager forward)."""
        return (self.penalized or bool(self.logit_bias) or self.allowed_token_ids is not None
                or self.structured_outputs is not None or bool(self.bad_words))


def truncate_prompt(prompt_ids: list[int], truncate_prompt_tokens: int | None, max_model_len: int,
                    max_tokens: int, max_tokens_name: str = "max_tokens") -> list[int]:
    """vLLM's truncate_prompt_tokens applied to a prompt's ids: None keeps them all, k >= 1 the last k
    (left truncation, as vLLM's default truncation side), -1 the last max_model_len - max_tokens
    (what vLLM's -1 maps to: the context less the output asked for). The list itself when nothing
    is cut. ValueError, naming both fields, when -1 leaves no token (max_tokens fills the context)."""
    k = truncate_prompt_tokens
    if k is None:
        return prompt_ids
    if k == -1:
        k = max_model_len - max_tokens
        if k < 1:
            raise ValueError(f"truncate_prompt_tokens -1 keeps max_model_len {max_model_len} - {max_tokens_name} "
                             f"{max_tokens} = {k} prompt tokens: lower {max_tokens_name} to at most "
                             f"{max_model_len - 1}")
    return prompt_ids if len(prompt_ids) <= k else list(prompt_ids[-k:])
