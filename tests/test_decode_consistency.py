"""scripts/decode_consistency.py on the CPU: the repeat and teacher-forced checks that found the
folded norms' stale reads on the H200 (session 41). The NumPy backend is deterministic, so a clean
run must pass; a decode step that computes something else must be caught."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from minillm.tools.random_model import write_random_model

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
import decode_consistency as dc  # noqa: E402 - a script beside the tests


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return str(write_random_model(tmp_path_factory.mktemp("tiny"), "tiny", seed=0))


def test_a_deterministic_backend_passes(tiny, tmp_path, capsys):
    out = tmp_path / "c.json"
    rc = dc.main([tiny, "--device", "cpu", "--repeats", "2", "--max-tokens", "6", "--configs", "sync,eager_sync",
                  "--json", str(out)])
    assert rc == 0, capsys.readouterr().out
    r = json.loads(out.read_text())
    assert set(r) == {"sync", "eager_sync"}
    for v in r.values():
        assert v["repeats_equal"] == [True, True] and v["not_argmax"] == [[], [], []]
        assert v["first_difference_from_first_config"] == [None, None, None]
        assert v["prefix_caching"] is False  # repeats must compute what the first run did
        assert all(len(t) == 6 for t in v["token_ids"][0])


def test_a_token_the_prefill_ranks_low_is_wrong(tiny, monkeypatch, capsys):
    """A run whose second repeat takes the prefill's least likely token at one position: the
    repeats differ, and that token is judged wrong; exit status 1."""
    from minillm import LLM

    real = LLM.generate
    calls = {"n": 0}

    def generate(self, prompts, params):
        outs = real(self, prompts, params)
        calls["n"] += 1
        if calls["n"] == 5:  # the second repeat's second prompt (three prompts a repeat)
            ids = list(prompts[0]) + outs[0].token_ids[:2]
            worst = int(dc.np.argmin(self.engine.score([ids])[0][-1]))
            outs[0].token_ids[2] = worst
        return outs

    monkeypatch.setattr(LLM, "generate", generate)
    assert dc.main([tiny, "--device", "cpu", "--repeats", "2", "--max-tokens", "6", "--configs", "sync"]) == 1
    text = capsys.readouterr().out
    assert "repeats equal [True, False]" in text
    assert "token 2: chose" in text and text.rstrip().endswith("wrong")


def test_speculative_configs_pass_on_a_deterministic_backend(tiny):
    """n-gram and self-drafting runs under the same checks: token-identical to plain decoding on
    the NumPy backend, every token the prefill's argmax."""
    assert dc.main([tiny, "--device", "cpu", "--repeats", "1", "--max-tokens", "6", "--configs",
                    "sync,ngram,self_draft"]) == 0
    assert dc.engine_args("self_draft", tiny)["speculative_config"]["model"] == tiny
    assert dc.engine_args("self_draft", None)["speculative_config"]["model"] == "smollm2-135m-instruct"
    assert "model" not in dc.CONFIGS["self_draft"]["speculative_config"]  # the table stays untouched


def test_prefix_caching_only_on_request(tiny, tmp_path):
    out = tmp_path / "c.json"
    assert dc.main([tiny, "--device", "cpu", "--repeats", "2", "--max-tokens", "4", "--configs", "sync",
                    "--prefix-caching", "--json", str(out)]) == 0
    assert json.loads(out.read_text())["sync"]["prefix_caching"] is True
