"""Values put in the column of their tag's configured type (details `config.type`).

A history row's value lands in the column of its JSON type (`value`, `value_bool`,
`value_str`: connectors/normalise/rows.py). A node that sends the numbers of a `number`
tag as strings ("12.5") would fill only the text column and leave the number column
null, silently. The tag's configuration decides instead: text of a `number` tag that is
a decimal number goes to `value`, `true`/`false` of a `boolean` tag to `value_bool`.
Text that does not parse as the tag's type stays where it came (never re-typed by a
guess) and is counted, for the run's summary. Vectorised per answer; an answer without
text values (the common one) costs one look at a null count.
"""

from __future__ import annotations

from collections.abc import Mapping

import pyarrow as pa
import pyarrow.compute as pc

# A decimal number as JSON writes it, optionally signed with `+` or padded with spaces.
_NUMBER = r"^\s*[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?\s*$"
_BOOLEAN = r"^\s*(?i:true|false)\s*$"


def by_configured_type(table: pa.Table, types: Mapping[str, str]) -> tuple[pa.Table, int]:
    """`table` (a tag-history table) with the text values of `number` and `boolean` tags
    (per `types`: tag -> configured type) in their type's column, and how many text values
    of such tags did not parse as their type (kept as text)."""
    if not types or not table.num_rows:
        return table, 0
    text = table.column("value_str")
    if text.null_count == table.num_rows:
        return table, 0
    # The tags holding text (string tags, mostly: few), looked up one by one.
    with_text = pc.unique(pc.filter(table.column("tag"), pc.is_valid(text)))
    if pa.types.is_dictionary(with_text.type):
        with_text = with_text.dictionary_decode()
    typed = {tag: types[tag] for tag in with_text.to_pylist() if tag in types}
    not_of_type = 0
    for kind, target, pattern in (
        ("number", "value", _NUMBER),
        ("boolean", "value_bool", _BOOLEAN),
    ):
        tags = [tag for tag, configured in typed.items() if configured == kind]
        if tags:
            table, failed = _retyped(table, tags, target, pattern)
            not_of_type += failed
    return table, not_of_type


def _retyped(table: pa.Table, tags: list[str], target: str, pattern: str) -> tuple[pa.Table, int]:
    """Text values of `tags` that match `pattern` moved to the column `target`; the count
    of their text values that do not."""
    text = table.column("value_str")
    ours = pc.and_(pc.is_valid(text), pc.is_in(table.column("tag"), value_set=pa.array(tags)))
    ours = pc.fill_null(ours, False)
    if not pc.any(ours).as_py():
        return table, 0
    parses = pc.fill_null(pc.match_substring_regex(text, pattern), False)
    moved = pc.and_(ours, parses)
    failed = (pc.sum(ours).as_py() or 0) - (pc.sum(moved).as_py() or 0)
    if not pc.any(moved).as_py():
        return table, failed
    column = table.column(target)
    readable = pc.if_else(moved, pc.utf8_trim_whitespace(text), pa.scalar("0"))
    if target == "value_bool":
        parsed = pc.equal(pc.utf8_lower(readable), "true")
    else:
        parsed = readable.cast(column.type)
    table = _set(table, target, pc.if_else(moved, parsed, column))
    table = _set(table, "value_str", pc.if_else(moved, pa.scalar(None, pa.string()), text))
    return table, failed


def _set(table: pa.Table, name: str, values: pa.Array | pa.ChunkedArray) -> pa.Table:
    index = table.schema.get_field_index(name)
    field = table.schema.field(index)
    return table.set_column(index, field, values.cast(field.type))
