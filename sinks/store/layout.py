"""Where things live in the Parquet lake: validated names, Hive partitions, file names.

Only names validated here ever become path components: dataset, flow and chunk names
must match a strict pattern, and tag paths never reach a path (they are data only). The
full layout is described in `sinks.lake.sink`.
"""

from __future__ import annotations

import hashlib
import re
from datetime import UTC, datetime, timedelta
from urllib.parse import quote, unquote

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from connectors.timewindow import Window
from sinks.base import SinkError

STATE_DIR = "_historian"
FLOWS_DIR = "_flows"
LOCKS_DIR = "locks"
METADATA_DATASET = "tag_metadata"
METADATA_FILE = "part-tag_metadata.parquet"
PARTITIONS = ("date", "month", "year", "none")
AUTO = "auto"
DAY_MS = 86_400_000

Owner = tuple[str, str]  # (flow, chunk_id): the chunk whose rows a data file holds

_DATASET_RE = re.compile(r"^[A-Za-z][A-Za-z0-9_]{0,62}$")
_FLOW_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_-]{0,127}$")
_CHUNK_RE = re.compile(r"^[A-Za-z0-9_-]{1,128}$")
# Names the lake uses itself beside the datasets (`<root>/_historian/<dataset>/` holds a
# dataset's state, so a dataset may not be called like a state directory).
_RESERVED = {LOCKS_DIR, FLOWS_DIR, METADATA_DATASET}


def check_dataset(name: str, *, metadata: bool = False) -> str:
    """The dataset name if it is safe as one path component, else SinkError."""
    if metadata and name == METADATA_DATASET:
        return name
    if not isinstance(name, str) or not _DATASET_RE.match(name):
        raise SinkError(
            f"dataset name {name!r} is not a plain name (a letter, then letters, digits, _)"
        )
    if name in _RESERVED:
        raise SinkError(f"dataset name {name!r} is reserved by the lake; choose another")
    return name


# A path component stays well under the 255 bytes file systems allow.
_MAX_COMPONENT = 200


def check_flow(flow: str) -> str:
    """A progress or lock key (`flow`, `flow@node`, `flow@node#2of4`: any non-empty text)."""
    if not isinstance(flow, str) or not flow or "\x00" in flow:
        raise SinkError(f"flow key {flow!r} is not a non-empty name")
    return flow


def key_name(key: str) -> str:
    """A flow, progress or lock key as one safe path component, one to one.

    A plain flow name (letters, digits, `_`, `-`: every key of earlier versions) is
    itself; any other character is percent-encoded (`%` is never plain, so two keys never
    meet). A name too long for a file system ends with a digest of the key instead.
    """
    check_flow(key)
    if _FLOW_RE.match(key):
        return key
    # Dots too: no name starts with one (hidden) or ends like `<dataset>.write.lock`.
    name = quote(key, safe="").replace(".", "%2E").replace("~", "%7E")
    if len(name) > _MAX_COMPONENT:
        digest = hashlib.sha256(key.encode()).hexdigest()[:32]
        name = f"{name[: _MAX_COMPONENT - 40]}%~{digest}"
    return name


def key_of_name(name: str) -> str | None:
    """The key `key_name` made `name` from; None for a name it cannot have made (a
    shortened one: its key is kept inside the directory)."""
    if "%~" in name:
        return None
    return unquote(name)


NODE_DIR_PREFIX = "node-"


def node_dir(node: str) -> str:
    """A node's directory in a dataset: `node-<name>`, the name percent-encoded (so it holds
    no `/` and no `=`); SinkError when too long.

    Not Hive style (`node=<name>`) on purpose: every file holds the `node` column, and a
    Hive key of the same name makes pandas' default reader fail (its partition column, a
    category, clashes with the files' strings). Readers of Hive layouts (pyarrow, DuckDB,
    Polars, pandas) pass over a directory without `=`, and take `node` from the files; the
    prefix keeps a node named `_x` or `.x` from becoming a directory they skip as hidden."""
    if not isinstance(node, str) or not node:
        raise SinkError(f"node name {node!r} is empty")
    name = NODE_DIR_PREFIX + quote(node, safe="")
    if len(name) > _MAX_COMPONENT:
        raise SinkError(
            f"node name {node[:40]!r}... is too long for a lake directory "
            f"({len(name)} characters encoded, at most {_MAX_COMPONENT})"
        )
    return name


def check_chunk_id(chunk_id: str) -> str:
    if not isinstance(chunk_id, str) or not _CHUNK_RE.match(chunk_id):
        raise SinkError(f"chunk id {chunk_id!r} is not a plain id (letters, digits, _ and -)")
    return chunk_id


def check_partition(scheme: str) -> str:
    """A stored scheme, or `auto` (a scheme chosen per dataset when it is created)."""
    if scheme not in (*PARTITIONS, AUTO):
        raise SinkError(f"partition {scheme!r} is not one of {', '.join((*PARTITIONS, AUTO))}")
    return scheme


def auto_partition(window: timedelta) -> str:
    """The finest scheme whose partitions a chunk of `window` rarely straddles.

    A chunk's rows are one file per partition they fall in, so partitions finer than the
    chunk cut every chunk into small files (1-week chunks into 7 day files) that
    compaction then rewrites. Windows of a day or less sit on the UTC day grid and never
    straddle a day; longer ones take the coarsest period they span at most 1 time in 4:
    a month for up to a week, a year for up to 13 weeks, else no partitions at all.
    """
    if window <= timedelta(days=1):
        return "date"
    if window <= timedelta(days=7):
        return "month"
    if window <= timedelta(weeks=13):
        return "year"
    return "none"


LEDGER_SUFFIX = ".coverage"  # `<dataset>.coverage/`: the completeness ledger's folder


def ledger_file(dataset: str, flow: str, chunk_id: str) -> str:
    """A chunk's ledger file in the lake, relative to its root (`sinks.lake.ledger`): under
    its progress key (chunk ids are unique per key, as markers are)."""
    return join(dataset + LEDGER_SUFFIX, key_name(flow), f"part-{chunk_id}.parquet")


def is_data_file(name: str) -> bool:
    """A file readers see: `*.parquet` not hidden by a `.` or `_` prefix."""
    return name.endswith(".parquet") and not name.startswith((".", "_"))


def part_name(stem: str, piece: int, pieces: int) -> str:
    """`part-<stem>.parquet`, or `part-<stem>-<n>.parquet` when a chunk's partition is split."""
    return f"part-{stem}.parquet" if pieces == 1 else f"part-{stem}-{piece}.parquet"


def _day_label(day: int, scheme: str) -> str:
    moment = datetime.fromtimestamp(day * 86_400, tz=UTC)
    if scheme == "date":
        return f"date={moment:%Y-%m-%d}"
    if scheme == "month":
        return f"month={moment:%Y-%m}"
    if scheme == "year":
        return f"year={moment:%Y}"
    return ""


def partition_of_rows(ts: pa.ChunkedArray, scheme: str) -> tuple[np.ndarray, list[str]]:
    """Per row, the index of its partition in the returned list of partition directories."""
    if scheme == "none" or len(ts) == 0:
        return np.zeros(len(ts), dtype=np.int64), [""]
    bounds = pc.min_max(pc.cast(ts, pa.int64()))
    first, last = int(bounds["min"].as_py()) // DAY_MS, int(bounds["max"].as_py()) // DAY_MS
    label = _day_label(first, scheme)
    if first == last or label == _day_label(last, scheme):  # the usual chunk: one partition
        return np.zeros(len(ts), dtype=np.int64), [label]
    ms = pc.cast(ts, pa.int64()).to_numpy()
    days = np.floor_divide(ms, DAY_MS)
    unique_days, inverse = np.unique(days, return_inverse=True)
    labels = [_day_label(int(day), scheme) for day in unique_days]
    if scheme == "date":
        return inverse.astype(np.int64), labels
    unique_labels = sorted(set(labels))
    position = {label: i for i, label in enumerate(unique_labels)}
    mapping = np.array([position[label] for label in labels], dtype=np.int64)
    return mapping[inverse], unique_labels


def partitions_of_window(window: Window, scheme: str) -> list[str]:
    """The partition directories rows of `window` can live in (relative to the dataset)."""
    if scheme == "none":
        return [""]
    first = window.start_ms // DAY_MS
    last = (window.end_ms - 1) // DAY_MS
    labels = [_day_label(day, scheme) for day in range(first, last + 1)]
    return sorted(set(labels))


def join(*parts: str) -> str:
    """Join path parts with `/`, skipping empty parts (the `none` partition)."""
    return "/".join(
        part.strip("/") if i else part.rstrip("/") for i, part in enumerate(parts) if part
    )


def in_dataset(rel: str) -> str:
    """A lake-relative path as a path inside its dataset (what markers list)."""
    return rel.split("/", 1)[1] if "/" in rel else rel
