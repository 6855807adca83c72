"""Streamed text: IncrementalDecoder's deltas against a decode of all the ids at once, on real
tokenizers (SmolLM2's byte-level BPE, a SentencePiece-style byte-fallback vocabulary, a byte a
token), and stop strings through LLMEngine.step() as the server streams them."""

from __future__ import annotations

import time

import pytest
from gguf import GGUFReader
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from minillm import SamplingParams
from minillm.engine.engine import LLMEngine
from minillm.models.gguf_loader import read_metadata, tokenizer_from_gguf
from minillm.models.loader import default_model_path
from minillm.models.tokenizer import IncrementalDecoder, Tokenizer

from gguf_util import SPM_TOKENS, random_weights, sentencepiece_tokenizer_metadata, tiny_config, write_model

few = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                       HealthCheck.function_scoped_fixture])


def gguf_tokenizer(path) -> Tokenizer:
    return tokenizer_from_gguf(read_metadata(GGUFReader(path), str(path)), str(path))


@pytest.fixture(scope="module")
def smollm():
    return gguf_tokenizer(default_model_path())


@pytest.fixture(scope="module")
def spm(tmp_path_factory):
    cfg = tiny_config("llama", num_layers=1, vocab_size=len(SPM_TOKENS))
    path, _ = write_model(tmp_path_factory.mktemp("spm") / "spm.gguf", cfg, random_weights(cfg),
                          extra_metadata=sentencepiece_tokenizer_metadata())
    return gguf_tokenizer(path)


def stream(tok: Tokenizer, ids: list[int], skip: bool) -> list[str]:
    dec = IncrementalDecoder(tok, skip)
    return [dec.push([i]) for i in ids] + [dec.flush()]


def check_stream(tok: Tokenizer, ids: list[int], skip: bool) -> None:
    deltas = stream(tok, ids, skip)
    full = tok.decode(ids, skip_special_tokens=skip)
    assert "".join(deltas) == full, (ids, deltas)
    sent = ""
    for d in deltas:  # never a U+FFFD that a later byte would have made a character, nothing twice
        sent += d
        assert full.startswith(sent), (ids, deltas)


def smollm_partial_ids(tok: Tokenizer) -> list[int]:
    """SmolLM2 tokens whose bytes are not whole UTF-8 characters (a lead byte, a continuation, ...)."""
    return [i for i in range(tok.vocab_size) if "\ufffd" in tok.decode([i], skip_special_tokens=False)]


@few
@given(data=st.data(), skip=st.booleans())
def test_smollm_deltas_join_to_the_whole_decode(smollm, data, skip):
    partial = smollm_partial_ids(smollm) if not hasattr(smollm, "_partial") else smollm._partial
    smollm._partial = partial
    token = st.one_of(st.integers(0, smollm.vocab_size - 1), st.sampled_from(partial), st.integers(0, 16),
                      st.integers(0, 300))
    ids = data.draw(st.lists(token, max_size=14))
    check_stream(smollm, ids, skip)


@few
@given(ids=st.lists(st.integers(0, len(SPM_TOKENS) + 2), max_size=14), skip=st.booleans())
def test_byte_fallback_deltas_join_to_the_whole_decode(spm, ids, skip):
    """A run of <0xXX> tokens decodes as a whole: one that is not UTF-8 gives a U+FFFD per token,
    ASCII ones too. DecodeStream raised 'Invalid prefix' when a later byte did that to a byte it had
    already let out (and again on every later token), and held an incomplete run at the end. Ids past
    the vocabulary (an embedding padded past it) have no text: decode drops them, and so must the stream."""
    check_stream(spm, ids, skip)


def test_byte_fallback_known_cases(spm):
    b = spm.tok.token_to_id
    nl, e2, the = b("<0x0A>"), b("<0xE2>"), b("\u2581the")
    euro = [e2, b("<0x82>"), b("<0xAC>")]
    past = len(SPM_TOKENS) + 1  # no token: inside a byte run it ended the run ("\n" let out, then one U+FFFD)
    for ids in ([nl, e2, the], [nl, *euro, the], [the, nl], [the, e2], [nl, e2, 1, b("<0x82>"), b("<0xAC>")],
                [nl, past, e2], [e2, past, *euro[1:]], [*euro[:2], past, euro[2]]):
        for skip in (True, False):
            check_stream(spm, ids, skip)
    assert "".join(stream(spm, [the, nl, *euro, the], True)) == "the\n\u20ac the"


def test_sequence_ending_mid_character_is_flushed(smollm):
    """The decode of all ids ends in U+FFFD where they end inside a character; the stream held those
    bytes for good (output text shorter than the decode of its token_ids)."""
    cut = [*smollm.encode("ok"), smollm.tok.token_to_id("\u00e2")]  # "ok", then 0xE2: a UTF-8 lead byte
    assert smollm.decode(cut) == "ok\ufffd"
    assert "".join(stream(smollm, cut, True)) == "ok\ufffd"
    for seq in (cut, [smollm.tok.token_to_id("\u0122")] * 5):  # the byte 0x80, never a character
        check_stream(smollm, seq, True)


def test_long_runs_stay_linear(smollm):
    """Skipped special tokens and stray continuation bytes were each held in DecodeStream's window,
    which every later step decodes whole: 8000 of them took seconds (quadratic)."""
    runs = ([0] * 6000, [smollm.tok.token_to_id("Ģ")] * 6000, [5, 30] * 3000)
    t0 = time.perf_counter()
    for ids in runs:
        dec = IncrementalDecoder(smollm)
        text = "".join(dec.push([i]) for i in ids) + dec.flush()
        assert text == smollm.decode(ids)
    assert time.perf_counter() - t0 < 2.0  # (0.03 s here; the quadratic decode took 8.7 s)


def test_a_failing_stream_falls_back_to_windows(smollm):
    """Should DecodeStream report an invalid prefix for some other decoder, the deltas go on (decoded
    here by windows) rather than the request (and the engine's step) failing."""

    class Failing:
        def step(self, tok, ids):
            raise Exception("Invalid prefix encountered while decoding stream")

    ids = smollm.encode("Hello w\u00f6rld, \u20ac5 \U0001F600!")
    dec = IncrementalDecoder(smollm)
    first = dec.push(ids[:3])
    dec._stream = Failing()
    rest = "".join(dec.push([i]) for i in ids[3:]) + dec.flush()
    assert first + rest == smollm.decode(ids)


# ---- stop strings -------------------------------------------------------------------------------------
def test_find_stop_takes_the_one_that_ends_first():
    """Text arriving a character at a time meets "bcd" before "abcde" is whole; a token bringing all
    of it at once took "abcde" (it starts first), so the cut depended on how the text was tokenized."""
    find = LLMEngine._find_stop
    assert find("xabcdey", ["abcde", "bcd"]) == (2, 5)
    assert find("xabc", ["abc", "ab"]) == (1, 3)  # "ab" ended first
    assert find("xabc", ["bc", "abc"]) == (1, 4)  # ending together: the one starting first
    assert find("aXb", ["Y"]) is None
    assert find("abab", ["ab"], 2) == (2, 4)  # only text past text[:2] is new
    # a stop string lying wholly in the old text is not matched, however long the others are
    assert find("xRabc", ["R", "QQQQQQQQ"], 3) is None and find("xRabcR", ["R", "QQQQQQQQ"], 5) == (5, 6)


def test_a_stop_string_inside_the_min_tokens_text_does_not_depend_on_the_other_stop_strings(engine):
    """Under min_tokens the first tokens' text is never searched; a search window as wide as the longest stop
    string then matched a shorter one lying wholly in that text, so adding a stop string that never occurs
    ('Q' x 12) cut the output at the first token's character."""
    prompt = [5, 6, 7, 8]
    first = run(engine, prompt, [SamplingParams(max_tokens=1, temperature=0, ignore_eos=True)])[0][1]
    assert first.strip(), first
    c = first.strip()[0]
    outs = run(engine, prompt, [SamplingParams(max_tokens=12, min_tokens=1, temperature=0, ignore_eos=True, stop=stop)
                                for stop in ([c], [c, "Q" * 12])])
    assert outs[0][:4] == outs[1][:4], outs
    assert outs[0][1].startswith(first)  # the first token's character was not taken as the stop


@pytest.fixture(scope="module")
def engine(byte_llama):
    return LLMEngine(model=str(byte_llama), device="cpu", max_model_len=128, max_num_seqs=8)


def run(engine: LLMEngine, prompt, params: list[SamplingParams]) -> list[tuple]:
    """(token ids, text, finish reason, stop reason, streamed text) of each request, stepped by hand."""
    for i, sp in enumerate(params):
        engine.add_request(prompt, sp, request_id=f"r{i}")
    streamed, done = {}, {}
    while engine.has_unfinished():
        for o in engine.step():
            streamed[o.request_id] = streamed.get(o.request_id, "") + o.new_text
            if o.finished:
                done[o.request_id] = (o.token_ids, o.text, o.finish_reason, o.stop_reason)
    return [(*done[f"r{i}"], streamed.get(f"r{i}", "")) for i in range(len(params))]


PROMPT = "Stop here: \u00e9\u20ac! then go on"
MAX = 48


def sampling(max_tokens: int, **kw) -> SamplingParams:
    return SamplingParams(temperature=1.0, seed=2, max_tokens=max_tokens, ignore_eos=True, **kw)


@pytest.fixture(scope="module")
def reference(engine):
    """The output with no stop string (seeded): random bytes, most not UTF-8, a few 2-byte characters."""
    [(ids, text, reason, _, streamed)] = run(engine, PROMPT, [sampling(MAX)])
    assert reason == "length" and len(ids) == MAX
    assert any(len(c.encode()) > 1 and c != "\ufffd" for c in engine.tokenizer.decode(ids))
    return ids


def test_engine_text_is_the_decode_of_its_ids(engine, reference):
    """Cut at every length, the output (whose bytes often end inside a character) streams the decode
    of its token ids, and its text is that too."""
    tok = engine.tokenizer
    ends_mid = [k for k in range(1, MAX + 1) if tok.decode(reference[:k]).endswith("\ufffd")]
    assert ends_mid, "no cut inside a character: the test would not notice"
    outs = run(engine, PROMPT, [sampling(k) for k in range(1, MAX + 1)])
    for k, (ids, text, reason, _, streamed) in enumerate(outs, 1):
        assert ids == reference[:k] and reason == "length"
        assert streamed == text == tok.decode(ids), k


def expected_stop(engine: LLMEngine, ids: list[int], stops: list[str], include: bool):
    """(token ids, text, stop string) plain decoding gives: the stop string that ends first in the
    text (ties: the one starting first), found at the token whose streamed text first holds it."""
    full = engine.tokenizer.decode(ids)
    found = [(full.find(s) + len(s), full.find(s), s) for s in stops if s in full]
    if not found:
        return ids, full, None
    end, start, s = min(found)
    dec, text, k = IncrementalDecoder(engine.tokenizer), "", 0
    while len(text) < end and k < len(ids):
        text += dec.push([ids[k]])
        k += 1
    return ids[:k], full[: end if include else start], s


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_engine_stop_strings(engine, reference, data):
    """Stop strings taken from the output (spanning tokens and characters split into bytes), prefixes of
    each other, ones that never occur (held text must come out whole) and ones only in the prompt."""
    full = engine.tokenizer.decode(reference)
    full_chars = full.rstrip("\ufffd") or full
    params, wants = [], []
    for _ in range(6):
        a = data.draw(st.integers(0, len(full_chars) - 1))
        b = data.draw(st.integers(a + 1, min(len(full_chars), a + 4)))
        s = full_chars[a:b]
        stops = data.draw(st.sampled_from([[s], [s, s[:1]], [s[:1], s], [s + "\x00"], ["Stop here", s + "\x00"],
                                           [full_chars[b - 1 : b + 2] or s, s]]))
        include = data.draw(st.booleans())
        params.append(sampling(MAX, stop=stops, include_stop_str_in_output=include))
        wants.append(expected_stop(engine, reference, stops, include))
    for (ids, text, reason, stop_reason, streamed), (want_ids, want_text, want_stop), sp in zip(
            run(engine, PROMPT, params), wants, params):
        assert (ids, text, stop_reason) == (want_ids, want_text, want_stop), sp.stop
        assert streamed == text
        assert reason == ("stop" if want_stop else "length")


def test_llm_generate_text_is_the_decode_of_its_ids(byte_llama, reference):
    """Through the offline API: an output cut inside a character, and one cut by a stop string."""
    from minillm import LLM

    llm = LLM(str(byte_llama), device="cpu", max_model_len=128)
    tok = llm.engine.tokenizer
    k = next(k for k in range(1, MAX + 1) if tok.decode(reference[:k]).endswith("\ufffd"))
    full = tok.decode(reference)
    stop = next(c for c in full if len(c.encode()) > 1 and c != "\ufffd")  # a character split in two tokens
    cut, stopped = llm.generate([PROMPT, PROMPT], [sampling(k), sampling(MAX, stop=[stop])])
    assert cut.text == tok.decode(reference[:k]) and cut.text.endswith("\ufffd")
    assert stopped.text == full[: full.index(stop)]
    assert stopped.finish_reason == "stop"
