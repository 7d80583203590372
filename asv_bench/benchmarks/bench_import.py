"""Import time and first-call (JIT compile) time, each in a fresh interpreter."""


def timeraw_import_hmath_dl():
    """`import hmath_dl` and its public modules: must compile nothing."""
    return """
    import hmath_dl, hmath_dl.precision, hmath_dl.layers, hmath_dl.activations
    import hmath_dl.autodiff, hmath_dl.optim
    """


def timeraw_import_numba_only():
    """Baseline: what importing numba alone costs."""
    return "import numba"


class FirstCall:
    """First call of a kernel with the on-disk cache switched off (pure compile time) and
    with it on (load from cache; the setup run fills it)."""

    params = [["layer_norm", "convolution", "int8_gemm", "reduced_gemm", "attention"], [False, True]]
    param_names = ["kernel", "cached"]
    timeout = 300

    _calls = {
        "layer_norm": "from hmath_dl.layers import layer_norm; layer_norm(1, 1e-5, np.ones((2, 3)))",
        "convolution": ("from hmath_dl.layers import ConvOptions, convolution; "
                        "convolution(ConvOptions((1,), (0,), (1,)), np.ones((1, 1, 4)), np.ones((1, 1, 2)), None)"),
        "int8_gemm": ("from hmath_dl.precision import quantize, int8_gemm, Quantization as Q; "
                      "int8_gemm(quantize(Q.SYMMETRIC, None, np.ones((2, 2))), quantize(Q.SYMMETRIC, None, np.ones((2, 2))))"),
        "reduced_gemm": ("from hmath_dl.precision import reduced_gemm, Precision; "
                         "reduced_gemm(Precision.BF16, np.ones((2, 2)), np.ones((2, 2)))"),
        "attention": ("from hmath_dl.layers import scaled_dot_product_attention as s; "
                      "s(np.ones((2, 2)), np.ones((2, 2)), np.ones((2, 2)))"),
    }

    def setup(self, kernel, cached):
        if cached:  # make sure the cache is populated
            import subprocess
            import sys
            subprocess.run([sys.executable, "-c", "import numpy as np; " + self._calls[kernel]], check=True)

    def timeraw_first_call(self, kernel, cached):
        prefix = "" if cached else "import os; os.environ['HMATH_DL_NO_CACHE'] = '1'\n"
        return prefix + "import numpy as np\n" + self._calls[kernel]
