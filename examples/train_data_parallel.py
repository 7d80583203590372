"""Train a small CNN on the digits data-parallel on a Dask cluster, bit for bit reproducibly.

Each step cuts the mini-batch into fixed shards of ``--shard-size`` examples and calls
``hmath_dl.distributed.data_parallel_gradients``: the workers of a
``dask.distributed.LocalCluster(n_workers=W, threads_per_worker=1, processes=True)``
compute each shard's summed loss and gradients, the caller combines them in a fixed
pairwise tree and divides by the batch size, and AdamW (``hmath_dl.optim``) updates the
float64 weights.  ``--workers 0`` computes the shards in this process instead.

At the end the script trains again with ``--workers 0`` and with every count in
``--compare`` (each run on its own fresh cluster) and checks that the final weights of all
runs are bitwise identical; it prints ``bitwise identical: True`` (exit status 0) or
``False`` (exit status 1), and the mean step time of each run (compilation excluded: a
warm-up call runs first), so "W workers vs in process" can be read off.

Model: conv 1->16 k3 p1, ReLU, max-pool 2, conv 16->32 k3 p1, ReLU, max-pool 2, dense
128->10, cross-entropy.  (The model of ``train_digits_cnn.py`` is not reused: its batch-norm
running statistics and its dropout RNG are state that a ``loss_fn`` returning only the loss
cannot carry, and per-shard batch statistics would make the gradient depend on the shard
size in a second way.)  Data: ``sklearn.datasets.load_digits`` (1,797 8x8 images, no
download), 80/20 train/test split.

Each shard on a worker runs with ``max(1, cpu_count // W)`` Numba threads (see
``ShardLoss``), so W worker processes do not oversubscribe the cores; the bits do not
depend on it.  (Not through ``LocalCluster(env={"NUMBA_NUM_THREADS": ...})``: a worker
applies that only after re-importing this script, and so Numba, and a kernel compiled
later then fails with "Cannot set NUMBA_NUM_THREADS ... once the threads have been
launched".)

Run:  python examples/train_data_parallel.py --workers 2 --compare 1   (a few minutes on 2 cores)
      python examples/train_data_parallel.py --smoke --workers 1 --compare 2   (for the tests)
Needs:  pip install "hmath_dl[dask]" scikit-learn tqdm
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

from hmath_dl import RNG, optim
from hmath_dl import autodiff as ad
from hmath_dl import layers as L
from hmath_dl.activations import Activation
from hmath_dl.distributed import data_parallel_gradients

CONV = L.ConvOptions(stride=(1, 1), padding=(1, 1), dilation=(1, 1), groups=1)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workers", type=int, default=2,
                   help="Dask worker processes (0: compute the shards in this process)")
    p.add_argument("--compare", default="1",
                   help="comma-separated worker counts to rerun and compare bit for bit "
                        "(a --workers 0 run is always compared; '' for none)")
    p.add_argument("--epochs", type=int, default=8)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--shard-size", type=int, default=64,
                   help="examples per shard (fixes the reduction order: same for every run)")
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--weight-decay", type=float, default=1e-4)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--smoke", action="store_true", help="a few steps on small data (for tests)")
    p.add_argument("--no-progress", action="store_true")
    args = p.parse_args(argv)
    if args.workers < 0:
        p.error("--workers must be >= 0")
    try:
        args.compare = [int(c) for c in args.compare.split(",") if c.strip()]
    except ValueError:
        p.error(f"--compare must be comma-separated integers (got {args.compare!r})")
    if any(c < 0 for c in args.compare):
        p.error("--compare counts must be >= 0")
    if args.smoke:
        args.epochs, args.batch, args.shard_size = 1, 64, 16
    return args


# ----------------------------------------------------------------------------- model
def load_data(rng, smoke=False):
    from sklearn.datasets import load_digits

    digits = load_digits()
    x = (digits.images / 16.0).reshape(-1, 1, 8, 8)
    y = digits.target.astype(np.int64)
    order, rng = rng.draw(lambda g: g.permutation(len(y)))
    if smoke:
        order = order[:320]
    cut = int(0.8 * len(order))
    train, test = order[:cut], order[cut:]
    return (x[train], y[train]), (x[test], y[test]), rng


def init_params(rng):
    w1, rng = L.initialize_weights(L.KaimingNormal(), 9, 16 * 9, (16, 1, 3, 3), rng)
    w2, rng = L.initialize_weights(L.KaimingNormal(), 16 * 9, 32 * 9, (32, 16, 3, 3), rng)
    w3, rng = L.initialize_weights(L.XavierUniform(), 128, 10, (10, 128), rng)
    return [w1, np.zeros(16), w2, np.zeros(32), w3, np.zeros(10)], rng


def logits_of(weights, x):
    """Logits [B, 10] of images x [B, 1, 8, 8] (weights: ADTensors)."""
    w1, b1, w2, b2, w3, b3 = weights
    h = ad.activate(Activation.RELU, L.convolution_ad(CONV, ad.constant(x), w1, b1))
    h = L.pooling_ad(L.PoolMode.MAX, (2, 2), (2, 2), (0, 0), h)
    h = ad.activate(Activation.RELU, L.convolution_ad(CONV, h, w2, b2))
    h = L.pooling_ad(L.PoolMode.MAX, (2, 2), (2, 2), (0, 0), h)
    return L.dense_ad(ad.reshape(h, (x.shape[0], 128)), w3, b3)


class ShardLoss:
    """``loss_fn``: the SUM of the shard's per-example cross-entropies (cross_entropy is
    a mean, hence ``* len(y)``).

    ``numba_threads`` (workers only) caps the Numba threads of the thread computing the
    shard (``numba.set_num_threads`` is per calling thread), so W worker processes share
    the cores instead of each starting one thread per core; the bits do not depend on it.
    Defined at module level, so it pickles for the workers (by value when this file runs
    as a script: the workers need nothing but hmath_dl installed).
    """

    def __init__(self, numba_threads=None):
        self.numba_threads = numba_threads

    def __call__(self, params_ad, x, y):
        if self.numba_threads is not None:
            import numba

            numba.set_num_threads(max(1, min(self.numba_threads, numba.config.NUMBA_NUM_THREADS)))
        return ad.cross_entropy(logits_of(params_ad, x), y) * float(len(y))


def accuracy(params, x, y, batch=512):
    weights = [ad.constant(p) for p in params]
    correct = 0
    for i in range(0, len(y), batch):
        logits = logits_of(weights, x[i:i + batch]).value
        correct += int((np.argmax(logits, axis=1) == y[i:i + batch]).sum())
    return correct / len(y)


# ----------------------------------------------------------------------------- engines
def start_client(workers):
    """(client, cluster) for ``workers`` > 0 worker processes, (None, None) for 0."""
    if workers == 0:
        return None, None
    import logging

    import dask
    from distributed import Client, LocalCluster  # (loads distributed's config defaults)

    # Dask's nanny starts workers with MALLOC_TRIM_THRESHOLD_=65536, which also freezes
    # glibc's mmap threshold at 128 KiB: every large temporary of a step is then a fresh
    # mmap + page faults (a shard's forward/backward ~2x slower).  Keep its other settings
    # (OMP/MKL/OPENBLAS_NUM_THREADS=1) and drop that one.
    environ = dict(dask.config.get("distributed.nanny.pre-spawn-environ", {}) or {})
    environ.pop("MALLOC_TRIM_THRESHOLD_", None)
    saved = dict(os.environ)  # the nanny writes its pre-spawn environment into ours
    try:
        with dask.config.set({"distributed.nanny.pre-spawn-environ": environ}):
            cluster = LocalCluster(n_workers=workers, threads_per_worker=1, processes=True,
                                   dashboard_address=None, silence_logs=logging.ERROR)
    finally:
        os.environ.clear()
        os.environ.update(saved)
    return Client(cluster), cluster


def train(args, workers, label):
    """Train from scratch with ``workers`` (0: in process); returns a result dict."""
    from tqdm import tqdm

    rng = RNG.from_seed(args.seed)
    (xtr, ytr), (xte, yte), rng = load_data(rng, args.smoke)
    params, rng = init_params(rng)
    opt = optim.adamw_init(params)
    steps_per_epoch = -(-len(ytr) // args.batch)
    if args.smoke:
        steps_per_epoch = min(steps_per_epoch, 3)
    client, cluster = start_client(workers)
    shard_loss = ShardLoss(None if workers == 0 else max(1, (os.cpu_count() or 1) // workers))
    step_times, history = [], []
    try:
        # warm-up: compiles (or loads) the kernels here and on every worker; not timed,
        # the weights and the optimizer state are not touched
        _, grads = data_parallel_gradients(shard_loss, params,
                                           (xtr[:args.batch], ytr[:args.batch]),
                                           args.shard_size, client=client)
        optim.adamw_step(opt, params, grads, lr=args.lr, weight_decay=args.weight_decay)
        for epoch in range(1, args.epochs + 1):
            order, rng = rng.draw(lambda g: g.permutation(len(ytr)))
            bar = tqdm(range(steps_per_epoch), desc=f"{label} epoch {epoch:2d}", leave=False,
                       disable=args.no_progress, file=sys.stdout)
            losses = []
            for s in bar:
                idx = order[s * args.batch:(s + 1) * args.batch]
                t0 = time.perf_counter()
                loss, grads = data_parallel_gradients(shard_loss, params, (xtr[idx], ytr[idx]),
                                                      args.shard_size, client=client)
                params, opt = optim.adamw_step(opt, params, grads, lr=args.lr,
                                               weight_decay=args.weight_decay)
                step_times.append(time.perf_counter() - t0)
                losses.append(loss)
                bar.set_postfix(loss=f"{loss:.4f}", refresh=False)
            bar.close()
            train_acc, test_acc = accuracy(params, xtr, ytr), accuracy(params, xte, yte)
            history.append({"loss": float(np.mean(losses)), "train_acc": train_acc,
                            "test_acc": test_acc})
            print(f"{label} epoch {epoch:2d}  loss {np.mean(losses):.4f}  "
                  f"train acc {train_acc:.4f}  test acc {test_acc:.4f}")
    finally:
        if client is not None:
            client.close()
            cluster.close()
    return {"workers": workers, "params": params, "history": history,
            "mean_step": float(np.mean(step_times)), "steps": len(step_times)}


def _label(workers):
    return "in-process" if workers == 0 else f"{workers} worker{'s' if workers > 1 else ''}"


def main(argv=None):
    args = parse_args(argv)
    runs = []
    for w in [args.workers, 0] + args.compare:
        if w not in runs:
            runs.append(w)
    print(f"digits CNN, data-parallel: batch {args.batch} in shards of {args.shard_size}, "
          f"{args.epochs} epoch(s); runs: {', '.join(_label(w) for w in runs)}")
    results = []
    for w in runs:
        started = time.perf_counter()
        r = train(args, w, _label(w))
        r["elapsed"] = time.perf_counter() - started
        results.append(r)
    first = results[0]
    identical = all(
        all(a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()
            for a, b in zip(first["params"], r["params"]))
        and [h["loss"] for h in first["history"]] == [h["loss"] for h in r["history"]]
        for r in results[1:])
    base = next(r for r in results if r["workers"] == 0)["mean_step"]
    print("mean step time (data_parallel_gradients + AdamW, warm-up excluded):")
    for r in results:
        print(f"  {_label(r['workers']):>12}: {r['mean_step'] * 1e3:8.1f} ms over {r['steps']} "
              f"steps  ({r['mean_step'] / base:.2f}x in-process; run {r['elapsed']:.1f} s "
              f"incl. cluster start)")
    print(f"final test accuracy {first['history'][-1]['test_acc']:.4f}")
    print(f"final weights of {', '.join(_label(r['workers']) for r in results)}: "
          f"bitwise identical: {identical}")
    return {"identical": identical,
            "mean_step": {r["workers"]: r["mean_step"] for r in results},
            "history": first["history"], "params": first["params"]}


if __name__ == "__main__":
    sys.exit(0 if main()["identical"] else 1)
