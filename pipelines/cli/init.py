"""`historian init`: a commented starter flows.yaml for someone starting in an empty
folder. It runs as written (the built-in simulator, a local lake and DuckDB), and its
comments say what to change for a real node."""

from __future__ import annotations

from pathlib import Path

from pipelines.cli.base import (
    DEFAULT_CONFIG,
    EXIT_USAGE,
    ConfigOption,
    UserError,
    app,
    out,
    user_errors,
)

STARTER = """\
# flows.yaml: what to extract, from which node, into which sinks.
#   historian check            # config valid, node reachable, sinks writable (writes nothing)
#   historian plan hourly      # what a run would fetch (writes nothing)
#   historian run --all        # extract every flow now
#   historian state            # how far each flow is, per sink
# Every key is described in docs/configuration.md. `${VAR}` in a value
# is replaced by the environment variable VAR.

nodes:
  plant:
    # The built-in node simulator, so that this file runs as it is. For a real node:
    #   url: https://node.plant.example:3443
    #   ca_bundle: /etc/historian/node-ca.pem   # the CA of a self-signed node
    #   token_env: HISTORIAN_NODE_TOKEN         # the NAME of the variable with the token
    simulator:
      seed: 7
      tags: 200
    max_connections: 4        # concurrent requests to the node
    retries: 5                # transient failures only (timeouts, 429, 5xx)

sinks:
  lake:
    type: parquet
    url: data/lake            # a folder (relative to this file) or s3://bucket/prefix
  warehouse:
    type: sql
    url: duckdb:///data/warehouse.duckdb   # or postgresql+psycopg://user@host/db
    busy_wait: 10m            # a run waits for another process writing this DuckDB file

flows:
  hourly:
    node: plant
    kind: tag_history
    tags:
      # Tags of a group; `regex` is searched in each tag's FULL PATH (not only its name):
      # anchor it (^/Plant A/Line 1/) to mean a prefix. Or list them:  paths: [/a/b, ...]
      # or discover them:  browse: /  include: ["^/Plant B/"]  exclude: ["(?i)test"]
      group: /Plant A/
      regex: "Temp"
      recurrent: true         # include sub-groups
    mode: raw                 # raw, filter, delta or aggregated (+ method, interval)
    window: auto              # chunk size (1h, 1d); auto sizes it from the data's density
    start: -1d                # relative times are evaluated on every run: -1d is "a day
                              # before now" each time, which matters only while nothing
                              # is extracted yet (later runs continue from the watermark)
    lookback: 15m             # re-read this much before the watermark (late samples)
    settle: 1m                # never mark the most recent minute complete
    sinks: [lake, warehouse]
    schedule:                 # used by `historian serve`
      interval: 15m

  quarter_hour_avg:
    node: plant
    tags:
      group: /Plant B/
    mode: aggregated
    method: avg               # first, last, min, max, avg, delta, stddev
    interval: 15m             # one row per tag and 15 minutes, on UTC multiples
    window: 1d                # a multiple of interval
    start: -7d
    sinks: [lake]

  alarms:
    node: plant
    kind: alarm_history
    alarms:
      path: /                 # alarms under this path (with recurrent: true)
      # status: 3             # only 0 cleared+acked, 1 active+acked, 2 cleared+unacked,
      #                       # 3 active+unacked
      # min_priority: 3       # 1 Low, 2 Medium, 3 High, 4 Critical
    window: 1d
    start: -7d
    lookback: 1h
    sinks: [lake, warehouse]
"""


@app.command()
def init(config: ConfigOption = Path(DEFAULT_CONFIG)) -> None:
    """Write a commented starter flows.yaml (never over an existing file): it runs as
    written against the built-in simulator, and says what to change for a real node."""
    with user_errors():
        try:
            with config.open("x", encoding="utf-8") as handle:
                handle.write(STARTER)
        except FileExistsError:
            raise UserError(
                f"{config}: already exists; nothing written (remove it or give --config NEW.yaml)",
                EXIT_USAGE,
            ) from None
        out.print(
            f"wrote {config}: 3 flows on the built-in simulator. Next: historian check, "
            "then historian run --all",
            highlight=False,
        )
