"""Build the drafter a SpeculativeConfig names, and keep the acceptance statistics."""

from __future__ import annotations

from contextlib import contextmanager

from minillm.models.loader import load_model


class SpecStats:
    """Rounds, drafted and accepted tokens, and the acceptance rate at each draft position."""

    def __init__(self, k: int):
        self.k = k
        self.rounds = 0
        self.drafted = 0
        self.accepted = 0
        self.accepted_at = [0] * k  # rounds whose draft j was accepted
        self.drafted_at = [0] * k
        self.paused_steps = 0  # steps that drafted nothing for disable_by_batch_size
        self.backoff_steps = 0  # a sequence's plain decode steps in backoff (backoff_after)

    def record(self, num_draft: int, num_accepted: int) -> None:
        self.rounds += 1
        self.drafted += num_draft
        self.accepted += num_accepted
        for j in range(num_draft):
            self.drafted_at[j] += 1
            if j < num_accepted:
                self.accepted_at[j] += 1

    def as_dict(self) -> dict:
        if not self.k:
            return {}
        return {
            "rounds": self.rounds, "draft_tokens": self.drafted, "accepted_tokens": self.accepted,
            # tokens appended per verification round: the accepted drafts plus one
            "mean_acceptance_length": (self.accepted + self.rounds) / self.rounds if self.rounds else 0.0,
            "acceptance_rate": self.accepted / self.drafted if self.drafted else 0.0,
            "acceptance_rate_per_position": [a / d if d else 0.0 for a, d in zip(self.accepted_at, self.drafted_at)],
            "accepted_tokens_per_position": list(self.accepted_at),
            "paused_steps": self.paused_steps,
            "backoff_steps": self.backoff_steps,
        }


def lookahead(spec) -> int:
    """Positions past the last token a drafter writes KV to (sizes block tables and the pool)."""
    if spec is None:
        return 0
    if spec.method == "dflash":
        from minillm.spec.dflash import dflash_block_size

        with drafter_errors():
            bs = dflash_block_size(spec.model)
        if spec.num_speculative_tokens > bs - 1:
            raise ValueError(f"--speculative-config: num_speculative_tokens {spec.num_speculative_tokens} is above "
                             f"the DFlash block size minus one ({bs - 1})")
        return bs - 1
    return spec.num_speculative_tokens


def build_proposer(engine):
    """The drafter for engine.spec, checked against the target (vocabulary, block size).

    Its weights are loaded now; its KV pool is allocated by attach() once the engine has sized the
    pool for target and drafter together (kv_bytes_per_token).
    """
    spec = engine.spec
    if spec.method == "ngram":
        from minillm.spec.ngram import NgramProposer

        return NgramProposer(spec.num_speculative_tokens, spec.prompt_lookup_min, spec.prompt_lookup_max)
    if spec.method == "dflash":
        return _dflash(engine)
    with drafter_errors():
        loaded = load_model(spec.model)
    if loaded.config.vocab_size != engine.config.vocab_size:
        raise ValueError(
            f"--speculative-config: the drafter {spec.model} has vocabulary size {loaded.config.vocab_size}, "
            f"the target {engine.config.vocab_size}; a drafter must share the target's tokenizer"
        )
    r = engine.runner_args
    if spec.method == "draft_model":
        from minillm.spec.draft_model import DraftModelProposer

        return DraftModelProposer(loaded, engine.backend, spec.num_speculative_tokens,
                                  r["max_tokens"], r["max_seqs"], r["max_model_len"], spec.draft_vocab_size)
    raise AssertionError(spec.method)


def _dflash(engine):
    from minillm.spec.dflash import DFlashProposer

    spec, r = engine.spec, engine.runner_args
    with drafter_errors():
        return DFlashProposer(spec.model, engine.model, engine.backend, spec.num_speculative_tokens,
                              r["max_tokens"], r["max_seqs"], engine.max_model_len, spec.draft_vocab_size)


@contextmanager
def drafter_errors():
    """A missing or malformed drafter says it is the drafter (the target's errors read the same)."""
    try:
        yield
    except FileNotFoundError as e:
        raise FileNotFoundError(f'--speculative-config "model" (the drafter): {e}') from None
    except NotADirectoryError as e:  # a file given where the drafter's directory belongs
        raise ValueError(f'--speculative-config "model" (the drafter): {e}: a drafter is a directory '
                         "(config.json and *.safetensors)") from None
    except ValueError as e:
        if str(e).startswith("--speculative-config"):
            raise
        raise ValueError(f'--speculative-config "model" (the drafter): {e}') from None
