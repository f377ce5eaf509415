"""Where the tee proxy sends a request (issue 25 row 1): the upstream's
scheme, host, port and userinfo are fixed, the target only supplies a path
below its prefix; ``..`` above the prefix (percent-encoded too) is refused.
Plus hypothesis: whatever the target, what is forwarded stays below the
prefix even for a server that decodes and resolves it again."""
from __future__ import annotations

import base64
import posixpath
import urllib.parse

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st

from bridges.agui.target import BadTarget, Upstream, forward_path, shown_url

UP = Upstream.parse("http://agent:pa%3Ass@127.0.0.1:8000/base/")


@pytest.mark.parametrize("target", [
    b"@127.0.0.1:9/x", b"http://127.0.0.1:9/x", b"*", b"", b"127.0.0.1:9",
    b"/..", b"/../x", b"/a/../../x", b"/%2e%2e/x", b"/%2E%2E/x", b"/%2e./x", b"/.%2E/x",
    b"/a/%2e%2e/%2E%2e/x", b"/..%2fx", b"/..%2Fx", b"/..%5cx", b"/..\\x", b"/a\\..\\..\\x",
    b"/%252e%252e/x", b"/%25252e%25252e/x",
])
def test_a_target_that_leaves_the_prefix_or_names_a_host_is_refused(target):
    with pytest.raises(BadTarget):
        UP.url(target)


@pytest.mark.parametrize("target,path", [
    (b"/", b"/base/"), (b"/run", b"/base/run"), (b"/a//b", b"/base/a//b"),
    (b"/a/./b", b"/base/a/b"), (b"/a/../b", b"/base/b"), (b"/a/..", b"/base/"),
    (b"/a/.", b"/base/a/"), (b"/a/%2e%2e/b", b"/base/b"), (b"/run%20x", b"/base/run%20x"),
    (b"/...", b"/base/..."), (b"/a..b/.x", b"/base/a..b/.x"), (b"//127.0.0.1:9/x", b"/base//127.0.0.1:9/x"),
])
def test_a_path_below_the_prefix_is_forwarded_resolved(target, path):
    url = UP.url(target, b"q=1&r=@h:9")
    assert (url.scheme, url.host, url.port, url.userinfo) == ("http", "127.0.0.1", 8000, b"")
    assert url.raw_path == path + b"?q=1&r=@h:9"


def test_the_userinfo_becomes_basic_credentials_and_is_never_shown():
    assert UP.origin == httpx.URL("http://127.0.0.1:8000/") and UP.prefix == b"/base"
    request = httpx.Request("GET", UP.url(b"/x"))
    assert UP.auth is not None
    sent = next(UP.auth.auth_flow(request))
    assert sent.headers["authorization"] == "Basic " + base64.b64encode(b"agent:pa:ss").decode()
    assert UP.shown == "http://***@127.0.0.1:8000/base/" and "pa" not in UP.shown
    assert UP.probe_url() == httpx.URL("http://127.0.0.1:8000/base/")
    assert Upstream.parse("http://127.0.0.1:8000").auth is None
    assert shown_url("http://u:p@h:1/x") == "http://***@h:1/x"
    assert shown_url("http://h:1/x") == "http://h:1/x"


def _resolved_by_a_lenient_server(path: bytes) -> str:
    """What a server that decodes everything (twice), treats ``\\`` as
    ``/`` and resolves dot segments would route."""
    text = path.decode("latin-1")
    for _ in range(3):
        text = urllib.parse.unquote(text, encoding="latin-1")
    return posixpath.normpath(text.replace("\\", "/")).replace("//", "/")


segment = st.sampled_from([".", "..", "%2e", "%2E%2e", "%2e.", "a", "%2f", "%5c", "\\", "%25",
                           "2e", "", "x y", "@h:9", "%252e"])


@given(st.lists(segment, max_size=8).map(lambda parts: "/" + "/".join(parts)))
def test_whatever_the_target_what_is_forwarded_stays_below_the_prefix(target):
    try:
        path = forward_path(target.encode("latin-1"))
    except BadTarget:
        return
    assert path.startswith(b"/")
    routed = _resolved_by_a_lenient_server(b"/base" + path)
    assert routed == "/base" or routed.startswith("/base/"), (target, path, routed)
