"""Database exceptions -> one-line sink errors: transient (retry later) or not.

Transient means the same request can succeed later without anyone changing anything: the
server refused or dropped the connection, is starting up or shutting down, or the
transaction lost a serialization race. Those become `SinkUnavailable`; every other
database error is a `SinkError`. Messages are one line and never carry the password.
"""

from __future__ import annotations

import re

from sqlalchemy.exc import DBAPIError, SQLAlchemyError

# SQLSTATE classes and codes that mean "try again later" (PostgreSQL Appendix A).
_TRANSIENT_CLASSES = ("08",)  # connection exception
_TRANSIENT_STATES = {
    "57P01",  # admin_shutdown (also pg_terminate_backend)
    "57P02",  # crash_shutdown
    "57P03",  # cannot_connect_now (starting up)
    "53300",  # too_many_connections
    "40001",  # serialization_failure
    "40P01",  # deadlock_detected
}
_DUPLICATE_STATES = {"23505", "21000"}  # unique_violation, cardinality_violation
# MariaDB/MySQL error numbers (PyMySQL's first argument): lost or refused connections,
# server going away or shutting down, lock wait timeout, deadlock.
_MYSQL_TRANSIENT = {1040, 1053, 1205, 1213, 2003, 2006, 2013, 2055}
_MYSQL_DUPLICATE = {1062}
_TRANSIENT_TEXT = (
    "connection refused",
    "server closed the connection",
    "terminating connection",
    "connection is closed",
    "connection already closed",
    "could not connect",
    "connection reset",
    "connection timed out",
    "consuming input failed",
    "the database system is starting up",
    "the database system is shutting down",
    "could not set lock on file",  # DuckDB file held by another process
)


# DuckDB's error for a file another process holds (DuckDB takes one writing process).
_DUCKDB_HELD = re.compile(
    r'Could not set lock on file "(?P<path>[^"]+)".*?\(PID (?P<pid>\d+)\)', re.IGNORECASE
)


def duckdb_holder(exc: BaseException) -> tuple[str, int] | None:
    """(file, pid) when `exc` says another process holds a DuckDB file, else None."""
    match = _DUCKDB_HELD.search(" ".join(str(exc).split()))
    return (match["path"], int(match["pid"])) if match else None


def _driver_error(exc: BaseException) -> BaseException:
    """The DB-API exception under SQLAlchemy's wrapper (or the exception itself)."""
    if isinstance(exc, DBAPIError) and exc.orig is not None:
        return exc.orig
    return exc


def sqlstate(exc: BaseException) -> str | None:
    """The SQLSTATE of a PostgreSQL error, if the driver reported one."""
    state = getattr(_driver_error(exc), "sqlstate", None)
    return state if isinstance(state, str) else None


def _mysql_errno(exc: BaseException) -> int | None:
    """The error number of a PyMySQL error, if that is what it is."""
    driver = _driver_error(exc)
    if type(driver).__module__.split(".")[0] != "pymysql" or not driver.args:
        return None
    number = driver.args[0]
    return number if isinstance(number, int) else None


def is_transient(exc: BaseException) -> bool:
    """Would retrying later, unchanged, plausibly succeed?"""
    if _mysql_errno(exc) in _MYSQL_TRANSIENT:
        return True
    if isinstance(exc, DBAPIError) and exc.connection_invalidated:
        return True
    if isinstance(exc, ConnectionError | TimeoutError):
        return True
    state = sqlstate(exc)
    if state is not None and (state in _TRANSIENT_STATES or state[:2] in _TRANSIENT_CLASSES):
        return True
    driver = _driver_error(exc)
    module = type(driver).__module__.split(".")[0]
    if module == "psycopg" and type(driver).__name__ == "OperationalError" and state is None:
        return True  # raised by libpq itself: the connection failed or was lost
    if module in ("duckdb", "_duckdb") and type(driver).__name__ == "ConnectionException":
        return True
    text = str(driver).lower()
    return any(needle in text for needle in _TRANSIENT_TEXT)


def is_duplicate_key(exc: BaseException) -> bool:
    """Did an insert meet two rows with one key (in the frame itself, after the delete)?"""
    if sqlstate(exc) in _DUPLICATE_STATES or _mysql_errno(exc) in _MYSQL_DUPLICATE:
        return True
    driver = _driver_error(exc)
    text = str(driver)
    return type(driver).__name__ in ("ConstraintException", "InvalidInputException") and (
        "Duplicate key" in text or "same row twice" in text
    )


def is_database_error(exc: BaseException) -> bool:
    """An error raised by SQLAlchemy or by a driver used directly (COPY, Arrow scans)."""
    if isinstance(exc, SQLAlchemyError):
        return True
    module = type(exc).__module__.split(".")[0]
    return module in ("psycopg", "duckdb", "_duckdb", "pymysql")


def one_line(exc: BaseException, secrets: tuple[str, ...] = (), limit: int = 300) -> str:
    """The driver's message on one line, cut to `limit`, with every secret masked."""
    text = " ".join(str(_driver_error(exc)).split()) or type(exc).__name__
    for secret in secrets:
        if secret:
            text = text.replace(secret, "***")
    return text if len(text) <= limit else text[: limit - 3] + "..."
