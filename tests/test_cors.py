"""CORS (vLLM's --allowed-origins and its companions) through a real server: a browser page on an
allowed origin gets its preflight answered (without the API key, which a preflight never carries)
and the CORS headers on every response, streamed, errors included; other origins, and a server
without the flag, get none."""

from __future__ import annotations

import httpx
import pytest
from test_server import Server, serve_cli

UI = "http://ui.example"


@pytest.fixture(scope="module")
def cors_server(byte_llama, tmp_path_factory):
    srv = Server(byte_llama, tmp_path_factory.mktemp("cors") / "server.log", "--api-key", "k",
                 "--served-model-name", "m", "--allowed-origins", f'["{UI}"]')
    yield srv
    assert srv.stop() == 0, srv.text()


def test_preflight_is_answered_without_the_key(cors_server):
    r = httpx.options(f"{cors_server.url}/v1/chat/completions", headers={
        "Origin": UI, "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization, content-type"})
    assert r.status_code == 200, r.text
    assert r.headers["access-control-allow-origin"] == UI
    assert r.headers["access-control-allow-methods"] == "*"  # --allowed-methods' default ["*"]: any
    assert {h.strip() for h in r.headers["access-control-allow-headers"].lower().split(",")} >= {
        "authorization", "content-type"}


def test_responses_carry_the_headers_streamed_and_errors_too(cors_server):
    auth = {"Origin": UI, "Authorization": "Bearer k"}
    body = {"model": "m", "prompt": "hi", "max_tokens": 4}
    r = httpx.post(f"{cors_server.url}/v1/completions", json=body, headers=auth)
    assert r.status_code == 200 and r.headers["access-control-allow-origin"] == UI
    assert "access-control-expose-headers" not in r.headers  # none to expose (quart_cors wrote '""')
    with httpx.stream("POST", f"{cors_server.url}/v1/completions", json={**body, "stream": True}, headers=auth) as s:
        assert s.status_code == 200 and s.headers["access-control-allow-origin"] == UI
        assert "data: [DONE]" in "".join(s.iter_text())
    # the page can read why it failed: no key, and a bad body
    r = httpx.post(f"{cors_server.url}/v1/completions", json=body, headers={"Origin": UI})
    assert r.status_code == 401 and r.headers["access-control-allow-origin"] == UI
    r = httpx.post(f"{cors_server.url}/v1/completions", json={"prompt": 5}, headers=auth)
    assert r.status_code == 400 and r.headers["access-control-allow-origin"] == UI


def test_other_origins_get_no_headers(cors_server):
    r = httpx.post(f"{cors_server.url}/v1/completions", json={"model": "m", "prompt": "hi", "max_tokens": 2},
                   headers={"Origin": "http://evil.example", "Authorization": "Bearer k"})
    assert r.status_code == 200 and "access-control-allow-origin" not in r.headers
    r = httpx.options(f"{cors_server.url}/v1/completions", headers={
        "Origin": "http://evil.example", "Access-Control-Request-Method": "POST"})
    assert "access-control-allow-origin" not in r.headers


def test_no_cors_without_the_flag(byte_llama, tmp_path):
    srv = Server(byte_llama, tmp_path / "server.log", "--served-model-name", "m")
    try:
        r = httpx.post(f"{srv.url}/v1/completions", json={"model": "m", "prompt": "hi", "max_tokens": 2},
                       headers={"Origin": UI})
        assert r.status_code == 200 and "access-control-allow-origin" not in r.headers
    finally:
        assert srv.stop() == 0, srv.text()


@pytest.mark.parametrize("flags,message", [
    (["--allowed-origins", '["*"]', "--allow-credentials"], "browsers refuse credentials with the wildcard"),
    (["--allow-credentials"], "--allow-credentials needs --allowed-origins"),
    (["--allowed-origins", "http://ui.example"], "--allowed-origins takes a JSON list of strings"),
    (["--allowed-origins", "[]"], "--allowed-origins takes a JSON list of strings"),
    (["--allowed-headers", '[1]'], "--allowed-headers takes a JSON list of strings"),
])
def test_bad_cors_flags_are_refused(flags, message):
    r = serve_cli(*flags)
    assert r.returncode == 2 and message in r.stderr, r.stderr
