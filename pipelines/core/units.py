"""One flow run over its units: one (flow, node) each, for a flow on a fleet of nodes.

A flow whose `node:` is a list or a pattern extracts every node it names (or those
`RunRequest.nodes` selects). Each node is a unit (`runner.FlowRun`) with its own lock in
every sink, plan, watermark, progress and summary, keyed `flow@node`
(`pipelines.config.models.unit_key`), so two processes running one flow on different nodes do
not block each other, and two on the same node stop at its lock as before.

The run:

1. takes each unit's lock and opens its node, here (a unit whose lock is held or whose
   node cannot be opened fails alone);
2. plans the units in parallel (their node requests overlap; their few sink calls take
   turns: a sink's connection serves one caller at a time); fetching starts when every
   unit has planned or failed to (a node that does not answer fails at its timeouts);
3. fetches every unit's chunks at once, each node bounded by its own `max_connections`
   (the engine's threads, or Prefect tasks), and writes them through ONE writer loop
   (`runner.write_all`): a DuckDB file has one writing process and its connection is not
   thread-safe, and each write stays atomic and idempotent;
4. compacts the dataset once and records each unit's watermark.

A node that fails (down, refusing, answering garbage) fails its unit only: the others'
chunks are still fetched, written and recorded, and the run ends in `RunFailed` naming
the failed nodes (exit 1); running again continues the failed units where they stopped.
A sink that fails a write stops the whole run (every unit writes to it).
"""

from __future__ import annotations

import contextvars
import queue
import threading
import time
from collections.abc import Generator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, as_completed
from contextlib import ExitStack
from datetime import datetime

from connectors.errors import NodeError, one_line
from pipelines.config.destinations import SinkSet
from pipelines.config.models import Config
from pipelines.config.nodes import NodePool
from pipelines.core.engine import ChunkResult
from pipelines.core.memory import freeze_imports
from pipelines.core.runner import (
    THREADS,
    FlowRun,
    Plan,
    PlanCallback,
    ProgressCallback,
    RunFailed,
    RunRequest,
    RunSummary,
    Submitter,
    WorkItem,
    write_all,
)
from pipelines.state import stored_watermark
from sinks.base import SinkError

# Units planned at once (their requests are a handful each: a fleet of hundreds of nodes
# plans in waves).
MAX_PLANNING = 16
_END = object()


def selected_nodes(config: Config, name: str, request: RunRequest) -> list[str]:
    """The nodes this run extracts: the flow's, or those of them the request names."""
    return config.select_nodes(name, request.nodes)


class _Units:
    """The units of one run and what happened to each."""

    def __init__(self, units: list[FlowRun]) -> None:
        self.all = units
        self.failed: dict[str, BaseException] = {}

    def fail(self, unit: FlowRun, exc: BaseException) -> None:
        if unit.node_name not in self.failed:
            self.failed[unit.node_name] = exc
            unit.summary.error = one_line(exc)

    def live(self) -> list[FlowRun]:
        return [unit for unit in self.all if unit.node_name not in self.failed]


def run_flow(
    config: Config,
    name: str,
    *,
    nodes: NodePool,
    sinks: SinkSet,
    request: RunRequest | None = None,
    on_chunk: ProgressCallback | None = None,
    on_plan: PlanCallback | None = None,
    now: datetime | None = None,
    submit: Submitter = THREADS,
) -> RunSummary:
    """Run one flow start to end: the one loop of the direct path and of Prefect's flows.

    Lock, plan, fetch and write every selected unit of the flow: each (flow, node) with
    its own lock, plan, watermark and summary, fetching in parallel; one node failing
    leaves the others' work complete and recorded. `submit` says where the plans and the
    fetches run (the engine's threads by default; Prefect tasks in a flow run). Node and
    sink failures come out as `RunFailed` carrying the partial summary; the original
    error is its `__cause__`.
    """
    freeze_imports()
    request = request or RunRequest()
    chosen = selected_nodes(config, name, request)
    guard = threading.Lock() if len(chosen) > 1 else None
    units = _Units(
        [
            FlowRun(
                config,
                name,
                nodes=nodes,
                sinks=sinks,
                request=request,
                now=now,
                node=node,
                sink_guard=guard,
            )
            for node in chosen
        ]
    )
    began = time.perf_counter()
    with ExitStack() as stack:
        for unit in units.all:
            try:
                stack.enter_context(unit)
                unit.node  # noqa: B018 - opened here: a NodePool is not shared by threads
            except (NodeError, SinkError) as exc:
                units.fail(unit, exc)
        _plan_all(units, submit, on_plan)
        _write_all(units, submit, on_chunk)
        _finish(units)
    for unit in units.all:
        unit.summary.seconds = time.perf_counter() - began
    return _outcome(config, name, units)


def _plan_all(units: _Units, submit: Submitter, on_plan: PlanCallback | None) -> None:
    """Plan every live unit (on threads when there are several); `on_plan` here, in order
    of completion."""
    planner = submit.plan
    live = units.live()
    if len(live) == 1:
        try:
            planned = planner(live[0])
        except (NodeError, SinkError) as exc:
            units.fail(live[0], exc)
            return
        if on_plan is not None:
            on_plan(planned)
        return
    with ThreadPoolExecutor(max_workers=min(MAX_PLANNING, max(1, len(live)))) as pool:
        futures: dict[Future[Plan], FlowRun] = {
            pool.submit(contextvars.copy_context().run, planner, unit): unit for unit in live
        }
        unexpected: BaseException | None = None
        for future in as_completed(futures):
            error = future.exception()
            if isinstance(error, NodeError | SinkError):
                units.fail(futures[future], error)
            elif error is not None:
                unexpected = unexpected or error
            elif on_plan is not None:
                on_plan(future.result())
        if unexpected is not None:
            raise unexpected


def _write_all(units: _Units, submit: Submitter, on_chunk: ProgressCallback | None) -> None:
    """Every planned unit's chunks, fetched in parallel, through one writer loop. A sink
    failing a write fails every unit still under way."""
    live = [unit for unit in units.live() if unit.plan_ is not None]
    if not live:
        return
    merged = _merged([_stream(unit, submit, units) for unit in live])
    try:
        write_all(merged, live[0].write_depth(), on_chunk)
    except SinkError as exc:
        for unit in live:
            units.fail(unit, exc)
    finally:
        merged.close()  # the fetching threads end now, not when the generator is collected


def _stream(unit: FlowRun, submit: Submitter, units: _Units) -> Generator[WorkItem]:
    """A unit's fetched chunks as work items; a node failure ends (and fails) the unit."""
    try:
        for result in unit.results(submit):
            yield unit, result
            del result
    except NodeError as exc:
        units.fail(unit, exc)


def _merged(streams: Sequence[Generator[WorkItem]]) -> Generator[WorkItem]:
    """The items of every stream as they come: each stream is drained on a thread of its
    own (in a copy of this context: a Prefect flow run's tasks are submitted from there),
    through a small queue that holds them back when the writer is behind."""
    if len(streams) == 1:
        yield from streams[0]
        return
    items: queue.Queue[object] = queue.Queue(maxsize=2 * len(streams))
    stop = threading.Event()

    def put(item: object) -> bool:
        while not stop.is_set():
            try:
                items.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def pump(stream: Generator[WorkItem]) -> None:
        try:
            for item in stream:
                if not put(item):
                    break
        except BaseException as exc:  # a bug: raised in the writer's thread
            put(exc)
        finally:
            stream.close()
            put(_END)

    threads = [
        threading.Thread(
            target=contextvars.copy_context().run, args=(pump, stream), name="unit", daemon=True
        )
        for stream in streams
    ]
    for thread in threads:
        thread.start()
    try:
        ended = 0
        while ended < len(threads):
            item = items.get()
            if item is _END:
                ended += 1
            elif isinstance(item, BaseException):
                raise item
            else:
                yield item  # type: ignore[misc]
    finally:
        stop.set()
        for thread in threads:
            thread.join()


def _finish(units: _Units) -> None:
    """Compact the dataset once (all units write it), then each unit's watermark (a failed
    unit's as its sinks hold it)."""
    written = [unit for unit in units.all if unit.summary.chunks_done]
    if written:
        written[0].compact()
    for unit in units.all:
        if unit.node_name in units.failed:
            _stored_watermark(unit)
        else:
            unit.finish()


def _stored_watermark(unit: FlowRun) -> None:
    """A failed unit's watermark as its sinks hold it, read as `historian state` reads it
    (a sink failing to say leaves it unknown: the failure is the news)."""
    try:
        progresses = [sink.progress(unit.key) for sink in unit.sinks]
    except SinkError:
        return
    marks = [stored_watermark(progress, unit.flow_config.start) for progress in progresses]
    known = [mark for mark in marks if mark is not None]
    unit.summary.watermark_after = min(known) if known and len(known) == len(marks) else None


def _outcome(config: Config, name: str, units: _Units) -> RunSummary:
    """The run's summary: the unit's own for a one-node flow, else the fleet's totals with
    one summary per unit; RunFailed when a unit failed."""
    if not config.flows[name].fleet:
        (unit,) = units.all
        summary = unit.summary
        if units.failed:
            exc = units.failed[unit.node_name]
            raise RunFailed(one_line(exc), summary, [unit.node_name]) from exc
        return summary
    summary = combined([unit.summary for unit in units.all])
    if units.failed:
        failed = sorted(units.failed)
        reasons = "; ".join(f"node {n}: {one_line(units.failed[n])}" for n in failed[:3])
        more = f"; and {len(failed) - 3} more" if len(failed) > 3 else ""
        message = f"{len(failed)} of {len(units.all)} nodes failed: {reasons}{more}"
        summary.error = message
        raise RunFailed(message, summary, failed) from units.failed[failed[0]]
    return summary


def combined(parts: list[RunSummary]) -> RunSummary:
    """A fleet flow run's summary: the totals of its units' (kept in `units`)."""
    first = parts[0]
    total = RunSummary(
        first.flow, first.dataset, first.kind, ", ".join(p.node for p in parts), key=first.flow
    )
    total.units = parts
    for part in parts:
        total.chunks_planned += part.chunks_planned
        total.chunks_skipped += part.chunks_skipped
        total.chunks_done += part.chunks_done
        total.rows += part.rows
        total.requests += part.requests
        total.bytes_received += part.bytes_received
        total.tags += part.tags
        total.rows_per_tag.update(part.rows_per_tag)
        total.bad_quality_per_tag.update(part.bad_quality_per_tag)
        total.rows_out_of_range += part.rows_out_of_range
        total.values_not_of_type += part.values_not_of_type
        total.sinks.update(part.sinks)
        total.notes += [f"node {part.node}: {remark}" for remark in part.remarks]
    total.seconds = max(part.seconds for part in parts)
    befores = [p.watermark_before for p in parts]
    afters = [p.watermark_after for p in parts]
    total.watermark_before = None if None in befores else min(befores)  # type: ignore[type-var]
    total.watermark_after = None if None in afters else min(afters)  # type: ignore[type-var]
    windows = {p.window for p in parts if p.window is not None}
    total.window = next(iter(windows)) if len(windows) == 1 else None
    total.window_auto = any(p.window_auto for p in parts)
    return total


__all__ = ["ChunkResult", "combined", "run_flow", "selected_nodes"]
