"""Train a small CNN on scikit-learn's handwritten digits with mixed precision.

The recipe of ``HMath.DeepLearning.Precision``:

* float64 master weights, updated by AdamW (``hmath_dl.optim``);
* the forward pass runs on the master weights rounded to BF16 (or FP16);
* the loss is multiplied by the scale of a ``LossScaler``; the scaled gradients are
  stored in FP16, and an FP16 overflow counts as a non-finite gradient;
* ``unscale_gradients`` -> on overflow the WHOLE update is skipped -> ``update_loss_scaler``
  (halve on overflow, double after ``growth_interval`` clean steps);
* gradients are clipped (``clip_gradients``) after unscaling.

The scale starts at 2**24, far too high for FP16 gradients, so the first steps overflow
and are visibly skipped while the scaler backs off.

Model: conv 1->16 k3 p1, batch norm (affine, running statistics), ReLU, max-pool 2, conv 16->32 k3 p1,
ReLU, max-pool 2, dropout 0.2, dense 128->10.  Data: ``sklearn.datasets.load_digits``
(1,797 8x8 images, no download), 80/20 train/test split.

Run:  python examples/train_digits_cnn.py            (about a minute on 2 cores)
      python examples/train_digits_cnn.py --smoke    (a few steps, for the test suite)
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
from hmath_dl import precision as P
from hmath_dl.activations import Activation
from hmath_dl.errors import NumericOverflow

CONV = L.ConvOptions(stride=(1, 1), padding="same", dilation=(1, 1), groups=1)  # 3x3: 1 each side


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--epochs", type=int, default=15)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--weight-decay", type=float, default=1e-4)
    p.add_argument("--precision", choices=["bf16", "fp16"], default="bf16",
                   help="format of the weights in the forward pass")
    p.add_argument("--initial-scale", type=float, default=2.0 ** 24)
    p.add_argument("--growth-interval", type=int, default=100)
    p.add_argument("--max-norm", type=float, default=5.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--plot", default=os.path.join("examples", "output", "digits_cnn.png"))
    p.add_argument("--smoke", action="store_true", help="a few steps only (for tests)")
    p.add_argument("--no-progress", action="store_true")
    return p.parse_args(argv)


def load_data(rng):
    from sklearn.datasets import load_digits

    digits = load_digits()
    x = (digits.images / 16.0).reshape(-1, 1, 8, 8)
    y = digits.target.astype(np.int64)
    order, rng = rng.draw(lambda g: g.permutation(len(y)))
    cut = int(0.8 * len(y))
    train, test = order[:cut], order[cut:]
    return (x[train], y[train]), (x[test], y[test]), rng


def init_params(rng):
    w1, rng = L.initialize_weights(L.KaimingNormal(), 9, 16 * 9, (16, 1, 3, 3), rng)
    w2, rng = L.initialize_weights(L.KaimingNormal(), 16 * 9, 32 * 9, (32, 16, 3, 3), rng)
    w3, rng = L.initialize_weights(L.XavierUniform(), 128, 10, (10, 128), rng)
    params = [w1, np.zeros(16), np.ones(16), np.zeros(16), w2, np.zeros(32), w3, np.zeros(10)]
    return params, rng


def forward(weights, bn_state, x, rng, training):
    """Logits [B, 10] from ADTensor weights; returns (logits, bn_state, rng)."""
    w1, b1, gamma, beta, w2, b2, w3, b3 = weights
    mode = L.Mode.TRAINING if training else L.Mode.INFERENCE
    h = L.convolution_ad(CONV, ad.constant(x), w1, b1)
    h, bn_state = L.batch_norm_ad(mode, 0.1, 1e-5, gamma, beta, bn_state, h)
    h = ad.activate(Activation.RELU, h)
    h = L.pooling_ad(L.PoolMode.MAX, (2, 2), (2, 2), (0, 0), h)
    h = L.convolution_ad(CONV, h, w2, b2)
    h = ad.activate(Activation.RELU, h)
    h = L.pooling_ad(L.PoolMode.MAX, (2, 2), (2, 2), (0, 0), h)
    h = ad.reshape(h, (x.shape[0], 128))
    if training:
        h, _, rng = L.dropout_ad(L.Mode.TRAINING, 0.2, rng, h)
    return L.dense_ad(h, w3, b3), bn_state, rng


def accuracy(params, bn_state, precision, x, y, batch=512):
    weights = [ad.constant(P.round_to_precision(precision, p)) for p in params]
    correct = 0
    for i in range(0, len(y), batch):
        logits, _, _ = forward(weights, bn_state, x[i:i + batch], None, training=False)
        correct += int((np.argmax(logits.value, axis=1) == y[i:i + batch]).sum())
    return correct / len(y)


def train_step(params, opt, bn_state, scaler, precision, xb, yb, rng, args):
    """One mixed-precision step; returns (params, opt, bn_state, scaler, loss, skipped, rng)."""
    variables = [ad.variable(P.round_to_precision(precision, p)) for p in params]
    logits, new_bn_state, rng = forward(variables, bn_state, xb, rng, training=True)
    loss = ad.cross_entropy(logits, yb)
    scaled_loss = loss * scaler.loss_scale          # == scale_loss(scaler, loss.value)
    try:
        scaled = ad.gradients(scaled_loss, variables)
        # scaled gradients are stored in FP16: an overflow there is a non-finite gradient
        stored = [P.round_to_precision(P.Precision.FP16, g) for g in scaled]
        finite, grads = P.unscale_gradients(scaler, stored)
    except NumericOverflow:
        finite, grads = False, None
    if finite:  # skip the WHOLE update otherwise
        grads = P.clip_gradients(args.max_norm, grads)
        params, opt = optim.adamw_step(opt, params, grads, lr=args.lr,
                                       weight_decay=args.weight_decay)
        bn_state = new_bn_state
    scaler = P.update_loss_scaler(finite, scaler)
    return params, opt, bn_state, scaler, float(loss.value), not finite, rng


def plot(history, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(3, 1, figsize=(8, 9), sharex=True)
    steps = np.arange(len(history["loss"]))
    axes[0].plot(steps, history["loss"], lw=0.8)
    axes[0].set_ylabel("training loss")
    skipped = np.flatnonzero(history["skipped"])
    axes[0].plot(skipped, np.asarray(history["loss"])[skipped], "rx", ms=4, label="skipped (overflow)")
    axes[0].legend()
    axes[1].plot(history["eval_step"], history["train_acc"], "o-", label="train")
    axes[1].plot(history["eval_step"], history["test_acc"], "s-", label="test")
    axes[1].set_ylabel("accuracy")
    axes[1].legend()
    axes[2].semilogy(steps, history["scale"], drawstyle="steps-post")
    axes[2].set_ylabel("loss scale")
    axes[2].set_xlabel("step")
    fig.suptitle("hmath_dl: digits CNN, BF16 forward, FP16 scaled gradients, AdamW")
    fig.tight_layout()
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None):
    args = parse_args(argv)
    from tqdm import tqdm

    started = time.perf_counter()
    precision = P.Precision.BF16 if args.precision == "bf16" else P.Precision.FP16
    rng = RNG.from_seed(args.seed)
    (xtr, ytr), (xte, yte), rng = load_data(rng)
    params, rng = init_params(rng)
    opt = optim.adamw_init(params)
    bn_state = L.BatchNormState.initial(16)
    scaler = P.initial_loss_scaler(args.initial_scale, args.growth_interval)
    epochs = 1 if args.smoke else args.epochs
    steps_per_epoch = -(-len(ytr) // args.batch)
    if args.smoke:
        steps_per_epoch = min(steps_per_epoch, 12)
    history = {k: [] for k in ("loss", "scale", "skipped", "eval_step", "train_acc", "test_acc")}
    print(f"digits: {len(ytr)} train / {len(yte)} test images; {epochs} epochs x "
          f"{steps_per_epoch} steps; forward in {precision.name}, gradients stored in FP16, "
          f"initial loss scale {args.initial_scale:g}")
    total_skipped = 0
    for epoch in range(1, epochs + 1):
        order, rng = rng.draw(lambda g: g.permutation(len(ytr)))
        bar = tqdm(range(steps_per_epoch), desc=f"epoch {epoch:2d}", leave=False,
                   disable=args.no_progress, file=sys.stdout)
        skipped_epoch, losses = 0, []
        for s in bar:
            idx = order[s * args.batch:(s + 1) * args.batch]
            history["scale"].append(scaler.loss_scale)
            params, opt, bn_state, scaler, loss, skipped, rng = train_step(
                params, opt, bn_state, scaler, precision, xtr[idx], ytr[idx], rng, args)
            history["loss"].append(loss)
            history["skipped"].append(skipped)
            skipped_epoch += skipped
            losses.append(loss)
            bar.set_postfix(loss=f"{loss:.3f}", scale=f"{scaler.loss_scale:g}", refresh=False)
        total_skipped += skipped_epoch
        train_acc = accuracy(params, bn_state, precision, xtr, ytr)
        test_acc = accuracy(params, bn_state, precision, xte, yte)
        history["eval_step"].append(len(history["loss"]) - 1)
        history["train_acc"].append(train_acc)
        history["test_acc"].append(test_acc)
        print(f"epoch {epoch:2d}  loss {np.mean(losses):.4f}  train acc {train_acc:.4f}  "
              f"test acc {test_acc:.4f}  skipped steps {skipped_epoch} (total {total_skipped})  "
              f"loss scale {scaler.loss_scale:g}")
    elapsed = time.perf_counter() - started
    plot(history, args.plot)
    print(f"final test accuracy {history['test_acc'][-1]:.4f}; {total_skipped} of "
          f"{len(history['loss'])} steps skipped on overflow; {elapsed:.1f} s "
          f"(JIT compile included); plot written to {args.plot}")
    return history


if __name__ == "__main__":
    main()
