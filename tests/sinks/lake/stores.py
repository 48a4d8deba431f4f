"""A `LakeStore` tests hand to the lake (`ParquetLake(url, store=...)`) or to its parts, to
count, fail or crash chosen file operations of that lake alone, instead of patching the
class every lake in the process shares."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sinks.store.objects import LakeStore

# `around(operation, *args, **kwargs)`: what the hooked operation does instead; calling
# `operation(*args, **kwargs)` does what the store would have done.
Around = Callable[..., Any]


class HookedStore(LakeStore):
    """A LakeStore whose hooked operations go through `around` first, calls the store
    makes to itself (`write_json` to `write_atomic`...) included."""

    def hook(self, name: str, around: Around) -> None:
        operation = getattr(LakeStore, name).__get__(self)

        def hooked(*args: Any, **kwargs: Any) -> Any:
            return around(operation, *args, **kwargs)

        setattr(self, name, hooked)

    def unhook(self, name: str) -> None:
        """`name` does what the store does again."""
        vars(self).pop(name, None)


class Crash(BaseException):
    """A simulated SIGKILL: raised by the n-th file operation, and by every one after it."""


class Crasher:
    """Fails the file operations `ops` of the stores it made from the `at`-th on, once
    armed: a write killed at each of its steps in turn, deterministically."""

    def __init__(self, ops: tuple[str, ...]) -> None:
        self.ops = ops
        self.at: int | None = None
        self.calls = 0

    def store(self, url: str) -> HookedStore:
        """A store over `url` whose `ops` count towards the crash."""
        store = HookedStore(url)
        for name in self.ops:
            store.hook(name, self._step)
        return store

    def _step(self, operation: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        if self.at is not None:
            self.calls += 1
            if self.calls >= self.at:
                raise Crash
        return operation(*args, **kwargs)

    def arm(self, at: int) -> None:
        self.at, self.calls = at, 0

    def disarm(self) -> None:
        self.at = None
