# SPDX-License-Identifier: Apache-2.0
"""The package's public API with arguments of every type (hypothesis):
each call returns or raises TypeError, ValueError, OverflowError or a
kvpool error, and never takes the interpreter down (an int where a C
string goes used to be read as a pointer). A crash fails the whole run."""
import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings, strategies as st  # noqa: E402

import kvpool  # noqa: E402

ANY = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-2**70, max_value=2**70)
    | st.floats(allow_nan=True) | st.text(max_size=8) | st.binary(max_size=40),
    lambda inner: st.lists(inner, max_size=4) | st.tuples(inner, inner, inner),
    max_leaves=8)
OK = (TypeError, ValueError, OverflowError, kvpool.KvpoolError)
FUZZ = settings(max_examples=100, deadline=None, database=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture])

CALLS = ["allocate", "touch", "free", "evict", "cache", "lookup", "cache_hashes",
         "cache_partial", "move_hashes", "report_cached", "lookup_hashes", "allocate_slots",
         "free_request", "get_computed_blocks", "read_blocks", "write_blocks", "copy_blocks",
         "write_tokens", "reserve", "commit", "abort", "lookup_and_lock", "unlock"]


@FUZZ
@given(url=ANY, pool=ANY, token=ANY, timeout_ms=ANY)
def test_client_constructor_refuses_wrong_types(url, pool, token, timeout_ms):
    try:
        kvpool.Client(url, pool=pool, token=token, timeout_ms=timeout_ms, retries=0,
                      connect_timeout_ms=50).close()
    except OK:
        pass


@FUZZ
@given(seed=ANY, algorithm=ANY, args=st.lists(ANY, max_size=3))
def test_hasher_refuses_wrong_types(seed, algorithm, args):
    try:
        kvpool.Hasher(seed, algorithm=algorithm)
    except OK:
        pass
    try:
        kvpool.Hasher("0").hash_request(*args)
    except OK:
        pass


@pytest.mark.parametrize("name", CALLS)
def test_every_call_refuses_wrong_types(daemon, name):
    c = kvpool.Client(daemon, pool="bare")
    fn = getattr(c, name)

    @FUZZ
    @given(args=st.lists(ANY, max_size=4),
           kwargs=st.dictionaries(st.sampled_from(["block_size", "group_id", "tokens",
                                                   "lora_name", "cache_salt", "mm",
                                                   "block_mask", "group_ids", "preempt"]),
                                  ANY, max_size=3))
    def one(args, kwargs):
        try:
            fn(*args, **kwargs)
        except OK:
            pass
    try:
        one()
    finally:
        c.close()
