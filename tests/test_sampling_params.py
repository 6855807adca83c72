"""SamplingParams' validation and normalisation: every bad value a ValueError naming its field at
construction (never a crash mid-step), the spellings vLLM takes (NumPy scalars, logit_bias's string
keys) taken as theirs; then through the real engine on the CPU (a tiny random Llama, byte tokenizer)."""

from __future__ import annotations

import copy
import dataclasses

import numpy as np
import pytest

from minillm import LLM, SamplingParams


@pytest.fixture(scope="module")
def llm(byte_llama):
    return LLM(str(byte_llama), device="cpu", max_model_len=128, max_num_seqs=4)


def test_numpy_scalars_are_taken_as_python_values():
    sp = SamplingParams(max_tokens=np.int64(4), top_k=np.int32(3), min_tokens=np.uint8(1), seed=np.uint64(7),
                        temperature=np.float32(0.5), top_p=np.float16(1.0), min_p=np.float32(0.0),
                        presence_penalty=np.float32(0.5), logprobs=np.int64(2), ignore_eos=np.bool_(True),
                        stop_token_ids=[np.int64(5)], logit_bias={np.int64(6): np.float32(1.5)},
                        allowed_token_ids=np.array([5, 6, 7]), truncate_prompt_tokens=np.int64(-1))
    assert (sp.max_tokens, sp.top_k, sp.min_tokens, sp.seed, sp.logprobs) == (4, 3, 1, 7, 2)
    assert (sp.temperature, sp.top_p, sp.presence_penalty, sp.ignore_eos) == (0.5, 1.0, 0.5, True)
    assert sp.stop_token_ids == [5] and sp.logit_bias == {6: 1.5} and sp.allowed_token_ids == [5, 6, 7]
    for v in (sp.max_tokens, sp.seed, sp.stop_token_ids[0], *sp.logit_bias, *sp.allowed_token_ids,
              sp.truncate_prompt_tokens):
        assert type(v) is int
    assert type(sp.temperature) is float and type(sp.logit_bias[6]) is float and type(sp.ignore_eos) is bool


@pytest.mark.parametrize("kw", [dict(max_tokens=np.bool_(True)), dict(top_k=np.float32(3)), dict(seed=np.float64(1)),
                                dict(ignore_eos=np.int64(1)), dict(temperature=np.float32("nan")),
                                dict(stop_token_ids=np.array([1.5])), dict(allowed_token_ids=np.array([], int))])
def test_numpy_values_of_the_wrong_kind_are_refused_by_name(kw):
    with pytest.raises(ValueError, match=next(iter(kw))):
        SamplingParams(**kw)


def test_numpy_typed_params_generate_as_python_typed(llm):
    py = SamplingParams(max_tokens=6, temperature=0.5, top_k=20, seed=11, logit_bias={70: 5.0}, stop_token_ids=[9])
    npy = SamplingParams(max_tokens=np.int64(6), temperature=np.float32(0.5), top_k=np.int64(20), seed=np.int64(11),
                         logit_bias={np.int64(70): np.float64(5.0)}, stop_token_ids=np.array([9]))
    a, b = llm.generate(["hello"], py)[0], llm.generate(["hello"], npy)[0]
    assert a.token_ids == b.token_ids and len(a.token_ids) >= 1


@pytest.mark.parametrize("field", ["stop_token_ids", "allowed_token_ids"])
@pytest.mark.parametrize("big", [2**31, 2**63, 2**70])
def test_token_ids_past_int32_are_refused(field, big):
    with pytest.raises(ValueError, match=field):
        SamplingParams(**{field: [5, big]})
    with pytest.raises(ValueError, match="logit_bias"):
        SamplingParams(logit_bias={big: 1.0})
    with pytest.raises(ValueError, match="think_token_ids"):
        SamplingParams(think_token_ids=(None, big))


def test_stop_token_ids_past_the_vocabulary_with_min_tokens_run(llm):
    """An id past the vocabulary is a no-op (vLLM's), with min_tokens too; before, [2**31] or [2**63] with
    min_tokens passed validation and raised OverflowError in the runner's ban list, mid-step."""
    vocab = llm.engine.config.vocab_size
    out = llm.generate(["hello"], SamplingParams(stop_token_ids=[vocab + 3, 2**31 - 1], min_tokens=3, max_tokens=5,
                                                 seed=0))[0]
    assert 3 <= len(out.token_ids) <= 5
    assert not llm.engine.requests


def test_logit_bias_digit_string_keys_are_token_ids(llm):
    """vLLM's SamplingParams takes {"70": bias} (int() of each key), as the JSON that carries it spells them."""
    assert SamplingParams(logit_bias={"70": 100, "5": -1.5}).logit_bias == {70: 100, 5: -1.5}
    by_str = llm.generate(["hello"], SamplingParams(max_tokens=4, seed=1, logit_bias={"70": 100}))[0]
    by_int = llm.generate(["hello"], SamplingParams(max_tokens=4, seed=1, logit_bias={70: 100}))[0]
    assert by_str.token_ids == by_int.token_ids == [70] * 4


@pytest.mark.parametrize("bias", [{"a": 1}, {"-1": 1}, {" 5": 1}, {"+5": 1}, {"5_0": 1}, {"\u0665": 1}, {"": 1},
                                  {5.0: 1}, {True: 1}, {"5": 1, 5: 2}, {5: float("inf")}, {5: "1"}])
def test_logit_bias_bad_keys_and_values_are_refused(bias):
    with pytest.raises(ValueError, match="logit_bias"):
        SamplingParams(logit_bias=bias)


@pytest.mark.parametrize("bias", [0, "", [], False, [(5, 1.0)], "{5: 1}"])
def test_logit_bias_not_a_dict_is_refused_even_when_empty(bias):
    """0, "" or [] were taken as "no bias" without a word."""
    with pytest.raises(ValueError, match="logit_bias"):
        SamplingParams(logit_bias=bias)
    assert SamplingParams(logit_bias={}).logit_bias is None


def test_validate_after_setting_fields_by_hand():
    """validate() normalises and checks again: a str stop set on the object is one stop string (it
    passed before as a list of its characters), and a bad value is refused by name."""
    sp = SamplingParams()
    sp.stop = "ab"
    sp.stop_token_ids = (np.int64(3),)
    sp.validate()
    assert sp.stop == ["ab"] and sp.stop_token_ids == [3]
    sp.stop_token_ids = [2**40]
    with pytest.raises(ValueError, match="stop_token_ids"):
        sp.validate()
    sp = SamplingParams()
    sp.logit_bias = {"7": 2}
    sp.validate()
    assert sp.logit_bias == {7: 2}
    sp.validate()  # idempotent
    assert sp.logit_bias == {7: 2}


def test_error_messages_stay_short():
    """A large bad value is cut in the message (a 10,000-entry logit_bias or stop list was printed whole)."""
    cases = [dict(logit_bias={i: 1000.0 for i in range(10_000)}), dict(stop=["x"] * 10_000 + [""]),
             dict(stop_token_ids=list(range(10_000)) + [-1])]
    for kw in cases:
        with pytest.raises(ValueError, match=next(iter(kw))) as e:
            SamplingParams(**kw)
        assert len(str(e.value)) < 400, kw.keys()


@pytest.mark.parametrize("kw", [dict(logit_bias={300: 1.0}), dict(allowed_token_ids=[5, 300]),
                                dict(think_token_ids=(None, 300))])
def test_out_of_vocabulary_ids_refused_at_admission_leave_no_request(llm, kw):
    kw["structured_outputs"] = {"regex": "[a-z]+"} if "think_token_ids" in kw else None
    with pytest.raises(ValueError, match=next(iter(kw))):
        llm.generate(["hello"], SamplingParams(max_tokens=3, **kw))
    assert not llm.engine.requests
    assert len(llm.generate(["hello"], SamplingParams(max_tokens=3))[0].token_ids) == 3


@pytest.mark.parametrize("field,value", [("temperature", -1.0), ("max_tokens", 0), ("stop_token_ids", [2**40]),
                                         ("top_p", 0.0), ("ignore_eos", "false")])
def test_fields_set_by_hand_are_checked_at_admission(llm, field, value):
    """SamplingParams changed after construction are validated when the request is added: refused by
    name, no request left behind, the engine serving the next one (it validated only at construction)."""
    sp = SamplingParams(max_tokens=3)
    setattr(sp, field, value)
    with pytest.raises(ValueError, match=field):
        llm.generate(["hello"], sp)
    assert not llm.engine.requests
    sp = SamplingParams(max_tokens=3)
    sp.stop = "zz"  # normalised at admission: one stop string, not two one-character ones
    out = llm.generate(["hello"], sp)[0]
    assert sp.stop == ["zz"] and len(out.token_ids) <= 3


def test_n_samples_offline_are_the_seeded_single_samples(llm):
    """SamplingParams.n (vLLM's): each prompt's result holds its n samples in outputs (index 0..n-1, the
    result itself first), sample k being what n = 1 gives with seed + k; a list of params may give each
    prompt its own n."""
    prompts = [[5, 6, 7], [8, 9]]
    params = [SamplingParams(n=3, temperature=1.0, seed=9, max_tokens=6, ignore_eos=True),
              SamplingParams(n=2, temperature=1.0, seed=2**64 - 1, max_tokens=4, ignore_eos=True, logprobs=1)]
    outs = llm.generate(prompts, params)
    assert len(outs) == 2
    for out, ids, p in zip(outs, prompts, params):
        assert out.outputs[0] is out and [c.index for c in out.outputs] == list(range(p.n))
        for k, c in enumerate(out.outputs):
            alone = llm.generate([ids], SamplingParams(temperature=1.0, seed=(p.seed + k) % 2**64,
                                                       max_tokens=p.max_tokens, ignore_eos=True,
                                                       logprobs=p.logprobs))[0]
            assert c.prompt_token_ids == ids and c.token_ids == alone.token_ids and c.text == alone.text
            assert len(c.token_ids) == p.max_tokens and (c.logprobs is None) == (p.logprobs is None)
    assert len({tuple(c.token_ids) for c in outs[0].outputs}) > 1  # seeded apart, not one sample thrice
    one = llm.generate([prompts[0]], SamplingParams(temperature=1.0, seed=9, max_tokens=6, ignore_eos=True))[0]
    assert one.outputs == [one] and one.index == 0 and one.token_ids == outs[0].token_ids
    # the samples are not a field: asdict, == and repr do not recurse through the list holding the output
    assert dataclasses.asdict(outs[0])["token_ids"] == outs[0].token_ids and "outputs" not in repr(outs[0])
    assert copy.deepcopy(outs[0]) == outs[0] and len(copy.deepcopy(outs[0]).outputs) == 3


def test_n_samples_count_once_a_prompt_on_the_progress_bar(llm):
    seen = []

    class Bar:
        def __init__(self, total, desc):
            seen.append(("total", total))

        def update(self, n=1):
            seen.append(("update", n))

        def close(self):
            seen.append(("close",))

    llm.generate([[5, 6], [7]], SamplingParams(n=4, temperature=1.0, max_tokens=3), use_tqdm=Bar)
    assert seen == [("total", 2), ("update", 1), ("update", 1), ("close",)]


@pytest.mark.parametrize("n", [0, -1, 1025, True, 1.5, "2"])
def test_bad_n_is_refused_by_name(n):
    with pytest.raises(ValueError, match=r"^n must be an integer in \[1, 1024\]"):
        SamplingParams(n=n)


def test_sample_params_seeds_each_sample():
    p = SamplingParams(n=3, seed=-1, temperature=0.5)
    assert [q.seed for q in (p.sample_params(k) for k in range(3))] == [-1, 0, 1]
    assert all(p.sample_params(k).n == 1 for k in range(3)) and p.sample_params(0).temperature == 0.5
    assert [SamplingParams(n=2).sample_params(k).seed for k in range(2)] == [None, None]  # each draws its own
    one = SamplingParams(seed=4)
    assert one.sample_params(0) is one
    with pytest.raises(ValueError, match="sample 3 of n = 3"):
        p.sample_params(3)


def test_outputs_carry_vllms_request_fields(llm):
    """vLLM's quickstart reads output.prompt and output.outputs[0].text: the prompt's text (None for ids; the
    rendered template for chat), cumulative_logprob the sum of the tokens' logprobs (None without them), and
    num_cached_tokens the prefix cache's share of the prompt."""
    text = "the same long prompt, " * 3
    first, ids = llm.generate([text, [5, 6, 7]], SamplingParams(max_tokens=4, logprobs=0, ignore_eos=True))
    assert first.prompt == text and ids.prompt is None and first.outputs[0].text == first.text
    for out in (first, ids):
        assert out.cumulative_logprob == pytest.approx(sum(lp.logprob for lp in out.logprobs))
        assert out.cumulative_logprob < 0 and out.num_cached_tokens == 0
    again = llm.generate(text, SamplingParams(max_tokens=2))[0]
    assert again.cumulative_logprob is None and again.logprobs is None
    assert 0 < again.num_cached_tokens < len(again.prompt_token_ids)  # whole blocks of the first call's prompt
    chat = llm.chat([{"role": "user", "content": "hi"}], SamplingParams(max_tokens=2))[0]
    assert chat.prompt == llm.tokenizer.decode(chat.prompt_token_ids, skip_special_tokens=False)
    assert "hi" in chat.prompt and chat.outputs[0].prompt == chat.prompt
    assert llm.get_tokenizer().decode(llm.get_tokenizer().encode("abc", add_special_tokens=False)) == "abc"


def test_the_engine_refuses_n_rather_than_dropping_it(llm):
    with pytest.raises(ValueError, match=r"one sample a request \(n = 2 given\).*sample_params"):
        llm.engine.add_request([5, 6], SamplingParams(n=2))
    assert not llm.engine.has_unfinished()


def test_generate_with_n_leaves_nothing_behind_and_skips_others_requests(llm, monkeypatch):
    """A request another caller queued on the engine finishing inside generate is not generate's (a KeyError
    before); n set by hand after construction is checked before anything is added; a Ctrl-C landing as
    add_request returns still aborts that request (its id was not yet in generate's list)."""
    engine = llm.engine
    stray = engine.add_request([5, 6], SamplingParams(max_tokens=2, temperature=0))
    out = llm.generate([[7, 8]], SamplingParams(max_tokens=3, temperature=0, ignore_eos=True))[0]
    assert len(out.token_ids) == 3 and stray not in engine.requests and not engine.has_unfinished()

    bad = SamplingParams(n=2)
    bad.n = 5000
    with pytest.raises(ValueError, match=r"prompt 1: n must be an integer in \[1, 1024\]"):
        llm.generate([[5], [6]], [SamplingParams(n=3), bad])
    assert not engine.has_unfinished() and not engine.requests

    real_add = engine.add_request
    calls = []

    def add_then_interrupt(*args, **kwargs):
        rid = real_add(*args, **kwargs)
        calls.append(rid)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return rid

    monkeypatch.setattr(engine, "add_request", add_then_interrupt)
    with pytest.raises(KeyboardInterrupt):
        llm.generate([[5, 6]], SamplingParams(n=4, max_tokens=2))
    monkeypatch.undo()
    assert len(calls) == 2 and not engine.has_unfinished() and not engine.requests and not engine._sync_requests
    assert len(llm.generate([[5, 6]], SamplingParams(max_tokens=2, temperature=0, ignore_eos=True))[0].token_ids) == 2


def test_results_compare_every_sample_and_chat_prompt_is_the_template_text(llm):
    a = llm.generate([[5, 6]], SamplingParams(n=3, temperature=1.0, seed=1, max_tokens=4))[0]
    b = llm.generate([[5, 6]], SamplingParams(n=3, temperature=1.0, seed=1, max_tokens=4))[0]
    one = llm.generate([[5, 6]], SamplingParams(temperature=1.0, seed=1, max_tokens=4))[0]
    assert a == b and a != one and a.token_ids == one.token_ids  # sample 0 alike, the others count
    c = copy.deepcopy(a)
    c.outputs[2].token_ids.append(0)
    assert a != c and a.outputs[1] == c.outputs[1]  # (a sample past the first compares itself)
    msgs = [{"role": "user", "content": "a long message " * 4}]
    whole = llm.chat(msgs, SamplingParams(max_tokens=1))[0]
    cut = llm.chat(msgs, SamplingParams(max_tokens=1, truncate_prompt_tokens=8))[0]
    assert len(cut.prompt_token_ids) == 8 and cut.prompt == whole.prompt  # the text given, as generate's
