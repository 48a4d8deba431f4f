"""The node's software version, and what the interface can do at that version.

The spec's Versioning section: `minPriority`/`maxPriority` exist from 1.21.13 (before it,
only `priority`, which means a minimum), and the aggregation methods `stddev` and `delta`
from 1.21.10. An older node does not refuse what it does not know: it ignores it, so a
client that does not read the version gets every priority, or another method's numbers,
without a word. The version comes from `system?cmd=status` (`n3.versions`, "an array of
version strings"); how those strings are spelled is not shown, so `node_version` reads
the plausible spellings and picks the node's own among the runtime's.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, replace

from connectors.errors import FatalNodeError
from connectors.options import AlarmFilter

_NUMBER = re.compile(r"(?<![\d.])v?(\d+)\.(\d+)(?:\.(\d+))?")
# Words that mark a string as the node's own software, or as something it runs on.
_OWN = re.compile(r"n3uron|\bn3\b|\bexe\b|bootstrap|historian|\bcore\b", re.IGNORECASE)
_RUNTIME = re.compile(
    r"node\.?js|\bnode\s*v?\d|\bv8\b|openssl|\buv\b|libuv|zlib|\bnpm\b|electron|\bos\b|"
    r"linux|windows|kernel|\bicu\b",
    re.IGNORECASE,
)


@dataclass(frozen=True, order=True)
class NodeVersion:
    """A node version as (major, minor, patch); `text` is how the node spelled it."""

    major: int
    minor: int
    patch: int = 0
    text: str = ""

    def __str__(self) -> str:
        return f"{self.major}.{self.minor}.{self.patch}"

    def at_least(self, other: NodeVersion) -> bool:
        return (self.major, self.minor, self.patch) >= (other.major, other.minor, other.patch)


MIN_MAX_PRIORITY = NodeVersion(1, 21, 13)
STDDEV_AND_DELTA = NodeVersion(1, 21, 10)
NEW_METHODS = frozenset({"stddev", "delta"})


class UnsupportedByNode(FatalNodeError):
    """The flow asks for something the node's version cannot compute or filter."""


def _numbers(text: str) -> NodeVersion | None:
    match = _NUMBER.search(text)
    if match is None:
        return None
    major, minor, patch = match.groups()
    return NodeVersion(int(major), int(minor), int(patch or 0), text.strip())


def node_version(versions: Sequence[object]) -> NodeVersion | None:
    """The node's own version among `n3.versions`; None when no string holds one.

    A string naming the node's software (`N3uron 1.21.5`, `exe: 1.21.5`, `bootstrap@1.21.5`)
    wins; strings naming the runtime (`Node.js v18.19.0`, `v8 10.2`, `openssl 3.0`) never
    count; otherwise the first version-looking string does (`1.21.5`, `v1.21.5-r2`).
    Several own strings: the lowest, since the node can do only what all its parts can.
    """
    own: list[NodeVersion] = []
    plain: list[NodeVersion] = []
    for item in versions:
        if not isinstance(item, str):
            continue
        found = _numbers(item)
        if found is None:
            continue
        if _OWN.search(item):
            own.append(found)
        elif not _RUNTIME.search(item):
            plain.append(found)
    if own:
        return min(own)
    return plain[0] if plain else None


@dataclass(frozen=True)
class AdaptedAlarmFilter:
    """The filter to send to a node of some version, and what to filter here afterwards."""

    sent: AlarmFilter
    max_priority_here: int | None = None


def adapt_alarm_filter(filt: AlarmFilter, version: NodeVersion | None) -> AdaptedAlarmFilter:
    """`filt` as a node of `version` understands it.

    From 1.21.13 the filter goes as it is. Before it, the node knows only `priority` (a
    minimum) and would ignore the others: the minimum is sent as `priority` and the maximum
    is applied to the answer here. An unknown version gets the same, which every version
    reads alike (`priority` stays an alias of `minPriority`).
    """
    if version is not None and version.at_least(MIN_MAX_PRIORITY):
        return AdaptedAlarmFilter(filt)
    minimums = [p for p in (filt.priority, filt.min_priority) if p is not None]
    sent = replace(
        filt,
        priority=max(minimums) if minimums else None,
        min_priority=None,
        max_priority=None,
    )
    return AdaptedAlarmFilter(sent, filt.max_priority)


def check_method(method: str | None, version: NodeVersion | None, *, where: str) -> None:
    """Refuse an aggregation method the node's version cannot compute (it would answer
    another method's numbers, not an error). `where` names the config key."""
    if method not in NEW_METHODS or version is None or version.at_least(STDDEV_AND_DELTA):
        return
    raise UnsupportedByNode(
        "node version",
        f"{where}: method {method!r} needs node version {STDDEV_AND_DELTA} or later; "
        f"the node runs {version}",
    )
