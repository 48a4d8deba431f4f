"""Re-planning a table-format commit that another writer beat (`sinks.tables.commit_retry`)."""

from __future__ import annotations

import pytest

from sinks.tables.commit_retry import retry_conflicts


class Beaten(Exception):
    pass


def test_a_lost_race_is_tried_again_and_other_failures_are_not() -> None:
    tries: list[int] = []

    def commit() -> str:
        tries.append(1)
        if len(tries) < 3:
            raise Beaten
        return "done"

    assert retry_conflicts(commit, lambda exc: isinstance(exc, Beaten)) == "done"
    assert len(tries) == 3

    def broken() -> None:
        tries.append(1)
        raise ValueError("not a race")

    tries.clear()
    with pytest.raises(ValueError, match="not a race"):
        retry_conflicts(broken, lambda exc: isinstance(exc, Beaten))
    assert len(tries) == 1


def test_a_race_lost_every_time_ends_with_the_last_failure() -> None:
    def always() -> None:
        raise Beaten("still beaten")

    with pytest.raises(Beaten, match="still beaten"):
        retry_conflicts(always, lambda exc: isinstance(exc, Beaten), attempts=3)
