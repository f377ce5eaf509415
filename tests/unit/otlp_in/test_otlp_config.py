"""The OTLP bridge's configuration without sockets: good and bad
environments as data (``testdata/config.json``), the settings metadata, and
that :func:`bridges.otlp_in.config.from_env` never raises and never stores a
value of the wrong type (issue 7, "one config shape")."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterator, Mapping

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bridges.core.settings import Setting
from bridges.otlp_in import SETTINGS, config
from bridges.otlp_in.config import SETTING_NAMES, OtlpConfig, check, from_env

CASES = json.loads((Path(__file__).parent / "testdata" / "config.json").read_text())["cases"]


def _addr(v: list[Any] | None) -> tuple[str, int] | None:
    return None if v is None else (v[0], v[1])


def _expected(c: dict[str, Any]) -> OtlpConfig:
    return OtlpConfig(c["vendor"], _addr(c["grpc"]), _addr(c["http"]), c["primary"],
                      c["max_body"], c["grpc_setting"], c["http_setting"])


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_environments(case):
    configs, problems = from_env(case["env"])
    assert list(configs) == [_expected(c) for c in case["configs"]]
    assert problems == case["problems"]


def test_check_of_typed_configs_matches_from_env():
    # a config built in code gets the same lines as one read from the environment
    assert check([OtlpConfig(grpc_listen=None, http_listen=None)]) == [
        "AEP_OTLP_GRPC_LISTEN and AEP_OTLP_HTTP_LISTEN are both off: the codex profile would "
        "receive nothing"]
    assert check([OtlpConfig(max_body=10)]) == [
        "AEP_OTLP_MAX_BODY=10: must be a whole number of bytes, at least 1024"]
    assert check([OtlpConfig("vscode")]) == []


class _Recording(Mapping[str, str]):
    """An environment that records every name looked up."""

    def __init__(self, env: dict[str, str]) -> None:
        self.env, self.read = env, set()

    def __getitem__(self, k: str) -> str:
        self.read.add(k)
        return self.env[k]

    def get(self, k, default=None):  # type: ignore[override]
        self.read.add(k)
        return self.env.get(k, default)

    def __iter__(self) -> Iterator[str]:
        return iter(self.env)

    def __len__(self) -> int:
        return len(self.env)


def test_every_variable_read_is_documented():
    env = _Recording({"AEP_OTLP_VENDOR": "codex,vscode"})
    from_env(env)
    assert env.read <= SETTING_NAMES
    assert {"AEP_OTLP_VSCODE_GRPC_LISTEN", "AEP_OTLP_VSCODE_HTTP_LISTEN"} <= env.read


def test_settings_metadata():
    assert all(isinstance(s, Setting) for s in SETTINGS)
    assert len({s.name for s in SETTINGS}) == len(SETTINGS)
    assert all(s.name.startswith("AEP_OTLP_") and s.meaning and s.default for s in SETTINGS)
    assert not any(s.secret for s in SETTINGS)
    # the documented defaults are the ones from_env applies
    by_name = {s.name: s.default for s in SETTINGS}
    assert by_name[config.GRPC_LISTEN] == f"`{config.DEFAULT_GRPC_LISTEN}`"
    assert by_name[config.HTTP_LISTEN] == f"`{config.DEFAULT_HTTP_LISTEN}`"
    assert by_name[config.VENDOR] == f"`{config.DEFAULT_VENDOR}`"
    assert by_name[config.MAX_BODY] == f"`{config.DEFAULT_MAX_BODY}`"
    assert by_name[config.PRIMARY] == "`1`"  # primary unless said otherwise (issue 29)
    assert SETTING_NAMES == {
        "AEP_OTLP_GRPC_LISTEN", "AEP_OTLP_HTTP_LISTEN", "AEP_OTLP_VENDOR", "AEP_OTLP_PRIMARY",
        "AEP_OTLP_MAX_BODY", "AEP_OTLP_CODEX_GRPC_LISTEN", "AEP_OTLP_CODEX_HTTP_LISTEN",
        "AEP_OTLP_VSCODE_GRPC_LISTEN", "AEP_OTLP_VSCODE_HTTP_LISTEN",
        "AEP_OTLP_MAX_NEW_SESSIONS", "AEP_OTLP_NEW_SESSIONS_PER_S",  # issue 10 #10
        *config.SHARED_SETTINGS}  # daemon-wide, documented in the core table


def test_known_settings_of_the_supervisor_name_the_same_variables():
    from supervisor.config import known_settings
    assert {n for n in known_settings() if n.startswith("AEP_OTLP_")} == \
        SETTING_NAMES - config.SHARED_SETTINGS
    assert config.SHARED_SETTINGS <= known_settings()


_names = st.sampled_from(sorted(SETTING_NAMES) + ["AEP_OTLP_X_GRPC_LISTEN"])


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(_names, st.text(max_size=30)))
def test_from_env_never_raises_and_fields_keep_their_types(env):
    configs, problems = from_env(env)
    assert configs and all(isinstance(p, str) for p in problems)
    for c in configs:
        assert isinstance(c.max_body, int) and isinstance(c.primary, bool)
        for addr in (c.grpc_listen, c.http_listen):
            assert addr is None or (isinstance(addr[0], str) and isinstance(addr[1], int))
    if not problems:  # a config without problems passes its own check
        assert check(configs) == []


def test_configuration_page_rows_are_the_settings_rendered():
    from bridges.core.settings import render_table
    page = (Path(__file__).resolve().parents[3] / "docs" / "configuration.md").read_text()
    documented = [line for line in page.splitlines() if line.startswith("| `AEP_OTLP_")]
    assert documented == render_table(SETTINGS).splitlines()[2:]
