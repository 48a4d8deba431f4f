"""Dictionary-encoded names sort, compare and list like the strings they stand for; the
last row of a key is kept as pandas keeps it."""

from __future__ import annotations

import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
from hypothesis import given
from hypothesis import strategies as st

from connectors.schema import last_per_key, names_of, sort_key


def _encoded(indices: list[int | None], names: list[str]) -> pa.DictionaryArray:
    return pa.DictionaryArray.from_arrays(pa.array(indices, type=pa.int32()), pa.array(names))


def test_sort_key_orders_rows_as_their_names_do_and_equal_names_alike() -> None:
    # "/a" twice in the dictionary: both give one key.
    column = _encoded([0, 1, 2, 3, 1, 0], ["/c", "/a", "/b", "/a"])
    keys = sort_key(column).to_pylist()
    strings = column.cast(pa.string()).to_pylist()
    assert keys[1] == keys[3] == keys[4]
    by_key = pc.sort_indices(pa.array(keys), sort_keys=[("", "ascending")]).to_pylist()
    by_name = pc.sort_indices(pa.array(strings), sort_keys=[("", "ascending")]).to_pylist()
    assert by_key == by_name


def test_sort_key_of_chunks_with_their_own_dictionaries() -> None:
    column = pa.chunked_array([_encoded([0, 1], ["/b", "/a"]), _encoded([0, 1], ["/c", "/a"])])
    assert sort_key(column).to_pylist() == [2, 1, 3, 1]  # dense ranks from 1


def test_sort_key_of_strings_is_the_strings() -> None:
    column = pa.chunked_array([pa.array(["/b", "/a"])])
    assert sort_key(column).to_pylist() == ["/b", "/a"]


def test_names_of_leaves_out_unused_dictionary_values_and_nulls() -> None:
    assert names_of(_encoded([1, None, 1, 2], ["/unused", "/a", "/b"])) == {"/a", "/b"}
    assert names_of(_encoded([None, 1], ["/only-null-slot", "/a"])) == {"/a"}
    assert names_of(pa.chunked_array([pa.array(["/a", None, "/a"])])) == {"/a"}


@given(st.lists(st.tuples(st.sampled_from("ab"), st.sampled_from(["x", "y/z", "ß"])), max_size=30))
def test_last_per_key_keeps_what_pandas_drop_duplicates_keeps(keys: list[tuple[str, str]]) -> None:
    table = pa.table(
        {
            "node": pa.array([k[0] for k in keys], pa.string()),
            "tag": pa.array([k[1] for k in keys], pa.string()),
            "row": pa.array(range(len(keys)), pa.int64()),
        }
    )
    expected = table.to_pandas().drop_duplicates(subset=["node", "tag"], keep="last")
    assert last_per_key(table, ["node", "tag"]).to_pylist() == expected.to_dict("records")
    frame = table.to_pandas(types_mapper=pd.ArrowDtype)  # a DataFrame is taken as well
    assert last_per_key(frame, ["node", "tag"]).column("row").to_pylist() == list(expected["row"])
