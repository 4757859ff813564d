"""The summary panel's "top problems": ``formats.findings`` (the one definition summary-text uses too),
turned into rows the viewer can jump from.

Each finding names the module kind carrying most of what it measures (``down_proj`` across every
decoder layer, as XProf's op profile aggregates), that kind's largest layer and op, and the kind's
share. Here a finding gets the keys of that op (the tree selects it) and of its kind (the bottom-up
view, ``b``, opens it): enter on a problem goes to the kind with its biggest instance selected.
"""

from __future__ import annotations

from collections.abc import Sequence

from explorer.viewer.bottomup import KIND_PREFIX
from explorer.viewer.view_model import Hierarchy, Problem
from formats.read_api import Finding


def from_findings(found: Sequence[Finding], hierarchy: Hierarchy) -> tuple[Problem, ...]:
    """Problems in the findings' order (biggest first), each linked to its op and kind."""
    out = []
    for finding in found:
        node = _op_node(hierarchy, finding.op, finding.layer)
        detail = finding.detail + (f"; most in {finding.where}" if finding.where else "")
        t0, t1 = finding.t0, finding.t1
        if (t0 is None or t1 is None) and node is not None:
            span = hierarchy.nodes[node].stats.span
            t0, t1 = span if span is not None else (None, None)
        kind = KIND_PREFIX + finding.kind if finding.kind else None
        out.append(Problem(finding.title, detail, finding.severity, node, t0, t1, kind))
    return tuple(out)


def _op_node(hierarchy: Hierarchy, op: str | None, layer: str | None) -> str | None:
    """The key of the HLO op named ``op`` (in ``layer`` when several ops share the name)."""
    if not op:
        return None
    named = [n for n in hierarchy.nodes.values() if n.kind == "hlo" and n.name == op]
    mine = [n for n in named if n.layer == layer] or named
    return mine[0].key if mine else None
