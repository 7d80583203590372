#!/usr/bin/env python3
"""Measure the headline speed ratios of issue 7 side by side and print a markdown table.

    python asv_bench/ratios.py                 # every pair, 7 interleaved repeats
    python asv_bench/ratios.py -r 15 -k conv   # only pairs whose name contains "conv"
    python asv_bench/ratios.py --asv           # the same pairs from the newest saved asv run

For every pair, ours and the peer run on the same inputs (float64 unless stated), each
in its own worker process (started once for the whole table; ``--same-process`` times
both in this one), interleaved: repeat ``r`` times { time ours, time peer }, each time
being the best per-call time of a ``timeit`` loop long enough to last ~0.1 s; the table
reports the best of the ``r`` repeats of each and ``peer / ours`` (> 1: ours is faster).
Separate processes because torch and Numba otherwise share one OpenMP runtime (torch's
libgomp), initialised with the settings of whichever library loaded first: each side
should run with its own defaults, as a user of either library would.  Peer = torch
float64 when importable (same thread count as numba), else the numpy expression.
Compilation is excluded: every function runs once before timing.  The shapes are the
issue's targets, the same as the asv benchmarks (asv_bench/benchmarks/bench_*.py).

``--asv [FILE]`` measures nothing: it reads an asv result file (default: the newest one
under asv_bench/.asv/results, written by ``asv run --python=same --set-commit-hash=...``)
and prints the same pairs from that run's numbers (``ASV_PAIRS`` names the benchmarks).
"""

import argparse
import datetime
import os
import platform
import sys
import time
import timeit

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
# import hmath_dl from this checkout, and the bench package (training steps) from here
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != HERE]
sys.path.insert(0, os.path.dirname(HERE))
sys.path.append(HERE)

# A worker process that times OUR side does not load torch at all, as for a user of
# hmath_dl alone: torch ships its own libgomp under the soname libgomp.so.1, which Numba's
# OpenMP pool then shares -- initialised with torch's spin policy if torch came first (a
# CNN step 6 -> 16 ms), and measurably slower for our kernels even when it came second
# (conv2d 2.5 -> 3.5 ms).  A worker timing the PEER imports torch first, so torch keeps
# its own defaults.
_ROLE = sys.argv[sys.argv.index("--worker") + 1] if "--worker" in sys.argv[:-1] else None
if _ROLE == "ours":
    torch = None
else:
    import warnings
    # torch first on purpose (see above): hmath_dl's warning about that is expected
    warnings.filterwarnings("ignore", message="hmath_dl: an OpenMP runtime")
    try:
        import torch
        torch.set_num_threads(int(os.environ.get("NUMBA_NUM_THREADS", os.cpu_count() or 1)))
    except Exception:  # pragma: no cover - torch absent
        torch = None

import numba  # noqa: E402

from hmath_dl import layers as L  # noqa: E402
from hmath_dl import precision as P  # noqa: E402


def rnd(shape, seed):
    return np.random.default_rng(seed).standard_normal(shape)


def tt(a):
    return torch.from_numpy(np.array(a, dtype=np.float64, copy=True))


# --------------------------------------------------------------------------- the pairs
# each builder returns (ours callable, peer name, peer callable); None peer = skip
PAIRS = []


FLOPS = {}   # pair name -> floating-point operations per call (for the roofline column)


def pair(name, shape, flops=None):
    def wrap(builder):
        PAIRS.append((name, shape, builder))
        if flops:
            FLOPS[name] = flops
        return builder
    return wrap


DGEMM = "numpy float64 matmul (the FMA roofline)"


@pair(DGEMM, "1024 x 1024 x 1024", 2 * 1024 ** 3)
def _dgemm():
    a, b = rnd((1024, 1024), 1), rnd((1024, 1024), 2)
    return (lambda: a @ b), "numpy", (lambda: a @ b)


def _int8_pair(m, k, n):
    qa = P.quantize(P.Quantization.SYMMETRIC, 0, rnd((m, k), 1))
    qb = P.quantize(P.Quantization.SYMMETRIC, 1, rnd((k, n), 2))
    a, b = rnd((m, k), 1), rnd((k, n), 2)
    return (lambda: P.int8_gemm(qa, qb)), "numpy float64 matmul", (lambda: a @ b)


def _reduced_pair(precision, n):
    a, b = rnd((n, n), 1), rnd((n, n), 2)
    a32, b32 = a.astype(np.float32), b.astype(np.float32)
    return (lambda: P.reduced_gemm(precision, a, b)), "numpy float32 matmul", (lambda: a32 @ b32)


pair("int8_gemm (per-row x per-column, symmetric)", "1024 x 1024 x 1024")(
    lambda: _int8_pair(1024, 1024, 1024))
pair("reduced_gemm BF16", "1024 x 1024 x 1024")(lambda: _reduced_pair(P.Precision.BF16, 1024))
pair("reduced_gemm FP16", "1024 x 1024 x 1024")(lambda: _reduced_pair(P.Precision.FP16, 1024))
pair("reduced_gemm BF16 256^3", "256 x 256 x 256")(lambda: _reduced_pair(P.Precision.BF16, 256))
pair("reduced_gemm FP16 256^3", "256 x 256 x 256")(lambda: _reduced_pair(P.Precision.FP16, 256))
pair("int8_gemm one token (1 x 4096 . 4096 x 4096)", "1 x 4096 x 4096")(
    lambda: _int8_pair(1, 4096, 4096))


# Issue 15's skinny products (batch-1 inference).  Ours reads the float64 operands (the
# API's) and rounds them; the first peer multiplies float32 copies made beforehand (half
# the bytes, no rounding to check), the second makes them in the call, as a user holding
# float64 data would.
def _skinny_pair(m, k, n, convert):
    a, b = rnd((m, k), 1), rnd((k, n), 2)
    ours = (lambda: P.reduced_gemm(P.Precision.FP16, a, b))
    if convert:
        return ours, "numpy a.astype(float32) @ b.astype(float32)", (
            lambda: a.astype(np.float32) @ b.astype(np.float32))
    a32, b32 = a.astype(np.float32), b.astype(np.float32)
    return ours, "numpy float32 matmul", (lambda: a32 @ b32)


pair("reduced_gemm FP16 one token", "1 x 4096 x 4096")(
    lambda: _skinny_pair(1, 4096, 4096, False))
pair("reduced_gemm FP16 one token, peer converting", "1 x 4096 x 4096")(
    lambda: _skinny_pair(1, 4096, 4096, True))
pair("reduced_gemm FP16 one output column", "4096 x 4096 x 1")(
    lambda: _skinny_pair(4096, 4096, 1, False))


# The memory-bound conversions (issue 15: >= 2x the same array's numpy / ml_dtypes cast;
# ours do one rounding from float64 and check every entry, the casts check nothing).
N_CONVERT = 1 << 20   # bench_half.N_ROUND


def _conversion_pair(kind, precision):
    import ml_dtypes
    x = rnd((N_CONVERT,), 3)
    p = P.Precision[precision]
    cast = np.float16 if precision == "FP16" else ml_dtypes.bfloat16
    peer_name = "numpy astype(float16)" if precision == "FP16" else "ml_dtypes astype(bfloat16)"
    if kind == "round_to_bits":
        return (lambda: P.round_to_bits(p, x)), peer_name, (lambda: x.astype(cast))
    if kind == "round_to_precision":
        return ((lambda: P.round_to_precision(p, x)), peer_name + ".astype(float64)",
                (lambda: x.astype(cast).astype(np.float64)))
    bits = P.round_to_bits(p, x)
    half = x.astype(cast)
    return ((lambda: P.bits_to_float(p, bits)), peer_name.split(" ")[0] + " float16 -> float64"
            if precision == "FP16" else "ml_dtypes bfloat16 -> float64",
            (lambda: half.astype(np.float64)))


for _kind in ("round_to_bits", "round_to_precision", "bits_to_float"):
    for _prec in ("FP16", "BF16"):
        pair(f"{_kind} {_prec}", "1M float64")(
            lambda kind=_kind, prec=_prec: _conversion_pair(kind, prec))


@pair("quantize SYMMETRIC per row (int8)", "1024 x 1024")
def _quantize_pair():
    x = rnd((1024, 1024), 3)
    return ((lambda: P.quantize(P.Quantization.SYMMETRIC, 0, x)), "numpy astype(float16)",
            (lambda: x.astype(np.float16)))


@pair("dequantize (per row)", "1024 x 1024")
def _dequantize_pair():
    x = rnd((1024, 1024), 3)
    q = P.quantize(P.Quantization.SYMMETRIC, 0, x)
    half = x.astype(np.float16)
    return (lambda: P.dequantize(q)), "numpy float16 -> float64", (lambda: half.astype(np.float64))


# Issue 17: every activation on 16M float64 elements against torch's (same thread count);
# ours checks every input and output, torch's checks nothing.
N_ACTIVATE = (4096, 4096)   # bench_activations.BIG
_TORCH_ACT = {"RELU": "relu", "LEAKY_RELU": "leaky_relu", "GELU": "gelu", "SILU": "silu",
              "SIGMOID": "sigmoid", "TANH": "tanh", "SOFTPLUS": "softplus", "ELU": "elu"}


def _activation_pair(name):
    from hmath_dl.activations import Activation, activate
    x = rnd(N_ACTIVATE, 3)
    act = Activation[name]
    ours = (lambda: activate(act, x))
    if torch is None:
        return ours, None, None
    t = tt(x)
    if name == "GELU_TANH":
        return ours, "torch", (lambda: torch.nn.functional.gelu(t, approximate="tanh"))
    fn = getattr(torch.nn.functional, _TORCH_ACT[name])
    return ours, "torch", (lambda: fn(t))


for _act in ("RELU", "LEAKY_RELU", "GELU", "GELU_TANH", "SILU", "SIGMOID", "TANH", "SOFTPLUS",
             "ELU"):
    pair(f"activate {_act}", "4096 x 4096")(lambda name=_act: _activation_pair(name))


@pair("dense vs torch linear", "x 512 x 1024, w 1024 x 1024")
def _dense_torch():
    x, w, b = rnd((512, 1024), 5), rnd((1024, 1024), 6), rnd((1024,), 7)
    if torch is None:
        return (lambda: L.dense(x, w, b)), None, None
    tx, tw, tb = tt(x), tt(w), tt(b)
    return (lambda: L.dense(x, w, b)), "torch", (lambda: torch.nn.functional.linear(tx, tw, tb))


def _row_norm(ours, torch_fn, numpy_fn, shape=(16, 512, 768)):
    x = rnd(shape, 3)
    if torch is not None:
        t = tt(x)
        return ((lambda: ours(1, 1e-5, x)), "torch",
                (lambda: torch_fn(t, (shape[-1],), eps=1e-5)))
    return (lambda: ours(1, 1e-5, x)), "numpy", (lambda: numpy_fn(x))


@pair("layer_norm (last axis)", "16 x 512 x 768")
def _ln():
    def np_ln(x):
        d = x - x.mean(axis=-1, keepdims=True)
        return d / np.sqrt((d * d).mean(axis=-1, keepdims=True) + 1e-5)
    return _row_norm(L.layer_norm, torch and torch.nn.functional.layer_norm, np_ln)


@pair("layer_norm, short rows (the transformer step's)", "16 x 64 x 64")
def _ln_short():
    def np_ln(x):
        d = x - x.mean(axis=-1, keepdims=True)
        return d / np.sqrt((d * d).mean(axis=-1, keepdims=True) + 1e-5)
    return _row_norm(L.layer_norm, torch and torch.nn.functional.layer_norm, np_ln,
                     (16, 64, 64))


@pair("rms_norm (last axis)", "16 x 512 x 768")
def _rms():
    def np_rms(x):
        return x / np.sqrt((x * x).mean(axis=-1, keepdims=True) + 1e-5)
    return _row_norm(L.rms_norm, torch and torch.nn.functional.rms_norm, np_rms)


@pair("batch_norm TRAINING", "16 x 64 x 56 x 56")
def _bn():
    x = rnd((16, 64, 56, 56), 4)
    g, b, s = np.ones(64), np.zeros(64), L.BatchNormState.initial(64)

    def ours():
        return L.batch_norm(L.Mode.TRAINING, 0.1, 1e-5, g, b, s, x)
    if torch is None:
        def peer():
            d = x - x.mean(axis=(0, 2, 3), keepdims=True)
            return d / np.sqrt((d * d).mean(axis=(0, 2, 3), keepdims=True) + 1e-5)
        return ours, "numpy", peer
    t, tg, tb = tt(x), tt(g), tt(b)
    rm, rv = tt(np.zeros(64)), tt(np.ones(64))
    return ours, "torch", (lambda: torch.nn.functional.batch_norm(
        t, rm, rv, tg, tb, training=True, momentum=0.1, eps=1e-5))


@pair("group_norm(8)", "16 x 64 x 56 x 56")
def _gn():
    x = rnd((16, 64, 56, 56), 4)
    if torch is None:
        def peer():
            g = x.reshape(16, 8, -1)
            d = g - g.mean(axis=-1, keepdims=True)
            return (d / np.sqrt((d * d).mean(axis=-1, keepdims=True) + 1e-5)).reshape(x.shape)
        return (lambda: L.group_norm(8, 1e-5, x)), "numpy", peer
    t = tt(x)
    return (lambda: L.group_norm(8, 1e-5, x)), "torch", (lambda: torch.nn.functional.group_norm(t, 8, eps=1e-5))


@pair("dense x @ w.T + b", "x 512 x 1024, w 1024 x 1024")
def _dense():
    x, w, b = rnd((512, 1024), 5), rnd((1024, 1024), 6), rnd((1024,), 7)
    return (lambda: L.dense(x, w, b)), "numpy x @ w.T + b", (lambda: x @ w.T + b)


def _torch_or_skip(ours, peer):
    return (ours, "torch", peer) if torch is not None else (ours, None, None)


@pair("conv2d, padding 1", "x 8x32x32x32, w 64x32x3x3")
def _conv2d():
    x, w = rnd((8, 32, 32, 32), 8), rnd((64, 32, 3, 3), 9)
    o = L.ConvOptions(1, 1, 1)
    tx, tw = (tt(x), tt(w)) if torch else (None, None)
    return _torch_or_skip(lambda: L.convolution(o, x, w, None),
                          lambda: torch.nn.functional.conv2d(tx, tw, padding=1))


@pair("conv1d", "x 16x64x1024, w 64x64x5")
def _conv1d():
    x, w = rnd((16, 64, 1024), 10), rnd((64, 64, 5), 11)
    o = L.ConvOptions(1, 0, 1)
    tx, tw = (tt(x), tt(w)) if torch else (None, None)
    return _torch_or_skip(lambda: L.convolution(o, x, w, None),
                          lambda: torch.nn.functional.conv1d(tx, tw))


@pair("strided conv2d 3x3, stride 2, padding 1", "x 8x32x32x32, w 64x32x3x3")
def _sconv2d():
    x, w = rnd((8, 32, 32, 32), 8), rnd((64, 32, 3, 3), 9)
    o = L.ConvOptions(2, 1, 1)
    tx, tw = (tt(x), tt(w)) if torch else (None, None)
    return _torch_or_skip(lambda: L.convolution(o, x, w, None),
                          lambda: torch.nn.functional.conv2d(tx, tw, stride=2, padding=1))


@pair("transposed conv2d, stride 2", "x 8x64x16x16, w 64x64x4x4")
def _tconv():
    x, w = rnd((8, 64, 16, 16), 12), rnd((64, 64, 4, 4), 13)
    o = L.ConvOptions(2, 0, 1)
    tx, tw = (tt(x), tt(w)) if torch else (None, None)
    return _torch_or_skip(lambda: L.transposed_convolution(0, o, x, w, None),
                          lambda: torch.nn.functional.conv_transpose2d(tx, tw, stride=2))


@pair("depthwise conv2d, padding 1", "x 8x64x56x56, w 64x1x3x3")
def _dw():
    x, w = rnd((8, 64, 56, 56), 14), rnd((64, 1, 3, 3), 15)
    o = L.ConvOptions(1, 1, 1)
    tx, tw = (tt(x), tt(w)) if torch else (None, None)
    return _torch_or_skip(lambda: L.depthwise_convolution(o, x, w, None),
                          lambda: torch.nn.functional.conv2d(tx, tw, padding=1, groups=64))


@pair("max pooling k3 s2 p1", "8 x 64 x 56 x 56")
def _maxpool():
    x = rnd((8, 64, 56, 56), 16)
    tx = tt(x) if torch else None
    return _torch_or_skip(lambda: L.pooling(L.PoolMode.MAX, 3, 2, 1, x),
                          lambda: torch.nn.functional.max_pool2d(tx, 3, 2, 1))


@pair("average pooling k3 s2 p1 (padding excluded)", "8 x 64 x 56 x 56")
def _avgpool():
    x = rnd((8, 64, 56, 56), 16)
    tx = tt(x) if torch else None
    return _torch_or_skip(lambda: L.pooling(L.PoolMode.AVERAGE, 3, 2, 1, x),
                          lambda: torch.nn.functional.avg_pool2d(tx, 3, 2, 1, count_include_pad=False))


@pair("SDPA causal (ours also returns the weights)", "q = k = v 8 x 512 x 64")
def _sdpa():
    x = rnd((8, 512, 64), 17)
    m = L.causal_mask(512, 512, 0)
    tx = tt(x) if torch else None
    return _torch_or_skip(lambda: L.scaled_dot_product_attention(x, x, x, m),
                          lambda: torch.nn.functional.scaled_dot_product_attention(tx, tx, tx, is_causal=True))


@pair("KV cache: 4000 vs 1000 one-row appends (linear = 4.0)", "rows of width 64 / 64")
def _kv():
    g = np.random.default_rng(18)
    rows = [(g.standard_normal((1, 64)), g.standard_normal((1, 64))) for _ in range(4000)]

    def decode(n):
        c = L.empty_cache(n, 64, 64)
        for k, v in rows[:n]:
            c = L.append_cache(c, k, v)
        return c
    # "ours" = 1000 appends, "peer" = 4000 appends: the ratio is peer/ours = growth factor
    return (lambda: decode(1000)), "ours, 4000 appends", (lambda: decode(4000))


# the shapes of issue 14 ("Fast on every CPU"): float64, batch 8 unless noted
_ISSUE14 = [  # name, x shape, w shape, stride, padding, groups, transposed
    ("3x3 s1 32->64 @32", (8, 32, 32, 32), (64, 32, 3, 3), 1, 1, 1, False),
    ("3x3 s1 64->64 @56", (8, 64, 56, 56), (64, 64, 3, 3), 1, 1, 1, False),
    ("3x3 s2 64->128 @56", (8, 64, 56, 56), (128, 64, 3, 3), 2, 1, 1, False),
    ("1x1 s1 256->64 @56", (8, 256, 56, 56), (64, 256, 1, 1), 1, 0, 1, False),
    ("1x1 s2 256->512 @56", (8, 256, 56, 56), (512, 256, 1, 1), 2, 0, 1, False),
    ("7x7 s2 3->64 @224 (batch 4)", (4, 3, 224, 224), (64, 3, 7, 7), 2, 3, 1, False),
    ("3x3 s1 256->256 @14", (8, 256, 14, 14), (256, 256, 3, 3), 1, 1, 1, False),
    ("3x3 groups 32, 128->128 @28", (8, 128, 28, 28), (128, 4, 3, 3), 1, 1, 32, False),
    ("transposed 4x4 s2 p1 64->64 @16", (8, 64, 16, 16), (64, 64, 4, 4), 2, 1, 1, True),
    ("conv1d k5 p2 64->64 @1024 (batch 16)", (16, 64, 1024), (64, 64, 5), 1, 2, 1, False),
]


def _conv_flops(xs, ws, s, p, tr):
    from math import prod
    if tr:
        return 2 * prod(xs) * ws[1] * prod(ws[2:])
    o = [(xs[2 + a] + 2 * p - ws[2 + a]) // s + 1 for a in range(len(xs) - 2)]
    return 2 * xs[0] * ws[0] * prod(o) * ws[1] * prod(ws[2:])


# ResNet's last stage (deep channels on 7x7 planes): not in issue 14's table, but the
# shapes the convolution's GEMM path is planned for
_DEEP_SMALL = [
    ("3x3 s1 512->512 @7", (8, 512, 7, 7), (512, 512, 3, 3), 1, 1, 1, False),
    ("1x1 s1 512->2048 @7", (8, 512, 7, 7), (2048, 512, 1, 1), 1, 0, 1, False),
]


def _issue14_pair(name, xs, ws, s, p, g, tr, prefix="issue 14: conv "):
    @pair(prefix + name, f"x {'x'.join(map(str, xs))}, w {'x'.join(map(str, ws))}",
          _conv_flops(xs, ws, s, p, tr))
    def _build():
        x, w = rnd(xs, 20), rnd(ws, 21)
        r = len(xs) - 2
        o = L.ConvOptions((s,) * r, (p,) * r, (1,) * r, g)
        if tr:
            ours = lambda: L.transposed_convolution((0,) * r, o, x, w, None)  # noqa: E731
        else:
            ours = lambda: L.convolution(o, x, w, None)  # noqa: E731
        if torch is None:
            return ours, None, None
        tx, tw = tt(x), tt(w)
        F = torch.nn.functional
        if tr:
            return ours, "torch", (lambda: F.conv_transpose2d(tx, tw, None, s, p, 0, g))
        fn = F.conv1d if r == 1 else F.conv2d
        return ours, "torch", (lambda: fn(tx, tw, None, s, p, 1, g))


for _args in _ISSUE14:
    _issue14_pair(*_args)
for _args in _DEEP_SMALL:
    _issue14_pair(*_args, prefix="conv (deep, small planes) ")


def _training(kind):
    try:
        from benchmarks import bench_autodiff as B
    except Exception as e:  # pragma: no cover
        print(f"(training steps unavailable: {e!r})", file=sys.stderr)
        return None, None, None
    if kind == "cnn":
        p = B.cnn_params()
        x, y = B.cnn_data(64)
        ours = lambda: B.cnn_step(p, x, y)  # noqa: E731
        if torch is None:
            return ours, None, None
        tp, tx, ty = [tt(a) for a in p], tt(x), torch.from_numpy(y)
        return ours, "torch", (lambda: B.torch_cnn_step(tp, tx, ty))
    p = B.transformer_params()
    t, y = B.transformer_data(16)
    ours = lambda: B.transformer_step(p, t, y)  # noqa: E731
    if torch is None:
        return ours, None, None
    tp = [tt(a) for a in p]
    tt_, ty, mask = torch.from_numpy(t), torch.from_numpy(y), torch.from_numpy(B.CAUSAL.copy())
    return ours, "torch", (lambda: B.torch_transformer_step(tp, tt_, ty, mask))


@pair("training step, small CNN (forward + backward)", "batch 64, 1x8x8 images")
def _train_cnn():
    return _training("cnn")


@pair("training step, 2-layer transformer (forward + backward)", "batch 16, seq 64, d 64")
def _train_tf():
    return _training("transformer")


# --------------------------------------------------------------------------- asv results
# pair name prefix -> ((ours benchmark, params), (peer benchmark, params)); params as asv prints
ASV_PAIRS = {
    "int8_gemm": (("bench_quantization.Int8Gemm.time_int8_gemm", ["1024"]),
                  ("bench_quantization.NumpyMatmulFloat64.time_numpy_matmul_float64", ["1024"])),
    "reduced_gemm": (("bench_half.ReducedGemm.time_reduced_gemm", ["1024", "'BF16'"]),
                     ("bench_half.NumpyMatmulFloat32.time_numpy_matmul_float32", ["1024"])),
    "layer_norm": (("bench_norm.RowNorms.time_layer_norm", ["(16, 512, 768)"]),
                   ("bench_norm.TorchRowNorms.time_layer_norm", ["(16, 512, 768)"])),
    "rms_norm": (("bench_norm.RowNorms.time_rms_norm", ["(16, 512, 768)"]),
                 ("bench_norm.TorchRowNorms.time_rms_norm", ["(16, 512, 768)"])),
    "batch_norm": (("bench_norm.ImageNorms.time_batch_norm_training", ["(16, 64, 56, 56)"]),
                   ("bench_norm.TorchImageNorms.time_batch_norm_training", ["(16, 64, 56, 56)"])),
    "group_norm": (("bench_norm.ImageNorms.time_group_norm_8", ["(16, 64, 56, 56)"]),
                   ("bench_norm.TorchImageNorms.time_group_norm_8", ["(16, 64, 56, 56)"])),
    "dense": (("bench_dense.Dense.time_dense", ["(512, 1024)"]),
              ("bench_dense.NumpyDense.time_dense", ["(512, 1024)"])),
    "conv2d": (("bench_conv.Conv2d.time_convolution", ["32"]),
               ("bench_conv.TorchConv2d.time_torch_conv2d", ["32"])),
    "conv1d": (("bench_conv.Conv1d.time_convolution", ["1024"]),
               ("bench_conv.TorchConv1d.time_torch_conv1d", ["1024"])),
    "strided conv2d": (("bench_conv.StridedConv2d.time_convolution", ["'3x3'"]),
                       ("bench_conv.TorchStridedConv2d.time_torch_conv2d", ["'3x3'"])),
    "transposed conv2d": (("bench_conv.TransposedConv2d.time_transposed_convolution", ["16"]),
                          ("bench_conv.TorchTransposedConv2d.time_torch_conv_transpose2d", ["16"])),
    "depthwise conv2d": (("bench_conv.DepthwiseConv2d.time_depthwise_convolution", ["56"]),
                         ("bench_conv.TorchDepthwiseConv2d.time_torch_depthwise_conv2d", ["56"])),
    "max pooling": (("bench_pool.Pool2d.time_max_pooling", ["56"]),
                    ("bench_pool.TorchPool2d.time_torch_max_pool2d", ["56"])),
    "average pooling": (("bench_pool.Pool2d.time_average_pooling", ["56"]),
                        ("bench_pool.TorchPool2d.time_torch_avg_pool2d", ["56"])),
    "SDPA": (("bench_attention.CausalAttention.time_sdpa_causal", ["512"]),
             ("bench_attention.TorchCausalAttention.time_torch_sdpa_causal", ["512"])),
    "KV cache": (("bench_attention.KVCacheDecode.time_append_one_row_at_a_time", ["1000"]),
                 ("bench_attention.KVCacheDecode.time_append_one_row_at_a_time", ["4000"])),
    "training step, small CNN": (("bench_autodiff.TrainCNN.time_hmath_dl", ["64"]),
                                 ("bench_autodiff.TrainCNNTorch.time_torch_float64", ["64"])),
    "training step, 2-layer": (("bench_autodiff.TrainTransformer.time_hmath_dl", ["16"]),
                               ("bench_autodiff.TrainTransformerTorch.time_torch_float64", ["16"])),
}


def asv_value(results, name, params):
    """One number from an asv result file (None when missing, failed or skipped)."""
    import itertools
    entry = results.get(name)
    if entry is None:
        return None
    values, grid = entry[0], entry[1]
    if not grid:
        return values if not isinstance(values, list) else values[0]
    for value, combo in zip(values, itertools.product(*grid)):
        if list(combo) == params:
            return value
    return None


def from_asv(path):
    import glob
    import json
    if path is None:
        files = glob.glob(os.path.join(HERE, ".asv", "results", "*", "*.json"))
        files = [f for f in files if not f.endswith("machine.json")]
        if not files:
            sys.exit("no saved asv results: run asv with --set-commit-hash first")
        path = max(files, key=os.path.getmtime)
    with open(path) as f:
        data = json.load(f)
    print(f"<!-- from {os.path.relpath(path, HERE)}: commit {data['commit_hash'][:10]}, "
          f"{datetime.datetime.fromtimestamp(data['date'] / 1000, datetime.timezone.utc):%Y-%m-%d} -->")
    print()
    print("| benchmark | shape | ours (asv) | peer | peer (asv) | peer / ours |")
    print("|---|---|---:|---|---:|---:|")
    for name, shape, builder in PAIRS:
        key = next((k for k in ASV_PAIRS if name.startswith(k)), None)
        if key is None:       # measured by this script only (no asv benchmark pair)
            continue
        (ob, op), (pb, pp) = ASV_PAIRS[key]
        to, tp = asv_value(data["results"], ob, op), asv_value(data["results"], pb, pp)
        peer = pb.split(".")[-2] + ("" if pb != ob else f" {pp[0]}")
        if to is None or tp is None:
            print(f"| {name} | {shape} | {fmt(to) if to else '-'} | {peer} | {fmt(tp) if tp else '-'} | - |")
        else:
            print(f"| {name} | {shape} | {fmt(to)} | {peer} | {fmt(tp)} | {tp / to:.2f} |")


# --------------------------------------------------------------------------- timing
def per_call(fn, number):
    return min(timeit.repeat(fn, number=number, repeat=1)) / number


def host_environment(env):
    """``env`` for the host column: every library picks its kernels for this CPU itself.
    An inherited ``OPENBLAS_CORETYPE`` is dropped (returned as the second value, for the
    table's header): some machines set one for every process (seen: ``Haswell`` on an
    AVX-512 host, where numpy's float64 1024^3 matmul then ran AVX2 kernels at about
    half the rate of OpenBLAS's own choice), and a roofline on another CPU's kernels
    would flatter every ratio against numpy."""
    env = dict(env)
    return env, env.pop("OPENBLAS_CORETYPE", None)


def calibrate(fn, target=0.1):
    n = 1
    while True:
        t = timeit.timeit(fn, number=n)
        if t >= target or n >= 10_000:
            return n
        n = max(n * 2, int(n * target / max(t, 1e-9)) + 1) if t > 0.01 else n * 10


# Seconds of idleness before each timing loop.  OpenBLAS's idle workers spin (yielding) for
# 2**28 cycles (OPENBLAS_THREAD_TIMEOUT's default, ~0.1 s at 2.5-3 GHz) after every
# threaded call before they sleep: with 0.02 s the peer process's spinning thread took a
# core from our next loop (reduced_gemm 1024^3: 9.2 ms after a numpy sgemm loop, 7.1 ms
# with OPENBLAS_THREAD_TIMEOUT=4 or with this pause; the peer's own time unchanged).
SETTLE = 0.15


def measure(ours, peer, repeats):
    """Best per-call times of ``ours`` and ``peer``, interleaved.  Before every timing
    loop the process idles for ``SETTLE`` seconds: after a parallel region, OpenMP and
    OpenBLAS worker threads spin for a while before they sleep (OpenBLAS: ~0.1 s), and on a 2-core machine
    the previous library's spinning workers would otherwise steal the cores from the next
    one's first calls (measured: up to 16 ms added to a 0.1 ms call).  Both sides get the
    same pause, so neither pays for the other's threads."""
    ours(), peer()  # compile / load, warm caches
    no, npeer = calibrate(ours), calibrate(peer)
    to, tp = [], []
    for _ in range(repeats):
        time.sleep(SETTLE)
        to.append(per_call(ours, no))
        time.sleep(SETTLE)
        tp.append(per_call(peer, npeer))
    return min(to), min(tp)


def worker(role):
    """Serve timing requests on stdin for one side (``ours`` or ``peer``): each line
    ``NAME`` (a pair name) is answered by one line: the best per-call time of one timing
    loop in seconds and the peer's name, or ``none`` when this side has no callable.  The
    first request of a pair builds its inputs, warms it up and calibrates the loop
    length.  (The ours worker has no torch: it answers for our side even where the peer
    is torch.)"""
    builders = {name: builder for name, _, builder in PAIRS}
    built = {}
    for line in sys.stdin:
        name = line.rstrip("\n")
        if name not in built:
            ours, peer_name, peer = builders[name]()
            fn = ours if role == "ours" else peer
            if fn is not None:
                fn()
                built[name] = (fn, calibrate(fn), peer_name)
            else:
                built[name] = None
        if built[name] is None:
            print("none", flush=True)
        else:
            fn, n, peer_name = built[name]
            print(repr(per_call(fn, n)), peer_name, flush=True)


def measure_isolated(procs, name, repeats):
    """Best per-call times of ``name`` from the two worker processes, interleaved (one
    timing loop each per repeat, ``SETTLE`` idle seconds before each), and the peer's
    name.  Nones when a side has no callable."""
    def ask(role):
        procs[role].stdin.write(name + "\n")
        procs[role].stdin.flush()
        reply = procs[role].stdout.readline().strip()
        if not reply:
            raise RuntimeError(f"the {role} worker died while timing {name!r}")
        if reply == "none":
            return None, None
        t, peer_name = (reply.split(" ", 1) + ["None"])[:2]
        return float(t), peer_name

    if ask("ours")[0] is None or ask("peer")[0] is None:     # build, warm up, calibrate
        return None, None, None
    to, tp = [], []
    for _ in range(repeats):
        time.sleep(SETTLE)
        to.append(ask("ours")[0])
        time.sleep(SETTLE)
        t, peer_name = ask("peer")
        tp.append(t)
    return min(to), min(tp), peer_name


def fmt(t):
    return f"{t * 1e3:.3g} ms" if t < 1 else f"{t:.3g} s"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("-r", "--repeat", type=int, default=7, help="interleaved repeats (best of)")
    ap.add_argument("-k", "--filter", default="", help="only pairs whose name contains this")
    ap.add_argument("--asv", nargs="?", const="", default=None, metavar="FILE",
                    help="print the pairs from a saved asv result file instead of measuring")
    ap.add_argument("--same-process", action="store_true",
                    help="time both sides in this process (they then share one OpenMP "
                         "runtime, initialised with torch's settings)")
    ap.add_argument("--isa", choices=("host", "avx2"), default="host",
                    help="avx2: both workers run AVX2 code on an AVX-512 host (numba "
                         "NUMBA_CPU_NAME=haswell with haswell's NUMBA_CPU_FEATURES -- the "
                         "name alone keeps the host's features --, OpenBLAS Haswell "
                         "kernels, torch "
                         "ATEN_CPU_CAPABILITY=avx2 and MKL_ENABLE_INSTRUCTIONS=AVX2 -- MKL "
                         "ignores ATEN's setting)")
    ap.add_argument("--worker", choices=("ours", "peer"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        return worker(args.worker)
    if args.asv is not None:
        return from_asv(args.asv or None)
    procs = None
    dropped = None
    if args.isa != "host" and args.same_process:
        ap.error("--isa needs worker processes (the target is fixed when numba loads)")
    if not args.same_process:
        import subprocess
        env = dict(os.environ)
        if args.isa == "avx2":
            from hmath_dl._kernels._cpu import target_environment
            env.update(target_environment("haswell"), OPENBLAS_CORETYPE="Haswell",
                       ATEN_CPU_CAPABILITY="avx2", MKL_ENABLE_INSTRUCTIONS="AVX2")
        else:
            env, dropped = host_environment(env)
        procs = {role: subprocess.Popen([sys.executable, os.path.abspath(__file__),
                                         "--worker", role], env=env,
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
                 for role in ("ours", "peer")}
    print(f"<!-- {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC; "
          f"{platform.node()} {platform.machine()} {os.cpu_count()} CPUs; "
          f"numba {numba.__version__} ({numba.config.NUMBA_NUM_THREADS} threads), "
          f"numpy {np.__version__}, torch {torch.__version__ if torch else 'absent'}"
          f"{' (' + str(torch.get_num_threads()) + ' threads)' if torch else ''}; "
          f"ISA {args.isa}"
          f"{'; inherited OPENBLAS_CORETYPE=' + dropped + ' dropped' if dropped else ''}; "
          f"best of {args.repeat} interleaved repeats"
          f"{'; both sides in one process' if procs is None else '; each side in its own worker process'} -->")
    print()
    print("| benchmark | shape | ours | peer | peer time | peer / ours | ours / dgemm rate |")
    print("|---|---|---:|---|---:|---:|---:|")
    dgemm_rate = None
    try:
        for name, shape, builder in PAIRS:
            if args.filter.lower() not in name.lower() and name != DGEMM:
                continue
            if procs is None:
                ours, peer_name, peer = builder()
                to, tp = (None, None) if ours is None or peer is None else \
                    measure(ours, peer, args.repeat)
            else:
                to, tp, peer_name = measure_isolated(procs, name, args.repeat)
            if to is None or tp is None:
                print(f"| {name} | {shape} | - | (no peer) | - | - | - |", flush=True)
                continue
            if name == DGEMM:
                dgemm_rate = FLOPS[name] / min(to, tp)
                print(f"| {name} | {shape} | {fmt(min(to, tp))} | = | {dgemm_rate / 1e9:.1f} "
                      f"GFLOP/s | - | 1.00 |", flush=True)
                continue
            roof = (f"{FLOPS[name] / to / dgemm_rate:.2f}" if name in FLOPS and dgemm_rate
                    else "-")
            print(f"| {name} | {shape} | {fmt(to)} | {peer_name} | {fmt(tp)} | {tp / to:.2f} "
                  f"| {roof} |", flush=True)
    finally:
        for p in (procs or {}).values():
            p.stdin.close()
            p.wait()


if __name__ == "__main__":
    main()
