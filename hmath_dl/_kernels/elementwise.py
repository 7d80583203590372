"""Elementwise kernels: activations (forward and derivative) and dropout masks.

Activation codes
----------------
Every activation is identified by a small int, ``hmath_dl.activations.Activation.<M>.value``
(also available as ``hmath_dl.activations.ACTIVATION_CODES[Activation.<M>]``):

====  ==========  =======================================================
code  activation  forward ``f(x)``
====  ==========  =======================================================
0     IDENTITY    ``x``
1     RELU        ``max(x, 0)``
2     LEAKY_RELU  ``x if x > 0 else 0.01 x`` (other slopes: ``*_param`` kernels)
3     GELU        ``0.5 x (1 + erf(x / sqrt 2))`` (evaluated as ``0.5 x erfc(-x/sqrt 2)``,
                  erfc by ``_gelu_span``: vectorisable, within 3 ulps)
4     GELU_TANH   ``0.5 x (1 + tanh(u))``, ``u = sqrt(2/pi) (x + 0.044715 x^3)``,
                  evaluated as ``x sigmoid(2u)`` (same value, no cancellation)
5     SILU        ``x sigmoid(x)``
6     SIGMOID     ``1 / (1 + exp(-x))`` (stable two-branch form)
7     TANH        ``tanh(x)``
8     SOFTPLUS    ``max(x, 0) + log1p(exp(-|x|))`` (beta 1; others: ``*_param``)
9     ELU         ``x if x > 0 else expm1(x)`` (alpha 1; others: ``*_param``)
====  ==========  =======================================================

Public kernel entries (for reuse, e.g. by autodiff):

* ``activation_forward(code, x_flat, out_flat) -> bool``: ``out_flat[i] = f(x_flat[i])``.
* ``activation_derivative(code, x_flat, out_flat) -> bool``: ``out_flat[i] = f'(x_flat[i])``
  (at the kinks of RELU / LEAKY_RELU / ELU, ``x == 0``, the left derivative is used: 0,
  0.01 and 1 respectively).
* ``activation_forward_derivative(code, x_flat, out_flat, d_flat) -> bool``: both in one
  pass (GELU evaluates erfc once), bitwise equal to the two kernels above.

Both take 1-D C-contiguous float64 arrays of equal length (``out_flat`` may be
``x_flat`` itself for in-place use) and return True iff every INPUT is finite; for
finite inputs every output of every activation and derivative is finite (the formulas
are evaluated in overflow-free forms).  They do not validate anything else: pass a valid
code (an unknown code leaves ``out_flat`` untouched). Work is split over fixed chunks, so results do
not depend on the thread count.

Each entry dispatches (in Python) on the code to that activation's own compiled code: a
serial span helper (``_fwd_span_<name>`` ...; the ``*_serial`` entries call it directly)
and a thin parallel kernel over its chunks (``activation_forward_<name>`` ...), so a
program compiles only the activations it uses.  Per chunk of 4096 elements one loop
counts the non-finite inputs and evaluates ``f`` (one read, one write); SIGMOID, SILU,
GELU_TANH and SOFTPLUS evaluate libm's ``*_fast_inline`` forms (FMA for exact product
errors, bit for bit the plain results within their ``|x|`` bound) in that loop, count the
elements beyond the bound, and evaluate a chunk (in a serial call, the whole array) that
has any again with the plain forms;
TANH and ELU use the fast forms everywhere.  Without FMA on the target
the fast forms are the plain ones.

Parameterised activations (``activate(..., negative_slope=, alpha=, beta=)``):

* ``activation_forward_param(code, p, x_flat, out_flat) -> int``,
  ``activation_derivative_param(code, p, x_flat, out_flat) -> int`` and
  ``activation_forward_derivative_param(code, p, x_flat, out_flat, d_flat) -> int`` for
  the three codes that take a parameter ``p`` (any other code is evaluated by the
  unparameterised kernels above, ``p`` ignored):

  ==========  ============================================  =============================
  code        forward ``f(x)``                              ``f'(x)`` (left one at 0)
  ==========  ============================================  =============================
  LEAKY_RELU  ``x if x > 0 else p x``                       ``1 if x > 0 else p``
  ELU         ``x if x > 0 else p expm1(x)``                ``1 if x > 0 else p exp(x)``
  SOFTPLUS    ``max(x, 0) + log1p(exp(-|p x|)) / p``        ``sigmoid(p x)``
  ==========  ============================================  =============================

  SOFTPLUS is ``log1p(exp(p x)) / p`` in a form that neither overflows nor cancels (no
  linear cut-off); ``p x`` overflowing to ``+-inf`` gives the exact limits.  With the
  default parameters (0.01, 1.0, 1.0) every result is bitwise the unparameterised
  kernels' (``1.0 * x`` and ``t / 1.0`` are exact).  They return a
  :class:`~.status.Status` code: OK (0) when all inputs and outputs are finite,
  NONFINITE_INPUT (1) when an input is NaN/inf, OVERFLOW (2) when an input is finite but
  an output is not (e.g. ``p x`` overflowing for a huge slope, or ``log 2 / p`` for a tiny beta).

Transcendentals: every ``exp``, ``expm1``, ``log1p``, ``tanh``, ``sigmoid`` and ``softplus``
above is the library's own (:mod:`hmath_dl._kernels.libm`, each within 1 ulp, the same bits
on every CPU; no libm call); the tanh derivative is ``sech^2 = 4e / (1 + e)^2`` with
``e = exp(-2|x|)``.  GELU's erfc/exp are written out in ``_gelu_span``.

Dropout: ``dropout_train(x_flat, u_flat, p, scale, out_flat)`` (element-wise mask) and
``apply_channel_mask(x_flat, channel_mask, inner, out_flat, mask_flat)`` (spatial).
"""


import types as _pytypes

import numpy as np
from numba import prange

from ._jit import helper, inlined as _inl, kernel, runs_serial, span_kernel
from .checks import span_finite
from .status import NONFINITE_INPUT, OK, OVERFLOW
from .libm import (SIGMOID_FAST_BOUND, SOFTPLUS_FAST_BOUND, _bits, _float, _ROUND_BITS,
                   _wide, exp_inline, expm1_fast_inline, expm1_inline, log1p_inline,
                   sigmoid_fast_inline, sigmoid_inline, softplus_fast_inline,
                   softplus_inline, tanh_fast_inline, tanh_inline)

_CHUNK = 4096

IDENTITY = 0
RELU = 1
LEAKY_RELU = 2
GELU = 3
GELU_TANH = 4
SILU = 5
SIGMOID = 6
TANH = 7
SOFTPLUS = 8
ELU = 9

LEAKY_SLOPE = 0.01
_INV_SQRT2 = 0.7071067811865476
_INV_SQRT_2PI = 0.3989422804014327
_GELU_TANH_C = 0.7978845608028654  # sqrt(2 / pi)
_GELU_TANH_A = 0.044715
_INF = np.inf


_sigmoid = sigmoid_inline    # the library's own (hmath_dl._kernels.libm): no libm call


# --------------------------------------------------------------------------- GELU
# GELU(v) = 0.5 v erfc(z), GELU'(v) = 0.5 erfc(z) + v exp(-v^2/2) / sqrt(2 pi), z = -v/sqrt 2.
# For a = |z|: erfc(a) = exp(-a^2) t Q(t), t = 1/(1 + a/2), and erfc(-a) = 2 - erfc(a).
# Q(t) = erfc(a) exp(a^2) / t is smooth on t in [1/15, 1] (a in [0, 28]): one degree-27
# polynomial in y = (15 t - 8)/7 in [-1, 1], a Chebyshev fit of mpmath's Q (50 digits,
# max error 2.4e-19; tests/reference/gelu_table.py regenerates it).  exp(-a^2) is
# evaluated without rounding a^2 (Veltkamp split a = ah + al: a^2 = ah^2 + al (a + ah),
# ah^2 exact), reduced by Cody-Waite to 2^k exp(r), |r| <= ln2/2 (degree-13 Taylor), and
# 2^k = 2^k1 2^k2 built from exponent bits (both factors normal; one final rounding; k
# taken from the bits of the rounding sum, the same integer as int(kf)).
# erfc(z) is within 3 ulps of erfc of the rounded z (the rounding of z itself is the
# x**2-sized condition the tests allow).  Pure arithmetic, no libm calls and no table
# gathers (slow on this hardware): LLVM vectorises the loops; the polynomials are
# evaluated by Estrin's scheme (pairs, then powers y^2, y^4, ...: a short dependency
# chain; exp(r) = 1 + (r + r^2 P(r)) keeps the rounding of P's terms scaled by r^2).  Beyond a = 28
# (|v| > 39.6) erfc(a) < 1e-340 underflows to exactly 0.
_LOG2E = 1.4426950408889634
_LN2_HI = 0.6931471796706319  # ln 2 rounded down to 30 bits: k * _LN2_HI is exact
_LN2_LO = 8.893134238886677e-10  # ln 2 - _LN2_HI
_ROUND = 6755399441055744.0  # 1.5 * 2**52: (t + _ROUND) - _ROUND rounds t to an integer
_SPLIT = 134217729.0  # 2**27 + 1
_GELU_V0_HI = -0.7517915246935645  # the zero of GELU' (mpmath), split in two doubles
_GELU_V0_LO = 1.4956759177009883e-17


@_inl
def _gelu_erfc(v):
    """(erfc(z), exp(-a^2), a, ah, al) for z = -v/sqrt 2, a = min(|z|, 28) = ah + al.
    Any v (NaN and inf included) gives in-range exponent bits; the results for a
    non-finite v are meaningless (the callers report them)."""
    z = -v * _INV_SQRT2
    a = abs(z)
    a = a if a <= 28.0 else 28.0  # also NaN -> 28
    t = a * _SPLIT
    ah = t - (t - a)
    al = a - ah
    s_hi = -(ah * ah)
    s_lo = -(al * (a + ah))
    tk = s_hi * _LOG2E + _ROUND
    kf = tk - _ROUND              # an integer in [-1132, 0]
    k = _bits(tk) - _ROUND_BITS   # the same integer
    k1 = k >> 1
    s1 = _float((k1 + 1023) << 52)
    s2 = _float((k - k1 + 1023) << 52)
    r = ((s_hi - kf * _LN2_HI) - kf * _LN2_LO) + s_lo
    e0_0 = 0.5 + 0.16666666666666666 * r
    e0_1 = 0.041666666666666664 + 0.008333333333333333 * r
    e0_2 = 0.001388888888888889 + 0.0001984126984126984 * r
    e0_3 = 2.48015873015873e-05 + 2.7557319223985893e-06 * r
    e0_4 = 2.755731922398589e-07 + 2.505210838544172e-08 * r
    e0_5 = 2.08767569878681e-09 + 1.6059043836821613e-10 * r
    ep1 = r * r
    e1_0 = e0_0 + e0_1 * ep1
    e1_1 = e0_2 + e0_3 * ep1
    e1_2 = e0_4 + e0_5 * ep1
    ep2 = ep1 * ep1
    e2_0 = e1_0 + e1_1 * ep2
    e2_1 = e1_2
    ep3 = ep2 * ep2
    e3_0 = e2_0 + e2_1 * ep3
    p = 1.0 + (r + (r * r) * e3_0)
    tt = 1.0 / (1.0 + 0.5 * a)
    y = (15.0 * tt - 8.0) / 7.0
    q0_0 = 0.5343229401326932 + 0.33827892810777704 * y
    q0_1 = 0.12464235007162038 + 0.012373178041174356 * y
    q0_2 = -0.00889983427343155 + -0.0018328807495958705 * y
    q0_3 = 0.0011232723676870148 + 0.00014901182286643924 * y
    q0_4 = -0.00018906135521377202 + 1.4082005063943185e-05 * y
    q0_5 = 2.8690886475719638e-05 + -1.0797362558817278e-05 * y
    q0_6 = -1.8788845603213935e-06 + 2.7930952968092153e-06 * y
    q0_7 = -7.104029565809786e-07 + -2.889351024390062e-07 * y
    q0_8 = 2.824119681119841e-07 + -6.917672362665062e-08 * y
    q0_9 = -2.9020629402536678e-08 + 3.1878135939711285e-08 * y
    q0_10 = -1.1795940225770977e-08 + -2.111742344662179e-09 * y
    q0_11 = 5.505309302206009e-09 + -1.944165783580062e-09 * y
    q0_12 = -9.777267508949562e-10 + 6.76524823910441e-10 * y
    q0_13 = 6.63119264205424e-11 + -7.855755494805594e-11 * y
    qp1 = y * y
    q1_0 = q0_0 + q0_1 * qp1
    q1_1 = q0_2 + q0_3 * qp1
    q1_2 = q0_4 + q0_5 * qp1
    q1_3 = q0_6 + q0_7 * qp1
    q1_4 = q0_8 + q0_9 * qp1
    q1_5 = q0_10 + q0_11 * qp1
    q1_6 = q0_12 + q0_13 * qp1
    qp2 = qp1 * qp1
    q2_0 = q1_0 + q1_1 * qp2
    q2_1 = q1_2 + q1_3 * qp2
    q2_2 = q1_4 + q1_5 * qp2
    q2_3 = q1_6
    qp3 = qp2 * qp2
    q3_0 = q2_0 + q2_1 * qp3
    q3_1 = q2_2 + q2_3 * qp3
    qp4 = qp3 * qp3
    q4_0 = q3_0 + q3_1 * qp4
    q = q4_0
    ec = ((p * (tt * q)) * s1) * s2  # erfc(a)
    ez = ec if z >= 0.0 else 2.0 - ec  # erfc(z)
    e = (p * s1) * s2  # exp(-a^2)
    return ez, e, a, ah, al


@_inl
def _gelu_deriv(v, ez, e, a, ah, al):
    """GELU'(v) from :func:`_gelu_erfc`'s results."""
    # phi needs exp(-v^2/2), not exp(-a^2) (a^2 carries the rounding of z):
    # exp(-v^2/2) = e (1 + c), c = a^2 - v^2/2 (tiny, from the exact split squares;
    # 0 once a is clamped, where e == 0)
    t = v * _SPLIT
    vh = t - (t - v)
    vl = v - vh
    c = ((ah * ah) - 0.5 * (vh * vh)) + ((al * (a + ah)) - 0.5 * (vl * (v + vh)))
    c = c if a < 28.0 else 0.0
    dg = 0.5 * ez + v * _INV_SQRT_2PI * (e + e * c)
    # near the zero v0 = -0.7518 of GELU' the two terms above cancel (x67 at
    # v = -0.744): on [-1, -0.5] use GELU'(v) = (v - v0) S(v) instead, S a degree-14
    # polynomial in u = 4v + 3 (exact), Chebyshev fit of mpmath's S (error 7e-22)
    u = 4.0 * v + 3.0
    g0_0 = 0.43218955538054815 + 0.09705466864084913 * u
    g0_1 = -0.0011757940898419806 + -0.0017830228689401518 * u
    g0_2 = -5.702082800956383e-05 + 1.901398583044852e-05 * u
    g0_3 = 1.1013369675704306e-06 + -1.3734078878787107e-07 * u
    g0_4 = -1.1319121003241076e-08 + 7.16710365686359e-10 * u
    g0_5 = 8.195572081377135e-11 + -2.713390909492108e-12 * u
    g0_6 = -4.611874571369789e-13 + 6.653216460069254e-15 * u
    g0_7 = 2.0934701906097666e-15
    gp1 = u * u
    g1_0 = g0_0 + g0_1 * gp1
    g1_1 = g0_2 + g0_3 * gp1
    g1_2 = g0_4 + g0_5 * gp1
    g1_3 = g0_6 + g0_7 * gp1
    gp2 = gp1 * gp1
    g2_0 = g1_0 + g1_1 * gp2
    g2_1 = g1_2 + g1_3 * gp2
    gp3 = gp2 * gp2
    g3_0 = g2_0 + g2_1 * gp3
    sloc = g3_0
    dl = ((v - _GELU_V0_HI) - _GELU_V0_LO) * sloc
    return dl if (v >= -1.0) & (v <= -0.5) else dg


# --------------------------------------------------------------------------- element functions
# f(v) and f'(v) of every activation (the formulas of the module docstring; selects, not
# branches, so that each kernel's loop vectorises).
@_inl
def _f_identity(v):
    return v


@_inl
def _d_identity(v):
    return 1.0


@_inl
def _f_relu(v):
    return v if v > 0.0 else 0.0


@_inl
def _d_relu(v):
    return 1.0 if v > 0.0 else 0.0


@_inl
def _f_leaky_relu(v):
    return v if v > 0.0 else LEAKY_SLOPE * v


@_inl
def _d_leaky_relu(v):
    return 1.0 if v > 0.0 else LEAKY_SLOPE


@_inl
def _f_gelu(v):
    ez, e, a, ah, al = _gelu_erfc(v)
    return 0.5 * v * ez


@_inl
def _d_gelu(v):
    # Phi(v) + v phi(v), phi(v) = exp(-z^2) / sqrt(2 pi)
    ez, e, a, ah, al = _gelu_erfc(v)
    return _gelu_deriv(v, ez, e, a, ah, al)


@_inl
def _fd_gelu(v):
    ez, e, a, ah, al = _gelu_erfc(v)
    return 0.5 * v * ez, _gelu_deriv(v, ez, e, a, ah, al)


@_inl
def _f_gelu_tanh(v):
    # 0.5 (1 + tanh(u)) == sigmoid(2u): no cancellation for negative v;
    # v**3 overflowing to +-inf gives sigmoid = 0 or 1, never NaN.
    u = _GELU_TANH_C * (v + _GELU_TANH_A * v * v * v)
    return v * _sigmoid(2.0 * u)


@_inl
def _d_gelu_tanh(v):
    u = _GELU_TANH_C * (v + _GELU_TANH_A * v * v * v)
    du = _GELU_TANH_C * (1.0 + 3.0 * _GELU_TANH_A * v * v)
    sp = _sigmoid(2.0 * u)
    sm = _sigmoid(-2.0 * u)
    # d/dv [v sigmoid(2u)] = sigmoid(2u) + 2 v sigmoid(2u) sigmoid(-2u) u'
    d = sp + 2.0 * v * (sp * sm) * du
    # |v| >= 1e10: sigmoid(-2|u|) is exactly 0, the formula gives exactly 1 / 0; the
    # select also avoids 0 * inf once v**2 overflows
    big = 1.0 if v > 0.0 else 0.0
    return big if abs(v) >= 1e10 else d


@_inl
def _f_silu(v):
    return v * _sigmoid(v)


@_inl
def _d_silu(v):
    # sigmoid'(v) = sigmoid(v) sigmoid(-v): no cancellation in 1 - sigmoid(v)
    return _sigmoid(v) * (1.0 + v * _sigmoid(-v))


@_inl
def _f_sigmoid(v):
    return _sigmoid(v)


@_inl
def _d_sigmoid(v):
    return _sigmoid(v) * _sigmoid(-v)


@_inl
def _f_tanh(v):
    return tanh_inline(v)


@_inl
def _d_tanh(v):
    # sech^2 = 4e / (1 + e)^2 with e = exp(-2|x|) <= 1: no cancellation, no
    # overflow; gradually 0 in the tails (e underflows beyond |x| ~ 372)
    e = exp_inline(-2.0 * abs(v))
    t = 1.0 + e
    return (4.0 * e) / (t * t)


@_inl
def _f_softplus(v):
    return softplus_inline(v)


@_inl
def _d_softplus(v):
    return _sigmoid(v)


@_inl
def _f_elu(v):
    return v if v > 0.0 else expm1_inline(v)


@_inl
def _d_elu(v):
    return 1.0 if v > 0.0 else exp_inline(v)


# the same functions with libm's ``*_fast_inline`` (FMA for the exact product errors, the
# same bits: see libm): TANH and ELU everywhere; the others for chunks whose every |x| is
# within ``_FAST_BOUNDS`` (where those give the plain bits), the rest by the plain ones
@_inl
def _f_tanh_fast(v):
    return tanh_fast_inline(v)


@_inl
def _f_elu_fast(v):
    return v if v > 0.0 else expm1_fast_inline(v)


@_inl
def _ff_gelu_tanh(v):
    u = _GELU_TANH_C * (v + _GELU_TANH_A * v * v * v)
    return v * sigmoid_fast_inline(2.0 * u)


@_inl
def _df_gelu_tanh(v):
    u = _GELU_TANH_C * (v + _GELU_TANH_A * v * v * v)
    du = _GELU_TANH_C * (1.0 + 3.0 * _GELU_TANH_A * v * v)
    sp = sigmoid_fast_inline(2.0 * u)
    sm = sigmoid_fast_inline(-2.0 * u)
    return sp + 2.0 * v * (sp * sm) * du       # |v| <= 19: not the 1e10 branch


@_inl
def _ff_silu(v):
    return v * sigmoid_fast_inline(v)


@_inl
def _df_silu(v):
    return sigmoid_fast_inline(v) * (1.0 + v * sigmoid_fast_inline(-v))


@_inl
def _ff_sigmoid(v):
    return sigmoid_fast_inline(v)


@_inl
def _df_sigmoid(v):
    return sigmoid_fast_inline(v) * sigmoid_fast_inline(-v)


@_inl
def _ff_softplus(v):
    return softplus_fast_inline(v)


@_inl
def _df_softplus(v):
    return sigmoid_fast_inline(v)


# |x| bounds of the fast forms: GELU_TANH's sigmoid argument 2u is within 600 for |x| <= 19
_FAST_BOUNDS = {"gelu_tanh": (19.0, 19.0), "silu": (SIGMOID_FAST_BOUND, SIGMOID_FAST_BOUND),
                "sigmoid": (SIGMOID_FAST_BOUND, SIGMOID_FAST_BOUND),
                "softplus": (SOFTPLUS_FAST_BOUND, SIGMOID_FAST_BOUND)}


# parameterised (LEAKY_RELU negative_slope, ELU alpha, SOFTPLUS beta)
@_inl
def _pf_leaky_relu(p, v):
    return v if v > 0.0 else p * v


@_inl
def _pd_leaky_relu(p, v):
    return 1.0 if v > 0.0 else p


@_inl
def _pf_elu(p, v):
    return v if v > 0.0 else p * expm1_fast_inline(v)


@_inl
def _pd_elu(p, v):
    return 1.0 if v > 0.0 else p * exp_inline(v)


@_inl
def _pf_softplus(p, v):
    # max(v, 0) + log1p(exp(-|p v|)) / p: finite even when p v overflows
    return max(v, 0.0) + log1p_inline(exp_inline(-abs(p * v))) / p


@_inl
def _pd_softplus(p, v):
    return _sigmoid(p * v)


# --------------------------------------------------------------------------- kernel templates
# One kernel per activation (and per entry point): each compiles only its own element
# function.  The templates below are cloned (``_clone``) with their own globals ``_F`` /
# ``_D`` / ``_FD`` / ``_PF`` / ``_PD`` / ``_PDEF`` / ``_FDEF``; each clone has its own name
# and so its own on-disk cache entry (as the serial twins do).  Every kernel reads each
# element once: the finiteness count (an integer reduction, which vectorises) and f are
# computed in the same loop.  Chunks of ``_CHUNK`` elements in parallel; every element is
# independent, so the results do not depend on the thread count or the chunking.
# Each activation's loop is a serial helper over a span of elements, one flat loop (the
# finiteness count and f): the serial entries call it on the whole array from Python, and
# the parallel kernel is a thin ``prange`` over chunks that calls the same helper on each
# chunk, so the loop is compiled once (not again inside a parallel twin and a serial
# twin).  Both give the same bits.  A flat loop, not chunks of the span nested in a loop
# over them: with 16 vector registers (AVX2) LLVM kept fewer of the polynomial constants
# in registers in the nested form (GELU 5.6 vs 4.9 ns per element and thread); and the
# loop is not a separate compiled helper either, which Numba would compile again inside
# every caller (a cold first use of three activations took 13 s with the nested loops,
# 21 s with a chunk helper under the span).
def _span_template(xs, os):
    """os = _F(xs) (the forward or the derivative); returns the non-finite inputs."""
    _wide()
    nb = 0
    for i in range(xs.shape[0]):
        v = xs[i]
        nb += not (abs(v) < _INF)
        os[i] = _F(v)
    return nb


def _fwd_der_span_template(xs, os, ds):
    _wide()
    nb = 0
    for i in range(xs.shape[0]):
        v = xs[i]
        nb += not (abs(v) < _INF)
        f, d = _FD(v)
        os[i] = f
        ds[i] = d
    return nb


# The fast forms (libm's ``*_fast_inline``) give the plain bits for |x| <= _BOUND: the
# span is evaluated by them, the elements beyond the bound (NaN and inf among them)
# counted in the same loop, and a span that has any is evaluated again by the plain forms,
# counting the non-finite inputs (a span without any has none: every |x| <= _BOUND).  The
# parallel kernel's spans are its chunks, so the plain forms rerun only chunks that need
# them; a serial call (a small array) reruns the whole array.
def _fast_span_template(xs, os):
    _wide()
    ns = 0
    for i in range(xs.shape[0]):
        v = xs[i]
        ns += not (abs(v) <= _BOUND)
        os[i] = _FF(v)
    nb = 0
    if ns != 0:
        for i in range(xs.shape[0]):
            v = xs[i]
            nb += not (abs(v) < _INF)
            os[i] = _F(v)
    return nb


def _fwd_der_fast_span_template(xs, os, ds):
    _wide()
    ns = 0
    for i in range(xs.shape[0]):
        v = xs[i]
        ns += not (abs(v) <= _BOUND)
        f, d = _FDF(v)
        os[i] = f
        ds[i] = d
    nb = 0
    if ns != 0:
        for i in range(xs.shape[0]):
            v = xs[i]
            nb += not (abs(v) < _INF)
            f, d = _FD(v)
            os[i] = f
            ds[i] = d
    return nb


def _drive2_template(x_flat, out_flat, bad, c0, c1):
    """Chunks ``c0 .. c1-1`` of ``_CHUNK`` elements: ``bad[c]`` = the chunk's non-finite
    inputs.  A span kernel (:func:`._jit.span_kernel`): the serial and the parallel
    schedule run this same compiled body."""
    n = x_flat.shape[0]
    for c in range(c0, c1):
        lo = c * _CHUNK
        hi = min(lo + _CHUNK, n)
        _wide()
        bad[c] = _SPAN(x_flat[lo:hi], out_flat[lo:hi])


def _drive3_template(x_flat, out_flat, d_flat, bad, c0, c1):
    """As :func:`_drive2_template`, with the derivative written to ``d_flat``."""
    n = x_flat.shape[0]
    for c in range(c0, c1):
        lo = c * _CHUNK
        hi = min(lo + _CHUNK, n)
        _wide()
        bad[c] = _SPAN(x_flat[lo:hi], out_flat[lo:hi], d_flat[lo:hi])


def _chunks(x_flat):
    """A zeroed per-chunk count array for the span kernels above."""
    return np.zeros((x_flat.shape[0] + _CHUNK - 1) // _CHUNK, dtype=np.int64)


def _pfwd_template(p, x_flat, out_flat):
    n = x_flat.shape[0]
    nchunks = (n + _CHUNK - 1) // _CHUNK
    st = np.zeros(nchunks, dtype=np.int64)
    for c in prange(nchunks):
        lo = c * _CHUNK
        hi = min(lo + _CHUNK, n)
        _wide()
        st[c] = _pfwd_span(p, x_flat[lo:hi], out_flat[lo:hi])
    return _first(st)


def _pder_template(p, x_flat, out_flat):
    n = x_flat.shape[0]
    nchunks = (n + _CHUNK - 1) // _CHUNK
    st = np.zeros(nchunks, dtype=np.int64)
    for c in prange(nchunks):
        lo = c * _CHUNK
        hi = min(lo + _CHUNK, n)
        _wide()
        st[c] = _pder_span(p, x_flat[lo:hi], out_flat[lo:hi])
    return _first(st)


def _pfwd_der_template(p, x_flat, out_flat, d_flat):
    n = x_flat.shape[0]
    nchunks = (n + _CHUNK - 1) // _CHUNK
    st = np.zeros(nchunks, dtype=np.int64)
    for c in prange(nchunks):
        lo = c * _CHUNK
        hi = min(lo + _CHUNK, n)
        _wide()
        xs = x_flat[lo:hi]
        a = _pfwd_span(p, xs, out_flat[lo:hi])
        b = _pder_span(p, xs, d_flat[lo:hi])
        st[c] = a if a != OK else b
    return _first(st)


def _pfwd_span_template(p, xs, os):
    """Status of one chunk: NONFINITE_INPUT if an input is not finite, else OVERFLOW if
    an output is not, else OK.  ``p == _PDEF`` (the default parameter) runs the
    unparameterised ``_FDEF`` (the same bits, documented)."""
    nb = 0
    no = 0
    if p == _PDEF:
        for i in range(xs.shape[0]):
            v = xs[i]
            nb += not (abs(v) < _INF)
            r = _FDEF(v)
            no += not (abs(r) < _INF)
            os[i] = r
    else:
        for i in range(xs.shape[0]):
            v = xs[i]
            nb += not (abs(v) < _INF)
            r = _PF(p, v)
            no += not (abs(r) < _INF)
            os[i] = r
    return NONFINITE_INPUT if nb != 0 else (OVERFLOW if no != 0 else OK)


def _pder_span_template(p, xs, os):
    nb = 0
    no = 0
    for i in range(xs.shape[0]):
        v = xs[i]
        nb += not (abs(v) < _INF)
        r = _PD(p, v)
        no += not (abs(r) < _INF)
        os[i] = r
    return NONFINITE_INPUT if nb != 0 else (OVERFLOW if no != 0 else OK)


@helper
def _none(bad):
    """True iff no chunk counted a non-finite input."""
    for c in range(bad.shape[0]):
        if bad[c] != 0:
            return False
    return True


@helper
def _first(st):
    """The first non-OK status of the chunks (OK when all are); chunks in order."""
    for c in range(st.shape[0]):
        if st[c] != OK:
            return st[c]
    return OK


def _clone(template, name, **names):
    """``template`` as a new Python function ``name`` whose globals add ``names``."""
    g = dict(globals())
    g.update(names)
    f = _pytypes.FunctionType(template.__code__, g, name, template.__defaults__,
                              template.__closure__)
    f.__qualname__ = name
    f.__doc__ = template.__doc__
    f.__module__ = __name__
    return f


_NAMES = {IDENTITY: "identity", RELU: "relu", LEAKY_RELU: "leaky_relu", GELU: "gelu",
          GELU_TANH: "gelu_tanh", SILU: "silu", SIGMOID: "sigmoid", TANH: "tanh",
          SOFTPLUS: "softplus", ELU: "elu"}
_FORWARD = {}
_DERIVATIVE = {}
_FORWARD_DERIVATIVE = {}
def _pair(name, f, d):
    """The inline ``v -> (f(v), d(v))``."""
    return _inl(_clone(lambda v: (_F(v), _D(v)), name, _F=f, _D=d))


_SPAN_FWD = {}
_SPAN_DER = {}
_SPAN_FWD_DER = {}


def _entries(code, name, fwd, der, fd):
    """Register the three span helpers of an activation and their thin parallel kernels."""
    _SPAN_FWD[code] = fwd
    _SPAN_DER[code] = der
    _SPAN_FWD_DER[code] = fd
    spans = span_kernel(iterations=lambda *args: args[-1].shape[0])
    _FORWARD[code] = spans(_clone(_drive2_template, "activation_forward_" + name,
                                  _SPAN=fwd))
    _DERIVATIVE[code] = spans(_clone(_drive2_template, "activation_derivative_" + name,
                                     _SPAN=der))
    _FORWARD_DERIVATIVE[code] = spans(_clone(
        _drive3_template, "activation_forward_derivative_" + name, _SPAN=fd))


for _code, _name in _NAMES.items():
    _f = globals()["_f_" + _name]
    _d = globals()["_d_" + _name]
    _fd = globals().get("_fd_" + _name) or _pair("_fd_" + _name, _f, _d)
    _fwd_f = globals().get("_f_%s_fast" % _name, _f)   # the same bits everywhere
    if _name in _FAST_BOUNDS:
        _ff = globals()["_ff_" + _name]
        _df = globals()["_df_" + _name]
        _bf, _bd = _FAST_BOUNDS[_name]
        _entries(_code, _name,
                 helper(_clone(_fast_span_template, "_fwd_span_" + _name, _F=_f, _FF=_ff,
                               _BOUND=_bf)),
                 helper(_clone(_fast_span_template, "_der_span_" + _name, _F=_d, _FF=_df,
                               _BOUND=_bd)),
                 helper(_clone(_fwd_der_fast_span_template, "_fwd_der_span_" + _name,
                               _FD=_fd, _FDF=_pair("_fdf_" + _name, _ff, _df),
                               _BOUND=min(_bf, _bd))))
    else:
        _fdd = _fd if _fwd_f is _f else _pair("_fdf_" + _name, _fwd_f, _d)
        _entries(_code, _name,
                 helper(_clone(_span_template, "_fwd_span_" + _name, _F=_fwd_f)),
                 helper(_clone(_span_template, "_der_span_" + _name, _F=_d)),
                 helper(_clone(_fwd_der_span_template, "_fwd_der_span_" + _name,
                               _FD=_fdd)))

_PARAM = {LEAKY_RELU: (_pf_leaky_relu, _pd_leaky_relu, np.nan, _f_identity),
          ELU: (_pf_elu, _pd_elu, np.nan, _f_identity),
          SOFTPLUS: (_pf_softplus, _pd_softplus, 1.0, _f_softplus)}
_FORWARD_PARAM = {}
_DERIVATIVE_PARAM = {}
_FORWARD_DERIVATIVE_PARAM = {}
for _code, (_pf, _pd, _pdef, _fdef) in _PARAM.items():
    _name = _NAMES[_code]
    _ps = _inl(_clone(_pfwd_span_template, "_pfwd_span_" + _name, _PF=_pf,
                        _PDEF=_pdef, _FDEF=_fdef))
    _pds = _inl(_clone(_pder_span_template, "_pder_span_" + _name, _PD=_pd))
    _FORWARD_PARAM[_code] = kernel(_clone(
        _pfwd_template, "activation_forward_param_" + _name, _pfwd_span=_ps))
    _DERIVATIVE_PARAM[_code] = kernel(_clone(
        _pder_template, "activation_derivative_param_" + _name, _pder_span=_pds))
    _FORWARD_DERIVATIVE_PARAM[_code] = kernel(_clone(
        _pfwd_der_template, "activation_forward_derivative_param_" + _name,
        _pfwd_span=_ps, _pder_span=_pds))
del _code, _name, _f, _d, _fd, _fwd_f, _ff, _df, _bf, _bd, _fdd, _pf, _pd, _pdef, _fdef
del _ps, _pds


@helper
def _inputs_finite(x_flat):
    return span_finite(x_flat, np.int64(0), x_flat.shape[0])   # not a literal 0: one compile


# --------------------------------------------------------------------------- public entries
def activation_forward(code, x_flat, out_flat):
    """``out_flat[i] = f_code(x_flat[i])``; True iff every input is finite (see module doc)."""
    if code not in _FORWARD:
        return bool(_inputs_finite(x_flat))
    bad = _chunks(x_flat)
    _FORWARD[code](x_flat, out_flat, bad)
    return bool(_none(bad))


def activation_derivative(code, x_flat, out_flat):
    """``out_flat[i] = f_code'(x_flat[i])``; True iff every input is finite (see module doc)."""
    if code not in _DERIVATIVE:
        return bool(_inputs_finite(x_flat))
    bad = _chunks(x_flat)
    _DERIVATIVE[code](x_flat, out_flat, bad)
    return bool(_none(bad))


def activation_forward_derivative(code, x_flat, out_flat, d_flat):
    """``out_flat[i] = f_code(x_flat[i])`` and ``d_flat[i] = f_code'(x_flat[i])`` in one
    pass (for autodiff: the backward pass then only multiplies).  Bitwise the results of
    :func:`activation_forward` and :func:`activation_derivative`; True iff every input is
    finite."""
    if code not in _FORWARD_DERIVATIVE:
        return bool(_inputs_finite(x_flat))
    bad = _chunks(x_flat)
    _FORWARD_DERIVATIVE[code](x_flat, out_flat, d_flat, bad)
    return bool(_none(bad))


def activation_forward_serial(code, x_flat, out_flat):
    """:func:`activation_forward` compiled without threads (the same bits)."""
    if code not in _FORWARD:
        return bool(_inputs_finite(x_flat))
    return _SPAN_FWD[code](x_flat, out_flat) == 0  # a count of non-finite inputs


def activation_derivative_serial(code, x_flat, out_flat):
    """:func:`activation_derivative` compiled without threads (the same bits)."""
    if code not in _DERIVATIVE:
        return bool(_inputs_finite(x_flat))
    return _SPAN_DER[code](x_flat, out_flat) == 0  # a count of non-finite inputs


def activation_forward_derivative_serial(code, x_flat, out_flat, d_flat):
    """:func:`activation_forward_derivative` compiled without threads (the same bits)."""
    if code not in _FORWARD_DERIVATIVE:
        return bool(_inputs_finite(x_flat))
    return _SPAN_FWD_DER[code](x_flat, out_flat, d_flat) == 0  # a count of non-finite inputs


def _param_call(table, fallback, serial, code, p, x_flat, *outs):
    if code in table:
        k = table[code]
        return int(k.serial(p, x_flat, *outs) if serial else k(p, x_flat, *outs))
    # any other code: the unparameterised kernel (finite inputs give finite outputs)
    return OK if fallback(code, x_flat, *outs) else NONFINITE_INPUT


def activation_forward_param(code, p, x_flat, out_flat):
    """``out_flat[i] = f_code(x_flat[i]; p)``; a Status code (see module doc)."""
    return _param_call(_FORWARD_PARAM, activation_forward, False, code, p, x_flat, out_flat)


def activation_derivative_param(code, p, x_flat, out_flat):
    """``out_flat[i] = f_code'(x_flat[i]; p)``; a Status code (see module doc)."""
    return _param_call(_DERIVATIVE_PARAM, activation_derivative, False, code, p, x_flat,
                       out_flat)


def activation_forward_derivative_param(code, p, x_flat, out_flat, d_flat):
    """Both :func:`activation_forward_param` and :func:`activation_derivative_param` in
    one launch (bitwise their results); the status is the worse of the two."""
    return _param_call(_FORWARD_DERIVATIVE_PARAM, activation_forward_derivative, False,
                       code, p, x_flat, out_flat, d_flat)


def activation_forward_param_serial(code, p, x_flat, out_flat):
    """:func:`activation_forward_param` compiled without threads (the same bits)."""
    return _param_call(_FORWARD_PARAM, activation_forward_serial, True, code, p, x_flat,
                       out_flat)


def activation_derivative_param_serial(code, p, x_flat, out_flat):
    """:func:`activation_derivative_param` compiled without threads (the same bits)."""
    return _param_call(_DERIVATIVE_PARAM, activation_derivative_serial, True, code, p,
                       x_flat, out_flat)


def activation_forward_derivative_param_serial(code, p, x_flat, out_flat, d_flat):
    """:func:`activation_forward_derivative_param` compiled without threads."""
    return _param_call(_FORWARD_DERIVATIVE_PARAM, activation_forward_derivative_serial,
                       True, code, p, x_flat, out_flat, d_flat)


@span_kernel(iterations=lambda x_flat, u_flat, p, scale, out_flat, ok: ok.shape[0],
             work=lambda x_flat, u_flat, p, scale, out_flat, ok: x_flat.shape[0])
def _dropout_span(x_flat, u_flat, p, scale, out_flat, ok, c0, c1):
    """Chunks ``c0 .. c1-1`` (``_CHUNK`` elements each) of :func:`dropout_train`;
    ``ok[c]``: whether chunk ``c``'s outputs are all finite."""
    n = x_flat.shape[0]
    for c in range(c0, c1):
        start = c * _CHUNK
        stop = min(n, start + _CHUNK)
        for i in range(start, stop):
            m = scale if u_flat[i] >= p else 0.0
            u_flat[i] = m
            out_flat[i] = x_flat[i] * m
        ok[c] = span_finite(out_flat, start, stop)


def dropout_train(x_flat, u_flat, p, scale, out_flat):
    """Inverted dropout.  ``u_flat`` holds uniform draws in ``[0, 1)`` and is OVERWRITTEN
    with the mask: ``scale`` where ``u >= p`` (element kept), else ``0.0``;
    ``out_flat = x_flat * mask``.  True iff every output is finite.  A span kernel over
    chunks (one compiled body for both schedules; the size chooses)."""
    ok = np.ones(-(-x_flat.shape[0] // _CHUNK), dtype=np.bool_)
    _dropout_span(x_flat, u_flat, float(p), float(scale), out_flat, ok)
    return bool(ok.all())


@kernel
def apply_channel_mask(x_flat, channel_mask, inner, out_flat, mask_flat):
    """Spatial dropout: ``x_flat`` is ``[rows, inner]`` flattened; row ``r`` is multiplied
    by ``channel_mask[r]``; ``mask_flat`` receives the broadcast mask. True iff every
    output is finite."""
    rows = channel_mask.shape[0]
    ok = np.ones(rows, dtype=np.bool_)
    for r in prange(rows):
        m = channel_mask[r]
        base = r * inner
        for j in range(inner):
            out_flat[base + j] = x_flat[base + j] * m
            mask_flat[base + j] = m
        ok[r] = span_finite(out_flat, base, base + inner)
    for r in range(rows):
        if not ok[r]:
            return False
    return True


# calls under SERIAL_WORK elements run the serial twins (same functions compiled without
# threads, the same bits): see _jit.py, "Serial or parallel: the one policy"
from ..config import SERIAL_WORK  # noqa: E402  (HMATH_DL_SERIAL_WORK)


def _small(n):
    """Whether a call of ``n`` elements runs the serial twin: below ``SERIAL_WORK``, unless
    :func:`._jit.forced_schedule` says otherwise (the package's one policy)."""
    return runs_serial(n < SERIAL_WORK)


def sized_forward(n):
    """``activation_forward`` or its serial twin for ``n`` elements."""
    return activation_forward_serial if _small(n) else activation_forward


def sized_derivative(n):
    """``activation_derivative`` or its serial twin for ``n`` elements."""
    return activation_derivative_serial if _small(n) else activation_derivative


def sized_forward_derivative(n):
    """``activation_forward_derivative`` or its serial twin for ``n`` elements."""
    return (activation_forward_derivative_serial if _small(n)
            else activation_forward_derivative)


def sized_forward_param(n):
    """``activation_forward_param`` or its serial twin for ``n`` elements."""
    return activation_forward_param_serial if _small(n) else activation_forward_param


def sized_derivative_param(n):
    """``activation_derivative_param`` or its serial twin for ``n`` elements."""
    return activation_derivative_param_serial if _small(n) else activation_derivative_param


def sized_forward_derivative_param(n):
    """``activation_forward_derivative_param`` or its serial twin for ``n`` elements."""
    return (activation_forward_derivative_param_serial if _small(n)
            else activation_forward_derivative_param)
