"""What the pipeline knows about one node: who it is, its version, its clock, and the
readings of the spec's open points it learned (or assumed) about it.

`read_facts` asks the node what can change between runs, cheaply, once per run: one
`system?cmd=status` (`n3.versions`, `n3.node`, `sys.ts`) and one `license?cmd=getUid`
(`uid`). The other fields are learned by probes elsewhere (timestamp unit, raw cap, bucket
stamping, browse `recurrent`, details keying: `connectors/probes.py`, asked by `historian
check`); None in a slot means "not probed": `lines()`
says so rather than guess.

Identity (issue 27, item 10): progress belongs to the node it was extracted from. The node
names itself (`n3.node`) and its license names its machine (`uid`); when it says neither,
its URL is all there is. A URL alone changing (a new address, http to https) is the same
node when the node still says it is.

Clock (item 9): the node stamps its samples with its own clock, so what it holds ends at
its `sys.ts`, whatever ours says.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import orjson

from connectors.admin import NodeAdmin
from connectors.client import NodeClient
from connectors.errors import FatalNodeError, RetriesExhausted, one_line
from connectors.models import SystemStatus
from connectors.timewindow import iso_utc
from connectors.version import NodeVersion, node_version

log = logging.getLogger("historian.nodes")

# A clock difference the user is told about (check, run summary); smaller ones are the
# time a request takes.
SKEW_SHOWN = timedelta(seconds=5)
NOT_PROBED = "not probed"


class NodeMoved(FatalNodeError):
    """A unit's progress was extracted from another node than the one its flow now names."""


@dataclass(frozen=True)
class NodeIdentity:
    """Who a node says it is (`n3.node`, license `uid`); `url` where it says neither."""

    name: str | None = None
    uid: str | None = None
    url: str | None = None

    @property
    def told(self) -> bool:
        """Whether the node named itself (else only its URL identifies it)."""
        return self.name is not None or self.uid is not None

    def key(self) -> str:
        """A stable text form (what progress records): JSON, any characters allowed."""
        if self.told:
            return orjson.dumps({"name": self.name, "uid": self.uid}).decode()
        return orjson.dumps({"url": self.url}).decode()

    @classmethod
    def from_key(cls, key: str) -> NodeIdentity:
        """The identity `key()` wrote; an unreadable key is an identity of nothing known."""
        try:
            data = orjson.loads(key)
        except orjson.JSONDecodeError:
            return cls()
        if not isinstance(data, dict):
            return cls()
        return cls(**{k: _text(data.get(k)) for k in ("name", "uid", "url")})

    def same_node(self, other: NodeIdentity) -> bool:
        """Whether two identities may be one node: what both say agrees (a uid one side
        could not read is no difference); the URLs decide only when neither named itself."""
        if self.told and other.told:
            return all(
                a is None or b is None or a == b
                for a, b in ((self.name, other.name), (self.uid, other.uid))
            )
        if not self.told and not other.told:
            return self.url == other.url
        return False

    def __str__(self) -> str:
        if not self.told:
            where = f" at {self.url}" if self.url else ""
            return f"unnamed (no n3.node, no uid){where}"
        name = repr(self.name) if self.name is not None else "unnamed"
        return f"{name} (uid {self.uid})" if self.uid is not None else name


@dataclass(frozen=True)
class NodeClock:
    """The node's `sys.ts` and our clock when it was read (the request's middle), as a
    date and as `time.monotonic()` (how a run with a given `now` places the reading)."""

    node_ms: int
    read_at: datetime
    read_monotonic: float = 0.0

    @property
    def node_time(self) -> datetime:
        return datetime.fromtimestamp(self.node_ms / 1000, tz=UTC)

    @property
    def skew(self) -> timedelta:
        """The node's clock minus ours (negative: the node is behind)."""
        return self.node_time - self.read_at


@dataclass(frozen=True)
class NodeFacts:
    """What a run learned or assumed about a node; None in a slot: not known, not probed."""

    identity: NodeIdentity
    version: NodeVersion | None = None
    clock: NodeClock | None = None
    # Learned by probes of their own (issue 27 items 1-7), wired in where they are learned.
    timestamp_unit: str | None = None
    raw_cap: str | None = None
    bucket_stamping: str | None = None
    browse_recurrent: bool | None = None
    details_keyed_by: str | None = None

    def lines(self) -> list[str]:
        """One `what: value` line per fact, for `historian check`."""
        version = "unknown"
        if self.version is not None:
            version = str(self.version)
            if self.version.text and self.version.text != version:
                version += f" ({self.version.text!r})"
        recurrent = {True: "honoured", False: "ignored (always recurses)", None: NOT_PROBED}
        return [
            f"identity: {self.identity}",
            f"version: {version}",
            f"clock: {describe_skew(self.clock)}",
            f"timestamp unit: {self.timestamp_unit or NOT_PROBED}",
            f"raw cap: {self.raw_cap or 'learned by runs (answers at limit or a cap continued)'}",
            f"bucket stamping: {self.bucket_stamping or NOT_PROBED}",
            f"browse recurrent: {recurrent[self.browse_recurrent]}",
            f"details keyed by: {self.details_keyed_by or NOT_PROBED}",
        ]


def describe_skew(clock: NodeClock | None) -> str:
    """`in step`, `10 min behind ours (node 2026-...)`, or `unknown (no sys.ts)`."""
    if clock is None:
        return "unknown (no sys.ts): runs end at our clock minus settle"
    skew = clock.skew
    if abs(skew) <= SKEW_SHOWN:
        return "in step with ours"
    side = "behind" if skew < timedelta(0) else "ahead of"
    return f"{short_span(abs(skew))} {side} ours (node says {iso_utc(clock.node_time)})"


def skew_note(node: str, skew: timedelta | None) -> str | None:
    """The run summary's line about a node clock that differs from ours, when it matters."""
    if skew is None or abs(skew) <= SKEW_SHOWN:
        return None
    if skew < timedelta(0):
        return (
            f"node {node}'s clock is {short_span(-skew)} behind ours: windows are complete "
            "up to its own time minus settle, the rest waits for the next run"
        )
    return (
        f"node {node}'s clock is {short_span(skew)} ahead of ours: windows are complete up "
        "to our time minus settle, its newer samples wait for the next run"
    )


def short_span(span: timedelta) -> str:
    """`42 s`, `10 min`, `3.5 h`, `2.0 days`: a skew as a person reads it."""
    seconds = span.total_seconds()
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    if seconds < 172_800:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86_400:.1f} days"


def read_facts(client: NodeClient, name: str, url: str) -> NodeFacts:
    """The node's identity, version and clock, asked now (two requests). A node that does
    not answer at all (`RetriesExhausted`) stops the caller; one that refuses either
    question leaves those facts unknown, with a warning naming the node."""
    status, clock = _status(client, name)
    n3 = status.n3 if status is not None else None
    versions = n3.versions if n3 is not None else []
    found = node_version(versions)
    if status is not None and found is None:
        log.warning("node %s: no version among n3.versions %r", name, versions[:5])
    identity = NodeIdentity(n3.node if n3 is not None else None, _uid(client), url)
    return NodeFacts(identity, found, clock)


def _status(client: NodeClient, name: str) -> tuple[SystemStatus | None, NodeClock | None]:
    """`system?cmd=status` and the clock it shows (None when it has no `sys.ts`)."""
    before, began = time.time(), time.monotonic()
    try:
        status = client.system_status()
    except RetriesExhausted:
        raise  # the node is not answering at all: nothing else will work either
    except FatalNodeError as exc:
        log.warning("node %s: cannot read its version (%s)", name, one_line(exc))
        return None, None
    middle = datetime.fromtimestamp((before + time.time()) / 2, tz=UTC)
    ts = status.sys.ts if status.sys is not None else None
    if not isinstance(ts, int):
        return status, None
    return status, NodeClock(ts, middle, (began + time.monotonic()) / 2)


def _uid(client: NodeClient) -> str | None:
    """The license uid; None when the node (or the credentials' role) does not say."""
    try:
        answer = NodeAdmin(client).license_get_uid()
    except RetriesExhausted:
        raise
    except FatalNodeError as exc:
        log.info("license uid not read (%s)", one_line(exc))
        return None
    return answer.uid or None


def _text(value: object) -> str | None:
    return value if isinstance(value, str) else None
