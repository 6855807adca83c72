"""Structured outputs: which tokens a request with a JSON schema, regex, choice list or grammar may
sample next.

llguidance (the library vLLM uses for the same) compiles the constraint and walks it token by token:
each sequence holds a matcher that consumes the tokens it accepts, and before a step samples, the
runner asks it for a bitmask of the allowed next tokens (bit t of word t // 32) and bans the rest
on the device (backend.mask_logits). A verification row j of a speculative step gets the mask that
follows drafts 0 .. j - 1, so speculation stays lossless under a constraint.
"""

from __future__ import annotations

import numpy as np

from minillm.sampling_params import StructuredOutputsParams


def _llguidance():
    try:
        import llguidance
        import llguidance.numpy
    except ImportError as e:  # an install without it: say how to get it
        raise ValueError(f"structured outputs need the llguidance package ({e}); pip install llguidance") from None
    return llguidance


def compile_grammar(so: StructuredOutputsParams) -> str:
    """The constraint as an llguidance grammar, checked; ValueError names what is wrong with it."""
    llg = _llguidance()
    fmt, text = so.grammar_source()
    what = {"json_schema": "JSON schema", "regex": "regex", "choice": "choice list", "grammar": "grammar"}[fmt]
    try:
        grammar = llg.grammar_from(fmt, text)
    except (ValueError, RuntimeError) as e:
        raise ValueError(f"structured_outputs: the {what} does not compile: {e}") from None
    is_error, messages = llg.LLMatcher.validate_grammar_with_warnings(grammar, None)
    if is_error:
        raise ValueError(f"structured_outputs: the {what} does not compile: {messages[0].strip()}")
    return grammar


class GrammarCompiler:
    """Per engine: the tokenizer in llguidance's form (built on the first constrained request, ~1 s
    for a 150k vocabulary), and a matcher for each constrained sequence."""

    def __init__(self, tokenizer, vocab_size: int, eos_ids: list[int]):
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size  # the logits' width: tokens past the tokenizer's are banned
        self.eos_ids = list(eos_ids)
        self._lltok = None

    @property
    def words(self) -> int:
        """int32 words in one row of the bitmask."""
        return (self.vocab_size + 31) // 32

    def matcher(self, so: StructuredOutputsParams):
        """A fresh matcher for one sequence (ValueError: the constraint does not compile)."""
        llg = _llguidance()
        if self._lltok is None:
            self._lltok = llg.LLTokenizer(self.tokenizer.tok.to_str(), n_vocab=self.vocab_size,
                                          eos_token=self.eos_ids or None)
        m = llg.LLMatcher(self._lltok, compile_grammar(so), log_level=0)
        if m.is_error():
            raise ValueError(f"structured_outputs: {m.get_error()}")
        return m

    def next_token_masks(self, m, drafts: list[int]) -> np.ndarray:
        """[len(drafts) + 1, words] int32: row j allows the tokens m accepts after drafts[:j]. Rows
        past a draft the grammar refuses copy the row before them (a verification step can never
        accept a token there). m is left as it was. A row with nothing allowed (a constraint no
        token can continue, e.g. an unsatisfiable schema) allows EOS, so the request ends."""
        llg = _llguidance()
        out = np.zeros((len(drafts) + 1, self.words), np.int32)
        ok = m.validate_tokens(drafts) if drafts else 0  # how many drafts the grammar takes in order
        for j in range(len(drafts) + 1):
            if j > ok:
                out[j] = out[ok]
                continue
            if j:
                m.consume_token(drafts[j - 1])
            llg.numpy.fill_next_token_bitmask(m, out, j)
            if not out[j].any():
                for t in self.eos_ids:
                    out[j, t >> 5] |= np.int32(np.uint32(1 << (t & 31)).view(np.int32))
        if ok:
            m.rollback(ok)
        return out
