"""Round 8 outside attack, findings 2 and 3 (issue 25): a session id whose
percent-encoding has the shape of a long id's shortened name
(``'a'*100 + '~' + sha256('a'*200)[:24]``) was named as the long id is, so a
second credential appended its lines to the first's session log and
retention charged its bytes to the first's writer (its closed sessions
removed for them). :func:`supervisor.sessionlog.jsonlog.safe_name` is
injective now; every name it gave before keeps its meaning except that
crafted shape's."""
from __future__ import annotations

import base64
import hashlib
import json
import random
import re
import urllib.parse

from hypothesis import given, settings
from hypothesis import strategies as st

from supervisor.sessionlog.jsonlog import safe_name
from supervisor.sessionlog.retention import RetainingSessionLog, RetentionPolicy
from supervisor.sessionlog.writers import stem_of


def _digest(value: str) -> str:
    return hashlib.sha256(value.encode("utf-8", "surrogatepass")).hexdigest()[:24]


def _quote(value: str) -> str:
    return urllib.parse.quote(value, safe="")


def _partner(long_id: str) -> str:
    """The id the attack crafts for ``long_id``: one whose percent-encoding
    is exactly ``long_id``'s shortened name (when the cut at 100 falls
    between two escapes)."""
    return urllib.parse.unquote(_quote(long_id)[:100]) + "~" + _digest(long_id)


_Y = "a" * 200
_X = "a" * 100 + "~" + _digest(_Y)  # the attacker's pair (REPORT.md finding 2)

_DIGEST_NAME = re.compile(r"~.{100}~[0-9a-f]{24}", re.DOTALL)
_STAMP = st.from_regex(r"\.[0-9]{8}T[0-9]{6}\.[0-9]{6}Z", fullmatch=True)
_HEX24 = st.from_regex(r"[0-9a-f]{24}", fullmatch=True)
_TILDES = st.text(alphabet="a~%7E.-_Z/ é", max_size=300)  # long, tildes, escapes
_IDS = st.one_of(
    st.text(max_size=60),
    _TILDES,
    st.builds(lambda p, h: p + "~" + h, st.text(alphabet="a~b%.", min_size=90, max_size=110),
              _HEX24),  # the digest form's shape, and near it
    st.builds(_partner, st.text(alphabet="ab~/ ", min_size=60, max_size=300)),
    st.builds(str.__add__, st.text(alphabet="a~1", max_size=140), _STAMP),  # stamp-shaped
)


def test_the_attackers_pair_has_two_names_and_two_stems():
    assert safe_name(_X) != safe_name(_Y)
    assert stem_of("worker", safe_name(_X) + ".jsonl") != stem_of("worker", safe_name(_Y) + ".jsonl")
    assert urllib.parse.unquote(safe_name(_X)[1:]) == _X  # still the id, percent-decoded


@settings(max_examples=600, deadline=None)
@given(_IDS)
def test_a_name_says_which_id_it_is(x):
    # injective by construction: a name is the id itself, or ~ and the id's
    # percent-encoding (decoding back to it), or a long id's shortened form,
    # which no short id's name takes
    name = safe_name(x)
    if not name.startswith("~"):
        assert name == x
    elif _DIGEST_NAME.fullmatch(name):
        assert len(_quote(x)) > 150 and name == "~" + _quote(x)[:100] + "~" + _digest(x)
    else:
        assert urllib.parse.unquote(name[1:], errors="surrogatepass") == x


@settings(max_examples=400, deadline=None)
@given(_IDS, _IDS)
def test_distinct_ids_have_distinct_names(a, b):
    if a != b:
        assert safe_name(a) != safe_name(b)


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet="ab~/ ", min_size=60, max_size=300))
def test_no_crafted_partner_shares_a_long_ids_name(y):
    x = _partner(y)
    if x != y:
        assert safe_name(x) != safe_name(y)


def test_names_given_before_keep_their_meaning():
    # logs on disk from before: the plain, the ~-quoted, the shortened forms unchanged
    assert safe_name("ses_01JX-9.a_b") == "ses_01JX-9.a_b"
    assert safe_name("a~b") == "~a~b"
    assert safe_name(_Y) == "~" + "a" * 100 + "~" + _digest(_Y)
    assert safe_name("x~" + "0" * 24) == "~x~" + "0" * 24  # hex after ~, but not 100 before


def _ev(session: str, seq: int, source: str, note: str) -> dict:
    return {"aep": "0.1", "id": f"{source}-{session[:8]}-{seq}", "type": "progress.status",
            "time": "2026-12-07T17:00:00Z", "source": source, "agent": "worker",
            "session": session, "seq": seq, "data": {"note": note}}


async def test_retention_charges_bobs_bytes_to_bob(tmp_path):
    # REPORT.md finding 3: alice's closed sessions, her long-id session Y;
    # bob floods X (the crafted partner of Y); over the cap, bob's own
    # files go, alice keeps hers
    log = RetainingSessionLog(tmp_path, RetentionPolicy(max_bytes=None, max_age=None,
                                                        max_total_bytes=None), max_open=8)
    assert log.writers is not None
    log.writers.open_prefixes += ("relay:",)
    alice, bob = "relay:emitter:alice", "relay:emitter:bob"
    d = tmp_path / "worker"
    rnd = random.Random(25)
    def noise() -> str:  # incompressible: the segments keep their size once gzipped
        return base64.b64encode(rnd.randbytes(6000)).decode()
    for s in ("alice-1", "alice-2", "alice-3"):
        log.write(_ev(s, 0, "urn:alice", noise()), writer=alice)
        assert log.rotate(d / f"{s}.jsonl") is not None  # closed
    log.write(_ev(_Y, 0, "urn:alice", "alice's Y"), writer=alice)
    for i in range(6):
        log.write(_ev(_X, i, "urn:bob", noise()), writer=bob)
        assert log.rotate(log.path_for(_ev(_X, i, "urn:bob", ""))) is not None
    log.write(_ev(_X, 6, "urn:bob", "b"), writer=bob)
    log.check()
    y_file = d / f"{safe_name(_Y)}.jsonl"
    y_lines = [json.loads(ln) for ln in y_file.read_text().splitlines()]
    assert [e["source"] for e in y_lines] == ["urn:alice"]  # bob's lines are not in alice's log
    group = log._grouper()
    assert group(y_file) == f"w:{alice}"
    assert group(log.path_for(_ev(_X, 7, "urn:bob", ""))) == f"w:{bob}"
    await log.compress_pending()
    held = sum(p.stat().st_size for p in tmp_path.rglob("*") if p.is_file())
    alice_before = sorted(p.name for p in d.iterdir() if p.name.startswith("alice"))
    log.policy = RetentionPolicy(max_bytes=None, max_age=None,
                                 max_total_bytes=held - 20_000)
    log.sweep()
    names = [p.name for p in d.iterdir()]
    assert sorted(n for n in names if n.startswith("alice")) == alice_before
    assert log.retained["removed_files"] >= 2  # bob's closed segments
    log.close()
