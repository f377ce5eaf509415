"""AEP-0003 §9.4 redaction pipeline: the adversarial corpus
``conformance/fixtures/redaction/cases.json`` (every case, read from shared/
at test time), the order of the rules, hardening beyond the corpus, and
properties (never raises, idempotent, never grows a secret back)."""
from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bridges.core import capture, redaction
from bridges.core.capture import CapturePolicy
from tests.support.shared import fixture

CASES = fixture("redaction/cases.json")


def _policy(opts: dict) -> CapturePolicy:
    # The corpus' option names are the reference implementation's (JS).
    return CapturePolicy(secret_values=tuple(opts.get("secretValues", ())),
                         home=opts.get("home"), pii=opts.get("pii", True))


def _check(out: str, case: dict) -> None:
    for s in case.get("must_not_contain", ()):
        assert s not in out, f"{case['name']}: leaked {s!r} in {out!r}"
    for s in case.get("must_contain", ()):
        assert s in out, f"{case['name']}: lost {s!r} in {out!r}"


@pytest.mark.parametrize("case", CASES["text_cases"], ids=lambda c: c["name"])
def test_text_case(case):
    out = capture.redact_text(case["input"], _policy(case.get("opts", {})))
    _check(out, case)


@pytest.mark.parametrize("case", CASES["value_cases"], ids=lambda c: c["name"])
def test_value_case(case):
    original = json.dumps(case["input"])
    out = capture.redact_value(case["input"], _policy(case.get("opts", {})))
    _check(json.dumps(out, ensure_ascii=False), case)
    assert json.dumps(case["input"]) == original, "redact_value mutated its input"


def test_corpus_is_not_empty():
    # A renamed key in the fixture must not silently turn the corpus off.
    assert len(CASES["text_cases"]) >= 28 and len(CASES["value_cases"]) >= 5


# ---------------------------------------------------------------- order and floor


def test_rules_apply_in_order_secret_before_pii():
    # (a) before (d): the credential value is a secret, not an email.
    assert capture.redact_text("password=foo@bar.com") == "password=[REDACTED:secret]"


def test_configured_value_containing_a_secret_shape_never_leaks_a_remainder():
    # Rule (a) alone would cut the AKIA part first and leave "hunter-" and
    # "-tail" behind for (b) to miss; (b) also runs first.
    value = "hunter-AKIAIOSFODNN7EXAMPLE-tail"
    out = capture.redact_text(f"using {value} now", CapturePolicy(secret_values=(value,)))
    assert out == "using [REDACTED:secret] now"


def test_home_prefix_only_at_a_path_boundary():
    p = CapturePolicy(home="/tmp/h", pii=False)
    assert capture.redact_text("/tmp/h/x and /tmp/hello", p) == "~/x and /tmp/hello"
    assert capture.redact_text("/mnt/tmp/h/x", p) == "/mnt/tmp/h/x"


def test_root_home_is_ignored():
    # HOME=/ would otherwise rewrite every absolute path.
    p = CapturePolicy(home="/")
    assert p.home is None
    assert capture.redact_text("/etc/passwd", p) == "/etc/passwd"


def test_pii_rule_can_be_disabled_but_secrets_cannot():
    p = CapturePolicy(pii=False)
    out = capture.redact_text("ops@example.com token=abc123", p)
    assert "ops@example.com" in out and "abc123" not in out


def test_short_configured_values_are_not_used():
    p = CapturePolicy(secret_values=("a", "xyz", "long-enough"))
    assert p.secret_values == ("long-enough",)


@pytest.mark.parametrize("text, leaked", [
    ("curl https://bob:s3cretpw@example.test/x", "s3cretpw"),
    ("mytool --password hunter2 --verbose", "hunter2"),
    ("mytool --api-key abcd1234", "abcd1234"),
    ("Authorization: Basic dXNlcjpwYXNz", "dXNlcjpwYXNz"),
    ("aws ASIAIOSFODNN7EXAMPLE", "ASIAIOSFODNN7EXAMPLE"),
    ("stripe sk_live_4eC39HqLyjWDarjtT1zdp7dc", "4eC39HqLyjWDarjtT1zdp7dc"),
    ('{\\"token\\": \\"t0k3n-in-json-string\\"}', "t0k3n-in-json-string"),
    ("-----BEGIN PRIVATE KEY-----\nMIIEvQIBADANBg truncated", "MIIEvQIBADANBg"),
    ("GITHUB_TOKEN=plainvalue", "plainvalue"),
    ("C:\\Users\\carol\\secrets.txt", "carol"),
    ("call 555-123-4567 now", "555-123-4567"),
    ("ring +44 20 7946 0958", "7946 0958"),
])
def test_hardening_beyond_the_corpus(text, leaked):
    assert leaked not in capture.redact_text(text)


@pytest.mark.parametrize("text", [
    "max_tokens: 4096 and input_tokens=12",
    "listening on 127.0.0.1:8787, pid 4242",
    "commit 1d959a0 at 2026-08-13T10:00:00Z, ulid 01JX9YB3P4T9",
    "the secretary read the token list",
    "sha256 a3f9c2d1e8b7a6f5a3f9c2d1e8b7a6f5",
])
def test_structural_text_is_not_over_redacted(text):
    assert capture.redact_text(text) == text


# ---------------------------------------------------------------- properties

_text = st.text(alphabet=st.characters(codec="utf-8"), max_size=200)
_secretish = st.sampled_from([
    "token=", "password: ", "Bearer ", "bearer ", "AKIA", "ghp_", "eyJ", "/home/", "/Users/",
    "@", "+1 ", "(555) ", "-----BEGIN RSA PRIVATE KEY-----\n", "-----END RSA PRIVATE KEY-----",
    "sk-", "\"api_key\": \"", "://u:", "~", "[REDACTED:secret]", " ", "\n", ".", "-", "0123456789",
    "abcdefghijklmnopqrstuvwxyz", "ABCDEFGHIJKLMNOP",
])
_adversarial = st.lists(st.one_of(_secretish, _text), max_size=12).map("".join)


@settings(max_examples=400, deadline=None)
@given(text=_adversarial, home=st.sampled_from([None, "/home/operator", "/"]),
       pii=st.booleans())
def test_redact_text_never_raises_and_is_idempotent(text, home, pii):
    p = CapturePolicy(home=home, pii=pii, secret_values=("s3cr3t-value",))
    once = capture.redact_text(text, p)
    assert isinstance(once, str)
    assert capture.redact_text(once, p) == once
    assert "s3cr3t-value" not in once


@settings(max_examples=200, deadline=None)
@given(secret=st.text(alphabet="abcdefXYZ0123456789-_", min_size=8, max_size=30),
       before=_text, after=_text)
def test_configured_secret_never_survives(secret, before, after):
    p = CapturePolicy(secret_values=(secret,))
    assert secret not in capture.redact_text(before + " " + secret + " " + after, p)


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | _adversarial,
    lambda c: st.lists(c, max_size=4) | st.dictionaries(
        st.one_of(st.sampled_from(["token", "API_KEY", "region", "Password", "authorization"]),
                  st.text(max_size=8)), c, max_size=4),
    max_leaves=20)


@settings(max_examples=200, deadline=None)
@given(value=_json)
def test_redact_value_never_raises_keeps_shape_and_is_idempotent(value):
    once = capture.redact_value(value)
    assert type(once) is type(value) or (isinstance(value, tuple) and isinstance(once, list))
    assert capture.redact_value(once) == once
    if isinstance(value, dict):
        assert once.keys() == value.keys()


@pytest.mark.timeout(120)
def test_pipeline_is_linear_on_long_runs():
    # Guards the (?<!...) run-start anchors: without them these inputs are
    # quadratic in the regex engine (minutes); a generous timeout, not a
    # timing assertion.
    big = "a_" * 50_000 + " " + "x." * 50_000 + " " + "--a-" * 20_000 + " +" + "1" * 5000
    out = redaction.redact_text(big)
    assert out.startswith("a_a_")
