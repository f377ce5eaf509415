"""``aep-bridges validate`` and ``aep-bridges timeline`` over files
(:mod:`supervisor.tools.validate`, :mod:`supervisor.tools.timeline`): the
shipped schemas are the protocol's, the conformance corpora are judged as
the spec pins them (golden valid, every invalid case flagged at its line),
and bad input has a defined answer."""
from __future__ import annotations

import gzip
import io
import json

import pytest

from supervisor.tools import timeline, validate
from tests.support.shared import aep_dir, fixture

GOLDEN = aep_dir() / "conformance/fixtures/golden/golden.jsonl"
INVALID = fixture("invalid/cases.json")["cases"]


def test_the_shipped_schemas_are_the_protocols():
    shared, shipped = aep_dir() / "schemas", validate.SHIPPED
    names = ["aep-event.schema.json", "registry/types.json",
             *(f"types/{p.name}" for p in (shared / "types").glob("*.schema.json"))]
    assert len(names) > 40
    for name in names:
        assert (shipped / name).read_bytes() == (shared / name).read_bytes(), name
    assert sorted(p.name for p in (shipped / "types").iterdir()) == \
        sorted(p.name for p in (shared / "types").iterdir())


def run(*names: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    return validate.run(list(names), out=out, err=err), out.getvalue(), err.getvalue()


def test_golden_corpus_is_valid_plain_and_gzipped(tmp_path):
    status, out, _ = run(str(GOLDEN))
    n = sum(1 for line in GOLDEN.read_text().splitlines() if line.strip())
    assert status == 0 and out.strip() == f"{GOLDEN}: {n} event(s), all valid"
    gz = tmp_path / "seg.jsonl.gz"
    gz.write_bytes(gzip.compress(GOLDEN.read_bytes()))
    assert run(str(gz))[0] == 0


def test_every_invalid_case_is_flagged_at_its_line(tmp_path):
    golden = [line for line in GOLDEN.read_text().splitlines() if line.strip()]
    for i, case in enumerate(INVALID):
        evs = case.get("events") or [case["event"]]
        f = tmp_path / f"case{i}.jsonl"
        # a valid first line, so the problem's line number is not 1 by luck
        f.write_text("\n".join([golden[0], *map(json.dumps, evs)]) + "\n")
        status, out, _ = run(str(f))
        assert status == 1, (case["name"], out)
        flagged = {int(line.split(":")[1]) for line in out.splitlines()[:-1]}
        assert flagged and flagged <= set(range(2, 2 + len(evs))), (case["name"], out)


def test_bad_lines_and_unreadable_files(tmp_path):
    f = tmp_path / "bad.jsonl"
    f.write_text('{"aep": "0.1"\n\n[1, 2]\n')
    status, out, _ = run(str(f))
    assert status == 1
    assert f"{f}:1: not JSON" in out and f"{f}:3: not a JSON object: list" in out
    status, _, err = run(str(tmp_path / "missing.jsonl"), str(GOLDEN))
    assert status == 2 and "missing.jsonl" in err


def test_timeline_renders_a_file_as_tail_does(tmp_path, monkeypatch):
    # a file keeps whole lines unless COLUMNS asks otherwise (pytest-xdist's
    # workers run with COLUMNS=80, which cut the PENDING mark)
    monkeypatch.delenv("COLUMNS", raising=False)
    f = tmp_path / "log.jsonl"
    f.write_text(GOLDEN.read_text() + "not json\n")
    out, err = io.StringIO(), io.StringIO()
    assert timeline.run([str(f)], color="never", out=out, err=err) == 0
    lines = out.getvalue().splitlines()
    n = sum(1 for line in GOLDEN.read_text().splitlines() if line.strip())
    assert lines[0].startswith("── 20") and len([x for x in lines if not x.startswith("──")]) == n
    # every ask of the golden corpus is settled in the same file: none is PENDING
    assert not any("PENDING" in x for x in lines)
    assert sum("→ answered" in x for x in lines) == 2 and sum("→ timed out" in x for x in lines) == 1
    assert f"{f}:{n + 1}: not JSON" in err.getvalue()
    assert timeline.run([str(tmp_path / "nope")], out=io.StringIO(), err=io.StringIO()) == 2


def test_timeline_marks_pending_only_the_asks_the_input_does_not_settle(tmp_path, monkeypatch):
    monkeypatch.delenv("COLUMNS", raising=False)  # whole lines (xdist workers: COLUMNS=80)
    golden = [json.loads(x) for x in GOLDEN.read_text().splitlines() if x.strip()]
    asks = [e for e in golden if e["type"] == "attention.requested"]
    outcomes = [e for e in golden if e["type"] in ("attention.answered", "attention.timeout")]
    settled_one = [o for o in outcomes if o["subject"] == asks[0]["id"]]
    first, second = tmp_path / "asks.jsonl", tmp_path / "answers.jsonl"
    first.write_text("".join(json.dumps(e) + "\n" for e in asks))
    second.write_text("".join(json.dumps(e) + "\n" for e in settled_one))

    def pending(*names: str) -> list[str]:
        out = io.StringIO()
        assert timeline.run(list(names), color="never", out=out, err=io.StringIO()) == 0
        return [x for x in out.getvalue().splitlines() if "PENDING" in x]

    assert len(pending(str(first))) == len(asks) == 3  # nothing settles them
    # the answer in the next file settles the first ask, shown on the ask's own line
    assert len(pending(str(first), str(second))) == 2
    monkeypatch.setattr("sys.stdin", io.StringIO(first.read_text() + second.read_text()))
    assert len(pending("-")) == 2


def test_timeline_keeps_an_ask_pending_that_a_foreign_outcome_names(tmp_path, monkeypatch):
    # issue 25 (attack 5): anyone who may post can name a fleet ask's id as
    # the subject of an outcome in a session of its own; the ask stays pending
    monkeypatch.delenv("COLUMNS", raising=False)
    src = "aep://host/agent/claude-code/session/victim"
    ask = {"aep": "0.1", "id": "A1", "type": "attention.requested", "agent": "claude-code",
           "source": src, "session": "victim", "seq": 1, "severity": "notice",
           "time": "2026-12-01T09:31:02Z", "data": {"kind": "permission", "prompt": "deploy prod"}}
    forged = {**ask, "id": "F1", "type": "attention.resolved", "subject": "A1", "agent": "alice",
              "source": "urn:alice:1", "session": "alice-own", "data": {"resolution": "answered"}}
    f = tmp_path / "log.jsonl"
    f.write_text(json.dumps(ask) + "\n" + json.dumps(forged) + "\n")
    out = io.StringIO()
    assert timeline.run([str(f)], color="never", out=out, err=io.StringIO()) == 0
    lines = out.getvalue().splitlines()
    assert any("deploy prod" in x and x.endswith("PENDING") for x in lines), lines
    assert not any("→ answered" in x or "← deploy prod" in x for x in lines), lines


@pytest.mark.parametrize("case", [c for c in INVALID if "event" in c][:3], ids=lambda c: c["name"])
def test_stdin(case, monkeypatch):
    monkeypatch.setattr("sys.stdin", io.StringIO(json.dumps(case["event"]) + "\n"))
    status, out, _ = run("-")
    assert status == 1 and out.startswith("<stdin>:1: ")


def test_validate_says_a_line_is_no_aep_event_not_none_id_none(tmp_path):
    f = tmp_path / "x.jsonl"
    f.write_text('{"a": 1}\n{"b": 2}\n{"type": "x"}\n')
    out = io.StringIO()
    assert validate.run([str(f)], out=out, err=io.StringIO()) == 1
    text = out.getvalue()
    assert "None" not in text, text
    assert f"{f}:1: (not an AEP event): " in text and "(x, no id)" in text
    # two events without an id are not one id reused
    assert "reused" not in text, text


ESC = "\x1b]0;PWNED-TITLE\x07\x1b[2J\x1b[32mall valid\x1b[8m\u202e"


def test_an_events_own_words_reach_the_terminal_escaped(tmp_path):
    # issue 25 (attack 5): an id (and payload keys) with terminal escapes in
    # an event with a schema problem reached the terminal raw in its label
    evs = [{"aep": "0.1", "id": "01J" + ESC, "type": "tool.completed", "time": "2026-12-07T00:00:00Z",
            "agent": "evil", "source": "urn:evil:2", "session": "s" + ESC, "seq": 1,
            "severity": "info", "data": {"nonsense": True, ESC: 1}},
           {"aep": "0.1", "id": "01K", "type": "session.started" + ESC,
            "time": "2026-12-07T00:00:00Z", "agent": "a", "source": "s", "session": "x", "seq": 1,
            "severity": "info", "data": {}}]
    f = tmp_path / "hostile.jsonl"
    f.write_text("".join(json.dumps(e) + "\n" for e in evs))
    status, out, _ = run(str(f))
    assert status == 1
    assert not any(c in out for c in "\x1b\x07\u202e\r"), out
    assert f"{f}:1: (tool.completed id=01J\\x1b]0;PWNED-TITLE\\x07" in out, out
    assert "\\u202e" in out


def test_a_line_too_long_is_a_problem_of_its_own_never_read_whole(tmp_path, monkeypatch):
    # issue 25 (attack 5): a small .gz holding one 800 MB line made validate and
    # timeline die with MemoryError; the line is read on in chunks and reported
    monkeypatch.setattr(validate, "MAX_LINE", 1 << 16, raising=False)
    monkeypatch.setattr(validate, "_CHUNK", 1 << 12, raising=False)
    good = GOLDEN.read_text().splitlines()[0]
    big = b"a" * (1 << 20)
    f = tmp_path / "bomb.jsonl.gz"
    with gzip.open(f, "wb") as z:
        z.write(good.encode() + b"\n" + big + b"\n" + good.replace('"id": "', '"id": "x').encode() + b"\n")
    reads: list[int] = []
    real_open = gzip.open

    class Counting:
        def __init__(self, z):
            self.z = z

        def __enter__(self):
            return self

        def __exit__(self, *a):
            self.z.close()

        def readline(self, size=-1):
            line = self.z.readline(size)
            reads.append(len(line))
            return line

        def __iter__(self):
            while line := self.readline():
                yield line

    monkeypatch.setattr(validate.gzip, "open", lambda *a, **kw: Counting(real_open(*a, **kw)))
    status, out, _ = run(str(f))
    assert f"{f}:2: line of {len(big) + 1} bytes, over the {1 << 16}-byte limit" in out, out
    assert f"{f}: 2 event(s)" in out and f"{f}:1:" not in out and f"{f}:3:" not in out, out
    assert status == 1 and max(reads) <= 1 << 16  # never more than the limit at once
    err = io.StringIO()
    assert timeline.run([str(f)], color="never", out=io.StringIO(), err=err) == 0
    assert f"{f}:2: line of {len(big) + 1} bytes" in err.getvalue()
    # stdin: the same rule
    monkeypatch.setattr("sys.stdin", io.StringIO(good + "\n" + "b" * (1 << 17) + "\n"))
    status, out, _ = run("-")
    assert status == 1 and "<stdin>:2: line of" in out and "<stdin>: 1 event(s)" in out


def test_a_truncated_gz_is_unreadable_not_a_crash(tmp_path):
    f = tmp_path / "cut.jsonl.gz"
    f.write_bytes(gzip.compress(GOLDEN.read_bytes())[:-40])
    status, _, err = run(str(f))
    assert status == 2 and "truncated gzip" in err


def test_validate_holds_one_event_at_a_time_not_the_log(tmp_path):
    # a long log (many large events, each under the line cap) is read in one
    # pass: what validate holds at once is about one event, not the file
    import tracemalloc
    base = json.loads(GOLDEN.read_text().splitlines()[0])
    f = tmp_path / "big.jsonl"
    with open(f, "w") as out:
        for i in range(40):
            out.write(json.dumps({**base, "id": f"big-{i}", "x-pad": "p" * (256 << 10)}) + "\n")
    run(str(f))  # warm: the compiled schemas, the escaping tables
    tracemalloc.start()
    try:
        status, text, _ = run(str(f))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert f"{f}: 40 event(s)" in text, text
    assert peak < 4 << 20, peak  # the file is 10 MiB
