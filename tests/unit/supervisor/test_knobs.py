"""The knob tables of docs/configuration.md and the known-settings list are
generated from the settings metadata (issue 7): a page that drifts from the
metadata fails here (fix: ``python -m supervisor.knobs --write``)."""
from __future__ import annotations

import pytest

from bridges.core.capture import BUILTIN_SECRET_NAMES
from bridges.core.settings import Setting, render_table
from supervisor import config, knobs


def test_the_configuration_page_tables_are_the_metadata():
    assert knobs.PAGE.name == "configuration.md" and knobs.PAGE.parent.name == "docs"
    text = knobs.PAGE.read_text()
    assert knobs.render(text) == text, "knob tables drifted: python -m supervisor.knobs --write"
    assert knobs.main([]) == 0


def test_the_readme_links_the_tables_instead_of_holding_them():
    readme = (knobs.PAGE.parents[1] / "README.md").read_text()
    assert "<!-- knobs:" not in readme
    assert "docs/configuration.md" in readme


def test_a_drifted_page_is_caught_and_rewritten(tmp_path, capsys):
    page = tmp_path / "configuration.md"
    text = knobs.PAGE.read_text()
    assert "| `AEP_BUFFER` | `10000` |" in text
    page.write_text(text.replace("| `AEP_BUFFER` | `10000` |", "| `AEP_BUFFER` | `999` |"))
    assert knobs.main(["--page", str(page)]) == 1
    assert "python -m supervisor.knobs --write" in capsys.readouterr().err
    assert knobs.main(["--page", str(page), "--write"]) == 0
    assert page.read_text() == text


def test_every_owner_has_a_table_and_every_table_an_owner():
    marked = [m["owners"].split(",") for m in knobs.MARKED.finditer(knobs.PAGE.read_text())]
    shown = {o for owners in marked for o in owners}
    assert shown == set(config.all_settings()) - {"dev"}
    with pytest.raises(ValueError, match="unknown"):
        knobs.rows(["nope"])


def test_known_settings_is_every_name_in_the_metadata():
    documented = {s.name for table in config.all_settings().values() for s in table}
    concrete = {n for n in documented if "{" not in n}
    expanded = set().union(*(config.bridge_setting_names(s) for s in config.FLEET))
    assert config.known_settings() == concrete | expanded | {s.flag for s in config.FLEET}
    # a documented name with a {VENDOR} placeholder is known only as its expansions
    assert not any("{" in n for n in config.known_settings())
    assert {"AEP_OTLP_CODEX_GRPC_LISTEN", "AEP_OTLP_VSCODE_HTTP_LISTEN"} <= config.known_settings()
    for spec in config.FLEET:
        assert spec.built == (spec.settings is not None), spec.key


def test_every_secret_in_the_metadata_is_always_redacted():
    secrets = {s.name for table in config.all_settings().values() for s in table if s.secret}
    assert secrets <= set(BUILTIN_SECRET_NAMES)


def test_merged_rows_name_each_profile_and_refuse_different_meanings():
    a, b = Setting("AEP_A_URL", "`x`", "the server"), Setting("AEP_B_URL", "`x`", "the server")
    assert render_table([(a, b)]).splitlines()[2] == "| `AEP_A_URL` / `AEP_B_URL` | `x` | the server |"
    with pytest.raises(ValueError):
        render_table([(a, Setting("AEP_B_URL", "`x`", "another"))])
