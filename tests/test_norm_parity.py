"""Normalisation with an affine transform (API.md section 8), empty batches (section 0)
and the normalisation ``_ad`` twins (group/instance/weight norm, layer/RMS norm options).

Oracles are plain loops over the contract's formulas (``math.fsum`` statistics), written
from API.md, not from the kernels; torch is a second opinion where it is importable.
"""

import math

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from hmath_dl import autodiff as ad
from hmath_dl import layers as L
from hmath_dl.errors import DomainError, NonFiniteError, NumericOverflow, ShapeError
from tests.helpers import assert_same_across_threads

try:
    import torch
    import torch.nn.functional as F
except ImportError:  # pragma: no cover
    torch = None

needs_torch = pytest.mark.skipif(torch is None, reason="torch not importable")
seeds = st.integers(0, 2**32 - 1)
SET = settings(max_examples=25, deadline=None)


def rnd(seed, shape, scale=1.0):
    return np.random.default_rng(seed).standard_normal(shape) * scale


def raises(exc, fname, fn, *args, **kwargs):
    with pytest.raises(exc) as info:
        fn(*args, **kwargs)
    assert str(info.value).startswith(fname + ":"), str(info.value)
    return str(info.value)


# ----------------------------------------------------------------------------- oracles
def _normalise_rows(rows, eps, center):
    """Plain loops: each row -> (x - mean) / sqrt(var + eps) (or x / sqrt(mean x^2 + eps))."""
    out = []
    for row in rows:
        n = len(row)
        m = math.fsum(row) / n if center else 0.0
        v = math.fsum((t - m) ** 2 for t in row) / n
        d = math.sqrt(v + eps)
        out.append([(t - m) / d for t in row])
    return out


def ref_layer(axes, eps, x, weight=None, bias=None, center=True):
    x = np.asarray(x, dtype=float)
    tail = x.shape[x.ndim - axes:]
    n = int(np.prod(tail))
    rows = x.reshape(-1, n).tolist()
    w = [1.0] * n if weight is None else np.asarray(weight).reshape(-1).tolist()
    b = [0.0] * n if bias is None else np.asarray(bias).reshape(-1).tolist()
    out = [[yj * w[j] + b[j] for j, yj in enumerate(r)] for r in _normalise_rows(rows, eps, center)]
    return np.array(out).reshape(x.shape)


def ref_group(groups, eps, x, weight=None, bias=None):
    x = np.asarray(x, dtype=float)
    N, C = x.shape[:2]
    S = int(np.prod(x.shape[2:]))
    x3 = x.reshape(N, C, S)
    cpg = C // groups
    y = np.empty((N, C, S))
    for n in range(N):
        for g in range(groups):
            vals = [x3[n, c, s] for c in range(g * cpg, (g + 1) * cpg) for s in range(S)]
            (res,) = _normalise_rows([vals], eps, True)
            k = 0
            for c in range(g * cpg, (g + 1) * cpg):
                wc = 1.0 if weight is None else float(weight[c])
                bc = 0.0 if bias is None else float(bias[c])
                for s in range(S):
                    y[n, c, s] = res[k] * wc + bc
                    k += 1
    return y.reshape(x.shape)


def ref_instance(eps, x, weight=None, bias=None):
    x = np.asarray(x, dtype=float)
    return ref_group(x.shape[1], eps, x, weight, bias) if x.shape[1] else np.empty(x.shape)


def ref_weight_norm(axis, m, w):
    w = np.asarray(w, dtype=float)
    wm = np.moveaxis(w, axis, 0)
    out = np.empty_like(wm)
    for i in range(wm.shape[0]):
        vals = wm[i].reshape(-1).tolist()
        nrm = math.sqrt(math.fsum(t * t for t in vals))
        out[i] = (m[i] * wm[i]) / nrm
    return np.moveaxis(out, 0, axis)


def close(got, want, rtol=1e-12, atol=1e-12):
    np.testing.assert_allclose(got, want, rtol=rtol, atol=atol)


shapes_nc = st.tuples(st.integers(1, 3), st.integers(1, 3), st.integers(0, 2),
                      st.integers(1, 4), st.integers(1, 4))


def _nc_shape(n, cmul, nsp, a, b):
    return (n, cmul) + (a, b)[:nsp]


# ----------------------------------------------------------------------------- layer / rms
@SET
@given(seed=seeds, shape=st.lists(st.integers(1, 5), min_size=1, max_size=3),
       data=st.data(), has_w=st.booleans(), has_b=st.booleans())
def test_layer_norm_affine_matches_oracle_and_rounding(seed, shape, data, has_w, has_b):
    x = rnd(seed, shape, 3.0) + 1.0
    axes = data.draw(st.integers(1, len(shape)))
    eps = data.draw(st.sampled_from([1e-5, 1e-2, 0.5]))
    tail = tuple(shape[len(shape) - axes:])
    w = rnd(seed + 1, tail) if has_w else None
    b = rnd(seed + 2, tail) if has_b else None
    y = L.layer_norm(axes, eps, x, weight=w, bias=b)
    close(y, ref_layer(axes, eps, x, w, b))
    # the documented rounding: (xhat * weight) + bias, two roundings (numpy's elementwise)
    want = L.layer_norm(axes, eps, x)
    if w is not None:
        want = want * w
    if b is not None:
        want = want + b
    assert want.tobytes() == y.tobytes()


@SET
@given(seed=seeds, shape=st.lists(st.integers(1, 5), min_size=1, max_size=3), data=st.data(),
       has_w=st.booleans())
def test_rms_norm_weight(seed, shape, data, has_w):
    x = rnd(seed, shape, 2.0)
    axes = data.draw(st.integers(1, len(shape)))
    tail = tuple(shape[len(shape) - axes:])
    w = rnd(seed + 1, tail) if has_w else None
    y = L.rms_norm(axes, 1e-3, x, weight=w)
    close(y, ref_layer(axes, 1e-3, x, w, None, center=False))
    want = L.rms_norm(axes, 1e-3, x) * (1.0 if w is None else w)
    assert want.tobytes() == y.tobytes()


def test_defaults_are_todays_numbers():
    x = rnd(0, (5, 7, 3))
    for fn, args in ((L.layer_norm, (2, 1e-5)), (L.rms_norm, (1, 1e-5)),
                     (L.group_norm, (1, 1e-5)), (L.instance_norm, (1e-5,))):
        a = fn(*args, x)
        b = fn(*args, x, weight=None) if fn is L.rms_norm else fn(*args, x, weight=None, bias=None)
        assert a.tobytes() == b.tobytes()
    # ones / zeros leave the values unchanged (up to the sign of zero)
    assert np.array_equal(L.layer_norm(1, 1e-5, x, weight=np.ones(3), bias=np.zeros(3)),
                          L.layer_norm(1, 1e-5, x))
    assert np.array_equal(L.group_norm(7, 1e-5, x, weight=np.ones(7), bias=np.zeros(7)),
                          L.group_norm(7, 1e-5, x))


def test_large_rows_parallel_path_and_scaled_rows():
    # > SERIAL_WORK elements: the parallel kernel; rows near 1e300 use the scaled path
    x = rnd(1, (64, 4096))
    x[3] *= 1e300
    x[5, :7] = 1e305
    w, b = rnd(2, 4096), rnd(3, 4096)
    y = L.layer_norm(1, 1e-5, x, weight=w, bias=b)
    assert y.tobytes() == (L.layer_norm(1, 1e-5, x) * w + b).tobytes()
    y = L.rms_norm(1, 1e-5, x, weight=w)
    assert y.tobytes() == (L.rms_norm(1, 1e-5, x) * w).tobytes()
    x4 = rnd(4, (4, 32, 40, 40))
    x4[1, :4] *= 1e300
    wc, bc = rnd(5, 32), rnd(6, 32)
    y = L.group_norm(8, 1e-5, x4, weight=wc, bias=bc)
    assert y.tobytes() == (L.group_norm(8, 1e-5, x4) * wc[:, None, None] + bc[:, None, None]).tobytes()
    y = L.instance_norm(1e-5, x4, bias=bc)
    assert y.tobytes() == (L.instance_norm(1e-5, x4) + bc[:, None, None]).tobytes()


# ----------------------------------------------------------------------------- group / instance
@SET
@given(seed=seeds, shp=shapes_nc, g=st.integers(1, 3), has_w=st.booleans(), has_b=st.booleans())
def test_group_norm_affine(seed, shp, g, has_w, has_b):
    n, cmul, nsp, a, bb = shp
    shape = _nc_shape(n, cmul * g, nsp, a, bb)
    c = shape[1]
    x = rnd(seed, shape, 2.0)
    w = rnd(seed + 1, c) if has_w else None
    b = rnd(seed + 2, c) if has_b else None
    y = L.group_norm(g, 1e-3, x, weight=w, bias=b)
    close(y, ref_group(g, 1e-3, x, w, b))
    bs = (c,) + (1,) * (x.ndim - 2)
    want = L.group_norm(g, 1e-3, x)
    if w is not None:
        want = want * w.reshape(bs)
    if b is not None:
        want = want + b.reshape(bs)
    assert want.tobytes() == y.tobytes()


@SET
@given(seed=seeds, shp=shapes_nc, has_w=st.booleans(), has_b=st.booleans())
def test_instance_norm_affine(seed, shp, has_w, has_b):
    n, c, nsp, a, bb = shp
    shape = (n, c) + (a, bb)[:max(nsp, 1)]
    x = rnd(seed, shape, 2.0)
    w = rnd(seed + 1, c) if has_w else None
    b = rnd(seed + 2, c) if has_b else None
    y = L.instance_norm(1e-3, x, weight=w, bias=b)
    close(y, ref_instance(1e-3, x, w, b))
    bs = (c,) + (1,) * (x.ndim - 2)
    want = L.instance_norm(1e-3, x)
    if w is not None:
        want = want * w.reshape(bs)
    if b is not None:
        want = want + b.reshape(bs)
    assert want.tobytes() == y.tobytes()


# ----------------------------------------------------------------------------- torch
@needs_torch
def test_against_torch():
    t = lambda a: torch.tensor(a, dtype=torch.float64)  # noqa: E731
    x = rnd(7, (4, 6, 5, 3), 2.0) + 0.5
    w3, b3 = rnd(8, (6, 5, 3)), rnd(9, (6, 5, 3))
    close(L.layer_norm(3, 1e-5, x, weight=w3, bias=b3),
          F.layer_norm(t(x), (6, 5, 3), t(w3), t(b3), 1e-5).numpy())
    w1 = rnd(10, 3)
    close(L.layer_norm(1, 1e-5, x, weight=w1), F.layer_norm(t(x), (3,), t(w1), None, 1e-5).numpy())
    if hasattr(F, "rms_norm"):
        close(L.rms_norm(2, 1e-5, x, weight=w3[0]),
              F.rms_norm(t(x), (5, 3), t(w3[0]), 1e-5).numpy())
    wc, bc = rnd(11, 6), rnd(12, 6)
    close(L.group_norm(3, 1e-5, x, weight=wc, bias=bc),
          F.group_norm(t(x), 3, t(wc), t(bc), 1e-5).numpy())
    close(L.instance_norm(1e-5, x, weight=wc, bias=bc),
          F.instance_norm(t(x), weight=t(wc), bias=t(bc), eps=1e-5).numpy())


# ----------------------------------------------------------------------------- errors
def test_affine_errors():
    x = rnd(0, (2, 3, 4))
    for kw in ({"weight": np.ones(3)}, {"weight": np.ones((1, 4))}, {"bias": np.ones((3, 4, 1))},
               {"weight": np.ones(5)}, {"bias": 1.0}, {"weight": np.ones((2, 3, 4))}):
        raises(ShapeError, "layer_norm", L.layer_norm, 1, 1e-5, x, **kw)
    raises(ShapeError, "layer_norm", L.layer_norm, 2, 1e-5, x, weight=np.ones(4))  # broadcastable
    msg = raises(ShapeError, "rms_norm", L.rms_norm, 2, 1e-5, x, weight=np.ones((4, 3)))
    assert "got [4, 3], expected [3, 4]" in msg
    for bad in (np.nan, np.inf, -np.inf):
        w = np.ones(4)
        w[2] = bad
        raises(NonFiniteError, "layer_norm", L.layer_norm, 1, 1e-5, x, weight=w)
        raises(NonFiniteError, "layer_norm", L.layer_norm, 1, 1e-5, x, bias=w)
        raises(NonFiniteError, "rms_norm", L.rms_norm, 1, 1e-5, x, weight=w)
        c3 = np.ones(3)
        c3[1] = bad
        raises(NonFiniteError, "group_norm", L.group_norm, 3, 1e-5, x, weight=c3)
        raises(NonFiniteError, "group_norm", L.group_norm, 1, 1e-5, x, bias=c3)
        raises(NonFiniteError, "instance_norm", L.instance_norm, 1e-5, x, weight=c3)
        raises(NonFiniteError, "instance_norm", L.instance_norm, 1e-5, x, bias=c3)
    for fn, args in ((L.group_norm, (1, 1e-5)), (L.instance_norm, (1e-5,))):
        name = fn.__name__
        for bad in (np.ones(4), np.ones((3, 1)), np.ones((1, 3)), np.ones(1), 2.0, np.ones(2)):
            raises(ShapeError, name, fn, *args, x, weight=bad)
            raises(ShapeError, name, fn, *args, x, bias=bad)
    with pytest.raises(TypeError):
        L.rms_norm(1, 1e-5, x, bias=np.ones(4))      # RMS norm has no bias
    with pytest.raises(TypeError):
        L.layer_norm(1, 1e-5, x, np.ones(4))         # keyword-only
    with pytest.raises(TypeError):
        L.layer_norm(1, 1e-5, x, weight="abc")
    # the existing parameter checks still come first / still apply
    raises(DomainError, "layer_norm", L.layer_norm, 0, 1e-5, x, weight=np.ones(4))
    raises(DomainError, "group_norm", L.group_norm, 2, 1e-5, x, weight=np.ones(3))
    xn = x.copy()
    xn[0, 0, 0] = np.nan
    raises(NonFiniteError, "layer_norm", L.layer_norm, 1, 1e-5, xn, weight=np.ones(4))
    raises(NonFiniteError, "group_norm", L.group_norm, 1, 1e-5, xn, weight=np.ones(3))


def test_affine_overflow():
    x = rnd(0, (2, 3, 4))
    raises(NumericOverflow, "layer_norm", L.layer_norm, 1, 1e-5, x, weight=np.full(4, 1e308),
           bias=np.full(4, 1e308))
    raises(NumericOverflow, "rms_norm", L.rms_norm, 1, 1e-5, x * 0 + 1.0 + x,
           weight=np.full(4, 1.7e308) * np.sign(x[0, 0] + 10))
    raises(NumericOverflow, "group_norm", L.group_norm, 1, 1e-5, x, weight=np.full(3, 1e308))
    raises(NumericOverflow, "instance_norm", L.instance_norm, 1e-5, x, bias=np.full(3, 1.7e308),
           weight=np.full(3, 1.7e308))
    # huge but representable: fine
    y = L.layer_norm(1, 1e-5, x, weight=np.full(4, 1e300))
    assert np.isfinite(y).all()


def test_inputs_not_mutated_and_array_likes():
    x = rnd(0, (3, 4))
    w = rnd(1, 4)
    b = rnd(2, 4)
    xc, wc, bc = x.copy(), w.copy(), b.copy()
    y = L.layer_norm(1, 1e-5, x, weight=w, bias=b)
    assert np.array_equal(x, xc) and np.array_equal(w, wc) and np.array_equal(b, bc)
    assert y.flags.c_contiguous and y.dtype == np.float64
    wv = np.repeat(w, 2)[::2]               # non-contiguous view, same values
    wv.flags.writeable = False
    assert L.layer_norm(1, 1e-5, x, weight=wv, bias=b.tolist()).tobytes() == y.tobytes()
    assert L.layer_norm(1, 1e-5, x, weight=w.astype(np.float32)).tobytes() == \
        (L.layer_norm(1, 1e-5, x) * w.astype(np.float32).astype(np.float64)).tobytes()


# ----------------------------------------------------------------------------- empty batches
def test_empty_batches_plain():
    assert L.layer_norm(1, 1e-5, np.zeros((0, 4)), weight=np.ones(4), bias=np.ones(4)).shape == (0, 4)
    assert L.layer_norm(2, 1e-5, np.zeros((2, 0, 3, 4)), weight=np.ones((3, 4))).shape == (2, 0, 3, 4)
    assert L.rms_norm(1, 1e-5, np.zeros((0, 5)), weight=np.ones(5)).shape == (0, 5)
    assert L.group_norm(2, 1e-5, np.zeros((0, 4, 3)), weight=np.ones(4), bias=np.ones(4)).shape == (0, 4, 3)
    assert L.group_norm(2, 1e-5, np.zeros((0, 4))).shape == (0, 4)
    assert L.instance_norm(1e-5, np.zeros((0, 3, 2, 2)), weight=np.ones(3)).shape == (0, 3, 2, 2)
    assert L.instance_norm(1e-5, np.zeros((0, 3, 2))).shape == (0, 3, 2)
    # shapes are still checked for empty batches
    raises(ShapeError, "layer_norm", L.layer_norm, 1, 1e-5, np.zeros((0, 4)), weight=np.ones(3))
    raises(ShapeError, "group_norm", L.group_norm, 2, 1e-5, np.zeros((0, 4, 3)), bias=np.ones(3))
    # batch_norm TRAINING with no statistics is still an error
    with pytest.raises(ShapeError):
        L.batch_norm(L.Mode.TRAINING, 0.1, 1e-5, [1.0], [0.0], L.BatchNormState.initial(1),
                     np.zeros((0, 1)))


def test_empty_batches_ad():
    x = ad.variable(np.zeros((0, 4)))
    w = ad.variable(np.ones(4))
    b = ad.variable(np.ones(4))
    y = L.layer_norm_ad(1, 1e-5, x, weight=w, bias=b)
    assert y.shape == (0, 4)
    gx, gw, gb = ad.gradients(ad.sum(y), [x, w, b])
    assert gx.shape == (0, 4) and np.array_equal(gw, np.zeros(4)) and np.array_equal(gb, np.zeros(4))
    y = L.rms_norm_ad(1, 1e-5, x, weight=w)
    assert y.shape == (0, 4)
    for fn, args in ((L.group_norm_ad, (2,)), (L.instance_norm_ad, ())):
        x4 = ad.variable(np.zeros((0, 4, 3)))
        y = fn(*args, 1e-5, x4, weight=w, bias=b)
        assert y.shape == (0, 4, 3)
        gx, gw, gb = ad.gradients(ad.sum(y), [x4, w, b])
        assert gx.shape == (0, 4, 3)
        assert np.array_equal(gw, np.zeros(4)) and np.array_equal(gb, np.zeros(4))
        y = fn(*args, 1e-5, x4)
        assert y.shape == (0, 4, 3)
        (gx,) = ad.gradients(ad.sum(y), [x4])
        assert gx.shape == (0, 4, 3)


# ----------------------------------------------------------------------------- _ad twins
def _bits_equal(a, b):
    return a.tobytes() == b.tobytes() and a.shape == b.shape


@SET
@given(seed=seeds, shape=st.lists(st.integers(1, 4), min_size=1, max_size=3), data=st.data(),
       has_w=st.booleans(), has_b=st.booleans())
def test_layer_rms_ad_forward_and_gradients(seed, shape, data, has_w, has_b):
    x = rnd(seed, shape, 2.0)
    axes = data.draw(st.integers(1, len(shape)))
    tail = tuple(shape[len(shape) - axes:])
    w = rnd(seed + 1, tail) if has_w else None
    b = rnd(seed + 2, tail) if has_b else None
    kw = {}
    if w is not None:
        kw["weight"] = ad.variable(w)
    if b is not None:
        kw["bias"] = ad.variable(b)
    y = L.layer_norm_ad(axes, 1e-3, ad.variable(x), **kw)
    assert _bits_equal(y.value, L.layer_norm(axes, 1e-3, x, weight=w, bias=b))
    z = L.rms_norm_ad(axes, 1e-3, ad.variable(x), **({"weight": kw["weight"]} if has_w else {}))
    assert _bits_equal(z.value, L.rms_norm(axes, 1e-3, x, weight=w))
    inputs = [x] + [a for a in (w, b) if a is not None]

    def f_layer(xx, *rest):
        it = iter(rest)
        return L.layer_norm_ad(axes, 1e-3, xx, weight=next(it) if has_w else None,
                               bias=next(it) if has_b else None)

    ad.check_gradients(f_layer, inputs, rtol=1e-5, atol=1e-7)
    if has_w:
        ad.check_gradients(lambda xx, ww: L.rms_norm_ad(axes, 1e-3, xx, weight=ww), [x, w],
                           rtol=1e-5, atol=1e-7)


def test_layer_rms_ad_affine_large_rows_parallel_and_serial():
    # the recorded affine output (one pass, non-finite outputs counted in it) on shapes
    # that take the parallel kernel: the plain layers' bits, serial and parallel alike,
    # for every combination of weight and bias
    from hmath_dl._kernels._jit import forced_schedule
    for shape, axes in (((300, 129), 1), ((16, 64, 64), 1), ((4, 40, 33), 2)):
        x = rnd(5, shape, 3.0)
        tail = shape[len(shape) - axes:]
        w, b = rnd(6, tail), rnd(7, tail)
        for ww, bb in ((w, b), (w, None), (None, b)):
            want = L.layer_norm(axes, 1e-5, x, weight=ww, bias=bb)
            for sched in ("serial", "parallel"):
                with forced_schedule(sched):
                    got = L.layer_norm_ad(axes, 1e-5, ad.variable(x), weight=ww, bias=bb)
                assert _bits_equal(got.value, want), (shape, ww is None, bb is None, sched)
        want = L.rms_norm(axes, 1e-5, x, weight=w)
        assert _bits_equal(L.rms_norm_ad(axes, 1e-5, ad.variable(x), weight=w).value, want)
    # an output that overflows only in the affine step, deep in a parallel run of rows
    x = rnd(8, (300, 129), 1.0)
    w = np.ones(129)
    w[77] = 1e308
    raises(NumericOverflow, "layer_norm_ad", L.layer_norm_ad, 1, 1e-5, ad.variable(x),
           weight=w, bias=np.full(129, 1e308))


@SET
@given(seed=seeds, shp=shapes_nc, g=st.integers(1, 2), has_w=st.booleans(), has_b=st.booleans())
def test_group_instance_ad(seed, shp, g, has_w, has_b):
    n, cmul, nsp, a, bb = shp
    shape = _nc_shape(n, cmul * g, nsp, a, bb)
    c = shape[1]
    x = rnd(seed, shape, 2.0)
    w = rnd(seed + 1, c) if has_w else None
    b = rnd(seed + 2, c) if has_b else None
    kw = dict(weight=None if w is None else ad.variable(w), bias=None if b is None else ad.variable(b))
    y = L.group_norm_ad(g, 1e-3, ad.variable(x), **kw)
    assert _bits_equal(y.value, L.group_norm(g, 1e-3, x, weight=w, bias=b))
    inputs = [x] + [t for t in (w, b) if t is not None]

    def wrap(fn, *args):
        def f(xx, *rest):
            it = iter(rest)
            return fn(*args, 1e-3, xx, weight=next(it) if has_w else None,
                      bias=next(it) if has_b else None)
        return f

    ad.check_gradients(wrap(L.group_norm_ad, g), inputs, rtol=1e-5, atol=1e-7)
    if nsp:
        yi = L.instance_norm_ad(1e-3, ad.variable(x), **kw)
        assert _bits_equal(yi.value, L.instance_norm(1e-3, x, weight=w, bias=b))
        ad.check_gradients(wrap(L.instance_norm_ad), inputs, rtol=1e-5, atol=1e-7)


def test_weight_grads_against_formula():
    # dweight = sum over the batch of g * xhat, dbias = sum of g (independent numpy oracle)
    x = rnd(0, (5, 3, 4))
    w, b = rnd(1, 3), rnd(2, 3)
    vx, vw, vb = ad.variable(x), ad.variable(w), ad.variable(b)
    cot = rnd(3, x.shape)
    gx, gw, gb = ad.gradients(L.group_norm_ad(3, 1e-5, vx, weight=vw, bias=vb), [vx, vw, vb], cot)
    xh = ref_group(3, 1e-5, x)
    close(gw, [math.fsum((cot[:, c] * xh[:, c]).ravel()) for c in range(3)], rtol=1e-12)
    close(gb, [math.fsum(cot[:, c].ravel()) for c in range(3)], rtol=1e-12)
    x2 = rnd(4, (6, 7))
    w2, b2 = rnd(5, 7), rnd(6, 7)
    vx, vw, vb = ad.variable(x2), ad.variable(w2), ad.variable(b2)
    cot = rnd(7, x2.shape)
    gx, gw, gb = ad.gradients(L.layer_norm_ad(1, 1e-5, vx, weight=vw, bias=vb), [vx, vw, vb], cot)
    xh = ref_layer(1, 1e-5, x2)
    close(gw, [math.fsum(cot[:, j] * xh[:, j]) for j in range(7)], rtol=1e-12)
    close(gb, [math.fsum(cot[:, j]) for j in range(7)], rtol=1e-12)


@needs_torch
def test_ad_gradients_against_torch():
    x = rnd(0, (3, 4, 5))
    w, b = rnd(1, 4), rnd(2, 4)
    cot = rnd(3, x.shape)
    vx, vw, vb = ad.variable(x), ad.variable(w), ad.variable(b)
    got = ad.gradients(L.group_norm_ad(2, 1e-5, vx, weight=vw, bias=vb), [vx, vw, vb], cot)
    tx, tw, tb = (torch.tensor(a, dtype=torch.float64, requires_grad=True) for a in (x, w, b))
    F.group_norm(tx, 2, tw, tb, 1e-5).backward(torch.tensor(cot))
    for g_, t_ in zip(got, (tx, tw, tb)):
        close(g_, t_.grad.numpy(), rtol=1e-10, atol=1e-12)
    vx, vw, vb = ad.variable(x), ad.variable(w), ad.variable(b)
    got = ad.gradients(L.instance_norm_ad(1e-5, vx, weight=vw, bias=vb), [vx, vw, vb], cot)
    tx, tw, tb = (torch.tensor(a, dtype=torch.float64, requires_grad=True) for a in (x, w, b))
    F.instance_norm(tx, weight=tw, bias=tb, eps=1e-5).backward(torch.tensor(cot))
    for g_, t_ in zip(got, (tx, tw, tb)):
        close(g_, t_.grad.numpy(), rtol=1e-10, atol=1e-12)
    w5, b5 = rnd(4, 5), rnd(5, 5)
    vx, vw, vb = ad.variable(x), ad.variable(w5), ad.variable(b5)
    got = ad.gradients(L.layer_norm_ad(1, 1e-5, vx, weight=vw, bias=vb), [vx, vw, vb], cot)
    tx, tw, tb = (torch.tensor(a, dtype=torch.float64, requires_grad=True) for a in (x, w5, b5))
    F.layer_norm(tx, (5,), tw, tb, 1e-5).backward(torch.tensor(cot))
    for g_, t_ in zip(got, (tx, tw, tb)):
        close(g_, t_.grad.numpy(), rtol=1e-10, atol=1e-12)


def test_ad_constants_and_errors():
    x = rnd(0, (2, 3, 4))
    vx = ad.variable(x)
    # array-like weight/bias are constants: only x gets a gradient
    y = L.layer_norm_ad(1, 1e-5, vx, weight=np.ones(4) * 2, bias=[0.5] * 4)
    assert _bits_equal(y.value, L.layer_norm(1, 1e-5, x, weight=np.ones(4) * 2, bias=[0.5] * 4))
    (gx,) = ad.gradients(ad.sum(y * y), [vx])
    assert gx.shape == x.shape
    # a variable weight with a constant x: a gradient for the weight only
    vw = ad.variable(np.ones(3))
    y = L.group_norm_ad(1, 1e-5, x, weight=vw)
    (gw,) = ad.gradients(ad.sum(y), [vw])
    close(gw, [math.fsum(ref_group(1, 1e-5, x)[:, c].ravel()) for c in range(3)], atol=1e-12)
    raises(ShapeError, "layer_norm_ad", L.layer_norm_ad, 1, 1e-5, vx, weight=ad.variable(np.ones(3)))
    raises(ShapeError, "rms_norm_ad", L.rms_norm_ad, 2, 1e-5, vx, weight=np.ones(4))
    raises(ShapeError, "group_norm_ad", L.group_norm_ad, 1, 1e-5, vx, bias=np.ones(4))
    raises(ShapeError, "instance_norm_ad", L.instance_norm_ad, 1e-5, vx, weight=np.ones((3, 1)))
    raises(ShapeError, "instance_norm_ad", L.instance_norm_ad, 1e-5, ad.variable(np.ones((2, 3))))
    raises(DomainError, "group_norm_ad", L.group_norm_ad, 2, 1e-5, vx)
    raises(DomainError, "group_norm_ad", L.group_norm_ad, 1, 0.0, vx)
    raises(DomainError, "instance_norm_ad", L.instance_norm_ad, -1.0, vx)
    raises(NonFiniteError, "group_norm_ad", L.group_norm_ad, 1, 1e-5, vx, weight=[1.0, np.nan, 1.0])
    raises(NonFiniteError, "layer_norm_ad", L.layer_norm_ad, 1, 1e-5, vx, bias=[1.0, np.inf, 1.0, 1.0])
    raises(NumericOverflow, "layer_norm_ad", L.layer_norm_ad, 1, 1e-5, vx, weight=np.full(4, 1e308),
           bias=np.full(4, 1e308))
    with pytest.raises(TypeError):
        L.group_norm_ad(1, 1e-5, None)
    with pytest.raises(TypeError):
        L.rms_norm_ad(1, 1e-5, vx, bias=np.ones(4))


# ----------------------------------------------------------------------------- weight norm
@SET
@given(seed=seeds, shape=st.lists(st.integers(1, 4), min_size=1, max_size=3), data=st.data())
def test_weight_norm_ad(seed, shape, data):
    w = rnd(seed, shape) + 0.25
    axis = data.draw(st.integers(-len(shape), len(shape) - 1))
    m = np.random.default_rng(seed + 1).uniform(-2.0, 2.0, shape[axis])
    y = L.weight_norm_ad(axis, ad.variable(m), ad.variable(w))
    assert _bits_equal(y.value, L.weight_norm(axis, m, w))
    close(y.value, ref_weight_norm(axis, m, w))
    ad.check_gradients(lambda mm, ww: L.weight_norm_ad(axis, mm, ww), [m, w], rtol=1e-5, atol=1e-7)


def test_weight_norm_ad_formula_extremes_and_errors():
    w = rnd(0, (3, 4, 2))
    m = np.array([1.5, -0.5, 2.0, 1.0])
    cot = rnd(1, w.shape)

    def grads(scale):
        vm, vw = ad.variable(m), ad.variable(w * scale)
        return ad.gradients(L.weight_norm_ad(1, vm, vw), [vm, vw], cot)

    gm, gw = grads(1.0)
    # oracle: dm_i = sum g u, dw = m/||w|| (g - u (u.g))
    for i in range(4):
        wi = w[:, i, :]
        nrm = math.sqrt(math.fsum((wi * wi).ravel()))
        u = wi / nrm
        ug = math.fsum((u * cot[:, i, :]).ravel())
        close(gm[i], ug)
        close(gw[:, i, :], m[i] / nrm * (cot[:, i, :] - u * ug))
    # scale invariance: the power-of-two scaling keeps huge / tiny slices exact
    for scale in (2.0 ** 900, 2.0 ** -1000):
        gm2, gw2 = grads(scale)
        close(gm2, gm, rtol=1e-13)
        close(gw2 * scale, gw, rtol=1e-12)
    wz = w.copy()
    wz[:, 2, :] = 0.0
    raises(DomainError, "weight_norm_ad", L.weight_norm_ad, 1, m, ad.variable(wz))
    raises(ShapeError, "weight_norm_ad", L.weight_norm_ad, 1, m[:3], ad.variable(w))
    raises(DomainError, "weight_norm_ad", L.weight_norm_ad, 3, m, ad.variable(w))
    raises(NonFiniteError, "weight_norm_ad", L.weight_norm_ad, 1, [1.0, np.nan, 1.0, 1.0], ad.variable(w))
    # empty slices: empty result, zero magnitude gradients
    vm, vw = ad.variable(np.ones(3)), ad.variable(np.zeros((3, 0)))
    y = L.weight_norm_ad(0, vm, vw)
    assert y.shape == (3, 0)
    gm, gw = ad.gradients(ad.sum(y), [vm, vw])
    assert np.array_equal(gm, np.zeros(3)) and gw.shape == (3, 0)


# ----------------------------------------------------------------------------- determinism
def test_backward_kernels_serial_equals_parallel():
    from hmath_dl._kernels import norm_affine as K
    from hmath_dl._kernels.norm import LANES
    from hmath_dl._kernels._jit import forced_schedule
    g, xh = rnd(0, (37, 300)), rnd(1, (37, 300))
    outs = []
    for schedule in ("parallel", "serial"):     # 300 columns: two blocks
        dw, db = np.zeros(300), np.zeros(300)
        with forced_schedule(schedule):
            K.affine_grads_elem(g.reshape(-1), xh.reshape(-1), 37, 300, dw, db)
        outs.append(dw.tobytes() + db.tobytes())
    dw, db = np.zeros(300), np.zeros(300)
    K.affine_grads_elem_serial(g.reshape(-1), xh.reshape(-1), 37, 300, dw, db)
    outs.append(dw.tobytes() + db.tobytes())
    assert outs[0] == outs[1] == outs[2]
    want_w, want_b = np.zeros(300), np.zeros(300)      # rows in order, each product rounded
    for r in range(37):
        want_w = want_w + g[r] * xh[r]
        want_b = want_b + g[r]
    assert outs[0] == want_w.tobytes() + want_b.tobytes()
    outs = []
    for fn in (K.affine_grads_channel, K.affine_grads_channel_serial):
        dw, db = np.zeros(5), np.zeros(5)
        fn(g.reshape(-1), xh.reshape(-1), 3, 5, 37 * 300 // 15, LANES, dw, db)
        outs.append(dw.tobytes() + db.tobytes())
    assert outs[0] == outs[1]
    outs = []
    w = rnd(2, (6, 5, 7))
    for fn in (K.weight_norm_backward, K.weight_norm_backward_serial):
        dw, dm, st_ = np.zeros(w.size), np.zeros(5), np.zeros(5, dtype=np.int8)
        fn(w.reshape(-1), g.reshape(-1)[:w.size].copy(), 6, 5, 7, np.ones(5), dw, dm, st_)
        outs.append(dw.tobytes() + dm.tobytes())
    assert outs[0] == outs[1]
    from hmath_dl._kernels import norm as N
    x = rnd(3, (20, 50))
    w, b = rnd(4, 50), rnd(5, 50)
    res = []
    for fn in (N.normalize_rows_affine, N.normalize_rows_affine_serial):
        out, stt = np.empty(1000), np.zeros(20, dtype=np.int8)
        fn(x.reshape(-1), 20, 50, 1e-5, True, LANES, w, b, True, True, 1, 50, 1, False, out, stt,
           np.empty(0))
        res.append(out.tobytes())
    assert res[0] == res[1]


def test_same_bits_for_any_thread_count():
    assert_same_across_threads("""
        import sys, numpy as np
        from hmath_dl import autodiff as ad, layers as L
        rng = np.random.default_rng(0)
        x = rng.standard_normal((8, 16, 32, 40))
        w, b = rng.standard_normal(16), rng.standard_normal(16)
        out = [L.group_norm(4, 1e-5, x, weight=w, bias=b), L.instance_norm(1e-5, x, weight=w),
               L.layer_norm(2, 1e-5, x, weight=rng.standard_normal((32, 40)), bias=None)]
        vx, vw, vb = ad.variable(x), ad.variable(w), ad.variable(b)
        cot = rng.standard_normal(x.shape)
        out += ad.gradients(L.group_norm_ad(4, 1e-5, vx, weight=vw, bias=vb), [vx, vw, vb], cot)
        vl = ad.variable(rng.standard_normal((32, 40)))
        out += ad.gradients(L.layer_norm_ad(2, 1e-5, vx, weight=vl, bias=vl), [vx, vl], cot)
        vm, vww = ad.variable(rng.uniform(1, 2, 16)), ad.variable(x[0])
        out += ad.gradients(L.weight_norm_ad(0, vm, vww), [vm, vww], cot[0])
        for a in out:
            sys.stdout.buffer.write(a.tobytes())
    """)
