"""The per-type payload capture table (AEP-0002 §5.1-§5.4, AEP-0004 §2,
AEP-0006), hand-written from the specification text.

Every property of every registered payload schema carries an
``x-aep-capture`` annotation naming the minimum capture level at which the
field may be present; fields the schemas do not name default to
``metadata`` (AEP-0002 §5.1 rule 4). This module is that table as Python
data, so the daemon needs nothing from ``shared/`` at run time.
``tests/unit/core/test_captable.py`` checks it, path for path, against every
annotation in ``shared/aep/schemas/types/*.schema.json`` (nested properties
and array items included) and checks the ``[metadata*]`` markers against
the schemas' "by exception" comments.

Shapes:

- :class:`Node`: one annotated position: ``level`` (``metadata`` |
  ``redacted`` | ``full``), ``props`` (object members, name -> Node),
  ``items`` (the array item Node), ``star`` (the ``[metadata*]`` exception
  kind, see below), ``digest_of``/``twin_of`` (derivation links).
- :data:`TABLE`: registered type -> root Node (the payload object).

``star`` kinds (AEP-0002 §5.3, §8; AEP-0003 §9.2; AEP-0006):

- ``"prompt"``: ``attention.requested.prompt``; at ``metadata`` it is
  synthesized as ``"{agent} requests {kind}: {subject}"``.
- ``"label"``: ``options[].label``, ``fields[].label``,
  ``fields[].choices[].label``; at ``metadata`` a structural placeholder.
- ``"values"``: ``answer.values``; type-dependent per referenced
  ``field_spec`` (string / ``other`` free text ``redacted`` minimum,
  number/boolean/closed-select ``metadata``).

Derivation links (AEP-0003 §9.3 digests before redaction; AEP-0002 §5.3
two-field pattern):

- ``digest_of="args"`` on ``args_digest``: when absent, the gate computes
  it from the original ``args`` before anything is dropped or redacted.
- ``twin_of="args"`` on ``args_redacted``: when absent at a ``redacted``
  ceiling, the gate fills it with ``args`` through the §9.4 pipeline.
"""
from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType
from typing import Mapping


@dataclass(frozen=True)
class Node:
    """One annotated position of a payload (see the module docstring)."""

    level: str = "metadata"
    props: Mapping[str, "Node"] | None = None
    items: "Node | None" = None
    star: str | None = None
    digest_of: str | None = None
    twin_of: str | None = None


def _obj(_level: str = "metadata", /, **props: Node) -> Node:
    return Node(_level, props=MappingProxyType(dict(props)))


def _arr(items: Node, level: str = "metadata") -> Node:
    return Node(level, items=items)


META = Node("metadata")
RED = Node("redacted")
FULL = Node("full")
PROMPT = Node("metadata", star="prompt")
LABEL = Node("metadata", star="label")
VALUES = Node("metadata", star="values")

# --------------------------------------------------------------- common objects (AEP-0002 §5.2)

TOOL_REF = _obj(name=META, call_id=META)
ERROR_INFO = _obj(type=META, message=RED)
COST = _obj(currency=META, total=META, prompt=META, completion=META, cache=META,
            reasoning=META)
USAGE = {"gen_ai.usage.input_tokens": META, "gen_ai.usage.output_tokens": META}
DOCUMENT = _obj(id=META, score=META, content_redacted=Node("redacted", twin_of="content"),
                content=FULL, metadata=META)
CITATION = _obj(
    source=_obj(id=META, uri=RED, title=RED),
    cited_text_redacted=Node("redacted", twin_of="cited_text"),
    cited_text=FULL,
    offset=_obj(char=_obj(start=META, end=META),
                page=_obj(page=META, start=META, end=META),
                block=_obj(block=META, start=META, end=META)),
    document_index=META,
)
GUARDRAIL = _obj(
    stage=META, verdict=META,
    categories=_arr(_obj(name=META, score=META)),
    detector=_obj(name=META, version=META),
    explanation=RED,
)
OPTION = _obj(id=META, label=LABEL)
FIELD_SPEC = _obj(
    id=META, type=META, label=LABEL, required=META, multi=META, other=META,
    choices=_arr(_obj(id=META, label=LABEL)),
    min=META, max=META,
)
ANSWER = _obj(option=META, text=RED, values=VALUES)
LINEAGE = _obj(session=META, run=META, agent=META)
TASK = _obj(id=META, title=RED)

# --------------------------------------------------------------- per-type (AEP-0002 §5.3/§5.4, AEP-0004)

_TABLE: dict[str, Node] = {
    # session
    "session.started": _obj(label=RED, parent=LINEAGE, client=_obj(name=META, version=META),
                            cwd=RED, **{"gen_ai.request.model": META}),
    "session.ended": _obj(reason=META, duration_ms=META, runs=META),
    "session.compacted": _obj(trigger=META, strategy=META, estimated_token_count=META,
                              forgotten=META, **USAGE),
    # run
    "run.started": _obj(trigger=META, prompt=RED, cost=COST, **USAGE),
    "run.finished": _obj(duration_ms=META, summary=RED, cost=COST, **USAGE),
    "run.failed": _obj(reason=META, error=ERROR_INFO, duration_ms=META),
    "run.cancelled": _obj(by=META, reason=RED, duration_ms=META),
    "run.step.started": _obj(name=RED, initial_num_steps=META),
    "run.step.finished": _obj(status=META),
    # tool
    "tool.requested": _obj(tool=TOOL_REF, args_digest=Node("metadata", digest_of="args"),
                           args_redacted=Node("redacted", twin_of="args"), args=FULL),
    "tool.completed": _obj(tool=TOOL_REF, duration_ms=META, status=META,
                           result_digest=Node("metadata", digest_of="result"),
                           result_redacted=Node("redacted", twin_of="result"), result=FULL,
                           cost=COST, **USAGE),
    "tool.failed": _obj(tool=TOOL_REF, error=ERROR_INFO, duration_ms=META),
    "tool.denied": _obj(tool=TOOL_REF, by=META, rule=META),
    # attention
    "attention.requested": _obj(kind=META, prompt=PROMPT, options=_arr(OPTION),
                                fields=_arr(FIELD_SPEC), expires_at=META, respond_via=META,
                                context=FULL),
    "attention.answered": _obj(answer=ANSWER, by=META, via=META),
    "attention.resolved": _obj(resolution=META, latency_ms=META),
    "attention.timeout": _obj(after_ms=META),
    "attention.routed": _obj(to=META, via=META),
    # progress
    "progress.status": _obj(message=RED, phase=META, percent=META),
    "progress.task.planned": _obj(task=TASK, parent=META),
    "progress.task.completed": _obj(task=TASK, status=META),
    "progress.artifact.produced": _obj(artifact=_obj(id=META, name=RED, mime=META, bytes=META,
                                                     uri=RED)),
    # delegation
    "delegation.subagent.started": _obj(child=LINEAGE, agent_type=META, role=META),
    "delegation.subagent.stopped": _obj(child=LINEAGE, agent_type=META, status=META,
                                        duration_ms=META),
    # agent (agent-scoped)
    "agent.presence": _obj(state=META),
    "agent.idle": _obj(since_ms=META, reason=META),
    "agent.health": _obj(status=META, detail=RED),
    "agent.heartbeat": _obj(tick=META, interval_ms=META),
    # error / state
    "error.raised": _obj(error=ERROR_INFO, code=META, fatal=META),
    "state.snapshot": _obj(state=RED, key=META, rev=META),
    "state.delta": _obj(delta=RED, key=META, rev=META),
    # resource (experimental)
    "resource.retrieval.requested": _obj(query=RED,
                                         query_digest=Node("metadata", digest_of="query"),
                                         corpus=META, top_k=META),
    "resource.retrieval.returned": _obj(documents=_arr(DOCUMENT), count=META, corpus=META,
                                        duration_ms=META),
    "resource.retrieval.reranked": _obj(query=RED,
                                        query_digest=Node("metadata", digest_of="query"),
                                        model=META, top_k=META,
                                        input_documents=_arr(DOCUMENT),
                                        output_documents=_arr(DOCUMENT),
                                        count=META, duration_ms=META),
    "resource.citation.recorded": _obj(citations=_arr(CITATION), count=META),
    # assessment (experimental, AEP-0009)
    "assessment.evaluation.recorded": _obj(**{
        "gen_ai.evaluation.name": META,
        "gen_ai.evaluation.score.value": META,
        "gen_ai.evaluation.score.label": META,
        "gen_ai.evaluation.explanation": RED,
        "evaluator": META,
    }),
    "assessment.feedback.received": _obj(rating=META, label=META, comment=RED, correction=RED,
                                         source=META),
    "assessment.guardrail.recorded": _obj(guardrail=GUARDRAIL),
    # control (AEP-0004 §2)
    "control.attention.respond": _obj(answer=ANSWER),
    "control.cancel": _obj(scope=META, reason=RED),
    "control.pause": _obj(),
    "control.resume": _obj(),
    "control.accepted": _obj(),
    "control.rejected": _obj(reason=META, detail=RED),
}

TABLE: Mapping[str, Node] = MappingProxyType(_TABLE)
"""Registered type -> payload root :class:`Node`."""


def node_for(type_: str) -> Node | None:
    """The payload root for a registered type; ``None`` for vendor
    (``x.*``), reserved (``message.*``) and unknown types."""
    return TABLE.get(type_)


def walk(node: Node, path: str = ""):
    """Yield ``(path, Node)`` for every annotated position below ``node``;
    object members join with ``.``, array items append ``[]``
    (``fields[].choices[].label``). Used by the table tests."""
    for name, child in (node.props or {}).items():
        p = f"{path}.{name}" if path else name
        yield p, child
        yield from walk(child, p)
    if node.items is not None:
        p = f"{path}[]"
        yield p, node.items
        yield from walk(node.items, p)
