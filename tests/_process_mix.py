"""Worker functions for tests/test_processes.py: a mix of parallel kernels large enough
to take the parallel (not the serial-twin) path.  An importable module, so that spawned
workers can unpickle them."""
import hashlib
import numpy as np

def mix():
    from hmath_dl import layers as L
    from hmath_dl import precision as P
    from hmath_dl.activations import Activation, activate
    g = np.random.default_rng(5)
    x4 = g.standard_normal((4, 8, 32, 32))
    w = g.standard_normal((8, 8, 3, 3))
    seq = g.standard_normal((4, 64, 16))
    a, b = g.standard_normal((96, 80)), g.standard_normal((80, 48))
    opts = L.ConvOptions((1, 1), (1, 1), (1, 1), 1)
    outs = [
        L.convolution(opts, x4, w, None),
        L.layer_norm(1, 1e-5, x4),
        L.group_norm(4, 1e-5, x4),
        L.pooling(L.PoolMode.MAX, (3, 3), (2, 2), (1, 1), x4),
        L.scaled_dot_product_attention(seq, seq, seq, L.causal_mask(64, 64, 0), None)[0],
        P.int8_gemm(P.quantize(P.Quantization.SYMMETRIC, 0, a),
                    P.quantize(P.Quantization.ASYMMETRIC, 1, b)),
        P.reduced_gemm(P.Precision.BF16, a, b),
        P.round_to_bits(P.Precision.FP16, x4),
        activate(Activation.GELU, x4),
    ]
    h = hashlib.sha256()
    for o in outs:
        h.update(np.ascontiguousarray(o).tobytes())
    return h.hexdigest()

def work(i):
    import os
    from hmath_dl import _threads
    return mix(), _threads.serial_only(), os.getpid()
