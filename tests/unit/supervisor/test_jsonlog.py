"""The JSONL session log (AEP-0003 §3.1)."""
import json
import os

import pytest

from supervisor.sessionlog.jsonlog import SessionLog, safe_name


@pytest.mark.parametrize("raw", ["../../etc/passwd", "a/b", ".", "..", ".hidden", "x" * 400,
                                 "sp ace", "ünï", "a\nb", ""])
def test_untrusted_ids_never_escape_or_collide(raw):
    name = safe_name(raw)
    assert "/" not in name and name not in ("", ".", "..") and not name.startswith(".")
    assert name != "_agent"
    assert len(name) <= 160
    assert "\n" not in name


def test_safe_ids_pass_through_and_distinct_ids_stay_distinct():
    assert safe_name("ses_01JX-9.a_b") == "ses_01JX-9.a_b"
    assert safe_name("a/b") != safe_name("a%2Fb")
    assert safe_name("x" * 400) != safe_name("x" * 401)


def test_one_line_per_event_in_agent_session_layout(tmp_path):
    sl = SessionLog(tmp_path, max_open=2)
    evs = [{"aep": "0.1", "agent": "codex", "session": f"s{i % 3}", "seq": i, "data": {"t": "é"}}
           for i in range(9)]
    for ev in evs:
        sl.write(ev)
    sl.write({"aep": "0.1", "agent": "codex", "type": "agent.heartbeat"})
    sl.close()
    for s in range(3):
        lines = (tmp_path / "codex" / f"s{s}.jsonl").read_text().splitlines()
        assert [json.loads(x)["seq"] for x in lines] == [i for i in range(9) if i % 3 == s]
    assert (tmp_path / "codex" / "_agent.jsonl").exists()
    assert sl.lines == 10 and sl.errors == 0


def test_unwritable_dir_counts_errors_and_does_not_raise(tmp_path):
    (tmp_path / "codex").write_text("a file where the agent dir should be")
    sl = SessionLog(tmp_path)
    sl.write({"agent": "codex", "session": "s"})
    sl.write({"agent": "codex", "session": "s"})
    assert sl.errors == 2 and sl.lines == 0


def test_files_are_private(tmp_path):
    sl = SessionLog(tmp_path)
    sl.write({"agent": "a", "session": "s"})
    sl.close()
    assert os.stat(tmp_path / "a" / "s.jsonl").st_mode & 0o077 == 0
