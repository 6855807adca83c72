"""python -m minillm.generate: one run per prompt from the command line (in-process here)."""

from __future__ import annotations

import json

from minillm.generate import main


def test_json_with_logprobs_and_penalties(tiny, capsys):
    rc = main([str(tiny), "--device", "cpu", "--max-model-len", "128", "--prompt", "hello", "--prompt", "a b c",
               "--max-tokens", "5", "--ignore-eos", "--json", "--logprobs", "2", "--presence-penalty", "1.0"])
    assert rc == 0
    recs = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert len(recs) == 2
    for r in recs:
        assert r["finish_reason"] == "length" and len(r["token_ids"]) == 5
        assert [lp["token_id"] for lp in r["logprobs"]] == r["token_ids"]
        assert all(len(lp["top"]) == 2 and lp["logprob"] <= 0 for lp in r["logprobs"])


def test_bad_values_are_one_line_errors(tiny, capsys):
    for flag, value in (("--logprobs", "21"), ("--repetition-penalty", "0"), ("--frequency-penalty", "9")):
        rc = main([str(tiny), "--device", "cpu", "--prompt", "x", flag, value])
        err = capsys.readouterr().err
        assert rc == 2 and err.startswith("error: ") and flag[2:].replace("-", "_") in err
