"""The client commands' endpoint (``tail``, ``respond``, ``cancel``,
``pause``, ``resume``): the URL and token from ``--config`` / ``AEP_CONFIG``
with ``run``'s precedence (the environment over the file, a flag over
both), the hint when nothing listens, ``respond``'s unreachable lookup
(exit 1), the state directory's lock probe, and ``validate``'s label of a
line that is no AEP event."""
from __future__ import annotations

import argparse
import io
import os

import pytest

from supervisor import cli, cliconfig, clientcli
from supervisor.sessionlog.statelock import LOCK_FILE, StateDirBusy, hold, probe
from supervisor.tools.tail import default_url
from supervisor.tools.tailstream import ELSEWHERE_HINT, refused
from tests.support.net import free_port


@pytest.fixture
def environ(monkeypatch):
    """A process environment of the test's own (``apply_settings`` writes
    the file's values into it), with no AEP_* setting."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AEP_")}
    monkeypatch.setattr(os, "environ", env)
    return env


def endpoint(config: str | None = None, *, url: str | None = None,
             token: str | None = None) -> tuple[int | None, str, str | None]:
    args = argparse.Namespace(config=config, env_file=None, url=url, token=token)
    refused_status = cliconfig.apply_settings(args)[0]
    return (refused_status, *clientcli.endpoint(args))


def conf(tmp_path, text: str) -> str:
    path = tmp_path / "config.toml"
    path.write_text(text)
    path.chmod(0o600)
    return str(path)


FILE = 'AEP_LISTEN = "127.0.0.1:18787"\nAEP_TOKEN = "file-token-0123456789abcdef"\n'


def test_the_config_file_gives_the_url_and_the_token(environ, tmp_path):
    assert endpoint(conf(tmp_path, FILE)) == (None, "http://127.0.0.1:18787",
                                              "file-token-0123456789abcdef")


def test_aep_config_in_the_environment_is_read_too(environ, tmp_path):
    environ["AEP_CONFIG"] = conf(tmp_path, FILE)
    assert endpoint() == (None, "http://127.0.0.1:18787", "file-token-0123456789abcdef")


def test_the_environment_wins_over_the_file_and_a_flag_over_both(environ, tmp_path):
    path = conf(tmp_path, FILE)
    environ["AEP_LISTEN"] = "127.0.0.1:9999"
    environ["AEP_TOKEN"] = "env-token-0123456789abcdef"
    assert endpoint(path) == (None, "http://127.0.0.1:9999", "env-token-0123456789abcdef")
    assert endpoint(path, url="http://10.0.0.5:1", token="flag") == (None, "http://10.0.0.5:1",
                                                                    "flag")
    assert endpoint(path, token="")[2] == ""  # an explicit empty token wins too: none sent


def test_a_wildcard_listen_address_is_reached_on_loopback():
    assert default_url({"AEP_LISTEN": "0.0.0.0:18787"}) == "http://127.0.0.1:18787"
    assert default_url({"AEP_LISTEN": "[::]:18787"}) == "http://[::1]:18787"
    assert default_url({"AEP_LISTEN": ":::18787"}) == "http://[::1]:18787"
    assert default_url({"AEP_LISTEN": "[::1]:18787"}) == "http://[::1]:18787"
    assert default_url({"AEP_LISTEN": "10.0.0.5:8787"}) == "http://10.0.0.5:8787"


def test_a_misspelt_name_gets_the_did_you_mean_and_a_bad_file_refuses(environ, tmp_path,
                                                                        capsys):
    status, url, _ = endpoint(conf(tmp_path, 'AEP_LISTN = "127.0.0.1:1"\n'))
    assert status is None and url == "http://127.0.0.1:8787"
    assert "did you mean AEP_LISTEN?" in capsys.readouterr().err
    assert endpoint(conf(tmp_path, "AEP_LISTEN = [\n"))[0] == 2
    assert "not TOML" in capsys.readouterr().err


def test_every_client_command_takes_config(environ, tmp_path, capsys):
    # a malformed file refuses each one (exit 2) before it dials anything
    bad = conf(tmp_path, "AEP_LISTEN = [\n")
    for argv in (["tail"], ["respond", "REQ", "--option", "once"], ["cancel", "s1"],
                 ["pause", "s1"], ["resume", "s1"]):
        assert cli.main([*argv, "--config", bad]) == 2, argv
        assert "not TOML" in capsys.readouterr().err, argv


def test_a_refused_connection_is_known_by_its_cause_or_its_words():
    from aep_sdk import TransportError
    assert refused(ConnectionRefusedError(111, "Connection refused"))
    assert refused(TransportError("network", "[Errno 111] Connection refused"))
    wrapped = TransportError("network", "connect failed")
    wrapped.__cause__ = ConnectionRefusedError()
    assert refused(wrapped)
    assert not refused(TransportError("http", "SSE HTTP 503", status=503))
    assert not refused(TimeoutError("timed out"))


class Refusals:
    """A subscription that reports ``n`` refused connections, then an event."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __call__(self, url, on_event, *, on_error, on_comment, **kw):
        from aep_sdk import TransportError
        for _ in range(self.n):
            on_error(TransportError("network", "[Errno 111] Connection refused"))
        on_event({"id": "1", "type": "x.v.t", "agent": "a", "data": {}})
        return self

    def close(self) -> None:
        pass


def test_tail_says_where_to_look_once_when_nothing_listens():
    from supervisor.tools.tail import run
    err = io.StringIO()
    assert run("http://127.0.0.1:1", limit=1, out=io.StringIO(), err=err,
               subscribe=Refusals(3)) == 0
    lines = [line for line in err.getvalue().splitlines() if "retrying" in line]
    assert len(lines) == 3 and sum(ELSEWHERE_HINT in line for line in lines) == 1, lines
    assert ELSEWHERE_HINT in lines[0]


def test_respond_to_nothing_listening_says_where_to_look(environ, capsys):
    url = f"http://127.0.0.1:{free_port()}"
    from supervisor.tools import control
    err = io.StringIO()
    assert control.send(url, None, control.pause("s1"), out=io.StringIO(), err=err) == 1
    assert f"cannot reach {url}" in err.getvalue() and ELSEWHERE_HINT in err.getvalue()
    # the request id alone: the lookup cannot connect, so exit 1, not "holds no ..." (2)
    assert cli.main(["respond", "--url", url, "REQ1", "--option", "once"]) == 1
    text = capsys.readouterr().err
    assert f"cannot reach {url} (is the daemon running? --url URL, or --config FILE)" in text
    assert "holds no attention.requested" not in text


def test_the_lock_probe_sees_a_holder_and_never_takes_the_lock(tmp_path):
    probe(tmp_path)  # no lock file: free, and none made
    assert not (tmp_path / LOCK_FILE).exists()
    held = hold(tmp_path)
    try:
        with pytest.raises(StateDirBusy) as e:
            probe(tmp_path)
        assert e.value.pid == os.getpid()
        what, fix = e.value.refusal()
        assert what == f"AEP_STATE_DIR={str(tmp_path)!r}: in use by aep-bridges pid {os.getpid()}"
        assert fix == "stop it first, or give this daemon a state directory of its own"
        assert (tmp_path / LOCK_FILE).read_text() == f"{os.getpid()}\n"  # the probe wrote nothing
    finally:
        held.release()
    probe(tmp_path)  # free again
    hold(tmp_path).release()  # and the probe left nothing held

