"""The library's own float64 GEMM (issue 14 item 4): every output one fma chain over k in
order from +0.0, on every path (register-tiled, portable rows, serial twins), every
shape remainder, and in `dense`, the autodiff's `@` and the dense/convolution gradients."""

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hmath_dl import autodiff as ad
from hmath_dl._kernels import gemm_f64 as G
from hmath_dl._kernels._jit import forced_schedule, runs_serial
from hmath_dl.layers import dense
from tests.helpers import ROOT
from tests.reference import gemm as ref


def _rnd(shape, seed):
    return np.random.default_rng(seed).standard_normal(shape)


@settings(max_examples=40, deadline=None)
@given(M=st.integers(1, 20), K=st.integers(0, 40), N=st.integers(1, 45), seed=st.integers(0, 99))
def test_every_path_equals_the_fma_chain_oracle(M, K, N, seed):
    a, b = _rnd((M, K), seed), _rnd((K, N), seed + 1)
    want = ref.matmul_2d(a, b).tobytes()
    assert G.matmul(a, b, tiled=False).tobytes() == want
    assert G.matmul(a, b, tiled=True).tobytes() == want
    bt = np.ascontiguousarray(b.T).T          # b as the transpose of a C array (dense's w.T)
    assert G.matmul(a, bt, tiled=True).tobytes() == want
    at = np.ascontiguousarray(a.T).T          # a likewise (x.T in a weight gradient)
    assert G.matmul(at, b, tiled=True).tobytes() == want
    assert G.matmul(at, bt, tiled=True).tobytes() == want
    assert G.matmul(at, bt, tiled=False).tobytes() == want


@pytest.mark.parametrize("M,K,N", [(6, 300, 32), (13, 257, 33), (97, 130, 300), (200, 600, 70),
                                   (373, 300, 450)])
def test_tiled_parallel_serial_and_rows_agree(M, K, N):
    """Shapes past one K chunk, one row panel and one column panel (parallel kernel) agree
    with the serial twin and the portable kernel, bit for bit.  (373, 300, 450): several
    row panels with a row-edge block and a column-edge tile (b packed: 450 columns are
    not whole vectors)."""
    a, b = _rnd((M, K), 1), _rnd((K, N), 2)
    tiled = G.matmul(a, b, tiled=True)
    assert tiled.tobytes() == G.matmul(a, b, tiled=False).tobytes()
    with forced_schedule("serial"):       # everything serial
        assert G.matmul(a, b, tiled=True).tobytes() == tiled.tobytes()
    with forced_schedule("parallel"):     # everything parallel
        assert G.matmul(a, b, tiled=True).tobytes() == tiled.tobytes()
    assert np.allclose(tiled, a @ b, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("threads", [1, 2, 3])
@pytest.mark.parametrize("M,K,N", [(32, 70, 144), (13, 40, 33), (7, 9, 100), (150, 20, 10),
                                   (6, 5, 32), (66, 140, 56), (90, 30, 392)])
def test_small_products_cut_into_more_tasks_keep_their_bits(M, K, N, threads):
    """A parallel product too small for one task per thread is cut into smaller panels
    (``_tasks``), with a task count that is a multiple of the threads where that takes
    fewer than 8 tasks per thread: every output still written once, by its one chain,
    whatever the cut (and the last tile's narrower micro-kernel: 144, 56, 392 columns
    leave 16, 24 and 8 columns there)."""
    import numba
    a, b = _rnd((M, K), 3), _rnd((K, N), 4)
    want = ref.matmul_2d(a, b).tobytes()
    old = numba.get_num_threads()
    numba.set_num_threads(min(threads, numba.config.NUMBA_NUM_THREADS))
    try:
        nmb, ntile = -(-M // G._CB), -(-N // G.tile_width(N))
        pm, pn, tasks = G._tasks(M, N, G.tile_width(N), 1, threads)
        assert 1 <= pm <= nmb and 1 <= pn <= ntile and tasks == pm * pn
        assert tasks >= min(G._TASKS_PER_THREAD * threads if threads > 1 else 1, nmb * ntile)
        assert tasks % threads == 0 or tasks >= 8 * threads or tasks == nmb * ntile
        with forced_schedule("parallel"):
            out = np.full((M, N), np.nan)
            assert G.matmul(a, b, out=out, tiled=True).tobytes() == want
    finally:
        numba.set_num_threads(old)


@pytest.mark.parametrize("threads", [2, 3])
def test_tasks_numbered_column_panel_first_keep_their_bits(threads):
    """A parallel product cut into row and column panels whose ``b`` is the larger
    operand numbers its tasks column panel first (``_column_major``: each thread's share
    then reads its own columns of ``b``, which ``_pack_bt`` packed tile-major on that
    thread): every output still written once, by its one chain, as a row-major numbering
    and a serial run give."""
    import numba
    M, K, N = 100, 10, 1100
    a, bt = _rnd((M, K), 5), _rnd((N, K), 6)
    want = ref.matmul_2d(a, np.ascontiguousarray(bt.T)).tobytes()
    old = numba.get_num_threads()
    numba.set_num_threads(min(threads, numba.config.NUMBA_NUM_THREADS))
    try:
        T = G.tile_width(N)
        pm, pn, _ = G._tasks(M, N, T, 1, threads)
        assert pm > 1 and pn > 1 and pm != pn      # (a swapped decoding shows)
        assert G._column_major(M, N, K, T, 1, threads, False)
        assert not G._column_major(M, N, K, T, 1, threads, True)       # serial: no order
        assert not G._column_major(N, M, K, T, 1, threads, False)      # a the larger
        for schedule in ("parallel", "serial"):
            with forced_schedule(schedule):
                out = np.full((M, N), np.nan)
                assert G.matmul(a, bt.T, out=out, tiled=True).tobytes() == want
    finally:
        numba.set_num_threads(old)


def test_forced_schedule_overrides_the_work_size_choice():
    """The one package-level serial/parallel switch: forced_schedule decides for every
    launch (Kernel.sized, launchers with their own threshold) and restores the policy."""
    k = G.gemm_rows
    with forced_schedule("serial"):
        assert k.sized(1 << 62) is k.serial
        assert runs_serial(False)
    with forced_schedule("parallel"):
        assert k.sized(0) is k.parallel
        assert not runs_serial(True)
        with forced_schedule(None):
            assert runs_serial(True) and not runs_serial(False)
        assert not runs_serial(True)
    assert runs_serial(True) and not runs_serial(False)
    with pytest.raises(ValueError, match="schedule 'fast' is not one of"):
        with forced_schedule("fast"):
            pass


def test_dense_is_the_chain_then_the_bias():
    x, w, b = _rnd((7, 19), 3), _rnd((11, 19), 4), _rnd(11, 5)
    want = ref.matmul_2d(x, w.T) + b
    assert dense(x, w, b).tobytes() == want.tobytes()
    x3 = _rnd((2, 3, 19), 6)
    assert dense(x3, w, None).tobytes() == ref.matmul(x3, w.T).tobytes()


@pytest.mark.parametrize("M,K,N", [(24, 64, 64), (25, 130, 70), (64, 64, 16), (61, 7, 256),
                                   (12, 300, 33)])
@pytest.mark.parametrize("schedule", ["serial", "parallel"])
def test_bias_and_nonfinite_count_of_every_tile(M, K, N, schedule):
    """``gemm``'s epilogue -- ``+ bias`` per column (``bias_axis`` 1) or per row (0), one
    rounding after the chain, and the exact number of non-finite outputs -- for interior
    tiles (finished in registers when the tiles are the widest) and edge tiles (finished
    after the product): against the chain oracle plus the bias (inf, -inf, NaN and -0.0
    in the bias) and numpy's count; with NaN/inf in ``a`` and ``b``, against the portable
    path (its bias added and its outputs counted by numpy)."""
    a, b = _rnd((M, K), M), _rnd((K, N), N)
    a[0, :] = 0.0                                  # row 0: +0.0 chains (+ -0.0 bias below)
    chains = ref.matmul_2d(a, b)
    for axis, n in ((1, N), (0, M)):
        bias = _rnd(n, 7)
        bias[0] = -0.0
        bias[n - 1] = np.inf                       # a column / row in the last tile / block
        bias[n // 2] = np.nan
        bias[min(n - 1, 5)] = -np.inf              # in the first tile / block
        want = chains + (bias if axis == 1 else bias[:, None])
        with forced_schedule(schedule):
            got, bad = G.gemm(a, b, bias=bias, bias_axis=axis)
        assert got.tobytes() == want.tobytes(), axis
        assert bad == want.size - np.count_nonzero(np.isfinite(want)), axis
    with forced_schedule(schedule):
        got, bad = G.gemm(a, b)                    # the count alone
        assert G.gemm(a, b, count=False)[1] == 0   # neither: not counted
    assert got.tobytes() == chains.tobytes() and bad == 0
    a[M // 2, 3] = np.nan                          # a row of NaN outputs
    b[1, N - 1] = np.inf                           # a column (the last tile) of inf/NaN
    b[2, min(N - 1, 5)] = -np.inf                  # a column in the first tile
    bias = _rnd(N, 8)
    with np.errstate(invalid="ignore", over="ignore"):
        want = G.gemm(a, b, tiled=False, bias=bias)[0]
    with forced_schedule(schedule):
        got, bad = G.gemm(a, b, bias=bias)
    assert got.tobytes() == want.tobytes()
    assert 0 < bad == want.size - np.count_nonzero(np.isfinite(want))


def test_dense_gradients_use_the_same_chains():
    from hmath_dl.layers import dense_ad
    x, w, b = _rnd((5, 9), 7), _rnd((4, 9), 8), _rnd(4, 9)
    xv, wv, bv = ad.variable(x), ad.variable(w), ad.variable(b)
    g = _rnd((5, 4), 10)
    gx, gw, gb = ad.gradients(dense_ad(xv, wv, bv), [xv, wv, bv], cotangent=g)
    assert gx.tobytes() == ref.matmul_2d(g, w).tobytes()
    assert gw.tobytes() == ref.matmul_2d(g.T, x).tobytes()


def test_signed_zeros_and_empty_inner_dimension():
    a = np.array([[-0.0, 1.0]])
    b = np.array([[1.0], [-0.0]])
    got = G.matmul(a, b, tiled=True)
    assert got.tobytes() == ref.matmul_2d(a, b).tobytes()
    assert G.matmul(np.ones((3, 0)), np.ones((0, 4))).tobytes() == np.zeros((3, 4)).tobytes()


def test_same_bits_compiled_for_avx2_and_baseline():
    code = textwrap.dedent("""
        import hashlib, sys
        import numpy as np
        from hmath_dl._kernels import gemm_f64 as G
        h = hashlib.sha256()
        for M, K, N in [(1, 5, 3), (7, 300, 33), (64, 129, 100), (130, 64, 257)]:
            a = np.random.default_rng(M).standard_normal((M, K))
            b = np.random.default_rng(N).standard_normal((K, N))
            h.update(G.matmul(a, b).tobytes())
            h.update(G.matmul(a, np.ascontiguousarray(b.T).T).tobytes())
            h.update(G.matmul(np.ascontiguousarray(a.T).T, b).tobytes())
        print(h.hexdigest())
    """)

    def run(**extra):
        env = {k: v for k, v in os.environ.items()
               if k not in ("NUMBA_CPU_NAME", "NUMBA_CPU_FEATURES", "HMATH_DL_KERNELS")}
        env.update(extra, PYTHONPATH=ROOT)
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                             text=True, timeout=900)
        assert out.returncode == 0, out.stderr[-3000:]
        return out.stdout
    from hmath_dl._kernels._cpu import target_environment
    host = run()
    assert run(**target_environment("generic")) == host
    assert run(HMATH_DL_KERNELS="portable") == host
    import llvmlite.binding as llb
    feats = llb.get_host_cpu_features()
    if not (feats.get("avx2") and feats.get("fma")):
        pytest.skip("host cannot execute AVX2 code (haswell target not run)")
    assert run(**target_environment("haswell")) == host


def test_packing_compiles_one_specialisation_for_writable_and_read_only_operands():
    # the packs only read their source: the GEMM hands them read-only views, so a
    # writable and a read-only operand (the autodiff's tape values) share one compiled
    # specialisation (in a fresh process: other tests call the packs directly)
    code = textwrap.dedent("""
        import numpy as np
        from hmath_dl._kernels import gemm_f64 as G
        rng = np.random.default_rng(0)
        # serial and parallel packs; a read in place (row-major, and transposed with
        # M = 7, 300, 13) or packed (transposed, columns 4 KiB apart: M = 512), and
        # _pack_a by the non-contiguous a below
        for M, K, N in [(7, 30, 33), (300, 300, 300), (13, 512, 40), (512, 30, 20)]:
            a = rng.standard_normal((M, K))
            b = rng.standard_normal((K, N))
            ra, rb = a.copy(), b.copy()
            ra.flags.writeable = rb.flags.writeable = False
            want = G.matmul(a, b)
            for x, y in ((ra, rb), (a, np.ascontiguousarray(b.T).T),
                         (np.ascontiguousarray(ra.T).T, rb)):
                assert G.matmul(x, y).tobytes() == want.tobytes()
            for x in (a, ra):          # the transposed views of writable / read-only arrays
                xt = np.ascontiguousarray(x.T)
                xt.flags.writeable = x.flags.writeable
                assert G.matmul(xt.T, b).tobytes() == want.tobytes()
                assert G.matmul(a, np.ascontiguousarray(b.T).T).tobytes() == want.tobytes()
            for x in (a, ra):          # a strided view (neither layout): packed by _pack_a
                nc = np.repeat(x, 2, axis=1)[:, ::2]
                nc.flags.writeable = x.flags.writeable
                assert not nc.flags.c_contiguous and not nc.T.flags.c_contiguous
                assert G.matmul(nc, b).tobytes() == want.tobytes()
        for k in (G._pack_a, G._pack_b, G._pack_at, G._pack_bt, G.gemm_tiled):
            for sig in k.span.signatures:   # span kernels: one compilation for both paths
                print(k.__name__, sig[0].mutable)
    """)
    env = dict(os.environ, PYTHONPATH=ROOT)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                         text=True, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    lines = out.stdout.split()
    names = lines[0::2]
    assert sorted(names) == ["_pack_a", "_pack_at", "_pack_b", "_pack_bt", "gemm_tiled"]
    assert set(lines[1::2]) == {"False"}, out.stdout      # every source typed read-only


@pytest.mark.parametrize("K,N", [(1, 5), (64, 20011), (65, 37), (130, 7), (7, 1000),
                                 (4096, 16), (1027, 33)])
def test_panel_packing_is_the_documented_layout(K, N):
    """_pack_b (and _pack_bt from b's transpose): b [K, N] -> [ceil(N/T), K, T] (zero
    columns past N); _pack_at: a [M, K]
    given as at [K, M] -> [ceil(M/6), K, 6] (zero rows past M); parallel (chunks of rows
    x tiles or blocks, also for a short operand) and serial alike, against numpy."""
    from hmath_dl._kernels import gemm_f64 as G
    rng = np.random.default_rng(K * N)
    b = rng.standard_normal((K, N))
    T = G.tile_width(N)
    want = np.zeros((-(-N // T), K, T))
    for t in range(want.shape[0]):
        seg = b[:, t * T:(t + 1) * T]
        want[t, :, :seg.shape[1]] = seg
    bt = b.T.copy()         # _pack_bt: the same panels from b's transpose
    for schedule in ("parallel", "serial"):
        got = np.full(want.size, np.nan)
        with forced_schedule(schedule):
            G._pack_b(b, got, K, T)
        assert got.tobytes() == want.reshape(-1).tobytes()
        for tile_major in (False, True):     # the two orders of its tasks
            got = np.full(want.size, np.nan)
            with forced_schedule(schedule):
                G._pack_bt(bt, got, K, T, tile_major)
            assert got.tobytes() == want.reshape(-1).tobytes()
    at = b.T.copy() if N < 2000 else b[:, :300].T.copy()        # at [K', M]: M = K here
    kk, m = at.shape
    want = np.zeros((-(-m // 6), kk, 6))
    for blk in range(want.shape[0]):
        seg = at[:, blk * 6:(blk + 1) * 6]
        want[blk, :, :seg.shape[1]] = seg
    for schedule in ("parallel", "serial"):
        got = np.full(want.size, np.nan)
        with forced_schedule(schedule):
            G._pack_at(at, got, kk)
        assert got.tobytes() == want.reshape(-1).tobytes()


def test_a_read_in_place_and_an_output_over_it():
    """``a`` is read where it lies (row-major, or the transpose of a row-major array,
    with a packed row-edge block) -- and packed when the output overlaps it."""
    for M, K in [(6, 7), (13, 40), (100, 64), (31, 512)]:
        a, b = _rnd((M, K), M), _rnd((K, K), K)
        want = ref.matmul_2d(a, b).tobytes()
        assert G.matmul(a, b, tiled=True).tobytes() == want
        assert G.matmul(np.ascontiguousarray(a.T).T, b, tiled=True).tobytes() == want
        inplace = a.copy()
        G.matmul(inplace, b, out=inplace, tiled=True)
        assert inplace.tobytes() == want


def test_row_strides_of_b_in_l1_set_groups():
    """``_set_groups``: rows a multiple of 64 bytes apart fall into ``64 / gcd(rows/8,
    64)`` groups of L1 sets; any other stride spreads over all 64."""
    for n, groups in [(8, 64), (24, 64), (64, 8), (128, 4), (192, 8), (256, 2), (512, 1),
                      (1024, 1), (520, 64), (100, 64)]:
        assert G._set_groups(n) == groups, n


@pytest.mark.parametrize("M,K,N", [(6, 7, 16), (13, 300, 40), (40, 257, 24), (100, 64, 96),
                                   (257, 40, 24), (300, 20, 64), (7, 1100, 8),
                                   # rows of b 1-4 KiB apart: each tile's chunk copied
                                   (7, 130, 128), (13, 66, 256), (6, 20, 512)])
def test_b_read_in_place_or_packed_gives_the_oracle_bits(M, K, N, monkeypatch):
    """A row-major ``b`` whose rows are whole vectors is read where it lies when few
    blocks of ``a`` reuse it (:func:`gemm_f64.b_in_place`) and packed otherwise: the same
    chains either way, with K past one chunk, row and column edges, ``a`` in place or
    transposed, read-only operands, and an output over ``b`` (then packed)."""
    a, b = _rnd((M, K), M + K), _rnd((K, N), N)
    want = ref.matmul_2d(a, b).tobytes()
    at = np.ascontiguousarray(a.T).T
    rb = b.copy()
    rb.flags.writeable = False
    vw = G._VW
    expect_in_place = N % vw == 0 and (M <= (192 if vw >= 8 else 64)
                                       or (vw >= 8 and K * N <= 1 << 16))
    assert G.b_in_place(b, M, N, K) == expect_in_place
    if N >= 128:        # the chunk copy (rows crowd into a few L1 sets) runs these
        assert G._KC_IN_PLACE > G._LINES_PER_SET * G._set_groups(N)
    for flag in (True, False):
        monkeypatch.setattr(G, "B_IN_PLACE", flag)
        assert G.b_in_place(b, M, N, K) == (flag and expect_in_place)
        assert G.matmul(a, b, tiled=True).tobytes() == want
        assert G.matmul(at, rb, tiled=True).tobytes() == want
        with forced_schedule("serial"):
            assert G.matmul(a, b, tiled=True).tobytes() == want
    # an output that is b itself (a square b): packed first, so still the chains
    monkeypatch.setattr(G, "B_IN_PLACE", True)
    sq, a_sq = _rnd((24, 24), N), _rnd((24, 24), N + 1)
    assert G.b_in_place(sq, 24, 24, 24)
    want_sq = ref.matmul_2d(a_sq, sq).tobytes()
    over = sq.copy()
    G.matmul(a_sq, over, out=over, tiled=True)
    assert over.tobytes() == want_sq


def test_b_in_place_bounds():
    """The bounds of :func:`gemm_f64.b_in_place` for a ``b`` of more than 64 Ki elements:
    at most 192 rows of ``a`` on 8-lane targets, 64 on narrower ones; rows that are not
    whole vectors, or a ``b`` that is not row-major, are always packed."""
    b = np.empty((260, 256))
    most = 192 if G._VW >= 8 else 64
    assert G.b_in_place(b, most, 256, 260)
    assert not G.b_in_place(b, most + 1, 256, 260)
    assert not G.b_in_place(np.empty((260, 258)), 8, 258, 260)
    assert not G.b_in_place(np.empty((256, 260)).T, 8, 256, 260)
    if G._VW >= 8:     # a small b (at most 64 Ki elements) is read in place for any M
        assert G.b_in_place(np.empty((256, 256)), 5000, 256, 256)


def test_workspaces_above_the_cap_come_from_the_pool(monkeypatch):
    """A packing workspace above ``_WS_MAX`` is not kept per thread but leased from the
    output pool of ``hmath_dl._alloc``: 64-byte aligned, and once the last view of it is
    gone the next request of that size gets the same (already faulted-in) memory back."""
    from hmath_dl import _alloc

    if not _alloc._enabled:
        pytest.skip("the pool is off (HMATH_DL_MALLOC=system): plain memory instead")
    monkeypatch.setattr(G, "_WS_MAX", 1 << 10)
    monkeypatch.setattr(_alloc, "POOL_FROM", 1 << 12)
    n = 5003
    w = G._workspace("test-pooled", n)
    assert w.shape == (n,) and w.dtype == np.float64 and w.ctypes.data % 64 == 0
    base = w
    while base is not None and not isinstance(base, _alloc.Lease):
        base = base.base
    assert isinstance(base, _alloc.Lease)
    w[:] = 1.0
    addr = w.ctypes.data
    del w, base
    again = G._workspace("test-pooled", n)
    assert again.ctypes.data == addr
