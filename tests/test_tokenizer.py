"""Tokenizer from GGUF metadata against transformers' GGUF tokenizer (the reference we match).

The SmolLM2 file ("smollm" pre-tokenizer, ChatML template) is compared on hypothesis-generated
text and chat conversations; tiny byte-level vocabularies written with gguf.GGUFWriter cover the
other pre-tokenizer regexes (llama-bpe, qwen2) and user-defined tokens.
"""

from __future__ import annotations

import pytest
from gguf import GGUFReader
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from minillm.models.gguf_loader import read_metadata, tokenizer_from_gguf
from minillm.models.loader import default_model_path
from minillm.models.tokenizer import IncrementalDecoder

from gguf_util import (
    SPM_TOKENS,
    byte_alphabet,
    random_weights,
    sentencepiece_tokenizer_metadata,
    tiny_config,
    write_model,
)


def hf_gguf_tokenizer(path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)


def our_tokenizer(path):
    return tokenizer_from_gguf(read_metadata(GGUFReader(path), str(path)), str(path))


@pytest.fixture(scope="module")
def smollm_pair():
    path = default_model_path()
    return our_tokenizer(path), hf_gguf_tokenizer(path)


# Pieces that stress the pre-tokenizer and the added-token matcher, mixed with arbitrary text.
FRAGMENTS = [
    "<|im_start|>", "<|im_end|>", "<|endoftext|>", "<repo_name>", "<file_sep>", "<|im_start", "im_end|>",
    "<", "|>", " ", "  ", "   ", "\n", "\n\n", "\t", "\r\n", "  \n ", "0", "123", " 42", "  7", "2024-11-30",
    "3.14159", "def f(x):\n    return x ** 2\n", "if (a && b) { return; }", "x = [1, 2, 3]", "'s", "'LL",
    "I'm", "don't", "Hello", " world", "héllo", "naïve", "日本語", "한국어", "😀", "👍🏽", "\u00a0", "\u200b",
    "\u0301", "Ω", "ﬁ",
]
texts = st.lists(
    st.one_of(st.text(max_size=12), st.sampled_from(FRAGMENTS), st.text(alphabet=" \n\t0123456789", max_size=8)),
    max_size=10,
).map("".join)
BYTE_CHARS = byte_alphabet()
fast = settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@fast
@given(text=texts)
def test_smollm_encodes_like_transformers(smollm_pair, text):
    ours, hf = smollm_pair
    assert ours.encode(text) == hf.encode(text)
    assert ours.encode(text, add_special_tokens=False) == hf.encode(text, add_special_tokens=False)


def representable(tok, text: str) -> bool:
    """SmolLM2's vocabulary lacks 21 byte tokens (0x04, 0xF1, ...): BPE without an unknown token
    drops such characters (transformers too), so only other text can decode back to itself."""
    if tok not in _BYTES_IN_VOCAB:
        vocab = tok.tok.get_vocab()
        _BYTES_IN_VOCAB[tok] = {b for b in range(256) if BYTE_CHARS[b] in vocab}
    return set(text.encode("utf-8")) <= _BYTES_IN_VOCAB[tok]


_BYTES_IN_VOCAB: dict = {}


def test_smollm_drops_bytes_it_has_no_token_for(smollm_pair):
    ours, hf = smollm_pair
    text = "a\U00040000b\x04c"
    assert not representable(ours, text)
    assert ours.encode(text) == hf.encode(text)
    assert ours.decode(ours.encode(text)) == "a\ufffd\ufffd\ufffdbc"


def test_lone_surrogates_are_refused_by_name(smollm_pair):
    """JSON can carry an unpaired "\\ud800"; the tokenizers library fails on it with a bare TypeError."""
    ours, hf = smollm_pair
    with pytest.raises(ValueError, match=r"lone surrogate '\\ud800' at character 1"):
        ours.encode("a\ud800b")
    assert ours.encode("a\U0001F600b") == hf.encode("a\U0001F600b")  # a whole character outside the BMP


@fast
@given(text=texts)
def test_smollm_decodes_back_to_the_text(smollm_pair, text):
    ours, hf = smollm_pair
    assume(representable(ours, text))
    ids = ours.encode(text)
    assert ours.decode(ids, skip_special_tokens=False) == text
    assert ours.decode(ids) == hf.decode(ids, skip_special_tokens=True)
    dec = IncrementalDecoder(ours)
    assert "".join(dec.push([i]) for i in ids) == ours.decode(ids)


def test_smollm_special_tokens(smollm_pair):
    ours, _ = smollm_pair
    assert ours.encode("<|im_start|>user\nhi<|im_end|>") == [1, 4093, 198, 6004, 2]
    assert ours.bos_token == "<|im_start|>" and ours.eos_token == "<|im_end|>"
    assert ours.eos_token_ids == [2] and not ours.add_bos_token
    assert set(range(17)) <= ours.special_token_ids  # the 17 control tokens
    assert ours.decode([1, 4093, 2]) == "user"


CONVERSATIONS = [
    [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "What is 2+2?"}],
    [{"role": "user", "content": "Hi there"}],  # the template adds its default system prompt
    [{"role": "system", "content": "Be kind."}, {"role": "user", "content": "Hello"},
     {"role": "assistant", "content": "Hi! How can I help?"},
     {"role": "user", "content": "Tell me a joke.\n\nA short one."}],
    [{"role": "user", "content": "  spaces  and <|im_end|> inside  "}],
]


@pytest.mark.parametrize("messages", CONVERSATIONS, ids=["system+user", "user", "multi-turn", "specials"])
@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_smollm_chat_template_like_transformers(smollm_pair, messages, add_generation_prompt):
    ours, hf = smollm_pair
    text = ours.apply_chat_template(messages, add_generation_prompt=add_generation_prompt)
    want = hf.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)
    assert text == want
    want_ids = hf.apply_chat_template(messages, tokenize=True, add_generation_prompt=add_generation_prompt)
    assert ours.encode_chat(messages, add_generation_prompt=add_generation_prompt) == want_ids["input_ids"]
    assert text.startswith("<|im_start|>system\n")
    assert text.endswith("<|im_start|>assistant\n") == add_generation_prompt


# ---- other pre-tokenizers, on tiny vocabularies -----------------------------------------------------
PRE_TOKENIZERS = ["llama-bpe", "qwen2", "smollm", "default"]


@pytest.fixture(scope="module")
def tiny_pairs(tmp_path_factory):
    pairs = {}
    for pre in PRE_TOKENIZERS:
        cfg = tiny_config("qwen2", num_layers=1)
        path, _ = write_model(tmp_path_factory.mktemp(pre) / "tiny.gguf", cfg, random_weights(cfg), pre=pre)
        pairs[pre] = our_tokenizer(path), hf_gguf_tokenizer(path)
    return pairs


tiny_texts = st.lists(
    st.one_of(st.text(max_size=8), st.sampled_from(
        ["the", " the", "  ", "    ", "\n\n", "12", " 12", "1234", " 1", "in", " a", "er", "<think>", "<|im_end|>",
         "'s", "'S", "don't", "\r\n", "日本", "a\u0301"])),
    max_size=10,
).map("".join)


@pytest.mark.parametrize("pre", PRE_TOKENIZERS)
def test_tiny_vocab_pre_tokenizers_like_transformers(tiny_pairs, pre):
    ours, hf = tiny_pairs[pre]

    @settings(max_examples=150, deadline=None)
    @given(text=tiny_texts)
    def check(text):
        ids = ours.encode(text)
        assert ids == hf.encode(text)
        assert ours.decode(ids, skip_special_tokens=False) == text

    check()


def test_tiny_vocab_merges_and_added_tokens(tiny_pairs):
    ours = tiny_pairs["qwen2"][0]
    toks = [ours.tok.id_to_token(i) for i in ours.encode("the 12 <think>\n\n<|im_end|>")]
    # qwen2 splits digits one by one, so the "12" merge never applies; <think> is user-defined
    assert toks == ["t", "he", "Ġ", "1", "2", "Ġ", "<think>", "ĊĊ", "<|im_end|>"]
    assert 270 not in ours.special_token_ids and 2 in ours.special_token_ids
    llama3 = tiny_pairs["llama-bpe"][0]
    assert [llama3.tok.id_to_token(i) for i in llama3.encode(" 12")] == ["Ġ", "12"]


# ---- SentencePiece-style ("llama") tokenizer, on a tiny vocabulary ---------------------------------
@pytest.fixture(scope="module")
def spm_pair(tmp_path_factory):
    cfg = tiny_config("llama", num_layers=1, vocab_size=len(SPM_TOKENS))
    path, _ = write_model(tmp_path_factory.mktemp("spm") / "spm.gguf", cfg, random_weights(cfg),
                          extra_metadata=sentencepiece_tokenizer_metadata())
    return our_tokenizer(path), hf_gguf_tokenizer(path)


spm_texts = st.lists(
    st.one_of(st.text(max_size=8), st.sampled_from(
        ["the", " the", "  ", "    ", "\n", "12", " 12", " 1", "in", " in", " a", "her", "<s>", "</s>", "<unk>",
         "<think>", "▁", "é", "日本", "😀"])),
    max_size=10,
).map("".join)


@settings(max_examples=250, deadline=None)
@given(text=spm_texts)
def test_sentencepiece_encodes_like_transformers(spm_pair, text):
    ours, hf = spm_pair
    ids = ours.encode(text, add_special_tokens=False)
    assert ids == hf.encode(text, add_special_tokens=False)
    assert ours.decode(ids, skip_special_tokens=False) == hf.decode(ids, skip_special_tokens=False)
    assert ours.decode(ids) == hf.decode(ids, skip_special_tokens=True)
    with_bos = ours.encode(text)
    assert with_bos[0] == 1  # BOS by default for SentencePiece files
    if ids[:1] != [1]:  # text starting with "<s>" gets no second BOS from us (transformers adds one)
        assert with_bos == hf.encode(text)


def test_sentencepiece_pieces(spm_pair):
    ours, _ = spm_pair
    pieces = [ours.tok.id_to_token(i) for i in ours.encode("the  there 12 \u00e9<think>", add_special_tokens=False)]
    # a space prefix, "▁" for spaces, merges by score, <0xXX> bytes for what the vocabulary lacks;
    # "12" and "▁1" score the same, and "12" is listed first, so it wins
    assert pieces == ["▁the", "▁", "▁the", "r", "e", "▁", "12", "▁", "<0xC3>", "<0xA9>", "<think>"]
    assert ours.decode(ours.encode("the  there 12 \u00e9")) == "the  there 12 \u00e9"
    assert ours.add_bos_token and ours.bos_token == "<s>" and ours.eos_token_ids == [2]


def test_incremental_decoder_keeps_special_tokens_when_asked(smollm_pair):
    ours, hf = smollm_pair
    ids = ours.encode("<|im_start|>user\nhi<|im_end|>")
    kept = IncrementalDecoder(ours, skip_special_tokens=False)
    text = "".join(kept.push([i]) for i in ids)
    assert text == hf.decode(ids, skip_special_tokens=False) == "<|im_start|>user\nhi<|im_end|>"
    assert "".join(IncrementalDecoder(ours).push([i]) for i in ids) == hf.decode(ids, skip_special_tokens=True)


def test_long_text_encodes_the_same_and_lets_other_threads_run(smollm_pair):
    """Texts of 64K characters and more go through encode_batch, which releases the GIL (encode holds it
    throughout: a 7 MB prompt stopped the server's event loop for 5 s). The ids are transformers'; and
    while a 2 MB text encodes in a worker thread, this thread keeps running: its longest pause is a
    small part of the encode's time, where holding the GIL would make it all of it."""
    import threading
    import time

    ours, hf = smollm_pair
    text = "Hello world, this is a long prompt. " * 2000  # 72K characters
    assert ours.encode(text) == hf.encode(text)
    big = "a fairly long sentence with some words in it. " * 45000
    done, span = threading.Event(), []

    def work():
        t0 = time.perf_counter()
        ours.encode(big)
        span.append(time.perf_counter() - t0)
        done.set()

    worker = threading.Thread(target=work)
    last, longest = time.perf_counter(), 0.0
    worker.start()
    while not done.is_set():
        time.sleep(0.002)
        now = time.perf_counter()
        longest, last = max(longest, now - last), now
    worker.join()
    assert span[0] > 0.2, "the text encoded too fast to tell"
    assert longest < span[0] / 2, (longest, span[0])
