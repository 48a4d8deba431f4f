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
    """What is known of the node's own cap on raw samples per tag, shared by a run's pages.

    `known`: the cap, once a guessed one was confirmed. `lower_bound`: the cap, if there is
    one, is at least this: no page held more rows of one tag than the cap. (A guess refuted
    at n rows does not put the cap above n: the tag may have held exactly n.)
    """

    known: int | None = None
    lower_bound: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def observe(self, returned: int) -> None:
        """A page held `returned` rows of one tag: a cap is at least that."""
        if returned > self.lower_bound:
            with self._lock:
                self.lower_bound = max(self.lower_bound, returned)

    def capped(self, returned: int, busiest: int, limit: int | None) -> tuple[bool, bool]:
        """(may be capped, certainly capped) for a tag's page of `returned` rows, the busiest
        tag of that page holding `busiest`."""
        if returned <= 0:
            return False, False
        if limit is not None and returned >= limit:
            return True, True
        if self.known is not None:
            return returned >= self.known, returned >= self.known
        guess = returned == busiest and returned >= max(self.lower_bound, MIN_CAP_GUESS)
        return guess, False

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


@dataclass
class _Cursor:
    last_ms: int | None = None
    kept_at_last: int = 0
    more: bool = True
    # Rows of a first page whose cap was only guessed: learned from the next page.
    guessed_rows: int | None = None


class RawPager:
    """The continuation state of one window's tags: `has_more`, `next_starts`, `advance`."""

    def __init__(
        self,
        tags: Iterable[str],
        window_end_ms: int,
        *,
        cap: CapGuess,
        limit: int | None,
        where: str = "",
    ) -> None:
        self._cursors = {tag: _Cursor() for tag in tags}
        self._end_ms = window_end_ms
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
        ms): tags that stopped on the same millisecond continue in one request. Each maps
        to the rows already kept on that millisecond (to skip when the answer repeats them)."""
        starts: dict[int, dict[str, int]] = {}
        for tag, cursor in self._cursors.items():
            if cursor.more and cursor.last_ms is not None:
                starts.setdefault(cursor.last_ms, {})[tag] = cursor.kept_at_last
        return starts

    def advance(self, pages: Mapping[str, TagPage], *, operation: str) -> None:
        """Move the cursors of the tags `pages` answered; a tag asked and not answered has
        no more (its absence is the caller's business). `operation` names what answered."""
        busiest = max((page.returned for page in pages.values()), default=0)
        for tag, page in pages.items():
            cursor = self._cursors.get(tag)
            if cursor is None or not cursor.more:
                continue
            self._step(tag, cursor, page, busiest, operation)
        self._cap.observe(busiest)

    def finish(self, tags: Iterable[str]) -> None:
        """Tags the caller will not continue (asked, and left out of the answer)."""
        for tag in tags:
            if tag in self._cursors:
                self._cursors[tag].more = False

    def _step(self, tag: str, cursor: _Cursor, page: TagPage, busiest: int, operation: str) -> None:
        first = cursor.last_ms is None
        moved = page.fresh_last_ms is not None
        if cursor.guessed_rows is not None:
            self._cap.learn(cursor.guessed_rows, found_more=moved)
            cursor.guessed_rows = None
        if page.fresh_last_ms is not None:
            if page.fresh_last_ms == cursor.last_ms:
                cursor.kept_at_last += page.fresh_at_last
            else:
                assert cursor.last_ms is None or page.fresh_last_ms > cursor.last_ms
                cursor.last_ms, cursor.kept_at_last = page.fresh_last_ms, page.fresh_at_last
        maybe, certain = self._cap.capped(page.returned, busiest, self._limit)
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
