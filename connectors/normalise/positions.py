"""Which field an alarm event's array element holds at each position: configured, or proven.

The spec does not show `data` elements of an alarm history answer, and node-facts.md says
accept arrays; an array says nothing of its order, and `status` (0..3) read as `priority`
(1..4) and back fits the column types, so a guessed order stores wrong events silently.
An order is therefore either *configured* (`nodes.<name>.alarm_fields`, checked against
every event) or *proven* by the answer itself: exactly one assignment of the four fields
the pipeline cannot do without (`ts`, `path`, `status`, `priority`) to distinct positions
fits every event (`FITS`). Anything else is a one-line refusal naming the shape.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Callable, Sequence
from typing import Any

from connectors.errors import quoted

# The alarm record's fields (spec: Alarm record) an array position may be given.
KNOWN_FIELDS = ("ts", "path", "status", "priority", "value", "description", "ackInfo")
# The fields an order must place, and so the ones a proof must find.
REQUIRED = ("ts", "path", "status", "priority")
_ISO = re.compile(r"\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}")
_STAMP_FROM = 1_000_000_000  # 2001-09-09 in epoch seconds: no status or priority is near


def _integer(value: Any) -> int | None:
    if type(value) is float and value.is_integer():
        return int(value)
    return value if type(value) is int else None


def _is_stamp(value: Any) -> bool:
    """Epoch seconds or milliseconds after 2001, or an ISO 8601 date and time."""
    number = _integer(value)
    if number is not None:
        return number >= _STAMP_FROM
    return isinstance(value, str) and _ISO.match(value) is not None


def _in(low: int, high: int) -> Callable[[Any], bool]:
    def fits(value: Any) -> bool:
        number = _integer(value)
        return number is not None and low <= number <= high

    return fits


# What a value must be to be the field (spec: status 0..3, priority 1..4; paths absolute).
FITS: dict[str, Callable[[Any], bool]] = {
    "ts": _is_stamp,
    "path": lambda value: isinstance(value, str) and value.startswith("/"),
    "status": _in(0, 3),
    "priority": _in(1, 4),
}


def check_alarm_fields(fields: Sequence[str]) -> tuple[str, ...]:
    """A configured order as given; ValueError names what is wrong with it."""
    names = tuple(fields)
    empty = [name for name in names if not isinstance(name, str) or not name.strip()]
    if empty:
        raise ValueError("every entry must be a field name (like ts, path, status, priority)")
    repeated = sorted({name for name in names if names.count(name) > 1})
    if repeated:
        raise ValueError(f"{', '.join(repeated)} named more than once")
    lacking = [name for name in REQUIRED if name not in names]
    if lacking:
        raise ValueError(f"the order must place {', '.join(lacking)} ({', '.join(REQUIRED)})")
    return names


def _shape(events: Sequence[list[Any]]) -> str:
    return f"alarm events are arrays (the first: {quoted(events[0])})"


def _hint(node: str) -> str:
    return (
        f"set nodes.{node}.alarm_fields to the node's order "
        f"(like [{', '.join(KNOWN_FIELDS)}]); see docs/node-behaviour.md"
    )


def proven_positions(events: Sequence[list[Any]], node: str) -> dict[int, str]:
    """The one order of REQUIRED that fits every event, as {position: field}; ValueError
    (one line: the shape, why nothing is proven, the setting) when none or several fit."""
    width = min(len(event) for event in events)
    candidates = [
        [at for at in range(width) if all(FITS[name](event[at]) for event in events)]
        for name in REQUIRED
    ]
    fitting = [
        chosen
        for chosen in itertools.islice(itertools.product(*candidates), 10_000)
        if len(set(chosen)) == len(chosen)
    ]
    if len(fitting) == 1:
        return {at: name for name, at in zip(REQUIRED, fitting[0], strict=True)}
    if not fitting:
        why = "no order of ts, path, status and priority fits every event"
    else:
        places = "; ".join(
            f"{name} at {' or '.join(str(at) for at in sorted({f[i] for f in fitting}))}"
            for i, name in enumerate(REQUIRED)
        )
        why = f"{len(fitting)} orders fit every event ({places})"
    raise ValueError(f"{_shape(events)} and their field order is not proven: {why}; {_hint(node)}")


def configured_positions(
    events: Sequence[list[Any]], fields: Sequence[str], node: str
) -> dict[int, str]:
    """{position: field} of the configured order; ValueError when an event contradicts it
    (a value that cannot be its field, or an array too short to hold a required field)."""
    positions = dict(enumerate(fields))
    for index, event in enumerate(events):
        for at, name in positions.items():
            fits = FITS.get(name)
            if fits is None:
                continue
            if at >= len(event):
                wrong = f"has no element {at} ({name})"
            elif event[at] is None or fits(event[at]):
                continue
            else:
                wrong = f"holds {quoted(event[at])} at {at}, not a {name}"
            raise ValueError(
                f"{_shape(events)}: event {index} {wrong}, so nodes.{node}.alarm_fields "
                f"[{', '.join(fields)}] is not this node's order"
            )
    return positions


def named_record(
    element: list[Any], positions: dict[int, str]
) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """An array event as the record's known fields and the rest: named fields the record
    does not have under their name, unnamed positions as `_<position>`."""
    record: dict[str, Any] = {}
    rest: dict[str, Any] = {}
    for at, value in enumerate(element):
        name = positions.get(at)
        if name in KNOWN_FIELDS:
            record[name] = value
        else:
            rest[name if name is not None else f"_{at}"] = value
    return record, rest or None
