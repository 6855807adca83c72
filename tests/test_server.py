"""The OpenAI-compatible server, end to end: a real `python -m minillm.serve` subprocess on a tiny
random model, driven by the official openai client (and raw httpx where the bytes matter).

Also the lifecycle: a disconnected stream frees its blocks, an injected engine fault reaches every
open stream as an error event and turns /health 503, SIGTERM drains open requests and exits 0.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import openai
import pytest

from hf_models import make_tiny

ROOT = Path(__file__).resolve().parents[1]
READY = re.compile(r"minillm ready: serving .* at (http://[^/\s]+)/v1")


class Server:
    """`python -m minillm.serve MODEL --device cpu --port 0 ...`; the URL comes from its ready line."""

    def __init__(self, model: Path, log: Path, *flags: str, env: dict | None = None):
        self.log = log
        cmd = [sys.executable, "-m", "minillm.serve", str(model), "--device", "cpu", "--port", "0", *flags]
        self.proc = subprocess.Popen(cmd, cwd=ROOT, stdout=log.open("wb"), stderr=subprocess.STDOUT,
                                     env={**os.environ, **(env or {})})
        deadline = time.monotonic() + 90
        while not (m := READY.search(self.text())):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.proc.kill()
                raise RuntimeError(f"server did not start:\n{self.text()}")
            time.sleep(0.05)
        self.url = m.group(1)

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def client(self, **kw) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.url}/v1", api_key=kw.pop("api_key", "none"), max_retries=0, **kw)

    def wait_idle(self, timeout: float = 5) -> dict[str, float]:
        """The metrics once no request runs (or after timeout seconds): what an aborted request left."""
        deadline = time.monotonic() + timeout
        while (m := self.metrics())["minillm:num_requests_running"] and time.monotonic() < deadline:
            time.sleep(0.02)
        return m

    def metrics(self) -> dict[str, float]:
        """Each minillm series by its name and labels, the model_name label every series carries left
        out (test_metrics checks it): {'minillm:request_success_total{finished_reason="stop"}': 3.0, ...}."""
        text = httpx.get(f"{self.url}/metrics").text
        out = {}
        for name, labels, value in re.findall(r"^(minillm:[^\s{]+)(?:\{(.*)\})? ([-+.e0-9]+)$", text, re.M):
            rest = ",".join(lb for lb in re.findall(r'\w+="[^"]*"', labels) if not lb.startswith("model_name="))
            out[f"{name}{{{rest}}}" if rest else name] = float(value)
        return out

    def stop(self, timeout: float = 30) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise


def serve_cli(*flags: str) -> subprocess.CompletedProcess:
    """`python -m minillm.serve --device cpu --port 0 FLAGS` run to its end: flags it refuses end it at once."""
    return subprocess.run([sys.executable, "-m", "minillm.serve", "--device", "cpu", "--port", "0", *flags],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("tiny-llama")
    make_tiny("llama", path)
    return path


@pytest.fixture(scope="module")
def server(model_dir, tmp_path_factory):
    # the step delay keeps long requests in flight for the disconnect test, at little cost elsewhere
    srv = Server(model_dir, tmp_path_factory.mktemp("log") / "server.log", "--enable-prompt-tokens-details",
                 env={"MINILLM_TEST_STEP_DELAY": "0.003"})
    yield srv
    assert srv.stop() == 0, srv.text()
    assert "Traceback" not in srv.text()


def model_name(server) -> str:
    return server.client().models.list().data[0].id


# ---- the basics ---------------------------------------------------------------------------
def test_models_and_health(server, model_dir):
    models = server.client().models.list().data
    assert [m.id for m in models] == [str(model_dir)]
    assert 0 < models[0].created <= time.time()  # when the server started, as vLLM's cards say
    assert httpx.get(f"{server.url}/health").status_code == 200


def test_completion(server):
    c = server.client().completions.create(model=model_name(server), prompt="hello", max_tokens=7,
                                           temperature=0, extra_body={"ignore_eos": True})
    assert c.id.startswith("cmpl-") and c.object == "text_completion" and c.created > 0
    assert c.choices[0].finish_reason == "length"
    assert (c.usage.prompt_tokens, c.usage.completion_tokens, c.usage.total_tokens) == (5, 7, 12)


def test_completion_token_ids_and_default_max_tokens(server):
    # no max_tokens: what is left of max_model_len (512) after the prompt, as vLLM does
    c = server.client().completions.create(model=model_name(server), prompt=[40 + i % 200 for i in range(460)],
                                           temperature=0, extra_body={"ignore_eos": True})
    assert c.usage.prompt_tokens == 460 and c.usage.completion_tokens == 52
    assert c.choices[0].finish_reason == "length"


def test_prompt_tokens_details(server):
    """--enable-prompt-tokens-details: usage.prompt_tokens_details.cached_tokens is the prompt tokens
    the prefix cache held (whole 16-token blocks; the last prompt token is always computed): none the
    first time a prompt is seen, the blocks before its last token the next time; each prompt counted
    once with n > 1, as prompt_tokens is; streamed in the usage chunk and per choice."""
    cl, name = server.client(), model_name(server)
    prompt = [7 + i % 50 for i in range(70)]  # 4 whole blocks before the last token
    kw = dict(model=name, max_tokens=2, extra_body={"ignore_eos": True})
    first = cl.completions.create(prompt=prompt, **kw).usage
    assert first.prompt_tokens_details.cached_tokens == 0
    assert cl.completions.create(prompt=prompt, **kw).usage.prompt_tokens_details.cached_tokens == 64
    two = cl.completions.create(prompt=[prompt, prompt[:40]], n=2, **kw).usage
    assert (two.prompt_tokens, two.prompt_tokens_details.cached_tokens) == (110, 64 + 32)
    every = {"include_usage": True, "continuous_usage_stats": True}
    chunks = list(cl.completions.create(prompt=prompt, stream=True, stream_options=every, **kw))
    assert chunks[-1].usage.prompt_tokens_details.cached_tokens == 64
    assert all(c.usage.prompt_tokens_details.cached_tokens == 64 for c in chunks)
    msgs = [{"role": "user", "content": "the same question, asked twice over " * 3}]
    chat = [cl.chat.completions.create(model=name, messages=msgs, max_tokens=2).usage for _ in range(2)]
    assert chat[1].prompt_tokens_details.cached_tokens == (chat[1].prompt_tokens - 1) // 16 * 16 > 0


def test_completion_stream_matches_non_stream(server):
    cl, name = server.client(), model_name(server)
    ref = cl.completions.create(model=name, prompt="The quick brown fox", max_tokens=24, temperature=0,
                                extra_body={"ignore_eos": True})
    chunks = list(cl.completions.create(model=name, prompt="The quick brown fox", max_tokens=24, temperature=0,
                                        stream=True, stream_options={"include_usage": True},
                                        extra_body={"ignore_eos": True}))
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == ref.choices[0].text
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 24
    assert all(c.id == chunks[0].id for c in chunks) and chunks[0].id.startswith("cmpl-")


def test_continuous_usage_stats(server):
    """vLLM's stream_options.continuous_usage_stats: every chunk carries its choice's usage so far
    (its prompt's tokens, its completion tokens, their sum), rising to what the final usage chunk
    and the non-streamed response say; chat's role chunk says 0 completion tokens."""
    cl, name = server.client(), model_name(server)
    opts = {"include_usage": True, "continuous_usage_stats": True}
    ref = cl.completions.create(model=name, prompt="The quick brown fox", max_tokens=9, temperature=0,
                                extra_body={"ignore_eos": True})
    chunks = list(cl.completions.create(model=name, prompt="The quick brown fox", max_tokens=9, temperature=0,
                                        stream=True, stream_options=opts, extra_body={"ignore_eos": True}))
    *body, last = chunks
    assert last.choices == [] and last.usage.completion_tokens == 9 == ref.usage.completion_tokens
    seen = [c.usage.completion_tokens for c in body]
    assert seen == sorted(seen) and seen[-1] == 9 and seen[0] >= 1
    assert all(c.usage.prompt_tokens == ref.usage.prompt_tokens
               and c.usage.total_tokens == c.usage.prompt_tokens + c.usage.completion_tokens for c in body)
    chat = list(cl.chat.completions.create(model=name, messages=[{"role": "user", "content": "hi"}], max_tokens=4,
                                           temperature=0, stream=True, stream_options=opts,
                                           extra_body={"ignore_eos": True}))
    assert chat[0].choices[0].delta.role == "assistant" and chat[0].usage.completion_tokens == 0
    assert [c.usage.completion_tokens for c in chat[:-1]][-1] == 4 == chat[-1].usage.completion_tokens
    # include_usage alone: null in every chunk but the last (as before)
    plain = list(cl.completions.create(model=name, prompt="hi", max_tokens=3, stream=True,
                                       stream_options={"include_usage": True}, extra_body={"ignore_eos": True}))
    assert all(c.usage is None for c in plain[:-1]) and plain[-1].usage.completion_tokens == 3


def test_n_choices(server):
    """n > 1: n engine requests sharing the prompt; choice i samples with seed + i, so choice 0 is
    the n = 1 answer, a repeated request repeats all n, and usage counts every choice's tokens."""
    cl, name = server.client(), model_name(server)
    kw = dict(model=name, prompt="Once upon a time", max_tokens=12, temperature=1.0, seed=7,
              extra_body={"ignore_eos": True})
    one = cl.completions.create(**kw)
    three = cl.completions.create(n=3, **kw)
    assert [c.index for c in three.choices] == [0, 1, 2]
    assert three.choices[0].text == one.choices[0].text
    assert len({c.text for c in three.choices}) > 1  # other seeds, other samples
    assert [c.text for c in cl.completions.create(n=3, **kw).choices] == [c.text for c in three.choices]
    assert three.usage.completion_tokens == 36 and three.usage.prompt_tokens == one.usage.prompt_tokens

    greedy = cl.completions.create(n=2, **{**kw, "temperature": 0})
    assert greedy.choices[0].text == greedy.choices[1].text

    # streamed, chat: every chunk names its choice; each choice gets its role, its text, its finish
    msgs = [{"role": "user", "content": "hi"}]
    ref = cl.chat.completions.create(model=name, messages=msgs, n=2, max_tokens=10, temperature=1.0, seed=3,
                                     extra_body={"ignore_eos": True})
    chunks = list(cl.chat.completions.create(model=name, messages=msgs, n=2, max_tokens=10, temperature=1.0,
                                             seed=3, stream=True, stream_options={"include_usage": True},
                                             extra_body={"ignore_eos": True}))
    for i in range(2):
        mine = [c.choices[0] for c in chunks if c.choices and c.choices[0].index == i]
        assert mine[0].delta.role == "assistant" and mine[-1].finish_reason == "length"
        assert "".join(ch.delta.content or "" for ch in mine) == ref.choices[i].message.content
    assert chunks[-1].usage.completion_tokens == 20 == ref.usage.completion_tokens


def test_batched_prompts(server):
    """A completions batch (strings and token ids) with n = 2: choices prompt by prompt, n each,
    each what its prompt alone gives; usage counts every prompt once and every choice's tokens."""
    cl, name = server.client(), model_name(server)
    kw = dict(model=name, max_tokens=6, temperature=0.9, seed=11, extra_body={"ignore_eos": True})
    prompts = ["first prompt", [70, 71, 72]]
    c = cl.completions.create(prompt=prompts, n=2, **kw)
    assert [ch.index for ch in c.choices] == [0, 1, 2, 3]
    alone = [cl.completions.create(prompt=p, n=2, **kw) for p in prompts]
    assert [ch.text for ch in c.choices] == [ch.text for a in alone for ch in a.choices]
    assert c.usage.prompt_tokens == sum(a.usage.prompt_tokens for a in alone)
    assert c.usage.completion_tokens == 24
    chunks = list(cl.completions.create(prompt=prompts, n=2, stream=True, **kw))
    texts = ["".join(ch.choices[0].text for ch in chunks if ch.choices and ch.choices[0].index == k)
             for k in range(4)]
    assert texts == [ch.text for ch in c.choices]


def test_logprobs(server):
    """logprobs through the official client: the legacy completions body (tokens, token_logprobs,
    top_logprobs with the sampled token, text_offset) and the chat body (content entries with
    bytes and top_logprobs), streamed and not, one entry per completion token."""
    cl, name = server.client(), model_name(server)
    kw = dict(model=name, prompt="Once upon", max_tokens=6, temperature=0, extra_body={"ignore_eos": True})
    c = cl.completions.create(logprobs=2, **kw)
    lp = c.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 6 == c.usage.completion_tokens
    assert "".join(lp.tokens) == c.choices[0].text and lp.text_offset[0] == 0
    assert all(v <= 0 for v in lp.token_logprobs)
    for tok, v, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs):
        # keyed by text: the tiny model's byte tokens may read alike ("\ufffd"), so 1-3 keys
        assert 1 <= len(top) <= 3 and top[tok] == v == max(top.values())  # greedy: the best one
    streamed = [ch.choices[0].logprobs for ch in cl.completions.create(stream=True, logprobs=2, **kw)
                if ch.choices and ch.choices[0].logprobs]
    assert sum((s.token_logprobs for s in streamed), []) == pytest.approx(lp.token_logprobs, abs=1e-5)
    assert sum((s.text_offset for s in streamed), []) == lp.text_offset
    assert cl.completions.create(**kw).choices[0].logprobs is None

    msgs = [{"role": "user", "content": "hi"}]
    ckw = dict(model=name, messages=msgs, max_tokens=5, temperature=0, logprobs=True, top_logprobs=3,
               extra_body={"ignore_eos": True})
    r = cl.chat.completions.create(**ckw)
    content = r.choices[0].logprobs.content
    assert len(content) == 5 and all(len(e.top_logprobs) == 3 for e in content)
    assert all(e.top_logprobs[0].token == e.token and e.top_logprobs[0].logprob == e.logprob for e in content)
    assert all(bytes(e.bytes).decode() == e.token for e in content)
    chunks = list(cl.chat.completions.create(stream=True, **ckw))
    got = [e.logprob for ch in chunks if ch.choices and ch.choices[0].logprobs for e in ch.choices[0].logprobs.content]
    # (a prefix-cache hit computes the prompt's last row in a smaller product: float32 rounding)
    assert got == pytest.approx([e.logprob for e in content], abs=1e-5)


def test_logprobs_as_token_ids(server):
    """vLLM's return_tokens_as_token_ids: each logprobs token is named "token_id:<id>", so the
    tiny model's byte tokens that read alike stay apart; the values are the plain body's."""
    cl, name = server.client(), model_name(server)
    kw = dict(model=name, prompt="Once upon", max_tokens=6, temperature=0, logprobs=2)
    plain = cl.completions.create(**kw).choices[0].logprobs
    lp = cl.completions.create(**kw, extra_body={"return_tokens_as_token_ids": True}).choices[0].logprobs
    assert lp.token_logprobs == pytest.approx(plain.token_logprobs, abs=1e-5)
    ids = [int(t.removeprefix("token_id:")) for t in lp.tokens]
    assert all(t.startswith("token_id:") for t in lp.tokens) and all(0 <= i < 256 for i in ids)
    assert all(len(top) == 2 and top[tok] == v for tok, v, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs))
    streamed = [ch.choices[0].logprobs for ch in cl.completions.create(
        stream=True, **kw, extra_body={"return_tokens_as_token_ids": True}) if ch.choices and ch.choices[0].logprobs]
    assert sum((s.tokens for s in streamed), []) == lp.tokens
    r = cl.chat.completions.create(model=name, messages=[{"role": "user", "content": "hi"}], max_tokens=4,
                                   temperature=0, logprobs=True, top_logprobs=3,
                                   extra_body={"return_tokens_as_token_ids": True})
    for e in r.choices[0].logprobs.content:
        assert e.token.startswith("token_id:") and bytes(e.bytes).decode() == e.token
        assert len({t.token for t in e.top_logprobs}) == 3 and e.top_logprobs[0].token == e.token


def test_echo(server):
    """echo on /v1/completions: the prompt's text first and, with logprobs, its tokens' logprobs
    first (the first token's null), then the completion's; max_tokens 0 scores the prompt and
    generates nothing (lm-evaluation-harness's loglikelihood requests); streamed and not, batched."""
    cl, name = server.client(), model_name(server)
    prompt = "Once upon a time"  # the byte tokenizer: one token a character
    kw = dict(model=name, temperature=0, extra_body={"ignore_eos": True})
    gen = cl.completions.create(prompt=prompt, max_tokens=6, logprobs=2, **kw).choices[0]
    c = cl.completions.create(prompt=prompt, max_tokens=6, logprobs=2, echo=True, **kw)
    ch, lp = c.choices[0], c.choices[0].logprobs
    assert ch.text == prompt + gen.text and ch.finish_reason == "length"
    assert (c.usage.prompt_tokens, c.usage.completion_tokens) == (len(prompt), 6)
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(prompt) + 6
    assert "".join(lp.tokens[:len(prompt)]) == prompt and lp.text_offset[len(prompt)] == len(prompt)
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    assert all(v <= 0 for v in lp.token_logprobs[1:])
    for tok, v, top in zip(lp.tokens[1:len(prompt)], lp.token_logprobs[1:], lp.top_logprobs[1:]):
        assert top[tok] == v and 1 <= len(top) <= 3  # the prompt token, then the 2 best
    assert lp.token_logprobs[len(prompt):] == pytest.approx(gen.logprobs.token_logprobs, abs=1e-5)

    zero = cl.completions.create(prompt=prompt, max_tokens=0, logprobs=2, echo=True, **kw)
    assert zero.choices[0].text == prompt and zero.choices[0].finish_reason == "length"
    assert (zero.usage.prompt_tokens, zero.usage.completion_tokens) == (len(prompt), 0)
    zlp = zero.choices[0].logprobs
    assert zlp.tokens == lp.tokens[:len(prompt)] and zlp.text_offset == lp.text_offset[:len(prompt)]
    assert zlp.token_logprobs[0] is None
    assert zlp.token_logprobs[1:] == pytest.approx(lp.token_logprobs[1:len(prompt)], abs=1e-5)

    # a prompt logprob is the probability of that token after the ones before it: the model's
    # distribution after a prefix, for characters among its 20 best
    greedy_seen = set()
    for prefix in (prompt, "abc", "hello world", "The quick brown fox", "1 2 3 4"):
        top = cl.completions.create(prompt=prefix, max_tokens=1, logprobs=20, **kw).choices[0].logprobs.top_logprobs[0]
        best = max(top, key=top.get)
        for t in [t for t in top if len(t) == 1 and t.isascii() and t.isprintable()][:3]:
            s = cl.completions.create(prompt=prefix + t, max_tokens=0, logprobs=1, echo=True, **kw).choices[0]
            assert s.logprobs.tokens[-1] == t and s.logprobs.token_logprobs[-1] == pytest.approx(top[t], abs=1e-4)
            # lm-evaluation-harness's is_greedy: the token's logprob is the best of its top_logprobs
            greedy = s.logprobs.token_logprobs[-1] == max(s.logprobs.top_logprobs[-1].values())
            assert greedy == (t == best)
            greedy_seen.add(greedy)
    assert greedy_seen == {True, False}

    # streamed: the prompt and its logprobs in each choice's first chunk, then the completion's
    for max_tokens, ref in ((6, c), (0, zero)):
        chunks = [x for x in cl.completions.create(prompt=prompt, max_tokens=max_tokens, logprobs=2, echo=True,
                                                   stream=True, **kw) if x.choices]
        assert chunks[0].choices[0].text.startswith(prompt)
        assert len(chunks[0].choices[0].logprobs.tokens) >= len(prompt)
        assert "".join(x.choices[0].text for x in chunks) == ref.choices[0].text
        got = [x.choices[0].logprobs for x in chunks if x.choices[0].logprobs]
        assert sum((g.tokens for g in got), []) == ref.choices[0].logprobs.tokens
        assert sum((g.text_offset for g in got), []) == ref.choices[0].logprobs.text_offset
        vals = sum((g.token_logprobs for g in got), [])
        assert vals[0] is None and vals[1:] == pytest.approx(ref.choices[0].logprobs.token_logprobs[1:], abs=1e-5)
        assert chunks[-1].choices[0].finish_reason == "length"

    # without logprobs: the text only
    plain = cl.completions.create(prompt=prompt, max_tokens=6, echo=True, **kw).choices[0]
    assert plain.text == ch.text and plain.logprobs is None
    assert cl.completions.create(prompt=prompt, max_tokens=0, echo=True, **kw).choices[0].text == prompt
    streamed = cl.completions.create(prompt=prompt, max_tokens=6, echo=True, stream=True, **kw)
    assert "".join(x.choices[0].text for x in streamed if x.choices) == ch.text

    # a batch of prompts (a string and token ids) with n = 2: each choice echoes its own prompt
    b = cl.completions.create(prompt=[prompt, [70, 71, 72]], n=2, max_tokens=0, logprobs=1, echo=True, **kw)
    assert [x.index for x in b.choices] == [0, 1, 2, 3]
    assert [x.text for x in b.choices] == [prompt, prompt, "ghi", "ghi"]  # ids 70-72: 'g', 'h', 'i'
    assert all(x.logprobs.tokens == list(x.text) and x.logprobs.token_logprobs[0] is None for x in b.choices)
    assert b.choices[0].logprobs.token_logprobs[1:] == pytest.approx(zlp.token_logprobs[1:], abs=1e-5)
    assert b.usage.prompt_tokens == len(prompt) + 3 and b.usage.completion_tokens == 0
    bs = [x for x in cl.completions.create(prompt=[prompt, [70, 71, 72]], n=2, max_tokens=3, echo=True, stream=True,
                                           **kw) if x.choices]
    texts = ["".join(x.choices[0].text for x in bs if x.choices[0].index == k) for k in range(4)]
    assert texts[0].startswith(prompt) and texts[2].startswith("ghi") and texts[0] == texts[1]

    with pytest.raises(openai.BadRequestError, match="'logprobs' must be between 0 and 20"):
        cl.completions.create(prompt=prompt, max_tokens=0, logprobs=21, echo=True, **kw)


@pytest.fixture(scope="module")
def oracle(model_dir):
    """(tokenizer, prompt ids -> [len - 1, vocab] log_softmax rows): row t - 1 is prompt token t's
    distribution, from one LLMEngine.score step in this process (the engine's own oracle)."""
    import numpy as np

    from minillm.engine.engine import LLMEngine

    eng = LLMEngine(model=str(model_dir), device="cpu", max_model_len=512, max_num_seqs=64)

    def rows(ids: list[int]):
        x = eng.score([ids])[0][:-1].astype(np.float64)
        m = x.max(-1, keepdims=True)
        return x - m - np.log(np.exp(x - m).sum(-1, keepdims=True))

    return eng.tokenizer, rows


def check_prompt_logprobs(plps, ids: list[int], rows, top: int, token_text) -> None:
    """vLLM's shape: None first, then {str(id): {logprob, rank, decoded_token}} for the prompt token
    (first) and the `top` best (ranks 1..top), every value and rank the oracle's."""
    import numpy as np

    want = rows(ids)
    assert len(plps) == len(ids) and plps[0] is None
    for t, entry in enumerate(plps[1:], start=1):
        row, tok = want[t - 1], ids[t]
        keys = list(entry)
        assert keys[0] == str(tok) and all(set(v) == {"logprob", "rank", "decoded_token"} for v in entry.values())
        own = entry[str(tok)]
        assert own["logprob"] == pytest.approx(row[tok], abs=1e-4) and own["decoded_token"] == token_text(tok)
        # its rank wherever it ranks (tolerant of float32 near-ties)
        assert np.count_nonzero(row > row[tok] + 1e-5) < own["rank"] <= np.count_nonzero(row >= row[tok] - 1e-5)
        best = np.argsort(-row, kind="stable")[:top].tolist()
        assert set(keys) == {str(tok), *map(str, best)}
        for j, i in enumerate(best):
            assert entry[str(i)]["logprob"] == pytest.approx(row[i], abs=1e-4)
            assert entry[str(i)]["rank"] == j + 1  # (the prompt token's own rank, when it is among them)


def test_prompt_logprobs(server, oracle):
    """vLLM's prompt_logprobs extension on both endpoints through the official client (extra_body
    in, model_extra out): per prompt token its logprob and rank and the N best, the first None, as
    the engine's oracle computes them and as echo + logprobs reports them; the completion unchanged;
    streamed in each choice's first chunk; batched prompts with n = 2; chat: the template's tokens."""
    cl, name = server.client(), model_name(server)
    tok, rows = oracle

    def text(i: int) -> str:
        return tok.decode([i], skip_special_tokens=False)

    prompt = "The quick brown fox"
    ids = tok.encode(prompt)
    kw = dict(model=name, prompt=prompt, max_tokens=4, temperature=0)
    plain = cl.completions.create(**kw, extra_body={"ignore_eos": True}).choices[0]
    assert "prompt_logprobs" not in plain.model_extra
    c = cl.completions.create(**kw, extra_body={"ignore_eos": True, "prompt_logprobs": 2}).choices[0]
    assert c.text == plain.text and c.logprobs is None  # asking for them changes nothing else
    plps = c.model_extra["prompt_logprobs"]
    check_prompt_logprobs(plps, ids, rows, 2, text)

    # they agree with echo + logprobs from the same server; with both, each keeps its own top N
    e = cl.completions.create(**{**kw, "max_tokens": 0}, echo=True, logprobs=1, extra_body={"prompt_logprobs": 3})
    ech = e.choices[0]
    assert ech.text == prompt and ech.logprobs.token_logprobs[0] is None
    assert ech.logprobs.token_logprobs[1:] == pytest.approx([p[str(i)]["logprob"] for p, i in zip(plps[1:], ids[1:])],
                                                            abs=1e-5)
    assert all(len(t) <= 2 for t in ech.logprobs.top_logprobs[1:])  # the token and 1 best
    check_prompt_logprobs(ech.model_extra["prompt_logprobs"], ids, rows, 3, text)
    zero = cl.completions.create(**kw, extra_body={"prompt_logprobs": 0}).choices[0].model_extra["prompt_logprobs"]
    assert [list(p) for p in zero[1:]] == [[str(i)] for i in ids[1:]]
    assert [p[str(i)]["rank"] for p, i in zip(zero[1:], ids[1:])] == [p[str(i)]["rank"] for p, i in
                                                                      zip(plps[1:], ids[1:])]

    # batched prompts with n = 2, streamed and not: each choice its own prompt's, in its first chunk
    prompts, pids = [prompt, [70, 71, 72]], [ids, [70, 71, 72]]
    b = cl.completions.create(model=name, prompt=prompts, n=2, max_tokens=3, temperature=0,
                              extra_body={"prompt_logprobs": 1, "ignore_eos": True})
    for k, ch in enumerate(b.choices):
        check_prompt_logprobs(ch.model_extra["prompt_logprobs"], pids[k // 2], rows, 1, text)
    chunks = [x for x in cl.completions.create(model=name, prompt=prompts, n=2, max_tokens=3, temperature=0,
                                               stream=True, extra_body={"prompt_logprobs": 1, "ignore_eos": True})
              if x.choices]
    for k in range(4):
        mine = [x.choices[0] for x in chunks if x.choices[0].index == k]
        assert "".join(x.text for x in mine) == b.choices[k].text
        assert [("prompt_logprobs" in x.model_extra) for x in mine] == [True] + [False] * (len(mine) - 1)
        check_prompt_logprobs(mine[0].model_extra["prompt_logprobs"], pids[k // 2], rows, 1, text)

    # chat: the rendered template's tokens, in the response beside the choices (vLLM's place)
    msgs = [{"role": "user", "content": "hi"}]
    cids = tok.encode_chat(msgs)
    ckw = dict(model=name, messages=msgs, max_tokens=3, temperature=0, n=2)
    r = cl.chat.completions.create(**ckw, extra_body={"prompt_logprobs": 2, "ignore_eos": True})
    check_prompt_logprobs(r.model_extra["prompt_logprobs"], cids, rows, 2, text)
    assert all("prompt_logprobs" not in ch.model_extra for ch in r.choices)
    chunks = list(cl.chat.completions.create(**ckw, stream=True, extra_body={"prompt_logprobs": 2,
                                                                             "ignore_eos": True}))
    for k in range(2):
        mine = [x for x in chunks if x.choices and x.choices[0].index == k]
        assert mine[0].choices[0].delta.role == "assistant" and "prompt_logprobs" not in mine[0].model_extra
        assert "".join(x.choices[0].delta.content or "" for x in mine) == r.choices[k].message.content
        assert [("prompt_logprobs" in x.model_extra) for x in mine[1:]] == [True] + [False] * (len(mine) - 2)
        check_prompt_logprobs(mine[1].model_extra["prompt_logprobs"], cids, rows, 2, text)


def test_truncate_prompt_tokens(server, oracle):
    """vLLM's truncate_prompt_tokens: k keeps the prompt's last k tokens (what that tail alone gives;
    usage counts it; a prompt of k or fewer is kept whole), -1 the last max_model_len - max_tokens
    (max_model_len - 1 without max_tokens); the room for max_tokens is the truncated prompt's; batched
    strings and token ids, streamed, echo (the tail's text and logprobs), prompt_logprobs, chat."""
    cl, name = server.client(), model_name(server)
    tok, rows = oracle

    def text(i: int) -> str:
        return tok.decode([i], skip_special_tokens=False)

    kw = dict(model=name, max_tokens=5, temperature=0)
    eos = {"ignore_eos": True}
    prompt = "The quick brown fox jumps"  # the byte tokenizer: one token a character
    tail = cl.completions.create(prompt=prompt[-9:], **kw, extra_body=eos)
    c = cl.completions.create(prompt=prompt, **kw, extra_body={**eos, "truncate_prompt_tokens": 9})
    assert c.choices[0].text == tail.choices[0].text and c.usage.prompt_tokens == 9
    whole = cl.completions.create(prompt=prompt, **kw, extra_body=eos)
    for k in (len(prompt), 1000):  # a prompt of k tokens or fewer: unchanged
        same = cl.completions.create(prompt=prompt, **kw, extra_body={**eos, "truncate_prompt_tokens": k})
        assert same.choices[0].text == whole.choices[0].text and same.usage.prompt_tokens == len(prompt)
    streamed = cl.completions.create(prompt=prompt, **kw, stream=True, stream_options={"include_usage": True},
                                     extra_body={**eos, "truncate_prompt_tokens": 9})
    *chunks, last = list(streamed)
    assert "".join(x.choices[0].text for x in chunks) == c.choices[0].text and last.usage.prompt_tokens == 9

    # batched strings and token ids, n = 2: each prompt cut alone
    b = cl.completions.create(prompt=[prompt, [70, 71, 72, 73, 74]], n=2, **kw,
                              extra_body={**eos, "truncate_prompt_tokens": 3})
    alone = cl.completions.create(prompt=[prompt[-3:], [72, 73, 74]], n=2, **kw, extra_body=eos)
    assert [x.text for x in b.choices] == [x.text for x in alone.choices] and b.usage.prompt_tokens == 6

    # longer than the context (512): -1 keeps max_model_len - max_tokens, or max_model_len - 1 (one
    # token of room) without max_tokens; k leaves max_model_len - k for max_tokens
    ids = [40 + i % 200 for i in range(600)]
    m = cl.completions.create(model=name, prompt=ids, max_tokens=12, temperature=0,
                              extra_body={**eos, "truncate_prompt_tokens": -1})
    assert (m.usage.prompt_tokens, m.usage.completion_tokens) == (500, 12)
    ref = cl.completions.create(model=name, prompt=ids[-500:], max_tokens=12, temperature=0, extra_body=eos)
    assert m.choices[0].text == ref.choices[0].text
    d = cl.completions.create(model=name, prompt=ids, temperature=0, extra_body={**eos, "truncate_prompt_tokens": -1})
    assert (d.usage.prompt_tokens, d.usage.completion_tokens) == (511, 1)
    r = cl.completions.create(model=name, prompt=ids, max_tokens=12, temperature=0,
                              extra_body={**eos, "truncate_prompt_tokens": 500})
    assert r.choices[0].text == ref.choices[0].text and r.usage.prompt_tokens == 500
    with pytest.raises(openai.BadRequestError, match="has 500 and max_tokens asks for 13 more"):
        cl.completions.create(model=name, prompt=ids, max_tokens=13, extra_body={"truncate_prompt_tokens": 500})
    with pytest.raises(openai.BadRequestError, match="prompt has 600 tokens"):  # without it: refused
        cl.completions.create(model=name, prompt=ids, max_tokens=12)

    # echo: the kept tail's text and its tokens' logprobs (the first null: nothing before it ran)
    e = cl.completions.create(model=name, prompt="Once upon a time", max_tokens=0, temperature=0, logprobs=1,
                              echo=True, extra_body={"truncate_prompt_tokens": 4})
    ch = e.choices[0]
    assert ch.text == "time" and ch.logprobs.tokens == list("time") and ch.logprobs.token_logprobs[0] is None
    assert e.usage.prompt_tokens == 4
    alone = cl.completions.create(model=name, prompt="time", max_tokens=0, temperature=0, logprobs=1, echo=True)
    assert ch.logprobs.token_logprobs[1:] == pytest.approx(alone.choices[0].logprobs.token_logprobs[1:], abs=1e-5)
    ekw = dict(model=name, prompt=tok.encode("Once up"), max_tokens=2, temperature=0, echo=True,
               extra_body={**eos, "truncate_prompt_tokens": 2})  # ids: "Once up", of which "up" is kept
    whole = cl.completions.create(**ekw).choices[0].text
    se = [x for x in cl.completions.create(**ekw, stream=True) if x.choices]
    assert whole.startswith("up") and se[0].choices[0].text.startswith("up")
    assert "".join(x.choices[0].text for x in se) == whole

    # prompt_logprobs cover the kept tokens; chat keeps the rendered template's last k tokens
    pids = tok.encode(prompt)
    p = cl.completions.create(prompt=prompt, **kw, extra_body={"truncate_prompt_tokens": 6, "prompt_logprobs": 2})
    check_prompt_logprobs(p.choices[0].model_extra["prompt_logprobs"], pids[-6:], rows, 2, text)
    msgs = [{"role": "user", "content": "hello there"}]
    cids = tok.encode_chat(msgs)
    r = cl.chat.completions.create(model=name, messages=msgs, max_tokens=4, temperature=0,
                                   extra_body={**eos, "truncate_prompt_tokens": 7, "prompt_logprobs": 1})
    assert r.usage.prompt_tokens == 7 < len(cids)
    check_prompt_logprobs(r.model_extra["prompt_logprobs"], cids[-7:], rows, 1, text)
    same = cl.completions.create(model=name, prompt=cids[-7:], max_tokens=4, temperature=0, extra_body=eos)
    assert r.choices[0].message.content == same.choices[0].text


def test_penalties(server):
    """presence/frequency (OpenAI) and repetition (vLLM) penalties reach the sampler: a greedy run
    that repeats itself without them does not with them; streamed equals non-streamed."""
    cl, name = server.client(), model_name(server)
    kw = dict(model=name, prompt="abcabcabc", max_tokens=24, temperature=0)
    plain = cl.completions.create(**kw, extra_body={"ignore_eos": True}).choices[0].text
    pen = dict(presence_penalty=2.0, frequency_penalty=1.0,
               extra_body={"ignore_eos": True, "repetition_penalty": 1.5})
    c = cl.completions.create(**kw, **pen)
    assert c.usage.completion_tokens == 24 and c.choices[0].text != plain
    streamed = "".join(ch.choices[0].text for ch in cl.completions.create(stream=True, **kw, **pen) if ch.choices)
    assert streamed == c.choices[0].text
    forced = cl.completions.create(**kw, logit_bias={"70": 100}, extra_body={"ignore_eos": True}).choices[0].text
    assert len(forced) == 24 and len(set(forced)) == 1  # one token, 24 times (one byte each)


def test_min_p(server):
    """vLLM's min_p through the official client (extra_body): min_p 1 keeps only the top token, so a
    hot seeded run is the greedy one, streamed or not, completions and chat; a value outside [0, 1]
    is a 400 naming it."""
    cl, name = server.client(), model_name(server)
    kw = dict(model=name, prompt="once upon a time", max_tokens=16)
    greedy = cl.completions.create(**kw, temperature=0, extra_body={"ignore_eos": True}).choices[0].text
    free = cl.completions.create(**kw, temperature=1.5, seed=5, extra_body={"ignore_eos": True}).choices[0].text
    assert free != greedy  # without min_p this run leaves the greedy path
    hot = dict(temperature=1.5, seed=5, extra_body={"ignore_eos": True, "min_p": 1.0})
    assert cl.completions.create(**kw, **hot).choices[0].text == greedy
    assert "".join(c.choices[0].text for c in cl.completions.create(**kw, **hot, stream=True)) == greedy
    some = dict(temperature=1.0, seed=9, extra_body={"ignore_eos": True, "min_p": 0.1})
    assert cl.completions.create(**kw, **some).choices[0].text == cl.completions.create(**kw, **some).choices[0].text
    msgs = [{"role": "user", "content": "hi"}]
    chat = dict(model=name, messages=msgs, max_tokens=8)
    g = cl.chat.completions.create(**chat, temperature=0, extra_body={"ignore_eos": True})
    h = cl.chat.completions.create(**chat, temperature=1.5, seed=1, extra_body={"ignore_eos": True, "min_p": 1})
    assert h.choices[0].message.content == g.choices[0].message.content
    for bad in (1.5, -0.1, "0.1"):
        with pytest.raises(openai.BadRequestError, match="min_p") as e:
            cl.completions.create(**kw, extra_body={"min_p": bad})
        assert e.value.body["param"] == "min_p", e.value.body
    with pytest.raises(openai.BadRequestError, match=r"min_p must be in \[0, 1\]"):
        cl.chat.completions.create(**chat, extra_body={"min_p": 2})


def test_min_p_default_is_the_models():
    """The model's generation_config (or GGUF general.sampling.min_p) fills min_p as it does top_p;
    the request's own value wins."""
    from minillm.server import protocol

    info = protocol.ModelInfo(names=["m"], max_model_len=64, vocab_size=256, tokenizer=None,
                              generation_defaults={"min_p": 0.05, "top_p": 0.9})
    for chat in (False, True):
        p = protocol.sampling_params({}, 4, info, chat)
        assert (p.min_p, p.top_p) == (0.05, 0.9)
        assert protocol.sampling_params({"min_p": 0}, 4, info, chat).min_p == 0
        assert protocol.sampling_params({"min_p": 0.5}, 4, info, chat).min_p == 0.5
    info.generation_defaults = {"min_p": None}  # a null in generation_config.json: off
    assert protocol.sampling_params({}, 4, info, False).min_p == 0


def test_chat(server):
    cl, name = server.client(), model_name(server)
    msgs = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    r = cl.chat.completions.create(model=name, messages=msgs, max_completion_tokens=9, temperature=0,
                                   extra_body={"ignore_eos": True})
    assert r.id.startswith("chatcmpl-") and r.object == "chat.completion"
    assert r.choices[0].message.role == "assistant" and r.choices[0].finish_reason == "length"
    prompt = "<system>be brief\n<user>hi\n<assistant>"  # the tiny model's byte tokenizer: one token a byte
    assert (r.usage.prompt_tokens, r.usage.completion_tokens) == (len(prompt.encode()), 9)

    chunks = list(cl.chat.completions.create(model=name, messages=msgs, max_tokens=9, temperature=0, stream=True,
                                             stream_options={"include_usage": True},
                                             extra_body={"ignore_eos": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[0].object == "chat.completion.chunk"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == r.choices[0].message.content
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].usage.total_tokens == r.usage.total_tokens


def test_structured_outputs(server):
    """OpenAI's response_format (json_schema, json_object) on chat, vLLM's structured_outputs and
    guided_* fields on completions, streamed and not: the random model's every output follows its
    constraint, and a streamed one equals the response that is not."""
    import json
    import re

    cl, name = server.client(), model_name(server)
    schema = {"type": "object", "additionalProperties": False, "required": ["n", "ok"],
              "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 99}, "ok": {"type": "boolean"}},
              "x-guidance": {"whitespace_flexible": False}}  # llguidance's extension: no free whitespace
    msgs = [{"role": "user", "content": "hi"}]
    fmt = {"type": "json_schema", "json_schema": {"name": "reply", "schema": schema, "strict": True}}
    for seed in range(3):
        r = cl.chat.completions.create(model=name, messages=msgs, max_tokens=40, seed=seed, response_format=fmt)
        v = json.loads(r.choices[0].message.content)
        assert set(v) == {"n", "ok"} and 0 <= v["n"] <= 99 and isinstance(v["ok"], bool)
        assert r.choices[0].finish_reason == "stop"
    streamed = "".join(c.choices[0].delta.content or "" for c in cl.chat.completions.create(
        model=name, messages=msgs, max_tokens=40, seed=0, response_format=fmt, stream=True) if c.choices)
    again = cl.chat.completions.create(model=name, messages=msgs, max_tokens=40, seed=0, response_format=fmt)
    assert streamed == again.choices[0].message.content
    obj = cl.chat.completions.create(model=name, messages=msgs, max_tokens=200, temperature=0,
                                     response_format={"type": "json_object"}).choices[0].message.content
    assert obj.startswith("{")  # a greedy random walk may not close the object within max_tokens

    kw = dict(model=name, prompt="pick one: ", max_tokens=20, temperature=1.0)
    picks = {cl.completions.create(**kw, seed=s, extra_body={"guided_choice": ["cat", "dog", "a bird"]})
             .choices[0].text for s in range(6)}
    assert picks <= {"cat", "dog", "a bird"} and len(picks) > 1
    c = cl.completions.create(**kw, seed=1, n=3, extra_body={"structured_outputs": {"regex": "[0-9]{3}-[a-c]{2}"}})
    assert all(re.fullmatch("[0-9]{3}-[a-c]{2}", ch.text) for ch in c.choices)
    v = json.loads(cl.completions.create(**{**kw, "max_tokens": 40}, seed=2, extra_body={
        "structured_outputs": {"json": schema, "disable_any_whitespace": True}}).choices[0].text)
    assert set(v) == {"n", "ok"}
    with pytest.raises(openai.BadRequestError, match="does not compile"):
        cl.completions.create(**kw, extra_body={"guided_regex": "(unclosed"})


# ---- vLLM's utility endpoints: /tokenize, /detokenize, /version, /v1/models/{id} -------------
def test_tokenize_detokenize_round_trip(server, model_dir):
    from tokenizers import Tokenizer as HFTokenizer

    hf = HFTokenizer.from_file(str(model_dir / "tokenizer.json"))
    for text in ("hello", "The quick brown fox\n  jumps", "naïve café 日本 😀", ""):
        r = httpx.post(f"{server.url}/tokenize", json={"model": model_name(server), "prompt": text,
                                                       "return_token_strs": True})
        assert r.status_code == 200, r.text
        body = r.json()
        assert set(body) == {"count", "max_model_len", "tokens", "token_strs"}
        assert body["tokens"] == hf.encode(text).ids and body["count"] == len(body["tokens"])
        assert body["max_model_len"] == 512
        assert body["token_strs"] == [hf.id_to_token(i) for i in body["tokens"]]
        back = httpx.post(f"{server.url}/detokenize", json={"model": model_name(server), "tokens": body["tokens"]})
        assert back.status_code == 200 and back.json() == {"prompt": text}
    # model is optional (the first served name), token_strs only when asked
    body = httpx.post(f"{server.url}/tokenize", json={"prompt": "hello"}).json()
    assert set(body) == {"count", "max_model_len", "tokens"} and body["count"] == 5
    # the ids a completion prefills: tokenize counts what usage reports
    c = server.client().completions.create(model=model_name(server), prompt="The quick brown fox\n  jumps",
                                           max_tokens=1)
    assert c.usage.prompt_tokens == httpx.post(f"{server.url}/tokenize",
                                               json={"prompt": "The quick brown fox\n  jumps"}).json()["count"]


def test_tokenize_add_special_tokens(server):
    """The tiny model's byte tokenizer adds no BOS (nor anything else), so add_special_tokens true
    and false give the same ids here; test_tokenize_bos_at_the_protocol shows a tokenizer that does."""
    on = httpx.post(f"{server.url}/tokenize", json={"prompt": "hi there", "add_special_tokens": True}).json()
    off = httpx.post(f"{server.url}/tokenize", json={"prompt": "hi there", "add_special_tokens": False}).json()
    default = httpx.post(f"{server.url}/tokenize", json={"prompt": "hi there"}).json()
    assert on == off == default and on["count"] == len("hi there")


def test_tokenize_chat_matches_the_chat_endpoint(server):
    cl, name = server.client(), model_name(server)
    msgs = [{"role": "system", "content": "be brief"}, {"role": "user", "content": [{"type": "text", "text": "hi"}]},
            {"role": "assistant", "content": "yes?"}, {"role": "user", "content": "go on"}]
    tok = httpx.post(f"{server.url}/tokenize", json={"model": name, "messages": msgs}).json()
    r = cl.chat.completions.create(model=name, messages=msgs, max_tokens=1)
    assert tok["count"] == r.usage.prompt_tokens == len(tok["tokens"])
    prompt = "<system>be brief\n<user>hi\n<assistant>yes?\n<user>go on\n<assistant>"
    text = httpx.post(f"{server.url}/detokenize", json={"tokens": tok["tokens"]}).json()["prompt"]
    assert text == prompt
    # add_generation_prompt false: the template's "<assistant>" left off; add_special_tokens true adds
    # nothing with this tokenizer
    bare = httpx.post(f"{server.url}/tokenize", json={"messages": msgs, "add_generation_prompt": False}).json()
    assert bare["tokens"] == tok["tokens"][:-len("<assistant>")]
    assert httpx.post(f"{server.url}/tokenize", json={"messages": msgs, "add_special_tokens": True,
                                                     "add_generation_prompt": True}).json() == tok
    # the chat endpoint takes add_generation_prompt and chat_template_kwargs too (this template uses
    # no extra variable: the prompt is unchanged; test_chat_template_kwargs shows one that does)
    r = cl.chat.completions.create(model=name, messages=msgs, max_tokens=1,
                                   extra_body={"add_generation_prompt": False,
                                               "chat_template_kwargs": {"enable_thinking": False}})
    assert r.usage.prompt_tokens == bare["count"]


def test_continue_final_message(server):
    """continue_final_message (vLLM's): the last message is left open, cut right after its text,
    and no generation prompt follows, in /tokenize and the chat endpoint alike; add_generation_prompt
    may be left out or false."""
    cl, name = server.client(), model_name(server)
    msgs = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Sure, the"}]
    tok = httpx.post(f"{server.url}/tokenize", json={"messages": msgs, "continue_final_message": True}).json()
    text = httpx.post(f"{server.url}/detokenize", json={"tokens": tok["tokens"]}).json()["prompt"]
    assert text == "<user>hi\n<assistant>Sure, the"  # the template's "\n" after the message is gone
    closed = httpx.post(f"{server.url}/tokenize", json={"messages": msgs, "add_generation_prompt": False}).json()
    assert closed["tokens"][:tok["count"]] == tok["tokens"] and closed["count"] == tok["count"] + 1
    for extra in ({"continue_final_message": True}, {"continue_final_message": True, "add_generation_prompt": False}):
        r = cl.chat.completions.create(model=name, messages=msgs, max_tokens=2, extra_body=extra)
        assert r.usage.prompt_tokens == tok["count"] and r.choices[0].message.role == "assistant"


def test_continue_final_message_finds_the_text(model_dir):
    """The cut follows the final message's text as the template writes it: verbatim (trailing
    spaces kept), stripped when the template strips it, the last occurrence when it repeats;
    a template that rewrites the text cannot be left open and says so (a 400 at the protocol)."""
    from minillm import LLM, SamplingParams
    from minillm.models.tokenizer import Tokenizer
    from minillm.server import protocol

    llm = LLM(str(model_dir), device="cpu", max_model_len=64, max_num_seqs=2)
    tok: Tokenizer = llm.tokenizer
    info = protocol.ModelInfo(names=["m"], max_model_len=64, vocab_size=tok.vocab_size, tokenizer=tok)
    say = [{"role": "user", "content": "ab"}, {"role": "assistant", "content": "ab "}]
    for template, want in [
        ("{% for m in messages %}<{{ m.role }}>{{ m.content }}|{% endfor %}"
         "{% if add_generation_prompt %}<assistant>{% endif %}", "<user>ab|<assistant>ab "),
        ("{% for m in messages %}<{{ m.role }}>{{ m.content | trim }}|{% endfor %}", "<user>ab|<assistant>ab"),
    ]:
        tok.chat_template, tok._template = template, None
        assert tok.apply_chat_template(say, continue_final_message=True) == want
        assert tok.apply_chat_template(say, add_generation_prompt=True, continue_final_message=True) == want
        ids = protocol.chat_prompt({"messages": say, "continue_final_message": True}, info)
        assert ids == tok.encode(want)
        out = llm.chat(say, SamplingParams(temperature=0, max_tokens=1), continue_final_message=True)
        assert out[0].prompt_token_ids == ids
    tok.chat_template, tok._template = "{% for m in messages %}{{ m.content | upper }}{% endfor %}", None
    with pytest.raises(protocol.ProtocolError, match="verbatim"):
        protocol.chat_prompt({"messages": say, "continue_final_message": True}, info)


def test_chat_template_kwargs(model_dir):
    """chat_template_kwargs reach the template as variables (Qwen3's enable_thinking), through the
    server's protocol and the offline LLM.chat, as in vLLM."""
    from minillm import LLM, SamplingParams
    from minillm.models.tokenizer import Tokenizer
    from minillm.server import protocol

    template = ("{% if enable_thinking is defined and not enable_thinking %}<no_think>{% endif %}"
                "{% for m in messages %}[{{ m.content }}]{% endfor %}")
    llm = LLM(str(model_dir), device="cpu", max_model_len=64, max_num_seqs=2)
    tok: Tokenizer = llm.tokenizer
    tok.chat_template, tok._template = template, None
    info = protocol.ModelInfo(names=["m"], max_model_len=64, vocab_size=tok.vocab_size, tokenizer=tok)
    msgs = [{"role": "user", "content": "hi"}]
    off = protocol.chat_prompt({"messages": msgs, "chat_template_kwargs": {"enable_thinking": False}}, info)
    assert off == tok.encode("<no_think>[hi]")
    assert protocol.chat_prompt({"messages": msgs, "chat_template_kwargs": {"enable_thinking": True}}, info) \
        == protocol.chat_prompt({"messages": msgs}, info) == tok.encode("[hi]")
    greedy = SamplingParams(temperature=0, max_tokens=1)
    out = llm.chat(msgs, greedy, chat_template_kwargs={"enable_thinking": False})
    assert out[0].prompt_token_ids == off
    assert llm.chat(msgs, greedy)[0].prompt_token_ids == tok.encode("[hi]")


def test_llm_chat_checks_and_flattens_messages(model_dir):
    """LLM.chat takes what the chat endpoint takes (text parts joined as the server joins them, an
    assistant's null content) and names what is malformed instead of a template's TypeError."""
    from minillm import LLM, SamplingParams
    from minillm.server import protocol

    llm = LLM(str(model_dir), device="cpu", max_model_len=64, max_num_seqs=2)
    tok = llm.tokenizer
    tok.chat_template, tok._template = "{% for m in messages %}[{{ m.content }}]{% endfor %}", None
    info = protocol.ModelInfo(names=["m"], max_model_len=64, vocab_size=tok.vocab_size, tokenizer=tok)
    msgs = [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
            {"role": "assistant", "content": None}, {"role": "user", "content": "c"}]
    greedy = SamplingParams(temperature=0, max_tokens=1)
    assert llm.chat(msgs, greedy)[0].prompt_token_ids == protocol.chat_prompt({"messages": msgs}, info)
    for bad, words in [({"role": "user", "content": "hi"}, "list of"), ([[]], "non-empty"),
                       ([{"content": "hi"}], "message 0: a message is a dict"),
                       ([{"role": "user"}], "message 0: 'content'"), ([{"role": "user", "content": 5}], "got int")]:
        with pytest.raises(ValueError, match=words):
            llm.chat(bad, greedy)
    with pytest.raises(ValueError, match="chat_template_kwargs"):
        llm.chat(msgs, greedy, chat_template_kwargs=[1])
    # tools reach the template as the server's chat endpoint gives them, checked alike
    tok.chat_template, tok._template = ("{% for t in tools or [] %}<{{ t.function.name }}>{% endfor %}"
                                        "{% for m in messages %}[{{ m.content }}]{% endfor %}"), None
    tools = [{"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}}]
    ids = llm.chat(msgs, greedy, tools=tools)[0].prompt_token_ids
    assert ids == protocol.chat_prompt({"messages": msgs}, info, tools=tools)
    assert ids != llm.chat(msgs, greedy)[0].prompt_token_ids
    assert tok.decode(ids).startswith("<get_time>[a\nb]")
    with pytest.raises(ValueError, match="tools\\[0\\].function.name must be"):
        llm.chat(msgs, greedy, tools=[{"type": "function", "function": {"name": "bad name"}}])


def test_tokenize_bos_at_the_protocol(model_dir):
    """add_special_tokens with a tokenizer that adds a BOS (the tiny one does not): the prompt form
    adds it by default and not with false; the chat form adds it only when asked (the template writes
    its own); detokenize keeps it, as vLLM does."""
    from tokenizers import Tokenizer as HFTokenizer

    from minillm.models.tokenizer import Tokenizer
    from minillm.server import protocol

    hf = HFTokenizer.from_file(str(model_dir / "tokenizer.json"))
    hf.add_special_tokens(["<s>"])
    tok = Tokenizer(hf, chat_template="{% for m in messages %}[{{ m.content }}]{% endfor %}", bos_token="<s>",
                    add_bos_token=True)
    info = protocol.ModelInfo(names=["m"], max_model_len=64, vocab_size=tok.vocab_size, tokenizer=tok)
    bos = tok.bos_token_id
    assert bos == 256
    with_bos = protocol.tokenize_response({"prompt": "hi"}, info)
    without = protocol.tokenize_response({"prompt": "hi", "add_special_tokens": False}, info)
    ids = lambda text: hf.encode(text).ids  # noqa: E731 (the byte-level ids: no BOS from tokenizers itself)
    assert with_bos["tokens"] == [bos, *ids("hi")] and without["tokens"] == ids("hi")
    assert with_bos["count"] == 3 and without["count"] == 2
    strs = protocol.tokenize_response({"prompt": "hi", "return_token_strs": True}, info)["token_strs"]
    assert strs == ["<s>", "h", "i"]
    assert protocol.detokenize_response({"tokens": with_bos["tokens"]}, info) == {"prompt": "<s>hi"}
    msgs = {"messages": [{"role": "user", "content": "hi"}]}
    assert protocol.tokenize_response(msgs, info)["tokens"] == ids("[hi]")
    assert protocol.tokenize_response({**msgs, "add_special_tokens": True}, info)["tokens"] == [bos, *ids("[hi]")]
    # the generation endpoints prefill what /tokenize counts: completions add the BOS unless told not to,
    # chat only when asked (vLLM's add_special_tokens, default true / false)
    def prefilled(body: dict, chat: bool) -> list[int]:
        parsed = protocol.parse_request(protocol.parse_body(json.dumps({**body, "max_tokens": 1}).encode()), info, chat)
        assert parsed.ignored == []
        return parsed.choices[0][0]

    assert prefilled({"prompt": "hi"}, False) == with_bos["tokens"]
    assert prefilled({"prompt": "hi", "add_special_tokens": False}, False) == without["tokens"]
    assert prefilled(msgs, True) == ids("[hi]")
    assert prefilled({**msgs, "add_special_tokens": True}, True) == [bos, *ids("[hi]")]


def test_ignored_fields_are_named(server):
    """A field the parser never reads (a misspelt one, say) changes nothing: the request runs, and the
    server's log names it, as vLLM's does; OpenAI's bookkeeping fields (user, metadata) pass unnamed,
    and so does every field the parser reads, whatever its value (stream false, n 1, ...)."""
    def ignored_line(body: dict) -> str:
        r = httpx.post(f"{server.url}/v1/completions", json=body)
        assert r.status_code == 200, r.text
        lines = [ln for ln in server.text().splitlines() if r.json()["id"] in ln and "ignored" in ln]
        assert len(lines) <= 1
        return lines[0] if lines else ""  # logged before the request ran, so before its response

    body = {"prompt": "hi", "max_tokens": 2, "temprature": 0.5, "user": "u", "metadata": {"a": "b"}, "stream": False,
            "n": 1, "echo": False, "logprobs": None, "add_special_tokens": True, "stop": None, "seed": 3}
    assert ignored_line(body).endswith("fields present in the request but ignored: temprature")
    assert ignored_line({**body, "temprature": None, "frequency_penaltyy": 0}).endswith(
        "ignored: frequency_penaltyy, temprature")  # sorted; null counts as given
    assert ignored_line({"prompt": "hi", "max_tokens": 1, "user": "u"}) == ""
    # stream_options' fields too (a misspelt continuous_usage_stats)
    chunks = list(server.client().completions.create(model=model_name(server), prompt="hi", max_tokens=2, stream=True,
                                                     stream_options={"include_usage": True, "continuous_usage": True}))
    assert [ln for ln in server.text().splitlines() if chunks[0].id in ln and "ignored" in ln][0].endswith(
        "ignored: stream_options.continuous_usage")
    # chat's reasoning_effort goes to the template, which here does not read it: named
    c = server.client().chat.completions.create(model=model_name(server), max_tokens=1, reasoning_effort="low",
                                                messages=[{"role": "user", "content": "hi"}])
    assert [ln for ln in server.text().splitlines() if c.id in ln and "ignored" in ln][0].endswith(
        "ignored: reasoning_effort (this model's chat template does not read it)")


def test_version(server):
    import importlib.metadata

    r = httpx.get(f"{server.url}/version")
    assert r.status_code == 200 and r.json() == {"version": importlib.metadata.version("minillm")}


def test_version_falls_back_to_setup_cfg(monkeypatch):
    import configparser
    import importlib.metadata

    from minillm.server.app import package_version

    def missing(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "version", missing)
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    assert package_version() == cfg.get("metadata", "version")


def test_models_retrieve(server, model_dir):
    cl = server.client()
    m = cl.models.retrieve(str(model_dir))  # an absolute path: slashes, percent-encoded by the client
    assert (m.id, m.object, m.owned_by) == (str(model_dir), "model", "minillm")
    assert m.model_dump() == cl.models.list().data[0].model_dump()
    with pytest.raises(openai.NotFoundError) as e:
        cl.models.retrieve("gpt-4")
    assert e.value.body["code"] == "model_not_found" and "gpt-4" in e.value.body["message"]


def test_raw_sse_framing(server):
    body = {"prompt": "abc", "max_tokens": 3, "stream": True, "ignore_eos": True}
    with httpx.stream("POST", f"{server.url}/v1/completions", json=body) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        raw = r.read().decode()
    events = raw.split("\n\n")
    assert events[-1] == "" and events[-2] == "data: [DONE]"
    assert all(e.startswith("data: {") for e in events[:-2])


def printable_stop(text: str) -> str | None:
    for i in range(2, len(text) - 2):
        s = text[i:i + 2]
        if s.isascii() and s.isprintable() and text.find(s) == i:
            return s
    return None


def test_stop_strings(server):
    cl, name = server.client(), model_name(server)
    for prompt in ("The quick brown fox", "hello", "abc", "minillm", "0123"):
        ref = cl.completions.create(model=name, prompt=prompt, max_tokens=40, temperature=0,
                                    extra_body={"ignore_eos": True}).choices[0].text
        stop = printable_stop(ref)
        if stop:
            break
    assert stop, "no printable stop string in the greedy outputs"
    want = ref[:ref.find(stop)]
    r = cl.completions.create(model=name, prompt=prompt, max_tokens=40, temperature=0, stop=[stop, "\x00never"],
                              extra_body={"ignore_eos": True})
    assert (r.choices[0].text, r.choices[0].finish_reason) == (want, "stop")
    assert r.choices[0].stop_reason == stop  # vLLM's: the stop string that ended it
    chunks = list(cl.completions.create(model=name, prompt=prompt, max_tokens=40, temperature=0, stop=stop,
                                        stream=True, extra_body={"ignore_eos": True}))
    assert "".join(c.choices[0].text for c in chunks) == want
    assert (chunks[-1].choices[0].finish_reason, chunks[-1].choices[0].stop_reason) == ("stop", stop)
    assert all(c.choices[0].stop_reason is None for c in chunks[:-1])
    # a stop token id is the stop_reason (chat too); ending at max_tokens leaves it null
    ids = cl.completions.create(model=name, prompt=prompt, max_tokens=8, temperature=0, logprobs=0,
                                extra_body={"ignore_eos": True, "return_tokens_as_token_ids": True})
    assert ids.choices[0].stop_reason is None and ids.choices[0].finish_reason == "length"
    token = int(ids.choices[0].logprobs.tokens[3].removeprefix("token_id:"))
    r = cl.completions.create(model=name, prompt=prompt, max_tokens=8, temperature=0,
                              extra_body={"ignore_eos": True, "stop_token_ids": [token]})
    assert (r.choices[0].finish_reason, r.choices[0].stop_reason) == ("stop", token)
    chat = cl.chat.completions.create(model=name, messages=[{"role": "user", "content": prompt}], max_tokens=8,
                                      temperature=0, logprobs=True,
                                      extra_body={"ignore_eos": True, "return_tokens_as_token_ids": True})
    assert chat.choices[0].stop_reason is None
    token = int(chat.choices[0].logprobs.content[2].token.removeprefix("token_id:"))
    chat = cl.chat.completions.create(model=name, messages=[{"role": "user", "content": prompt}], max_tokens=8,
                                      temperature=0, extra_body={"ignore_eos": True, "stop_token_ids": [token]})
    assert (chat.choices[0].finish_reason, chat.choices[0].stop_reason) == ("stop", token)
    # vLLM's include_stop_str_in_output: the stop string stays, streamed or not
    kept = want + stop
    r = cl.completions.create(model=name, prompt=prompt, max_tokens=40, temperature=0, stop=[stop, "\x00never"],
                              extra_body={"ignore_eos": True, "include_stop_str_in_output": True})
    assert (r.choices[0].text, r.choices[0].finish_reason) == (kept, "stop")
    chunks = list(cl.completions.create(model=name, prompt=prompt, max_tokens=40, temperature=0, stop=stop,
                                        stream=True, extra_body={"ignore_eos": True,
                                                                 "include_stop_str_in_output": True}))
    assert "".join(c.choices[0].text for c in chunks) == kept


def test_seeded_sampling_is_reproducible(server):
    cl, name = server.client(), model_name(server)

    def sample(seed: int) -> str:
        return cl.completions.create(model=name, prompt="once upon a time", max_tokens=32, temperature=1.0,
                                     seed=seed, extra_body={"ignore_eos": True}).choices[0].text

    a, b, c = sample(1234), sample(1234), sample(4321)
    assert a == b
    assert a != c


def test_eight_concurrent_streams(server):
    name = model_name(server)
    prompts = [f"prompt number {i}: " + "xyz" * i for i in range(8)]
    cl = server.client()
    refs = [cl.completions.create(model=name, prompt=p, max_tokens=32, temperature=0,
                                  extra_body={"ignore_eos": True}).choices[0].text for p in prompts]

    async def one(acl: openai.AsyncOpenAI, prompt: str) -> tuple[str, str, int]:
        stream = await acl.completions.create(model=name, prompt=prompt, max_tokens=32, temperature=0, stream=True,
                                              stream_options={"include_usage": True},
                                              extra_body={"ignore_eos": True})
        text, finish, n = "", None, 0
        async for c in stream:
            if c.choices:
                text += c.choices[0].text
                finish = c.choices[0].finish_reason or finish
            if c.usage:
                n = c.usage.completion_tokens
        return text, finish, n

    async def all_at_once():
        async with openai.AsyncOpenAI(base_url=f"{server.url}/v1", api_key="none", max_retries=0) as acl:
            return await asyncio.gather(*(one(acl, p) for p in prompts))

    results = asyncio.run(all_at_once())
    assert [r[0] for r in results] == refs  # batched together == alone, none mixed up
    assert all(r[1:] == ("length", 32) for r in results)


@pytest.mark.parametrize("n", [1, 4])
def test_disconnect_frees_blocks(server, n):
    before = server.metrics()
    body = {"prompt": "a long one", "max_tokens": 480, "stream": True, "ignore_eos": True, "n": n}
    with httpx.stream("POST", f"{server.url}/v1/completions", json=body) as r:
        lines = r.iter_lines()
        got = [next(lines) for _ in range(6)]  # a few events in: the request is mid-flight
        assert sum(g.startswith("data: ") for g in got) >= 3
        assert server.metrics()["minillm:kv_cache_blocks_used"] > 0
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        m = server.metrics()
        if m["minillm:kv_cache_blocks_used"] == 0 and m["minillm:num_requests_running"] == 0:
            break
        time.sleep(0.02)
    assert m["minillm:kv_cache_blocks_used"] == 0 and m["minillm:num_requests_running"] == 0
    assert m['minillm:request_success_total{finished_reason="abort"}'] == \
        before.get('minillm:request_success_total{finished_reason="abort"}', 0) + 1
    # the engine stopped generating for it (each of its n choices) long before its 480 tokens
    assert m["minillm:generation_tokens_total"] - before["minillm:generation_tokens_total"] < 240 * n


@pytest.mark.parametrize("stream", [True, False])
def test_disconnect_before_the_response(server, stream):
    """A client that sends its request and closes at once (before any response byte): the request
    must not run to max_tokens. Quart's cancellation of the handler can be lost there on Python 3.11
    (the body's completion and the disconnect arrive together), so app.watch_disconnects marks the
    request and the handler checks before the engine gets it (then it counts as an abort; when
    Quart's cancellation does land, it never reaches the engine or the counters at all)."""
    before = server.metrics()
    body = json.dumps({"prompt": "a long one", "max_tokens": 480, "ignore_eos": True, "stream": stream}).encode()
    host, port = server.url.removeprefix("http://").rsplit(":", 1)
    with socket.create_connection((host, int(port))) as s:
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
    time.sleep(0.5)
    # a request sent after it is served; by its end the closed one, had it been admitted, would be running
    r = httpx.post(f"{server.url}/v1/completions", json={"prompt": "hi", "max_tokens": 4, "ignore_eos": True})
    assert r.status_code == 200, r.text
    m = server.wait_idle()
    assert m["minillm:kv_cache_blocks_used"] == 0 and m["minillm:num_requests_running"] == 0
    length = 'minillm:request_success_total{finished_reason="length"}'
    assert m[length] == before.get(length, 0) + 1  # the later request's alone: the closed one never finished
    assert m["minillm:generation_tokens_total"] - before["minillm:generation_tokens_total"] < 240


def test_disconnect_non_streamed(server):
    before = server.metrics()
    body = {"prompt": "a long one", "max_tokens": 480, "ignore_eos": True}
    with pytest.raises(httpx.ReadTimeout):  # the client gives up and closes the connection
        httpx.post(f"{server.url}/v1/completions", json=body, timeout=0.3)
    m = server.wait_idle()
    assert m["minillm:kv_cache_blocks_used"] == 0 and m["minillm:num_requests_running"] == 0
    assert m["minillm:generation_tokens_total"] - before["minillm:generation_tokens_total"] < 240


def test_metrics(server):
    m = server.metrics()
    for key in ("minillm:num_requests_running", "minillm:num_requests_waiting", "minillm:kv_cache_blocks_total",
                "minillm:kv_cache_blocks_used", "minillm:num_preemptions_total", "minillm:prefix_cache_hit_rate",
                "minillm:prompt_tokens_total", "minillm:generation_tokens_total",
                "minillm:time_to_first_token_seconds_count", "minillm:time_per_output_token_seconds_count",
                "minillm:e2e_request_latency_seconds_count", "minillm:engine_healthy"):
        assert key in m, key
    assert m["minillm:kv_cache_blocks_total"] == 512 and m["minillm:engine_healthy"] == 1
    assert m["minillm:prompt_tokens_total"] > 0 and m["minillm:e2e_request_latency_seconds_count"] > 0
    # vLLM's prefix-cache counters (tokens), whose ratio is the hit rate
    assert 0 <= m["minillm:prefix_cache_hits_total"] <= m["minillm:prefix_cache_queries_total"]
    assert m["minillm:prefix_cache_hits_total"] / m["minillm:prefix_cache_queries_total"] == pytest.approx(
        m["minillm:prefix_cache_hit_rate"])
    # every series carries vLLM's model_name label: the served name
    text = httpx.get(f"{server.url}/metrics").text
    samples = [ln for ln in text.splitlines() if ln.startswith("minillm:")]
    assert samples and all(f'model_name="{model_name(server)}"' in ln for ln in samples), samples


def test_per_request_histograms(server):
    """vLLM's request_queue_time_seconds, request_prompt_tokens and request_generation_tokens: one
    observation per engine request, so an n = 3 completion adds three, with exact token sums."""
    before = server.metrics()
    cl = server.client()
    out = cl.completions.create(model=cl.models.list().data[0].id, prompt="count these tokens", max_tokens=5, n=3,
                                extra_body={"ignore_eos": True})
    after = server.metrics()

    def added(key: str) -> float:
        return after.get(key, 0.0) - before.get(key, 0.0)

    for name in ("request_queue_time_seconds", "request_prompt_tokens", "request_generation_tokens"):
        assert added(f"minillm:{name}_count") == 3, name
    assert added("minillm:request_prompt_tokens_sum") == 3 * out.usage.prompt_tokens
    assert added("minillm:request_generation_tokens_sum") == out.usage.completion_tokens == 15
    assert 0 <= added("minillm:request_queue_time_seconds_sum") < 30


# ---- lifecycle: faults and shutdown -------------------------------------------------------
async def read_stream(client: httpx.AsyncClient, url: str, body: dict, started: asyncio.Event,
                      events: list[str]) -> None:
    async with client.stream("POST", url, json=body) as r:
        assert r.status_code == 200
        async for line in r.aiter_lines():
            if line.startswith("data: "):
                events.append(line[6:])
                if len(events) >= 2:
                    started.set()


def test_engine_fault_reaches_every_stream(model_dir, tmp_path):
    srv = Server(model_dir, tmp_path / "fault.log",
                 env={"MINILLM_TEST_FAULTS": "1", "MINILLM_TEST_STEP_DELAY": "0.01"})
    try:
        async def scenario() -> tuple[list[list[str]], float]:
            body = {"prompt": "stream me", "max_tokens": 400, "stream": True, "ignore_eos": True}
            async with httpx.AsyncClient(base_url=srv.url, timeout=30) as client:
                events = [[] for _ in range(3)]
                started = [asyncio.Event() for _ in range(3)]
                tasks = [asyncio.create_task(read_stream(client, "/v1/completions", body, s, e))
                         for s, e in zip(started, events)]
                await asyncio.wait_for(asyncio.gather(*(s.wait() for s in started)), 10)
                t0 = time.monotonic()
                assert (await client.post("/_test/fault", json={})).status_code == 200
                while (await client.get("/health")).status_code != 503:
                    assert time.monotonic() - t0 < 1.0, "/health still 200 a second after the fault"
                    await asyncio.sleep(0.01)
                await asyncio.wait_for(asyncio.gather(*tasks), 5)  # every stream closes: nothing hangs
                return events, time.monotonic() - t0

        events, _ = asyncio.run(scenario())
        for ev in events:
            assert ev[-1] == "[DONE]"
            err = json.loads(ev[-2])["error"]
            assert "injected test fault" in err["message"] and err["type"] == "internal_server_error"
        r = httpx.post(f"{srv.url}/v1/completions", json={"prompt": "x", "max_tokens": 2})
        assert r.status_code == 503 and r.json()["error"]["type"] == "service_unavailable"
        with pytest.raises(openai.APIError, match="injected test fault"):  # after a fault: 503 up front
            list(srv.client().completions.create(model=str(model_dir), prompt="x", max_tokens=2, stream=True))
        log = srv.text()
        assert "Traceback (most recent call last)" in log and "RuntimeError: injected test fault" in log
    finally:
        assert srv.stop() == 0


def test_hung_step_fails_open_streams_and_health(model_dir, tmp_path):
    """A step that does not return within --step-timeout is treated like one that raised."""
    srv = Server(model_dir, tmp_path / "hang.log", "--step-timeout", "0.5",
                 env={"MINILLM_TEST_STEP_DELAY": "4"})
    try:
        assert httpx.get(f"{srv.url}/health").status_code == 200
        t0 = time.monotonic()
        r = httpx.post(f"{srv.url}/v1/completions", json={"prompt": "x", "max_tokens": 4, "stream": True},
                       timeout=10)
        elapsed = time.monotonic() - t0
        events = [ln[6:] for ln in r.text.splitlines() if ln.startswith("data: ")]
        assert events[-1] == "[DONE]" and "did not return within 0.5 s" in json.loads(events[-2])["error"]["message"]
        assert elapsed < 3.0, f"the stream hung for {elapsed:.1f} s"  # well before the 4 s step ends
        assert httpx.get(f"{srv.url}/health").status_code == 503
        assert "engine step has not returned" in srv.text() and "the engine thread is at" in srv.text()
    finally:
        srv.stop()


def wait_for_log(srv: Server, needle: str, start: int = 0, timeout: float = 10) -> str:
    """The server's log from character `start` on, once it holds needle (or after timeout)."""
    deadline = time.monotonic() + timeout
    while needle not in (text := srv.text()[start:]) and time.monotonic() < deadline:
        time.sleep(0.05)
    return text


def test_sigusr1_prints_every_thread_and_serves_on(server):
    """kill -USR1: each thread's Python stack in the log (the engine thread's loop among them), and
    the server keeps serving."""
    before = len(server.text())
    server.proc.send_signal(signal.SIGUSR1)
    dump = wait_for_log(server, "async_engine.py", start=before)
    # the dump is written thread by thread: the main thread's (serve.py) may come after the engine's
    dump = wait_for_log(server, "serve.py", start=before)
    assert "most recent call first" in dump and "async_engine.py" in dump and "serve.py" in dump, dump
    c = server.client().completions.create(model=model_name(server), prompt="still here", max_tokens=3,
                                           temperature=0, extra_body={"ignore_eos": True})
    assert c.usage.completion_tokens == 3 and server.proc.poll() is None


def test_native_crash_prints_every_thread_before_dying(model_dir, tmp_path):
    """A segmentation fault (here a real SIGSEGV, as a fault in native code raises) kills the server,
    but not silently: faulthandler names the fault and prints where every thread was, the engine's too."""
    srv = Server(model_dir, tmp_path / "crash.log")
    try:
        srv.proc.send_signal(signal.SIGSEGV)
        assert srv.proc.wait(15) != 0
        text = srv.text()
        assert "Fatal Python error: Segmentation fault" in text, text
        assert "async_engine.py" in text and "serve.py" in text, text
    finally:
        srv.stop()


def test_stream_cut_by_fault_raises_in_openai_client(model_dir, tmp_path):
    srv = Server(model_dir, tmp_path / "fault2.log",
                 env={"MINILLM_TEST_FAULTS": "1", "MINILLM_TEST_STEP_DELAY": "0.01"})
    try:
        stream = srv.client().chat.completions.create(model=str(model_dir), messages=[{"role": "user", "content": "x"}],
                                                      max_tokens=300, stream=True, extra_body={"ignore_eos": True})
        it = iter(stream)
        next(it), next(it)
        httpx.post(f"{srv.url}/_test/fault", json={})
        with pytest.raises(openai.APIError, match="injected test fault"):
            list(it)
    finally:
        assert srv.stop() == 0


def test_sigterm_drains_then_cuts_after_grace(model_dir, tmp_path):
    srv = Server(model_dir, tmp_path / "drain.log", "--shutdown-grace", "2",
                 env={"MINILLM_TEST_STEP_DELAY": "0.01"})

    async def scenario() -> tuple[list[str], list[str], int, int]:
        async with httpx.AsyncClient(base_url=srv.url, timeout=30) as client:
            short, long_ = [], []
            s1, s2 = asyncio.Event(), asyncio.Event()
            t1 = asyncio.create_task(read_stream(client, "/v1/completions", {
                "prompt": "short", "max_tokens": 40, "stream": True, "ignore_eos": True}, s1, short))
            t2 = asyncio.create_task(read_stream(client, "/v1/completions", {
                "prompt": "long", "max_tokens": 450, "stream": True, "ignore_eos": True}, s2, long_))
            await asyncio.wait_for(asyncio.gather(s1.wait(), s2.wait()), 10)
            srv.proc.send_signal(signal.SIGTERM)
            await asyncio.sleep(0.1)
            health = (await client.get("/health")).status_code
            new = (await client.post("/v1/completions", json={"prompt": "late", "max_tokens": 2})).status_code
            await asyncio.wait_for(asyncio.gather(t1, t2), 15)
            return short, long_, health, new

    try:
        short, long_, health, new = asyncio.run(scenario())
        assert (health, new) == (503, 503)
        assert short[-1] == "[DONE]" and json.loads(short[-2])["choices"][0]["finish_reason"] == "length"
        assert long_[-1] == "[DONE]" and json.loads(long_[-2])["error"]["type"] == "server_shutdown"
        assert srv.proc.wait(15) == 0
    finally:
        srv.stop()


def test_sigterm_exits_with_a_client_that_stopped_reading(model_dir, tmp_path):
    """A stream whose client stopped reading (megabytes of events unsent) held the server after SIGTERM until
    the client went away: hypercorn waits on that connection's close for good, and a second signal after the
    drain did nothing. Now a drained server exits 0 by graceful_timeout + HARD_EXIT_MARGIN, and at once on a
    second signal; the client's socket stays open throughout."""
    from minillm.serve import HARD_EXIT_MARGIN

    body = json.dumps({"prompt": "hi", "max_tokens": 480, "ignore_eos": True, "stream": True, "n": 16,
                       "logprobs": 20}).encode()
    for second_signal in (True, False):
        srv = Server(model_dir, tmp_path / f"stalled_{second_signal}.log", "--shutdown-grace", "0.5")
        sock = socket.socket()
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            sock.connect((srv.url.split("//")[1].rsplit(":", 1)[0], int(srv.url.rsplit(":", 1)[1])))
            sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                         + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
            deadline = time.monotonic() + 60  # ~6 MB of events written, most of them unsent
            while srv.metrics()["minillm:generation_tokens_total"] < 4000 and time.monotonic() < deadline:
                time.sleep(0.2)
            t0 = time.monotonic()
            srv.proc.send_signal(signal.SIGTERM)
            if second_signal:
                time.sleep(2)  # the drain (0.5 s grace, then the cut) is over; hypercorn waits on the socket
                assert srv.proc.poll() is None
                srv.proc.send_signal(signal.SIGTERM)
                assert srv.proc.wait(5) == 0 and time.monotonic() - t0 < 5
            else:
                assert srv.proc.wait(5.0 + HARD_EXIT_MARGIN + 10) == 0
                assert time.monotonic() - t0 > 5.0  # hypercorn's graceful_timeout came first
            assert "exiting without waiting for the connections still open" in srv.text(), srv.text()
            assert "Traceback" not in srv.text(), srv.text()
        finally:
            sock.close()
            if srv.proc.poll() is None:
                srv.proc.kill()


def test_priority_scheduling_through_the_server(model_dir, tmp_path):
    """--scheduling-policy priority with one seat: while a long request runs, a priority 5 request
    and then a priority -1 one queue; the -1 gets the seat first (vLLM's priority field, sent by
    the openai client as an extra body field)."""
    import threading

    srv = Server(model_dir, tmp_path / "priority.log", "--scheduling-policy", "priority", "--max-num-seqs", "1",
                 env={"MINILLM_TEST_STEP_DELAY": "0.02"})
    try:
        client = srv.client()
        name = client.models.list().data[0].id
        done: list[str] = []

        def ask(tag: str, priority: int, max_tokens: int) -> None:
            client.completions.create(model=name, prompt=f"request {tag}", max_tokens=max_tokens, temperature=0,
                                      extra_body={"priority": priority, "ignore_eos": True})
            done.append(tag)

        threads = [threading.Thread(target=ask, args=("long", 0, 40))]
        threads[0].start()
        time.sleep(0.3)  # the long request holds the one seat
        for tag, priority in (("low", 5), ("high", -1)):
            threads.append(threading.Thread(target=ask, args=(tag, priority, 4)))
            threads[-1].start()
            time.sleep(0.1)
        for t in threads:
            t.join(60)
        assert done == ["long", "high", "low"], done
        with pytest.raises(openai.BadRequestError, match="priority must be an integer|'priority' must be"):
            client.completions.create(model=name, prompt="x", max_tokens=1, extra_body={"priority": 1.5})
    finally:
        assert srv.stop() == 0, srv.text()
