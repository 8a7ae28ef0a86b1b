"""Hypothesis strategies shared by the tiers."""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st


def json_values(*, size: int = 4, leaves: int = 20) -> st.SearchStrategy[Any]:
    """Any value `json.loads` can return: containers of at most `size` items, `leaves` scalars."""
    return st.recursive(
        st.none()
        | st.booleans()
        | st.integers()
        | st.floats(allow_nan=False, allow_infinity=False)
        | st.text(),
        lambda inner: (
            st.lists(inner, max_size=size) | st.dictionaries(st.text(), inner, max_size=size)
        ),
        max_leaves=leaves,
    )
