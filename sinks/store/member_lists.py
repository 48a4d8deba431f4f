"""Content-addressed member lists: a chunk's record names its members by the digest of a
file holding the list, written once and never changed. A flow's chunks share a handful of
lists (the same tags every hour, or each batch's tags in every window), so the records
stay small: the lake's markers and intents, the Iceberg sink's snapshot summaries.

A list is `<directory>/<digest>.json` (blake2b, 16 bytes, hex), cached in memory once read
or written. `load` answers None for a list that is missing or torn and for a "digest"
that is not one (never a path), so a record naming it reads as absent.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence

import orjson

from sinks.store.layout import join
from sinks.store.objects import LakeStore

_DIGEST = re.compile(r"[0-9a-f]{32}")


class MemberLists:
    """Member lists saved under directories of one store (see the module docstring)."""

    def __init__(self, store: LakeStore, *, durable: bool) -> None:
        """`durable`: a list reaches the disk before `save` returns (local disk); without
        it a power cut may leave it torn, and `save` writes it again when it next sees it."""
        self.store = store
        self.durable = durable
        self._lists: dict[tuple[str, str], list[str]] = {}

    def save(self, directory: str, members: Sequence[str]) -> str:
        """The list's digest; the file is written unless it is there, whole."""
        listed = [str(member) for member in members]
        raw = orjson.dumps(listed)
        digest = hashlib.blake2b(raw, digest_size=16).hexdigest()
        if (directory, digest) not in self._lists:
            path = join(directory, f"{digest}.json")
            if self.store.read_bytes(path) != raw:
                self.store.makedirs(directory)
                self.store.write_atomic(path, raw, durable=self.durable)
            self._lists[(directory, digest)] = listed
        return digest

    def load(self, directory: str, digest: str) -> list[str] | None:
        """The list `digest` names; None when it is missing, torn or not a digest."""
        if not _DIGEST.fullmatch(digest):
            return None
        listed = self._lists.get((directory, digest))
        if listed is None:
            value = self.store.read_json(join(directory, f"{digest}.json"), torn_is_missing=True)
            if not isinstance(value, list):
                return None
            listed = self._lists[(directory, digest)] = [str(member) for member in value]
        return listed
