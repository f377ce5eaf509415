"""Issue 10 #4: gzip bodies inflate in linear time with a member cap."""
from __future__ import annotations

import gzip

import pytest

from bridges.otlp_in.decode import MAX_GZIP_MEMBERS, gunzip_capped
from bridges.otlp_in.status import BadRequest


def test_a_body_of_many_empty_members_is_refused_by_the_member_cap():
    with pytest.raises(BadRequest) as e:
        gunzip_capped(gzip.compress(b"") * 209715, 4 << 20)
    assert e.value.status == 400 and "members" in e.value.message


def test_members_up_to_the_cap_inflate_in_order():
    parts = [f"part{i};".encode() for i in range(MAX_GZIP_MEMBERS)]
    body = b"".join(gzip.compress(p) for p in parts) + b"\0" * 16
    assert gunzip_capped(body, 1 << 20) == b"".join(parts)


def test_the_member_walk_handles_every_split_of_small_and_large_members():
    import os
    big = os.urandom(300_000)
    body = gzip.compress(b"a") + gzip.compress(big) + gzip.compress(b"") + gzip.compress(b"z")
    assert gunzip_capped(body, 1 << 20) == b"a" + big + b"z"
    assert gunzip_capped(gzip.compress(b"") * 10_000, 10, max_members=10_000) == b""


@pytest.mark.parametrize("cut", [1, 5, 11])
def test_a_truncated_member_is_refused(cut):
    body = gzip.compress(b"hello world") * 2
    with pytest.raises(BadRequest) as e:
        gunzip_capped(body[:-cut], 1000)
    assert e.value.status == 400
