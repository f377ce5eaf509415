"""NATS credentials against a real nats-server (issue 14: "NATS credentials
(``AEP_NATS_CREDS``, TLS) are supported and never logged"), through the
real code path: :func:`supervisor.jetstream.link.open_link`, the Fleet's
JetStream sink, and ``aep-bridges check`` as a subprocess.

- ``user:password@`` in ``AEP_NATS_URL`` against ``authorization { user,
  password }``: publishes; a wrong password is refused with a redacted
  line; the password is in no captured log line nor ``check`` output.
- TLS with a throwaway CA made by ``openssl`` in ``tmp_path``: ``tls://``
  + ``AEP_NATS_TLS_CA`` publishes; without the CA the certificate
  verification failure is reported (not a hang); mutual TLS (``verify:
  true``) with ``AEP_NATS_TLS_CERT``/``KEY`` works and is refused without.
- ``AEP_NATS_CREDS``: an operator-mode server (operator, account and user
  JWTs signed offline with the ``nkeys`` package, memory resolver); the
  ``.creds`` file publishes, a user signed by another account is refused,
  and the seed never appears in a log line.
"""
from __future__ import annotations

import base64
import hashlib
import json
import logging
import os
import subprocess
import time
from pathlib import Path

import nkeys
import pytest
import trio

from supervisor.jetstream.link import open_link
from tests.integration.jetstream.fleet_support import (
    BurstBridge,
    decoded,
    nats_config,
    running_fleet,
    wait_published,
)
from tests.integration.jetstream.test_daemon import _check
from tests.support.nats import NatsCluster, stream_messages

OPENSSL = "/usr/bin/openssl"
PASSWORD = "pa55-W0rd-not-logged"


async def _publish_through_fleet(tmp_path: Path, url: str, n: int = 12, **env: str) -> list[dict]:
    """``n`` events through the real Fleet's JetStream sink on ``url``,
    read back from the stream with a second link of the same config."""
    bridge = BurstBridge(n, sessions=2)
    async with running_fleet(tmp_path, [bridge], url, **env) as fleet:
        await bridge.done.wait()
        await wait_published(fleet, n)
        async with open_link(fleet.cfg.nats) as link:
            msgs = await stream_messages(link, "AEP")
    events = decoded(msgs)
    assert sorted((e["source"], e["id"]) for e in events) == \
        sorted((e["source"], e["id"]) for e in bridge.emitted)
    return events


async def _refused(url: str, seconds: float = 4.0, **env: str) -> None:
    """``open_link`` on a server that refuses us: it keeps retrying (a
    daemon started before its credentials are fixed stays up), so it must
    not yield within ``seconds``."""
    with trio.move_on_after(seconds) as scope:
        async with open_link(nats_config(url, **env)):
            pytest.fail("open_link connected with credentials the server refuses")
    assert scope.cancelled_caught


# -- user:password ---------------------------------------------------------------------------

def _userpass_cluster(tmp_path: Path) -> NatsCluster:
    return NatsCluster(1, tmp_path / "nats",
                       extra_conf=[f'authorization {{ user: aep, password: "{PASSWORD}" }}'])


async def test_user_password_in_the_url_publishes_and_is_never_logged(tmp_path, caplog) -> None:
    caplog.set_level(logging.DEBUG)
    with _userpass_cluster(tmp_path) as c:
        url = c.url.replace("nats://", f"nats://aep:{PASSWORD}@")
        events = await _publish_through_fleet(tmp_path, url)
        assert len(events) == 12
        ok = _check({"AEP_STATE_DIR": str(tmp_path / "state"), "AEP_NATS_URL": url})
    assert ok.returncode == 0, ok.stderr
    assert "answers, JetStream on, stream AEP holds 12 events" in ok.stdout
    assert "nats://***@127.0.0.1:" in ok.stdout
    assert "nats: connected to nats://***@127.0.0.1:" in caplog.text
    assert PASSWORD not in caplog.text and PASSWORD not in ok.stdout + ok.stderr


async def test_a_wrong_password_is_refused_with_a_redacted_line(tmp_path, caplog) -> None:
    caplog.set_level(logging.DEBUG)
    wrong = "wr0ng-" + PASSWORD
    with _userpass_cluster(tmp_path) as c:
        url = c.url.replace("nats://", f"nats://aep:{wrong}@")
        await _refused(url)
        await _refused(c.url)  # no credentials at all
        bad = _check({"AEP_STATE_DIR": str(tmp_path / "state"), "AEP_NATS_URL": url})
    retry = [r.getMessage() for r in caplog.records
             if r.name == "aep.nats" and r.levelno >= logging.WARNING]
    assert retry, caplog.text
    assert any("nats://***@127.0.0.1:" in m and "authorization violation" in m.lower()
               for m in retry), retry
    assert bad.returncode == 0, bad.stderr
    assert "nats://***@127.0.0.1:" in bad.stdout and "authorization violation" in bad.stdout.lower()
    assert wrong not in caplog.text and wrong not in bad.stdout + bad.stderr
    assert PASSWORD not in caplog.text


# -- TLS -------------------------------------------------------------------------------------

def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run([OPENSSL, *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def make_pki(root: Path) -> dict[str, Path]:
    """A throwaway CA and a server (SAN ``IP:127.0.0.1``) and a client
    certificate it signs, P-256 keys, valid two days: paths by name
    (``ca``, ``server``, ``server_key``, ``client``, ``client_key``, and
    ``other_ca``, a CA that signed neither)."""
    root.mkdir(parents=True, exist_ok=True)
    ec = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")
    for ca in ("ca", "other_ca"):
        _openssl("req", "-x509", *ec, "-keyout", f"{ca}.key", "-out", f"{ca}.pem", "-days", "2",
                 "-subj", f"/CN=aep-test-{ca}", "-addext", "basicConstraints=critical,CA:TRUE",
                 "-addext", "keyUsage=critical,keyCertSign,cRLSign", cwd=root)
    exts = {"server": "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n",
            "client": "extendedKeyUsage=clientAuth\n"}
    for who, ext in exts.items():
        (root / f"{who}.ext").write_text(ext + "basicConstraints=CA:FALSE\n")
        _openssl("req", *ec, "-keyout", f"{who}.key", "-out", f"{who}.csr", "-subj", f"/CN={who}",
                 cwd=root)
        _openssl("x509", "-req", "-in", f"{who}.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
                 "-CAcreateserial", "-out", f"{who}.pem", "-days", "2", "-extfile", f"{who}.ext",
                 cwd=root)
    return {"ca": root / "ca.pem", "other_ca": root / "other_ca.pem",
            "server": root / "server.pem", "server_key": root / "server.key",
            "client": root / "client.pem", "client_key": root / "client.key"}


def _tls_cluster(tmp_path: Path, pki: dict[str, Path], *, verify: bool = False) -> NatsCluster:
    conf = (f'tls {{ cert_file: "{pki["server"]}", key_file: "{pki["server_key"]}", '
            f'ca_file: "{pki["ca"]}", verify: {"true" if verify else "false"}, timeout: 2 }}')
    return NatsCluster(1, tmp_path / "nats", extra_conf=[conf])


async def test_tls_with_the_ca_publishes_and_without_it_verification_fails(tmp_path, caplog) -> None:
    caplog.set_level(logging.DEBUG)
    pki = make_pki(tmp_path / "pki")
    with _tls_cluster(tmp_path, pki) as c:
        url = c.url.replace("nats://", "tls://")
        events = await _publish_through_fleet(tmp_path, url, AEP_NATS_TLS_CA=str(pki["ca"]))
        assert len(events) == 12
        # a CA that did not sign the server's certificate: refused, said, no hang
        await _refused(url, AEP_NATS_TLS_CA=str(pki["other_ca"]))
        state = {"AEP_STATE_DIR": str(tmp_path / "state")}
        ok = _check({**state, "AEP_NATS_URL": url, "AEP_NATS_TLS_CA": str(pki["ca"])})
        # a hang would be _check's subprocess timeout (60 s), an error here
        bad = _check({**state, "AEP_NATS_URL": url, "AEP_NATS_TLS_CA": str(pki["other_ca"])})
    assert ok.returncode == 0 and "answers, JetStream on, stream AEP holds 12 events" in ok.stdout, \
        ok.stdout + ok.stderr
    assert bad.returncode == 0 and "no server of tls://127.0.0.1:" in bad.stdout
    assert "certificate verify failed" in bad.stdout, bad.stdout
    retry = [r.getMessage() for r in caplog.records
             if r.name == "aep.nats" and r.levelno >= logging.WARNING]
    assert any("certificate verify failed" in m for m in retry), retry


async def test_mutual_tls_needs_the_client_certificate(tmp_path, caplog) -> None:
    caplog.set_level(logging.DEBUG)
    pki = make_pki(tmp_path / "pki")
    mtls = {"AEP_NATS_TLS_CA": str(pki["ca"]), "AEP_NATS_TLS_CERT": str(pki["client"]),
            "AEP_NATS_TLS_KEY": str(pki["client_key"])}
    with _tls_cluster(tmp_path, pki, verify=True) as c:
        url = c.url.replace("nats://", "tls://")
        events = await _publish_through_fleet(tmp_path, url, **mtls)
        assert len(events) == 12
        await _refused(url, AEP_NATS_TLS_CA=str(pki["ca"]))
        state = {"AEP_STATE_DIR": str(tmp_path / "state")}
        ok = _check({**state, "AEP_NATS_URL": url, **mtls})
        bad = _check({**state, "AEP_NATS_URL": url, "AEP_NATS_TLS_CA": str(pki["ca"])})
    assert ok.returncode == 0 and "answers, JetStream on" in ok.stdout, ok.stdout + ok.stderr
    assert bad.returncode == 0 and "no server of tls://127.0.0.1:" in bad.stdout, bad.stdout
    # TLS 1.3: the client's handshake ends before the server checks the
    # client certificate, so the refusal reaches the client either as the
    # server's alert or as the socket it closed under the CONNECT (a race)
    assert "certificate required" in bad.stdout.lower() or "Broken pipe" in bad.stdout \
        or "reset by peer" in bad.stdout, bad.stdout
    retry = [r.getMessage() for r in caplog.records
             if r.name == "aep.nats" and r.levelno >= logging.WARNING]
    assert any(m.startswith("nats: cannot connect to tls://127.0.0.1:") for m in retry), retry
    key = pki["client_key"].read_text().splitlines()[1]
    assert key not in caplog.text and key not in ok.stdout + bad.stdout


# -- .creds (operator mode: JWT + NKey seed) -------------------------------------------------

def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


class _Key:
    """A fresh NKey of one kind (``nkeys.PREFIX_BYTE_*``): ``seed``
    (``S...``), ``public`` (``O...``/``A...``/``U...``), ``sign``."""

    def __init__(self, prefix: int) -> None:
        self.seed = nkeys.encode_seed(os.urandom(32), prefix)
        self._kp = nkeys.from_seed(bytearray(self.seed))
        self.public = self._kp.public_key.decode()

    def sign(self, data: bytes) -> bytes:
        return self._kp.sign(data)


def _jwt(issuer: _Key, subject: str, name: str, nats_claims: dict) -> str:
    """A NATS v2 JWT (``ed25519-nkey``) for ``subject`` signed by ``issuer``."""
    claims = {"iat": int(time.time()), "iss": issuer.public, "name": name, "sub": subject,
              "nats": {**nats_claims, "version": 2}}
    claims["jti"] = base64.b32encode(hashlib.sha256(json.dumps(claims, sort_keys=True)
                                                    .encode()).digest()).decode().rstrip("=")
    head = _b64(json.dumps({"typ": "JWT", "alg": "ed25519-nkey"}).encode())
    body = _b64(json.dumps(claims).encode())
    return f"{head}.{body}.{_b64(issuer.sign(f'{head}.{body}'.encode()))}"


ACCOUNT_LIMITS = {"subs": -1, "data": -1, "payload": -1, "imports": -1, "exports": -1,
                  "wildcards": True, "conn": -1, "leaf": -1,
                  "mem_storage": -1, "disk_storage": -1, "streams": -1, "consumer": -1}


def make_operator(root: Path) -> tuple[list[str], Path, Path, str]:
    """An operator, an account with JetStream (unlimited), a user of it,
    and a second account's user the server does not know: ``(server
    config lines, good .creds, stranger .creds, the good user's seed)``."""
    root.mkdir(parents=True, exist_ok=True)
    op = _Key(nkeys.PREFIX_BYTE_OPERATOR)
    acc, other = _Key(nkeys.PREFIX_BYTE_ACCOUNT), _Key(nkeys.PREFIX_BYTE_ACCOUNT)
    sys_acc = _Key(nkeys.PREFIX_BYTE_ACCOUNT)  # JetStream needs a system account
    op_jwt = _jwt(op, op.public, "aep-test-op", {"type": "operator",
                                                 "system_account": sys_acc.public})
    sys_jwt = _jwt(op, sys_acc.public, "SYS", {"type": "account"})
    acc_jwt = _jwt(op, acc.public, "AEP", {"type": "account", "limits": ACCOUNT_LIMITS,
                                           "default_permissions": {"pub": {}, "sub": {}}})
    paths = []
    for name, issuer in (("aep", acc), ("stranger", other)):
        user = _Key(nkeys.PREFIX_BYTE_USER)
        jwt = _jwt(issuer, user.public, name, {"type": "user", "pub": {}, "sub": {},
                                               "subs": -1, "data": -1, "payload": -1})
        p = root / f"{name}.creds"
        p.write_text("-----BEGIN NATS USER JWT-----\n" f"{jwt}\n" "------END NATS USER JWT------\n\n"
                     "-----BEGIN USER NKEY SEED-----\n" f"{user.seed.decode()}\n"
                     "------END USER NKEY SEED------\n")
        p.chmod(0o600)
        paths.append((p, user.seed.decode()))
    conf = [f'operator: "{op_jwt}"', f"system_account: {sys_acc.public}", "resolver: MEMORY",
            f'resolver_preload: {{ {acc.public}: "{acc_jwt}", {sys_acc.public}: "{sys_jwt}" }}']
    return conf, paths[0][0], paths[1][0], paths[0][1]


async def test_a_creds_file_publishes_in_operator_mode_and_a_stranger_is_refused(
        tmp_path, caplog) -> None:
    caplog.set_level(logging.DEBUG)
    conf, creds, stranger, seed = make_operator(tmp_path / "op")
    with NatsCluster(1, tmp_path / "nats", extra_conf=conf) as c:
        events = await _publish_through_fleet(tmp_path, c.url, AEP_NATS_CREDS=str(creds))
        assert len(events) == 12
        await _refused(c.url, AEP_NATS_CREDS=str(stranger))
        await _refused(c.url)  # no credentials at all
        state = {"AEP_STATE_DIR": str(tmp_path / "state")}
        ok = _check({**state, "AEP_NATS_URL": c.url, "AEP_NATS_CREDS": str(creds)})
        bad = _check({**state, "AEP_NATS_URL": c.url, "AEP_NATS_CREDS": str(stranger)})
    assert ok.returncode == 0 and "answers, JetStream on, stream AEP holds 12 events" in ok.stdout, \
        ok.stdout + ok.stderr
    assert bad.returncode == 0 and "no server of nats://127.0.0.1:" in bad.stdout, bad.stdout
    assert "authorization violation" in bad.stdout.lower(), bad.stdout
    retry = [r.getMessage() for r in caplog.records
             if r.name == "aep.nats" and r.levelno >= logging.WARNING]
    assert any("authorization violation" in m.lower() for m in retry), retry
    jwt_body = creds.read_text().splitlines()[1].split(".")[1]
    for secret in (seed, jwt_body):
        assert secret not in caplog.text and secret not in ok.stdout + ok.stderr + bad.stdout
