"""A lake dataset's stored facts (`_historian/<dataset>/dataset.json`): kind, scheme, attrs.

The first chunk written to a dataset records them; every later chunk must agree, so that
rows extracted with other settings (another mode, interval, node) never land silently
beside the old ones. The partition scheme is recorded too: under `partition: auto` each
dataset picks its scheme once, from its flow's chunk size, and keeps it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import orjson

from sinks.base import ChunkScope, SinkError
from sinks.lake_files import file_metadata
from sinks.lake_layout import AUTO, PARTITIONS, STATE_DIR, Owner, auto_partition
from sinks.lake_store import LakeStore


def json_value(value: object) -> object:
    """`value` as it reads back from JSON (what a stored attr is compared with)."""
    return orjson.loads(orjson.dumps(value, default=str))


class DatasetFacts:
    """The datasets' stored facts, read once per dataset and process."""

    def __init__(self, store: LakeStore, *, lake: str, partition: str) -> None:
        self.store = store
        self.lake = lake
        self.partition = partition
        self._facts: dict[str, dict[str, Any]] = {}

    def _path(self, dataset: str) -> str:
        return self.store.path(STATE_DIR, dataset, "dataset.json")

    def get(self, dataset: str) -> dict[str, Any] | None:
        """The stored facts, None for a dataset never written."""
        if dataset not in self._facts:
            value = self.store.read_json(self._path(dataset))
            if not isinstance(value, dict):
                return None
            self._facts[dataset] = value
        return self._facts[dataset]

    def check(self, scope: ChunkScope) -> dict[str, Any]:
        """The dataset's stored facts; the first write stores them, later ones must agree.

        The partition scheme is one of them: `auto` picks it here, once, from the flow's
        chunk size (`auto_partition`); a dataset keeps the scheme it was created with.
        """
        dataset, kind = scope.dataset, scope.kind
        wanted = {key: json_value(value) for key, value in sorted(scope.attrs.items())}
        facts = self.get(dataset)
        if facts is None:
            scheme = self.partition
            if scheme == AUTO:
                scheme = auto_partition(scope.window_size or scope.window.end - scope.window.start)
            facts = {"dataset": dataset, "kind": kind, "partition": scheme, "attrs": wanted}
            self.store.makedirs(self.store.path(STATE_DIR, dataset))
            self.store.write_json(self._path(dataset), facts)
            self._facts[dataset] = facts
            return facts
        differences = []
        if facts.get("kind") != kind:
            differences.append(f"kind: stored {facts.get('kind')!r}, now {kind!r}")
        stored = facts.get("attrs") or {}
        for key in sorted(set(stored) | set(wanted)):
            if stored.get(key) != wanted.get(key):
                differences.append(f"{key}: stored {stored.get(key)!r}, now {wanted.get(key)!r}")
        if differences:
            raise SinkError(
                f"lake '{self.lake}': dataset '{dataset}' was written with other settings "
                f"({'; '.join(differences)}); use another dataset name or reset it"
            )
        if self.partition != AUTO and facts.get("partition") != self.partition:
            raise SinkError(
                f"lake '{self.lake}': dataset '{dataset}' is partitioned by "
                f"{facts.get('partition')}, not {self.partition}; use another dataset name, "
                f"or partition: auto (each dataset keeps its own scheme)"
            )
        return facts

    def scheme(self, dataset: str) -> str:
        """The partition scheme the dataset was created with."""
        facts = self.get(dataset) or {}
        scheme = facts.get("partition")
        if scheme not in PARTITIONS:
            raise SinkError(
                f"lake '{self.lake}': dataset '{dataset}' records partition {scheme!r}, "
                f"not one of {', '.join(PARTITIONS)}"
            )
        return str(scheme)

    def file_metadata(self, dataset: str, kind: str, owners: Sequence[Owner]) -> dict[bytes, bytes]:
        """Schema metadata of a data file of `dataset` whose rows `owners` wrote."""
        facts = self.get(dataset) or {}
        return file_metadata(dataset, kind, facts.get("attrs", {}), owners)
