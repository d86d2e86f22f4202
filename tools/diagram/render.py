"""Draw the models as PNG files: the architecture with the `diagrams` library (AWS icons), the pipeline with Graphviz.

Both need Graphviz's `dot` on the PATH (`apt-get install -y graphviz`); the models themselves do not.
"""

import html
import importlib
from pathlib import Path
from typing import Any

from tools.diagram.architecture import Architecture, Node
from tools.diagram.states import START, Box, Picture

# Sizes chosen by looking at the result at README width (about 1000 px): icons and labels stay legible.
_ARCHITECTURE_GRAPH = {
    "fontsize": "22",
    "pad": "0.3",
    "nodesep": "0.25",
    "ranksep": "0.6",
    "dpi": "72",
    "splines": "spline",
    "newrank": "true",
    "labelloc": "t",
    "size": "14,40",
}  # at most 14 in (1008 px) wide: scaled down, never up
_ARCHITECTURE_NODE = {"fontsize": "15"}
_ARCHITECTURE_EDGE = {"fontsize": "14", "fontcolor": "#2D3436", "color": "#5A6672", "penwidth": "1.6"}
_ICON_PT = 64
_CLUSTER = {"fontsize": "18", "margin": "10"}


def render_architecture(model: Architecture, png: Path) -> None:
    import diagrams  # type: ignore[import-untyped]  # the library ships no type information

    with diagrams.Diagram(
        model.title,
        filename=str(png.with_suffix("")),
        outformat="png",
        show=False,
        direction="TB",
        graph_attr=_ARCHITECTURE_GRAPH,
        node_attr=_ARCHITECTURE_NODE,
        edge_attr=_ARCHITECTURE_EDGE,
    ):
        drawn: dict[str, Any] = {}
        for label in model.clusters:
            with diagrams.Cluster(label, graph_attr=_CLUSTER) as cluster:
                _draw_cluster(model, label, cluster, drawn)
        for upper, lower in _unlinked(model):
            drawn[upper].connect(drawn[lower], diagrams.Edge(drawn[upper], style="invis"))
        for edge in model.edges:
            source, target = drawn[edge.source], drawn[edge.target]
            source.connect(target, diagrams.Edge(source, forward=True, reverse=edge.both_ways, label=edge.label))


def _draw_cluster(model: Architecture, label: str, cluster: Any, drawn: dict[str, Any]) -> None:
    """The cluster's nodes; two resources linked both ways are peers: side by side, not one above the other."""
    for node in (n for n in model.nodes if n.cluster == label):
        drawn[node.id] = _icon_node(node)
    for edge in (e for e in model.edges if e.both_ways and e.source.startswith(f"{label}/")):
        cluster.dot.body.append(f'{{rank=same; "{drawn[edge.source].nodeid}"; "{drawn[edge.target].nodeid}"}}')


def _unlinked(model: Architecture) -> list[tuple[str, str]]:
    """(upper, lower): in each cluster, the nodes that no edge touches go below the first node that has edges
    (an invisible edge), so the cluster sits where its linked resources are, not in a column of its own."""
    touched = {end for edge in model.edges for end in (edge.source, edge.target)}
    pairs = []
    for label in model.clusters:
        members = [node.id for node in model.nodes if node.cluster == label]
        anchors = [m for m in members if m in touched]
        pairs += [(anchors[0], m) for m in members if m not in touched and anchors]
    return pairs


def _icon_node(node: Node) -> Any:
    """The resource's AWS icon above its label, as one HTML-like table, so the node is as wide as its text
    (a `diagrams` node has a fixed width that long labels overflow onto their neighbours)."""
    module, name = node.kind.icon.rsplit(".", 1)
    icon_class = getattr(importlib.import_module(f"diagrams.aws.{module}"), name)
    icon = icon_class._load_icon(icon_class)  # the library's PNG for this class (reads class attributes only)
    title, *names = node.label.split("\n")
    rows = "".join(
        f'<TR><TD><FONT POINT-SIZE="13" COLOR="#57606A">{html.escape(line)}</FONT></TD></TR>' for line in names
    )
    image = f'<TD FIXEDSIZE="TRUE" WIDTH="{_ICON_PT}" HEIGHT="{_ICON_PT}"><IMG SRC="{icon}" SCALE="TRUE"/></TD>'
    label = (
        f'<<TABLE BORDER="0" CELLSPACING="0" CELLPADDING="1"><TR>{image}</TR>'
        f"<TR><TD>{html.escape(title)}</TD></TR>{rows}</TABLE>>"
    )
    return icon_class(label, image="", shape="plaintext", fixedsize="false", width="0", height="0")


_BOX_STYLES = {  # state type -> Graphviz node attributes
    "Task": {"shape": "box", "style": "rounded,filled", "fillcolor": "#E8F1FB", "color": "#3B7DD8"},
    "Choice": {"shape": "box", "style": "filled,diagonals", "fillcolor": "#FFF4D6", "color": "#B8860B"},
    "Parallel": {"shape": "box", "style": "filled", "peripheries": "2", "fillcolor": "#EDE7F6", "color": "#6A4FB3"},
    "Map": {"shape": "box", "style": "filled", "peripheries": "2", "fillcolor": "#EDE7F6", "color": "#6A4FB3"},
    "Fail": {"shape": "box", "style": "filled", "fillcolor": "#FDE2E1", "color": "#C62828", "penwidth": "1.5"},
    "Succeed": {"shape": "box", "style": "rounded,filled,bold", "fillcolor": "#DFF5E1", "color": "#2E7D32"},
}
_ARROW_STYLES = {  # transition kind -> Graphviz edge attributes
    "next": {},
    "choice": {},
    "default": {"xlabel": "default"},
    "catch": {"style": "dashed", "color": "#C62828", "fontcolor": "#C62828"},
    "branch": {"style": "dotted", "arrowhead": "open"},
}


def render_pipeline(picture: Picture, title: str, png: Path) -> None:
    import graphviz  # type: ignore[import-untyped]  # the library ships no type information

    policies = list(dict.fromkeys(box.retry for box in picture.boxes if box.retry))
    graph = graphviz.Digraph(
        graph_attr={
            "rankdir": "TB",
            "fontname": "Sans-Serif",
            "fontsize": "13",
            "dpi": "72",
            "nodesep": "0.25",
            "ranksep": "0.35",
            "newrank": "true",
            "size": "14,60",
            "labelloc": "t",
            "label": _legend(title, picture, policies),
        },
        node_attr={"fontname": "Sans-Serif", "fontsize": "13", "margin": "0.08,0.04"},
        edge_attr={"fontname": "Sans-Serif", "fontsize": "11", "color": "#44505C", "arrowsize": "0.7"},
    )
    graph.node(START, "", shape="circle", style="filled", fillcolor="#44505C", width="0.18")
    parents = dict.fromkeys(box.parent for box in picture.boxes if box.parent)  # in the definition's order
    for parent in [None, *parents]:
        scope = graph if parent is None else graphviz.Digraph(f"cluster_{parent}")
        if parent:
            scope.attr(label=f"branch of {parent}", style="dashed", color="#6A4FB3", fontcolor="#6A4FB3")
        for box in (b for b in picture.boxes if b.parent == parent):
            scope.node(box.id, _box_label(box, policies), **_BOX_STYLES.get(box.type, {"shape": "box"}))
        if parent:
            graph.subgraph(scope)
    graph.edge(START, picture.start)
    for arrow in picture.arrows:
        attributes = dict(_ARROW_STYLES[arrow.kind])
        if arrow.kind == "catch" and arrow.errors != ("States.ALL",):
            attributes["xlabel"] = "\n".join(arrow.errors)
        graph.edge(arrow.source, arrow.target, **attributes)
    graph.render(outfile=str(png), format="png", cleanup=True, quiet=True)


def _box_label(box: Box, policies: list[tuple[str, ...]]) -> str:
    lines = [f"<B>{html.escape(part)}</B>" for line in box.label.split("\n") for part in _halves(line)]
    if box.integration:
        lines.append(f'<FONT POINT-SIZE="11" COLOR="#57606A">{html.escape(box.integration)}</FONT>')
    if box.retry:
        lines.append(f'<FONT POINT-SIZE="11" COLOR="#3B7DD8">↻ R{policies.index(box.retry) + 1}</FONT>')
    return "<" + "<BR/>".join(lines) + ">"


def _legend(title: str, picture: Picture, policies: list[tuple[str, ...]]) -> str:
    rows = [
        f'<TR><TD ALIGN="LEFT"><FONT POINT-SIZE="18">{html.escape(title)}</FONT></TD></TR>',
        '<TR><TD ALIGN="LEFT">solid: Next, Choices, Default · <FONT COLOR="#C62828">dashed: Catch</FONT>'
        " (unlabelled: States.ALL) · dotted: a branch's start</TD></TR>",
        f'<TR><TD ALIGN="LEFT">{len(picture.folded)} Pass states (they only shape data) are drawn as part of'
        " the arrows through them</TD></TR>",
        '<TR><TD ALIGN="LEFT">Fail states entered from the same box share one (… ×N); a chain of input checks'
        " is one box</TD></TR>",
    ]
    rows += [
        f'<TR><TD ALIGN="LEFT"><FONT COLOR="#3B7DD8">↻ R{i}</FONT> retries {html.escape("; ".join(policy))}</TD></TR>'
        for i, policy in enumerate(policies, 1)
    ]
    return '<<TABLE BORDER="0" CELLSPACING="0" CELLPADDING="2">' + "".join(rows) + "</TABLE>>"


def _halves(name: str, longest: int = 15) -> list[str]:
    """A long CamelCase name on two lines, split at the capital nearest its middle: narrower boxes."""
    capitals = [i for i, char in enumerate(name) if char.isupper() and i > 0]
    if len(name) <= longest or " " in name or not capitals:
        return [name]
    cut = min(capitals, key=lambda i: abs(len(name) / 2 - i))
    return [name[:cut], name[cut:]]
