"""AEP_NATS_* parsing (supervisor.jetstream.config): off when unset, one
problem line per bad value, credentials never in a problem line or repr."""
from __future__ import annotations

from supervisor.jetstream.config import NatsConfig, file_problems, from_env, redact_url


def test_unset_is_off() -> None:
    assert from_env({}) == (None, [])


def test_defaults() -> None:
    cfg, problems = from_env({"AEP_NATS_URL": "nats://127.0.0.1:4222, nats://b:4223"})
    assert problems == []
    assert cfg is not None
    assert cfg.servers == ("nats://127.0.0.1:4222", "nats://b:4223")
    assert (cfg.stream, cfg.replicas, cfg.outbox) == ("AEP", 1, 10_000)
    assert cfg.max_age == 7 * 86400 and cfg.max_bytes == 1 << 30


def test_bad_values_are_problems_and_never_echo_a_password() -> None:
    cfg, problems = from_env({
        "AEP_NATS_URL": "http://u:hunter2@x:1,nats://ok:4222",
        "AEP_NATS_STREAM": "a.b", "AEP_NATS_REPLICAS": "7",
        "AEP_NATS_TLS_CERT": "/c.pem", "AEP_NATS_CREDS": "relative.creds",
    })
    assert cfg is None
    text = "\n".join(problems)
    assert "hunter2" not in text
    assert "AEP_NATS_URL" in text and "AEP_NATS_STREAM" in text and "AEP_NATS_REPLICAS" in text
    assert "AEP_NATS_TLS_KEY" in text and "AEP_NATS_CREDS" in text
    assert len(problems) == 5


def test_repr_and_shown_servers_hide_credentials() -> None:
    cfg, _ = from_env({"AEP_NATS_URL": "nats://u:hunter2@h:4222"})
    assert cfg is not None
    assert "hunter2" not in repr(cfg)
    assert cfg.shown_servers == ("nats://***@h:4222",)
    assert redact_url("nats://tok@h") == "nats://***@h"
    assert redact_url("nats://h:1") == "nats://h:1"


def test_missing_files_reported(tmp_path) -> None:
    cfg = NatsConfig(servers=("nats://h:1",), creds=tmp_path / "none.creds")
    assert file_problems(cfg) == [f"AEP_NATS_CREDS={str(tmp_path / 'none.creds')!r}: not a readable file"]


def test_malformed_urls_are_problems_not_crashes() -> None:
    for url in ("nats://[::1", "nats://alice:S3cretPW@127.0.0.1:99999", "nats://h:0"):
        cfg, problems = from_env({"AEP_NATS_URL": url})
        assert cfg is None and len(problems) == 1 and "AEP_NATS_URL" in problems[0]
        assert "S3cretPW" not in problems[0]


def test_a_password_with_unencoded_delimiters_is_never_shown() -> None:
    for pw in ("S3cret/PW", "S3cret#PW", "S3cret?PW", "a@b"):
        url = f"nats://alice:{pw}@h:4222"
        assert redact_url(url) == "nats://***@h:4222"
        _, problems = from_env({"AEP_NATS_URL": url})
        assert all(pw not in p and "alice" not in p for p in problems)


def test_the_duplicate_window_problem_names_its_limit_the_max_age() -> None:
    """The window's one limit is AEP_NATS_MAX_AGE (JetStream refuses a
    longer window); the line said "expected seconds > 0" for a positive
    value over an unrelated 86400 cap, and a window over a short max age
    was cut silently."""
    url = {"AEP_NATS_URL": "nats://h:4222"}
    cfg, problems = from_env({**url, "AEP_NATS_DUPLICATE_WINDOW": "100000"})
    assert problems == [] and cfg is not None and cfg.duplicate_window == 100000.0  # < 7 days
    cfg, problems = from_env({**url, "AEP_NATS_DUPLICATE_WINDOW": "900",
                              "AEP_NATS_MAX_AGE": "600"})
    assert cfg is None
    assert problems == ["AEP_NATS_DUPLICATE_WINDOW='900': expected at most AEP_NATS_MAX_AGE "
                        "(600 s: the stream cannot remember an id longer than it keeps the "
                        "event; default 300)"]
    cfg, problems = from_env({**url, "AEP_NATS_DUPLICATE_WINDOW": "2000000"})
    assert problems == ["AEP_NATS_DUPLICATE_WINDOW='2000000': expected at most "
                        "AEP_NATS_MAX_AGE (604800 s: the stream cannot remember an id longer "
                        "than it keeps the event; default 300)"]
    for bad in ("0", "-5", "soon", "nan"):
        _, problems = from_env({**url, "AEP_NATS_DUPLICATE_WINDOW": bad})
        assert problems == [f"AEP_NATS_DUPLICATE_WINDOW={bad!r}: expected seconds > 0 "
                            "(default 300)"]
    # unset: the default, cut to a shorter max age without a problem
    cfg, problems = from_env({**url, "AEP_NATS_MAX_AGE": "60"})
    assert problems == [] and cfg is not None and cfg.duplicate_window == 60.0
    cfg, problems = from_env({**url, "AEP_NATS_DUPLICATE_WINDOW": "45", "AEP_NATS_MAX_AGE": "60"})
    assert problems == [] and cfg is not None and cfg.duplicate_window == 45.0
