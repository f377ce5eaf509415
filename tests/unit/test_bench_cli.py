"""``python -m benchmarks`` (``scripts/dev bench``): an unknown option is an
error before anything runs (a fresh-user review: ``--help`` and a typo both
started the whole ~5-minute run)."""
from __future__ import annotations

import importlib

import pytest

bench_main = importlib.import_module("benchmarks.__main__")


@pytest.mark.parametrize("argv", [["--quik"], ["otlp", "--fast"], ["-q"]])
def test_an_unknown_option_runs_nothing(argv, monkeypatch, capsys) -> None:
    ran: list[str] = []
    monkeypatch.setattr(bench_main.importlib, "import_module", lambda name: ran.append(name))
    assert bench_main.main(argv) == 2
    assert ran == []
    assert "unknown option" in capsys.readouterr().err


def test_help_lists_the_benchmarks_and_runs_nothing(monkeypatch, capsys) -> None:
    ran: list[str] = []
    monkeypatch.setattr(bench_main.importlib, "import_module", lambda name: ran.append(name))
    assert bench_main.main(["--help"]) == 0
    out = capsys.readouterr().out
    assert ran == [] and "otlp" in out and "--quick" in out
