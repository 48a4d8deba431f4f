"""A lake dataset's stored facts (`_historian/<dataset>/dataset.json`): kind, scheme, attrs.

The first chunk written to a dataset records them; every later chunk must agree, so that
rows extracted with other settings (another mode, interval) never land silently beside
the old ones (`sinks.identity`; the node is a column, not identity). The partition
scheme is recorded too: under `partition: auto` each dataset picks its scheme once, from
its flow's chunk size, and keeps it. So is the node level (`node_level`): datasets
created now keep each node's rows under `node-<name>/`, so writers of different nodes
touch disjoint directories; datasets of earlier versions (one node each) have none and
keep their layout.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sinks.base import ChunkScope, SinkError
from sinks.identity import differences, identity
from sinks.lake.files import file_metadata
from sinks.store.layout import AUTO, PARTITIONS, STATE_DIR, Owner, auto_partition, node_dir
from sinks.store.objects import LakeStore


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
        facts = self.get(dataset)
        if facts is None:
            scheme = self.partition
            if scheme == AUTO:
                scheme = auto_partition(scope.window_size or scope.window.end - scope.window.start)
            facts = {
                "dataset": dataset,
                "kind": kind,
                "partition": scheme,
                "node_level": True,
                "attrs": identity(scope.attrs),
            }
            self.store.makedirs(self.store.path(STATE_DIR, dataset))
            # Writers in other processes may create it at the same moment (under the
            # dataset's write lock: one at a time): the first one's facts stay.
            if not self.store.exists(self._path(dataset)):
                self.store.write_json(self._path(dataset), facts)
            self._facts.pop(dataset, None)
            return self.check(scope)
        found = differences(facts.get("kind"), facts.get("attrs") or {}, kind, scope.attrs)
        if found:
            raise SinkError(
                f"lake '{self.lake}': dataset '{dataset}' was written with other settings "
                f"({'; '.join(found)}); use another dataset name or reset it"
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

    def node_dir(self, dataset: str, node: str) -> str:
        """Where a node's partitions live inside the dataset: `node-<name>` (encoded), or
        the dataset's top for a dataset of an earlier version (no node level)."""
        facts = self.get(dataset) or {}
        return node_dir(node) if facts.get("node_level") else ""

    def file_metadata(self, dataset: str, kind: str, owners: Sequence[Owner]) -> dict[bytes, bytes]:
        """Schema metadata of a data file of `dataset` whose rows `owners` wrote."""
        facts = self.get(dataset) or {}
        return file_metadata(dataset, kind, facts.get("attrs", {}), owners)
