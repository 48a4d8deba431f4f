"""flows.yaml text is bounded and checked before anything builds or walks it."""

from __future__ import annotations

import tracemalloc
from pathlib import Path

import pytest

from pipelines.config.file import (
    MAX_ALIASES,
    MAX_CONFIG_BYTES,
    MAX_DEPTH,
    MAX_VALUES,
    DocumentError,
    check_document,
    load_document,
)
from pipelines.config.models import ConfigError, load_config


def bomb(key: str = "bomb", indent: int = 0) -> str:
    """Nine levels of nine aliases: a few hundred bytes standing for 9**9 values."""
    pad = " " * indent
    lines = [f"{pad}{key}:", f'{pad}  l0: &l0 ["${{HOME}}", "${{HOME}}", "${{HOME}}"]']
    for level in range(1, 9):
        refs = ", ".join([f"*l{level - 1}"] * 9)
        lines.append(f"{pad}  l{level}: &l{level} [{refs}]")
    return "\n".join(lines) + "\n"


def error(text: str, top_keys: set[str] | None = None) -> DocumentError:
    with pytest.raises(DocumentError) as caught:
        check_document(text, top_keys)
    return caught.value


def test_an_alias_bomb_is_refused_before_it_is_built() -> None:
    tracemalloc.start()
    try:
        caught = error(bomb())
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert str(caught) == f"aliases expand the document past {MAX_VALUES:,} values (an alias bomb?)"
    assert caught.where.startswith("bomb.l")
    assert caught.line is not None
    assert peak < 5 << 20, peak  # read as events: nothing is expanded


def test_unknown_top_level_keys_fail_before_their_value_is_read() -> None:
    caught = error("nodes: {}\n" + bomb(key="extra"), top_keys={"nodes", "sinks", "flows"})
    assert (str(caught), caught.where, caught.line) == ("unknown key", "extra", 2)


def test_aliases_that_stay_small_are_fine_and_merge_keys_are_not_duplicates() -> None:
    text = (
        "defaults: &d {mode: raw, window: 1h}\nflows:\n  a: {<<: *d, window: 2h}\n  b: {<<: *d}\n"
    )
    data = load_document(text)
    assert data["flows"]["a"] == {"mode": "raw", "window": "2h"}
    assert data["flows"]["b"] == {"mode": "raw", "window": "1h"}


@pytest.mark.parametrize(
    ("text", "where", "message"),
    [
        ("flows: {a: 1}\nnodes: {}\nflows: {b: 2}\n", "flows", "duplicate key at lines 1 and 3"),
        (
            "flows:\n  f:\n    window: 1h\n    mode: raw\n    window: 2h\n",
            "flows.f.window",
            "duplicate key at lines 3 and 5",
        ),
        (
            "flows:\n  f:\n    tags:\n      paths:\n        - {a: 1, a: 2}\n",
            "flows.f.tags.paths.0.a",
            "duplicate key at line 5 twice",
        ),
    ],
)
def test_a_duplicate_key_at_any_depth_names_the_key_and_both_lines(
    text: str, where: str, message: str
) -> None:
    caught = error(text)
    assert caught.where == where
    assert str(caught).startswith(message)


def test_depth_aliases_and_size_are_bounded() -> None:
    deep = "a: " + "[" * (MAX_DEPTH + 1) + "]" * (MAX_DEPTH + 1) + "\n"
    assert str(error(deep)) == f"nested more than {MAX_DEPTH} levels deep"
    many = "a: &a 1\nb: [" + ", ".join(["*a"] * (MAX_ALIASES + 1)) + "]\n"
    assert str(error(many)) == f"more than {MAX_ALIASES:,} aliases"
    big = "a: '" + "x" * MAX_CONFIG_BYTES + "'\n"
    assert str(error(big)).startswith(f"the file is {MAX_CONFIG_BYTES + 6:,} bytes")


def test_a_file_naming_many_tags_is_well_inside_the_bounds() -> None:
    paths = "\n".join(f"        - /Plant/Line {i // 100}/Tag {i}" for i in range(100_000))
    data = load_document(f"flows:\n  f:\n    tags:\n      paths:\n{paths}\n")
    assert len(data["flows"]["f"]["tags"]["paths"]) == 100_000


def test_load_config_reports_document_problems_as_one_config_line(tmp_path: Path) -> None:
    file = tmp_path / "flows.yaml"
    file.write_text("nodes: {}\nsinks: {}\nflows: {}\nsinks:\n" + bomb("x", indent=2))
    with pytest.raises(ConfigError) as caught:
        load_config(file, env={})
    assert str(caught.value).endswith(
        "flows.yaml: sinks: duplicate key at lines 2 and 4 (the second would silently replace "
        "the first)"
    )
    file.write_text("sinks:\n" + bomb("x", indent=2))
    with pytest.raises(ConfigError, match=r"sinks\.x\.l\d+\.\d+ \(line \d+\): aliases expand"):
        load_config(file, env={})
