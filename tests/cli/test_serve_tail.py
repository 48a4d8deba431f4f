"""`historian serve` with a live flow beside a scheduled one: the schedule fires, the tail
(a `<flow>-tail` deployment's run, started by serve) commits, and Ctrl-C stops both:
exit 130 within 5 s, one line, the tail's subscription cancelled on the node, nothing
left running. The node is the simulator on loopback in this process, so the test sees its
subscriptions; serve starts its own Prefect server (`tests/cli/test_schedules.py`)."""

from __future__ import annotations

import signal
import sys
import time
from pathlib import Path

import orjson
import pytest

from connectors.simulator import SimConfig, SimulatedNode, run_server
from tests.cli.test_schedules import (
    descendants,
    first_line,
    running,
    start_serve,
    stopped_at_exit,
    wait_for_runs,
)
from tests.fixtures import write_config
from tests.live_harness import local_tags, sink_frame, wait_until

STOP_S = 5.0


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_serve_runs_a_tail_beside_a_schedule_and_ctrl_c_stops_both(tmp_path: Path) -> None:
    node = SimulatedNode(SimConfig(seed=5, tags=12, period_ms=1000))
    tags = local_tags(node, 4)
    common = {"node": "n", "tags": {"paths": tags}, "mode": "raw", "window": "10m"}
    flows = {
        "sched": {**common, "start": "-5m", "settle": "5s", "schedule": {"interval": "4s"}},
        "live": {
            **common,
            "start": "-1m",
            "settle": "5s",
            "live": {"commit_every": "1s", "poll_every": "250ms", "late_within": "2s"},
        },
    }
    with run_server(node, http_port=0, https_port=None) as server:
        config = write_config(tmp_path, node={"url": server.http_url}, flows=flows, sinks=["lake"])
        serve, out = start_serve(config, tmp_path)
        with stopped_at_exit(serve):
            line = first_line(out, "local Prefect server", serve)
            assert "1 scheduled flows (sched) and 1 live tails (live)" in line, line
            api = line.split(" API ")[1].split()[0]
            wait_for_runs(api, config, 1, lambda: serve.poll() is None)
            wait_until(
                lambda: serve.poll() is None and len(sink_frame(config, "lake", "live")),
                240,
                "the tail's first commit",
            )
            listed = orjson.loads(node.subscriptions.list({}).body)
            assert len(listed) == 1, listed
            below = descendants(serve.pid)
            asked = time.monotonic()
            serve.send_signal(signal.SIGINT)
            code = serve.wait(timeout=60)
            took = time.monotonic() - asked
        assert code == 130, out.read_text()
        assert took < STOP_S, f"serve took {took:.1f} s to stop"
        assert orjson.loads(node.subscriptions.list({}).body) == [], "the tail cancelled it"
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(running(pid) for pid in below):
        time.sleep(0.2)
    assert [pid for pid in below if running(pid)] == [], "serve's children ended with it"
    output = out.read_text()
    assert "Traceback" not in output, output
    errors = [line for line in output.splitlines() if line.startswith("error:")]
    assert errors == ["error: interrupted; committed chunks are kept and the next run continues"]
