"""``aep-bridges tail``'s pure parts: the one-line gist of every event the
mapping fixtures pin (read from ``shared/``), the aligned columns, pending
attention, the ``--filter`` parser; fuzzed so garbage never raises."""
from __future__ import annotations

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from supervisor.tools.tail import (
    AGENT_W,
    SESSION_W,
    TIME_W,
    TYPE_W,
    Timeline,
    default_url,
    gist,
    parse_filter,
)
from tests.support.shared import aep_dir, fixture, pin_entries


def pinned_emissions() -> list[dict]:
    """Every ``expected`` emission of every mapping fixture in shared/."""
    out = []
    for f in sorted((aep_dir() / "conformance" / "fixtures" / "mappings").glob("*.json")):
        for _, pin in pin_entries(fixture(f"mappings/{f.name}")):
            exp = pin.get("expected")
            for e in exp if isinstance(exp, list) else [exp]:
                if isinstance(e, dict) and isinstance(e.get("type"), str):
                    out.append(e)
    return out


PINNED = pinned_emissions()


def test_the_fixtures_give_us_material():
    kinds = {e["type"] for e in PINNED}
    assert {"tool.completed", "attention.requested", "run.finished"} <= kinds, sorted(kinds)


@pytest.mark.parametrize("ev", PINNED, ids=lambda e: e["type"])
def test_gist_of_every_pinned_emission(ev):
    text = gist(ev)
    assert isinstance(text, str) and "\n" not in text
    assert not text.startswith(("{", "[")), text  # a summary, not the payload's JSON
    data = ev.get("data") or {}
    if ev["type"].startswith("tool.") and isinstance(data.get("tool"), dict):
        assert data["tool"]["name"] in text
    if ev["type"] == "attention.requested":
        assert data["kind"] in text
        assert data["prompt"][:20] in text
        for opt in data.get("options") or []:
            assert opt["id"] in text
    if ev["type"] == "run.failed":
        assert str(data["reason"]) in text


def test_gists_name_what_happened():
    assert gist({"type": "tool.completed", "data": {"tool": {"name": "bash"}, "status": "ok",
                                                    "duration_ms": 12}}) == "bash ✓ ok (12 ms)"
    assert gist({"type": "tool.failed", "data": {"tool": {"name": "edit"},
                                                 "error": {"message": "no such file"}}}) \
        == "edit ✗ failed: no such file"
    assert gist({"type": "tool.denied", "data": {"tool": {"name": "rm"}, "by": "policy"}}) \
        == "rm ⊘ denied by policy"
    assert gist({"type": "run.finished", "data": {"duration_ms": 900,
                                                  "gen_ai.usage.input_tokens": 120,
                                                  "gen_ai.usage.output_tokens": 12}}) \
        == "finished ok (900 ms)  tokens 120 in / 12 out"
    assert gist({"type": "run.failed", "data": {"reason": "error"}}) == "failed: error"
    assert gist({"type": "run.cancelled", "data": {"by": "control"}}) == "cancelled by control"
    assert gist({"type": "attention.answered", "data": {"answer": {"option": "once"},
                                                        "via": "control"}}) \
        == "answered once via control"
    assert gist({"type": "control.rejected", "data": {"reason": "unauthorized"}}) \
        == "rejected: unauthorized"
    form = {"type": "attention.requested", "data": {"kind": "form", "prompt": "Pick one",
                                                    "fields": [{"id": "q0", "label": "Database"}]}}
    assert gist(form) == "form: Pick one  {Database}"
    # a vendor event: its telling attributes, in a fixed order
    assert gist({"type": "x.codex.otel.tool_result",
                 "data": {"duration_ms": 4, "tool_name": "shell_command", "success": "true",
                          "call_id": "c1"}}) \
        == "tool_name=shell_command success=true duration_ms=4"
    # no telling key: the other scalars, sizes of what nests, tokens; never the raw JSON,
    # never the vendor's bookkeeping
    assert gist({"type": "x.acp.plan.updated",
                 "data": {"entries_pending": 2, "entries_completed": 1}}) \
        == "entries_pending=2 entries_completed=1"
    assert gist({"type": "x.opencode.message.updated",
                 "data": {"role": "assistant", "gen_ai.usage.input_tokens": 120,
                          "gen_ai.usage.output_tokens": 40}}) \
        == "role=assistant tokens 120 in / 40 out"
    assert gist({"type": "x.openhands.message.event",
                 "data": {"vendor_ts": "2026-07-12T10:15:00.123456", "vendor_event_id": "e1",
                          "role": "user", "skills": [1, 2], "extra": {"a": 1}}}) \
        == "role=user skills[2] extra{1}"
    # Codex's own names: the request's status and endpoint, the startup phase, its token counts
    assert gist({"type": "x.codex.otel.api_request",
                 "data": {"attempt": 1, "duration_ms": 34, "endpoint": "/v1/responses",
                          "http.response.status_code": 200}}) \
        == "http.response.status_code=200 endpoint=/v1/responses duration_ms=34"
    assert gist({"type": "x.codex.otel.startup_phase",
                 "data": {"duration_ms": 13, "startup.phase": "mcp", "startup.status": "ok"}}) \
        == "startup.phase=mcp startup.status=ok duration_ms=13"
    assert gist({"type": "x.codex.otel.sse_event",
                 "data": {"event.kind": "response.completed", "input_token_count": 900,
                          "output_token_count": 12}}) \
        == "event.kind=response.completed tokens 900 in / 12 out"
    assert gist({"type": "x.openhands.user_reject.observation",
                 "data": {"tool": {"name": "bash", "call_id": "c"}}}) == "tool=bash"
    assert gist({"type": "x.openhands.pause.event",
                 "data": {"vendor_ts": "2026-07-12T10:15:00.123456"}, "subject": "S1"}) == "S1"


def test_columns_are_aligned_and_pending_attention_highlighted():
    tl = Timeline()
    base = {"agent": "opencode", "session": "ses_0123456789abcdef", "time": "2026-12-01T09:31:02.118Z"}
    ask = {**base, "id": "A1", "type": "attention.requested",
           "data": {"kind": "permission", "prompt": "bash: ls", "options": [{"id": "once"}]}}
    tool = {**base, "id": "T1", "type": "tool.completed", "data": {"tool": {"name": "bash"}}}
    done = {**base, "id": "R1", "type": "attention.resolved", "subject": "A1",
            "data": {"resolution": "answered"}}
    lines = [tl.line(tool), tl.line(ask)]
    assert [k[2] for k in tl.pending] == ["A1"]
    lines.append(tl.line(done))
    assert tl.pending == {}
    gist_at = TIME_W + AGENT_W + SESSION_W + TYPE_W + 4
    for line in lines:
        plain = line.plain
        assert plain[:TIME_W] == "09:31:02.118"
        assert plain[TIME_W + 1:TIME_W + 1 + AGENT_W].rstrip() == "opencode"
        assert plain[TIME_W + AGENT_W + 2:].startswith("…9abcdef ")  # the session's tail
        assert plain[gist_at - 1] == " " and plain[gist_at] != " "
    assert lines[1].plain.endswith("PENDING")
    highlighted = {str(span.style) for span in lines[1].spans}
    assert any("on yellow" in s for s in highlighted), highlighted
    assert not any("on yellow" in str(span.style) for span in lines[0].spans)
    assert lines[2].plain.endswith("resolved: answered ← bash: ls")


def test_an_ask_known_settled_shows_its_outcome_not_pending():
    base = {"agent": "opencode", "session": "ses_0123456789abcdef", "time": "2026-12-01T09:31:02.118Z"}
    tl = Timeline(settled={(None, base["session"], "A1"): "answered"})
    ask = {**base, "id": "A1", "type": "attention.requested",
           "data": {"kind": "permission", "prompt": "bash: ls", "options": [{"id": "once"}]}}
    line = tl.line(ask)
    assert line.plain.endswith("[once]  → answered") and "PENDING" not in line.plain
    assert not any("on yellow" in str(span.style) for span in line.spans)
    assert tl.pending == {}
    done = tl.line({**base, "id": "R1", "type": "attention.resolved", "subject": "A1",
                    "data": {"resolution": "answered"}})
    assert done.plain.endswith("resolved: answered ← bash: ls") and tl.asked == {}


def _ask_and_forgeries():
    """A fleet ask, and the outcomes an outside emitter can post with its id
    as ``subject`` (issue 25, attack 5): in a session of its own, and in the
    ask's session under another emitter's ``source``."""
    src = "aep://host/agent/claude-code/session/victim"
    ask = {"aep": "0.1", "id": "A1", "type": "attention.requested", "agent": "claude-code",
           "source": src, "session": "victim", "time": "2026-12-01T09:31:02.118Z",
           "data": {"kind": "permission", "prompt": "deploy prod", "options": [{"id": "allow"}]}}
    forged = [{**ask, "id": f"F{i}", "type": t, "subject": "A1", "agent": "alice-agent",
               "source": s, "session": sess, "data": {"resolution": "answered"}}
              for i, (t, s, sess) in enumerate([
                  ("attention.resolved", "urn:alice:1", "alice-own"),
                  ("attention.timeout", "urn:alice:1", "alice-own"),
                  ("attention.answered", "urn:alice:1", "alice-own"),
                  ("attention.resolved", "urn:alice:1", "victim")])]
    real = {**ask, "id": "R1", "type": "attention.resolved", "subject": "A1",
            "data": {"resolution": "answered"}}
    return ask, forged, real


def test_an_outcome_from_another_session_or_emitter_settles_no_ask():
    from supervisor.tools.tailstream import settle
    ask, forged, real = _ask_and_forgeries()
    tl = Timeline()
    assert tl.line(ask).plain.endswith("PENDING")
    for f in forged:
        line = tl.line(f)
        assert "← deploy prod" not in line.plain, line.plain
        assert len(tl.pending) == 1, f
    # the replay's outcomes, read before the live stream: the forgeries settle nothing
    settled: dict = {}
    for f in forged:
        settle(f, settled)
    fresh = Timeline(settled=settled)
    assert fresh.line(ask).plain.endswith("PENDING")
    # the ask's own emitter, in its own session, does settle it
    assert tl.line(real).plain.endswith("← deploy prod") and tl.pending == {}
    settle(real, settled)
    assert Timeline(settled=settled).line(ask).plain.endswith("→ answered")


def test_a_second_pending_ask_is_counted_when_one_resolves():
    tl = Timeline()
    for i in (1, 2):
        tl.line({"id": f"A{i}", "type": "attention.requested", "data": {"kind": "input"}})
    line = tl.line({"id": "R", "type": "attention.resolved", "subject": "A1", "data": {}})
    assert line.plain.endswith("(1 still pending)")


def test_parse_filter():
    assert parse_filter([]) == {}
    assert parse_filter(["agent=codex"]) == {"agent": "codex"}
    assert parse_filter(["type=tool.*,attention.*"]) == {"type": ["tool.*", "attention.*"]}
    assert parse_filter(["type=attention.*"]) == {"type": ["attention.*"]}
    assert parse_filter(["severity>=warning", "agent=a,b"]) == {
        "severity": {"gte": "warning"}, "agent": ["a", "b"]}
    assert parse_filter(['{"type": ["run.*"]}', "agent=x"]) == {"type": ["run.*"], "agent": "x"}
    for bad in ("agent", "=x", "{nope", "[1]", "agent="):
        with pytest.raises(ValueError, match="--filter"):
            parse_filter([bad])


def test_default_url_is_the_local_relay():
    assert default_url({}) == "http://127.0.0.1:8787"
    assert default_url({"AEP_LISTEN": "0.0.0.0:9000"}) == "http://127.0.0.1:9000"
    assert default_url({"AEP_LISTEN": "10.0.0.5:8787"}) == "http://10.0.0.5:8787"


json_values = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=20),
                           lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=8), c, max_size=4),
                           max_leaves=20)


@given(st.dictionaries(st.sampled_from(["type", "data", "time", "agent", "session", "id",
                                        "subject", "severity"]), json_values),
       st.sampled_from(["tool.completed", "tool.failed", "attention.requested", "run.finished",
                        "attention.resolved", "session.started", "x.v.y", "control.accepted",
                        "progress.task.planned", "error.raised", None]))
# an ask whose session (or source) is a list: its key was unhashable (found by this property
# once the asks were keyed by (source, session, id), issue 25)
@example(ev={"id": "", "session": []}, type_="attention.requested")
@example(ev={"id": "a", "source": {"x": 1}}, type_="attention.requested")
@example(ev={"subject": "a", "session": [1]}, type_="attention.resolved")
def test_garbage_never_raises(ev, type_):
    if type_ is not None:
        ev["type"] = type_
    assert isinstance(gist(ev), str)
    assert isinstance(Timeline().line(ev).plain, str)


_HOSTILE = ["\n", "\r", "\x1b[2J", "\x1b]0;title\x07", "\x9b31m", "\x08", "\u2028", "\x85",
            "\u202e", "\u2066", "\x00", "\u200b", "\u061c", "\ufeff", "\udc00", "\U000e0041"]
_hostile_text = st.one_of(
    st.text(max_size=30),
    st.builds(lambda a, c, b: a + c + b, st.text(max_size=5), st.sampled_from(_HOSTILE),
              st.text(max_size=5)),
    st.text(min_size=300, max_size=1500))
_hostile_key = st.one_of(_hostile_text, st.sampled_from(
    ["model", "tool", "name", "vendor_ts", "", "gen_ai.usage.input_tokens",
     "gen_ai.usage.output_tokens"]))
_hostile_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | _hostile_text,
    lambda c: st.lists(c, max_size=3) | st.dictionaries(_hostile_key, c, max_size=3),
    max_leaves=10)


def _unsafe(text: str) -> list[str]:
    """What a terminal line must not hold: controls, format characters
    (bidi controls, zero-width ones), surrogates, line and paragraph
    separators."""
    import unicodedata
    return [c for c in text if unicodedata.category(c) in ("Cc", "Cf", "Cs", "Zl", "Zp")]


@given(st.dictionaries(_hostile_key, _hostile_json, max_size=8),
       st.sampled_from(["x.vendor.thing", "tool.completed", "attention.requested",
                        "run.failed", "session.started", "control.rejected"]),
       _hostile_text)
def test_an_events_content_never_reaches_the_terminal_raw(data, type_, text):
    """Keys and values alike: no control character (ESC would start a
    terminal command), no line break (a forged timeline line), no bidi
    control, and a vendor gist stays short (four bits, each shortened)."""
    ev = {"type": type_, "data": data, "agent": text, "session": text, "time": "T" + text,
          "subject": text, "id": "A1"}
    summary = gist(ev)
    assert not _unsafe(summary), repr(summary[:120])
    if type_ == "x.vendor.thing":
        assert len(summary) <= 4 * 60, len(summary)
    line = Timeline().line({**ev, "type": type_ + text}).plain
    assert not _unsafe(line), repr(line[:160])


def test_hostile_keys_and_token_counts_are_escaped_and_shortened():
    forged = gist({"type": "x.v.t", "data": {"a\nFAKE attention.requested": 1}})
    assert "\n" not in forged and forged.startswith("a FAKE")
    assert gist({"type": "x.v.t", "data": {"\x1b[2J": 1}}) == "\\x1b[2J=1"
    tokens = gist({"type": "x.v.t", "data": {"gen_ai.usage.input_tokens": "1\n" + "9" * 10000}})
    assert "\n" not in tokens and len(tokens) < 40
    assert len(gist({"type": "x.v.t", "data": {"k" * 5000: 1, "j" * 5000: 2}})) < 70
    assert gist({"type": "tool.completed", "data": {"tool": {"name": "b\u202eash"}}}) \
        == "b\\u202eash ✓ completed"


class FakeSubscription:
    """Stands in for ``aep_sdk.subscribe`` to drive :func:`supervisor.tools.tail.run`'s
    error handling (the real consumer is exercised against the daemon in
    tests/integration/supervisor/test_tail_daemon.py)."""

    def __init__(self, script):
        self.script = script
        self.closed = False

    def __call__(self, url, on_event, *, on_error, **kw):
        self.kw = kw
        for kind, item in self.script:
            (on_event if kind == "event" else on_error)(item)
        return self

    def close(self):
        self.closed = True


def test_run_survives_a_refused_from_all_but_not_a_refused_token():
    import io

    from aep_sdk import TransportError

    from supervisor.tools.tail import run
    ev = {"id": "1", "type": "tool.completed", "agent": "a", "data": {"tool": {"name": "t"}}}
    fake = FakeSubscription([("error", TransportError("http", "SSE HTTP 400", status=400)),
                             ("event", ev)])
    out, err = io.StringIO(), io.StringIO()
    assert run("http://x", from_="all", limit=1, out=out, err=err, subscribe=fake) == 0
    assert "t ✓ completed" in out.getvalue() and "(retrying, attempt 1)" in err.getvalue()
    assert fake.closed and fake.kw["from_"] == "all"
    fake = FakeSubscription([("error", TransportError("http", "SSE HTTP 401", status=401))])
    err = io.StringIO()
    assert run("http://x", out=io.StringIO(), err=err, subscribe=fake) == 1
    assert "HTTP 401 (pass --token or set AEP_TOKEN)" in err.getvalue() and fake.closed


_NASTY = "a\u2028b\x9b31m\u202ec\u200bd\ufeff\x7f\udc00\U000e0001\U0001d173z"


def test_json_mode_escapes_what_json_dumps_leaves_raw():
    """``--json``: the same JSON (it parses back to the event), with C1,
    DEL, line separators, format characters and lone surrogates as
    ``\\u`` escapes, so a terminal gets no raw control and a UTF-8 stdout
    no unencodable character."""
    import io
    import json

    from supervisor.tools.tail import run
    ev = {"id": "1", "type": "x.v.t", "agent": "a", "data": {_NASTY: _NASTY}}
    out = io.StringIO()
    assert run("http://x", as_json=True, limit=1, out=out, err=io.StringIO(),
               subscribe=FakeSubscription([("event", ev)])) == 0
    line = out.getvalue()
    assert line.endswith("\n") and line.count("\n") == 1
    assert json.loads(line) == ev
    assert not _unsafe(line[:-1]) and "\udc00" not in line and "\x9b" not in line
    line.encode("utf-8")  # would raise on a raw lone surrogate


def test_an_endpoints_own_words_reach_stderr_escaped():
    import io

    from aep_sdk import TransportError

    from supervisor.tools.tail import run
    bad = TransportError("http", "bad status line: \x1b]0;pwned\x07\x1b[2J\nFORGED", status=None)
    err = io.StringIO()
    ev = {"id": "1", "type": "x.v.t", "agent": "a", "data": {}}
    assert run("http://x", limit=1, out=io.StringIO(), err=err,
               subscribe=FakeSubscription([("error", bad), ("event", ev)])) == 0
    text = err.getvalue()
    assert text.count("\n") == 1 and "\x1b" not in text and "\x07" not in text
    assert "\\x1b]0;pwned" in text


def test_format_characters_and_surrogates_are_shown_not_rendered():
    text = gist({"type": "x.v.t", "data": {"k1": "a\u202e", "k2": "\u200b\ufeff",
                                           "k3": "\x7f\udc00", "k4": "\x9b"}})
    assert not _unsafe(text)
    for shown in ("\\u202e", "\\u200b", "\\ufeff", "\\x7f", "\\udc00", "\\x9b"):
        assert shown in text
    text.encode("utf-8")


def test_an_ask_whose_data_is_no_object_resolves_without_a_crash():
    tl = Timeline()
    tl.line({"id": "A1", "type": "attention.requested", "data": [1, 2]})
    line = tl.line({"id": "R", "type": "attention.resolved", "subject": "A1", "data": "x"})
    assert line.plain.rstrip().endswith("←") and tl.pending == {}


def test_columns_hold_in_cells_with_wide_and_combining_characters():
    from rich.cells import cell_len
    tl = Timeline()
    base = {"type": "tool.completed", "time": "2026-12-01T09:31:02.118Z",
            "data": {"tool": {"name": "bash"}}}
    lines = [tl.line({**base, "agent": agent, "session": agent}).plain
             for agent in ("codex", "日本語のエージェント", "e\u0301\u0301\u0301x", "ok")]
    gist_at = TIME_W + AGENT_W + SESSION_W + TYPE_W + 4
    for plain in lines:
        cut = plain.index("bash ✓")
        assert cell_len(plain[:cut]) == gist_at, plain


def test_an_event_without_a_payload_says_so():
    # issue 29: the demo's x.opencode.session.updated lines had an empty gist
    for ev in ({"type": "x.opencode.session.updated", "data": {}},
               {"type": "x.opencode.session.diff"}):
        assert gist(ev) == "(no data)"
        assert Timeline().line(ev).plain.endswith(" (no data)")
    assert gist({"type": "x.v.t", "data": {}, "subject": "S1"}) == "S1"
