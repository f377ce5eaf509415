"""AEP-0001 §8.2 hop down-leveling: the corpus
``conformance/fixtures/downlevel/cases.json`` (every case, read from shared/
at test time), the §8.2(e) boundary, and properties over the golden events
(never up-levels, output honors its capture and validates)."""
from __future__ import annotations

import copy
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bridges.core.capture import LEVELS, downlevel, rank
from tests.support.schema import capture_problems, validate_event
from tests.support.shared import aep_dir, fixture

CASES = fixture("downlevel/cases.json")["cases"]
GOLDEN = [json.loads(line) for line in
          (aep_dir() / "conformance/fixtures/golden/golden.jsonl").read_text().splitlines()
          if line.strip()]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c["name"])
def test_downlevel_case(case):
    before = copy.deepcopy(case["event"])
    out = downlevel(case["event"], case["ceiling"])
    assert out["capture"] == case["expect_capture"]
    assert out.get("data") == case["expect_data"]
    # Everything but capture/data rides unchanged; the input is untouched.
    rest = {k: v for k, v in out.items() if k not in ("capture", "data")}
    assert rest == {k: v for k, v in before.items() if k not in ("capture", "data")}
    assert case["event"] == before


def test_corpus_covers_the_boundary():
    assert len(CASES) >= 18
    assert any(c["event"].get("capture") == "full" and c["ceiling"] == "redacted" for c in CASES)


def test_redacted_ceiling_never_mints_redacted_from_full():
    ev = {"aep": "0.1", "id": "e", "type": "run.cancelled", "time": "2026-07-03T10:00:00Z",
          "source": "aep://h/agent/a/session/s", "agent": "a", "session": "s", "seq": 0,
          "capture": "full", "data": {"by": "user", "reason": "verbatim SECRET reason"}}
    out = downlevel(ev, "redacted")
    assert out["capture"] == "metadata"
    assert out["data"] == {"by": "user"}


def test_absent_capture_is_metadata_and_passes_a_metadata_ceiling():
    ev = {"aep": "0.1", "id": "e", "type": "x.acme.session.blob", "time": "2026-07-03T10:00:00Z",
          "source": "aep://h/agent/a/session/s", "agent": "a", "session": "s", "seq": 0,
          "data": {"anything": 1}}
    assert downlevel(ev, "metadata") == ev


def test_unknown_capture_claim_is_treated_as_full():
    ev = {"type": "tool.completed", "agent": "a", "capture": "bogus",
          "data": {"tool": {"name": "Bash"}, "result": "SECRET"}}
    out = downlevel(ev, "redacted")
    assert out["capture"] == "metadata" and out["data"] == {"tool": {"name": "Bash"}}


def test_unknown_ceiling_is_refused():
    with pytest.raises(ValueError):
        downlevel(GOLDEN[0], "partial")


@settings(max_examples=300, deadline=None)
@given(ev=st.sampled_from(GOLDEN), ceiling=st.sampled_from(LEVELS))
def test_golden_downleveled_never_uplevels_and_stays_valid(ev, ceiling):
    out = downlevel(ev, ceiling)
    before = ev.get("capture", "metadata")
    after = out.get("capture", "metadata")
    assert rank(after) <= rank(before)
    assert rank(after) <= rank(ceiling)
    if ceiling == "redacted" and before == "full":
        assert after == "metadata"
    if ceiling == "none":
        assert "data" not in out
    assert capture_problems(out["type"], out.get("data"), after) == []
    validate_event(out)
    # A second hop at the same ceiling changes nothing.
    assert downlevel(out, ceiling) == out
