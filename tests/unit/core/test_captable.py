"""The hand-written capture table (bridges/core/captable.py) against EVERY
``x-aep-capture`` annotation in ``shared/aep/schemas/types/*.schema.json``
(nested properties and array items included), read at test time: same
paths, same levels, same ``[metadata*]`` exceptions, same type set."""
from __future__ import annotations

import json

import pytest

from bridges.core import captable
from tests.support.shared import aep_dir

SCHEMAS = {p.name[: -len(".schema.json")]: json.loads(p.read_text())
           for p in sorted((aep_dir() / "schemas/types").glob("*.schema.json"))}
REGISTRY = json.loads((aep_dir() / "schemas/registry/types.json").read_text())["types"]


def _schema_annotations(schema: dict, path: str = ""):
    """(path, level, comment) for every annotated position, joined the way
    captable.walk joins them (members with ``.``, array items ``[]``)."""
    for name, sub in (schema.get("properties") or {}).items():
        p = f"{path}.{name}" if path else name
        yield p, sub.get("x-aep-capture"), sub.get("$comment", "")
        yield from _schema_annotations(sub, p)
    items = schema.get("items")
    if isinstance(items, dict) and (items.get("properties") or "x-aep-capture" in items):
        p = f"{path}[]"
        yield p, items.get("x-aep-capture"), items.get("$comment", "")
        yield from _schema_annotations(items, p)


def test_every_schema_has_a_table_entry_and_back():
    assert set(captable.TABLE) == set(SCHEMAS)


def test_every_registry_type_with_a_schema_is_in_the_table():
    with_schema = {t["type"] for t in REGISTRY if t.get("schema")}
    assert with_schema == set(captable.TABLE)
    for t in REGISTRY:
        if not t.get("schema"):
            assert captable.node_for(t["type"]) is None


@pytest.mark.parametrize("type_", sorted(SCHEMAS))
def test_table_matches_every_annotation(type_):
    schema = SCHEMAS[type_]
    expected = {p: lvl for p, lvl, _ in _schema_annotations(schema)}
    # Every property in the registered schemas is annotated (AEP-0002 §5.1).
    assert all(lvl is not None for lvl in expected.values()), expected
    table = {p: n.level for p, n in captable.walk(captable.TABLE[type_])}
    assert table == expected


@pytest.mark.parametrize("type_", sorted(SCHEMAS))
def test_star_exceptions_match_the_schema_comments(type_):
    # The [metadata*] fields are the ones whose $comment states the
    # exception: "by exception" (prompt, labels) or "type-dependent" (values).
    schema = SCHEMAS[type_]
    expected = set()
    for p, _, comment in _schema_annotations(schema):
        c = comment.lower()
        if "by exception" in c or "type-dependent" in c:
            expected.add(p)
    stars = {p for p, n in captable.walk(captable.TABLE[type_]) if n.star}
    assert stars == expected


def test_star_kinds():
    kinds = {(t, p): n.star for t, root in captable.TABLE.items()
             for p, n in captable.walk(root) if n.star}
    assert kinds == {
        ("attention.requested", "prompt"): "prompt",
        ("attention.requested", "options[].label"): "label",
        ("attention.requested", "fields[].label"): "label",
        ("attention.requested", "fields[].choices[].label"): "label",
        ("attention.answered", "answer.values"): "values",
        ("control.attention.respond", "answer.values"): "values",
    }


def test_derivation_links_point_at_siblings_of_the_right_level():
    # *_digest fields are metadata and digest a sibling; *_redacted twins are
    # redacted and mirror a full-gated sibling (AEP-0002 §5.2/§5.3).
    seen = 0
    for root in captable.TABLE.values():
        nodes = [root] + [n for _, n in captable.walk(root)]
        for node in nodes:
            for name, child in (node.props or {}).items():
                if child.digest_of:
                    seen += 1
                    assert name == f"{child.digest_of}_digest" and child.level == "metadata"
                    assert child.digest_of in node.props
                if child.twin_of:
                    seen += 1
                    assert name == f"{child.twin_of}_redacted" and child.level == "redacted"
                    assert node.props[child.twin_of].level == "full"
    assert seen >= 8


def test_every_digest_and_twin_in_the_schemas_is_linked():
    for t, schema in SCHEMAS.items():
        for p, _, _ in _schema_annotations(schema):
            leaf = p.rsplit(".", 1)[-1]
            if leaf.endswith("_digest") or leaf.endswith("_redacted"):
                node = dict(captable.walk(captable.TABLE[t]))[p]
                assert node.digest_of or node.twin_of, f"{t}: {p} not linked"
