"""Post-training INT8 quantization of a trained MLP, served through the exact int8 GEMM.

1. Train a float64 MLP (64 -> 256 -> 256 -> 10, ReLU) on scikit-learn's digits with the
   autodiff tape and AdamW.
2. Quantize every dense weight matrix per OUTPUT channel (symmetric, one scale per row of
   W [out, in]; ``int8_gemm`` wants its right operand as [K, N] quantized per column, so
   we quantize ``W.T`` with ``axis=1``).
3. At inference, quantize each layer's input dynamically per tensor and multiply with
   ``int8_gemm``: exact integer accumulation, one float64 rescale, overflow refused.

Prints float64 vs INT8 accuracy, the relative output error, the speed of both paths, and
the parity test of the seed client (``quantizar_linha`` / ``paridade``: per-row INT8 of
W [64, 32] ~ N(0, 0.05) against x [4, 32] ~ N(0, 1) must stay under 5 % mean relative
error).

Run:  python examples/int8_inference.py [--smoke]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from hmath_dl import RNG, optim
from hmath_dl import autodiff as ad
from hmath_dl import layers as L
from hmath_dl import precision as P
from hmath_dl.activations import Activation, activate

SIZES = [64, 256, 256, 10]


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--epochs", type=int, default=15)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--smoke", action="store_true")
    return p.parse_args(argv)


def train_mlp(x, y, epochs, rng):
    params = []
    for fan_in, fan_out in zip(SIZES[:-1], SIZES[1:]):
        w, rng = L.initialize_weights(L.KaimingUniform(), fan_in, fan_out, (fan_out, fan_in), rng)
        params += [w, np.zeros(fan_out)]
    state = optim.adamw_init(params)
    for _ in range(epochs):
        order, rng = rng.draw(lambda g: g.permutation(len(y)))
        for i in range(0, len(y), 64):
            idx = order[i:i + 64]
            variables = [ad.variable(p) for p in params]
            h = ad.constant(x[idx])
            for j in range(0, len(variables), 2):
                h = h @ ad.transpose(variables[j]) + variables[j + 1]
                if j + 2 < len(variables):
                    h = ad.activate(Activation.RELU, h)
            grads = ad.gradients(ad.cross_entropy(h, y[idx]), variables)
            params, state = optim.adamw_step(state, params, grads, lr=2e-3, weight_decay=1e-4)
    return params, rng


def float_forward(params, x):
    h = x
    for j in range(0, len(params), 2):
        h = L.dense(h, params[j], params[j + 1])
        if j + 2 < len(params):
            h = activate(Activation.RELU, h)
    return h


def quantize_weights(params):
    """Per-output-channel symmetric INT8 of every W [out, in] (as W.T [in, out], axis=1)."""
    return [(P.quantize(P.Quantization.SYMMETRIC, 1, params[j].T), params[j + 1])
            for j in range(0, len(params), 2)]


def int8_forward(qlayers, x):
    h = x
    for n, (qw, bias) in enumerate(qlayers):
        qx = P.quantize(P.Quantization.SYMMETRIC, None, h)  # dynamic, per tensor
        h = P.int8_gemm(qx, qw) + bias
        if n + 1 < len(qlayers):
            h = activate(Activation.RELU, h)
    return h


def relative_error(approx, exact):
    return float(np.mean(np.abs(approx - exact)) / max(np.mean(np.abs(exact)), 1e-12))


def seed_client_parity(rng):
    """The seed client's test: per-row INT8 of W [64, 32] ~ N(0, 0.05), x [4, 32] ~ N(0, 1)."""
    (w, x), _ = rng.draw(lambda g: (g.normal(0.0, 0.05, (64, 32)), g.normal(0.0, 1.0, (4, 32))))
    qw = P.quantize(P.Quantization.SYMMETRIC, 1, w.T)
    qx = P.quantize(P.Quantization.SYMMETRIC, None, x)
    return relative_error(P.int8_gemm(qx, qw), x @ w.T)


def best_time(fn, repeats=5):
    best = np.inf
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def main(argv=None):
    from sklearn.datasets import load_digits

    args = parse_args(argv)
    rng = RNG.from_seed(args.seed)
    digits = load_digits()
    x, y = digits.data / 16.0, digits.target.astype(np.int64)
    order, rng = rng.draw(lambda g: g.permutation(len(y)))
    cut = int(0.8 * len(y))
    tr, te = order[:cut], order[cut:]
    params, rng = train_mlp(x[tr], y[tr], 2 if args.smoke else args.epochs, rng)
    qlayers = quantize_weights(params)

    ref = float_forward(params, x[te])
    out = int8_forward(qlayers, x[te])
    acc_f = float(np.mean(np.argmax(ref, 1) == y[te]))
    acc_q = float(np.mean(np.argmax(out, 1) == y[te]))
    agree = float(np.mean(np.argmax(ref, 1) == np.argmax(out, 1)))
    rel = relative_error(out, ref)
    parity = seed_client_parity(rng)

    big = np.tile(x[te], (16, 1))  # a larger batch for timing
    t_f = best_time(lambda: float_forward(params, big))
    t_q = best_time(lambda: int8_forward(qlayers, big))
    print(f"test accuracy  float64 {acc_f:.4f}   INT8 {acc_q:.4f}   (argmax agreement {agree:.4f})")
    print(f"relative output error (mean |int8 - f64| / mean |f64|): {100 * rel:.3f} %")
    print(f"seed-client parity (W 64x32 ~ N(0, .05), x 4x32): {100 * parity:.3f} % (needs < 5 %)")
    print(f"batch {len(big)}: float64 forward {1e3 * t_f:.2f} ms, INT8 forward {1e3 * t_q:.2f} ms "
          f"(x{t_f / t_q:.2f})")
    return {"acc_float": acc_f, "acc_int8": acc_q, "relative_error": rel, "parity": parity}


if __name__ == "__main__":
    main()
