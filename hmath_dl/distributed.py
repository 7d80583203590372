"""Data-parallel gradients over shards of a batch, in this process or on a Dask cluster.

:func:`data_parallel_gradients` splits a batch into fixed shards, computes each shard's
loss and parameter gradients with :mod:`hmath_dl.autodiff` (in this process, or on the
workers of a ``dask.distributed`` client), and combines them in a fixed order, so the
result has the same bits whoever computed the shards::

    from hmath_dl import autodiff as ad
    from hmath_dl.distributed import data_parallel_gradients

    def loss_fn(params, x, y):            # module level: picklable for a Dask client
        w, b = params
        logits = ad.constant(x) @ w + b
        return ad.cross_entropy(logits, y) * len(y)   # the SUM over the shard

    loss, grads = data_parallel_gradients(loss_fn, [w, b], (x, y), shard_size=64)
    # same bits with  client=distributed.Client(...)  and any number of workers/threads

Dask is an optional dependency (``pip install hmath_dl[dask]``, i.e.
``dask[distributed]``); this module imports it only when a client is given.
"""

from __future__ import annotations

import operator
from typing import List, Sequence, Tuple

import numpy as np

from . import _blas, _checks
from . import autodiff as _ad
from .autodiff.core import ADTensor
from .errors import DomainError, ShapeError

__all__ = ["data_parallel_gradients"]

_FNAME = "data_parallel_gradients"


# --------------------------------------------------------------------------- validation
def _check_loss_fn(loss_fn):
    if not callable(loss_fn):
        raise TypeError(f"{_FNAME}: loss_fn must be callable as loss_fn(params_ad, *shard) "
                        f"(got {type(loss_fn).__name__})")
    return loss_fn


def _check_params(params) -> List[np.ndarray]:
    if isinstance(params, np.ndarray) or not isinstance(params, (list, tuple)):
        raise TypeError(f"{_FNAME}: params must be a list or tuple of arrays "
                        f"(got {type(params).__name__})")
    if len(params) == 0:
        raise ShapeError(f"{_FNAME}: params must not be empty (got an empty {type(params).__name__})")
    return [_checks.tensor(_FNAME, f"params[{i}]", p) for i, p in enumerate(params)]


def _check_batch(batch) -> Tuple[Tuple[np.ndarray, ...], int]:
    if isinstance(batch, np.ndarray) or not isinstance(batch, (tuple, list)):
        raise TypeError(f"{_FNAME}: batch must be a tuple of arrays sharing their leading "
                        f"length, e.g. (x, y) or (x,) (got {type(batch).__name__})")
    if len(batch) == 0:
        raise ShapeError(f"{_FNAME}: batch must hold at least one array (got an empty "
                         f"{type(batch).__name__})")
    arrays = []
    for i, a in enumerate(batch):
        name = f"batch[{i}]"
        arr = _checks._to_array(_FNAME, name, a, None)   # real numbers, dtype kept
        if arr.ndim == 0:
            raise ShapeError(f"{_FNAME}: {name} must have a leading batch axis (got a 0-d array)")
        if arr.dtype.kind == "f":
            _checks.require_finite(_FNAME, name, arr)
        arrays.append(arr)
    lengths = [a.shape[0] for a in arrays]
    if any(n != lengths[0] for n in lengths):
        raise ShapeError(f"{_FNAME}: the arrays of batch must share their leading length "
                         f"(got leading lengths {lengths})")
    if lengths[0] < 1:
        raise ShapeError(f"{_FNAME}: the batch is empty (leading length 0; expected B >= 1)")
    return tuple(arrays), int(lengths[0])


def _check_shard_size(shard_size) -> int:
    if isinstance(shard_size, (bool, np.bool_)):
        raise TypeError(f"{_FNAME}: shard_size must be a positive int (got bool {shard_size!r})")
    try:
        s = operator.index(shard_size)
    except TypeError:
        raise TypeError(f"{_FNAME}: shard_size must be a positive int "
                        f"(got {type(shard_size).__name__} {shard_size!r})") from None
    if s < 1:
        raise DomainError(f"{_FNAME}: shard_size must be a positive int (got {s})")
    return int(s)


def _check_client(client):
    for method in ("scatter", "map", "gather", "cancel"):
        if not callable(getattr(client, method, None)):
            raise TypeError(f"{_FNAME}: client must be None or a dask.distributed.Client "
                            f"(got {type(client).__name__}, which has no {method}())")
    if getattr(client, "asynchronous", False):
        raise TypeError(f"{_FNAME}: client is asynchronous; pass a synchronous "
                        f"dask.distributed.Client (or call this function in a thread)")
    try:
        import distributed  # noqa: F401  (a real client cannot exist without it)
    except ImportError as exc:  # pragma: no cover - a duck-typed client without dask
        raise ImportError(f"{_FNAME}: a Dask client needs dask.distributed; install it with "
                          f"pip install hmath_dl[dask]  (or pip install 'dask[distributed]')"
                          ) from exc
    return client


# --------------------------------------------------------------------------- BLAS threads
# OpenBLAS's results depend on its thread count for some shapes (see hmath_dl._blas), and
# Dask's nanny starts its workers with OPENBLAS_NUM_THREADS=OMP_NUM_THREADS=1 while this
# process has one BLAS thread per core.  Every shard is therefore computed with numpy's
# OpenBLAS on ONE thread (a thread-local switch, restored afterwards), here and on every
# worker.
# --------------------------------------------------------------------------- per shard
def _shard_loss_and_gradients(loss_fn, params, shard):
    """Loss (a float) and gradients (one float64 array per parameter) of one shard.

    Module level so that Dask pickles it by reference; the same function runs in this
    process for ``client=None``.
    """
    params_ad = [_ad.variable(p) for p in params]
    with _blas.one_thread():
        loss = loss_fn(params_ad, *shard)
        _check_loss(loss)
        grads = _ad.gradients(loss, params_ad)
    value = float(np.asarray(loss.value, dtype=np.float64).reshape(()))
    return value, [np.ascontiguousarray(g, dtype=np.float64) for g in grads]


def _check_loss(loss):
    if not isinstance(loss, ADTensor):
        raise TypeError(f"{_FNAME}: loss_fn must return a scalar ADTensor (the sum of the "
                        f"shard's per-example losses) (got {type(loss).__name__})")
    if loss.size != 1:
        raise ShapeError(f"{_FNAME}: loss_fn must return a scalar ADTensor (the sum of the "
                         f"shard's per-example losses) (got shape {_checks.shape_str(loss.shape)})")


def _shards(batch: Tuple[np.ndarray, ...], size: int, shard_size: int):
    """Shard ``i`` = ``tuple(a[i*shard_size:(i+1)*shard_size] for a in batch)``."""
    out = []
    for lo in range(0, size, shard_size):
        shard = []
        for a in batch:
            view = a[lo:lo + shard_size].view()
            view.flags.writeable = False  # loss_fn must not write into the caller's batch
            shard.append(view)
        out.append(tuple(shard))
    return out


# --------------------------------------------------------------------------- reduction
def _tree_sum(values: Sequence, lo: int, hi: int):
    """``values[lo:hi]`` summed by the fixed balanced tree ``sum(lo, mid) + sum(mid, hi)``
    with ``mid = (lo + hi) // 2``.  Values are floats or float64 arrays; every addition
    is one IEEE-754 elementwise ``+`` (no reduction whose order a library may choose)."""
    if hi - lo == 1:
        return values[lo]
    mid = (lo + hi) // 2
    return _tree_sum(values, lo, mid) + _tree_sum(values, mid, hi)


def _combine(results, params, size: int):
    n = len(results)
    for k, r in enumerate(results):  # a partial or malformed result never gets summed
        if (not isinstance(r, tuple) or len(r) != 2 or not isinstance(r[0], float)
                or not isinstance(r[1], list) or len(r[1]) != len(params)):
            raise RuntimeError(f"{_FNAME}: shard {k} returned a malformed result")
    losses = [r[0] for r in results]
    loss_total = _tree_sum(losses, 0, n)
    _checks.finish(_FNAME, bool(np.isfinite(loss_total)), overflow=lambda u, code: (
        f"the sum of the shard losses overflowed (got {loss_total!r})"))
    grads = []
    for j, p in enumerate(params):
        parts = [np.asarray(r[1][j], dtype=np.float64) for r in results]
        for k, g in enumerate(parts):
            if g.shape != p.shape:
                raise RuntimeError(f"{_FNAME}: shard {k} returned a gradient of shape "
                                   f"{_checks.shape_str(g.shape)} for params[{j}] of shape "
                                   f"{_checks.shape_str(p.shape)}")
        total = _tree_sum(parts, 0, n)
        _checks.finish(_FNAME, None, out=np.asarray(total), overflow=lambda u, code: (
            f"the sum of the shard gradients of params[{j}] overflowed"))
        g = np.asarray(total, dtype=np.float64) / np.float64(size)  # a new array
        grads.append(np.ascontiguousarray(g))
    return float(loss_total) / float(size), grads


# --------------------------------------------------------------------------- engines
def _run_local(loss_fn, params, shards):
    return [_shard_loss_and_gradients(loss_fn, params, shard) for shard in shards]


def _run_dask(client, loss_fn, params, shards):
    # The parameters travel once per call to every worker; each shard travels with its
    # own task (the scheduler keeps the task, so a task lost with its worker is rerun).
    param_futures = client.scatter(list(params), broadcast=True, hash=False)
    futures = []
    try:
        n = len(shards)
        # one task per shard, submitted together (one message; pure=False: fresh keys)
        futures = list(client.map(_shard_loss_and_gradients, [loss_fn] * n,
                                  [param_futures] * n, shards, pure=False))
        if len(futures) != n:  # pragma: no cover - defensive
            raise RuntimeError(f"{_FNAME}: submitted {len(futures)} of {n} shard tasks")
        # gather in shard order; re-raises the original exception of a failed shard and
        # raises CancelledError/KilledWorker for a cancelled or lost one
        results = client.gather(futures, errors="raise")
    except BaseException:
        try:
            client.cancel(futures + list(param_futures))
        except Exception:  # pragma: no cover - the client may be closing
            pass
        raise
    if len(results) != len(shards):  # pragma: no cover - defensive: never a partial sum
        raise RuntimeError(f"{_FNAME}: gathered {len(results)} of {len(shards)} shard results")
    return list(results)


# --------------------------------------------------------------------------- public
def data_parallel_gradients(loss_fn, params, batch, shard_size, client=None):
    r"""Mean loss and mean parameter gradients of a batch, computed shard by shard.

    The batch of ``B`` examples is cut into ``S = ceil(B / shard_size)`` shards; shard
    ``i`` is ``tuple(a[i*shard_size:(i+1)*shard_size] for a in batch)`` (the last may be
    shorter).  For each shard, ``loss_fn(params_ad, *shard)`` returns :math:`L_i`, the SUM
    of the shard's per-example losses, and reverse mode gives :math:`G_i = \partial L_i /
    \partial \theta`.  The result is

    .. math::

        \text{loss} = \frac{1}{B}\,\mathrm{T}(L_0, \dots, L_{S-1}), \qquad
        \text{grads}[j] = \frac{1}{B}\,\mathrm{T}(G_{0,j}, \dots, G_{S-1,j})

    where :math:`\mathrm{T}` is a fixed balanced pairwise tree over shard index order:
    :math:`\mathrm{T}(lo, hi) = \mathrm{T}(lo, mid) + \mathrm{T}(mid, hi)`, ``mid = (lo +
    hi) // 2``, a single shard is itself; every ``+`` is an elementwise float64 addition
    and the division by ``B`` is elementwise too.

    Parameters
    ----------
    loss_fn : callable
        ``loss_fn(params_ad, *shard) -> ADTensor``, a scalar (one element): the **sum**
        of the per-example losses of the shard (for a mean loss such as
        ``autodiff.cross_entropy`` multiply by the shard's length).  ``params_ad`` is a
        list of :func:`hmath_dl.autodiff.variable` leaves holding ``params``.  With a Dask
        client it must be picklable (a module-level function, or one cloudpickle can
        serialise) and importable on the workers.
    params : list or tuple of array_like
        The parameters, converted to C-contiguous float64 (not empty; finite).
    batch : tuple of array_like
        Arrays sharing the leading length ``B >= 1`` (e.g. ``(x, y)``); their dtypes are
        kept (integer labels stay integers); floating arrays must be finite.  The shards
        ``loss_fn`` receives are read-only views (copies on Dask workers).
    shard_size : int
        Examples per shard, ``>= 1``.  A ``shard_size >= B`` gives one shard.
    client : dask.distributed.Client, optional
        ``None`` (default): every shard is computed in this process, in shard order.
        A (synchronous) client: ``params`` are scattered once per call to every worker,
        one task per shard is submitted, the results are gathered in shard order and
        combined here.  Dask is imported only in this case
        (``pip install hmath_dl[dask]``).

    Returns
    -------
    loss : float
        ``loss_total / B``.
    grads : list of ndarray
        ``[g_total / B ...]``, new C-contiguous float64 arrays of the parameters' shapes.

    Notes
    -----
    **Determinism.** The shards, the per-shard computation and the reduction tree depend
    only on ``B`` and ``shard_size``, never on the engine: the result is bitwise identical
    for ``client=None`` and for any Dask client, whatever its number of workers and
    threads per worker (the per-shard gradients are thread-count independent, see the
    conventions of the package, and the combination always happens in the caller).  It
    generally differs in the last bits from the gradient of the whole batch at once or
    from another ``shard_size``, since the additions happen in another order.

    **BLAS threads.** The library's matrix products (``@`` on ADTensors, the backward of
    ``dense_ad``/``convolution_ad``) call numpy's BLAS, whose bits depend on its thread
    count, and Dask starts its workers with ``OPENBLAS_NUM_THREADS=1``.  Each shard is
    therefore computed with numpy's OpenBLAS on one thread (a thread-local switch of the
    calling thread, restored afterwards), here and on the workers.  Where that switch is
    not available (numpy built on another BLAS, or no ``/proc/self/maps``), the bitwise
    guarantee needs the same BLAS thread count in this process and on the workers (for
    example ``OPENBLAS_NUM_THREADS=1`` here too).

    **Failures.** An exception raised by ``loss_fn`` (or by a library function it calls)
    reaches the caller as the original exception type, also from a Dask worker.  A task
    whose worker dies is rescheduled by Dask (up to its ``allowed-failures`` setting,
    then ``distributed.KilledWorker``); a cancelled task or lost data raises
    (``CancelledError``).  Either every shard's result is combined or an exception is
    raised: a partial sum is never returned.  On an error the call's remaining tasks are
    cancelled.

    Raises
    ------
    TypeError
        ``loss_fn`` not callable, ``params``/``batch`` not lists/tuples of numeric
        array-likes, ``shard_size`` not an int (bool rejected), ``client`` not a
        synchronous Dask client, or ``loss_fn`` returned something else than an ADTensor.
    ShapeError
        Empty ``params`` or ``batch``, a 0-d batch array, leading lengths that differ,
        ``B == 0``, or a non-scalar loss.
    DomainError
        ``shard_size < 1``.
    NonFiniteError
        NaN or ±inf in ``params`` or in a floating batch array.
    NumericOverflow
        The summed loss or gradients overflow (or the tape does, inside a shard).
    ImportError
        A client is given but ``dask.distributed`` is not installed.
    """
    loss_fn = _check_loss_fn(loss_fn)
    params = _check_params(params)
    batch, size = _check_batch(batch)
    shard_size = _check_shard_size(shard_size)
    shards = _shards(batch, size, shard_size)
    if client is None:
        results = _run_local(loss_fn, params, shards)
    else:
        results = _run_dask(_check_client(client), loss_fn, params, shards)
    return _combine(results, params, size)
