"""Suite-wide settings.

Hypothesis: no deadline and no "too slow" health check. Both are timing
assertions, and these machines are noisy. The first test that draws text
in a fresh checkout also builds Hypothesis's Unicode cache (over a second).
Run alone, as ``scripts/dev test tests/unit/supervisor/test_tail.py`` does,
that test failed its first run on ``FailedHealthCheck``. Every property
still runs its examples and still fails on a counterexample.

Two Hypothesis profiles (the Hypothesis docs' pattern): ``aep``, the
default, runs every property's full ``max_examples`` (CI, and a plain
``pytest``); ``dev`` (``--hypothesis-profile=dev``, what ``scripts/dev
test`` passes unless ``CI`` is set) runs each at a :data:`DEV_DIVISOR`-th
of its examples, at least :data:`MIN_EXAMPLES`. ``--quick-properties``
(``scripts/dev test --unit``) a :data:`QUICK_DIVISOR`-th."""
from __future__ import annotations

import os
import sys
from typing import Any

import pytest
from hypothesis import HealthCheck, settings

MIN_EXAMPLES = 20
"""No property runs fewer examples than this, whatever the profile."""
DEV_DIVISOR = 5
"""The ``dev`` profile's share of each property's examples (issue 29:
measured, the full properties were ~260 of the suite's 919 CPU seconds)."""
QUICK_DIVISOR = 10
"""``--quick-properties``' share (the unit-only loop)."""

settings.register_profile("aep", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("dev", settings.get_profile("aep"),
                          max_examples=max(MIN_EXAMPLES, settings.default.max_examples // DEV_DIVISOR))
settings.load_profile("aep")


def _one_default_ssl_context() -> None:
    """httpx builds a new default SSL context for every client (certifi's
    CA bundle parsed: ~23 ms of CPU), and ``httpx.get``/``post`` make a
    client per call. The suite talks plain HTTP to loopback, polling
    (``/healthz`` every 0.1 s while a daemon starts, a stream read per
    check): that parsing was a large share of the test processes' CPU
    (issue 29). Here a test process builds the default context once and
    hands the same one to every client that asks for the default
    (``verify=True``, no ``cert``; one per ``SSL_CERT_FILE``/``SSL_CERT_DIR``
    pair, which httpx reads); any other ``verify`` goes to httpx as given. The daemons and CLIs the tests start
    are untouched."""
    from httpx._transports import default as transports

    made = transports.create_ssl_context
    shared: dict[tuple[str, str], Any] = {}

    def create_ssl_context(verify: Any = True, cert: Any = None, trust_env: bool = True) -> Any:
        if verify is not True or cert is not None:
            return made(verify=verify, cert=cert, trust_env=trust_env)
        # the default context reads SSL_CERT_FILE / SSL_CERT_DIR when trust_env
        env = os.environ if trust_env else {}
        key = (env.get("SSL_CERT_FILE", ""), env.get("SSL_CERT_DIR", ""))
        if key not in shared:
            shared[key] = made(verify=verify, cert=cert, trust_env=trust_env)
        return shared[key]

    transports.create_ssl_context = create_ssl_context  # type: ignore[assignment]


_one_default_ssl_context()


@pytest.hookimpl(tryfirst=True)
def pytest_sessionstart(session: pytest.Session) -> None:
    """The vendors the selected tests need, installed before any test runs
    (:mod:`tests.support.prepare`): in the controller only, so with ``-n``
    it runs once, before the workers start."""
    config = session.config
    if hasattr(config, "workerinput") or config.option.collectonly:
        return
    from tests.support.prepare import prepare
    reporter = config.pluginmanager.get_plugin("terminalreporter")

    def say(line: str) -> None:
        if reporter is not None:
            reporter.write_line(line)
        else:
            print(line, file=sys.stderr, flush=True)
    prepare(config.args, say=say)


@pytest.hookimpl(optionalhook=True, tryfirst=True)
def pytest_xdist_auto_num_workers(config: pytest.Config) -> int | None:
    """``-n auto`` (what ``scripts/dev test`` passes): no workers for a run
    of one test file (starting workers costs more than it saves), else
    :func:`tests.support.parallel.workers`. ``PYTEST_XDIST_AUTO_NUM_WORKERS``
    still wins (xdist's own override)."""
    if os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS"):
        return None  # xdist's implementation reads it
    from tests.support.parallel import workers
    return workers(config.args)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--quick-properties", action="store_true", default=False,
        help=f"each Hypothesis property test runs a {QUICK_DIVISOR}th of its examples (at "
             f"least {MIN_EXAMPLES}): the quick loop of `scripts/dev test --unit`; CI runs "
             "them all")
    parser.addoption(
        "--cpu-report", metavar="DIR", default=None,
        help="write each test file's CPU seconds (the test process and the children it "
             "reaped) to DIR/cpu-<worker>.jsonl; `python -m tests.support.cpureport DIR` "
             "sums them (tests/support/cpureport.py)")


def pytest_configure(config: pytest.Config) -> None:
    """``--cpu-report DIR``: the per-file CPU plugin, in every process."""
    out = config.getoption("cpu_report", None)
    if out:
        from pathlib import Path

        from tests.support.cpureport import CpuReport
        worker = getattr(config, "workerinput", {}).get("workerid", "main")
        config.pluginmanager.register(CpuReport(Path(out).resolve(), worker), "aep-cpu-report")


def _divisor(config: pytest.Config) -> int:
    """By how much each property's ``max_examples`` is divided in this run."""
    if config.getoption("quick_properties"):
        return QUICK_DIVISOR
    if settings.get_current_profile_name() == "dev":
        return DEV_DIVISOR
    return 1


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """``--quick-properties`` or the ``dev`` profile: divide each property's
    ``max_examples`` (its own ``@settings`` included, which a profile cannot
    lower), never below :data:`MIN_EXAMPLES`. The assertions are the same;
    only the number of generated inputs shrinks.

    In an xdist worker the files are also put longest first
    (:func:`tests.support.parallel.file_rank`; a stable sort: a file's tests
    keep their order); ``scripts/dev test`` turns xdist's own reordering off."""
    if hasattr(config, "workerinput"):
        from tests.support.parallel import file_rank
        items.sort(key=lambda item: file_rank(item.nodeid.split("::", 1)[0]))
    divisor = _divisor(config)
    if divisor == 1:
        return
    for item in items:
        fn = getattr(item, "obj", None)
        fn = getattr(fn, "__func__", fn)  # a method: the function under it
        current = getattr(fn, "_hypothesis_internal_use_settings", None)
        if current is None or not hasattr(fn, "hypothesis"):
            continue
        fewer = max(MIN_EXAMPLES, current.max_examples // divisor)
        if fewer < current.max_examples:
            fn._hypothesis_internal_use_settings = settings(current, max_examples=fewer)  # type: ignore[union-attr]
