"""Any JSON value (hypothesis), and the instant the answers of these tests start at."""

from __future__ import annotations

from hypothesis import strategies as st

T0 = 1_704_067_200_000  # 2024-01-01T00:00:00Z

json_scalars = (
    st.none()
    | st.booleans()
    | st.integers(-(2**64), 2**64)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=5)
)
json_values = st.recursive(
    json_scalars,
    lambda children: (
        st.lists(children, max_size=5) | st.dictionaries(st.text(max_size=3), children, max_size=4)
    ),
    max_leaves=20,
)
