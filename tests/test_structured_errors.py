"""A structured output whose llguidance matcher fails mid-output (a limit of llguidance's met while a
mask is computed or a token consumed) ends with finish reason "error" and a message: offline in
CompletionOutput.error, on the server as a 500 / a stream's error event then [DONE]. The other
requests of the batch run on as if it were not there.

The failure is real, not mocked: MINILLM_GRAMMAR_FUEL (engine/structured.py `_limits`) lowers
llguidance's per-mask lexer fuel (step_lexer_fuel), and a regex of 300 alternatives after a literal
prefix runs out of it once the prefix is written ("lexer error: too many expressions constructed").
Each test uses its own prefix: a compiled constraint is cached with the limits it was compiled with.
"""

from __future__ import annotations

import json
import os
import random
import re
import threading

import httpx
import llguidance
import numpy as np
import openai
import pytest
from test_server import Server

from minillm import LLM, SamplingParams
from minillm.sampling_params import StructuredOutputsParams as SO

FUEL = "500"
LIMIT = "too many expressions constructed"
_rng = random.Random(0)
WORDS = ["".join(_rng.choice("abcdefghijklmnop") for _ in range(8)) for _ in range(300)]


def hard(prefix: str) -> str:
    """A regex whose masks past `prefix` need more lexer fuel than FUEL gives."""
    return re.escape(prefix) + "(" + "|".join(WORDS) + ")"


def check_failed(text: str, reason: str, error: str | None, prefix: str) -> None:
    assert reason == "error", (text, reason)
    assert error and "structured output failed mid-output" in error and LIMIT in error, error
    assert prefix.startswith(text), text  # what the constraint accepted before the limit, nothing else


@pytest.fixture(scope="module")
def tiny(byte_llama):
    return LLM(str(byte_llama), device="cpu", max_model_len=256, max_num_seqs=8)


def test_llguidance_on_a_limit(tiny):
    """What llguidance 1.9 does (the engine's handling rests on it): the first mask is within the
    fuel; once the prefix is consumed, compute_mask meets the limit, puts the matcher in an error
    state (is_error, get_error naming the limit) and returns a mask that allows EOS alone; the
    state stays (rollback fails) and the matcher counts as stopped."""
    gc = tiny.engine.grammars
    gc.matcher(SO(regex="x"))  # builds llguidance's tokenizer
    lim = llguidance.LLParserLimits(verbose_errors=False, step_lexer_fuel=int(FUEL))
    m = llguidance.LLMatcher(gc._lltok, llguidance.grammar_from("regex", hard("ok ")), log_level=0, limits=lim)
    words = gc.words
    out = np.zeros(words, np.int32)
    m.unsafe_compute_mask_ptr(out.ctypes.data, words * 4)
    assert not m.is_error() and out.any()
    for t in tiny.tokenizer.tok.encode("ok ", add_special_tokens=False).ids:
        assert m.consume_token(t), m.get_error()
    out[:] = 0
    m.unsafe_compute_mask_ptr(out.ctypes.data, words * 4)
    assert m.is_error() and LIMIT in m.get_error() and m.is_stopped()
    allowed = [t for t in range(gc.vocab_size) if (int(out[t >> 5]) >> (t & 31)) & 1]
    assert allowed == sorted(gc.eos_ids)
    assert not m.rollback(1) and m.is_error()


@pytest.mark.parametrize("async_scheduling", [True, False])
def test_failure_is_reported_and_the_batch_runs_on(tiny, monkeypatch, async_scheduling):
    monkeypatch.setenv("MINILLM_GRAMMAR_FUEL", FUEL)
    tiny.engine.async_scheduling = async_scheduling
    prefix = f"ok{int(async_scheduling)} "
    others = [("hello", SamplingParams(temperature=0, max_tokens=12)),
              ("hello", SamplingParams(temperature=1.0, seed=3, max_tokens=12)),
              ("hi", SamplingParams(temperature=0, max_tokens=12, structured_outputs=SO(choice=["red", "blue"])))]
    failing = ("hello", SamplingParams(temperature=0, max_tokens=30, structured_outputs=SO(regex=hard(prefix))))
    before = tiny.engine.stats().generation_tokens
    outs = tiny.generate([p for p, _ in [failing] + others], [s for _, s in [failing] + others])
    check_failed(outs[0].text, outs[0].finish_reason, outs[0].error, prefix)
    assert tiny.tokenizer.decode(outs[0].token_ids) == outs[0].text  # no id past the text
    assert outs[3].text in ("red", "blue") and outs[3].finish_reason == "stop"
    assert all(o.error is None for o in outs[1:])
    alone = tiny.generate([p for p, _ in others], [s for _, s in others])
    assert [o.token_ids for o in outs[1:]] == [o.token_ids for o in alone]
    assert [o.finish_reason for o in outs[1:]] == [o.finish_reason for o in alone]
    # the engine's token count moved by what was returned (the failed step's ids are not counted)
    total = sum(len(o.token_ids) for o in outs) + sum(len(o.token_ids) for o in alone)
    assert tiny.engine.stats().generation_tokens - before == total
    assert not tiny.engine.has_unfinished() and tiny.engine.block_manager.num_used == 0
    tiny.engine.async_scheduling = True


def test_default_limits_finish(tiny, monkeypatch):
    """The same constraint under llguidance's default fuel completes: the limit is what failed."""
    monkeypatch.delenv("MINILLM_GRAMMAR_FUEL", raising=False)
    o = tiny.generate("hello", SamplingParams(temperature=0, max_tokens=30,
                                             structured_outputs=SO(regex=hard("ok9 "))))
    assert o[0].finish_reason == "stop" and o[0].error is None
    assert re.fullmatch(hard("ok9 "), o[0].text), o[0].text


# ---- the server ------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def server(byte_llama, tmp_path_factory):
    srv = Server(byte_llama, tmp_path_factory.mktemp("log") / "server.log", "--served-model-name", "tiny",
                 env={"MINILLM_GRAMMAR_FUEL": FUEL})
    yield srv
    assert srv.stop() == 0, srv.text()
    assert "Traceback" not in srv.text()


def so(prefix: str) -> dict:
    return {"structured_outputs": {"regex": hard(prefix)}}


def errors_counted(server) -> float:
    return server.metrics().get('minillm:request_success_total{finished_reason="error"}', 0.0)


def test_server_not_streamed(server):
    client = server.client()
    n0 = errors_counted(server)
    with pytest.raises(openai.InternalServerError) as e:
        client.completions.create(model="tiny", prompt="hello", max_tokens=30, temperature=0, extra_body=so("ab "))
    assert e.value.status_code == 500 and LIMIT in e.value.message and "mid-output" in e.value.message
    body = e.value.body
    assert body["type"] == "internal_server_error" and LIMIT in body["message"]
    with pytest.raises(openai.InternalServerError) as e:  # one failing choice of n fails the response
        client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}], n=2,
                                       max_tokens=30, temperature=0, extra_body=so("cd "))
    assert "choice " in e.value.message and LIMIT in e.value.message
    assert errors_counted(server) == n0 + 2
    ok = client.completions.create(model="tiny", prompt="hello", max_tokens=8, temperature=0,
                                   extra_body={"structured_outputs": {"choice": ["red", "blue"]}})
    assert ok.choices[0].text in ("red", "blue") and ok.choices[0].finish_reason == "stop"


def test_server_streamed(server):
    client = server.client()
    n0 = errors_counted(server)
    with pytest.raises(openai.APIError) as e:
        for _ in client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}],
                                                max_tokens=30, temperature=0, stream=True, extra_body=so("ef ")):
            pass
    assert LIMIT in e.value.message
    # the raw stream: the text the constraint accepted, then one error event, then [DONE]
    body = {"model": "tiny", "prompt": "hello", "max_tokens": 30, "temperature": 0, "stream": True, **so("gh ")}
    with httpx.stream("POST", f"{server.url}/v1/completions", json=body, timeout=60) as r:
        events = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    err = json.loads(events[-2])
    assert LIMIT in err["error"]["message"] and err["error"]["code"] == 500
    text = "".join(json.loads(ev)["choices"][0]["text"] for ev in events[:-2])
    assert "gh ".startswith(text)
    assert all(json.loads(ev)["choices"][0]["finish_reason"] is None for ev in events[:-2])
    assert errors_counted(server) == n0 + 2


def test_server_other_requests_unaffected(server):
    """A failing request beside plain ones, in the same steps: theirs are what they are alone."""
    client = server.client()
    plain = dict(model="tiny", prompt="hello", max_tokens=16, temperature=0, extra_body={"ignore_eos": True})
    alone = client.completions.create(**plain).choices[0].text
    results, failures = [], []

    def run_plain():
        results.append(client.completions.create(**plain).choices[0].text)

    def run_failing(prefix):
        try:
            client.completions.create(model="tiny", prompt="hello", max_tokens=30, temperature=0,
                                      extra_body=so(prefix))
        except openai.InternalServerError as e:
            failures.append(e.message)

    threads = [threading.Thread(target=run_plain) for _ in range(3)]
    threads += [threading.Thread(target=run_failing, args=(p,)) for p in ("ij ", "kl ")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert results == [alone] * 3
    assert len(failures) == 2 and all(LIMIT in f for f in failures)
    assert httpx.get(f"{server.url}/health").status_code == 200


def test_a_bad_mask_threads_variable_is_a_start_up_error(tmp_path):
    """MINILLM_MASK_PARALLEL_MIN=abc failed `import minillm` itself with a traceback (an int() at
    import); now the engine's start-up refuses it in one line naming the variable."""
    import subprocess
    import sys

    env = {**os.environ, "MINILLM_MASK_PARALLEL_MIN": "abc"}
    code = "import minillm; from minillm.engine.structured import GrammarCompiler; GrammarCompiler(None, 8, [0])"
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode != 0
    assert "ValueError: MINILLM_MASK_PARALLEL_MIN='abc': give an integer >= 0" in r.stderr, r.stderr
    r = subprocess.run([sys.executable, "-c", "import minillm.engine.structured"], env=env, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr


def test_an_added_tokens_text_in_a_constraint_is_named(tmp_path):
    """llguidance 1.9 allows a non-special added token (Qwen's <tool_call>, <think>) where the
    constraint's text spells it, then refuses it when consumed (outlines #1771). The refusal named
    "a limit of llguidance's ... simplify the constraint"; it now names the token and what to do."""
    from tokenizers import AddedToken, Tokenizer

    from minillm.tools.random_model import write_random_model

    path = write_random_model(tmp_path / "m", "tiny")
    tok = Tokenizer.from_file(str(path / "tokenizer.json"))
    tok.add_tokens([AddedToken("<tool_call>", special=False, normalized=False)])
    tok.save(str(path / "tokenizer.json"))
    added = tok.token_to_id("<tool_call>")
    llm = LLM(str(path), device="cpu", max_model_len=64)
    with pytest.raises(ValueError, match=rf"spells '<tool_call>', the tokenizer's added token {added},"):
        llm.generate(["hi"], SamplingParams(max_tokens=8, structured_outputs=SO(choice=["<tool_call>"])))
    out = llm.generate(["hi"], SamplingParams(max_tokens=8, structured_outputs=SO(choice=["tool_call"])))[0]
    assert out.text == "tool_call"  # the same text without the added token's spelling follows
