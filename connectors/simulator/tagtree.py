"""The simulated tag tree: deterministic tags with their sampling and value behaviour.

Everything about tag i follows from (seed, i) through a counter-based hash, so any range
of any tag can be generated on demand, in any order, without storing history.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

MASK64 = np.uint64(0xFFFFFFFFFFFFFFFF)

# How late a tag over the link reaches the node: history and events show its samples this
# long after their stamps (`SimConfig.remote_lag_ms` sets another).
REMOTE_LAG_MS = 120_000
PERIODS_MS = (1000, 1000, 2000, 5000, 5000, 10_000, 15_000, 30_000, 60_000)
GROUPS = (
    "/Plant A/Line 1",
    "/Plant A/Line 2",
    "/Plant A/Utilities/Compressed Air",
    "/Plant B/Boiler.House",
    "/Plant B/Pumps, Main",
    "/Usine Süd/Pompe ß",
)
NAMES = ("Temp.", "Pressure", "Flow, Rate", "Level", "Débit", "Speed", "Power kW", "温度")
UNITS = {
    "Temp.": "°C",
    "Pressure": "bar",
    "Flow, Rate": "m3/h",
    "Level": "%",
    "Débit": "l/s",
    "Speed": "rpm",
    "Power kW": "kW",
    "温度": "°C",
}
STATES = ("RUN", "STOP", "IDLE", "FAULT", 'Ölwechsel, "bitte"')
HOSTILE = (
    "/Hostile/../../etc/passwd",
    "/Hostile/quote ' and \" double",
    "/Hostile/'; DROP TABLE tag_history; --",
    "/Hostile/back\\slash and %2F percent",
    "/Hostile/emoji 🌡️ temp",
    "/Hostile/comma, separated, name",
    "/Hostile/" + "x" * 1000,
    "/Hostile/tab\tand newline-free ctrl \x01",
)


# A tag's salt, or a column of salts (one row per tag) hashing many tags at once.
Salt = int | np.ndarray


def mix(values: np.ndarray, salt: Salt) -> np.ndarray:
    """splitmix64 of uint64 values with a salt: a fast, vectorised counter hash (a column
    of salts: one row of hashes per salt)."""
    with np.errstate(over="ignore"):
        z = (values.astype(np.uint64) + np.uint64(salt & 0xFFFFFFFFFFFFFFFF)) * np.uint64(
            0x9E3779B97F4A7C15
        )
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


def mix1(value: int, salt: int) -> int:
    return int(mix(np.array([value], dtype=np.uint64), salt)[0])


@dataclass(frozen=True)
class TagSpec:
    index: int
    path: str
    type: str  # number | boolean | string
    period_ms: int
    irregular: bool
    duplicates: bool
    remote_lag_ms: int  # > 0: a tag over a link whose samples arrive late
    amplitude: float
    offset: float
    wave_ms: int
    deadband: float
    default_method: str
    units: str
    salt: int
    # Stamps [lo, hi) not in history now: a link's store-and-forward buffer holds them
    # (connectors/simulator/links.py).
    hidden: tuple[int, int] | None = None

    @property
    def name(self) -> str:
        return self.path.rsplit("/", 1)[1]

    @property
    def group(self) -> str:
        return self.path.rsplit("/", 1)[0] + "/"


def _tag_type(index: int, h: int) -> str:
    """Every tenth tag boolean, the next one string (so any tree of 10 has all three),
    the rest mostly numbers."""
    if index % 10 == 8:
        return "boolean"
    if index % 10 == 9:
        return "string"
    pick = h % 20
    return "boolean" if pick == 0 else "string" if pick == 1 else "number"


def without_history(spec: TagSpec) -> bool:
    """Whether a node of the `null_without_history` profile holds no history for this tag
    (every fifth): its history answers hold `data: null`, its ground truth no rows."""
    return spec.index % 5 == 4


def tag_paths(count: int, *, hostile: bool = False, repeated_names: bool = False) -> list[str]:
    """The generated tag paths: `count` tags spread over GROUPS. Names are unique unless
    `repeated_names`: then every group holds the same leaf names (`Temp. 000` in each), as
    real plants do; `hostile` puts HOSTILE's paths first."""
    paths: list[str] = []
    for i in range(count):
        group = GROUPS[i % len(GROUPS)]
        name = NAMES[(i // len(GROUPS)) % len(NAMES)]
        number = i // len(GROUPS) if repeated_names else i
        paths.append(f"{group}/{name} {number:03d}")
    if hostile:
        paths[: len(HOSTILE)] = HOSTILE[: min(len(HOSTILE), count)]
    return paths


def build_tags(
    seed: int,
    count: int,
    hostile: bool,
    period_ms: int | None = None,
    *,
    paths: list[str] | None = None,
    remote_lag_ms: int = REMOTE_LAG_MS,
) -> list[TagSpec]:
    """`count` tags from `seed` (`paths`: these paths instead of `tag_paths(count, ...)`).
    `period_ms`: every tag regular at that period (gaps, quality stretches, duplicates and
    late links stay as they are); None: mixed periods. The tags over the link arrive
    `remote_lag_ms` late."""
    if paths is None:
        paths = tag_paths(count, hostile=hostile)
    return [
        build_tag(seed, i, path, period_ms, remote_lag_ms=remote_lag_ms)
        for i, path in enumerate(paths)
    ]


def build_tag(
    seed: int,
    index: int,
    path: str,
    period_ms: int | None,
    *,
    tag_type: str | None = None,
    remote_lag_ms: int = REMOTE_LAG_MS,
) -> TagSpec:
    """Tag `index` of the tree of `seed` at `path` (`tag_type`: of this type instead; one
    in nine over the link, `remote_lag_ms` late)."""
    h = mix1(index, seed * 7919 + 17)
    kind = tag_type or _tag_type(index, h)
    period = PERIODS_MS[(h >> 8) % len(PERIODS_MS)] if period_ms is None else period_ms
    name = path.rsplit("/", 1)[1].rsplit(" ", 1)[0]
    return TagSpec(
        index=index,
        path=path,
        type=kind,
        period_ms=period,
        irregular=period_ms is None and (h >> 16) % 3 == 0,
        duplicates=(h >> 20) % 7 == 0,
        remote_lag_ms=remote_lag_ms if (h >> 24) % 9 == 0 else 0,
        amplitude=float(5 + (h >> 28) % 50),
        offset=float((h >> 34) % 200),
        wave_ms=int(600_000 + (h >> 40) % 3_000_000),
        deadband=float(0.5 + ((h >> 44) % 4) * 0.5),
        default_method="avg" if kind == "number" else "last",
        units=UNITS.get(name, ""),
        salt=mix1(index, seed * 104729 + 3),
    )


class TagTree:
    """The tags of one (local or remote) node, by index and by path."""

    def __init__(self, node_name: str, specs: list[TagSpec]) -> None:
        self.node_name = node_name
        self.specs = specs
        self.by_path = {spec.path: spec for spec in specs}

    def add(self, spec: TagSpec) -> None:
        """One more tag (the simulator's `add_tag`)."""
        self.specs = [*self.specs, spec]
        self.by_path = {**self.by_path, spec.path: spec}

    def remove(self, path: str) -> None:
        """The tag at `path` gone (the simulator's `remove_tag`)."""
        self.specs = [spec for spec in self.specs if spec.path != path]
        self.by_path = {spec.path: spec for spec in self.specs}

    def get(self, path: str) -> TagSpec | None:
        return self.by_path.get(path)

    def select(
        self, roots: list[str], pattern: re.Pattern[str] | None, recurrent: bool
    ) -> list[TagSpec]:
        """Tags equal to a root, or under a root group (direct children unless recurrent)."""
        chosen: dict[str, TagSpec] = {}
        for root in roots or ["/"]:
            exact = self.by_path.get(root)
            if exact is not None:
                if pattern is None or pattern.search(exact.path):
                    chosen[exact.path] = exact
                continue
            group = root if root.endswith("/") else root + "/"
            for spec in self.specs:
                if not spec.path.startswith(group):
                    continue
                if not recurrent and "/" in spec.path[len(group) :]:
                    continue
                if pattern is None or pattern.search(spec.path):
                    chosen[spec.path] = spec
        return list(chosen.values())
