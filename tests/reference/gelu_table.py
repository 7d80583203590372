"""Regenerates the polynomial coefficients of the GELU kernel (hmath_dl/_kernels/elementwise.py,
``_gelu_span``) with mpmath; run ``python -m tests.reference.gelu_table`` and compare the
printed numbers with the kernel's literals.  Not imported by the tests.

* Q(y) = erfc(a) exp(a^2) / t with t = 1/(1 + a/2) = (7y + 8)/15, y in [-1, 1]
  (a in [0, 28]): Chebyshev fit with 28 coefficients (degree 27).
* S(u) = GELU'(v) / (v - v0), v = (u - 3)/4 in [-1, -0.5], v0 the zero of
  GELU'(v) = Phi(v) + v phi(v): 15 coefficients (degree 14).

Both are evaluated in the kernel by Estrin's scheme: pairs ``c[2k] + c[2k+1] y``,
then combined with y^2, y^4, y^8, y^16.
"""

import mpmath as mp


def q_coefficients():
    mp.mp.dps = 50

    def q(y):
        t = (7 * y + 8) / 15
        a = 2 * (1 / t - 1)
        return mp.erfc(a) * mp.exp(a * a) / t

    poly, err = mp.chebyfit(q, [-1, 1], 28, error=True)
    return [float(p) for p in poly][::-1], float(err)  # lowest degree first


def s_coefficients():
    mp.mp.dps = 50

    def d(v):
        return mp.ncdf(v) + v * mp.npdf(v)

    v0 = mp.findroot(d, -0.75)

    def s(u):
        v = (u - 3) / 4
        return d(v) / (v - v0)

    poly, err = mp.chebyfit(s, [-1, 1], 15, error=True)
    v0_hi = float(v0)
    return [float(p) for p in poly][::-1], float(err), v0_hi, float(v0 - v0_hi)


if __name__ == "__main__":
    cq, eq = q_coefficients()
    print("Q (lowest degree first), fit error", eq)
    print(", ".join(repr(c) for c in cq))
    cs, es, hi, lo = s_coefficients()
    print("S (lowest degree first), fit error", es, "v0 =", repr(hi), "+", repr(lo))
    print(", ".join(repr(c) for c in cs))
