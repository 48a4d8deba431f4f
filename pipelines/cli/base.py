"""What every `historian` command shares: the typer apps, the consoles, one-line errors,
logging (rich or JSON lines) and reading flows.yaml.

Kept apart from `pipelines.cli.app` so that each group of commands can live in a small module
of its own (`run`, `state`, `plan`, ...) that registers itself on `app`.
"""

from __future__ import annotations

import contextvars
import logging
import os
import signal
import socket
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, NoReturn

import orjson
import typer
from rich.console import Console

from connectors.errors import NodeError, cut_values, one_line, quoted

if TYPE_CHECKING:  # config pulls in pandas and pyarrow: imported when needed
    from pipelines.config.models import Config
    from pipelines.core.runner import ChunkOutcome, RunSummary

app = typer.Typer(
    name="historian",
    help="Extract tag and alarm history from a data node into a Parquet lake or SQL warehouse.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    # click's plain help: flags read `--direct`, not `--direct <bool>`.
    rich_markup_mode=None,
)
state_app = typer.Typer(
    help="Show or reset what each flow has extracted.", no_args_is_help=False, rich_markup_mode=None
)
app.add_typer(state_app, name="state")

out = Console(width=None if sys.stdout.isatty() else 140)
err = Console(stderr=True, width=None if sys.stderr.isatty() else 140)

EXIT_FAILED = 1
EXIT_USAGE = 2
# pipelines.config.models.DEFAULT_CONFIG, spelled here so that the command starts (and a Prefect
# run starts its server) before pandas is imported; a test keeps the two equal.
DEFAULT_CONFIG = "flows.yaml"

ConfigOption = Annotated[
    Path, typer.Option("--config", "-c", help="flows.yaml to use.", envvar="HISTORIAN_CONFIG")
]
NodeOption = Annotated[
    list[str] | None,
    typer.Option(
        "--node",
        "-n",
        help="Only this node of a flow on several nodes (repeat for more). Default: all.",
    ),
]
VerboseOption = Annotated[
    bool, typer.Option("--verbose", "-v", help="Log progress (INFO), with times, to stderr.")
]

LOG_FORMATS = ("text", "json")
# `--log-format`, given before the command (`historian --log-format json run f`).
log_format = contextvars.ContextVar("historian_log_format", default="text")
# The flow (and chunk) a log line is about, for JSON lines.
current_flow: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "historian_flow", default=None
)


def _print_version(value: bool) -> None:
    if value:
        from importlib.metadata import version

        out.print(f"historian-extract {version('historian-extract')}", highlight=False)
        raise typer.Exit()


@app.callback()
def _options(
    version: Annotated[
        bool,
        typer.Option(
            "--version", callback=_print_version, is_eager=True, help="Print the version and exit."
        ),
    ] = False,
    log_format_option: Annotated[
        str,
        typer.Option(
            "--log-format",
            help="text, or json: one JSON object per line (time, level, flow, chunk, "
            "message) on stderr, for a scheduler that collects logs.",
            envvar="HISTORIAN_LOG_FORMAT",
        ),
    ] = "text",
) -> None:
    if log_format_option not in LOG_FORMATS:
        fail(f"--log-format: {quoted(log_format_option)} is not one of text, json", EXIT_USAGE)
    log_format.set(log_format_option)
    if log_format_option == "json":
        json_logs_for_prefect()
    setup_logging(verbose=False)  # every command logs its warnings in the chosen format


INTERRUPTED = "interrupted; committed chunks are kept and the next run continues"


class Interrupted(KeyboardInterrupt):
    """SIGINT or SIGTERM, raised in the main thread so that the command unwinds (sink
    locks released, a Prefect run marked) and exits 128 + the signal: 130 or 143."""

    def __init__(self, signum: int) -> None:
        self.code = 128 + signum
        super().__init__(signal.Signals(signum).name)


class Interrupts:
    """Ctrl-C and SIGTERM end every command within `grace_s` plus a second, with one line.

    The signal raises `Interrupted` in the main thread, so that the command unwinds. A
    thread that watches every signal's arrival (Python's wakeup fd: it sees them whoever's
    handler runs, Prefect's too during a flow run) starts a timer at the first: what has
    not ended after `grace_s` (a fetch waiting on a slow node, a Prefect client retrying a
    server that is gone, a served run's process) is ended: the line, every process below
    this one stopped, `os._exit`. A second signal does that at once. Chunks committed
    are kept either way: each commit is atomic (docs/reliability.md)."""

    grace_s = 3.0

    def __init__(self) -> None:
        self.signum: int | None = None
        self._arrived = 0
        self._said = threading.Event()
        self._last_words: list[Callable[[], None]] = []

    @contextmanager
    def last_words(self, say: Callable[[], None]) -> Iterator[None]:
        """Call `say` if the command is ended by force during the block (it is not when
        the block ends first): a run's record in the run log."""
        self._last_words.append(say)
        try:
            yield
        finally:
            self._last_words.remove(say)

    def install(self) -> None:
        """Take SIGINT and SIGTERM (main thread only), and watch their arrivals."""
        reader, writer = socket.socketpair()
        writer.setblocking(False)
        signal.set_wakeup_fd(writer.fileno(), warn_on_full_buffer=False)
        threading.Thread(target=self._watch, args=(reader, writer), daemon=True).start()
        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, self.on_signal)

    def on_signal(self, signum: int, frame: object) -> None:
        if self.signum is None:
            self.signum = signum
        hush_libraries()
        raise Interrupted(signum)

    def _watch(self, reader: socket.socket, writer: socket.socket) -> None:
        while data := reader.recv(64):
            for signum in data:
                if signum in (signal.SIGINT, signal.SIGTERM):
                    self._arrival(signum)

    def _arrival(self, signum: int) -> None:
        self._arrived += 1
        if self.signum is None:
            self.signum = signum
        hush_libraries()
        if self._arrived > 1:
            self.force()
        timer = threading.Timer(self.grace_s, self.force)
        timer.daemon = True
        timer.start()

    @property
    def code(self) -> int:
        return 128 + (self.signum or signal.SIGINT)

    def say(self) -> None:
        """The one line, once, whichever thread comes first."""
        if self._said.is_set():
            return
        self._said.set()
        if log_format.get() == "json":
            _json_line("ERROR", INTERRUPTED, current_flow.get(), None)
        else:
            err.show_cursor(True)  # a progress bar hid it
            err.print(f"[bold red]error:[/] {INTERRUPTED}", highlight=False, soft_wrap=True)

    def finish(self) -> NoReturn:
        """The line and the exit code, once the command has unwound; what it started and
        did not stop is stopped."""
        from pipelines.orchestration.children import end_descendants

        self.say()
        end_descendants()
        sys.exit(self.code)

    def force(self) -> NoReturn:
        from pipelines.orchestration.children import end_descendants

        for say in list(self._last_words):
            with suppress(Exception):  # the exit must come, whatever these do
                say()
        self.say()
        end_descendants()
        sys.stderr.flush()
        os._exit(self.code)


interrupts = Interrupts()

HUSHED = ("prefect", "websockets", "uvicorn", "httpx", "httpcore", "asyncio", "anyio")


class _Hushed(logging.Filter):
    """Drops the records of the libraries below a command once it is interrupted."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.name.partition(".")[0] not in HUSHED


_hushed = _Hushed()


def hush_libraries() -> None:
    """Keep what an interrupt makes the libraries say off the terminal: Prefect's runner
    logs the `Interrupted` that reached a flow run's start, and its event clients the
    server they lost, each with a traceback, after the one line that matters. The filter
    goes on every handler, because a library's record reaches its ancestors' handlers."""
    loggers = [logging.getLogger(), *logging.Logger.manager.loggerDict.values()]
    for logger in loggers:
        for handler in getattr(logger, "handlers", ()):
            if _hushed not in handler.filters:
                handler.addFilter(_hushed)


class UserError(Exception):
    """A problem the user can fix; printed as one line."""

    def __init__(self, message: str, code: int = EXIT_FAILED) -> None:
        self.code = code
        super().__init__(message)


def fail(message: str, code: int) -> NoReturn:
    """Print `error: message` (one line on stderr, long values cut: `cut_values`, wherever
    the message was built) and exit with `code`."""
    message = cut_values(message)
    if log_format.get() == "json":
        _json_line("ERROR", message, current_flow.get(), None)
    else:
        err.print(f"[bold red]error:[/] {message}", highlight=False, soft_wrap=True)
    raise typer.Exit(code)


@contextmanager
def user_errors() -> Iterator[None]:
    """Turn the project's typed errors into one line and an exit code."""
    if os.environ.get("HISTORIAN_DEBUG") == "1":
        yield
        return
    from pipelines.config.models import ConfigError
    from sinks.base import SinkError

    try:
        yield
    except ConfigError as exc:
        fail(str(exc), EXIT_USAGE)
    except UserError as exc:
        fail(str(exc), exc.code)
    except NodeError as exc:
        fail(f"node: {one_line(exc)}", EXIT_FAILED)
    except SinkError as exc:
        from pipelines.cli.busy import busy_line

        fail(busy_line(exc) or f"sink: {one_line(exc)}", EXIT_FAILED)
    except KeyboardInterrupt as exc:
        interrupts.say()
        raise typer.Exit(exc.code if isinstance(exc, Interrupted) else 130) from None
    except OSError as exc:
        fail(one_line(exc), EXIT_FAILED)
    except Exception as exc:
        line = prefect_api_error(exc)
        if line is None:
            raise
        fail(line, EXIT_FAILED)


@contextmanager
def naming_flow(flow: str) -> Iterator[None]:
    """An unreadable data file met while working on `flow` names the flow in the command
    that repairs it (`historian verify FLOW --repair`)."""
    from sinks.base import UnreadableFile

    try:
        yield
    except UnreadableFile as exc:
        raise exc.for_flow(flow) from exc


def prefect_api_error(exc: BaseException) -> str | None:
    """One line for a Prefect API that cannot be reached or refused a call (a wrong
    PREFECT_API_URL, a server that is down); None for any other error."""
    if "prefect" not in sys.modules:
        return None
    from urllib.parse import urlsplit

    import httpx
    from prefect.exceptions import PrefectHTTPStatusError
    from prefect.settings import get_current_settings

    api = os.environ.get("PREFECT_API_URL") or get_current_settings().api.url or ""
    parts = urlsplit(api)  # shown without userinfo or query, where secrets could be
    host = f"{parts.hostname}:{parts.port}" if parts.port else str(parts.hostname)
    where = f"the Prefect API at {parts.scheme}://{host}{parts.path} (PREFECT_API_URL)"
    if isinstance(exc, PrefectHTTPStatusError):
        status = exc.response.status_code
        return f"{where} answered HTTP {status} to {exc.request.method} {exc.request.url.path}"
    if isinstance(exc, httpx.TransportError):
        try:
            url = str(exc.request.url)
        except RuntimeError:  # no request attached: not a call this can name
            return None
        if api and url.startswith(api.rstrip("/")):
            return f"{where} cannot be reached: {one_line(exc)}"
        return None
    if isinstance(exc, RuntimeError) and str(exc).startswith("Failed to reach API at"):
        return f"{where} cannot be reached"
    if isinstance(exc, RuntimeError) and "ephemeral Prefect API server" in str(exc):
        waited = get_current_settings().server.ephemeral.startup_timeout_seconds
        return (
            f"Prefect's temporary server did not start within {waited} s: raise "
            "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS, point PREFECT_API_URL at a "
            "running server, or run without --prefect (in this process)"
        )
    return None


def _json_line(
    level: str,
    message: str,
    flow: str | None,
    chunk: str | None,
    extra: dict[str, object] | None = None,
) -> None:
    line = {
        "time": datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z"),
        "level": level,
        "flow": flow,
        "chunk": chunk,
        "message": message,
        **(extra or {}),
    }
    sys.stderr.write(orjson.dumps(line).decode() + "\n")
    sys.stderr.flush()


class JsonLines(logging.Handler):
    """One JSON object per line on stderr: time, level, flow, chunk, message; for a
    scheduler that collects logs. `flow` and `chunk` come from the record's extras, else
    from the flow the command is running."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            flow = getattr(record, "flow", None) or current_flow.get()
            chunk = getattr(record, "chunk", None)
            _json_line(record.levelname, record.getMessage(), flow, chunk)
        except Exception:  # a log line must never end a run
            self.handleError(record)


class PrefectJsonLines(JsonLines):
    """`JsonLines` in the place of Prefect's console handlers (its logging.yml passes
    them `stream` and `styles`, which a JSON line has no use for)."""

    def __init__(self, level: int = logging.NOTSET, **_console_options: object) -> None:
        super().__init__(level)


def json_logs_for_prefect() -> None:
    """Prefect's console lines (its server, workers, runs) as JSON lines too, through
    Prefect's documented override of its logging.yml: set before Prefect is imported, and
    inherited by the processes a command starts (`prefect server start`, flow runs)."""
    handler = f"{__name__}.{PrefectJsonLines.__name__}"
    for name in ("CONSOLE", "DEBUG"):
        os.environ.setdefault(f"PREFECT_LOGGING_HANDLERS_{name}_CLASS", handler)


def setup_logging(verbose: bool) -> None:
    """INFO with -v, else WARNING, to stderr, as rich text or JSON lines."""
    level = logging.INFO if verbose else logging.WARNING
    handler: logging.Handler
    if log_format.get() == "json":
        handler = JsonLines()
    else:
        from rich.logging import RichHandler

        handler = RichHandler(console=err, show_path=False, show_time=verbose, markup=False)
    root = logging.getLogger("historian")
    root.handlers[:] = [handler]
    root.setLevel(level)
    root.propagate = False


def load(path: Path) -> Config:
    """flows.yaml, checked (a ConfigError is one line naming the key)."""
    from pipelines.config.models import load_config

    return load_config(path)


def moment(value: str | None, option: str) -> datetime | None:
    """An option's time (ISO 8601 or relative), or a usage error naming the option."""
    if value is None:
        return None
    from pipelines.config.models import parse_moment

    try:
        return parse_moment(value)
    except ValueError as exc:
        raise UserError(f"{option}: {exc}", EXIT_USAGE) from None


def check_flow(config: Config, name: str, source: Path) -> None:
    """A usage error naming the flows there are, when `name` is not one of them."""
    if name not in config.flows:
        from pipelines.config.names import did_you_mean

        known = ", ".join(config.flows)
        hint = did_you_mean(name, config.flows)
        message = f"{source.name}: no flow named {quoted(name)} (flows: {known}){hint}"
        raise UserError(message, EXIT_USAGE)


def json_progress(flow: str, message: str, progress: dict[str, object]) -> None:
    """A progress line under --log-format json, shown with or without -v: the message, and
    its numbers under `progress` for a collector that charts them."""
    _json_line("INFO", message, flow, None, {"progress": progress})


_chunks_log = logging.getLogger("historian.chunks")


def log_chunk(outcome: ChunkOutcome, summary: RunSummary) -> None:
    """One INFO line per committed chunk (shown with -v; a JSON line with its flow, as
    `flow@node` for a node of a flow on several nodes, and chunk under --log-format json)."""
    if _chunks_log.isEnabledFor(logging.INFO):
        _chunks_log.info(
            "committed %s: %d rows",
            outcome.label,
            outcome.rows_fetched,
            extra={"flow": summary.key or summary.flow, "chunk": outcome.chunk_id},
        )
