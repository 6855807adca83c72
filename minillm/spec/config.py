"""SpeculativeConfig: vLLM's `--speculative-config` keys, validated at startup."""

from __future__ import annotations

from dataclasses import dataclass

METHODS = ("ngram", "draft_model", "dflash")


@dataclass
class SpeculativeConfig:
    method: str
    num_speculative_tokens: int
    model: str | None = None
    prompt_lookup_min: int = 1
    prompt_lookup_max: int = 4
    # draft_model / dflash: draft from the first draft_vocab_size token ids (the drafter's LM head
    # cut to those rows); None: the whole vocabulary. Verification stays lossless whatever the
    # drafts are: only acceptance can drop (draft_vocab_size below).
    draft_vocab_size: int | None = None
    # vLLM's disable_by_batch_size: no drafting while the batch holds at least this many running
    # sequences (a rejected round costs 1.3-1.5x a plain step on the H200, more at larger batches,
    # where a step's tokens already fill the GPU); None: always speculate
    disable_by_batch_size: int | None = None
    # minillm's backoff for drafts that do not land: after backoff_after verification rounds in a row
    # that accept no draft, a sequence decodes plainly for 1 step, then 2, 4, ... up to
    # backoff_max_steps between single probe rounds, until a round accepts a draft. The output is
    # the same (verification decides it); a drafter that never lands then costs one round in
    # backoff_max_steps + 1 steps instead of every step. None: never back off
    backoff_after: int | None = None
    backoff_max_steps: int = 32

    @classmethod
    def from_dict(cls, d: dict) -> SpeculativeConfig:
        known = {"method", "num_speculative_tokens", "model", "prompt_lookup_min", "prompt_lookup_max",
                 "draft_vocab_size", "disable_by_batch_size", "backoff_after", "backoff_max_steps"}
        unknown = set(d) - known
        if unknown:
            raise ValueError(
                f"--speculative-config: unknown keys {sorted(unknown)}; supported: {sorted(known)}"
            )
        method = d.get("method")
        model = d.get("model")
        # vLLM's older spellings of n-gram drafting: "model": "ngram" (was a drafter path 'ngram' that
        # does not exist) and "method": "[ngram]"
        if model in ("ngram", "[ngram]") and method in (None, "ngram", "[ngram]"):
            method, model = "ngram", None
        if method == "[ngram]":
            method = "ngram"
        if method is None and model:
            method = "draft_model"
        if method not in METHODS:
            raise ValueError(f"--speculative-config: method must be one of {', '.join(METHODS)}, got {method!r}")
        k = d.get("num_speculative_tokens")
        if not isinstance(k, int) or isinstance(k, bool) or k < 1:
            raise ValueError(f"--speculative-config: num_speculative_tokens must be an integer >= 1, got {k!r}")
        dv = d.get("draft_vocab_size")
        if dv is not None and (not isinstance(dv, int) or isinstance(dv, bool) or dv < 1):
            raise ValueError(f"--speculative-config: draft_vocab_size must be an integer >= 1, got {dv!r}")
        if dv is not None and method == "ngram":
            raise ValueError("--speculative-config: draft_vocab_size applies to a drafter model (methods "
                             "\"draft_model\" and \"dflash\"), not to \"ngram\"")
        off = d.get("disable_by_batch_size")
        if off is not None and (not isinstance(off, int) or isinstance(off, bool) or off < 2):
            raise ValueError("--speculative-config: disable_by_batch_size must be an integer >= 2 (the running "
                             f"sequences at which drafting stops; 1 would never speculate), got {off!r}")
        backoff = {}
        for key, default, low in (("backoff_after", None, 1), ("backoff_max_steps", 32, 1)):
            v = d.get(key, default)
            if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < low):
                raise ValueError(f"--speculative-config: {key} must be an integer >= {low}, got {v!r}")
            backoff[key] = v
        if "backoff_max_steps" in d and backoff["backoff_after"] is None:
            raise ValueError("--speculative-config: backoff_max_steps needs backoff_after (the rounds without an "
                             "accepted draft before a sequence backs off)")
        # keys of the other kind of drafter would be ignored, silently (a drafter's path given to
        # "ngram" drafted n-grams, not with the model)
        if method == "ngram" and model is not None:
            raise ValueError(f"--speculative-config: method \"ngram\" drafts from the sequence itself and takes no "
                             f"\"model\" (got {model!r}); for a drafter model use method \"draft_model\" or \"dflash\"")
        lookup_keys = sorted(k for k in ("prompt_lookup_min", "prompt_lookup_max") if k in d)
        if method != "ngram" and lookup_keys:
            raise ValueError(f"--speculative-config: {' and '.join(lookup_keys)} apply to method \"ngram\", not to "
                             f"{method!r}")
        lookup = {}
        for key, default in (("prompt_lookup_min", 1), ("prompt_lookup_max", 4)):
            v = d.get(key, default)
            if not isinstance(v, int) or isinstance(v, bool):
                raise ValueError(f"--speculative-config: {key} must be an integer, got {v!r}")
            lookup[key] = v
        if model is not None and not isinstance(model, str):
            raise ValueError(f"--speculative-config: model must be a path (a string), got {model!r}")
        cfg = cls(method, k, model, lookup["prompt_lookup_min"], lookup["prompt_lookup_max"], dv, off,
                  backoff["backoff_after"], backoff["backoff_max_steps"])
        if method in ("draft_model", "dflash") and not cfg.model:
            raise ValueError(f"--speculative-config: method {method!r} needs \"model\": the drafter's path")
        if method == "ngram" and not 1 <= cfg.prompt_lookup_min <= cfg.prompt_lookup_max:
            raise ValueError(
                "--speculative-config: need 1 <= prompt_lookup_min <= prompt_lookup_max, got "
                f"{cfg.prompt_lookup_min} and {cfg.prompt_lookup_max}"
            )
        return cfg


def draft_vocab_size(requested: int | None, vocab: int) -> int:
    """The drafter's vocabulary: the first `requested` token ids, or all `vocab` of them.

    Drafters draft the argmax of their logits and the target verifies exactly, so a drafter whose
    LM head keeps only the first N rows gives the same output and reads N / vocab of the head's
    bytes a drafting step (the 8B shape's 151,936-row head is 1.24 GB); acceptance drops where the
    target's token lies past N. Byte-level BPE vocabularies (Qwen, Llama 3) number tokens in merge
    order, which roughly follows frequency, so the first ids are the common ones."""
    if requested is None:
        return vocab
    if not 1 <= requested <= vocab:
        raise ValueError(f"--speculative-config: draft_vocab_size {requested} must be in [1, {vocab}] "
                         "(the target's vocabulary size)")
    return requested
