"""Structured outputs under adversarial constraints: long choice lists, constraints no text matches,
schemas nested past Python's recursion limit, llguidance errors mid-output, and the sampling
options beside a constraint (a bias toward a banned token, stop strings and stop tokens inside the
constrained text, n > 1 with a seed). The random tiny model (a small BPE vocabulary) picks
arbitrary paths through each constraint.
"""

from __future__ import annotations

import numpy as np
import pytest

from minillm import LLM, SamplingParams
from minillm.sampling_params import StructuredOutputsParams as SO

OPTIONS = [f"option-{i}" for i in range(3000)]


@pytest.fixture(scope="module")
def llm(tiny):
    return LLM(str(tiny), device="cpu", max_model_len=128, max_num_seqs=8)


def allowed(g, m) -> np.ndarray:
    """The token ids matcher m allows next."""
    mask = g.next_token_masks([(m, [])])[0]
    return np.flatnonzero(np.unpackbits(mask.view(np.uint8), bitorder="little"))


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_a_choice_list_of_thousands(llm, temperature):
    """More than 2,000 choices (llguidance's own choice grammar puts them in one parser row,
    which stops at 2,000 items: the output ended after its first token, 'o', with "stop")."""
    outs = llm.generate(["pick one:"] * 3, [SamplingParams(temperature=temperature, seed=s, max_tokens=16,
                                                           structured_outputs=SO(choice=OPTIONS))
                                            for s in range(3)])
    for o in outs:
        assert o.text in OPTIONS and o.finish_reason == "stop", (o.text, o.finish_reason)


def test_choices_that_prefix_each_other_and_unicode(llm):
    """'a' then 'ab': either can end the output; emoji and quotes pass through the Lark terminal."""
    choices = ["a", "ab", "😀", '🎉 "x"\\n', "é\u0301"]
    outs = llm.generate(["x"] * 8, [SamplingParams(temperature=1.0, seed=s, max_tokens=16,
                                                   structured_outputs=SO(choice=choices)) for s in range(8)])
    for o in outs:
        assert o.text in choices and o.finish_reason == "stop", o.text
    g = llm.engine.grammars
    m = g.matcher(SO(choice=["a", "ab"]))
    (a,) = llm.engine.tokenizer.encode("a", add_special_tokens=False)
    assert m.consume_token(a) and m.is_accepting() and not m.is_stopped()  # "a" may end it or go on


@pytest.mark.parametrize("kwargs", [
    dict(regex=r"[^\s\S]"),  # an impossible character class
    dict(json={"$ref": "#/$defs/a", "$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}}),
    dict(json={"$ref": "#"}),
    dict(grammar='start: a\na: a "x"'),  # a rule that never ends
])
def test_a_constraint_no_text_matches_is_refused(llm, kwargs):
    """Before: each was admitted and every output ended empty with finish reason "stop"."""
    with pytest.raises(ValueError, match="cannot be followed: no text matches it"):
        llm.generate(["hi"], SamplingParams(max_tokens=4, structured_outputs=kwargs))
    assert not llm.engine.has_unfinished()


def test_constraints_that_match_only_empty_text_still_run(llm):
    for so in (SO(regex="()"), SO(regex="a*"), SO(grammar='start: ""')):
        o = llm.generate(["hi"], SamplingParams(temperature=0, max_tokens=4, structured_outputs=so))[0]
        assert set(o.text) <= {"a"} and o.finish_reason in ("stop", "length"), o.text


def test_a_schema_nested_too_deeply_is_a_value_error(llm):
    """json.dumps of a schema past Python's recursion limit raised RecursionError, which the
    server's catch-all made a 500 (a body nested ~984 deep: just inside what its JSON parser
    takes); now the ValueError every bad constraint gets, a 400 naming the field."""
    from minillm.engine.structured import compile_grammar

    schema: dict = {}
    for _ in range(1200):
        schema = {"type": "array", "items": schema}
    so = SO(json={"type": "string"})
    so.json = schema  # (SamplingParams' own checks repr it first, and raise RecursionError there)
    with pytest.raises(ValueError, match="nested too deeply"):
        compile_grammar(so)
    with pytest.raises(ValueError, match="nested too deeply"):
        llm.engine.grammars.matcher(so)


def test_an_error_on_the_first_token_leaves_out_the_grammar(llm):
    """A grammar past llguidance's limits on the output's first token (the 100,000 bytes it forces
    after it) is refused where it compiles (a 400 on the server, not a 500 after 0 tokens); its
    error no longer carries the whole grammar and parser state."""
    with pytest.raises(ValueError, match="Too many items") as e:
        llm.engine.grammars.matcher(SO(grammar='start: "a"~100000'))
    err = str(e.value)
    assert "first token" in err and "<grammar>" not in err and "<state>" not in err and len(err) < 400, err


def test_sampling_options_beside_a_constraint(llm):
    """A +100 bias on a banned token, top-k / top-p / min-p, n seeds: the ban wins; a stop string
    inside the constrained text cuts it; a stop token inside it ends it there."""
    tok = llm.engine.tokenizer
    banned = tok.encode("zzz", add_special_tokens=False)[0]
    so = SO(regex="[0-9]{2,6}")
    params = [SamplingParams(temperature=t, seed=s, max_tokens=8, logit_bias={banned: 100.0}, top_k=k, top_p=p,
                             min_p=mp, structured_outputs=so)
              for t, s, k, p, mp in [(0.0, 0, -1, 1.0, 0.0), (1.0, 1, 3, 0.5, 0.0), (1.5, 2, -1, 0.9, 0.2)]]
    for o in llm.generate(["n:"] * len(params), params):
        assert o.text.isdigit() and 2 <= len(o.text) <= 6 and o.finish_reason == "stop", o.text
    o = llm.generate(["x"], SamplingParams(temperature=0, max_tokens=16, stop=["lo w"],
                                           structured_outputs=SO(choice=["hello world"])))[0]
    assert (o.text, o.finish_reason) == ("hel", "stop")
    ids = tok.encode("hello world", add_special_tokens=False)
    o = llm.generate(["x"], SamplingParams(temperature=0, max_tokens=16, stop_token_ids=[ids[1]],
                                           structured_outputs=SO(choice=["hello world"])))[0]
    assert o.token_ids == ids[:2] and o.finish_reason == "stop"
