"""The web page's access rules that need no server: which binds need a token, Host parsing, CSRF tokens
per session, sessions that expire or are dropped, and where a login may send the browser."""

from __future__ import annotations

from feiqiu_etl.web.params import safe_next as _safe_next
from feiqiu_etl.web.security import Security, host_of, needs_token


def test_only_127_0_0_1_ipv6_loopback_and_localhost_go_without_a_token():
    assert [h for h in ("127.0.0.1", "::1", "[::1]", "localhost", "LOCALHOST") if needs_token(h)] == []
    assert all(needs_token(h) for h in ("127.0.0.2", "0.0.0.0", "::", "192.168.1.5", "example.org"))


def test_host_header_parsing_and_the_loopback_check():
    assert [host_of(h) for h in ("127.0.0.1:8080", "[::1]:80", "Example.ORG", "::1")] == \
        ["127.0.0.1", "::1", "example.org", "::1"]
    open_server = Security(None)
    assert open_server.host_allowed("localhost:1") and open_server.host_allowed("127.9.9.9:80")
    assert not open_server.host_allowed("evil.example:8080") and not open_server.host_allowed("")
    assert Security("t" * 20, "0.0.0.0").host_allowed("anything.example")  # the token protects it


def test_csrf_tokens_belong_to_their_session_and_sessions_end():
    sec = Security("t" * 20)
    assert sec.login("wrong") is None and sec.login("") is None
    a, b = sec.login("t" * 20), sec.login("t" * 20)
    assert a and b and a != b and sec.session_valid(a)
    assert sec.csrf_ok(a, sec.csrf_token(a)) and not sec.csrf_ok(a, sec.csrf_token(b))
    assert not sec.csrf_ok(a, "") and not sec.csrf_ok(a, None)
    assert Security("t" * 20).csrf_token(a) != sec.csrf_token(a)  # a secret of its own per server process
    sec.logout(a)
    assert not sec.session_valid(a) and sec.session_valid(b)
    sec._sessions[b] = 0.0  # expired
    assert not sec.session_valid(b)
    assert sec.statistics().logins == 2 and sec.statistics().failed_logins == 2


def test_a_login_only_ever_sends_the_browser_to_a_local_path():
    assert _safe_next("/live") == "/live" and _safe_next("/?status=FAILED") == "/?status=FAILED"
    assert {_safe_next(v) for v in ("//evil.example", "https://evil.example/", "/\\evil", "", None,
                                    "javascript:alert(1)", "/x://y")} == {"/"}
