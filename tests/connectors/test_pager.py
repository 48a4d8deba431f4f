"""The raw pager as a state machine: every branch, without I/O."""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from typing import Any

import pytest

from connectors.pager import CapGuess, ContinuationStuck, RawPager, TagPage

END = 10_000


def pager(
    tags: tuple[str, ...] = ("/a",), *, limit: int | None = None, known: int | None = None
) -> RawPager:
    return RawPager(tags, END, cap=CapGuess(known=known), limit=limit, where="1 tag /a [x, +1h)")


@pytest.mark.parametrize(
    ("page", "limit", "known", "more"),
    [
        pytest.param(TagPage(0), 5, None, False, id="no-rows"),
        pytest.param(TagPage(5, reached_end=True), 5, None, False, id="answered-past-the-end"),
        pytest.param(TagPage(4, 900, 1), 5, None, True, id="under-the-limit-a-node-cap-maybe"),
        pytest.param(TagPage(5, 900, 1), 5, None, True, id="at-the-limit"),
        pytest.param(TagPage(7, 900, 1), 5, None, True, id="more-than-the-limit"),
        pytest.param(TagPage(3, 900, 1), None, 3, True, id="at-the-known-cap"),
        pytest.param(TagPage(2, 900, 1), None, 3, False, id="under-the-known-cap"),
        pytest.param(TagPage(3, 900, 1), None, None, True, id="guessed-busiest"),
        pytest.param(TagPage(1, 900, 1), None, None, False, id="one-row-is-no-cap-guess"),
        pytest.param(TagPage(5), 5, None, False, id="capped-but-nothing-in-the-window"),
    ],
)
def test_the_first_page_decides_whether_a_tag_continues(
    page: TagPage, limit: int | None, known: int | None, more: bool
) -> None:
    paging = pager(limit=limit, known=known)
    paging.advance({"/a": page}, operation="tag.historyMany")
    assert paging.has_more is more
    assert paging.next_starts() == ({900: {"/a": 1}} if more else {})


def test_a_tag_that_is_not_the_busiest_is_not_guessed_capped() -> None:
    paging = pager(("/a", "/b"))
    paging.advance(
        {"/a": TagPage(3, 900, 1), "/b": TagPage(2, 800, 1)}, operation="tag.historyMany"
    )
    assert paging.next_starts() == {900: {"/a": 1}}


def test_tags_stopped_on_one_millisecond_continue_together() -> None:
    paging = pager(("/a", "/b", "/c"), limit=3)
    paging.advance(
        {"/a": TagPage(3, 900, 2), "/b": TagPage(3, 900, 1), "/c": TagPage(3, 700, 1)},
        operation="tag.historyMany",
    )
    assert paging.next_starts() == {700: {"/c": 1}, 900: {"/a": 2, "/b": 1}}


def test_rows_on_the_cursor_millisecond_add_up() -> None:
    paging = pager(limit=3)
    paging.advance({"/a": TagPage(3, 900, 2)}, operation="tag.historyMany")
    paging.advance({"/a": TagPage(3, 900, 1)}, operation="tag.historyMany")
    assert paging.cursor("/a") == (900, 3)
    assert paging.has_more


def test_the_cursor_moves_to_the_newest_fresh_row() -> None:
    paging = pager(limit=3)
    paging.advance({"/a": TagPage(3, 900, 1)}, operation="tag.historyMany")
    paging.advance({"/a": TagPage(2, 1500, 1)}, operation="tag.historyMany")
    assert paging.cursor("/a") == (1500, 1)
    assert not paging.has_more


@pytest.mark.parametrize(
    ("limit", "known", "expectation"),
    [
        pytest.param(3, None, pytest.raises(ContinuationStuck), id="limit-is-certain"),
        pytest.param(None, 3, pytest.raises(ContinuationStuck), id="known-cap-is-certain"),
        pytest.param(None, None, nullcontext(), id="a-guess-was-wrong"),
    ],
)
def test_a_capped_page_that_adds_nothing(
    limit: int | None, known: int | None, expectation: AbstractContextManager[Any]
) -> None:
    paging = pager(limit=limit, known=known)
    paging.advance({"/a": TagPage(3, 900, 3)}, operation="tag.historyMany")
    with expectation:
        paging.advance({"/a": TagPage(3)}, operation="tag.historyMany")
        assert not paging.has_more


def test_the_loop_guard_names_the_operation_tag_and_chunk() -> None:
    paging = pager(limit=3)
    paging.advance({"/a": TagPage(3, 900, 3)}, operation="tag.historyFilter")
    with pytest.raises(ContinuationStuck) as caught:
        paging.advance({"/a": TagPage(3)}, operation="tag.historyMany")
    message = str(caught.value)
    assert message.startswith("tag.historyMany: ")
    assert "'/a' in 1 tag /a [x, +1h)" in message
    assert "cannot page past" in message


def test_a_guessed_cap_is_learned_when_the_next_page_holds_more() -> None:
    cap = CapGuess()
    paging = RawPager(("/a",), END, cap=cap, limit=None)
    paging.advance({"/a": TagPage(4, 900, 1)}, operation="tag.historyMany")
    paging.advance({"/a": TagPage(2, 1200, 1)}, operation="tag.historyMany")
    assert cap.known == 4


def test_a_refuted_guess_raises_the_lower_bound() -> None:
    cap = CapGuess()
    paging = RawPager(("/a",), END, cap=cap, limit=None)
    paging.advance({"/a": TagPage(4, 900, 1)}, operation="tag.historyMany")
    paging.advance({"/a": TagPage(1)}, operation="tag.historyMany")
    assert (cap.known, cap.lower_bound) == (None, 4)
    assert cap.capped(3, 3, None) == (False, False), "a cap would be at least 4"
    assert cap.capped(4, 4, None) == (True, False), "a tag may have held exactly the cap"


def test_no_cap_is_guessed_below_the_most_rows_a_page_held() -> None:
    cap = CapGuess()
    paging = RawPager(("/a", "/b"), END, cap=cap, limit=None)
    paging.advance({"/a": TagPage(6, 900, 1)}, operation="tag.historyMany")
    paging.advance({"/b": TagPage(5, 900, 1)}, operation="tag.historyMany")
    assert paging.next_starts() == {900: {"/a": 1}}


def test_a_lower_known_cap_replaces_a_higher_one() -> None:
    cap = CapGuess(known=10)
    cap.learn(6, found_more=True)
    cap.learn(8, found_more=True)
    assert cap.known == 6


def test_finished_tags_have_no_more_and_unknown_tags_are_ignored() -> None:
    paging = pager(("/a", "/b"), limit=2)
    paging.advance(
        {"/a": TagPage(2, 900, 1), "/b": TagPage(2, 900, 1), "/x": TagPage(2, 900, 1)},
        operation="tag.historyMany",
    )
    paging.finish(["/a", "/x"])
    assert paging.next_starts() == {900: {"/b": 1}}


# -- answers capped as a whole (a node whose cap counts the answer, not each tag) ------------

START = 100
MANY = "tag.historyMany"


def whole_pager(
    tags: tuple[str, ...], *, limit: int | None = None, cap: CapGuess | None = None
) -> RawPager:
    return RawPager(tags, END, cap=cap or CapGuess(), limit=limit, start_ms=START, where="w")


def test_an_answer_at_limit_continues_every_tag_short_of_the_end_zero_rows_from_the_start() -> None:
    paging = whole_pager(("/a", "/b", "/c", "/d"), limit=10)
    paging.advance(
        {
            "/a": TagPage(4, END, 1, reached_end=True),
            "/b": TagPage(3, 800, 1),
            "/c": TagPage(3, 700, 1),
            "/d": TagPage(0),
        },
        operation=MANY,
    )
    assert paging.next_starts() == {START: {"/d": 0}, 700: {"/c": 1}, 800: {"/b": 1}}


def test_rows_found_for_a_tag_a_cut_answer_left_short_teach_the_cap_per_answer() -> None:
    cap = CapGuess()
    paging = whole_pager(("/a", "/b", "/c"), cap=cap)
    paging.advance(
        {"/a": TagPage(5, 900, 1), "/b": TagPage(3, 400, 1), "/c": TagPage(0)}, operation=MANY
    )
    cut = {START: {"/c": 0}, 400: {"/b": 1}, 900: {"/a": 1}}  # /a: the busiest, per tag
    assert paging.next_starts() == cut, "the cut's signature: the tag cut, the empty tail"
    paging.advance({"/b": TagPage(2, 600, 1)}, operation=MANY)
    paging.advance({"/c": TagPage(4, 950, 1)}, operation=MANY)
    assert (cap.kind, cap.size) == ("per answer", 8)
    assert cap.answer_capped(8, None)
    assert cap.capped(8, 8, None) == (True, True), "a tag holding a whole answer's worth"


def test_a_suspected_cut_refuted_is_not_suspected_below_that_total_again() -> None:
    cap = CapGuess()
    paging = whole_pager(("/a", "/b", "/c"), cap=cap)
    paging.advance(
        {"/a": TagPage(5, 900, 1), "/b": TagPage(3, 400, 1), "/c": TagPage(0)}, operation=MANY
    )
    paging.advance({"/b": TagPage(1)}, operation=MANY)
    paging.advance({"/c": TagPage(0)}, operation=MANY)
    assert (cap.kind, cap.answer_lower_bound) == (None, 8)
    again = whole_pager(("/a", "/b", "/c"), cap=cap)
    again.advance(
        {"/a": TagPage(4, 900, 1), "/b": TagPage(3, 400, 1), "/c": TagPage(0)}, operation=MANY
    )
    assert not again.has_more


@pytest.mark.parametrize(
    ("pages", "starts"),
    [
        pytest.param(
            {"/a": TagPage(5, 900, 1), "/b": TagPage(3, 400, 1)},
            {400: {"/b": 1}, 900: {"/a": 1}},
            id="cut-in-the-last-tag-suspected",
        ),
        pytest.param(
            {"/a": TagPage(5, END, 1, reached_end=True), "/b": TagPage(0)},
            {START: {"/b": 0}},
            id="an-empty-tail-after-a-whole-tag",
        ),
        pytest.param(
            {"/a": TagPage(0), "/b": TagPage(5, END, 1, reached_end=True)},
            {},
            id="the-last-tag-whole",
        ),
        pytest.param({"/a": TagPage(0), "/b": TagPage(0)}, {}, id="no-rows-at-all"),
    ],
)
def test_the_last_tag_with_rows_decides_a_suspected_cut(
    pages: dict[str, TagPage], starts: dict[int, dict[str, int]]
) -> None:
    paging = whole_pager(tuple(pages))
    paging.advance(pages, operation=MANY)
    assert paging.next_starts() == starts


def test_the_answer_that_confirms_a_cut_per_answer_is_read_with_it() -> None:
    cap = CapGuess()
    paging = whole_pager(("/a", "/b", "/c"), cap=cap)
    paging.advance(
        {"/a": TagPage(5, END, 1, reached_end=True), "/b": TagPage(0), "/c": TagPage(0)},
        operation=MANY,
    )
    assert cap.kind is None
    # /b and /c asked again: /b now has rows and /c is cut inside, not the busiest.
    paging.advance({"/b": TagPage(4, 700, 1), "/c": TagPage(1, 300, 1)}, operation=MANY)
    assert (cap.kind, cap.size) == ("per answer", 5)
    assert paging.next_starts() == {300: {"/c": 1}, 700: {"/b": 1}}


def test_an_answer_above_a_learned_per_answer_cap_unlearns_it() -> None:
    cap = CapGuess(per_answer=8)
    whole_pager(("/a", "/b"), cap=cap).advance(
        {"/a": TagPage(6, 900, 1), "/b": TagPage(5, 800, 1)}, operation=MANY
    )
    assert (cap.kind, cap.per_answer, cap.answer_lower_bound) == (None, None, 11)


def test_an_answer_cut_as_a_whole_that_adds_nothing_stops_naming_the_operation() -> None:
    paging = whole_pager(("/a", "/b"), limit=6)
    paging.advance({"/a": TagPage(6, 900, 6), "/b": TagPage(0)}, operation=MANY)
    with pytest.raises(ContinuationStuck, match=r"^tag.historyMany: .*cut at 6 samples"):
        paging.advance({"/a": TagPage(6), "/b": TagPage(0)}, operation=MANY)
