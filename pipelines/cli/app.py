"""The `historian` command: the typer app and its entry point. Each group of commands
lives in a module of its own (run, check, simulate, serve, report, flows, init, plan,
state, verify; live/tail) and registers itself on `app` when imported, below.

User errors (bad config, unreachable node, refused credentials, TLS, a sink that cannot
be written, a flow already running) end with one line on stderr and a non-zero exit:
2 for configuration and usage errors, 1 for everything that failed while running.
`HISTORIAN_DEBUG=1` shows the traceback instead, for bug reports. Ctrl-C and SIGTERM end
any command within a few seconds: exit 130 or 143 and one line (`base.Interrupts`).
"""

from __future__ import annotations

import signal
import sys

from pipelines.cli.base import (
    DEFAULT_CONFIG,
    EXIT_FAILED,
    EXIT_USAGE,
    UserError,
    app,
    err,
    interrupts,
)

# The command modules register on `app` when imported: in the order `--help` lists them.
# isort: off
from pipelines.cli import run, check, simulate, serve, report  # noqa: F401
from pipelines.cli import flows, init, plan, state  # noqa: F401
from pipelines.cli import verify  # noqa: F401
from pipelines.cli.live import tail  # noqa: F401

# isort: on

__all__ = ["DEFAULT_CONFIG", "EXIT_FAILED", "EXIT_USAGE", "UserError", "app", "main"]


def main() -> None:
    """Console entry point."""
    from pipelines.core.memory import bound_memory, skip_collection_at_exit
    from pipelines.orchestration.env import configure_prefect

    bound_memory()
    configure_prefect()
    interrupts.install()
    try:
        app()
    except BaseException as exc:
        signum = getattr(exc, "signal", None)  # Prefect's TerminationSignal, in a flow run
        if interrupts.signum is None and signum in (signal.SIGINT, signal.SIGTERM):
            interrupts.signum = signum
        stopped = isinstance(exc, SystemExit) and exc.code in (0, None)  # `simulate`'s end
        if interrupts.signum is not None and not stopped:  # whatever the signal became
            interrupts.finish()
        if isinstance(exc, SystemExit):
            raise
        from pipelines.config.models import ConfigError

        if not isinstance(exc, ConfigError):
            raise
        err.print(f"[bold red]error:[/] {exc}", highlight=False)
        sys.exit(EXIT_USAGE)
    finally:
        skip_collection_at_exit()


if __name__ == "__main__":
    main()
