"""The pure frame parser (``bridges/sse_common/frames.py``): the bus and sync
forms the real servers send, the global wrapper, and a defined answer for
every malformed frame (issue section 6)."""
from __future__ import annotations

import json

import pytest

from bridges.sse_common.frames import BusEvent, FrameError, parse_frame
from tests.support.opencode_fixtures import real_frames


def test_bus_form_unwrapped():
    ev = parse_frame(json.dumps({"id": "evt_1", "type": "session.idle",
                                 "properties": {"sessionID": "ses_1"}}))
    assert ev == BusEvent("session.idle", {"sessionID": "ses_1"}, "evt_1", None, "bus")
    assert ev.session == "ses_1"


def test_global_wrapper_carries_the_directory():
    raw = json.dumps({"directory": "/p", "project": "global",
                      "payload": {"id": "evt_2", "type": "session.status",
                                  "properties": {"sessionID": "ses_1",
                                                 "status": {"type": "busy"}}}})
    ev = parse_frame(raw, wrapped=True)
    assert (ev.type, ev.id, ev.directory, ev.session) == ("session.status", "evt_2", "/p", "ses_1")


def test_unwrapped_frame_on_the_global_stream_is_tolerated():
    ev = parse_frame(json.dumps({"type": "server.heartbeat", "properties": {}}), wrapped=True)
    assert ev.type == "server.heartbeat" and ev.id is None


def test_sync_form_normalizes_to_the_bus_event_with_the_same_id():
    """The real servers follow a durable bus event with its sync form
    (same ``evt_`` id, versioned type, ``data`` = properties)."""
    props = {"sessionID": "ses_1", "info": {"id": "msg_1", "role": "user"}}
    raw = json.dumps({"directory": "/p", "payload": {"type": "sync", "syncEvent": {
        "id": "evt_3", "type": "message.updated.1", "seq": 7, "aggregateID": "ses_1",
        "data": props}}})
    ev = parse_frame(raw, wrapped=True)
    assert (ev.type, ev.id, ev.form, ev.properties, ev.directory) == (
        "message.updated", "evt_3", "sync", props, "/p")


@pytest.mark.parametrize("vendor", ["opencode", "kilocode"])
def test_every_captured_sync_frame_repeats_a_bus_event(vendor):
    """In the real captures every sync frame's id belongs to a bus event on
    the same stream, with the same (version-stripped) type and properties."""
    bus, sync = {}, []
    for stream, data in real_frames(vendor):
        ev = parse_frame(data, wrapped=stream.startswith("/global"))
        (sync.append((stream, ev)) if ev.form == "sync" else bus.setdefault((stream, ev.id), ev))
    assert sync, "the capture has sync frames"
    for stream, ev in sync:
        twin = bus[(stream, ev.id)]
        assert (twin.type, twin.properties) == (ev.type, ev.properties)


@pytest.mark.parametrize("data,reason", [
    ("{not json", "not_json"),
    ("[1, 2]", "not_object"),
    ("42", "not_object"),
    ('{"properties": {"sessionID": "s"}}', "no_type"),
    ('{"type": 5}', "no_type"),
    ('{"type": ""}', "no_type"),
    ('{"payload": {"type": "sync", "syncEvent": {"id": "e"}}}', "no_type"),
])
def test_malformed_frames_have_a_defined_reason(data, reason):
    with pytest.raises(FrameError) as e:
        parse_frame(data, wrapped=True)
    assert e.value.reason == reason


def test_frame_without_properties_is_an_event_with_empty_properties():
    ev = parse_frame('{"type": "session.idle"}')
    assert ev.properties == {} and ev.malformed and ev.session is None
    ev = parse_frame('{"type": "session.idle", "properties": [1]}')
    assert ev.properties == {} and ev.malformed


def test_oversize_frame_is_refused_before_parsing():
    big = json.dumps({"type": "x.y", "properties": {"blob": "a" * 100}})
    with pytest.raises(FrameError) as e:
        parse_frame(big, max_frame=50)
    assert e.value.reason == "oversize"
    assert parse_frame(big, max_frame=len(big)).type == "x.y"


def test_deeply_nested_json_is_not_json_not_a_crash():
    with pytest.raises(FrameError) as e:
        parse_frame("[" * 100000 + "]" * 100000)
    assert e.value.reason in ("not_json", "not_object")


@pytest.mark.parametrize("props,sid", [
    ({"sessionID": "a"}, "a"),
    ({"info": {"sessionID": "b"}}, "b"),
    ({"part": {"sessionID": "c"}}, "c"),
    ({"info": {"id": "d"}}, None),  # not a session.* event: info.id is a message id
])
def test_session_identity_per_the_pins(props, sid):
    assert BusEvent("message.updated", props).session == sid


def test_session_info_id_for_session_events():
    assert BusEvent("session.created", {"info": {"id": "ses_9"}}).session == "ses_9"


@pytest.mark.parametrize("inner", ["[" + ",".join(["[]"] * 65_537) + "]", "1" * 300])
def test_a_frame_over_check_json_caps_is_not_json(inner):
    """Round 12 of issue 25: a payload over :func:`bridges.core.aep.check_json`'s
    caps (65,538 arrays; a 300-digit number) is refused before the parse,
    counted ``frames_not_json`` as a frame that is not JSON; one within them
    parses as before."""
    data = '{"type": "x.y", "properties": {"a": ' + inner + "}}"
    with pytest.raises(FrameError) as e:
        parse_frame(data)
    assert e.value.reason == "not_json"
    ok = json.dumps({"type": "x.y", "properties": {"a": [[]] * 1000, "n": 10**200}})
    assert parse_frame(ok).properties == json.loads(ok)["properties"]
