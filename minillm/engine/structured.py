"""Structured outputs: which tokens a request with a JSON schema, regex, choice list or grammar may
sample next.

llguidance (the library vLLM uses for the same) compiles the constraint and walks it token by token:
each sequence holds a matcher that consumes the tokens it accepts, and before a step samples, the
runner asks it for a bitmask of the allowed next tokens (bit t of word t // 32) and bans the rest
on the device (backend.mask_logits). A verification row j of a speculative step gets the mask that
follows drafts 0 .. j - 1, so speculation stays lossless under a constraint.

With SamplingParams.think_token_ids (a thinking model behind a reasoning parser) the constraint
holds only after the thinking, as vLLM's does: the tokens up to the </think> token are the model's
own and the matcher first sees the token after it. ThinkState is where an output stands.
"""

from __future__ import annotations

import json
import os
import threading
from collections import OrderedDict

import numpy as np

from minillm.backends.compile import env_int
from minillm.sampling_params import StructuredOutputsParams

# compiled constraints kept for reuse (an n-choice request, or the same schema request after request,
# compiles once: a 200-property schema takes ~50 ms to compile and 0.05 ms to copy)
TEMPLATES = 16

# rows a step from which llguidance's executor threads compute the masks; below it, this thread
# one matcher after another. A mask after a few tokens takes ~5-80 us, and the pool's hand-off
# costs more than it saves at 8 rows: on the H200's host (16 cores), a batch-8 step's masks of
# `[a-z ]+` took 335-565 us one by one against 588-653 us on the threads (part212,
# scripts/structured_bench.py, alternated twice, 0.6B and 8B). A bad value is not raised here (it
# failed `import minillm` itself): GrammarCompiler raises it as a start-up error naming the variable
try:
    MASK_PARALLEL_MIN, _MASK_PARALLEL_PROBLEM = env_int(
        "MINILLM_MASK_PARALLEL_MIN", 16, "rows of a step from which llguidance's threads compute the masks"), None
except ValueError as e:
    MASK_PARALLEL_MIN, _MASK_PARALLEL_PROBLEM = 16, str(e)


def _llguidance():
    try:
        import llguidance
    except ImportError as e:  # an install without it: say how to get it
        raise ValueError(f"structured outputs need the llguidance package ({e}); pip install llguidance") from None
    return llguidance


def _source(so: StructuredOutputsParams) -> tuple[str, str]:
    try:
        return so.grammar_source()
    except RecursionError:  # json.dumps of a schema nested past Python's recursion limit
        raise ValueError("structured_outputs: the JSON schema is nested too deeply (llguidance takes at most "
                         "~100 levels)") from None


def _what(fmt: str) -> str:
    return {"json_schema": "JSON schema", "regex": "regex", "choice": "choice list", "grammar": "grammar"}[fmt]


def _message(error: str) -> str:
    """llguidance's error without what it appends for its own developers (a Rust backtrace)."""
    return error.split("\n<")[0].strip()


def _limits():
    # llguidance's default limits, but errors that do not append the whole grammar and parser
    # state: a large schema failing mid-output would put megabytes into one log line.
    # MINILLM_GRAMMAR_FUEL=N (a test hook, read at each compile) sets the lexer fuel one mask may
    # burn (step_lexer_fuel, llguidance's default 200,000): a tight value makes a real limit fail
    # mid-output (tests/test_structured_errors.py)
    fuel = os.environ.get("MINILLM_GRAMMAR_FUEL")
    try:
        kwargs = {"step_lexer_fuel": int(fuel)} if fuel else {}
    except ValueError:
        raise ValueError(f"MINILLM_GRAMMAR_FUEL={fuel!r}: give an integer (a test hook: the lexer fuel a mask "
                         "may burn), or unset it") from None
    return _llguidance().LLParserLimits(verbose_errors=False, **kwargs)


class ThinkState:
    """Where a constrained output stands against its thinking (Sequence.think_state; None: the
    constraint holds)."""

    MAY_OPEN = "may_open"  # no token yet; the first may be <think> (qwen3), or is constrained
    THINKING = "thinking"  # unconstrained until the </think> token

    @staticmethod
    def initial(params) -> str | None:
        if params.structured_outputs is None or params.think_token_ids is None:
            return None
        return ThinkState.THINKING if params.think_token_ids[0] is None else ThinkState.MAY_OPEN

    @staticmethod
    def after(state: str | None, tok: int, think_ids) -> tuple[str | None, bool]:
        """(the state after token tok, whether the matcher consumes tok)."""
        if state == ThinkState.THINKING:
            return (None if tok == think_ids[1] else ThinkState.THINKING), False
        if state == ThinkState.MAY_OPEN and tok == think_ids[0]:
            return ThinkState.THINKING, False
        return None, True

    @staticmethod
    def rows(state: str | None, drafts: list[int], think_ids) -> tuple[int | None, bool]:
        """For a step's sampling rows 0 .. len(drafts) of one sequence (row j follows drafts[:j]):
        (a, opens). Rows a, a + 1, ... are constrained, the matcher as it stands taking drafts[a:]
        (a None: no row is; rows before a are thinking); opens: row 0 also allows <think>, and when
        a > 0 it wants a mask of its own (the matcher's first)."""
        if state is None:
            return 0, False
        opens = state == ThinkState.MAY_OPEN
        if opens and not (drafts and drafts[0] == think_ids[0]):
            return 0, True  # the first token decides; drafts after a non-<think> one are constrained
        for j in range(1 if opens else 0, len(drafts)):
            if drafts[j] == think_ids[1]:
                return j + 1, opens
        return None, opens


def add_token(masks: np.ndarray, row: int, tok: int) -> None:
    """Allow token tok in masks[row] (bit tok % 32 of word tok // 32)."""
    masks[row, tok >> 5] |= np.uint32(1 << (tok & 31)).view(np.int32)


def token_mask(ids, vocab_size: int) -> np.ndarray:
    """One bitmask row (int32 words, the layout of mask_logits) allowing exactly the tokens ids."""
    ids = np.unique(np.asarray(ids, np.int64))
    row = np.zeros((vocab_size + 31) // 32, np.uint32)
    np.bitwise_or.at(row, ids >> 5, np.left_shift(np.uint32(1), (ids & 31).astype(np.uint32)))
    return row.view(np.int32)


def _first_token(mask: bytes, eos_ids: list[int]) -> int | None:
    """The lowest token id a bitmask (compute_bitmask's bytes, bit t % 8 of byte t // 8) allows
    other than EOS; None when it allows EOS alone."""
    bits = np.unpackbits(np.frombuffer(mask, np.uint8), bitorder="little")
    bits[[t for t in eos_ids if t < len(bits)]] = 0
    allowed = np.flatnonzero(bits)
    return int(allowed[0]) if len(allowed) else None


def matcher_error(m) -> str | None:
    """A matcher's error (None while it has none), as the client is told it.

    llguidance 1.9 (measured, tests/test_structured_errors.py): a limit hit while computing a mask
    (e.g. "lexer error: too many expressions constructed" past step_lexer_fuel) puts the matcher
    in an error state for good (is_error(), get_error(); rollback fails, later masks too) and the
    mask it returns allows EOS alone, so the output would end as if complete; a token it refuses
    (consume_token False) does the same. The engine ends such a sequence with finish reason
    "error" instead (engine._accept_tokens)."""
    if not m.is_error():
        return None
    return f"structured output failed mid-output: {_message(m.get_error())}"


def compile_grammar(so: StructuredOutputsParams) -> str:
    """The constraint as an llguidance grammar, checked; ValueError names what is wrong with it."""
    llg = _llguidance()
    fmt, text = _source(so)
    what = _what(fmt)
    if fmt == "choice":
        # one lexer terminal: llguidance's own choice grammar makes each string an item of a parser
        # row, and a row of over 2,000 items fails after the output's first token
        fmt, text = "lark", "start: CHOICE\nCHOICE: " + " | ".join(json.dumps(c) for c in json.loads(text))
    try:
        grammar = llg.grammar_from(fmt, text)
    except (ValueError, RuntimeError) as e:
        raise ValueError(f"structured_outputs: the {what} does not compile: {e}") from None
    is_error, messages = llg.LLMatcher.validate_grammar_with_warnings(grammar, None, limits=_limits())
    if is_error:
        raise ValueError(f"structured_outputs: the {what} does not compile: {_message(messages[0])}")
    return grammar


class GrammarCompiler:
    """Per engine: the tokenizer in llguidance's form (built on the first constrained request, ~1 s
    for a 150k vocabulary), and a matcher for each constrained sequence, copied from the last
    TEMPLATES constraints' compiled matchers."""

    def __init__(self, tokenizer, vocab_size: int, eos_ids: list[int]):
        if _MASK_PARALLEL_PROBLEM is not None:
            raise ValueError(_MASK_PARALLEL_PROBLEM)
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size  # the logits' width: tokens past the tokenizer's are banned
        self.eos_ids = list(eos_ids)
        self._lltok = None
        self._executor = None
        self._templates: OrderedDict[tuple[str, str], object] = OrderedDict()
        # the server compiles in its request threads (matcher() from protocol.py) and the engine
        # thread copies: the cache and the tokenizer's build are shared, compiles run unlocked
        self._lock = threading.Lock()

    @property
    def words(self) -> int:
        """int32 words in one row of the bitmask."""
        return (self.vocab_size + 31) // 32

    def matcher(self, so: StructuredOutputsParams):
        """A fresh matcher for one sequence (ValueError: the constraint does not compile). Thread-safe:
        the server calls it from its request threads first, so the engine thread only copies."""
        key = _source(so)
        with self._lock:
            template = self._templates.get(key)
            if template is not None:
                self._templates.move_to_end(key)
                return template.deep_copy()
        template = self._compile(so, key)  # unlocked: a long compile holds up no other request's copy
        with self._lock:
            self._templates[key] = template
            if len(self._templates) > TEMPLATES:
                self._templates.popitem(last=False)
        return template.deep_copy()

    def _compile(self, so: StructuredOutputsParams, key: tuple[str, str]):
        llg = _llguidance()
        with self._lock:
            if self._lltok is None:
                self._lltok = llg.LLTokenizer(self.tokenizer.tok.to_str(), n_vocab=self.vocab_size,
                                              eos_token=self.eos_ids or None)
        template = llg.LLMatcher(self._lltok, compile_grammar(so), log_level=0, limits=_limits())
        first = None
        if not template.is_error():
            # the first mask: a constraint that no text matches (an empty character class, a
            # $ref cycle, a rule that never ends) errs here, where it would otherwise end every
            # output empty with finish reason "stop"
            first = _first_token(template.compute_bitmask(), self.eos_ids)
        if template.is_error():
            error = _message(template.get_error())
            if error.startswith("NoExtension"):
                error = ("no text matches it (look for an impossible character class, a $ref cycle "
                         "or a rule that never ends)")
            raise ValueError(f"structured_outputs: the {_what(key[0])} cannot be followed: {error}")
        if first is not None:
            # and the first token, on a copy: consuming it computes the bytes the constraint forces
            # after it, where a limit of llguidance's can be met before any output (`root ::= "x"
            # root`: "Too many items"; `(a{1000}){1000}`: "too many expressions constructed"), which
            # would fail every request mid-output with a 500. Checked once a compile (the template
            # is cached) and on one token, the lowest id the mask allows: a limit that only some
            # first tokens meet still fails mid-output (engine._accept_tokens)
            probe = template.deep_copy()
            if not probe.consume_token(first) or probe.is_error():
                added = self.tokenizer.tok.get_added_tokens_decoder().get(first)
                why = (f"the constraint's text spells {added.content!r}, the tokenizer's added token {first}, which "
                       "llguidance allows and then refuses (a known llguidance limit); leave that text out of the "
                       "constraint" if added is not None and not added.special else
                       "a limit of llguidance's, met on the output's first token; simplify the constraint")
                raise ValueError(f"structured_outputs: the {_what(key[0])} cannot be followed: "
                                 f"{_message(probe.get_error())} ({why})")
        return template

    def next_token_masks(self, jobs: list[tuple[object, list[int]]]) -> np.ndarray:
        """The masks of a step's constrained sampling rows (from MASK_PARALLEL_MIN rows on, computed
        in parallel by llguidance's executor threads): for each (matcher m, drafts), len(drafts) + 1 rows where row
        j allows the tokens m accepts after drafts[:j]. Rows past a draft the grammar refuses copy
        the row before them (a verification step can never accept a token there). Each m is left
        as it was. A row with nothing allowed (a constraint no token continues, e.g. an
        unsatisfiable schema) allows EOS, so the request ends."""
        n = sum(len(d) + 1 for _, d in jobs)
        out = np.zeros((n, self.words), np.int32)
        plain, drafted, taken, at = [], [], [], 0
        for m, drafts in jobs:
            if drafts:
                drafted.append((m, at, list(drafts)))
                taken.append(m.validate_tokens(drafts))  # how many drafts the grammar takes, in order
            else:
                plain.append((m, at))
            at += len(drafts) + 1
        ptr, row_bytes = out.ctypes.data, self.words * 4
        if n >= MASK_PARALLEL_MIN:
            if self._executor is None:
                self._executor = _llguidance().LLExecutor()
            if plain:
                self._executor.unsafe_compute_mask_ptr(plain, ptr, row_bytes, n)
            if drafted:  # (llguidance refuses an empty draft list here)
                self._executor.unsafe_compute_mask_ptr_with_draft_token(drafted, ptr, row_bytes, n)
        else:
            for m, at in plain:
                m.unsafe_compute_mask_ptr(ptr + at * row_bytes, row_bytes)
            for (m, at, drafts), ok in zip(drafted, taken):  # row j after drafts[:j], up to the first refused
                for j in range(ok + 1):
                    if j:
                        m.consume_token(drafts[j - 1])
                    m.unsafe_compute_mask_ptr(ptr + (at + j) * row_bytes, row_bytes)
                if ok:
                    m.rollback(ok)
        for (_, at, drafts), ok in zip(drafted, taken):  # rows past a refused draft: never reached, a copy
            out[at + ok + 1 : at + len(drafts) + 1] = out[at + ok]
        for row in np.flatnonzero(~out.any(axis=1)):
            for t in self.eos_ids:
                add_token(out, row, t)
        return out
