"""python -m minillm.generate: one run per prompt from the command line (in-process here)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from minillm.generate import main

ROOT = Path(__file__).resolve().parents[1]


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


def test_json_with_prompt_logprobs(tiny, capsys):
    """--prompt-logprobs N: each prompt token's logprob, rank and N best (null first), as
    log_softmax of the engine's scored logits gives them, beside the prompt's ids."""
    from minillm.engine.engine import LLMEngine

    rc = main([str(tiny), "--device", "cpu", "--max-model-len", "128", "--prompt", "hello there", "--prompt", "a",
               "--max-tokens", "2", "--ignore-eos", "--json", "--prompt-logprobs", "3"])
    assert rc == 0
    recs = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert len(recs) == 2 and len(recs[1]["prompt_token_ids"]) == 1 and recs[1]["prompt_logprobs"] == [None]
    eng = LLMEngine(model=str(tiny), device="cpu", max_model_len=128)
    for r in recs:
        ids, plps = r["prompt_token_ids"], r["prompt_logprobs"]
        assert len(plps) == len(ids) and plps[0] is None and len(r["token_ids"]) == 2 and "logprobs" not in r
        x = eng.score([ids])[0].astype(np.float64)
        want = x - x.max(-1, keepdims=True)
        want -= np.log(np.exp(want).sum(-1, keepdims=True))
        for t, lp in enumerate(plps[1:], start=1):
            row = want[t - 1]
            assert lp["token_id"] == ids[t] and abs(lp["logprob"] - row[ids[t]]) < 1e-4
            v = row[ids[t]]  # its rank, tolerant of float32 near-ties between the chunked run and score's
            assert np.count_nonzero(row > v + 1e-5) < lp["rank"] <= np.count_nonzero(row >= v - 1e-5)
            assert [i for i, _ in lp["top"]] == np.argsort(-row, kind="stable")[:3].tolist()


def test_min_p_one_is_greedy(tiny, capsys):
    """--min-p 1 keeps only the top token: a hot run prints the greedy run's ids."""
    args = [str(tiny), "--device", "cpu", "--max-model-len", "128", "--prompt", "hello", "--max-tokens", "6",
            "--ignore-eos", "--json"]
    assert main(args) == 0
    greedy = json.loads(capsys.readouterr().out)["token_ids"]
    assert main([*args, "--temperature", "1.5", "--min-p", "1"]) == 0
    assert json.loads(capsys.readouterr().out)["token_ids"] == greedy


def test_bad_values_are_one_line_errors(tiny, capsys):
    for flag, value in (("--logprobs", "21"), ("--prompt-logprobs", "21"), ("--prompt-logprobs", "-1"),
                        ("--repetition-penalty", "0"), ("--frequency-penalty", "9"), ("--min-p", "1.5")):
        rc = main([str(tiny), "--device", "cpu", "--prompt", "x", "--json", flag, value])
        err = capsys.readouterr().err
        assert rc == 2 and err.startswith("error: ") and flag[2:].replace("-", "_") in err


def test_refusals_name_the_problem(tiny, capsys):
    assert main([str(tiny), "--device", "cpu", "--prompt", "hi", "--logprobs", "2"]) == 2
    assert "add --json" in capsys.readouterr().err  # the text output has no place for logprobs
    assert main([str(tiny), "--device", "cpu", "--max-model-len", "128", "--prompt", "hi", "--prompt", ""]) == 2
    assert "error: prompt 1: the prompt is empty" in capsys.readouterr().err  # which of the prompts


def _with_template(tiny, tmp_path, template: str):
    """A copy of `tiny` whose tokenizer_config.json has this chat template."""
    import shutil

    model = tmp_path / "model"
    shutil.copytree(tiny, model)
    cfg = json.loads((model / "tokenizer_config.json").read_text())
    cfg["chat_template"] = template
    (model / "tokenizer_config.json").write_text(json.dumps(cfg))
    return model


def test_a_chat_template_that_refuses_is_one_line_error(tiny, tmp_path, capsys):
    """A template's raise_exception (a jinja2 TemplateError) or a TypeError inside it: one line, no traceback."""
    for template, why in (("{{ raise_exception('a system message is required') }}", "a system message is required"),
                          ("{{ messages[0].content + 1 }}", "TypeError")):
        model = _with_template(tiny, tmp_path / why.replace(" ", "_"), template)
        rc = main([str(model), "--device", "cpu", "--max-model-len", "128", "--prompt", "hi", "--chat"])
        err = capsys.readouterr().err
        assert rc == 2 and err.startswith("error: the model's chat template refused the prompt") and why in err
        assert "drop --chat" in err and err.count("\n") == 1
    rc = main([str(model), "--device", "cpu", "--max-model-len", "128", "--prompt", "hi", "--prompt", "a\udcffb",
               "--chat"])
    assert rc == 2 and capsys.readouterr().err.startswith("error: prompt 0: the model's chat template refused")


def _cli(*args: str, **kw) -> subprocess.Popen:
    # SIGINT's default action in the child: a test run started in the background of a non-interactive
    # shell (as CI may be) inherits SIGINT ignored, and Python then never raises KeyboardInterrupt
    return subprocess.Popen([sys.executable, "-m", "minillm.generate", *args], cwd=ROOT, stdin=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL), **kw)


def test_a_closed_stdout_stops_quietly(tiny):
    """| head that has read enough: exit as cat does (141), without a BrokenPipeError traceback."""
    r, w = os.pipe()
    os.close(r)  # nobody reads: the first write fails with EPIPE
    p = _cli(str(tiny), "--device", "cpu", "--max-model-len", "128", "--prompt", "hi", "--max-tokens", "2",
             stdout=w)
    os.close(w)
    _, err = p.communicate(timeout=120)
    assert p.returncode == 141 and err == ""


def test_text_the_terminal_cannot_encode_is_replaced(tiny):
    """An ASCII-only stdout gets '?' for the U+FFFD in this output, not a UnicodeEncodeError."""
    p = _cli(str(tiny), "--device", "cpu", "--max-model-len", "128", "--prompt", "hello", "--max-tokens", "4",
             "--ignore-eos", stdout=subprocess.PIPE, env={**os.environ, "PYTHONIOENCODING": "ascii"})
    out, err = p.communicate(timeout=120)
    assert p.returncode == 0 and "Traceback" not in err and "?" in out, (out, err)


def test_ctrl_c_stops_quietly(tiny):
    """SIGINT mid-generation: exit 130 without a KeyboardInterrupt traceback."""
    p = _cli(str(tiny), "--device", "cpu", *("--prompt", "hello") * 16, "--max-tokens", "4000", "--ignore-eos",
             stdout=subprocess.PIPE)
    time.sleep(3)  # past the imports and the load (about a second), well before the end (many seconds)
    assert p.poll() is None
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=60)
    assert p.returncode == 130 and err == "" and out == ""


def test_chat_without_a_template_names_the_fix(tiny, tmp_path, capsys):
    """--chat on a model with no chat template names the two ways out (it said "use a plain completion
    prompt", naming neither --chat nor --chat-template)."""
    import shutil

    model = tmp_path / "model"
    shutil.copytree(tiny, model)
    cfg = json.loads((model / "tokenizer_config.json").read_text())
    del cfg["chat_template"]
    (model / "tokenizer_config.json").write_text(json.dumps(cfg))
    assert main([str(model), "--device", "cpu", "--max-model-len", "128", "--prompt", "hi", "--chat"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --chat: ") and "--chat-template FILE" in err and "drop --chat" in err, err


def test_prompt_bytes_that_are_not_utf8_are_replaced(tiny, capsys):
    """--prompt from argv with a byte that is not UTF-8 (a lone surrogate, as Python decodes argv) is
    sent with U+FFFD, as the chat does; it was refused as "a lone surrogate '\\udcff' at character N",
    N counted in the templated text under --chat."""
    for chat in ([], ["--chat"]):
        args = [str(tiny), "--device", "cpu", "--max-model-len", "128", "--max-tokens", "3", "--ignore-eos",
                "--json", *chat, "--prompt"]
        assert main([*args, "a\ufffdb"]) == 0
        want = json.loads(capsys.readouterr().out)["token_ids"]
        assert main([*args, "a\udcffb"]) == 0
        out, err = capsys.readouterr()
        assert json.loads(out)["token_ids"] == want and "--prompt had bytes that are not UTF-8" in err


def test_n_samples_print_prompt_by_prompt(tiny, capsys):
    """--n N: each prompt's N samples, one JSON line each with its index; sample i is the one --request-seed
    S + i gives alone."""
    base = [str(tiny), "--device", "cpu", "--max-model-len", "128", "--max-tokens", "4", "--ignore-eos",
            "--temperature", "1.0", "--json"]
    assert main([*base, "--prompt", "hello", "--prompt", "a b", "--n", "2", "--request-seed", "7"]) == 0
    recs = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["index"] for r in recs] == [0, 1, 0, 1]
    for i, prompt in enumerate(["hello", "a b"]):
        for k in range(2):
            assert main([*base, "--prompt", prompt, "--request-seed", str(7 + k)]) == 0
            alone = json.loads(capsys.readouterr().out)
            assert "index" not in alone and alone["token_ids"] == recs[2 * i + k]["token_ids"]
    assert main([*base, "--prompt", "hello", "--n", "0"]) == 2
    assert "n must be an integer in [1, 1024]" in capsys.readouterr().err
