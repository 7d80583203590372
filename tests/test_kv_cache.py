"""Immutable KV cache (API.md §5 "KV cache and feed-forward")."""

import threading

import numpy as np
import pytest
from hypothesis import given, strategies as st

from hmath_dl.errors import CapacityError, DomainError, NonFiniteError, ShapeError
from hmath_dl.layers import (KVCache, append_cache, cache_values, causal_mask, empty_cache,
                             scaled_dot_product_attention)
from tests.helpers import frozen_copy, noncontiguous, readonly
from tests.reference import attention as ref


def raises(exc, fname, fn, *args, **kwargs):
    with pytest.raises(exc) as info:
        fn(*args, **kwargs)
    assert str(info.value).startswith(fname + ":"), str(info.value)
    return info.value


def rows(rng, n, w):
    return rng.standard_normal((n, w))


def assert_holds(cache, model):
    k, v = cache_values(cache)
    mk, mv = model.arrays()
    assert cache.length == len(model.keys)
    assert k.shape == mk.shape and v.shape == mv.shape
    assert np.array_equal(k, mk) and np.array_equal(v, mv)


# ================================================================================ basics
def test_empty_cache_properties():
    c = empty_cache(5, 3, 2)
    assert isinstance(c, KVCache)
    assert (c.length, c.capacity, c.key_width, c.value_width) == (0, 5, 3, 2)
    k, v = cache_values(c)
    assert k.shape == (0, 3) and v.shape == (0, 2)
    assert "length=0" in repr(c)
    c2 = empty_cache(capacity=5, key_width=3, value_width=2)
    assert c2 == c


def test_cache_is_frozen():
    c = empty_cache(4, 1, 1)
    with pytest.raises(AttributeError):
        c.length = 3
    with pytest.raises(AttributeError):
        c._length = 3


def test_huge_capacity_allocates_lazily():
    c = empty_cache(10 ** 15, 4, 4)   # would be 32 PB if preallocated
    c = append_cache(c, np.ones((2, 4)), np.zeros((2, 4)))
    assert c.length == 2 and c.capacity == 10 ** 15


@given(chunks=st.lists(st.integers(0, 5), max_size=8), kw=st.integers(1, 3),
       vw=st.integers(1, 3), seed=st.integers(0, 2 ** 16))
def test_appends_equal_concatenation(chunks, kw, vw, seed):
    rng = np.random.default_rng(seed)
    cap = sum(chunks) + 1
    cache = empty_cache(cap, kw, vw)
    model = ref.ListCache(cap, kw, vw)
    history = [(cache, model)]
    for n in chunks:
        k, v = rows(rng, n, kw), rows(rng, n, vw)
        cache = append_cache(cache, k, v)
        model = model.append(k, v)
        history.append((cache, model))
    for c, m in history:   # every earlier version is still intact
        assert_holds(c, m)
        assert c.capacity == cap and c.key_width == kw and c.value_width == vw


def test_cache_values_are_read_only_forever_and_in_insertion_order():
    c = empty_cache(100, 2, 1)
    c = append_cache(c, [[1.0, 2.0]], [[3.0]])
    c = append_cache(c, [[4.0, 5.0], [6.0, 7.0]], [[8.0], [9.0]])
    k, v = cache_values(c)
    assert np.array_equal(k, [[1, 2], [4, 5], [6, 7]]) and np.array_equal(v, [[3], [8], [9]])
    for a in (k, v):
        assert not a.flags.writeable
        with pytest.raises(ValueError):
            a[0, 0] = 1.0
        with pytest.raises(ValueError):
            a.flags.writeable = True
        with pytest.raises(ValueError):
            a[:1].flags.writeable = True


def test_zero_row_append_returns_equal_cache():
    c = append_cache(empty_cache(3, 2, 2), np.ones((1, 2)), np.ones((1, 2)))
    c2 = append_cache(c, np.zeros((0, 2)), np.zeros((0, 2)))
    assert c2 == c and c2.length == 1
    full = append_cache(c, np.ones((2, 2)), np.ones((2, 2)))
    assert append_cache(full, np.zeros((0, 2)), np.zeros((0, 2))) == full


def test_equality_is_by_value():
    a = append_cache(empty_cache(4, 1, 1), [[1.0]], [[2.0]])
    b = append_cache(empty_cache(4, 1, 1), [[1.0]], [[2.0]])
    assert a == b and hash(a) == hash(b)
    assert a != append_cache(empty_cache(4, 1, 1), [[1.0]], [[3.0]])
    assert a != append_cache(empty_cache(5, 1, 1), [[1.0]], [[2.0]])
    assert a != empty_cache(4, 1, 1)
    assert a != "cache"


# ============================================================================= branching
def test_branching_leaves_original_and_both_branches_intact():
    rng = np.random.default_rng(0)
    base = append_cache(empty_cache(50, 3, 2), rows(rng, 4, 3), rows(rng, 4, 2))
    base_k, base_v = [a.copy() for a in cache_values(base)]
    view_k, view_v = cache_values(base)   # views taken before the branches exist
    a_k, a_v = rows(rng, 2, 3), rows(rng, 2, 2)
    b_k, b_v = rows(rng, 3, 3), rows(rng, 3, 2)
    branch_a = append_cache(base, a_k, a_v)
    branch_b = append_cache(base, b_k, b_v)     # base is no longer at the tip: copies
    branch_a2 = append_cache(branch_a, rows(rng, 5, 3), rows(rng, 5, 2))
    branch_b2 = append_cache(branch_b, rows(rng, 1, 3), rows(rng, 1, 2))
    assert branch_a2.length == 11 and branch_b2.length == 8
    for c, k, v in ((base, base_k, base_v), (branch_a, np.vstack([base_k, a_k]), np.vstack([base_v, a_v])),
                    (branch_b, np.vstack([base_k, b_k]), np.vstack([base_v, b_v]))):
        got_k, got_v = cache_values(c)
        assert np.array_equal(got_k, k) and np.array_equal(got_v, v)
    assert np.array_equal(view_k, base_k) and np.array_equal(view_v, base_v)
    assert np.array_equal(cache_values(branch_a2)[0][:6], cache_values(branch_a)[0])
    assert np.array_equal(cache_values(branch_b2)[0][:7], cache_values(branch_b)[0])


def test_views_survive_growth():
    rng = np.random.default_rng(1)
    c = empty_cache(10_000, 2, 2)
    model = ref.ListCache(10_000, 2, 2)
    kept = []
    for _ in range(200):   # many geometric reallocations
        k, v = rows(rng, 3, 2), rows(rng, 3, 2)
        c = append_cache(c, k, v)
        model = model.append(k, v)
        kept.append((cache_values(c), model.arrays()))
    for (k, v), (mk, mv) in kept:
        assert np.array_equal(k, mk) and np.array_equal(v, mv)


def test_tip_appends_share_storage():
    # amortised O(L) appends: appending at the tip writes behind the rows, no copy
    c1 = append_cache(empty_cache(1000, 4, 4), np.ones((1, 4)), np.ones((1, 4)))
    c2 = append_cache(c1, np.full((1, 4), 2.0), np.full((1, 4), 2.0))
    assert np.shares_memory(cache_values(c1)[0], cache_values(c2)[0])
    # a branch does not share the tip's storage, and the tip is unaffected by it
    c3 = append_cache(c1, np.full((1, 4), 3.0), np.full((1, 4), 3.0))
    assert not np.shares_memory(cache_values(c3)[0], cache_values(c2)[0])
    assert np.array_equal(cache_values(c2)[0][1], np.full(4, 2.0))
    assert np.array_equal(cache_values(c3)[0][1], np.full(4, 3.0))


def test_concurrent_appends_to_one_version():
    rng = np.random.default_rng(2)
    base = append_cache(empty_cache(10_000, 2, 1), rows(rng, 3, 2), rows(rng, 3, 1))
    base_k = cache_values(base)[0].copy()
    results = {}
    barrier = threading.Barrier(8)

    def worker(t):
        barrier.wait()
        c = base
        for s in range(50):
            c = append_cache(c, np.full((1, 2), float(t)), np.full((1, 1), float(s)))
        results[t] = c

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert np.array_equal(cache_values(base)[0], base_k)
    for t, c in results.items():
        k, v = cache_values(c)
        assert c.length == 53
        assert np.array_equal(k[:3], base_k)
        assert (k[3:] == t).all()
        assert np.array_equal(v[3:, 0], np.arange(50.0))


# ======================================================== incremental decoding vs full
def test_incremental_decoding_equals_full_attention():
    rng = np.random.default_rng(3)
    seq, d, f, prefix = 12, 4, 3, 5
    q, k, v = rng.standard_normal((seq, d)), rng.standard_normal((seq, d)), rng.standard_normal((seq, f))
    full_out, _ = scaled_dot_product_attention(q, k, v, causal_mask(seq, seq, 0))
    # prefill the first `prefix` tokens at once, then decode one token at a time
    cache = append_cache(empty_cache(seq, d, f), k[:prefix], v[:prefix])
    out_rows = [scaled_dot_product_attention(q[:prefix], *cache_values(cache),
                                             causal_mask(prefix, prefix, 0))[0]]
    for t in range(prefix, seq):
        cache = append_cache(cache, k[t:t + 1], v[t:t + 1])
        ck, cv = cache_values(cache)
        o, _ = scaled_dot_product_attention(q[t:t + 1], ck, cv, causal_mask(1, t + 1, t))
        out_rows.append(o)
    incremental = np.vstack(out_rows)
    np.testing.assert_allclose(incremental, full_out, rtol=1e-13, atol=1e-14)
    # the row computation is the same arithmetic on the same keys: bitwise equal
    assert np.array_equal(incremental[-1], full_out[-1])


# ================================================================================ errors
@pytest.mark.parametrize("args, exc", [
    ((0, 1, 1), DomainError), ((1, 0, 1), DomainError), ((1, 1, 0), DomainError),
    ((-3, 1, 1), DomainError), ((2.0, 1, 1), TypeError), ((2, True, 1), TypeError),
    ((2, 1, "1"), TypeError),
])
def test_empty_cache_errors(args, exc):
    raises(exc, "empty_cache", empty_cache, *args)


def test_append_errors():
    c = append_cache(empty_cache(4, 2, 3), np.ones((3, 2)), np.ones((3, 3)))
    name = "append_cache"
    err = raises(CapacityError, name, append_cache, c, np.ones((2, 2)), np.ones((2, 3)))
    assert "capacity" in str(err)
    raises(ShapeError, name, append_cache, c, np.ones((1, 3)), np.ones((1, 3)))   # key width
    raises(ShapeError, name, append_cache, c, np.ones((1, 2)), np.ones((1, 2)))   # value width
    raises(ShapeError, name, append_cache, c, np.ones((1, 2)), np.ones((0, 3)))   # row counts
    raises(ShapeError, name, append_cache, c, np.ones(2), np.ones((1, 3)))        # keys 1-D
    raises(ShapeError, name, append_cache, c, np.ones((1, 2)), np.ones((1, 1, 3)))
    raises(NonFiniteError, name, append_cache, c, np.array([[np.nan, 1.0]]), np.ones((1, 3)))
    raises(NonFiniteError, name, append_cache, c, np.ones((1, 2)), np.array([[1.0, np.inf, 0.0]]))
    raises(TypeError, name, append_cache, "cache", np.ones((1, 2)), np.ones((1, 3)))
    raises(TypeError, name, append_cache, c, [["a", "b"]], np.ones((1, 3)))
    raises(TypeError, "cache_values", cache_values, None)
    # failed appends leave the cache unchanged and usable
    assert c.length == 3
    c2 = append_cache(c, np.zeros((1, 2)), np.zeros((1, 3)))
    assert c2.length == 4 and np.array_equal(cache_values(c2)[0][3], np.zeros(2))
    raises(CapacityError, name, append_cache, c2, np.zeros((1, 2)), np.zeros((1, 3)))


def test_append_converts_and_never_mutates_inputs():
    rng = np.random.default_rng(4)
    k, v = rows(rng, 3, 2), rows(rng, 3, 2)
    saved = frozen_copy(k, v)
    c = append_cache(empty_cache(20, 2, 2), k, v)
    assert np.array_equal(k, saved[0]) and np.array_equal(v, saved[1])
    k[0, 0] = 123.0   # later changes to the caller's arrays do not leak into the cache
    assert cache_values(c)[0][0, 0] == saved[0][0, 0]
    for conv in (readonly, noncontiguous, lambda a: a.tolist(), np.asfortranarray):
        c2 = append_cache(empty_cache(20, 2, 2), conv(saved[0]), conv(saved[1]))
        assert c2 == c
    c3 = append_cache(cache=empty_cache(20, 2, 2), keys=saved[0].astype(np.float32),
                      values=saved[1])
    assert np.array_equal(cache_values(c3)[0], saved[0].astype(np.float32).astype(np.float64))


def test_copy_and_pickle_round_trip():
    import copy
    import pickle
    c = append_cache(empty_cache(8, 2, 1), [[1.0, 2.0], [3.0, 4.0]], [[5.0], [6.0]])
    assert copy.copy(c) is c and copy.deepcopy(c) is c
    back = pickle.loads(pickle.dumps(c))
    assert back == c and back.capacity == 8
    assert pickle.loads(pickle.dumps(empty_cache(3, 1, 1))) == empty_cache(3, 1, 1)
    # the unpickled cache is independent and extendable
    more = append_cache(back, [[0.0, 0.0]], [[0.0]])
    assert more.length == 3 and c.length == 2
