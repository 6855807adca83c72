"""The MINILLM_* variables: minillm/envvars.py's list is the set of names minillm/ reads, and an
engine started with a misspelt or removed one set says so (by name, with the nearest real name or what
became of it) instead of ignoring it."""

from __future__ import annotations

import logging
import pathlib
import re

from minillm import envvars

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_the_list_is_what_minillm_reads():
    """Every quoted "MINILLM_*" string in minillm/ (what env_int / env_flag / os.environ are given) is
    in READ, and READ holds nothing else, so a new switch cannot be left off the list."""
    found = set()
    for f in (ROOT / "minillm").rglob("*.py"):
        if f.name != "envvars.py":
            found |= set(re.findall(r"[\"'](MINILLM_[A-Z0-9_]+)[\"']", f.read_text()))
    assert found == set(envvars.READ), (sorted(found - envvars.READ), sorted(envvars.READ - found))
    assert not (envvars.READ | envvars.TESTS) & set(envvars.REMOVED)


def test_unknown_and_removed_settings_are_named():
    env = {"MINILLM_GEMV1_STAGE": "2", "MINILLM_GEMV1_STAEG": "1", "MINILLM_GEMV1_RING": "1",
           "MINILLM_STRESS_EXAMPLES": "5", "PATH": "/bin", "MINILLM_ZZZ": "1"}
    got = envvars.unknown_settings(env)
    assert got[0] == "MINILLM_GEMV1_RING is set, but it was removed in session 57 (gemv1_ring_*, measured " \
                     "slower); it changes nothing"
    assert got[1] == ("MINILLM_GEMV1_STAEG is set, but minillm reads no such variable (did you mean "
                      "MINILLM_GEMV1_STAGE?); it changes nothing")
    assert got[2] == "MINILLM_ZZZ is set, but minillm reads no such variable; it changes nothing"
    assert len(got) == 3
    assert envvars.unknown_settings({"MINILLM_PDL": "1", "HOME": "/root"}) == []


def test_an_engine_start_warns_of_them(tiny, monkeypatch, caplog):
    from minillm.llm import LLM

    monkeypatch.setenv("MINILLM_SKINNY2_RING", "1")
    with caplog.at_level(logging.WARNING, logger="minillm"):
        LLM(str(tiny), device="cpu", max_model_len=64, max_num_seqs=1)
    assert any("MINILLM_SKINNY2_RING is set, but it was removed" in r.getMessage() for r in caplog.records)
