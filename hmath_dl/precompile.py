"""``python -m hmath_dl.precompile [--all | module ...]``: fill the kernel cache ahead of time.

A fresh install compiles each kernel on its first call (seconds per kernel, a minute or
more for a training script).  This command makes those first calls now, so that later
processes load every kernel from Numba's on-disk cache: run it once after installing,
e.g. as a step of a Dockerfile or a CI job (with the same ``NUMBA_CACHE_DIR``,
``NUMBA_CPU_NAME`` and ``HMATH_DL_*`` settings as the runs that follow)::

    python -m hmath_dl.precompile --all          # every module below (~130 kernels,
                                                 # 4-5 minutes on 2 cores)
    python -m hmath_dl.precompile layers optim   # a subset
    python -m hmath_dl.precompile precision.int8_gemm   # one entry of the table

It calls the library's own public functions on small representative inputs (the table
``ENTRIES``), so exactly the specialisations that real calls use get compiled and
cached.  Each entry runs twice, at a small and at a larger batch, because a facade runs a
kernel's serial twin on little work and its parallel compilation on more (README,
"Small calls run serially"); both have their own cache entries.  Modules:
``precision``, ``activations``, ``layers``, ``autodiff``, ``optim``.

A progress bar (tqdm, an ``[examples]`` dependency; plain lines without it) goes to
stderr; one summary line goes to stdout.  ``--report`` adds the kernels that took longest
to compile.  ``--list`` prints the table and compiles nothing.  The exit status is 0 when
every entry ran, 1 when one failed (the others still run), 2 for an unknown module name.
"""

from __future__ import annotations

import sys
import time
from typing import Callable, List, NamedTuple

import numpy as np

__all__ = ["Entry", "ENTRIES", "MODULES", "select", "run", "main"]

#: The two batch sizes every entry runs at: below and above the serial-work threshold.
SMALL, LARGE = 2, 512


class Entry(NamedTuple):
    """One row of the table: ``run(batch)`` calls public functions of ``module``."""

    module: str
    name: str
    run: Callable[[int], object]

    @property
    def key(self) -> str:
        return f"{self.module}.{self.name}"


ENTRIES: List[Entry] = []


def _entry(module, name=None):
    def wrap(fn):
        ENTRIES.append(Entry(module, name or fn.__name__.lstrip("_"), fn))
        return fn
    return wrap


def _g(seed=0):
    return np.random.default_rng(seed)


def _images(b, c=16, side=8, seed=0):
    return _g(seed).standard_normal((b, c, side, side))


# --------------------------------------------------------------------------- precision
@_entry("precision")
def _quantization(b):
    from . import precision as P
    a = _g(1).standard_normal((b, 64))
    w = _g(2).normal(0.0, 0.05, (64, 128))
    for mode in P.Quantization:
        for axis in (None, 0, 1):
            q = P.quantize(mode, axis, a)
            P.dequantize(q)
    qa = P.quantize(P.Quantization.SYMMETRIC, 0, a)
    qw = P.quantize(P.Quantization.SYMMETRIC, 1, w)
    P.int8_gemm(qa, qw)
    P.int8_gemm(P.quantize(P.Quantization.ASYMMETRIC, None, a),
                P.quantize(P.Quantization.SYMMETRIC, None, w))


@_entry("precision")
def _int8_gemm(b):
    from . import precision as P
    a = _g(3).standard_normal((b, 256))
    w = _g(4).standard_normal((256, 256))
    P.int8_gemm(P.quantize(P.Quantization.SYMMETRIC, 0, a),
                P.quantize(P.Quantization.SYMMETRIC, 1, w))


@_entry("precision")
def _round_to_precision(b):
    from . import precision as P
    x = _g(5).standard_normal((b, 16, 64))
    for p in P.Precision:
        P.round_to_precision(p, x)
        P.bits_to_float(p, P.round_to_bits(p, x))


@_entry("precision")
def _reduced_gemm(b):
    from . import precision as P
    a = _g(6).standard_normal((b, 128))
    w = _g(7).standard_normal((128, 128))
    for p in P.Precision:
        P.reduced_gemm(p, a, w)


@_entry("precision")
def _loss_scaling(b):
    from . import precision as P
    grads = [_g(8).standard_normal((b, 16, 8, 8)), _g(9).standard_normal(16)]
    scaler = P.initial_loss_scaler(2.0 ** 16, 2000)
    P.scale_loss(scaler, 1.5)
    finite, unscaled = P.unscale_gradients(scaler, grads)
    P.unscale_gradients(scaler, [np.array([np.inf, 1.0])])
    P.update_loss_scaler(finite, scaler)
    P.gradient_norm(unscaled)
    P.clip_gradients(1.0, unscaled)


# --------------------------------------------------------------------------- activations
@_entry("activations")
def _activate(b):
    from .activations import Activation, activate
    x = _g(10).standard_normal((b, 16, 64))
    for act in Activation:
        activate(act, x)


# --------------------------------------------------------------------------- layers
@_entry("layers")
def _dropout(b):
    from . import layers as L
    from .rng import RNG
    rng = RNG.from_seed(0)
    x = _images(b)
    for mode in L.Mode:
        L.dropout(mode, 0.25, rng, x.reshape(b, -1))
        L.spatial_dropout(mode, 0.25, rng, x)


@_entry("layers")
def _normalization(b):
    from . import layers as L
    x = _images(b)
    state = L.BatchNormState.initial(16)
    ones, zeros = np.ones(16), np.zeros(16)
    for mode in L.Mode:
        L.batch_norm(mode, 0.1, 1e-5, ones, zeros, state, x)
    seq = _g(11).standard_normal((b, 16, 64))
    L.layer_norm(1, 1e-5, seq)
    L.layer_norm(1, 1e-5, seq, weight=np.ones(64), bias=np.zeros(64))
    L.rms_norm(1, 1e-6, seq)
    L.rms_norm(1, 1e-6, seq, weight=np.ones(64))
    L.instance_norm(1e-5, x)
    L.instance_norm(1e-5, x, weight=ones, bias=zeros)
    L.group_norm(4, 1e-5, x)
    L.group_norm(4, 1e-5, x, weight=ones, bias=zeros)
    L.weight_norm(0, np.ones(16), _g(12).standard_normal((16, 1, 3, 3)))


@_entry("layers")
def _initializers(b):
    from . import layers as L
    from .rng import RNG
    rng = RNG.from_seed(0)
    shape = (16, 8, 3, 3)
    for init in (L.XavierUniform(), L.XavierNormal(), L.KaimingUniform(), L.KaimingNormal(),
                 L.Orthogonal(), L.TruncatedNormal(0.0, 0.02, 2.0)):
        L.initialize_weights(init, 72, 144, shape, rng)


@_entry("layers")
def _embedding_dense(b):
    from . import layers as L
    table = _g(13).standard_normal((64, 32))
    L.embedding(table, np.arange(b * 16) % 64)
    x = _g(14).standard_normal((b, 128))
    L.dense(x, _g(15).standard_normal((64, 128)), np.zeros(64))
    L.dense(x, _g(15).standard_normal((64, 128)), None)


@_entry("layers")
def _convolution(b):
    from . import layers as L
    x = _images(b, c=8)
    w = _g(16).standard_normal((16, 8, 3, 3))
    bias = np.zeros(16)
    L.convolution(L.ConvOptions(stride=(1, 1), padding="same", dilation=(1, 1)), x, w, bias)
    L.convolution(L.ConvOptions(stride=(1, 1), padding=(1, 1), dilation=(1, 1)), x, w, None)
    L.convolution(L.ConvOptions(stride=(2, 2), padding=(1, 1), dilation=(1, 1)), x, w, bias)
    L.convolution(L.ConvOptions(stride=(1, 1), padding=(0, 0), dilation=(1, 1)), x,
                  _g(17).standard_normal((16, 8, 1, 1)), bias)
    L.convolution(L.ConvOptions(stride=(1, 1), padding=(1, 1), dilation=(1, 1), groups=4), x,
                  _g(18).standard_normal((16, 2, 3, 3)), bias)
    L.depthwise_convolution(L.ConvOptions(stride=(1, 1), padding=(1, 1), dilation=(1, 1)), x,
                            _g(19).standard_normal((8, 1, 3, 3)), np.zeros(8))
    L.transposed_convolution((0, 0), L.ConvOptions(stride=(2, 2), padding=(1, 1),
                                                   dilation=(1, 1)),
                             x, _g(20).standard_normal((8, 16, 4, 4)), bias)
    x1 = _g(21).standard_normal((b, 8, 64))
    L.convolution(L.ConvOptions(stride=(1,), padding=(2,), dilation=(1,)), x1,
                  _g(22).standard_normal((16, 8, 5)), bias)
    x3 = _g(23).standard_normal((b, 4, 6, 6, 6))
    L.convolution(L.ConvOptions(stride=(1, 1, 1), padding=(1, 1, 1), dilation=(1, 1, 1)), x3,
                  _g(24).standard_normal((8, 4, 3, 3, 3)), np.zeros(8))


@_entry("layers")
def _pooling(b):
    from . import layers as L
    x = _images(b)
    for mode in L.PoolMode:
        L.pooling(mode, (2, 2), (2, 2), (0, 0), x)
        L.pooling(mode, (3, 3), (2, 2), (1, 1), x)
        L.adaptive_pooling(mode, (3, 3), x)
        L.global_pooling(mode, x)
    values, indices = L.max_pooling_with_indices((2, 2), (2, 2), (0, 0), x)
    L.max_unpooling(values, indices, (8, 8))


@_entry("layers")
def _attention(b):
    from . import layers as L
    q = _g(25).standard_normal((b, 4, 16, 16))
    k = _g(26).standard_normal((b, 2, 16, 16))
    L.scaled_dot_product_attention(q, q, q)
    L.scaled_dot_product_attention(q, q, q, L.causal_mask(16, 16, 0))
    L.scaled_dot_product_attention(q, k, k, is_causal=True, enable_gqa=True)
    L.scaled_dot_product_attention(q, q, q, None, L.alibi_bias(0.5, 16, 16, 0))
    L.multihead_attention(4, q[:, 0], q[:, 1], q[:, 2], is_causal=True)
    L.rotary_embedding(10000.0, 0, q)
    L.sinusoidal_encoding(16, 64, 0)
    L.sinusoidal_encoding(1, 64, 5)


@_entry("layers")
def _kv_cache(b):
    from . import layers as L
    rows = _g(27).standard_normal((b, 16))
    cache = L.empty_cache(4 * b, 16, 16)
    c1 = L.append_cache(cache, rows, rows)
    c2 = L.append_cache(c1, rows[:1], rows[:1])
    L.append_cache(c1, rows[:1], rows[:1])           # a branch: copies
    L.cache_values(c2)


@_entry("layers")
def _feed_forward(b):
    from . import layers as L
    from .activations import Activation
    x = _g(28).standard_normal((b, 16, 32))
    w1, w2 = _g(29).standard_normal((64, 32)), _g(30).standard_normal((32, 64))
    L.transformer_feed_forward(Activation.GELU, w1, np.zeros(64), w2, np.zeros(32), x)


@_entry("layers")
def _differentiable_cnn(b):
    """The digits CNN's step (examples/train_digits_cnn.py) with its gradients."""
    from . import autodiff as ad
    from . import layers as L
    from .activations import Activation
    from .rng import RNG
    conv = L.ConvOptions(stride=(1, 1), padding="same", dilation=(1, 1), groups=1)
    g = _g(31)
    x = ad.constant(g.standard_normal((b, 1, 8, 8)))
    w1, b1 = ad.variable(g.standard_normal((16, 1, 3, 3))), ad.variable(np.zeros(16))
    gamma, beta = ad.variable(np.ones(16)), ad.variable(np.zeros(16))
    w2, b2 = ad.variable(g.standard_normal((32, 16, 3, 3))), ad.variable(np.zeros(32))
    w3, b3 = ad.variable(g.standard_normal((10, 128))), ad.variable(np.zeros(10))
    for mode in L.Mode:
        h = L.convolution_ad(conv, x, w1, b1)
        h, _ = L.batch_norm_ad(mode, 0.1, 1e-5, gamma, beta, L.BatchNormState.initial(16), h)
        h = ad.activate(Activation.RELU, h)
        h = L.pooling_ad(L.PoolMode.MAX, (2, 2), (2, 2), (0, 0), h)
        h = L.convolution_ad(conv, h, w2, b2)
        h = ad.activate(Activation.RELU, h)
        h = L.pooling_ad(L.PoolMode.MAX, (2, 2), (2, 2), (0, 0), h)
        h = ad.reshape(h, (b, 128))
        h, _, _ = L.dropout_ad(mode, 0.2, RNG.from_seed(0), h)
        loss = ad.cross_entropy(L.dense_ad(h, w3, b3), np.arange(b) % 10)
        ad.gradients(loss, [w1, b1, gamma, beta, w2, b2, w3, b3])
    # evaluation on constants (no tape): the kernels then see read-only arrays, which
    # numba compiles separately
    consts = [ad.constant(t.value) for t in (w1, b1, gamma, beta, w2, b2)]
    h = L.convolution_ad(conv, x, consts[0], consts[1])
    h, _ = L.batch_norm_ad(L.Mode.INFERENCE, 0.1, 1e-5, consts[2], consts[3],
                           L.BatchNormState.initial(16), h)
    h = L.pooling_ad(L.PoolMode.MAX, (2, 2), (2, 2), (0, 0), ad.activate(Activation.RELU, h))
    ad.activate(Activation.RELU, L.convolution_ad(conv, h, consts[4], consts[5]))


@_entry("layers")
def _differentiable_layers(b):
    from . import autodiff as ad
    from . import layers as L
    from .activations import Activation
    from .rng import RNG
    g = _g(32)
    opts = L.ConvOptions(stride=(1, 1), padding=(1, 1), dilation=(1, 1))
    x = ad.variable(_images(b, c=8))
    outs = [
        L.depthwise_convolution_ad(opts, x, ad.variable(g.standard_normal((8, 1, 3, 3))),
                                   ad.variable(np.zeros(8))),
        L.transposed_convolution_ad((0, 0), L.ConvOptions(stride=(2, 2), padding=(1, 1),
                                                          dilation=(1, 1)),
                                    x, ad.variable(g.standard_normal((8, 4, 4, 4))), None),
        L.pooling_ad(L.PoolMode.AVERAGE, (2, 2), (2, 2), (0, 0), x),
        L.adaptive_pooling_ad(L.PoolMode.MAX, (3, 3), x),
        L.adaptive_pooling_ad(L.PoolMode.AVERAGE, (3, 3), x),
        L.global_pooling_ad(L.PoolMode.MAX, x),
        L.global_pooling_ad(L.PoolMode.AVERAGE, x),
        L.group_norm_ad(4, 1e-5, x),
        L.instance_norm_ad(1e-5, x),
        L.spatial_dropout_ad(L.Mode.TRAINING, 0.25, RNG.from_seed(0), x)[0],
    ]
    for out in outs:
        ad.gradients(ad.sum(out * out), [x])
    w = ad.variable(g.standard_normal((8, 4, 3, 3)))
    ad.gradients(ad.sum(L.weight_norm_ad(0, ad.variable(np.ones(8)), w)), [w])
    table = ad.variable(g.standard_normal((32, 16)))
    ad.gradients(ad.sum(L.embedding_ad(table, np.arange(4 * b) % 32)), [table])


@_entry("layers")
def _differentiable_transformer(b):
    """The character transformer's step (examples/char_transformer.py) with gradients."""
    from . import autodiff as ad
    from . import layers as L
    from .activations import Activation
    g = _g(33)
    s, d, heads, kv_heads = 16, 32, 4, 2
    x = ad.variable(g.standard_normal((b, s, d)))
    gain = ad.variable(np.ones(d))
    h = L.rms_norm_ad(1, 1e-6, x, weight=gain)
    h = h + L.layer_norm_ad(1, 1e-5, x, weight=gain, bias=ad.variable(np.zeros(d)))
    q = ad.transpose(ad.reshape(L.dense_ad(h, ad.variable(g.standard_normal((d, d))), None),
                                (b, s, heads, d // heads)), (0, 2, 1, 3))
    k = ad.transpose(ad.reshape(L.dense_ad(h, ad.variable(g.standard_normal((d // 2, d))),
                                           None), (b, s, kv_heads, d // heads)), (0, 2, 1, 3))
    att = L.scaled_dot_product_attention_ad(q, k, k, is_causal=True, enable_gqa=True)
    att = att + L.scaled_dot_product_attention_ad(q, q, q, L.causal_mask(s, s, 0))
    att = att + L.rotary_embedding_ad(10000.0, 0, q)
    out = ad.reshape(ad.transpose(att, (0, 2, 1, 3)), (b, s, d))
    out = out + L.multihead_attention_ad(heads, h, h, h, is_causal=True)
    w1, w2 = ad.variable(g.standard_normal((64, d))), ad.variable(g.standard_normal((d, 64)))
    out = out + L.transformer_feed_forward_ad(Activation.GELU, w1, ad.variable(np.zeros(64)),
                                              w2, ad.variable(np.zeros(d)), out)
    logits = L.dense_ad(ad.activate(Activation.GELU, out), ad.variable(
        g.standard_normal((10, d))), ad.variable(np.zeros(10)))
    loss = ad.cross_entropy(ad.reshape(logits, (b * s, 10)), np.arange(b * s) % 10)
    ad.gradients(loss, [x, gain, w1, w2])


# --------------------------------------------------------------------------- autodiff
@_entry("autodiff")
def _ops(b):
    from . import autodiff as ad
    from .activations import Activation
    g = _g(34)
    x = ad.variable(np.abs(g.standard_normal((b, 16))) + 0.5)
    w = ad.variable(g.standard_normal((16, 8)))
    y = x @ w
    terms = [ad.sum(ad.exp(x * 0.1)), ad.sum(ad.log(x)), ad.sum(ad.sqrt(x)),
             ad.sum(ad.tanh(y)), ad.mean(y, axis=0), ad.sum(ad.softmax(y)),
             ad.sum(ad.log_softmax(y, axis=0)), ad.cross_entropy(y, np.arange(b) % 8),
             ad.mse(y, np.zeros((b, 8))), ad.sum(ad.transpose(ad.reshape(y, (b, 2, 4))))]
    terms += [ad.sum(ad.activate(act, y)) for act in Activation]
    for act in Activation:      # no tape: read-only arrays, a specialisation of their own
        ad.activate(act, ad.constant(y.value))
    total = terms[0]
    for t in terms[1:]:
        total = total + ad.sum(t)
    grads = ad.gradients(total - x.shape[0] / (1.0 + ad.sum(y * y)), [x, w])
    ad.gradient_norm(grads)
    ad.clip_gradients(1.0, grads)


# --------------------------------------------------------------------------- optim
@_entry("optim")
def _optimizers(b):
    from . import optim
    params = [_g(35).standard_normal((b, 16)), np.zeros(16)]
    grads = [_g(36).standard_normal((b, 16)), np.ones(16)]
    state = optim.sgd_init(params)
    optim.sgd_step(state, params, grads, 0.1)
    optim.sgd_step(state, params, grads, 0.1, momentum=0.0, weight_decay=1e-4)
    state = optim.adamw_init(params)
    optim.adamw_step(state, params, grads, 1e-3)


#: Module names, in table order.
MODULES = list(dict.fromkeys(e.module for e in ENTRIES))


def select(names):
    """The entries for ``names`` (module names or ``module.entry`` keys; empty: all)."""
    if not names:
        return list(ENTRIES)
    chosen, unknown = [], []
    for name in names:
        name = name.strip().removeprefix("hmath_dl.")
        hits = [e for e in ENTRIES if name in (e.module, e.key)]
        if not hits:
            unknown.append(name)
        chosen.extend(e for e in hits if e not in chosen)
    if unknown:
        raise KeyError(", ".join(unknown))
    return chosen


def _progress(entries):
    try:
        from tqdm import tqdm
    except ImportError:
        tqdm = None
    if tqdm is not None:
        bar = tqdm(entries, desc="hmath_dl precompile", unit="entry", file=sys.stderr,
                   dynamic_ncols=True)
        for e in bar:
            bar.set_postfix_str(e.key)
            yield e
        return
    n = len(entries)
    for i, e in enumerate(entries, 1):
        print(f"hmath_dl precompile [{i}/{n}] {e.key}", file=sys.stderr, flush=True)
        yield e


def run(entries, progress=True):
    """Run ``entries`` at both batch sizes; returns ``(seconds per key, failures)``, where
    ``failures`` maps a key to the exception it raised."""
    seconds, failures = {}, {}
    for e in (_progress(entries) if progress else entries):
        t0 = time.perf_counter()
        try:
            for batch in (SMALL, LARGE):
                e.run(batch)
        except Exception as exc:   # report it, compile the rest
            failures[e.key] = exc
        seconds[e.key] = time.perf_counter() - t0
    return seconds, failures


def _cache_dir():
    try:
        from .info import _cache_dir as cache_dir
        return cache_dir()
    except Exception:   # pragma: no cover - informational only
        return "unknown"


def main(argv=None) -> int:
    import argparse

    p = argparse.ArgumentParser(
        prog="python -m hmath_dl.precompile",
        description="Compile hmath_dl's kernels into Numba's on-disk cache ahead of time.")
    p.add_argument("modules", nargs="*", metavar="module",
                   help=f"modules ({', '.join(MODULES)}) or module.entry keys (--list)")
    p.add_argument("--all", action="store_true", help="every module (the default)")
    p.add_argument("--list", action="store_true", help="print the entries and exit")
    p.add_argument("--report", action="store_true",
                   help="also print the seconds per entry and the slowest kernels to compile")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    args = p.parse_args(sys.argv[1:] if argv is None else argv)
    try:
        entries = select([] if args.all else args.modules)
    except KeyError as exc:
        p.print_usage(sys.stderr)
        print(f"{p.prog}: unknown module or entry: {exc.args[0]} (known: "
              f"{', '.join(MODULES)}; --list shows the entries)", file=sys.stderr)
        return 2
    if args.list:
        for e in entries:
            print(e.key)
        return 0

    from ._kernels._jit import compile_watch
    compile_watch.quiet = True      # the progress bar says it: no first-run notice
    started = time.perf_counter()
    seconds, failures = run(entries, progress=not args.no_progress)
    wall = time.perf_counter() - started
    for key, exc in failures.items():
        print(f"hmath_dl precompile: {key} failed: {type(exc).__name__}: {exc}",
              file=sys.stderr)
    if args.report:
        print("seconds per entry (both batch sizes):")
        for key, s in sorted(seconds.items(), key=lambda kv: -kv[1]):
            print(f"  {s:7.2f}  {key}")
        print("slowest kernels to compile (seconds, without the helpers they compile):")
        for name, s in sorted(compile_watch.seconds.items(), key=lambda kv: -kv[1])[:25]:
            print(f"  {s:7.2f}  {name}")
    modules = ", ".join(dict.fromkeys(e.module for e in entries))
    print(f"hmath_dl precompile: {len(entries) - len(failures)}/{len(entries)} entries "
          f"({modules}) in {wall:.1f} s, {compile_watch.total:.1f} s of it compiling "
          f"{len(compile_watch.seconds)} kernels; cache {_cache_dir()}")
    return 1 if failures else 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
