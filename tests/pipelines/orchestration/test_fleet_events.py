"""Which worker ran each shard, read from the workers' events a page at a time: the
events API refuses pages over 50 (HTTP 422), and a fleet's backfill has more runs."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any

from pipelines.orchestration.fleet import EVENTS_PAGE, workers_of


class Resource(dict[str, str]):
    """A Prefect event resource: its labels, and its id."""

    def __init__(self, labels: dict[str, str], id: str) -> None:
        super().__init__(labels)
        self.id = id


@dataclass
class Event:
    resource: Resource
    related: list[Resource]


@dataclass
class Page:
    events: list[Event]
    next_page: str | None


@dataclass
class EventsAPI:
    """The two calls `workers_of` makes, with the server's page limit."""

    events: list[Event]
    pages: list[int] = field(default_factory=list)

    def _page(self, start: int, limit: int) -> Page:
        assert limit <= 50, "422: limit must be less than or equal to 50"
        self.pages.append(start)
        end = start + limit
        following = f"{end}:{limit}" if end < len(self.events) else None
        return Page(self.events[start:end], following)

    def read_events(self, *, filter: Any, limit: int) -> Page:
        return self._page(0, limit)

    def read_events_page(self, token: str) -> Page:
        start, limit = token.split(":")
        return self._page(int(start), int(limit))


def test_the_workers_of_more_runs_than_a_page_are_all_found() -> None:
    runs = [uuid.uuid4() for _ in range(3 * EVENTS_PAGE + 7)]
    events = [
        Event(
            Resource({"prefect.resource.name": f"w{i % 4}"}, id=f"prefect.worker.process.w{i % 4}"),
            [Resource({}, id=f"prefect.flow-run.{run}")],
        )
        for i, run in enumerate(runs)
    ]
    api = EventsAPI(events)
    found = workers_of(api, runs)
    assert found == {run: f"w{i % 4}" for i, run in enumerate(runs)}
    assert len(api.pages) == 4


class NoPools:
    def read_work_pool(self, name: str) -> None:
        from prefect.exceptions import ObjectNotFound

        raise ObjectNotFound(http_exc=Exception(f"404: {name}"))


def test_a_missing_work_pool_is_one_line_saying_how_to_create_it() -> None:
    import pytest

    from pipelines.config.models import ConfigError
    from pipelines.orchestration.fleet import require_work_pool

    with pytest.raises(ConfigError) as raised:
        require_work_pool(NoPools(), "plant")
    assert str(raised.value) == (
        "no work pool named 'plant' on the Prefect server "
        "(prefect work-pool create plant --type process)"
    )
