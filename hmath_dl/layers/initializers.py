"""Weight initialisers (the ``Initializer`` union) and ``initialize_weights``.

Every draw comes from ``rng.generator()`` (numpy's Philox stream) and the advanced RNG is
returned; the RNG passed in is never changed, so the same RNG gives the same weights.

The fans are explicit arguments of ``initialize_weights``; ``fans(shape, layout)``, a
helper of this module (not part of the contract), computes them from a weight's shape and
layout.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Union

import numpy as np

from .. import _checks
from .._kernels import libm
from .._kernels.qr import orthonormal_factor
from .._kernels.softmax import apply as libm_apply
from ..errors import DomainError, ShapeError
from ..rng import RNG

__all__ = ["XavierUniform", "XavierNormal", "KaimingUniform", "KaimingNormal", "Orthogonal",
           "TruncatedNormal", "Initializer", "initialize_weights"]


# The four fan-based initialisers are named instances of one variance-scaling rule
# (as JAX's ``variance_scaling(scale, mode, distribution)``): with ``fan`` = fan_in
# ("fan_in") or (fan_in + fan_out) / 2 ("fan_avg"), "uniform" draws U(-a, a) with
# a = sqrt(3 * scale / fan) and "normal" draws sqrt(scale / fan) * N(0, 1).  For the
# scales used here every step is exact or one rounding of the seed's formula (halving and
# doubling are exact in binary), so a = sqrt(6 / (fan_in + fan_out)) bit for bit, etc.
@dataclass(frozen=True)
class XavierUniform:
    """``U(-a, a)`` with ``a = sqrt(6 / (fan_in + fan_out))`` (variance scaling: scale 1,
    fan_avg, uniform)."""

    _rule = (1.0, "fan_avg", "uniform")


@dataclass(frozen=True)
class XavierNormal:
    """``N(0, std**2)`` with ``std = sqrt(2 / (fan_in + fan_out))`` (variance scaling:
    scale 1, fan_avg, normal)."""

    _rule = (1.0, "fan_avg", "normal")


@dataclass(frozen=True)
class KaimingUniform:
    """``U(-b, b)`` with ``b = sqrt(6 / fan_in)`` (variance scaling: scale 2, fan_in,
    uniform)."""

    _rule = (2.0, "fan_in", "uniform")


@dataclass(frozen=True)
class KaimingNormal:
    """``N(0, std**2)`` with ``std = sqrt(2 / fan_in)`` (variance scaling: scale 2, fan_in,
    normal)."""

    _rule = (2.0, "fan_in", "normal")


@dataclass(frozen=True)
class Orthogonal:
    """A (semi-)orthogonal matrix times ``gain`` (finite, DomainError otherwise).

    The shape is flattened to ``[shape[0], prod(shape[1:])]``; see
    :func:`initialize_weights`.
    """

    gain: float = 1.0

    def __post_init__(self):
        object.__setattr__(self, "gain", _checks.real("Orthogonal", "gain", self.gain))


@dataclass(frozen=True)
class TruncatedNormal:
    """``N(mean, sigma**2)`` conditioned on ``|x - mean| <= cutoff * sigma``.

    ``mean`` finite, ``sigma > 0``, ``cutoff > 0`` (all finite; DomainError otherwise).
    """

    mean: float
    sigma: float
    cutoff: float

    def __post_init__(self):
        object.__setattr__(self, "mean", _checks.real("TruncatedNormal", "mean", self.mean))
        object.__setattr__(self, "sigma",
                           _checks.real("TruncatedNormal", "sigma", self.sigma, positive=True))
        object.__setattr__(self, "cutoff",
                           _checks.real("TruncatedNormal", "cutoff", self.cutoff, positive=True))


Initializer = Union[XavierUniform, XavierNormal, KaimingUniform, KaimingNormal, Orthogonal,
                    TruncatedNormal]
_KINDS = (XavierUniform, XavierNormal, KaimingUniform, KaimingNormal, Orthogonal,
          TruncatedNormal)


def _variance_scaling(gen, rule, fan_in, fan_out, shape):
    """Draws of the variance-scaling ``rule = (scale, mode, distribution)``."""
    scale, mode, distribution = rule
    fan = fan_in if mode == "fan_in" else (fan_in + fan_out) / 2.0
    if distribution == "uniform":
        a = math.sqrt(3.0 * scale / fan)
        return gen.uniform(-a, a, shape)
    return math.sqrt(scale / fan) * gen.standard_normal(shape)


def _orthogonal(fname, gen, gain, shp):
    """``gain`` times a (semi-)orthogonal matrix of ``shp`` (see initialize_weights)."""
    if len(shp) < 2:
        raise DomainError(f"{fname}: Orthogonal needs a shape with at least 2 axes "
                          f"(got {shp!r})")
    rows = shp[0]
    cols = 1
    for s in shp[1:]:
        cols *= s
    if rows < 1 or cols < 1:
        raise DomainError(f"{fname}: Orthogonal needs a positive matrix shape "
                          f"(got {shp!r}, flattened to [{rows}, {cols}])")
    tall = rows >= cols
    a = gen.standard_normal((rows, cols) if tall else (cols, rows))
    # the library's own Householder QR (fixed order, no LAPACK): qt = Q^T with the signs
    # of diag(R) folded in
    qt = np.empty((a.shape[1], a.shape[0]))
    orthonormal_factor(np.ascontiguousarray(a.T), qt)
    return gain * (qt.T if tall else qt)


def _truncated_standard(gen, count, c):
    """``count`` standard normals conditioned on ``|z| <= c`` by exact rejection sampling.

    ``c <= 2``: propose ``z ~ U(-c, c)`` (``gen.uniform``), accept iff
    ``gen.random() <= exp(-z**2 / 2)`` (acceptance >= 0.59);  ``c > 2``: propose
    ``z ~ N(0, 1)`` (``gen.standard_normal``), accept iff ``|z| <= c`` (acceptance
    >= 0.95).  Rejected entries are redrawn together, in index order, until none is left.
    """
    out = np.empty(count)
    todo = np.arange(count)
    while todo.size:
        k = todo.size
        if c <= 2.0:
            z = gen.uniform(-c, c, k)
            u = gen.random(k)
            ok = u <= libm_apply(libm.exp_array, -0.5 * z * z)   # the library's own exp
        else:
            z = gen.standard_normal(k)
            ok = np.abs(z) <= c
        out[todo[ok]] = z[ok]
        todo = todo[~ok]
    return out


def fans(shape, layout=None):
    """``(fan_in, fan_out)`` of a weight of ``shape``, for :func:`initialize_weights`.

    ``layout`` names the axes, one letter each: ``"O"`` the outputs (features or
    channels), ``"I"`` the inputs, any other letter a kernel (receptive-field) axis.  With
    ``r`` the product of the kernel extents (1 without any): ``fan_in = shape[I] * r`` and
    ``fan_out = shape[O] * r``.  ``None`` is the library's layout ``[out, in, *kernel]``:
    ``"OI"`` for a dense weight ``[out, in]``, ``"OIW"`` / ``"OIHW"`` / ``"OIDHW"`` for a
    convolution weight ``[Cout, Cin/groups, *K]`` (so ``fan_in = Cin/groups * prod(K)``; a
    depthwise weight ``[Cin*m, 1, *K]`` alike).  A transposed convolution weight
    ``[Cin, Cout/groups, *K]`` is ``"IOW"`` / ``"IOHW"`` / ``"IODHW"`` (PyTorch reads it
    as ``"OIHW"``, giving ``fan_in = Cout/groups * prod(K)``), a JAX/TensorFlow kernel
    ``"HWIO"``.

    Parameters
    ----------
    shape : tuple of int
        At least 2 extents, each ``>= 1``.
    layout : str, optional
        ``len(shape)`` letters with exactly one ``"O"`` and one ``"I"``.

    Returns
    -------
    (int, int)
        ``(fan_in, fan_out)``.

    Raises
    ------
    TypeError
        ``shape`` not ints, ``layout`` not a str.
    DomainError
        Fewer than 2 extents, an extent below 1, or ``layout`` without exactly one ``"O"``
        and one ``"I"``.
    ShapeError
        ``layout`` does not have one letter per axis of ``shape``.
    """
    fname = "fans"
    shp = _checks.shape_tuple(fname, "shape", shape, min_len=2, min=1)
    if layout is None:
        o, i = 0, 1
    else:
        _checks.instance(fname, "layout", layout, str, "a str")
        if len(layout) != len(shp):
            raise ShapeError(f"{fname}: layout {layout!r} names {len(layout)} axes, shape "
                             f"{shp!r} has {len(shp)}")
        if layout.count("O") != 1 or layout.count("I") != 1:
            raise DomainError(f"{fname}: layout must name one output axis 'O' and one input "
                              f"axis 'I' (got {layout!r})")
        o, i = layout.index("O"), layout.index("I")
    r = 1
    for a, n in enumerate(shp):
        if a not in (o, i):
            r *= n
    return shp[i] * r, shp[o] * r


def initialize_weights(init, fan_in, fan_out, shape, rng):
    """Draw an initial weight tensor.

    Parameters
    ----------
    init : Initializer
        One of XavierUniform(), XavierNormal(), KaimingUniform(), KaimingNormal(),
        Orthogonal(gain), TruncatedNormal(mean, sigma, cutoff).
    fan_in, fan_out : int
        Positive (DomainError), checked for every initialiser
        (``hmath_dl.layers.initializers.fans`` computes them from a weight shape and layout).
    shape : tuple of int
        Non-negative extents (an int means a 1-D shape).
    rng : RNG

    Returns
    -------
    (weights, rng)
        A new float64 array of ``shape`` and the advanced RNG.  Draws (row-major, from
        ``g = rng.generator()``):

        * XavierUniform: ``g.uniform(-a, a, shape)``, ``a = sqrt(6 / (fan_in + fan_out))``
        * XavierNormal: ``std * g.standard_normal(shape)``, ``std = sqrt(2 / (fan_in + fan_out))``
        * KaimingUniform: ``g.uniform(-b, b, shape)``, ``b = sqrt(6 / fan_in)``
        * KaimingNormal: ``std * g.standard_normal(shape)``, ``std = sqrt(2 / fan_in)``
        * Orthogonal(gain): ``R = shape[0]``, ``K = prod(shape[1:])`` (both >= 1 and
          ``len(shape) >= 2``, DomainError otherwise); ``A = g.standard_normal((R, K))``
          if ``R >= K`` else of shape ``(K, R)``; ``Q, Rm`` its thin QR by Householder
          reflections in a fixed order (``hmath_dl._kernels.qr``, LAPACK's sign choice;
          no LAPACK, so the same bits on every CPU); ``Q *= sign(diag(Rm))`` (a zero
          diagonal counts as +1); transposed back when ``R < K``; times ``gain``.  Rows
          (R <= K) or columns (R >= K) are orthonormal.
        * TruncatedNormal(mean, sigma, cutoff): ``mean + sigma * z`` with ``z`` standard
          normal conditioned on ``|z| <= cutoff``, by exact rejection sampling (uniform
          proposal with acceptance ``exp(-z**2/2)`` when ``cutoff <= 2``, normal proposal
          otherwise; rejected entries redrawn in rounds).

    Raises
    ------
    TypeError
        ``init`` not an initialiser, ``rng`` not an RNG, non-int fans/shape.
    DomainError
        non-positive fans, negative extents, an unusable Orthogonal shape.
    NumericOverflow
        ``mean + sigma * z`` not finite.
    """
    fname = "initialize_weights"
    _checks.instance(fname, "init", init, _KINDS)
    fi = _checks.integer(fname, "fan_in", fan_in, min=1)
    fo = _checks.integer(fname, "fan_out", fan_out, min=1)
    shp = _checks.shape_tuple(fname, "shape", shape, min=0)
    _checks.instance(fname, "rng", rng, RNG, "an RNG")
    _checks.check_size(fname, shp)
    gen = rng.generator()
    if hasattr(init, "_rule"):
        w = _variance_scaling(gen, init._rule, fi, fo, shp)
    elif isinstance(init, Orthogonal):
        w = _orthogonal(fname, gen, init.gain, shp)
    else:  # TruncatedNormal
        count = 1
        for s in shp:
            count *= s
        z = _truncated_standard(gen, count, init.cutoff)
        with np.errstate(over="ignore", invalid="ignore"):
            w = init.mean + init.sigma * z
        _checks.finish(fname, bool(np.isfinite(w).all()), overflow=lambda u, code: (
            f"mean + sigma * z is not finite (mean {init.mean!r}, sigma {init.sigma!r})"))
    out = np.asarray(w, dtype=np.float64, order="C").reshape(shp)
    return out, rng.advanced(gen)
