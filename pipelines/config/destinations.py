"""Open the sinks a config names, with relative paths taken from the config's directory."""

from __future__ import annotations

from pathlib import Path
from types import TracebackType

from pipelines.config.models import (
    Config,
    DeltaSinkConfig,
    IcebergSinkConfig,
    ParquetSinkConfig,
    SinkConfig,
)
from sinks.base import Sink


def _local_path(url: str, base: Path) -> str:
    if "://" in url:
        return url
    path = Path(url).expanduser()
    return str(path if path.is_absolute() else base / path)


def _sql_url(url: str, base: Path) -> str:
    """Relative DuckDB/SQLite file URLs are relative to the config file, like lake paths."""
    for prefix in ("duckdb:///", "sqlite:///"):
        if url.startswith(prefix):
            rest = url[len(prefix) :]
            if rest and not rest.startswith("/") and not rest.startswith(":memory:"):
                return prefix + str(base / rest)
    return url


def make_sink(
    name: str, config: SinkConfig, base: Path, *, writing: bool = False, patient: bool = True
) -> Sink:
    """A sink object for one configured sink (not opened yet). `writing`: for a run, which
    waits for a DuckDB file another process writes (`busy_wait`); readers never wait.
    `patient`: a database that is away is waited for (a restart, a failover: the warehouse's
    `retry_s`); a command that only looks (flows, state, plan, report) says so at once."""
    if isinstance(config, DeltaSinkConfig):
        from sinks.tables.delta import DeltaLake

        return DeltaLake(
            _local_path(config.url, base),
            name=name,
            storage_options=config.storage_options,
            target_file_size=config.target_file_size,
        )
    if isinstance(config, IcebergSinkConfig):
        from sinks.tables.iceberg import IcebergLake

        return IcebergLake(
            _local_path(config.url, base),
            name=name,
            catalog=_sql_url(config.catalog, base) if config.catalog else None,
            namespace=config.namespace,
            properties=config.properties,
        )
    if isinstance(config, ParquetSinkConfig):
        from sinks.lake.sink import ParquetLake

        return ParquetLake(
            _local_path(config.url, base),
            name=name,
            partition=config.partition,
            storage_options=config.storage_options or None,
            target_file_rows=config.target_file_rows,
            compression=config.compression,
        )
    from sinks.sql.warehouse import SqlWarehouse

    assert not isinstance(config, ParquetSinkConfig | DeltaSinkConfig | IcebergSinkConfig)
    return SqlWarehouse(
        _sql_url(config.url, base),
        name=name,
        schema=config.schema_,
        busy_wait_s=config.busy_wait.total_seconds() if writing else 0.0,
        retry_s=None if patient else 0.0,
    )


class SinkSet:
    """Sinks by name, opened on first use and closed together; `writing` for a run's,
    `patient=False` for a command that only looks (`make_sink`)."""

    def __init__(
        self, config: Config, base: Path, *, writing: bool = False, patient: bool = True
    ) -> None:
        self.config = config
        self.base = base
        self.writing = writing
        self.patient = patient
        self._open: dict[str, Sink] = {}

    def get(self, name: str) -> Sink:
        if name not in self._open:
            sink = make_sink(
                name, self.config.sinks[name], self.base, writing=self.writing, patient=self.patient
            )
            sink.open()
            self._open[name] = sink
        return self._open[name]

    def close(self) -> None:
        for sink in self._open.values():
            sink.close()
        self._open.clear()

    def __enter__(self) -> SinkSet:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
