"""`historian simulate`: the built-in node simulator (connectors/simulator/) served on
loopback until Ctrl-C or SIGTERM."""

from __future__ import annotations

import signal
from typing import TYPE_CHECKING, Annotated

import typer

from pipelines.cli.base import (
    EXIT_USAGE,
    UserError,
    app,
    err,
    out,
    user_errors,
)

if TYPE_CHECKING:
    from connectors.simulator import SimConfig


@app.command()
def simulate(
    port: Annotated[int, typer.Option(help="HTTP port.")] = 3003,
    https_port: Annotated[int, typer.Option(help="HTTPS port (0 = off).")] = 3443,
    token: Annotated[
        str | None,
        typer.Option(help="Require this bearer token.", envvar="HISTORIAN_SIM_TOKEN"),
    ] = None,
    seed: Annotated[int, typer.Option(help="Seed of the deterministic data.")] = 7,
    tags: Annotated[int, typer.Option(help="Number of tags (10..100000).")] = 200,
    raw_cap: Annotated[int, typer.Option(help="Server-side cap of raw samples per tag.")] = 10_000,
    host: Annotated[str, typer.Option(help="Address to bind.")] = "127.0.0.1",
    replay: Annotated[
        bool, typer.Option("--replay", help="Serve repeated history queries from memory.")
    ] = False,
    replay_limit_mb: Annotated[
        int, typer.Option(help="Memory for replayed answers, MB (then no more are kept).")
    ] = 8192,
    replay_compress: Annotated[
        bool, typer.Option("--replay-compress", help="Keep replayed answers zstd-compressed.")
    ] = False,
    period_ms: Annotated[
        int | None,
        typer.Option(help="Sample every tag every N ms on a regular grid (default: mixed)."),
    ] = None,
    profile: Annotated[
        str,
        typer.Option(
            help="How the node reads what the spec leaves open: a profile, a+b, or `list`."
        ),
    ] = "default",
) -> None:
    """Serve the built-in node simulator (the whole REST interface) until Ctrl-C."""
    with user_errors():
        from connectors.simulator import SimConfig

        if profile == "list":
            _print_profiles()
            return
        _check_options(profile, tags=tags, period_ms=period_ms, replay_limit_mb=replay_limit_mb)
        config = SimConfig(
            seed=seed,
            tags=tags,
            token=token,
            raw_cap=raw_cap,
            cache_answers=replay,
            cache_limit_bytes=replay_limit_mb << 20,
            cache_compress=replay_compress,
            period_ms=period_ms,
            profile=profile,
        )
        err.print(
            f"simulator: http://{host}:{port}"
            + (f" (profile {profile})" if profile != "default" else "")
            + (f" and https://{host}:{https_port}" if https_port else "")
            + (" (bearer token required)" if token else ""),
            highlight=False,
        )
        _serve(config, host=host, port=port, https_port=https_port)


def _print_profiles() -> None:
    """`--profile list`: each profile and its behaviours, then what each behaviour does."""
    from connectors.simulator.profiles import BEHAVIOURS, PROFILES

    for name, behaviours in PROFILES.items():
        out.print(f"{name}: {', '.join(sorted(behaviours)) or '-'}", highlight=False)
    for name, what in BEHAVIOURS.items():
        out.print(f"  {name}: {what}", highlight=False, soft_wrap=True)


def _check_options(profile: str, *, tags: int, period_ms: int | None, replay_limit_mb: int) -> None:
    """The options the simulator cannot serve, refused as usage errors before it starts."""
    from connectors.simulator.config import MAX_PERIOD_MS
    from connectors.simulator.profiles import behaviours_of

    try:
        behaviours_of(profile)
    except ValueError as exc:
        raise UserError(f"--profile: {exc}", EXIT_USAGE) from None
    if not 10 <= tags <= 100_000:
        raise UserError("--tags must be between 10 and 100000", EXIT_USAGE)
    if period_ms is not None and not 1 <= period_ms <= MAX_PERIOD_MS:
        raise UserError(f"--period-ms must be between 1 and {MAX_PERIOD_MS}", EXIT_USAGE)
    if replay_limit_mb < 0:
        raise UserError("--replay-limit-mb must not be negative", EXIT_USAGE)


def _serve(config: SimConfig, *, host: str, port: int, https_port: int) -> None:
    """Serve until Ctrl-C or SIGTERM; a port in use is named by its option."""
    from connectors.simulator import serve_forever
    from connectors.simulator.server import PortInUse

    # `kill` stops it as cleanly as Ctrl-C: the servers close and the CA file goes.
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        serve_forever(config, http_port=port, https_port=https_port or None, host=host)
    except PortInUse as exc:
        option = "--port" if exc.port == port else "--https-port"
        raise UserError(f"{option}: {exc.strerror}; choose another port") from None
    except KeyboardInterrupt:
        err.print("simulator stopped")


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt
