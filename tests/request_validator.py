"""Check a boto request against its botocore API model, as the service would.

botocore's own ParamValidator (botocore/validate.py) checks unknown and required members, types and minimums only.
`check` runs it, then walks the operation's input shape over the request (boto member names, as passed to a boto3
client call) for what it leaves out: string enums, string patterns as a full match, the maximum length of strings,
lists and maps, and the maximum of numbers; into structures, lists and maps (keys and values).

botocore's patterns are Java regular expressions. Python's `re` lacks `\\p{...}` classes: the POSIX ones are
translated exactly, the Unicode categories L and N to `\\w` and Z to `\\s` (supersets, so never a false complaint);
a surrogate pair is read as its code point. A pattern that still does not compile is skipped and counted
(`skipped_patterns`).
"""

import functools
import re
from collections.abc import Mapping
from typing import Any

import botocore.session
from botocore.model import Shape
from botocore.validate import ParamValidator

_SESSION = botocore.session.get_session()
_CLASSES = {
    "Alnum": "a-zA-Z0-9",
    "Alpha": "a-zA-Z",
    "ASCII": r"\x00-\x7F",
    "Digit": "0-9",
    "XDigit": "0-9a-fA-F",
    "Upper": "A-Z",
    "Lower": "a-z",
    "Punct": r"!-/:-@\[-`{-~",
    "Space": r" \t\n\x0B\f\r",
    "L": r"\w",
    "N": r"\w",
    "Z": r"\s",
}
_SURROGATE_PAIR = re.compile(r"\\u(D[89AB][0-9A-F]{2})\\u(D[C-F][0-9A-F]{2})", re.IGNORECASE)
_TOKEN = re.compile(r"\\p\{\w+\}|\\.|.", re.DOTALL)
_NUMBERS = ("integer", "long", "float", "double")
_SKIPPED: set[str] = set()


@functools.cache
def input_shape(service: str, operation: str) -> Shape | None:
    return _SESSION.get_service_model(service).operation_model(operation).input_shape


def _code_point(pair: re.Match[str]) -> str:
    high, low = int(pair.group(1), 16), int(pair.group(2), 16)
    return f"\\U{0x10000 + ((high - 0xD800) << 10) + (low - 0xDC00):08X}"


def _python_regex(pattern: str) -> str:
    """A Java pattern in Python's syntax; KeyError for a `\\p{...}` class without a translation."""
    if "&&" in pattern:  # Java's class intersection
        raise KeyError(pattern)
    pattern = re.sub(r"(\\[wdsWDS])-", r"\1\\-", _SURROGATE_PAIR.sub(_code_point, pattern))  # [\w-.]: '-' literal
    tokens, in_class = [], False
    for token in _TOKEN.findall(pattern):
        if token.startswith("\\p{"):
            token = _CLASSES[token[3:-1]] if in_class else f"[{_CLASSES[token[3:-1]]}]"
        in_class = {"[": True, "]": False}.get(token, in_class)
        tokens.append(token)
    return "".join(tokens)


@functools.cache
def _compiled(pattern: str) -> re.Pattern[str] | None:
    try:
        return re.compile(_python_regex(pattern))
    except (KeyError, re.error):
        _SKIPPED.add(pattern)
        return None


def skipped_patterns() -> int:
    """How many distinct patterns met so far could not be checked."""
    return len(_SKIPPED)


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else f"{text[:77]}..."


def _string(shape: Shape, value: str) -> list[str]:
    rules = []
    enum = shape.metadata.get("enum")
    if enum and value not in enum:
        rules.append(f"not one of the {len(enum)} values of enum {shape.name}")
    pattern = shape.metadata.get("pattern")
    compiled = _compiled(pattern) if pattern else None
    if compiled is not None and not compiled.fullmatch(value):
        rules.append(f"does not fully match pattern {pattern!r} ({shape.name})")
    if "max" in shape.metadata and len(value) > shape.metadata["max"]:
        rules.append(f"{len(value)} characters, over max {shape.metadata['max']} ({shape.name})")
    return rules


def _scalar(shape: Shape, value: Any) -> list[str]:
    if shape.type_name == "string" and isinstance(value, str):
        return _string(shape, value)
    is_number = isinstance(value, int | float) and not isinstance(value, bool)
    if shape.type_name in _NUMBERS and is_number and value > shape.metadata.get("max", value):
        return [f"over max {shape.metadata['max']} ({shape.name})"]
    return []


def _size(shape: Shape, value: Any, unit: str) -> list[str]:
    limit = shape.metadata.get("max")
    return [f"{len(value)} {unit}, over max {limit} ({shape.name})"] if limit is not None and len(value) > limit else []


def _walk(shape: Shape, value: Any, path: str) -> list[str]:
    """Every problem under `path`, one line each: path = value: rule."""
    kind, problems = shape.type_name, []
    if kind == "structure" and isinstance(value, Mapping):
        for name, item in value.items():
            if name in shape.members:
                problems += _walk(shape.members[name], item, f"{path}.{name}")
        return problems
    if kind == "list" and isinstance(value, list):
        problems = [f"{path} = [{len(value)} items]: {rule}" for rule in _size(shape, value, "items")]
        for index, item in enumerate(value):
            problems += _walk(shape.member, item, f"{path}[{index}]")
        return problems
    if kind == "map" and isinstance(value, Mapping):
        problems = [f"{path} = {{{len(value)} entries}}: {rule}" for rule in _size(shape, value, "entries")]
        for key, item in value.items():
            problems += _walk(shape.key, key, f"{path} key")
            problems += _walk(shape.value, item, f"{path}[{key!r}]")
        return problems
    return [f"{path} = {_shown(value)}: {rule}" for rule in _scalar(shape, value)]


def check(service: str, operation: str, params: Mapping[str, Any]) -> list[str]:
    """The problems the service would find in `params` for `operation` (e.g. "sagemaker", "CreateTrainingJob")."""
    shape = input_shape(service, operation)
    if shape is None:
        return [f"{operation} = {_shown(params)}: takes no input"] if params else []
    report = ParamValidator().validate(params, shape)
    problems = [f"botocore: {line}" for line in report.generate_report().splitlines()] if report.has_errors() else []
    return problems + _walk(shape, params, operation)


def assert_valid(service: str, operation: str, params: Mapping[str, Any]) -> None:
    problems = check(service, operation, params)
    if problems:
        raise AssertionError(f"{service} {operation} request refused:\n" + "\n".join(problems))
