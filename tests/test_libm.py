"""hmath_dl._kernels.libm: ulp bounds against exact values, special values, same bits on
every CPU, thread-count independence.

Oracles.  The bulk (about 1.1 million points) is checked against ``np.longdouble``
(x87 80-bit, a 64-bit significand: glibc's ``expl``/``logl``/``sinl`` ... are accurate to a
few units of 2**-64, i.e. below 0.002 ulp of a double, and ``sinl``/``cosl`` reduce huge
arguments exactly), because 60-digit mpmath is about 30 us a point in Python.  That
oracle is itself checked against mpmath (60 digits) on a sample of every function's
points (including the hard ones: edges, subnormals, huge arguments), where it must agree
within 0.01 ulp; ``erf`` has no long-double counterpart and is checked against mpmath
alone (tens of thousands of points).  Where ``np.longdouble`` is not the 80-bit format
(e.g. aarch64 macOS: it is a double) the long-double sweeps are skipped and the mpmath
checks remain.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from hmath_dl._kernels import libm
from tests.helpers import ROOT

mp = pytest.importorskip("mpmath")
mp.mp.dps = 60

# documented bounds (module docstring of hmath_dl._kernels.libm), in ulps
BOUND = {"exp": 1.0, "expm1": 1.0, "log": 1.0, "log1p": 1.0, "tanh": 1.0, "erf": 1.0,
         "sigmoid": 1.0, "softplus": 1.0, "sin": 1.0, "cos": 1.0}
NAMES = tuple(BOUND)
LONG_OK = np.finfo(np.longdouble).nmant >= 63
LD = np.longdouble
DBL_MAX = np.finfo(np.float64).max
TINY = 5e-324


def kern(name):
    return getattr(libm, name + "_array")


def run(name, x):
    x = np.ascontiguousarray(x, dtype=np.float64)
    out = np.empty_like(x)
    kern(name)(x, out)
    return out


# --------------------------------------------------------------------------- points
def _logu(g, lo, hi, n, signed=True):
    """Log-uniform magnitudes 2**lo .. 2**hi (random mantissas), random signs."""
    e = g.uniform(lo, hi, n)
    v = np.exp2(e)
    if signed:
        v = v * np.where(g.random(n) < 0.5, -1.0, 1.0)
    return v


def _around(v, n):
    """The 2n+1 doubles around v (n ulps each side)."""
    out = [v]
    a = b = v
    with np.errstate(over="ignore"):
        for _ in range(n):
            a = np.nextafter(a, -np.inf)
            b = np.nextafter(b, np.inf)
            out += [a, b]
    return np.array(out)


def _subnormals(g, n):
    bits = g.integers(1, 1 << 52, n, dtype=np.int64)
    return bits.view(np.float64) * np.where(g.random(n) < 0.5, -1.0, 1.0)


def points(name, n=120_000, seed=0):
    g = np.random.default_rng(sum(name.encode()) * 7 + seed)
    tiny = np.concatenate([_logu(g, -1074, -20, n // 12), _subnormals(g, 200)])
    if name == "exp":
        p = [g.uniform(-746, 710, n // 3), _logu(g, -60, 9.6, n // 3),
             g.uniform(-745.2, -708.3, n // 6), tiny,
             _around(709.782712893384, 300), _around(-745.1332191019412, 300),
             _around(-708.3964185322641, 300), _around(0.34657359027997264, 100)]
    elif name == "expm1":
        p = [g.uniform(-40, 710, n // 3), _logu(g, -60, 9.5, n // 3),
             g.uniform(-1.5, 1.5, n // 6), tiny, _around(709.782712893384, 300),
             _around(354.0, 50), _around(355.0, 50), _around(-0.34657359027997264, 100),
             _around(0.34657359027997264, 100), _around(-38.0, 50)]
    elif name == "log":
        p = [np.exp2(g.uniform(-1074, 1024, n // 2)), np.abs(_subnormals(g, n // 12)),
             1.0 + g.uniform(-0.3, 0.42, n // 6), 1.0 + _logu(g, -53, -10, n // 6),
             _around(1.0, 200), _around(DBL_MAX, 1)[:2], _around(2.2250738585072014e-308, 100)]
    elif name == "log1p":
        p = [g.uniform(-1, 1, n // 4), -1.0 + np.exp2(g.uniform(-53, -1, n // 8)),
             np.exp2(g.uniform(-60, 1024, n // 4)), _logu(g, -60, -1, n // 4), tiny,
             _around(-0.2928932188134524, 100), _around(0.41421356237309503, 100),
             _around(DBL_MAX, 1)[:2]]
    elif name == "tanh":
        p = [g.uniform(-20, 20, n // 3), _logu(g, -40, 5, n // 2), tiny,
             _around(19.06, 100), _around(0.55, 100), _around(3.725290298461914e-09, 50)]
    elif name == "sigmoid":
        p = [g.uniform(-750, 40, n // 3), _logu(g, -40, 9.6, n // 2), tiny,
             _around(-708.3964185322641, 300), _around(-745.1332191019412, 300),
             _around(36.74, 100), _around(-36.74, 100)]
    elif name == "softplus":
        p = [g.uniform(-750, 750, n // 3), _logu(g, -40, 9.6, n // 2), tiny,
             _around(-708.0, 300), _around(-745.1332191019412, 300), _around(37.4, 100),
             _around(0.8813735870195429, 100), _around(-0.8813735870195429, 100)]
    elif name == "erf":
        p = [g.uniform(-6.5, 6.5, n // 2), _logu(g, -40, 2.7, n // 3), tiny,
             _around(1.0, 200), _around(-1.0, 200), _around(5.93, 100)]
    else:   # sin, cos
        k = g.integers(-1_000_000, 1_000_000, n // 8)
        near = k * (np.pi / 2)              # close to multiples of pi/2: hard reductions
        p = [g.uniform(-10, 10, n // 4), g.uniform(-1647099, 1647099, n // 4),
             _logu(g, -30, 20.65, n // 8), _logu(g, 20.65, 1023.9, n // 8), near,
             np.nextafter(near, np.inf), tiny, _around(1647099.0, 50),
             _around(np.pi / 4, 50), _around(6381956970095103.0 * 2.0 ** 797, 2)]
    return np.concatenate([np.asarray(a, dtype=np.float64) for a in p])


# --------------------------------------------------------------------------- oracles
def _ld_oracle(name, x):
    """The exact value, to 64 bits, as long doubles (see the module docstring)."""
    y = x.astype(LD)
    with np.errstate(all="ignore"):
        if name == "exp":
            return np.exp(y)
        if name == "expm1":
            return np.expm1(y)
        if name == "log":
            return np.log(y)
        if name == "log1p":
            return np.log1p(y)
        if name == "tanh":
            return np.tanh(y)
        if name == "sigmoid":
            return np.where(y >= 0, LD(1) / (LD(1) + np.exp(-y)),
                            np.exp(y) / (LD(1) + np.exp(y)))
        if name == "softplus":
            return np.maximum(y, LD(0)) + np.log1p(np.exp(-np.abs(y)))
        if name == "sin":
            return np.sin(y)
        if name == "cos":
            return np.cos(y)
    raise KeyError(name)


_MP = {"exp": mp.exp, "expm1": mp.expm1, "log": mp.log, "log1p": mp.log1p,
       "tanh": mp.tanh, "erf": mp.erf, "sin": mp.sin, "cos": mp.cos,
       "sigmoid": lambda v: 1 / (1 + mp.exp(-v)),
       "softplus": lambda v: mp.log1p(mp.exp(v))}


def _mp_round(e):
    """float64 rounding of the mpf e (inf beyond DBL_MAX + half an ulp)."""
    try:
        return float(e) if abs(e) < mp.mpf(2) ** 1024 else (np.inf if e > 0 else -np.inf)
    except OverflowError:
        return np.inf if e > 0 else -np.inf


def _ulp_of(v):
    """ulp of the binade of |v| (float64 arithmetic, v finite), floor 2**-1074."""
    a = np.abs(v)
    m, e = np.frexp(a)
    e = np.maximum(e - 1, -1022)
    return np.where(a < 2.2250738585072014e-308, 2.0 ** -1074, np.ldexp(1.0, e - 52))


def ulp_errors_ld(name, x, got):
    y = _ld_oracle(name, x)
    with np.errstate(over="ignore"):
        rounded = y.astype(np.float64)           # round-to-nearest of the 64-bit value
    # a value that rounds to inf (>= DBL_MAX + half an ulp) must give inf
    over = ~np.isfinite(rounded)
    err = np.zeros(x.size)
    fin = ~over
    u = _ulp_of(rounded[fin])
    err[fin] = np.abs((got[fin].astype(LD) - y[fin]) / u.astype(LD)).astype(np.float64)
    err[over] = np.where((got[over] == rounded[over])
                         | (np.isnan(got[over]) & np.isnan(rounded[over])), 0.0, np.inf)
    return err


def ulp_errors_mp(name, x, got):
    """|got - exact| / ulp(exact), the difference taken in mpmath (exact for subnormal
    results too)."""
    f = _MP[name]
    err = np.zeros(x.size)
    for i, (v, r) in enumerate(zip(x.tolist(), got.tolist())):
        e = f(mp.mpf(v))
        h = _mp_round(e)
        if not np.isfinite(h):
            err[i] = 0.0 if r == h else np.inf
        elif not np.isfinite(r):
            err[i] = np.inf
        else:
            err[i] = float(abs(mp.mpf(r) - e) / mp.mpf(float(_ulp_of(np.array([h]))[0])))
    return err


def _report(name, x, err):
    i = int(np.argmax(err))
    return f"{name}: max {err[i]:.4f} ulp at x = {x[i]!r}"


# --------------------------------------------------------------------------- ulp bounds
@pytest.mark.skipif(not LONG_OK, reason="np.longdouble is not the 80-bit format here")
@pytest.mark.parametrize("name", [n for n in NAMES if n != "erf"])
def test_ulp_bound_long_double_sweep(name):
    x = points(name)
    got = run(name, x)
    err = ulp_errors_ld(name, x, got)
    assert err.max() <= BOUND[name], _report(name, x, err)


@pytest.mark.parametrize("name", NAMES)
def test_ulp_bound_mpmath(name):
    """mpmath on a sample of the sweep's points (all of erf's hard cases and 40000 random
    points for erf); for the others it also validates the long-double oracle."""
    g = np.random.default_rng(7)
    x = points(name, n=12_000, seed=1)
    if name != "erf":
        x = np.concatenate([g.choice(x, 1500, replace=False), x[-400:]])
    else:
        x = np.concatenate([x, g.uniform(-6.5, 6.5, 30_000)])
    got = run(name, x)
    err = ulp_errors_mp(name, x, got)
    assert err.max() <= BOUND[name], _report(name, x, err)
    if name != "erf" and LONG_OK:
        err_ld = ulp_errors_ld(name, x, got)
        fin = np.isfinite(err) & np.isfinite(err_ld)
        assert np.all(np.abs(err[fin] - err_ld[fin]) < 0.01), "long-double oracle off"


def test_points_total_at_least_a_million():
    total = sum(points(n).size for n in NAMES if n != "erf" or not LONG_OK)
    assert total >= 1_000_000


# --------------------------------------------------------------------------- special values
def _same(a, b):
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    return np.array_equal(a.view(np.int64), b.view(np.int64)) or (
        np.all(np.isnan(a) == np.isnan(b)) and np.array_equal(a[~np.isnan(a)].view(np.int64),
                                                               b[~np.isnan(b)].view(np.int64)))


INF = np.inf
NAN = np.nan
SPECIAL = {
    "exp": [(0.0, 1.0), (-0.0, 1.0), (1.0, 2.718281828459045), (INF, INF), (-INF, 0.0),
            (NAN, NAN), (709.782712893384, 1.7976931348622732e308),
            (709.7827128933841, INF), (-745.1332191019411, 5e-324), (-745.1332191019412, 0.0),
            (-1000.0, 0.0), (1000.0, INF), (5e-324, 1.0), (-5e-324, 1.0)],
    "expm1": [(0.0, 0.0), (-0.0, -0.0), (5e-324, 5e-324), (-5e-324, -5e-324),
              (1e-300, 1e-300), (INF, INF), (-INF, -1.0), (NAN, NAN), (-38.0, -1.0),
              (-1000.0, -1.0), (709.7827128933841, INF), (1000.0, INF)],
    "log": [(1.0, 0.0), (0.0, -INF), (-0.0, -INF), (-1.0, NAN), (-INF, NAN), (INF, INF),
            (NAN, NAN), (5e-324, -744.4400719213812), (DBL_MAX, 709.782712893384),
            (2.0, 0.6931471805599453)],
    "log1p": [(0.0, 0.0), (-0.0, -0.0), (5e-324, 5e-324), (-5e-324, -5e-324),
              (-1.0, -INF), (-1.5, NAN), (-INF, NAN), (INF, INF), (NAN, NAN),
              (DBL_MAX, 709.782712893384), (1.0, 0.6931471805599453)],
    "tanh": [(0.0, 0.0), (-0.0, -0.0), (5e-324, 5e-324), (-5e-324, -5e-324), (INF, 1.0),
             (-INF, -1.0), (NAN, NAN), (20.0, 1.0), (-20.0, -1.0), (1e300, 1.0)],
    "erf": [(0.0, 0.0), (-0.0, -0.0), (INF, 1.0), (-INF, -1.0), (NAN, NAN), (6.0, 1.0),
            (-6.0, -1.0), (1e300, 1.0)],
    "sigmoid": [(0.0, 0.5), (-0.0, 0.5), (INF, 1.0), (-INF, 0.0), (NAN, NAN), (-800.0, 0.0),
                (40.0, 1.0), (-745.1332191019412, 0.0), (-745.1332191019411, 5e-324)],
    "softplus": [(INF, INF), (-INF, 0.0), (NAN, NAN), (-800.0, 0.0), (1e300, 1e300),
                 (40.0, 40.0), (0.0, 0.6931471805599453), (-0.0, 0.6931471805599453),
                 (DBL_MAX, DBL_MAX)],
    "sin": [(0.0, 0.0), (-0.0, -0.0), (5e-324, 5e-324), (-5e-324, -5e-324), (INF, NAN),
            (-INF, NAN), (NAN, NAN), (1e-10, 1e-10)],
    "cos": [(0.0, 1.0), (-0.0, 1.0), (5e-324, 1.0), (INF, NAN), (-INF, NAN), (NAN, NAN),
            (1e-10, 1.0)],
}


@pytest.mark.parametrize("name", NAMES)
def test_special_values_exact(name):
    x = np.array([p[0] for p in SPECIAL[name]])
    want = np.array([p[1] for p in SPECIAL[name]])
    got = run(name, x)
    scalar = np.array([getattr(libm, name)(v) for v in x])
    for v, w, a, s in zip(x, want, got, scalar):
        assert _same(a, w), f"{name}({v!r}) = {a!r}, want {w!r}"
        assert _same(s, w), f"scalar {name}({v!r}) = {s!r}, want {w!r}"


@pytest.mark.parametrize("name", NAMES)
def test_scalar_helper_equals_array_kernel(name):
    x = points(name, n=3000, seed=3)
    x = np.concatenate([x, [INF, -INF, NAN, 0.0, -0.0]])
    got = run(name, x)
    scalar = np.array([getattr(libm, name)(v) for v in x.tolist()])
    assert _same(got, scalar)


def test_in_place_and_sin_cos_huge_in_place():
    for name in NAMES:
        x = points(name, n=5000, seed=4)
        want = run(name, x)
        y = x.copy()
        kern(name)(y, y)
        assert _same(y, want), name


def test_nan_payload_passes_through():
    x = np.array([np.nan, -np.nan])
    for name in NAMES:
        assert np.isnan(run(name, x)).all(), name


def test_exp_overflow_threshold_is_exact():
    """inf exactly when the exact value rounds above DBL_MAX; 0 exactly when it rounds to
    0 (both thresholds against mpmath, the next doubles checked too)."""
    top = 709.782712893384
    assert np.isfinite(libm.exp(top)) and libm.exp(np.nextafter(top, INF)) == INF
    big = mp.exp(mp.mpf(top))
    assert big < mp.mpf(2) ** 1024 * (1 - mp.mpf(2) ** -54)
    assert mp.exp(mp.mpf(np.nextafter(top, INF))) > mp.mpf(2) ** 1024 * (1 - mp.mpf(2) ** -54)
    low = -745.1332191019412
    assert libm.exp(low) == 0.0 and libm.exp(np.nextafter(low, INF)) == 5e-324
    assert mp.exp(mp.mpf(low)) <= mp.mpf(2) ** -1075
    assert mp.exp(mp.mpf(np.nextafter(low, INF))) > mp.mpf(2) ** -1075


def test_sigmoid_and_softplus_are_exp_bit_for_bit_in_the_subnormal_range():
    x = np.concatenate([np.random.default_rng(5).uniform(-746.0, -708.4, 20_000),
                        [-745.1332191019412, -745.1332191019411, -800.0]])
    e = run("exp", x)
    assert _same(run("sigmoid", x), e)
    assert _same(run("softplus", x[x < -708.0]), e[x < -708.0])


def test_inline_variants_inside_a_caller_loop():
    """The ``*_inline`` functions compiled into another kernel's loop give the same bits."""
    from numba import njit

    @njit
    def loop(x, out):
        for i in range(x.shape[0]):
            out[i] = (libm.exp_inline(x[i]) + libm.tanh_inline(x[i])) + libm.erf_inline(x[i])

    x = points("tanh", n=2000, seed=5)
    out = np.empty_like(x)
    loop(x, out)
    want = (run("exp", x) + run("tanh", x)) + run("erf", x)
    assert _same(out, want)


_FAST = {"expm1": (np.inf, "expm1"), "tanh": (np.inf, "tanh"),
         "sigmoid": (libm.SIGMOID_FAST_BOUND, "sigmoid"),
         "softplus": (libm.SOFTPLUS_FAST_BOUND, "softplus")}


@pytest.mark.parametrize("name", sorted(_FAST))
def test_fast_variants_are_the_plain_bits_in_their_domain(name):
    """``*_fast_inline`` (FMA for the exact product errors where the target has FMA) give
    bit for bit the plain functions' results on every test point in their domain
    (``|x| <= bound``; every double for expm1 and tanh), the special values included."""
    from numba import njit

    bound, base = _FAST[name]
    fast = getattr(libm, name + "_fast_inline")
    plain = getattr(libm, name + "_inline")

    @njit
    def both(x, a, b):
        for i in range(x.shape[0]):
            a[i] = fast(x[i])
            b[i] = plain(x[i])

    x = np.concatenate([points(base), points(base, seed=3), points("sigmoid", seed=4),
                        np.array([p[0] for p in SPECIAL[base]]),
                        _around(min(bound, DBL_MAX), 20), _around(-min(bound, DBL_MAX), 20)])
    if np.isfinite(bound):      # the kernels take the plain path for any other chunk
        x = x[np.abs(x) <= bound]
    a = np.empty_like(x)
    b = np.empty_like(x)
    both(x, a, b)
    assert _same(a, b)


# --------------------------------------------------------------------------- same bits
_SCRIPT = textwrap.dedent("""
    import hashlib, sys
    import numpy as np
    import numba
    from hmath_dl._kernels import libm
    g = np.random.default_rng(2024)
    x = np.concatenate([g.standard_normal(20000) * 10.0, g.uniform(-750, 750, 20000),
                        np.exp2(g.uniform(-1074, 1024, 20000)) * np.where(g.random(20000) < 0.5, -1, 1),
                        g.uniform(-1647099, 1647099, 5000),
                        [0.0, -0.0, np.inf, -np.inf, np.nan, 5e-324, -5e-324, 1e300, -1e300]])
    out = {}
    for t in sorted({1, numba.config.NUMBA_NUM_THREADS}):
        numba.set_num_threads(t)
        h = hashlib.sha256()
        for name in %r:
            o = np.empty_like(x)
            getattr(libm, name + "_array")(x, o)
            h.update(name.encode() + o.tobytes())
        out[t] = h.hexdigest()
    assert len(set(out.values())) == 1, out
    print(out[1])
""" % (NAMES,))


def _host_has(feature):
    import llvmlite.binding as llb
    return bool(llb.get_host_cpu_features().get(feature, False))


def _target_env(name):
    out = subprocess.run([sys.executable, "-m", "hmath_dl.info", "--env", name], cwd=ROOT,
                         capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONPATH": ROOT})
    return dict(line.split("=", 1) for line in out.stdout.split())


@pytest.mark.slow
def test_same_bits_on_every_cpu(tmp_path):
    """Host, AVX2 (haswell) and baseline x86-64 (generic) builds, each in a fresh
    interpreter with a fresh numba cache, run concurrently: identical SHA-256 digests
    (the host run also compares 1 and 2 threads)."""
    targets = {"host": {}}
    import platform
    if platform.machine() in ("x86_64", "AMD64"):
        if _host_has("avx2") and _host_has("fma"):
            targets["haswell"] = _target_env("haswell")
        targets["generic"] = _target_env("generic")
    procs = {}
    for label, extra in targets.items():
        env = {k: v for k, v in os.environ.items()
               if k not in ("NUMBA_CPU_NAME", "NUMBA_CPU_FEATURES")}
        env.update(extra)
        env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
        env["NUMBA_CACHE_DIR"] = str(tmp_path / label)
        env["NUMBA_NUM_THREADS"] = "2" if label == "host" else "1"
        env["HMATH_DL_QUIET"] = "1"
        procs[label] = subprocess.Popen([sys.executable, "-c", _SCRIPT], env=env, cwd=ROOT,
                                        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                        text=True)
    digests = {}
    for label, p in procs.items():
        out, err = p.communicate(timeout=1200)
        assert p.returncode == 0, f"{label}: {err[-4000:]}"
        digests[label] = out.strip()
    assert len(set(digests.values())) == 1, digests
    if "haswell" not in targets and platform.machine() in ("x86_64", "AMD64"):
        pytest.skip("host has no AVX2+FMA: the haswell target was not run "
                    "(host and generic agree)")


def test_same_bits_across_thread_counts_in_process():
    import numba
    x = points("exp", n=40_000, seed=9)
    x = np.concatenate([x, points("sin", n=40_000, seed=9)])
    before = numba.get_num_threads()
    res = {}
    try:
        for t in sorted({1, numba.config.NUMBA_NUM_THREADS}):
            numba.set_num_threads(t)
            res[t] = b"".join(run(name, x).tobytes() for name in NAMES)
    finally:
        numba.set_num_threads(before)
    assert len(set(res.values())) == 1
