"""Node errors: each one transient or fatal, never both; messages quote user values cut to
a readable length, with the length said."""

from __future__ import annotations

import pytest

from connectors.errors import (
    QUOTED_CHARS,
    AnswerTooLarge,
    AuthenticationError,
    FatalNodeError,
    MalformedAnswer,
    NodeAnsweredError,
    NodeBusy,
    NodeConnectionError,
    NodeError,
    NodeRequestError,
    NodeServerError,
    NodeTimeout,
    NodeUnavailable,
    NotTheNodesAnswer,
    RateLimited,
    RetriesExhausted,
    SubscriptionGone,
    TLSVerificationError,
    TransientNodeError,
    UnknownTag,
    cut_values,
    one_line,
    quoted,
)
from connectors.facts import NodeMoved
from connectors.pager import ContinuationStuck
from connectors.settings import SettingsError
from connectors.version import UnsupportedByNode

# Every node error there is, and whether asking again unchanged may help.
SPLIT = [
    (NodeConnectionError, True),
    (NodeTimeout, True),
    (NodeUnavailable, True),
    (NodeBusy, True),
    (NotTheNodesAnswer, True),
    (NodeAnsweredError, True),
    (RateLimited, True),
    (RetriesExhausted, False),
    (AuthenticationError, False),
    (TLSVerificationError, False),
    (NodeRequestError, False),
    (NodeServerError, False),
    (MalformedAnswer, False),
    (AnswerTooLarge, False),
    (ContinuationStuck, False),
    (UnknownTag, False),
    (SubscriptionGone, False),
    (SettingsError, False),
    (UnsupportedByNode, False),
    (NodeMoved, False),
]


def _descendants(root: type) -> set[type]:
    found: set[type] = set()
    stack = [root]
    while stack:
        for sub in stack.pop().__subclasses__():
            if sub not in found:
                found.add(sub)
                stack.append(sub)
    return found


@pytest.mark.parametrize(("error", "transient"), SPLIT, ids=[e.__name__ for e, _ in SPLIT])
def test_each_error_is_on_one_side_of_the_split(error: type[NodeError], transient: bool) -> None:
    assert issubclass(error, TransientNodeError) is transient
    assert issubclass(error, FatalNodeError) is not transient


def test_every_node_error_is_in_the_table_and_none_is_both() -> None:
    leaves = _descendants(NodeError) - {TransientNodeError, FatalNodeError}
    assert leaves == {error for error, _ in SPLIT}
    for error in leaves:
        assert issubclass(error, TransientNodeError) != issubclass(error, FatalNodeError), error


def test_spent_retries_are_fatal_and_keep_the_last_failure() -> None:
    last = NodeUnavailable("tag.historyMany", "node unavailable", status=503, body="busy")
    spent = RetriesExhausted(last, 4)
    assert spent.last is last
    assert (
        str(spent)
        == "tag.historyMany: HTTP 503: gave up after 4 attempts: node unavailable: body: busy"
    )


def test_a_short_value_is_its_repr() -> None:
    assert quoted("/Plant A/Temp") == "'/Plant A/Temp'"
    assert quoted(15) == "15"


def test_a_long_string_is_cut_with_its_length() -> None:
    text = quoted("/" + "x" * 99_999)
    assert text == f"{'/' + 'x' * (QUOTED_CHARS - 1)!r}... (100,000 characters)"
    assert quoted(b"\x00" * 500, limit=4) == "b'\\x00\\x00\\x00\\x00'... (500 bytes)"


def test_any_long_repr_is_cut_too() -> None:
    assert quoted(list(range(10_000)), limit=10) == "[0, 1, 2, ... (58,890 characters)"
    assert quoted(10**5000) == "<int>"


def test_cut_values_cuts_a_long_run_once_and_leaves_what_quoted_cut() -> None:
    already = f"tag {quoted('x' * 100_000)} missing"
    assert cut_values(already) == already
    line = cut_values("open /lake/" + "l" * 100_000 + " failed")
    assert line == f"open {'/lake/' + 'l' * 74}... (100,006 characters) failed"
    assert one_line(OSError("name " + "n" * 500)) == f"name {'n' * 80}... (500 characters)"
