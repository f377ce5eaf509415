"""The tail's saved position (:mod:`supervisor.tools.resume`): one file per
endpoint under the state directory; a bad file reads as none."""
from __future__ import annotations

from supervisor.tools.resume import MAX_POSITIONS, load, position_file, save


def test_one_file_per_endpoint_under_the_state_dir(tmp_path):
    env = {"AEP_STATE_DIR": str(tmp_path)}
    a = position_file("http://127.0.0.1:8787", env)
    assert a.parent == tmp_path / "tail" and a.name.startswith("127.0.0.1_8787-")
    assert a == position_file("http://127.0.0.1:8787/", env)
    assert a != position_file("http://127.0.0.1:8788", env)
    assert a != position_file("https://127.0.0.1:8787", env)


def test_round_trip_and_bad_files(tmp_path):
    f = tmp_path / "tail" / "x.json"
    assert load(f) == []
    good = {"session": "s", "epoch": 1, "seq": 4}
    save(f, "http://x", [good, {"session": "", "seq": 1}, {"session": "t", "seq": -1},
                         {"session": "u", "epoch": True, "seq": 2}])
    assert load(f) == [good]
    for text in ("", "{", "[]", '{"positions": {}}', '{"positions": [1, "a", null]}'):
        f.write_text(text)
        assert load(f) == []
    save(f, "http://x", [{"session": f"s{i}", "seq": i} for i in range(MAX_POSITIONS + 5)])
    kept = load(f)
    assert len(kept) == MAX_POSITIONS and kept[-1]["session"] == f"s{MAX_POSITIONS + 4}"


def test_the_save_time_is_kept_and_an_older_file_gives_its_mtime(tmp_path):
    import json
    import os

    from supervisor.tools.resume import load_saved
    f = tmp_path / "tail" / "x.json"
    assert load_saved(f) is None  # no file: the tail starts live
    save(f, "http://x", [], saved_at=1_800_000_000.5)
    assert load_saved(f) == ([], 1_800_000_000.5)  # a position with no session is still one
    f.write_text(json.dumps({"url": "http://x", "positions": [{"session": "s", "seq": 1}]}))
    os.utime(f, (1_700_000_000, 1_700_000_000))
    assert load_saved(f) == ([{"session": "s", "epoch": 0, "seq": 1}], 1_700_000_000)
    f.write_text("{")
    assert load_saved(f) is None
