"""Half-open UTC time windows and the conversions between datetimes and epoch milliseconds.

Epoch milliseconds are the node's wire unit (node-facts.md); everything above the
connectors works with timezone-aware UTC datetimes.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def to_ms(moment: datetime) -> int:
    """Epoch milliseconds of an aware datetime (naive datetimes are refused, not guessed)."""
    if moment.tzinfo is None:
        raise ValueError(f"naive datetime {moment.isoformat()} has no timezone; use UTC")
    delta = moment - EPOCH
    return (delta.days * 86_400 + delta.seconds) * 1000 + delta.microseconds // 1000


def from_ms(ms: int) -> datetime:
    """Aware UTC datetime of epoch milliseconds."""
    return datetime.fromtimestamp(ms / 1000, tz=UTC).replace(microsecond=(ms % 1000) * 1000)


def iso_utc(moment: datetime) -> str:
    """ISO 8601 with milliseconds and `Z`, the form the node documents as accepted."""
    moment = moment.astimezone(UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"


@dataclass(frozen=True, order=True)
class Window:
    """A half-open interval [start, end) of aware UTC datetimes."""

    start: datetime
    end: datetime

    def __post_init__(self) -> None:
        if self.start.tzinfo is None or self.end.tzinfo is None:
            raise ValueError("Window bounds must be timezone-aware")
        if self.end <= self.start:
            raise ValueError(f"empty window: {self.start.isoformat()} >= {self.end.isoformat()}")

    @classmethod
    def from_ms(cls, start_ms: int, end_ms: int) -> Window:
        return cls(from_ms(start_ms), from_ms(end_ms))

    @property
    def start_ms(self) -> int:
        return to_ms(self.start)

    @property
    def end_ms(self) -> int:
        return to_ms(self.end)

    def contains_ms(self, ms: int) -> bool:
        return self.start_ms <= ms < self.end_ms

    def overlaps(self, other: Window) -> bool:
        return self.start < other.end and other.start < self.end

    def __str__(self) -> str:
        return f"[{iso_utc(self.start)}, {iso_utc(self.end)})"
