"""flows.yaml text -> plain data, bounded before anything walks it.

YAML aliases make a small file stand for a huge document: nine levels of nine aliases
(an "alias bomb") are a few hundred bytes that expand to hundreds of millions of values
as soon as anything copies the data (`${VAR}` resolution did, until memory ran out).
So the parser's event stream is read once first, without building anything: it bounds
the file's size, the nesting depth, the number of aliases and the number of values the
document holds *with every alias expanded*, and finds duplicate keys (which YAML loaders
silently resolve by keeping the last one: a second `flows:` block replaced the first).
Only then is the document built. Every problem is one line naming the file, the key path
and the line.
"""

from __future__ import annotations

import re
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any

import yaml

from connectors.errors import quoted
from pipelines.config.names import did_you_mean

# A flows.yaml naming 100,000 tags is about 6 MB and 100,000 values.
MAX_CONFIG_BYTES = 16 << 20
MAX_DEPTH = 64
MAX_ALIASES = 10_000
MAX_VALUES = 1_000_000

# libyaml's parser when PyYAML has it: far faster on a flows.yaml naming thousands of tags
# than the pure-Python one (same documents, same errors with line and column).
_LOADER: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_MERGE_KEY = "<<"
# Python refuses to build an int of more than 4,300 digits from text (CVE-2020-10735).
_HUGE_INT = re.compile(r"^[-+]?[0-9_]{4000,}$")


class DocumentError(ValueError):
    """The document is not acceptable; `where` is its key path, `line` 1-based (or None)."""

    def __init__(self, message: str, *, where: str = "", line: int | None = None) -> None:
        self.where = where
        self.line = line
        super().__init__(message)


@dataclass
class _Node:
    """A collection being read: its anchor, its expanded size so far, where it is."""

    mapping: bool
    anchor: str | None
    size: int = 1
    expect_key: bool = True
    key: str = ""
    index: int = -1
    keys: dict[str, int] = field(default_factory=dict)


def _line(event: Any) -> int | None:
    mark = getattr(event, "start_mark", None)
    return mark.line + 1 if mark is not None else None


def _path(stack: list[_Node], last: str | None = None) -> str:
    """The key path of the node being read (`flows.hourly.tags.paths.3`), shortened."""
    parts = [node.key if node.mapping else str(max(node.index, 0)) for node in stack]
    if last is not None:
        parts[-1] = last
    parts = [quoted(part, 40) if len(part) > 40 else part for part in parts if part != ""]
    if len(parts) > 8:
        parts = [*parts[:4], "...", *parts[-3:]]
    return ".".join(parts)


def check_document(text: str, top_keys: Collection[str] | None = None) -> None:
    """Raise DocumentError if the YAML text is too large, too deep, expands to too many
    values through aliases, repeats a key in one mapping, or (given `top_keys`) has a
    top-level key not among them, found before its value is read; YAMLError on bad syntax."""
    size = len(text.encode("utf-8"))
    if size > MAX_CONFIG_BYTES:
        raise DocumentError(f"the file is {size:,} bytes; at most {MAX_CONFIG_BYTES:,} are read")
    walk = _Walk(top_keys)
    for event in yaml.parse(text, Loader=_LOADER):
        walk.step(event)


class _Walk:
    """The parser's events read once, counting what the document holds with every alias
    expanded, without building it."""

    def __init__(self, top_keys: Collection[str] | None) -> None:
        self.top_keys = top_keys
        self.anchors: dict[str, int] = {}
        self.stack: list[_Node] = []
        self.aliases = 0
        self.total = 0

    def step(self, event: Any) -> None:
        if isinstance(event, yaml.AliasEvent):
            self._alias(event)
        elif isinstance(event, yaml.ScalarEvent):
            self._scalar(event)
        elif isinstance(event, yaml.MappingStartEvent | yaml.SequenceStartEvent):
            self._enter(event)
            self.stack.append(_Node(isinstance(event, yaml.MappingStartEvent), event.anchor))
            if len(self.stack) > MAX_DEPTH:
                self._fail(f"nested more than {MAX_DEPTH} levels deep", event)
        elif isinstance(event, yaml.MappingEndEvent | yaml.SequenceEndEvent):
            node = self.stack.pop()
            if node.anchor:
                self.anchors[node.anchor] = node.size
            self._add(node.size, event)

    def _alias(self, event: Any) -> None:
        self._enter(event)
        self.aliases += 1
        if self.aliases > MAX_ALIASES:
            self._fail(f"more than {MAX_ALIASES:,} aliases", event)
        self._add(self.anchors.get(event.anchor or "", 1), event)

    def _scalar(self, event: Any) -> None:
        self._enter(event)
        if event.implicit[0] and _HUGE_INT.match(event.value):
            self._fail(f"a number of {len(event.value):,} digits", event)
        if event.anchor:
            self.anchors[event.anchor] = 1
        self._add(1, event)

    def _fail(self, message: str, event: Any) -> None:
        raise DocumentError(message, where=_path(self.stack), line=_line(event))

    def _add(self, count: int, event: Any) -> None:
        """`count` more values in the collection being read (or the document)."""
        if self.stack:
            self.stack[-1].size += count
            grown = self.stack[-1].size
        else:
            self.total += count
            grown = self.total
        if grown > MAX_VALUES:
            self._fail(
                f"aliases expand the document past {MAX_VALUES:,} values (an alias bomb?)", event
            )

    def _enter(self, event: Any) -> None:
        """A node starts: if it is a mapping key, check it against the keys before it."""
        if not self.stack:
            return
        parent = self.stack[-1]
        if not parent.mapping:
            parent.index += 1
            return
        if parent.expect_key:
            self._key(parent, event)
        parent.expect_key = not parent.expect_key

    def _key(self, parent: _Node, event: Any) -> None:
        key = event.value if isinstance(event, yaml.ScalarEvent) else "?"
        line = _line(event) or 0
        if isinstance(event, yaml.ScalarEvent) and not (key == _MERGE_KEY and event.implicit[0]):
            if key in parent.keys:
                first = parent.keys[key]
                lines = f"lines {first} and {line}" if first != line else f"line {line} twice"
                raise DocumentError(
                    f"duplicate key at {lines} (the second would silently replace the first)",
                    where=_path(self.stack, key),
                )
            parent.keys[key] = line
        parent.key = key
        if self.top_keys is not None and len(self.stack) == 1 and key not in self.top_keys:
            message = "unknown key" + did_you_mean(key, self.top_keys)
            raise DocumentError(message, where=_path(self.stack), line=line)


def load_document(text: str, top_keys: Collection[str] | None = None) -> Any:
    """The YAML text as plain data, after `check_document` accepted it."""
    check_document(text, top_keys)
    return yaml.load(text, Loader=_LOADER)
