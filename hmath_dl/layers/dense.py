"""Fully connected layer: ``dense(x, weights, bias) = x @ weights.T + bias``."""

from __future__ import annotations

from .. import _checks
from .._kernels.gemm_f64 import gemm
from ..errors import ShapeError

__all__ = ["dense"]


def dense(x, weights, bias):
    """Affine map ``y = x @ weights.T + bias``.

    Parameters
    ----------
    x : array_like, shape ``[B, in]`` (or ``[..., B, in]``)
        Inputs, one row per example.  Leading batch axes are accepted as an extension
        of the contract (``[..., in]`` with at least 2 axes); the map acts on the last
        axis.  A 1-D ``x`` is rejected (``ShapeError``).
    weights : array_like, shape ``[out, in]``
    bias : array_like of length ``out``, or None (no bias)

    Returns
    -------
    ndarray, shape ``x.shape[:-1] + (out,)``
        ``y[..., o] = sum_i x[..., i] * weights[o, i] + bias[o]``.

    Notes
    -----
    Order: each output is one fused-multiply-add chain over the inputs ``i = 0 .. in-1``
    in order, from ``0.0`` (the library's own GEMM, ``hmath_dl._kernels.gemm_f64``; no
    BLAS), then ``+ bias[o]``: the same bits on every CPU and for any thread count.

    Raises
    ------
    ShapeError
        ``x`` has fewer than 2 axes, ``weights`` is not 2-D, the ``in`` sizes differ, or
        ``bias`` does not have length ``out``.
    NonFiniteError
        NaN/inf in ``x``, ``weights`` or ``bias``.
    NumericOverflow
        a result is not finite.
    """
    fname = "dense"
    # Finiteness of the inputs is not pre-scanned: a NaN/inf in x, weights or bias always
    # makes some output non-finite (inf * 0 = NaN, NaN propagates), so one check of the
    # (smaller) output suffices; only then are the inputs scanned to name the culprit.
    xa = _checks.tensor(fname, "x", x, min_ndim=2, finite=False)
    w = _checks.tensor(fname, "weights", weights, ndim=2, finite=False)
    if xa.shape[-1] != w.shape[1]:
        raise ShapeError(
            f"{fname}: x has {xa.shape[-1]} input features, weights expect {w.shape[1]} "
            f"(got x {_checks.shape_str(xa.shape)}, weights {_checks.shape_str(w.shape)})")
    b = None
    if bias is not None:
        b = _checks.vector(fname, "bias", bias, w.shape[0], finite=False)
    out = _checks.alloc(fname, xa.shape[:-1] + (w.shape[0],))
    if out.size == 0:
        _checks.require_finite(fname, "x", xa)
        _checks.require_finite(fname, "weights", w)
        if b is not None:
            _checks.require_finite(fname, "bias", b)
        return out
    # rows of every leading axis at once, into out; the GEMM adds the bias to each
    # finished chain and counts the non-finite results as it writes them (a NaN/inf
    # anywhere in x, weights or bias makes some output non-finite)
    rows = out.size // w.shape[0]
    _, nonfinite = gemm(xa.reshape(rows, xa.shape[-1]), w.T, bias=b, bias_axis=1,
                        out=out.reshape(rows, w.shape[0]))
    finite = nonfinite == 0
    inputs = (("x", xa), ("weights", w)) + ((("bias", b),) if b is not None else ())
    return _checks.finish(fname, finite, out=out, inputs=inputs,
                          overflow="result is not finite (x @ weights.T + bias overflowed)")
