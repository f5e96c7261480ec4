"""What the property tests share: the example budget and a strategy for JSON documents.

The default run is short; DSPARK_FUZZ_EXAMPLES raises every example count (`make fuzz`).
"""

from __future__ import annotations

import os
from contextlib import contextmanager

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

EXAMPLES = int(os.environ.get("DSPARK_FUZZ_EXAMPLES", "0")) or None


def fuzz_settings(default: int):
    """DSPARK_FUZZ_EXAMPLES or ``default`` examples, no deadline (the first examples pay for
    imports), no example database (runs stay independent)."""
    return settings(max_examples=EXAMPLES or default, deadline=None, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


# Any JSON document (as Python values): what a config.json field may hold.
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=12)


@contextmanager
def patched_limits(module, limits: dict[str, int]):
    """``module``'s limit constants set to ``limits`` for the block, then restored: lowered
    so that inputs of a few hundred bytes reach them."""
    saved = {name: getattr(module, name) for name in limits}
    for name, value in limits.items():
        setattr(module, name, value)
    try:
        yield
    finally:
        for name, value in saved.items():
            setattr(module, name, value)
