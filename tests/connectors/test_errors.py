"""Error messages quote user values cut to a readable length, with the length said."""

from __future__ import annotations

from connectors.errors import QUOTED_CHARS, quoted


def test_a_short_value_is_its_repr() -> None:
    assert quoted("/Plant A/Temp") == "'/Plant A/Temp'"
    assert quoted(15) == "15"


def test_a_long_string_is_cut_with_its_length() -> None:
    text = quoted("/" + "x" * 99_999)
    assert text == f"{'/' + 'x' * (QUOTED_CHARS - 1)!r}... (100,000 characters)"
    assert quoted(b"\x00" * 500, limit=4) == "b'\\x00\\x00\\x00\\x00'... (500 bytes)"


def test_any_long_repr_is_cut_too() -> None:
    assert quoted(list(range(10_000)), limit=10) == "[0, 1, 2, ... (58,890 characters)"
    assert quoted(10**5000) == "<int>"
