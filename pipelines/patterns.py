"""The regular expressions of flows.yaml that we match ourselves, in time linear in the text.

A tag selection's `regex`, `include` and `exclude` are searched in every tag path of a
node. Python's `re` backtracks: `^([^!]|[^!])*!$` takes 2^n steps on a path of n
characters, and a flows.yaml pattern would hang a run. RE2 (google-re2) guarantees time
linear in the text, and refuses what needs backtracking (backreferences, lookaround): such
a pattern is refused when the config loads, naming its key. Patterns the node matches (an
alarm flow's `regex`, sent on the wire) are the node's engine's business, not this module's.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import re2

from connectors.errors import QUOTED_CHARS, quoted

# RE2's default memory budget for one compiled pattern (its `max_mem`, 8 MiB): a pattern
# that needs more is refused, so compiling is bounded too.
_OPTIONS = re2.Options()
_OPTIONS.log_errors = False  # the refusal is our one line, not a C++ log line on stderr


@dataclass(frozen=True)
class Pattern:
    """A compiled flows.yaml pattern, searched (not anchored) in a text."""

    text: str
    _compiled: Any = field(repr=False, compare=False)

    def search(self, text: str) -> bool:
        """Whether the pattern occurs anywhere in `text`."""
        return self._compiled.search(text) is not None


def compile_pattern(text: str) -> Pattern:
    """The pattern compiled by RE2; ValueError (one line, the pattern quoted) when RE2
    cannot take it."""
    try:
        return Pattern(text, re2.compile(text, _OPTIONS))
    except re2.error as exc:
        reason = exc.args[0] if exc.args else "invalid"
        if isinstance(reason, bytes):
            reason = reason.decode("utf-8", "replace")
        why = reason if len(reason) <= QUOTED_CHARS else quoted(reason)
        raise ValueError(
            f"invalid regex {quoted(text)}: {why} (matched by RE2, in linear time: "
            "no backreferences or lookaround)"
        ) from None
