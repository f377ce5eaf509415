"""Secrets never reach the log, whatever the call site wrote."""
import io
import json
import logging

from supervisor.tools import logs


def _capture(environ, emit):
    buf = io.StringIO()
    logs.setup({**environ, "AEP_LOG_FORMAT": "json"}, stream=buf)
    emit(logging.getLogger("t"))
    return [json.loads(line) for line in buf.getvalue().splitlines()]


def test_secret_env_values_query_tokens_and_auth_headers_are_scrubbed():
    env = {"AEP_TOKEN": "tok-123456", "AEP_OPENCODE_PASSWORD": "hunter22",
           "AEP_OPENHANDS_SESSION_API_KEY": "sk-oh-key", "AEP_LISTEN": "127.0.0.1:1"}
    lines = _capture(env, lambda log: [
        log.info("GET /stream?filter=%%7B%%7D&access_token=%s HTTP/1.1", "qs-secret-1"),
        log.info("password for %s is %s", "u", "hunter22"),
        log.warning("header Authorization: Bearer abc.def.ghi and key sk-oh-key"),
        log.error("uplink to ws://r/socket?token=tok-123456 failed"),
        log.info("listening on 127.0.0.1:1", extra={"aep_peer": "Basic dXNlcjpwYXNz"}),
    ])
    text = json.dumps(lines)
    for secret in ("qs-secret-1", "hunter22", "abc.def.ghi", "sk-oh-key", "tok-123456",
                   "dXNlcjpwYXNz"):
        assert secret not in text
    assert lines[0]["msg"].endswith("access_token=[REDACTED] HTTP/1.1")
    assert "127.0.0.1:1" in lines[4]["msg"]  # non-secret settings stay readable
    assert {"ts", "level", "logger", "msg"} <= set(lines[0])


def test_text_format_when_requested():
    buf = io.StringIO()
    logs.setup({"AEP_LOG_FORMAT": "text", "AEP_TOKEN": "tok-abcdef"}, stream=buf)
    logging.getLogger("t").warning("token tok-abcdef")
    out = buf.getvalue()
    assert "WARNING" in out and "tok-abcdef" not in out and not out.startswith("{")


def test_the_userinfo_of_any_url_is_scrubbed():
    """Issue 25 row 10: "agui proxy listening on ... -> http://user:password@..."."""
    line = logs.scrub("up -> http://agent:hunter2pw@127.0.0.1:8000/p, nats://a:b@h:4222 "
                      "(mailto:x@y.example, http://h/p@q and user@host stay)")
    assert "hunter2pw" not in line and "a:b@" not in line
    assert "http://[REDACTED]@127.0.0.1:8000/p" in line and "nats://[REDACTED]@h:4222" in line
    assert "mailto:x@y.example" in line and "http://h/p@q" in line and "user@host" in line
