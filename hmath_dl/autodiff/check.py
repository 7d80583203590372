"""``check_gradients``: the tape against central finite differences."""

from __future__ import annotations

import numpy as np

from .. import _checks
from .core import ADTensor, constant, gradients, tensor, variable

__all__ = ["check_gradients"]


def check_gradients(fn, inputs, eps=1e-6, rtol=1e-5, atol=1e-7):
    """Compare reverse-mode gradients of ``fn`` with central finite differences.

    Like ``torch.autograd.gradcheck``: every input entry ``x_j`` is moved by ``±eps`` and

    ``numeric_j = (L(x + eps e_j) - L(x - eps e_j)) / (2 eps)``

    is compared with the tape's ``analytic_j = dL/dx_j``, where ``L`` is ``fn``'s output
    if it has one element, otherwise ``L = sum(c * fn(...))`` with a fixed random
    cotangent ``c`` (standard normal, seed 0, so every output entry is checked).

    Parameters
    ----------
    fn : callable
        ``fn(*adtensors) -> ADTensor``; called once with variables and then ``2 n``
        times with constants (``n`` = total number of input entries), so keep inputs small.
    inputs : sequence of array_like
        The point at which to check (finite float64 values; ADTensors give their values).
    eps : float
        Step, ``> 0``.
    rtol, atol : float
        Pass iff ``|analytic - numeric| <= atol + rtol * |numeric|`` for every entry.

    Returns
    -------
    float
        The largest ``|analytic - numeric|`` seen (all checks passed).

    Raises
    ------
    AssertionError
        Some entry fails; the message names the input, the index, both values and the
        largest error.
    TypeError
        ``fn`` does not return an ADTensor, or ``inputs`` is not a sequence.
    """
    fname = "check_gradients"
    if not callable(fn):
        raise TypeError(f"{fname}: fn must be callable (got {type(fn).__name__})")
    if isinstance(inputs, (ADTensor, np.ndarray)) or not isinstance(inputs, (list, tuple)):
        raise TypeError(f"{fname}: inputs must be a list or tuple of array-likes "
                        f"(got {type(inputs).__name__})")
    eps = _checks.real(fname, "eps", eps, positive=True)
    rtol = _checks.real(fname, "rtol", rtol, nonnegative=True)
    atol = _checks.real(fname, "atol", atol, nonnegative=True)
    values = [np.array(x.value if isinstance(x, ADTensor) else
                       tensor(fname, f"inputs[{i}]", x), dtype=np.float64, copy=True)
              for i, x in enumerate(inputs)]

    variables = [variable(v) for v in values]
    out = fn(*variables)
    if not isinstance(out, ADTensor):
        raise TypeError(f"{fname}: fn must return an ADTensor (got {type(out).__name__})")
    if out.size == 1:
        cot = np.ones(out.shape)
    else:
        cot = np.random.default_rng(0).standard_normal(out.shape)
    analytic = gradients(out, variables, cot)

    def scalar(vals):
        o = fn(*[constant(v) for v in vals])
        return float(np.sum(o.value * cot))

    worst = 0.0
    for i, v in enumerate(values):
        flat = v.reshape(-1)
        num = np.empty(flat.size)
        for j in range(flat.size):
            orig = flat[j]
            flat[j] = orig + eps
            plus = scalar(values)
            flat[j] = orig - eps
            minus = scalar(values)
            flat[j] = orig
            num[j] = (plus - minus) / (2.0 * eps)
        ana = analytic[i].reshape(-1)
        err = np.abs(ana - num)
        if err.size:
            worst = max(worst, float(err.max()))
        bad = np.flatnonzero(err > atol + rtol * np.abs(num))
        if bad.size:
            j = int(bad[0])
            index = tuple(int(k) for k in np.unravel_index(j, v.shape))
            raise AssertionError(
                f"{fname}: gradient of input {i} at index {index}: analytic {ana[j]!r}, "
                f"numeric {num[j]!r} (|diff| {err[j]:.3e} > atol {atol} + rtol {rtol} * |numeric|; "
                f"{bad.size} of {err.size} entries fail, max |diff| {float(err.max()):.3e})")
    return worst
