"""Continuation of capped raw answers: a small state machine per tag, and the cap guess.

A raw answer holds at most `limit` samples per tag, and a node may cap lower without
saying so (node-facts.md). For every tag of a window the pager keeps a cursor: the newest
timestamp kept so far and how many rows on it. After each page it says whether the tag
`has_more` and from where to ask next (`next_start_ms`: the cursor, asked 1 ms early so a
node whose start bound is exclusive still returns the rest of that millisecond). Only rows
inside the window move a cursor, and a cursor only moves forward: a row stamped before
the window (a garbled or negative timestamp) can never send the next request into the
past. When the node says there may be more but a page adds nothing, the cursor did not
move: the pager raises `ContinuationStuck` (naming the operation that answered) instead
of asking the same question again or dropping rows.

Whether a page was capped is a separate question (`CapGuess`): certain when it holds
`limit` rows or the node's known cap; a guess when no limit was sent (the page's busiest
tag, at least two rows); the guess is confirmed or refuted by the next page and learned.

The spec says `limit` "caps samples in raw mode", not whether per tag or per *answer*. A
node may count the whole `historyMany`/`historyFilter` answer: its first tags whole, one
cut, the rest with no rows. So each answer is also read as a whole: when its total stands
at `limit` or at a learned per-answer cap, every tag of it that stops short of the
window's end continues (a tag with no rows from the window's start: its 0 rows are the
cap's, not the node's "no data"). Without such certainty, the largest answer yet whose last
tag with rows stops short of the window's end may be such a cut: that tag and the tags
after it (no rows) are asked again, and rows found for them confirm the per-answer cap
(`CapGuess.kind`, `CapGuess.size`); none found raises the least such a cap could be.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from connectors.errors import MalformedAnswer

log = logging.getLogger("historian.pager")

# A page whose busiest tag has at least this many rows may have hit an unknown node cap.
MIN_CAP_GUESS = 2


class ContinuationStuck(MalformedAnswer):
    """A capped page added nothing: the next request would ask the same question again."""


@dataclass(frozen=True)
class TagPage:
    """What one answer held for one tag, as the pager needs it.

    `returned` counts the tag's rows inside the query's bounds (what the node's cap
    counts); `fresh_last_ms` is the newest of the rows not kept before (None: the page
    added nothing) and `fresh_at_last` how many of those share it; `reached_end` is true
    when a row stands on the window's end (the node answered past the window: nothing is
    left).
    """

    returned: int
    fresh_last_ms: int | None = None
    fresh_at_last: int = 0
    reached_end: bool = False


@dataclass
class CapGuess:
    """What is known of the node's own cap on raw samples, shared by a run's pages.

    Per tag: `known`, the cap once a guessed one was confirmed; `lower_bound`: the cap, if
    there is one, is at least this (no page held more rows of one tag). (A guess refuted at
    n rows does not put the cap above n: the tag may have held exactly n.) Per answer:
    `per_answer`, the samples a whole answer holds at most, once confirmed (rows found for
    a tag that an answer at that total gave none or too few), and `answer_lower_bound`.
    `kind` and `size` say which was learned (node facts show them).
    """

    known: int | None = None
    lower_bound: int = 0
    per_answer: int | None = None
    answer_lower_bound: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    @property
    def kind(self) -> str | None:
        """`per answer`, `per tag`, or None while no cap was confirmed."""
        if self.per_answer is not None:
            return "per answer"
        return "per tag" if self.known is not None else None

    @property
    def size(self) -> int | None:
        """The learned cap's size in samples (of `kind`), None while none was confirmed."""
        return self.per_answer if self.per_answer is not None else self.known

    def observe(self, returned: int, total: int = 0) -> None:
        """A page held `returned` rows of one tag and `total` in all: a cap is at least
        that, and a per-answer cap below `total` was wrong."""
        if returned > self.lower_bound or total > self.answer_lower_bound:
            with self._lock:
                self.lower_bound = max(self.lower_bound, returned)
                self.answer_lower_bound = max(self.answer_lower_bound, total)
                if self.per_answer is not None and total > self.per_answer:
                    log.info("an answer of %d samples: the node's cap is not per answer", total)
                    self.per_answer = None

    def capped(self, returned: int, busiest: int, limit: int | None) -> tuple[bool, bool]:
        """(may be capped, certainly capped) for a tag's page of `returned` rows, the busiest
        tag of that page holding `busiest`."""
        if returned <= 0:
            return False, False
        if limit is not None and returned >= limit:
            return True, True
        if self.known is not None:
            return returned >= self.known, returned >= self.known
        if self.per_answer is not None and returned >= self.per_answer:
            return True, True  # as many as a whole answer holds: cut, whichever the kind
        guess = returned == busiest and returned >= max(self.lower_bound, MIN_CAP_GUESS)
        return guess, False

    def answer_capped(self, total: int, limit: int | None) -> bool:
        """Whether an answer of `total` samples certainly stopped at a per-answer cap: at
        `limit` exactly (a per-tag reading rarely sums to it), or at the learned cap."""
        if total <= 0:
            return False
        if limit is not None and total == limit:
            return True
        return self.per_answer is not None and total >= self.per_answer

    def may_cap_answer(self, total: int) -> bool:
        """Whether an answer of `total` samples may have met an unknown per-answer cap."""
        return total >= max(self.answer_lower_bound, MIN_CAP_GUESS)

    def learn(self, first_page_rows: int, found_more: bool) -> None:
        """A guessed cap was confirmed (`found_more`: the node held more) or refuted."""
        with self._lock:
            if found_more:
                if self.known is None or first_page_rows < self.known:
                    self.known = first_page_rows
                    log.info("node caps raw answers at %d samples per tag", first_page_rows)
            else:
                # Not above it: a tag may have held exactly as many rows as the cap.
                self.lower_bound = max(self.lower_bound, first_page_rows)

    def learn_answer(self, total: int, found_more: bool) -> None:
        """An answer of `total` samples was cut (`found_more`: a tag it gave no or too few
        rows held more) or was not."""
        with self._lock:
            if found_more:
                if self.per_answer is None or total < self.per_answer:
                    self.per_answer = total
                    log.info("node caps raw answers at %d samples per answer", total)
            else:
                self.answer_lower_bound = max(self.answer_lower_bound, total)


@dataclass(frozen=True)
class _Whole:
    """What an answer as a whole says: certainly cut at a per-answer cap, or the tags a
    suspected cut may have left short (`suspects`), and its total."""

    total: int = 0
    certain: bool = False
    suspects: frozenset[str] = frozenset()


@dataclass
class _Cursor:
    last_ms: int | None = None
    kept_at_last: int = 0
    more: bool = True
    # Rows of a first page whose cap was only guessed: learned from the next page.
    guessed_rows: int | None = None
    # The total of an answer continued as cut per answer, learned from the next page.
    answer_total: int | None = None

    def move(self, page: TagPage) -> bool:
        """Forward to the page's newest fresh row; whether the page added rows."""
        if page.fresh_last_ms is None:
            return False
        if page.fresh_last_ms == self.last_ms:
            self.kept_at_last += page.fresh_at_last
        else:
            assert self.last_ms is None or page.fresh_last_ms > self.last_ms
            self.last_ms, self.kept_at_last = page.fresh_last_ms, page.fresh_at_last
        return True


class RawPager:
    """The continuation state of one window's tags: `has_more`, `next_starts`, `advance`.

    `start_ms`: the window's start, where a tag left without rows by a per-answer cap is
    asked from again (None: such a tag cannot be continued).
    """

    def __init__(
        self,
        tags: Iterable[str],
        window_end_ms: int,
        *,
        cap: CapGuess,
        limit: int | None,
        where: str = "",
        start_ms: int | None = None,
    ) -> None:
        self._cursors = {tag: _Cursor() for tag in tags}
        self._end_ms = window_end_ms
        self._start_ms = start_ms
        self._cap = cap
        self._limit = limit
        self._where = where

    @property
    def has_more(self) -> bool:
        return any(cursor.more for cursor in self._cursors.values())

    def cursor(self, tag: str) -> tuple[int | None, int]:
        """(newest timestamp kept, rows kept on it) of `tag`."""
        cursor = self._cursors[tag]
        return cursor.last_ms, cursor.kept_at_last

    def next_starts(self) -> dict[int, dict[str, int]]:
        """Tags that have more, by the start of their next request (the cursor, in epoch
        ms; the window's start for a tag without rows): tags that stopped on the same
        millisecond continue in one request. Each maps to the rows already kept on that
        millisecond (to skip when the answer repeats them)."""
        starts: dict[int, dict[str, int]] = {}
        for tag, cursor in self._cursors.items():
            if not cursor.more:
                continue
            last = cursor.last_ms if cursor.last_ms is not None else self._start_ms
            if last is not None:
                starts.setdefault(last, {})[tag] = cursor.kept_at_last
        return starts

    def advance(
        self, pages: Mapping[str, TagPage], *, operation: str, total: int | None = None
    ) -> None:
        """Move the cursors of the tags `pages` answered (in the answer's order); a tag
        asked and not answered has no more (its absence is the caller's business).
        `operation` names what answered; `total`: the answer's samples, of tags not in
        `pages` too (default: the sum of `pages`)."""
        busiest = max((page.returned for page in pages.values()), default=0)
        if total is None:
            total = sum(page.returned for page in pages.values())
        cursors = [
            (tag, page, cursor)
            for tag, page in pages.items()
            if (cursor := self._cursors.get(tag)) is not None and cursor.more
        ]
        for _, page, cursor in cursors:  # what earlier guesses meet, before this answer is read
            self._learn(cursor, moved=page.fresh_last_ms is not None)
        whole = self._whole(pages, total)
        moved = False
        for tag, page, cursor in cursors:
            moved = self._step(tag, cursor, page, busiest, operation, whole) or moved
        if whole.certain and not moved:
            raise ContinuationStuck(
                operation,
                f"an answer cut at {total} samples added nothing: more samples on one "
                "millisecond than the node returns in one answer, or the node ignores "
                "start; cannot page past them",
                where=f"{len(pages)} tags" + (f" in {self._where}" if self._where else ""),
            )
        self._cap.observe(busiest, total)

    def finish(self, tags: Iterable[str]) -> None:
        """Tags the caller will not continue (asked, and left out of the answer)."""
        for tag in tags:
            if tag in self._cursors:
                self._cursors[tag].more = False

    def _whole(self, pages: Mapping[str, TagPage], total: int) -> _Whole:
        """The answer as a whole (see the module docstring): certainly cut per answer, or
        suspected of it (the largest answer yet) when its last tag with rows stops short of
        the window's end: that tag and the tags after it (no rows) are the suspects."""
        if self._start_ms is None or len(pages) < 2:
            return _Whole(total)
        if self._cap.answer_capped(total, self._limit):
            return _Whole(total, certain=True)
        if not self._cap.may_cap_answer(total):
            return _Whole(total)
        order = list(pages)
        last = max((i for i, tag in enumerate(order) if pages[tag].returned), default=-1)
        if last < 0:
            return _Whole(total)
        if pages[order[last]].reached_end:  # whole; the tags after it are still suspects
            last += 1
        return _Whole(total, suspects=frozenset(order[last:]))

    def _learn(self, cursor: _Cursor, *, moved: bool) -> None:
        """A guess made on the tag's previous page, met by this one (`moved`: it held more)."""
        if cursor.guessed_rows is not None:
            self._cap.learn(cursor.guessed_rows, found_more=moved)
            cursor.guessed_rows = None
        if cursor.answer_total is not None:
            self._cap.learn_answer(cursor.answer_total, found_more=moved)
            cursor.answer_total = None

    def _step(
        self, tag: str, cursor: _Cursor, page: TagPage, busiest: int, operation: str, whole: _Whole
    ) -> bool:
        """Move one tag's cursor by its page; whether the page added rows."""
        first = cursor.last_ms is None
        moved = cursor.move(page)
        maybe, certain = self._cap.capped(page.returned, busiest, self._limit)
        if not page.reached_end and (whole.certain or tag in whole.suspects):
            # Cut per answer (or suspected): continued whatever its own rows say; rows
            # found for a tag the per-tag reading took as whole confirm that cap.
            if not maybe:
                cursor.answer_total = whole.total
            return moved
        if page.reached_end or not maybe or cursor.last_ms is None:
            cursor.more = False
        elif not moved:
            if certain:
                raise ContinuationStuck(
                    operation,
                    f"a full page of {page.returned} samples added nothing after "
                    f"{cursor.last_ms} ms: more samples on one millisecond than the node "
                    "returns in one answer, or the node ignores start; cannot page past them",
                    where=f"tag {tag!r}" + (f" in {self._where}" if self._where else ""),
                )
            cursor.more = False  # the guess was wrong: this tag was complete
        elif first and not certain:
            cursor.guessed_rows = page.returned
        return moved
