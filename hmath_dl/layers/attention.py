"""Attention and positions: scaled dot-product attention, multi-head attention, causal
masks, rotary embeddings, sinusoidal encodings and ALiBi biases.

Layout is ``sequence, feature`` with optional leading batch axes (``..., sequence,
feature``) that must be identical between ``q``, ``k`` and ``v``.  A mask is a boolean
array where True means "this key may be attended to".

Positions and offsets are non-negative ints: ``offset`` is the number of cached positions
that precede the first query (a prefix length), so negative offsets are rejected.
"""

from __future__ import annotations

import numpy as np

from .. import _checks
from .._kernels import libm
from .._kernels.attention import attention_forward, rotary_forward
from .._kernels.softmax import apply as libm_apply
from .._kernels.status import SCORE_OVERFLOW
from ..errors import DomainError, ShapeError

__all__ = ["scaled_dot_product_attention", "multihead_attention", "causal_mask",
           "rotary_embedding", "sinusoidal_encoding", "alibi_bias"]

# Positions are converted to float64; beyond 2**53 they would no longer be exact.
_MAX_POSITION = 2 ** 53

_NO_MASK = np.ones((0, 0, 0), dtype=np.bool_)
_NO_BIAS = np.zeros((0, 0, 0), dtype=np.float64)


def _prod(shape) -> int:
    out = 1
    for s in shape:
        out *= int(s)
    return out


def _qkv(fname, q, k, v, gqa=False):
    """Validate q [..., N, D], k [..., M, D], v [..., M, F]; returns ``(q, k, v, groups)``.

    With ``gqa`` q is ``[..., Hq, N, D]`` and k, v are ``[..., Hk, M, *]`` with ``Hq % Hk ==
    0``; ``groups = Hq // Hk`` query heads share one key/value head (1 without gqa)."""
    q = _checks.tensor(fname, "q", q, min_ndim=3 if gqa else 2)
    k = _checks.tensor(fname, "k", k, min_ndim=3 if gqa else 2)
    v = _checks.tensor(fname, "v", v, min_ndim=3 if gqa else 2)
    lead = q.shape[:-2]
    groups = 1
    if gqa and k.ndim == q.ndim and v.ndim == q.ndim:
        hq, hk, hv = q.shape[-3], k.shape[-3], v.shape[-3]
        if hk != hv or hk == 0 or hq % hk:
            raise ShapeError(
                f"{fname}: with enable_gqa the query heads must be a multiple of the key/value "
                f"heads (got q {_checks.shape_str(q.shape)}, k {_checks.shape_str(k.shape)}, "
                f"v {_checks.shape_str(v.shape)}: Hq {hq}, Hk {hk}, Hv {hv})")
        groups = hq // hk
        kv_lead = lead[:-1] + (hk,)
    else:
        kv_lead = lead
    if k.ndim != q.ndim or k.shape[:-2] != kv_lead or v.ndim != q.ndim or v.shape[:-2] != kv_lead:
        raise ShapeError(
            f"{fname}: q, k and v must have the same leading batch axes (got q "
            f"{_checks.shape_str(q.shape)}, k {_checks.shape_str(k.shape)}, v "
            f"{_checks.shape_str(v.shape)})")
    if k.shape[-1] != q.shape[-1]:
        raise ShapeError(
            f"{fname}: q and k must have the same feature size D (got q "
            f"{_checks.shape_str(q.shape)}, k {_checks.shape_str(k.shape)})")
    if v.shape[-2] != k.shape[-2]:
        raise ShapeError(
            f"{fname}: k and v must have the same number of keys M (got k "
            f"{_checks.shape_str(k.shape)}, v {_checks.shape_str(v.shape)})")
    if q.shape[-1] == 0:
        raise ShapeError(
            f"{fname}: q and k must have at least one feature (got D = 0, q "
            f"{_checks.shape_str(q.shape)}; the scale 1/sqrt(D) is undefined)")
    return q, k, v, groups


def _scale(fname, scale):
    """The explicit score scale (finite, non-zero), or 0.0 for the default ``1/sqrt(D)``
    (which the kernel applies as a division by ``sqrt(D)``)."""
    if scale is None:
        return 0.0
    value = _checks.real(fname, "scale", scale)
    if value == 0.0:
        raise DomainError(f"{fname}: scale must be non-zero (got {scale!r})")
    return value


def _mask(fname, mask, is_causal, n, m):
    """``mask`` after ``is_causal``: the causal mask ``causal_mask(N, M, 0)`` when asked for
    (a DomainError together with an explicit mask)."""
    if not _checks.boolean(fname, "is_causal", is_causal):
        return mask
    if mask is not None:
        raise DomainError(f"{fname}: is_causal=True and an explicit mask are exclusive "
                          f"(give one of them)")
    return np.arange(m)[None, :] <= np.arange(n)[:, None]


def _pairwise(fname, name, x, lead, n, m, convert):
    """A mask/bias ``[..., N, M]`` whose leading axes broadcast (numpy rules) against
    ``lead``, returned as ``[Bm, N, M]`` for the kernel, which gives flat batch ``b`` the
    entry ``b // (prod(lead) // Bm)``.  That indexing covers every mask that varies only
    over a prefix of ``lead`` (``[N, M]``, ``[1, N, M]``, ``[B, 1, N, M]``, the full shape)
    without a copy; any other broadcast (e.g. ``[H, N, M]`` against ``(B, H)``) is
    materialised."""
    a = convert(fname, name, x)
    want = _checks.shape_str(tuple(lead) + (n, m))
    if a.ndim < 2 or a.shape[-2:] != (n, m) or a.ndim > len(lead) + 2:
        raise ShapeError(f"{fname}: {name} must have shape [..., {n}, {m}] broadcastable to "
                         f"{want} (got {_checks.shape_str(a.shape)})")
    alead = (1,) * (len(lead) + 2 - a.ndim) + a.shape[:-2]
    for have, full in zip(alead, lead):
        if have not in (1, full):
            raise ShapeError(f"{fname}: {name} of shape {_checks.shape_str(a.shape)} does not "
                             f"broadcast to {want}")
    # the longest prefix of lead that the mask spans in full, then only ones
    k = 0
    while k < len(lead) and alead[k] == lead[k]:
        k += 1
    if all(x == 1 for x in alead[k:]):
        return np.ascontiguousarray(a).reshape(_prod(lead[:k]), n, m)
    full = np.broadcast_to(a.reshape(alead + (n, m)), tuple(lead) + (n, m))
    return np.ascontiguousarray(full).reshape(_prod(lead), n, m)


def _attention(fname, q, k, v, mask, bias, groups=1, scale=0.0):
    """Validated arrays in, (out, weights) out; raises on a bad kernel status."""
    lead = q.shape[:-2]
    n, d = q.shape[-2:]
    m, f = v.shape[-2:]
    b = _prod(lead)
    mk = _NO_MASK
    if mask is not None:
        mk = _pairwise(fname, "mask", mask, lead, n, m, _checks.bool_array)
    bs = _NO_BIAS
    if bias is not None:
        bs = _pairwise(fname, "bias", bias, lead, n, m,
                       lambda fn, nm, x: _checks.tensor(fn, nm, x))
    out = _checks.alloc(fname, lead + (n, f))
    weights = _checks.alloc(fname, lead + (n, m))
    if b * n == 0:
        return out, weights
    status, row = attention_forward(q.reshape(b, n, d), k.reshape(b // groups, m, d),
                                    v.reshape(b // groups, m, f), mk, bs,
                                    out.reshape(b, n, f), weights.reshape(b, n, m),
                                    groups, scale)
    _checks.finish(fname, (status, row), overflow=lambda r, code: _row_overflow(lead, n, r, code))
    return out, weights


def _row_overflow(lead, n, row, code):
    where = tuple(int(i) for i in np.unravel_index(int(row), tuple(lead) + (n,)))
    if code == SCORE_OVERFLOW:
        return (f"an attention score of query row {where} is not finite "
                f"(q k^T * scale + bias overflowed float64)")
    return f"the output of query row {where} is not finite (weights @ v overflowed float64)"


def scaled_dot_product_attention(q, k, v, mask=None, bias=None, *, scale=None, is_causal=False,
                                 enable_gqa=False):
    """Scaled dot-product attention with explicit mask and additive bias.

    For every batch index and query row ``i``::

        s[i, j]   = (q[i] . k[j]) / sqrt(D) + bias[i, j]          (allowed keys j only)
                    (or (q[i] . k[j]) * scale + bias[i, j] with an explicit scale)
        w[i, j]   = exp(s[i, j] - max_j s[i, j]) / sum_j exp(s[i, j] - max_j s[i, j])
        out[i, f] = sum_j w[i, j] * v[j, f]

    The softmax runs over the allowed keys only (``mask[i, j]`` True); masked keys get
    weight exactly 0 and their scores are never evaluated.  A row without any allowed key
    gives exact zeros in both ``out`` and ``weights`` (PyTorch would give NaN).

    Parameters
    ----------
    q : array_like, shape ``[..., N, D]``, ``D >= 1``
    k : array_like, shape ``[..., M, D]``
    v : array_like, shape ``[..., M, F]``
        The leading batch axes of ``q``, ``k`` and ``v`` must be identical (except the
        head axis with ``enable_gqa``).  A leading axis of length 0 gives empty results.
    mask : array_like of bool, shape ``[..., N, M]``, optional
        True = allowed (integers 0/1 are accepted).  Its leading axes broadcast (numpy
        rules) against the output's, e.g. ``[N, M]`` or ``[1, N, M]`` for every batch
        index and head.  None allows every key.
    bias : array_like, shape ``[..., N, M]``, optional
        Finite additive score bias (exclude keys with the mask, not with ``-inf``);
        broadcasts like ``mask``.
    scale : float, optional (keyword-only)
        Finite, non-zero: scores are ``(q . k) * scale + bias``.  None (default):
        ``(q . k) / sqrt(D)``, a correctly rounded division (so ``scale=1/sqrt(D)`` can
        differ from the default in the last bit).
    is_causal : bool, default False (keyword-only)
        Use ``causal_mask(N, M, 0)`` (top-left aligned, as PyTorch); together with an
        explicit ``mask`` it raises ``DomainError``.
    enable_gqa : bool, default False (keyword-only)
        Grouped-query attention: ``q [..., Hq, N, D]``, ``k [..., Hk, M, D]``,
        ``v [..., Hk, M, F]`` with ``Hq % Hk == 0``; query head ``h`` attends with
        key/value head ``h // (Hq // Hk)`` (no copy of ``k``/``v`` is made).

    Returns
    -------
    out : ndarray, shape ``[..., N, F]``
    weights : ndarray, shape ``[..., N, M]`` (``[..., Hq, N, M]`` with ``enable_gqa``)
        Each row sums to 1 (up to rounding), or is all zeros for a fully masked row.

    Notes
    -----
    ``M == 0`` (no keys) makes every row fully masked: ``out`` is zeros.  ``N == 0`` gives
    empty outputs.  Large finite scores (``1e300``) are fine thanks to the max
    subtraction.  Each dot product is summed over the features in increasing order, the
    softmax denominator and ``out`` over the keys in increasing order; ``exp`` is a
    vectorised polynomial (at most 1 ulp from the correctly rounded value), so results are
    bitwise identical for every thread count.

    Raises
    ------
    ShapeError
        ranks or shapes that do not fit (including ``D == 0``, a mask/bias that does not
        broadcast, GQA head counts that do not divide).
    NonFiniteError
        NaN/inf in ``q``, ``k``, ``v`` or ``bias``.
    NumericOverflow
        an allowed score is not finite (``q . k`` overflowed float64), or an output is not
        finite.
    TypeError, DomainError
        a mask that is not boolean (or 0/1); ``scale`` zero or not finite; ``is_causal``
        with ``mask``.
    """
    fname = "scaled_dot_product_attention"
    sc = _scale(fname, scale)
    gqa = _checks.boolean(fname, "enable_gqa", enable_gqa)
    q, k, v, groups = _qkv(fname, q, k, v, gqa)
    mask = _mask(fname, mask, is_causal, q.shape[-2], k.shape[-2])
    return _attention(fname, q, k, v, mask, bias, groups, sc)


def multihead_attention(heads, q, k, v, mask=None, *, scale=None, is_causal=False):
    """Multi-head attention without projections.

    Head ``i`` (``0 <= i < heads``) is :func:`scaled_dot_product_attention` of the feature
    columns ``[i*D/h, (i+1)*D/h)`` of ``q`` and ``k`` (so its scale is ``1/sqrt(D/h)``) and
    ``[i*F/h, (i+1)*F/h)`` of ``v``, with the same ``mask`` for every head; the head outputs
    are concatenated along the features in head order.  Compose :func:`dense` for the
    input/output projections.

    Parameters
    ----------
    heads : int, ``>= 1``, dividing both ``D`` and ``F``
    q, k, v : array_like, shapes ``[..., N, D]``, ``[..., M, D]``, ``[..., M, F]``
    mask : array_like of bool, ``[..., N, M]``, optional (True = allowed)
        Leading axes broadcast against ``q``'s leading axes; shared by all heads.
    scale : float, optional (keyword-only)
        Finite, non-zero score scale for every head; None: ``/ sqrt(D/h)``.
    is_causal : bool, default False (keyword-only)
        ``causal_mask(N, M, 0)`` for every head; exclusive with ``mask``.

    Returns
    -------
    ndarray, shape ``[..., N, F]``

    Raises
    ------
    DomainError
        ``heads < 1``, or ``heads`` does not divide ``D`` or ``F``.
    ShapeError, NonFiniteError, NumericOverflow
        as for :func:`scaled_dot_product_attention`.
    """
    return _multihead("multihead_attention", heads, q, k, v, mask, scale, is_causal)[0]


def _multihead(fname, heads, q, k, v, mask, scale, is_causal):
    """``(out, weights)`` of :func:`multihead_attention`; ``weights [prod(...)*h, N, M]``
    are the per-head attention weights (for the differentiable twin)."""
    h = _checks.integer(fname, "heads", heads, min=1)
    sc = _scale(fname, scale)
    q, k, v, _ = _qkv(fname, q, k, v)
    mask = _mask(fname, mask, is_causal, q.shape[-2], k.shape[-2])
    d = q.shape[-1]
    f = v.shape[-1]
    if d % h != 0:
        raise DomainError(f"{fname}: heads must divide the q/k feature size D "
                          f"(got heads {h}, D {d})")
    if f % h != 0:
        raise DomainError(f"{fname}: heads must divide the v feature size F "
                          f"(got heads {h}, F {f})")
    lead = q.shape[:-2]
    n = q.shape[-2]
    m = k.shape[-2]
    b = _prod(lead)
    mk = _NO_MASK
    if mask is not None:
        # [1 or B, N, M]; batch b*h + head uses mask index (b*h + head) // (B*h / Bm)
        mk = _pairwise(fname, "mask", mask, lead, n, m, _checks.bool_array)
    out = _checks.alloc(fname, lead + (n, f))
    if b * n == 0:
        return out, _checks.alloc(fname, (b * h, n, m))
    weights = _checks.alloc(fname, (b * h, n, m))
    # the kernel reads each head's feature columns in place and writes its output columns
    # (heads=h): no split or merge copies
    status, row = attention_forward(q.reshape(b, n, d), k.reshape(b, m, d),
                                    v.reshape(b, m, f), mk, _NO_BIAS, out.reshape(b, n, f),
                                    weights, 1, sc, heads=h)
    _checks.finish(fname, (status, row),
                   overflow=lambda r, code: _head_overflow(lead, n, h, r, code))
    return out, weights


def _head_overflow(lead, n, h, row, code):
    bh, i = divmod(int(row), n)
    bi, head = divmod(bh, h)
    where = tuple(int(x) for x in np.unravel_index(bi, lead)) + (i,) if lead else (i,)
    what = "an attention score" if code == SCORE_OVERFLOW else "the output"
    return f"{what} of head {head}, query row {where} is not finite (float64 overflow)"


def causal_mask(queries, keys, offset):
    """Causal attention mask ``allowed[i, j] = j <= i + offset``.

    Parameters
    ----------
    queries, keys : int, ``>= 0``
        Numbers of query rows and key columns.
    offset : int, ``>= 0``
        Number of cached positions before the first query (query ``i`` sits at position
        ``offset + i`` and may see keys ``0 .. offset + i``).

    Returns
    -------
    ndarray of bool, shape ``[queries, keys]``

    Raises
    ------
    DomainError
        a negative argument.  TypeError: a non-integer argument.
    """
    fname = "causal_mask"
    nq = _checks.integer(fname, "queries", queries, min=0)
    nk = _checks.integer(fname, "keys", keys, min=0)
    off = _checks.integer(fname, "offset", offset, min=0)
    out = _checks.alloc(fname, (nq, nk), np.bool_)
    off = min(off, nk)  # larger offsets allow every key, same as nk
    np.less_equal(np.arange(nk, dtype=np.int64)[None, :],
                  np.arange(nq, dtype=np.int64)[:, None] + off, out=out)
    return out


def rotary_embedding(base, offset, x):
    """Rotary position embedding (RoPE) of adjacent feature pairs.

    Row ``r`` of ``x [..., S, F]`` is position ``pos = offset + r``; feature pair
    ``(2i, 2i+1)`` is rotated by the angle ``pos * base ** (-2i / F)``::

        y[..., r, 2i]   = x0 * cos(angle) - x1 * sin(angle)
        y[..., r, 2i+1] = x0 * sin(angle) + x1 * cos(angle)

    with ``x0 = x[..., r, 2i]``, ``x1 = x[..., r, 2i+1]``.

    Parameters
    ----------
    base : float, finite, ``> 0`` (10000.0 is customary)
    offset : int, ``>= 0``
    x : array_like, shape ``[..., S, F]``, at least 2 axes, ``F`` even

    Returns
    -------
    ndarray, shape of ``x``

    Raises
    ------
    ShapeError
        ``x`` has fewer than 2 axes, or an odd feature size ``F``.
    DomainError
        ``base`` not finite and positive, ``offset < 0``, or ``offset + S > 2**53``.
    NonFiniteError
        NaN/inf in ``x``.
    NumericOverflow
        a rotated value is not finite (inputs near the float64 limit).
    """
    fname = "rotary_embedding"
    b = _checks.real(fname, "base", base, positive=True)
    off = _checks.integer(fname, "offset", offset, min=0)
    xa = _checks.tensor(fname, "x", x, min_ndim=2)
    s, f = xa.shape[-2:]
    if f % 2 != 0:
        raise ShapeError(f"{fname}: x must have an even number of features F "
                         f"(got shape {_checks.shape_str(xa.shape)})")
    if off + s > _MAX_POSITION:
        raise DomainError(f"{fname}: offset + sequence length must be <= 2**53 "
                          f"(got offset {off}, S {s})")
    out = _checks.alloc(fname, xa.shape)
    if out.size == 0:
        return out
    r = _prod(xa.shape[:-2])
    bad = rotary_forward(xa.reshape(r, s, f), b, np.int64(off), out.reshape(r, s, f))
    return _checks.finish(fname, _checks.located(bad), out=out, overflow=lambda i, code: (
        f"the rotated value at index {tuple(int(j) for j in np.unravel_index(i, xa.shape))} "
        f"is not finite (float64 overflow)"))


def sinusoidal_encoding(positions, features, offset):
    """Sinusoidal positional encoding with base 10000.

    ``pe[p, 2i] = sin(pos / 10000 ** (2i / F))`` and ``pe[p, 2i+1] = cos(pos / 10000 **
    (2i / F))`` with ``pos = offset + p`` and ``F = features``; for odd ``F`` the last
    column is a sine.

    Parameters
    ----------
    positions : int, ``>= 0``
    features : int, ``>= 0``
    offset : int, ``>= 0``, with ``offset + positions <= 2**53``

    Returns
    -------
    ndarray, shape ``[positions, features]``

    Raises
    ------
    DomainError
        a negative argument or positions beyond ``2**53``.  TypeError: non-integers.
    """
    fname = "sinusoidal_encoding"
    n = _checks.integer(fname, "positions", positions, min=0)
    f = _checks.integer(fname, "features", features, min=0)
    off = _checks.integer(fname, "offset", offset, min=0)
    if off + n > _MAX_POSITION:
        raise DomainError(f"{fname}: offset + positions must be <= 2**53 "
                          f"(got offset {off}, positions {n})")
    out = _checks.alloc(fname, (n, f))
    if out.size == 0:
        return out
    pos = (np.arange(n, dtype=np.int64) + off).astype(np.float64)
    two_i = (np.arange(f, dtype=np.int64) // 2 * 2).astype(np.float64)
    # 10000 ** (2i/F) as exp((2i/F) log 10000), sin and cos: the library's own (libm.py;
    # no libm/numpy transcendental, so the same bits on every CPU)
    denom = libm_apply(libm.exp_array, (two_i / float(f)) * libm.log(10000.0))
    angle = pos[:, None] / denom[None, :]
    out[:, 0::2] = libm_apply(libm.sin_array, angle[:, 0::2])
    out[:, 1::2] = libm_apply(libm.cos_array, angle[:, 1::2])
    return out


def alibi_bias(slope, queries, keys, offset):
    """ALiBi attention bias ``bias[i, j] = -slope * |(i + offset) - j|``.

    Non-positive everywhere (the diagonal ``j == i + offset`` is ``+0.0``).  Combine with
    :func:`causal_mask` when keys after the query must be excluded.

    Parameters
    ----------
    slope : float, finite, ``> 0``
    queries, keys : int, ``>= 0``
    offset : int, ``>= 0`` (position of query 0), with ``offset + queries <= 2**53``

    Returns
    -------
    ndarray, shape ``[queries, keys]``

    Raises
    ------
    DomainError
        ``slope`` not finite and positive, or a negative count/offset.
    NumericOverflow
        ``slope * distance`` overflows float64.
    """
    fname = "alibi_bias"
    sl = _checks.real(fname, "slope", slope, positive=True)
    nq = _checks.integer(fname, "queries", queries, min=0)
    nk = _checks.integer(fname, "keys", keys, min=0)
    off = _checks.integer(fname, "offset", offset, min=0)
    if off + nq > _MAX_POSITION or nk > _MAX_POSITION:
        raise DomainError(f"{fname}: positions must be <= 2**53 "
                          f"(got offset {off}, queries {nq}, keys {nk})")
    out = _checks.alloc(fname, (nq, nk))
    if out.size == 0:
        return out
    dist = np.abs((np.arange(nq, dtype=np.int64) + off)[:, None]
                  - np.arange(nk, dtype=np.int64)[None, :]).astype(np.float64)
    with np.errstate(over="ignore"):      # overflow is reported below, as NumericOverflow
        np.multiply(dist, -sl, out=out)
    out += 0.0  # -0.0 on the diagonal becomes +0.0
    return _checks.finish(fname, None, out=out, overflow=lambda u, code: (
        f"slope * distance overflows float64 (got slope {sl!r}, largest distance "
        f"{dist.max():.0f})"))
