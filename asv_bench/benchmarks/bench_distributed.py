"""``data_parallel_gradients`` with ``client=None`` against a plain loop over the same
shards (issue 13: the sharding, checks and fixed-tree combination should cost <= 5%).

Model: the small CNN of bench_autodiff (conv 1->16 k3 p1, ReLU, max-pool 2, conv 16->32,
ReLU, max-pool 2, dense 128->10), loss = summed cross-entropy of each shard.  The plain
loop builds the same variables, runs the same forward/backward per shard, sums the
gradients with ``+`` as it goes and divides by the batch size: the same work minus
``data_parallel_gradients``' argument checks, read-only shard views and pairwise tree.
``setup`` runs both once, so compilation is never measured.  (A Dask client is not
benchmarked here: its cost is the cluster's round trips, see
examples/train_data_parallel.py, which reports the step times of its runs.)
"""

from hmath_dl import autodiff as ad
from hmath_dl import layers as L
from hmath_dl.activations import Activation
from hmath_dl.distributed import data_parallel_gradients

from .bench_autodiff import CONV, cnn_data, cnn_params


def summed_cnn_loss(params, x, y):
    w1, b1, w2, b2, w3, b3 = params
    h = ad.activate(Activation.RELU, L.convolution_ad(CONV, x, w1, b1))
    h = L.pooling_ad(L.PoolMode.MAX, 2, 2, 0, h)
    h = ad.activate(Activation.RELU, L.convolution_ad(CONV, h, w2, b2))
    h = L.pooling_ad(L.PoolMode.MAX, 2, 2, 0, h)
    logits = L.dense_ad(ad.reshape(h, (h.shape[0], -1)), w3, b3)
    return ad.cross_entropy(logits, y) * float(len(y))


def plain_loop(params, x, y, shard_size):
    """The peer: one forward/backward per shard, gradients summed in shard order."""
    n = len(y)
    loss_total, grads_total = 0.0, None
    for lo in range(0, n, shard_size):
        vs = [ad.variable(p) for p in params]
        loss = summed_cnn_loss(vs, x[lo:lo + shard_size], y[lo:lo + shard_size])
        grads = ad.gradients(loss, vs)
        loss_total += float(loss.value)
        grads_total = grads if grads_total is None else [a + b for a, b in zip(grads_total, grads)]
    return loss_total / n, [g / n for g in grads_total]


class DataParallelGradients:
    params = [[(64, 16), (256, 64)]]
    param_names = ["batch, shard_size"]

    def setup(self, case):
        batch, self.shard = case
        self.p = cnn_params()
        self.x, self.y = cnn_data(batch)
        data_parallel_gradients(summed_cnn_loss, self.p, (self.x, self.y), self.shard)
        plain_loop(self.p, self.x, self.y, self.shard)

    def time_data_parallel_gradients(self, case):
        data_parallel_gradients(summed_cnn_loss, self.p, (self.x, self.y), self.shard)

    def time_plain_loop(self, case):
        plain_loop(self.p, self.x, self.y, self.shard)
