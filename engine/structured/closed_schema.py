"""JSON schemas closed by default, as llama.cpp's converter (hence Ollama) and xgrammar's strict mode
(vLLM's default) read them: an object schema that lists its keys (``properties``, ``patternProperties``)
and does not say ``additionalProperties`` takes no other key. JSON Schema itself leaves such an object
open, which lets a model add keys of its own (on a small model a stray key can run to the token limit).

llguidance has no option for this, so the schema is rewritten: ``additionalProperties: false`` is added
where it is absent, recursively (``$defs``, nested objects, ``items``, ``anyOf`` branches...). Where
several parts of one object each list keys (``allOf`` members, or ``properties`` beside ``anyOf``),
closing each part would forbid the others' keys, so the parts stay open and the object that joins them
is closed over all their keys (a ``$ref`` among them is inlined, open). An explicit
``additionalProperties`` (``true`` or a schema) is kept, and keeps its object open.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

PARTS = ("allOf", "anyOf", "oneOf")  # subschemas that describe the same object as their parent
VALUE_MAPS = ("properties", "patternProperties", "$defs", "definitions")  # name -> a value's schema
VALUE_ONES = ("additionalProperties", "unevaluatedProperties", "items", "additionalItems", "contains")
VALUE_LISTS = ("prefixItems", "items")  # ``items`` as a list: draft 4's tuples
OPENERS = ("additionalProperties", "unevaluatedProperties")


def closed_schema(schema: Any) -> Any:
    """A copy of ``schema`` in which objects take only the keys they list (the input is not changed)."""
    return _Closer(schema).walk(schema, close=True) if isinstance(schema, dict) else schema


@dataclass
class _Keys:
    """The keys an object's parts list: names and patterns (in order of appearance), how many parts
    list ``properties`` of their own (the object itself, each ``allOf`` member, a ``$ref``'s target,
    ``anyOf`` and ``oneOf`` each as one), and whether a part lets other keys in explicitly."""

    names: dict[str, None] = field(default_factory=dict)
    patterns: dict[str, None] = field(default_factory=dict)
    parts: int = 0
    open: bool = False


@dataclass
class _Closer:
    """One rewrite of the schema ``root`` (local ``$ref``s are resolved against it). ``walk`` builds
    new dicts and never changes ``root``."""

    root: dict[str, Any]
    _inlining: set[str] = field(default_factory=set)  # $refs being followed (a cycle keeps its $ref)

    def walk(self, node: Any, close: bool) -> Any:
        """``node`` with the objects of its values closed, and ``node``'s own object closed when
        ``close`` (else it is a part of a larger object, closed where the parts join)."""
        if not isinstance(node, dict):
            return node
        keys = self.keys(node)
        joined = not close or keys.parts > 1  # the parts stay open; the object is closed here
        out: dict[str, Any] = {}
        for key, value in node.items():
            if key in PARTS and isinstance(value, list):
                walked = [self.walk(part, close=not joined) for part in value]
                out.setdefault(key, []).extend(walked)  # allOf may already hold an inlined $ref
            elif key == "$ref" and joined and (target := self.target(value)) is not None:
                self._inlining.add(value)
                out.setdefault("allOf", []).append(self.walk(target, close=False))
                self._inlining.discard(value)
            elif key in VALUE_MAPS and isinstance(value, dict):
                out[key] = {name: self.walk(sub, close=True) for name, sub in value.items()}
            elif key in VALUE_ONES and isinstance(value, dict):
                out[key] = self.walk(value, close=True)
            elif key in VALUE_LISTS and isinstance(value, list):
                out[key] = [self.walk(sub, close=True) for sub in value]
            else:  # const, enum, default, examples, not, if/then/else...: as written
                out[key] = value
        lists_own = "properties" in node or "patternProperties" in node
        said = any(k in node for k in OPENERS)  # the object's own word, whatever it is, stands
        if close and (joined or lists_own) and keys.parts and not keys.open and not said:
            _close_over(out, keys)
        return out

    def keys(self, node: dict[str, Any]) -> _Keys:
        """The keys ``node``'s object lists, over its parts (members, ``$ref`` targets) recursively."""
        found = _Keys(open=any(k in node and node[k] is not False for k in OPENERS))
        found.names.update(dict.fromkeys(_dict(node.get("properties"))))
        found.names.update(dict.fromkeys(n for n in _list(node.get("required")) if isinstance(n, str)))
        found.patterns.update(dict.fromkeys(_dict(node.get("patternProperties"))))
        found.parts = int(any(isinstance(node.get(k), dict) for k in ("properties", "patternProperties")))
        members = [p for p in _list(node.get("allOf")) if isinstance(p, dict)]  # each one a part
        choices = [[p for p in _list(node.get(k)) if isinstance(p, dict)] for k in PARTS[1:]]  # one part each
        ref = node.get("$ref")
        target = self.target(ref)
        if isinstance(ref, str) and target is not None:
            self._inlining.add(ref)
            members.append(target)
        for group, one_part in [(members, False), *((c, True) for c in choices)]:
            inner = [self.keys(sub) for sub in group]
            for sub in inner:
                found.names.update(sub.names)
                found.patterns.update(sub.patterns)
                found.open = found.open or sub.open
            counted = [min(sub.parts, 1) for sub in inner]
            found.parts += max(counted, default=0) if one_part else sum(counted)
        if isinstance(ref, str) and target is not None:  # followed here, not by a caller
            self._inlining.discard(ref)
        return found

    def target(self, ref: Any) -> dict[str, Any] | None:
        """The schema a local ``$ref`` ("#/..." JSON pointer) names; None for other references, a
        pointer to nothing, or one already being followed."""
        if not isinstance(ref, str) or not ref.startswith("#") or ref in self._inlining:
            return None
        node: Any = self.root
        for token in filter(None, ref[1:].split("/")):
            token = token.replace("~1", "/").replace("~0", "~")
            if isinstance(node, dict) and token in node:
                node = node[token]
            elif isinstance(node, list) and token.isdigit() and int(token) < len(node):
                node = node[int(token)]
            else:
                return None
        return node if isinstance(node, dict) else None


def _close_over(out: dict[str, Any], keys: _Keys) -> None:
    """Let ``out`` take the keys listed and nothing else (a name its parts list but it does not
    comes in as ``true``: the parts still say what its value is)."""
    listed = _dict(out.get("properties"))
    out["properties"] = {**listed, **{n: True for n in keys.names if n not in listed}}
    if keys.patterns:
        patterns = _dict(out.get("patternProperties"))
        out["patternProperties"] = {**patterns, **{p: True for p in keys.patterns if p not in patterns}}
    out["additionalProperties"] = False


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []
