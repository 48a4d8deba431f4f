"""The live tail as a Prefect flow: one run per tailed flow that runs until it is cancelled.

`historian serve` registers a `<flow>-tail` deployment beside the scheduled ones for every
flow that declares `live:` and starts one run of it (`deployments.serve_flows`); a work
pool gets the same deployment from `historian deploy` (`prefect deployment run
'historian-tail/<flow>-tail'` starts it there). The run's body is the library's tail
(`pipelines.live.tail_flow`), stopped by an event: SIGINT or SIGTERM (serve stopping,
the runner cancelling the run, Ctrl-C at the terminal that serve's runs share) sets it,
so the tail commits what it holds, cancels its subscription on the node and returns,
instead of being unwound at an arbitrary point with its subscription left filling.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pipelines.orchestration.env import configure_prefect

configure_prefect()

from prefect import flow, get_run_logger  # noqa: E402

from pipelines.config.models import load_config  # noqa: E402

TAIL_FLOW = "historian-tail"
TAIL_SUFFIX = "-tail"


@contextmanager
def stopped_by_signals(stop: threading.Event) -> Iterator[None]:
    """SIGINT and SIGTERM set `stop` for the block (main thread only: elsewhere the
    process's own handlers stay, and the run is unwound by them)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    signums = (signal.SIGINT, signal.SIGTERM)
    before = {signum: signal.getsignal(signum) for signum in signums}

    def on_signal(signum: int, frame: object) -> None:
        stop.set()

    for signum in signums:
        signal.signal(signum, on_signal)
    try:
        yield
    finally:
        for signum, handler in before.items():
            signal.signal(signum, handler)


def _tail_run_name() -> str:
    """`f tail 2026-11-22T10:00Z`: the flow tailed and when this run started (UTC)."""
    from prefect.runtime import flow_run

    name = flow_run.parameters.get("flow_name", "flow")
    return f"{name} tail {datetime.now(UTC):%Y-%m-%dT%H:%MZ}"


@flow(name=TAIL_FLOW, flow_run_name=_tail_run_name, log_prints=False)
def tail_flow_run(
    flow_name: str, config_path: str, nodes: list[str] | None = None
) -> dict[str, Any]:
    """Tail one flows.yaml flow (`live:`) into its sinks until the run is cancelled;
    `nodes`: only these nodes of a fleet flow (None: all of them)."""
    from pipelines.live.tail import tail_flow

    path = Path(config_path)
    config = load_config(path)
    logger = get_run_logger()
    stop = threading.Event()
    logger.info("%s: tailing until cancelled", flow_name)
    with stopped_by_signals(stop):
        summary = tail_flow(config, flow_name, nodes=nodes, stop=stop, base=path.parent)
    logger.info(
        "%s: tail stopped after %.0f s: %s rows in %s commits, %s events discarded by the "
        "node, %s gaps re-read by history (%s pending)",
        flow_name,
        summary.seconds,
        f"{summary.rows:,}",
        summary.commits,
        summary.discarded,
        len(summary.gaps_healed),
        len(summary.gaps_pending),
    )
    return {
        "flow": flow_name,
        "rows": summary.rows,
        "commits": summary.commits,
        "discarded": summary.discarded,
        "gaps_healed": len(summary.gaps_healed),
        "gaps_pending": len(summary.gaps_pending),
    }
