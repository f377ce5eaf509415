"""``source`` stays a valid URI whatever a vendor names its sessions
(AEP-0001 §5.1 #6): the session is one percent-encoded path segment.

Found by the SSE fuzz (a session id ``"\\r"`` gave ``aep://.../session/\\r``,
which no URI parser accepts)."""
from __future__ import annotations

import re
import sys
from urllib.parse import unquote, urlsplit

from hypothesis import given
from hypothesis import strategies as st

from bridges.core.envelope import Stamper, session_segment
from tests.support.schema import validate_event

# RFC 3986 §3.3: segment = *pchar; pchar = unreserved / pct-encoded / sub-delims / ":" / "@"
_SEGMENT = re.compile(r"(?:[A-Za-z0-9\-._~!$&'()*+,;=:@]|%[0-9A-F]{2})*")

_ids = st.text(min_size=1, max_size=40)


@given(_ids)
def test_any_session_gives_a_valid_uri_source(session: str) -> None:
    ev = Stamper("opencode", host="h", epoch=1).stamp(session, {"type": "run.started"})
    assert ev["session"] == session  # the session field itself is verbatim
    validate_event(ev)
    prefix, _, segment = ev["source"].partition("/session/")
    assert prefix == "aep://h/agent/opencode"
    assert _SEGMENT.fullmatch(segment), ev["source"]
    assert "/" not in segment and unquote(segment) == session  # one segment, lossless


@given(_ids, _ids)
def test_two_sessions_never_share_a_source(a: str, b: str) -> None:
    if a != b:
        assert session_segment(a) != session_segment(b)


def test_a_lone_surrogate_session_is_spelled_not_raised() -> None:
    # as the fleet writes the session field: U+FFFD, so source and session agree
    assert session_segment("x\ud800") == session_segment("x\ufffd") == "x%EF%BF%BD"


def test_vendor_shaped_ids_are_unchanged() -> None:
    # ids every pin and capture uses: the wire form of existing sessions does not move
    for session in ("ses_4f1c2a9e7ffeQpLx", "s_8f2c", "019a8e2c-6f1b-7d55-9d7b-1c1e4c7f2d10",
                    "conv:1@host", "a.b~c_d-e"):
        assert session_segment(session) == session
        assert urlsplit(f"aep://h/agent/x/session/{session}").path.endswith(session)


def test_sessions_differing_only_in_lone_surrogates_are_one_gap_free_session() -> None:
    """Both vendor sessions become U+FFFD on the wire: one session, one
    ``seq`` line (two lines from 0 under one name made the relay refuse the
    second (epoch, seq) and the bridge's health red; fresh-user review)."""
    st_ = Stamper("opencode", host="h", epoch=1)
    evs = [st_.stamp(s, {"type": "run.started"}) for s in ("\ud800", "\udbff", "\ud800")]
    assert [e["session"] for e in evs] == ["\ufffd"] * 3
    assert [e["seq"] for e in evs] == [0, 1, 2]
    assert {e["source"] for e in evs} == {"aep://h/agent/opencode/session/%EF%BF%BD"}
    for e in evs:
        validate_event(e)
    assert st_.knows("\udbff") and st_.knows("\ufffd")


def test_the_source_cache_is_bounded_and_an_evicted_session_is_stamped_the_same(monkeypatch) -> None:
    # a daemon that sees new sessions all day must not keep one cached source
    # per session it ever saw; a session whose entry went is spelled again,
    # and its seq (kept apart) goes on gap-free
    from bridges.core import envelope

    monkeypatch.setattr(envelope, "MAX_SOURCES", 3)
    s = Stamper("codex", host="h", epoch=2)
    first = [s.stamp(f"ses-{i}", {"type": "run.started"}) for i in range(10)]
    assert len(s._sources) <= 3
    again = s.stamp("ses-0", {"type": "run.started"})  # long evicted
    run = list(s.stamp_run("ses-1", [{"type": "run.started"}], [None]))
    assert again["source"] == first[0]["source"] == "aep://h/agent/codex/session/ses-0"
    assert (again["seq"], run[0]["seq"]) == (1, 1)
    assert run[0]["source"] == first[1]["source"]
    assert len(s._sources) <= 3


def test_the_source_cache_keeps_no_long_session() -> None:
    """An eighth outside attack, finding 4: 4,096 cached sessions of up to
    4 KiB, each spelled into a source up to 12 characters a character, were
    kept outside any budget (an OTLP sender chooses its session ids). A
    session over 256 characters is spelled each time; stamped the same."""
    s = Stamper("codex", host="h", epoch=1)
    evs = [s.stamp(f"{n}-" + "\u00e9" * 4000, {"type": "run.started"}) for n in range(100)]
    kept = sum(sys.getsizeof(k) + sum(map(sys.getsizeof, v)) for k, v in s._sources.items())
    assert kept < 1 << 20, kept
    again = s.stamp("7-" + "\u00e9" * 4000, {"type": "run.started"})
    assert again["source"] == evs[7]["source"] and again["seq"] == evs[7]["seq"] + 1
