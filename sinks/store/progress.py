"""The progress half of the Sink protocol, once, for sinks that keep progress in a store.

The lake (`LakeState`) and the table formats (`TableProgress`) each keep a flow's progress
in an object of their own; what the sink adds is only the one-line error naming the flow.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from datetime import datetime
from typing import Protocol

from connectors.timewindow import to_ms
from sinks.base import ChunkRecord, Progress
from sinks.store.layout import check_flow


class ProgressStore(Protocol):
    def progress(self, flow: str) -> Progress: ...
    def chunk_log(self, flow: str, limit: int) -> list[ChunkRecord]: ...
    def flows(self) -> list[str]: ...
    def reset(self, flow: str, member: str | None) -> int: ...
    def forget_after(self, flow: str, moment_ms: int) -> int: ...


class ProgressMethods:
    """progress, chunk_log, flows, reset and forget_after read from `state`, each failure
    a SinkError from the sink's `_errors` naming what was being done."""

    @property
    def state(self) -> ProgressStore:
        raise NotImplementedError

    def _errors(self, action: str) -> AbstractContextManager[None]:
        raise NotImplementedError

    def progress(self, flow: str) -> Progress:
        with self._errors(f"read progress of flow '{check_flow(flow)}'"):
            return self.state.progress(flow)

    def chunk_log(self, flow: str, limit: int = 100) -> list[ChunkRecord]:
        with self._errors(f"read the chunk log of flow '{check_flow(flow)}'"):
            return self.state.chunk_log(flow, limit)

    def flows(self) -> list[str]:
        with self._errors("list flows"):
            return self.state.flows()

    def reset(self, flow: str, member: str | None = None) -> int:
        with self._errors(f"reset flow '{check_flow(flow)}'"):
            return self.state.reset(flow, member)

    def forget_after(self, flow: str, moment: datetime) -> int:
        with self._errors(f"forget progress of flow '{check_flow(flow)}'"):
            return self.state.forget_after(flow, to_ms(moment))
