"""The pipeline's states and failure paths, read from the synthesized state machine definition.

`state_graph` is the definition as it is: every state (branches included) and every transition (Next, Choices,
Default, Catch, a Parallel's or Map's branch start). `condense` is what the picture draws: Pass states only shape
data, so each is folded into the arrows through it; Fail states reached from the same states are one box.
"""

import json
import os
import re
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass

START = "(start)"


@dataclass(frozen=True)
class State:
    name: str
    type: str  # Task, Choice, Parallel, Map, Pass, Wait, Fail, Succeed
    parent: str | None  # the Parallel or Map state whose branch holds it
    integration: str = ""  # a Task's service call: "s3:putObject", "batch:submitJob.sync"
    retry: tuple[str, ...] = ()  # one line per retrier: "States.TaskFailed ×1"


@dataclass(frozen=True)
class Transition:
    source: str
    target: str
    kind: str  # next, choice, default, catch, branch
    errors: tuple[str, ...] = ()  # a Catch's ErrorEquals


@dataclass(frozen=True)
class StateGraph:
    start: str
    states: dict[str, State]
    transitions: tuple[Transition, ...]


def pipeline_definition(template: dict) -> dict:
    """The definition of the state machine that the stack's `StateMachineArn` output names (the one the CLI
    starts), or of its only state machine."""
    machines = {
        logical_id: resource
        for logical_id, resource in template.get("Resources", {}).items()
        if resource["Type"] == "AWS::StepFunctions::StateMachine"
    }
    named = template.get("Outputs", {}).get("StateMachineArn", {}).get("Value", {})
    logical_id = named.get("Ref") if isinstance(named, dict) else None
    if logical_id not in machines:
        if len(machines) != 1:
            raise ValueError(f"expected one state machine or a StateMachineArn output, found {sorted(machines)}")
        logical_id = next(iter(machines))
    properties = machines[logical_id]["Properties"]
    return properties["Definition"] if "Definition" in properties else definition_json(properties["DefinitionString"])


def definition_json(definition: object) -> dict:
    """A DefinitionString with its Fn::Join resolved: each token becomes a placeholder that names it."""
    if isinstance(definition, str):
        return json.loads(definition)
    if not (isinstance(definition, dict) and "Fn::Join" in definition):
        raise ValueError(f"cannot read a DefinitionString given as {definition!r:.80}")
    separator, parts = definition["Fn::Join"]
    text, inside = "", False
    for part in parts:
        piece = part if isinstance(part, str) else placeholder(part)
        if not isinstance(part, str) and not inside:
            piece = f'"{piece}"'  # a token outside a JSON string stands for a value: keep the JSON valid
        inside = _inside_string(piece, inside) if isinstance(part, str) else inside
        text += (separator if text else "") + piece
    return json.loads(text)


def placeholder(token: object) -> str:
    """<Ref Name>, <Name.Attribute>, <Stack.Output>: what a token would be at deploy time."""
    if isinstance(token, dict) and len(token) == 1:
        function, argument = next(iter(token.items()))
        if function == "Ref":
            text = f"Ref {argument}"
        elif function == "Fn::GetAtt":
            text = ".".join(argument) if isinstance(argument, list) else str(argument)
        elif function == "Fn::GetStackOutput" and isinstance(argument, dict):
            text = f"{argument.get('StackName')}.{argument.get('OutputName')}"
        else:
            text = function.removeprefix("Fn::")
    else:
        text = "token"
    return "<" + re.sub(r'["\\]', "", text) + ">"


def _inside_string(piece: str, inside: bool) -> bool:
    escaped = False
    for char in piece:
        if escaped:
            escaped = False
        elif char == "\\":
            escaped = True
        elif char == '"':
            inside = not inside
    return inside


def state_graph(definition: dict) -> StateGraph:
    states: dict[str, State] = {}
    transitions: list[Transition] = []
    _walk(definition, None, states, transitions)
    return StateGraph(definition["StartAt"], states, tuple(transitions))


def _walk(machine: dict, parent: str | None, states: dict[str, State], transitions: list[Transition]) -> None:
    for name, body in machine["States"].items():
        if name in states:
            raise ValueError(f"state {name!r} is defined twice")
        states[name] = State(name, body["Type"], parent, _integration(body), _retries(body))
        transitions.extend(_transitions(name, body))
        # A Parallel runs each of its Branches; a Map runs its ItemProcessor (Iterator before 2023):
        # https://docs.aws.amazon.com/step-functions/latest/dg/state-parallel.html
        # https://docs.aws.amazon.com/step-functions/latest/dg/state-map-inline.html
        for branch in body.get("Branches", []) + [b for b in (body.get("ItemProcessor"), body.get("Iterator")) if b]:
            transitions.append(Transition(name, branch["StartAt"], "branch"))
            _walk(branch, name, states, transitions)


def _transitions(name: str, body: dict) -> list[Transition]:
    # Choice rules and Default, and each Catcher's Next on its ErrorEquals:
    # https://docs.aws.amazon.com/step-functions/latest/dg/state-choice.html
    # https://docs.aws.amazon.com/step-functions/latest/dg/concepts-error-handling.html
    found = [Transition(name, body["Next"], "next")] if "Next" in body else []
    found += [Transition(name, rule["Next"], "choice") for rule in body.get("Choices", [])]
    found += [Transition(name, body["Default"], "default")] if "Default" in body else []
    found += [
        Transition(name, catcher["Next"], "catch", tuple(catcher["ErrorEquals"])) for catcher in body.get("Catch", [])
    ]
    return found


def _integration(body: dict) -> str:
    resource = body.get("Resource")
    if body["Type"] != "Task" or not isinstance(resource, str):
        return ""
    # arn:<partition>:states:::aws-sdk:s3:putObject -> s3:putObject; arn:aws:states:::batch:submitJob.sync as is.
    return resource.split(":::", 1)[-1].removeprefix("aws-sdk:")


def _retries(body: dict) -> tuple[str, ...]:
    # A retrier without MaxAttempts retries 3 times; 0 means never:
    # https://docs.aws.amazon.com/step-functions/latest/dg/concepts-error-handling.html
    return tuple(
        f"{', '.join(retrier['ErrorEquals'])} ×{retrier.get('MaxAttempts', 3)}" for retrier in body.get("Retry", [])
    )


@dataclass(frozen=True)
class Box:
    id: str
    type: str
    states: tuple[str, ...]  # one state, Fail states entered from the same boxes, or a chain of input checks
    parent: str | None
    integration: str = ""
    retry: tuple[str, ...] = ()

    @property
    def label(self) -> str:
        """The state's name; for a box of several, the first and last (in the definition's order) or their
        common prefix, and how many."""
        if len(self.states) == 1:
            return self.states[0]
        if self.type != "Fail":
            return f"{self.states[0]}\n… {self.states[-1]}\n({len(self.states)} {self.type} states)"
        prefix = os.path.commonprefix(list(self.states))
        return f"{prefix}… ×{len(self.states)}" if len(prefix) >= 3 else f"{len(self.states)} Fail states"


@dataclass(frozen=True)
class Arrow:
    source: str
    target: str
    kind: str
    errors: tuple[str, ...] = ()


@dataclass(frozen=True)
class Picture:
    start: str  # the box the execution starts in
    boxes: tuple[Box, ...]
    arrows: tuple[Arrow, ...]
    folded: tuple[str, ...]  # the Pass states drawn as part of the arrows through them


def condense(graph: StateGraph) -> Picture:
    folded = {name for name, state in graph.states.items() if state.type == "Pass" and _next(graph, name)}
    through = {name: _past_pass(graph, name, folded) for name in graph.states}
    arrows = [Arrow(t.source, through[t.target], t.kind, t.errors) for t in graph.transitions if t.source not in folded]
    box_of = _guard_chains(graph, arrows)
    box_of.update(_fail_groups(graph, folded, arrows, box_of))
    members: dict[str, list[str]] = defaultdict(list)
    for name in graph.states:
        if name not in folded:
            members[box_of.get(name, name)].append(name)
    boxes = tuple(_box(graph, box_id, names) for box_id, names in members.items())
    boxed = [Arrow(box_of.get(a.source, a.source), box_of.get(a.target, a.target), a.kind, a.errors) for a in arrows]
    # Arrows between states of one box are inside it; a state's arrow to itself stays.
    merged = _merge(b for a, b in zip(arrows, boxed, strict=True) if a.source == a.target or b.source != b.target)
    start = box_of.get(through[graph.start], through[graph.start])
    return Picture(start, boxes, merged, tuple(sorted(folded)))


def _box(graph: StateGraph, box_id: str, names: list[str]) -> Box:
    state = graph.states[names[0]]
    return Box(box_id, state.type, tuple(names), state.parent, state.integration, state.retry)


def _next(graph: StateGraph, name: str) -> str | None:
    return next((t.target for t in graph.transitions if t.source == name and t.kind == "next"), None)


def _past_pass(graph: StateGraph, name: str, folded: set[str]) -> str:
    seen = set()
    while name in folded and name not in seen:
        seen.add(name)
        name = _next(graph, name) or name
    return name


def _guard_chains(graph: StateGraph, arrows: list[Arrow]) -> dict[str, str]:
    """Choice state -> its chain's first state, for chains of two or more guards: Choice states whose every
    rule but one leads to a Fail state, the one left leading to the next guard (input checks, one box)."""
    onward = {}
    for name, state in graph.states.items():
        targets = {a.target for a in arrows if a.source == name and a.kind in ("choice", "default")}
        rest = [t for t in targets if graph.states[t].type != "Fail"]
        if state.type == "Choice" and len(rest) == 1:
            onward[name] = rest[0]
    heads = set(onward) - set(onward.values())
    chains = {}
    for head in heads:
        chain = [head]
        while onward.get(chain[-1]) in onward and onward[chain[-1]] not in chain:
            chain.append(onward[chain[-1]])
        if len(chain) > 1:
            chains.update({name: head for name in chain})
    return chains


def _fail_groups(graph: StateGraph, folded: set[str], arrows: list[Arrow], box_of: dict[str, str]) -> dict[str, str]:
    """Fail state -> its box: one box for two or more Fail states entered from the same boxes."""
    sources: dict[str, set[str]] = defaultdict(set)
    for arrow in arrows:
        sources[arrow.target].add(box_of.get(arrow.source, arrow.source))
    groups: dict[frozenset[str], list[str]] = defaultdict(list)
    for name, state in graph.states.items():
        if state.type == "Fail" and name not in folded:
            groups[frozenset(sources[name])].append(name)
    return {name: members[0] for members in groups.values() if len(members) > 1 for name in members}


def _merge(arrows: Iterable[Arrow]) -> tuple[Arrow, ...]:
    """One arrow per (source, target, kind); a Catch keeps every error name that leads along it."""
    errors: dict[tuple[str, str, str], list[str]] = {}
    for arrow in arrows:
        names = errors.setdefault((arrow.source, arrow.target, arrow.kind), [])
        names += [e for e in arrow.errors if e not in names]
    return tuple(Arrow(source, target, kind, tuple(names)) for (source, target, kind), names in errors.items())
