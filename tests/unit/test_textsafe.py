"""``textsafe``: control characters of outside text escaped (one line, nothing a terminal obeys), JSON for a
terminal that parses back to the same value, and secrets masked in URLs (issue 21, findings 4 and 5)."""

from __future__ import annotations

import json
import re

from hypothesis import given
from hypothesis import strategies as st

import pytest

from feiqiu_etl.textsafe import escape, escape_tree, redact_url, terminal_json, url_secrets

ISSUE_PAYLOAD = "\x1b[2J\x1b]0;pwned-title\x07…\n2026-12-01 00:00:00 ERROR [default 1 ODS_FAKE] forged line"
OBEYED = re.compile("[\x00-\x08\x0a-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


def test_the_issues_payload_becomes_one_visible_line():
    assert escape(ISSUE_PAYLOAD) == ("\\x1b[2J\\x1b]0;pwned-title\\x07…\\n2026-12-01 00:00:00 ERROR "
                                     "[default 1 ODS_FAKE] forged line")
    assert escape("tab\tkept, 中文 kept, \r\n, \x9b6n, \u202egnp.exe, \u2028") == \
        "tab\tkept, 中文 kept, \\r\\n, \\x9b6n, \\u202egnp.exe, \\u2028"
    assert escape(42) == "42" and escape("plain") == "plain"
    assert escape_tree({"k\n": ["\x1b", ("\x07", 1)], "n": None}) == {"k\\n": ["\\x1b", ("\\x07", 1)], "n": None}


@given(st.text())
def test_escaped_text_holds_nothing_a_terminal_obeys_and_is_idempotent(text):
    shown = escape(text)
    assert not OBEYED.search(shown) and "\n" not in shown
    assert escape(shown) == shown


@given(st.recursive(st.none() | st.booleans() | st.integers() | st.text(),
                    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
                    max_leaves=12))
def test_terminal_json_parses_back_to_the_same_value_and_shows_no_control(value):
    text = terminal_json(value)
    assert json.loads(text) == value
    assert not OBEYED.search(text)


def test_urls_keep_what_is_harmless_and_mask_secrets():
    cases = {
        "http://u:p@host/?token=qsecret": "http://u:***@host/?token=***",
        "https://open.feiqiu.example": "https://open.feiqiu.example",
        "https://h/x?a=1&access_token=t&API_KEY=k;sign=s&signature=z&password=p&passwd=q&pwd=r&auth=a&b=2":
            "https://h/x?a=1&access_token=***&API_KEY=***;sign=***&signature=***&password=***&passwd=***&pwd=***"
            "&auth=***&b=2",
        "https://h/cb#access_token=abc&x=1": "https://h/cb",
        "https://h/page#section": "https://h/page#section",
        "http://h/?mail=a@b.example": "http://h/?mail=a@b.example",
        "http://user@h:8080/p": "http://user@h:8080/p",
        "postgresql://etl:p@ss/w@db:5432/w?sslmode=require&sslpassword=x": "postgresql://etl:***@db:5432/w?"
                                                                           "sslmode=require&sslpassword=***",
        "http://h/?client%5Fsecret=z": "http://h/?client%5Fsecret=***",
        "host-only": "host-only",
    }
    for url, shown in cases.items():
        assert redact_url(url) == shown, url
    assert "s3cr3t" not in redact_url("u:s3cr3t@host") and "s3cr3t" not in redact_url("host?token=s3cr3t")
    assert url_secrets("http://u:p%40ss@h/?token=a%2Fb") == {"p%40ss", "p@ss", "a%2Fb", "a/b"}


SECRET = st.text(st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=20).map(lambda s: "S3CR3T" + s)


@given(SECRET, SECRET, st.sampled_from(["token", "access_token", "apiKey", "x-signature", "Password", "authCode"]))
def test_no_secret_survives_in_userinfo_or_a_secret_parameter(password, value, name):
    from urllib.parse import quote

    for pw in (password, quote(password, safe="")):
        for val in (quote(value, safe=""),):
            url = f"https://user:{pw}@api.example:8443/v1/list?page=2&{name}={val}&size=10"
            shown = redact_url(url)
            assert "S3CR3T" not in shown, (url, shown)
            assert shown.startswith("https://user:***@") and shown.endswith(f"&{name}=***&size=10"), shown


CREDENTIAL_PARAMS = ["sig", "signature", "key", "secret", "password", "token", "access_token", "refresh_token",
                     "api_key", "apikey", "client_secret", "X-Amz-Signature", "auth", "passwd", "sign", "hmac"]


@pytest.mark.parametrize("name", CREDENTIAL_PARAMS)
def test_every_credential_like_parameter_is_masked_by_the_one_redaction_rule(name):
    """Issue 28 item 5: ``config show`` printed ``sig=SIGVAL99`` from an API base while it masked ``token=``."""
    from feiqiu_etl.pipeline.unified_pipeline import safe_params
    from feiqiu_etl.registry import redact_args
    from feiqiu_etl.textsafe import is_secret_name, redact_mapping

    value = "SIGVAL99secret"
    url = f"https://api.example.com/v1?site=12&{name}={value}&page=3"
    shown = redact_url(url)
    assert value not in shown and f"{name}=***" in shown and "site=12" in shown and "page=3" in shown, shown
    assert value in url_secrets(url)
    assert is_secret_name(name) and redact_mapping({name: value, "site": 12}) == {name: "***", "site": 12}
    assert safe_params({name: value, "page": 1}) == {name: "***", "page": 1}  # the request records
    stored = redact_args({"api_base": url, "other_url": url, name: value})  # the run record's args
    assert value not in repr(stored), stored


@pytest.mark.parametrize("url, secrets", [
    ("tgram://123456789:AAHdqTcvCH1vGWJxfSeofSAs0K5PALDsaw/-1001234567", ["123456789", "AAHdqTcvCH1vGWJxfSeofSAs0K5PALDsaw"]),
    ("feishu://abcdefSECRETKEY", ["abcdefSECRETKEY", "abc", "KEY"]),
    ("json://hookuser:hookpass@127.0.0.1:9000/path/SECRETPATH?token=qq1234&sig=ss5678",
     ["hookuser", "hookpass", "SECRETPATH", "qq1234", "ss5678"]),
    ("mailto://mailuser:mailpass@smtp.example.com?to=a@x.com,b@y.com", ["mailuser", "mailpass"]),
    ("discord://webhook_id_999/webhook_token_888", ["webhook_id_999", "webhook_token_888"]),
])
def test_an_alert_urls_userinfo_path_and_host_key_are_not_shown_at_all(url, secrets):
    from feiqiu_etl.alerts.sending import redact

    shown = redact(url)
    for secret in secrets:
        assert secret not in shown, (shown, secret)
    assert shown.startswith(url.split("://")[0] + "://"), shown
    if url.startswith(("tgram", "feishu", "discord")):  # the host is a key: not even its first and last character
        assert shown.split("://", 1)[1].split("/")[0] == "***", shown
