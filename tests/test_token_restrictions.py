"""What a request may not sample, offline and on both endpoints (vLLM's fields):

- allowed_token_ids: sampling keeps only the listed tokens, on every row of a speculative step too;
- bad_words: a word's last token is banned wherever the output so far ends with its other tokens,
  so the output never contains the word's tokens in a row (verification rows follow their drafts);

combinations that could leave a row nothing to sample are refused, and vLLM's logits_processors,
which minillm does not implement, is refused by name rather than ignored.

Real parts: a random tiny model with a byte tokenizer (its arbitrary choices would leave any small
set at once), the NumPy backend's mask kernel twin, and the real server with the official openai client.
"""

from __future__ import annotations

import numpy as np
import openai
import pytest
from test_server import Server

from minillm import LLM, SamplingParams
from minillm.backends.numpy_ops import NumpyBackend
from minillm.engine.structured import token_mask


@pytest.fixture(scope="module")
def llm(byte_llama):
    return LLM(str(byte_llama), device="cpu", max_model_len=128, max_num_seqs=8)


@pytest.fixture(scope="module")
def abc_ids(llm):
    """The ids of "a", "b", "c" and " "."""
    ids = llm.engine.tokenizer.encode("abc ", add_special_tokens=False)
    assert len(ids) == 4
    return ids


def test_token_mask_allows_exactly_the_ids():
    logits = np.zeros((1, 70), np.float32)
    NumpyBackend().mask_logits(logits, np.zeros(1, np.int32), token_mask([3, 64, 3, 31, 32], 70)[None])
    assert np.flatnonzero(np.isfinite(logits[0])).tolist() == [3, 31, 32, 64]


def test_samples_stay_in_the_set(llm, abc_ids):
    outs = llm.generate(["hello"] * 6, [SamplingParams(temperature=1, seed=s, max_tokens=24, allowed_token_ids=abc_ids)
                                        for s in range(6)])
    for o in outs:
        assert set(o.token_ids) <= set(abc_ids) and set(o.text) <= set("abc "), o.text
        assert o.finish_reason == "length"  # EOS is not in the set
    assert len({o.text for o in outs}) > 1  # still sampled, within the set
    free = llm.generate(["hello"], SamplingParams(temperature=1, seed=0, max_tokens=24))[0]
    assert not set(free.token_ids) <= set(abc_ids)  # without the field the model leaves the set


def test_other_requests_in_the_batch_are_untouched(llm, abc_ids):
    params = [SamplingParams(temperature=0, max_tokens=16), SamplingParams(temperature=0, max_tokens=16,
                                                                           allowed_token_ids=abc_ids)]
    alone = llm.generate(["hello"], params[0])[0].token_ids
    both = llm.generate(["hello", "hello"], params)
    assert both[0].token_ids == alone and set(both[1].token_ids) <= set(abc_ids)


def test_speculation_is_lossless_under_the_set(byte_llama, llm, abc_ids):
    params = SamplingParams(temperature=0, max_tokens=30, allowed_token_ids=abc_ids)
    want = [o.token_ids for o in llm.generate(["hello", "a b c"], params)]
    for spec in ({"method": "draft_model", "model": str(byte_llama), "num_speculative_tokens": 3},
                 {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1}):
        spec_llm = LLM(str(byte_llama), device="cpu", max_model_len=128, max_num_seqs=4, speculative_config=spec)
        assert [o.token_ids for o in spec_llm.generate(["hello", "a b c"], params)] == want, spec["method"]


@pytest.mark.parametrize("kwargs, match", [
    (dict(allowed_token_ids=[]), "non-empty list"),
    (dict(allowed_token_ids=[-1]), "integers >= 0"),
    (dict(allowed_token_ids=[True]), "integers >= 0"),
    (dict(allowed_token_ids=[97], structured_outputs={"regex": "a+"}), "cannot be combined"),
])
def test_bad_values_are_refused(kwargs, match):
    with pytest.raises(ValueError, match=match):
        SamplingParams(**kwargs)


# ---- bad_words -----------------------------------------------------------------------------------
def ascii_word(text: str, n: int) -> str:
    """The first n characters in a row of text that are printable ASCII and not spaces (the byte
    tokenizer's text of a random model is mostly bytes of no character, which re-encode otherwise)."""
    ok = [c.isascii() and c.isprintable() and not c.isspace() for c in text]
    k = next(k for k in range(len(text) - n + 1) if all(ok[k:k + n]))
    return text[k:k + n]


def test_bad_words_never_appear(llm):
    """Words taken from what greedy decoding writes (one character: a single token; three: a sequence)
    are gone from the output, which otherwise runs as before up to the first ban."""
    params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    plain = llm.generate(["hello"], params)[0].text
    three, one = ascii_word(plain, 3), ascii_word(plain, 1)
    for word in (three, one):
        got = llm.generate(["hello"], SamplingParams(temperature=0, max_tokens=40, ignore_eos=True,
                                                     bad_words=[word]))[0].text
        assert word not in got and got != plain, (word, plain, got)
        first = plain.index(word)
        assert got[:first] == plain[:first]  # nothing changes before the word would have been written
    sampled = llm.generate(["hello"] * 4, [SamplingParams(temperature=1, seed=s, max_tokens=40, bad_words=[three, one])
                                           for s in range(4)])
    assert all(three not in o.text and one not in o.text for o in sampled)


def test_speculation_is_lossless_with_bad_words(byte_llama, llm):
    params = SamplingParams(temperature=0, max_tokens=30, ignore_eos=True)
    plain = llm.generate(["hello", "a b c"], params)
    words = [ascii_word(plain[0].text, 2), ascii_word(plain[1].text, 1)]
    params = SamplingParams(temperature=0, max_tokens=30, ignore_eos=True, bad_words=words)
    want = [o.token_ids for o in llm.generate(["hello", "a b c"], params)]
    assert all(w != o.token_ids for w, o in zip(want, plain))  # the words were banned somewhere
    for spec in ({"method": "draft_model", "model": str(byte_llama), "num_speculative_tokens": 3},
                 {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1}):
        spec_llm = LLM(str(byte_llama), device="cpu", max_model_len=128, max_num_seqs=4, speculative_config=spec)
        assert [o.token_ids for o in spec_llm.generate(["hello", "a b c"], params)] == want, spec["method"]


@pytest.mark.parametrize("kwargs, match", [
    (dict(bad_words=[""]), "words with text"),
    (dict(bad_words=[3]), "words with text"),
    (dict(bad_words=["a"], allowed_token_ids=[5]), "cannot be combined"),
    (dict(bad_words=["a"], structured_outputs={"regex": "a+"}), "cannot be combined"),
])
def test_bad_bad_words_are_refused(kwargs, match):
    with pytest.raises(ValueError, match=match):
        SamplingParams(**kwargs)


def test_refused_by_the_engine(llm):
    with pytest.raises(ValueError, match="below the vocabulary size 256"):
        llm.generate(["hi"], SamplingParams(allowed_token_ids=[97, 256]))
    with pytest.raises(ValueError, match="only stop tokens"):  # min_tokens would ban every allowed token
        llm.generate(["hi"], SamplingParams(allowed_token_ids=[2], min_tokens=2))


# ---- the server ---------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def server(byte_llama, tmp_path_factory):
    srv = Server(byte_llama, tmp_path_factory.mktemp("log") / "server.log", "--served-model-name", "tiny")
    yield srv
    assert srv.stop() == 0, srv.text()
    assert "Traceback" not in srv.text()


def test_server_honours_bad_words(server, llm):
    cl = server.client()
    kw = dict(model="tiny", prompt="hello", max_tokens=30, temperature=0, extra_body={"ignore_eos": True})
    plain = cl.completions.create(**kw).choices[0].text
    word = ascii_word(plain, 2)
    got = cl.completions.create(**{**kw, "extra_body": {"ignore_eos": True, "bad_words": [word]}}).choices[0].text
    assert word not in got and got != plain


@pytest.mark.parametrize("chat", [False, True])
def test_server_honours_the_set(server, chat, abc_ids):
    client = server.client()
    kw = dict(model="tiny", max_tokens=20, temperature=1, seed=5, extra_body={"allowed_token_ids": abc_ids})
    if chat:
        text = client.chat.completions.create(messages=[{"role": "user", "content": "hi"}], **kw)
        text = text.choices[0].message.content
    else:
        text = client.completions.create(prompt="hello", **kw).choices[0].text
    assert text and set(text) <= set("abc "), text


@pytest.mark.parametrize("body, param", [
    ({"allowed_token_ids": []}, "allowed_token_ids"),
    ({"allowed_token_ids": [7, 300]}, "allowed_token_ids"),
    ({"allowed_token_ids": [7], "structured_outputs": {"regex": "a+"}}, "allowed_token_ids"),
    ({"bad_words": [""]}, "bad_words"),
    ({"bad_words": ["ab"], "allowed_token_ids": [7]}, "bad_words"),
    ({"logits_processors": ["x"]}, "logits_processors"),
])
def test_server_refuses_by_name(server, body, param):
    with pytest.raises(openai.BadRequestError) as e:
        server.client().completions.create(model="tiny", prompt="hello", max_tokens=4, extra_body=body)
    assert e.value.body["param"] == param, e.value.body
