"""A 2-layer character-level transformer trained on the standard library's docstrings,
then sampled one token at a time with the immutable KV cache.

Model (pre-norm): token embedding + sinusoidal positions, 2 x [RMS norm -> causal
grouped-query attention (4 query heads sharing 2 key/value heads, d = 64; q/k/v/output
projections, ``scaled_dot_product_attention_ad(..., is_causal=True, enable_gqa=True)``) ->
residual, RMS norm -> feed-forward (GELU, 4d) -> residual], RMS norm, dense to the
vocabulary.  Every RMS norm carries its learned gain (``rms_norm_ad(..., weight=g)``).

It prints, and checks:
* validation loss against the unigram baseline (the cross-entropy of the validation text
  under the training set's character frequencies);
* that incremental decoding with one ``KVCache`` per layer (``append_cache`` +
  ``cache_values`` + ``causal_mask`` with the cached-prefix offset) gives the same logits
  as recomputing the whole sequence.

Run:  python examples/char_transformer.py [--steps N] [--smoke]
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import sys
import time

import numpy as np

from hmath_dl import RNG, optim
from hmath_dl import autodiff as ad
from hmath_dl import layers as L
from hmath_dl import precision as P
from hmath_dl.activations import Activation, activate

MODULES = ["collections", "itertools", "functools", "json", "re", "string", "textwrap",
           "random", "statistics", "pathlib", "argparse", "heapq", "bisect", "csv",
           "datetime", "decimal", "fractions", "os", "shutil", "subprocess", "typing",
           "logging", "unittest", "inspect", "dataclasses", "enum", "math", "zipfile"]


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=600)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--seq", type=int, default=64)
    p.add_argument("--width", type=int, default=64)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--kv-heads", type=int, default=2,
                   help="key/value heads shared by the query heads (grouped-query attention)")
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--generate", type=int, default=200, help="characters to sample")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--smoke", action="store_true", help="tiny model, a few steps (for tests)")
    return p.parse_args(argv)


# ----------------------------------------------------------------------------- data
def stdlib_text():
    """Docstrings of a fixed list of standard-library modules and their public members."""
    parts = []
    for name in MODULES:
        module = importlib.import_module(name)
        parts.append(inspect.getdoc(module) or "")
        for attr in sorted(dir(module)):
            if attr.startswith("_"):
                continue
            doc = inspect.getdoc(getattr(module, attr, None))
            if doc and getattr(getattr(module, attr), "__module__", None) == name:
                parts.append(doc)
    text = "\n\n".join(p for p in parts if p)
    return "".join(c if 32 <= ord(c) < 127 or c == "\n" else "?" for c in text)


class Corpus:
    def __init__(self, text):
        self.chars = sorted(set(text))
        self.index = {c: i for i, c in enumerate(self.chars)}
        ids = np.array([self.index[c] for c in text], dtype=np.int64)
        cut = int(0.9 * len(ids))
        self.train, self.val = ids[:cut], ids[cut:]

    @property
    def vocab(self):
        return len(self.chars)

    def batch(self, data, batch, seq, rng):
        starts, rng = rng.draw(lambda g: g.integers(0, len(data) - seq - 1, size=batch))
        x = np.stack([data[s:s + seq] for s in starts])
        y = np.stack([data[s + 1:s + seq + 1] for s in starts])
        return x, y, rng

    def unigram_loss(self):
        counts = np.bincount(self.train, minlength=self.vocab) + 1.0
        logp = np.log(counts / counts.sum())
        return float(-logp[self.val].mean())

    def decode(self, ids):
        return "".join(self.chars[i] for i in ids)


# ----------------------------------------------------------------------------- model
def init_params(vocab, d, layers, rng, heads=4, kv_heads=2):
    def dense_w(fan_in, fan_out, rng):
        return L.initialize_weights(L.XavierUniform(), fan_in, fan_out, (fan_out, fan_in), rng)

    params = {}
    params["embed"], rng = L.initialize_weights(L.TruncatedNormal(0.0, 0.02, 2.0), vocab, d,
                                                (vocab, d), rng)
    for i in range(layers):
        kvw = d // heads * kv_heads          # key/value width: kv_heads heads of d/heads
        for name, width in (("q", d), ("k", kvw), ("v", kvw), ("o", d)):
            params[f"{i}.{name}"], rng = dense_w(d, width, rng)
        params[f"{i}.ff1"], rng = dense_w(d, 4 * d, rng)
        params[f"{i}.ff1b"] = np.zeros(4 * d)
        params[f"{i}.ff2"], rng = dense_w(4 * d, d, rng)
        params[f"{i}.ff2b"] = np.zeros(d)
        params[f"{i}.g1"] = np.ones(d)
        params[f"{i}.g2"] = np.ones(d)
    params["gf"] = np.ones(d)
    params["out"], rng = dense_w(d, vocab, rng)
    params["outb"] = np.zeros(vocab)
    return params, rng


def _heads_ad(t, h):
    """[B, S, h*dh] -> [B, h, S, dh] on the tape."""
    b, s, w = t.shape
    return ad.transpose(ad.reshape(t, (b, s, h, w // h)), (0, 2, 1, 3))


def forward_ad(p, ids, heads, layers):
    """Logits [B, S, V] on the tape; ``p`` maps names to ADTensors."""
    b, s = ids.shape
    d = p["embed"].shape[1]
    kv_heads = p["0.k"].shape[0] // (d // heads)
    x = L.embedding_ad(p["embed"], ids) + ad.constant(L.sinusoidal_encoding(s, d, 0))
    for i in range(layers):
        h = L.rms_norm_ad(1, 1e-6, x, weight=p[f"{i}.g1"])
        q = _heads_ad(L.dense_ad(h, p[f"{i}.q"], None), heads)
        k, v = (_heads_ad(L.dense_ad(h, p[f"{i}.{n}"], None), kv_heads) for n in ("k", "v"))
        att = L.scaled_dot_product_attention_ad(q, k, v, is_causal=True, enable_gqa=True)
        att = ad.reshape(ad.transpose(att, (0, 2, 1, 3)), (b, s, d))
        x = x + L.dense_ad(att, p[f"{i}.o"], None)
        h = L.rms_norm_ad(1, 1e-6, x, weight=p[f"{i}.g2"])
        h = ad.activate(Activation.GELU, L.dense_ad(h, p[f"{i}.ff1"], p[f"{i}.ff1b"]))
        x = x + L.dense_ad(h, p[f"{i}.ff2"], p[f"{i}.ff2b"])
    x = L.rms_norm_ad(1, 1e-6, x, weight=p["gf"])
    return L.dense_ad(x, p["out"], p["outb"])


def loss_ad(p, x, y, heads, layers):
    logits = forward_ad(p, x, heads, layers)
    b, s, v = logits.shape
    return ad.cross_entropy(ad.reshape(logits, (b * s, v)), y.reshape(-1))


def full_logits(params, ids, heads, layers):
    """Plain (no tape) logits [S, V] for one sequence, recomputing everything."""
    p = {k: ad.constant(v) for k, v in params.items()}
    return forward_ad(p, ids[None, :], heads, layers).value[0]


def decode_step(params, caches, token, position, heads, layers):
    """Logits [V] of the next token given one new token and the per-layer KV caches."""
    d = params["embed"].shape[1]
    dh = d // heads
    kv_heads = params["0.k"].shape[0] // dh
    x = L.embedding(params["embed"], [token]) + L.sinusoidal_encoding(1, d, position)
    new_caches = []
    for i in range(layers):
        h = L.rms_norm(1, 1e-6, x, weight=params[f"{i}.g1"])
        q, k, v = (L.dense(h, params[f"{i}.{n}"], None) for n in ("q", "k", "v"))
        cache = L.append_cache(caches[i], k, v)
        keys, values = L.cache_values(cache)           # [length, kv_heads * dh]
        n = cache.length
        att, _ = L.scaled_dot_product_attention(
            q.reshape(1, heads, dh).transpose(1, 0, 2),
            keys.reshape(n, kv_heads, dh).transpose(1, 0, 2),
            values.reshape(n, kv_heads, dh).transpose(1, 0, 2),
            L.causal_mask(1, n, position), enable_gqa=True)
        x = x + L.dense(att.transpose(1, 0, 2).reshape(1, d), params[f"{i}.o"], None)
        h = L.rms_norm(1, 1e-6, x, weight=params[f"{i}.g2"])
        h = activate(Activation.GELU, L.dense(h, params[f"{i}.ff1"], params[f"{i}.ff1b"]))
        x = x + L.dense(h, params[f"{i}.ff2"], params[f"{i}.ff2b"])
        new_caches.append(cache)
    x = L.rms_norm(1, 1e-6, x, weight=params["gf"])
    return L.dense(x, params["out"], params["outb"])[0], new_caches


def generate(params, corpus, prompt_ids, n, capacity, heads, layers, rng, temperature=0.8):
    """Sample ``n`` tokens after the prompt; returns (all ids, per-position logits, rng)."""
    d = params["embed"].shape[1]
    kvw = params["0.k"].shape[0]
    caches = [L.empty_cache(capacity, kvw, kvw) for _ in range(layers)]
    ids, logits_seen = [], []
    for pos, tok in enumerate(prompt_ids):
        logits, caches = decode_step(params, caches, int(tok), pos, heads, layers)
        ids.append(int(tok))
        logits_seen.append(logits)
    for _ in range(n):
        z = logits_seen[-1] / temperature
        probs = np.exp(z - z.max())
        probs /= probs.sum()
        tok, rng = rng.draw(lambda g: int(g.choice(len(probs), p=probs)))
        ids.append(tok)
        if len(ids) >= capacity:
            break
        logits, caches = decode_step(params, caches, tok, len(ids) - 1, heads, layers)
        logits_seen.append(logits)
    return ids, np.array(logits_seen), rng


# ----------------------------------------------------------------------------- main
def main(argv=None):
    args = parse_args(argv)
    if args.smoke:
        args.steps, args.width, args.heads, args.layers, args.seq, args.batch = 3, 16, 2, 1, 16, 4
        args.kv_heads = 1
        args.generate = 12
    from tqdm import tqdm

    started = time.perf_counter()
    corpus = Corpus(stdlib_text())
    rng = RNG.from_seed(args.seed)
    if args.heads % args.kv_heads or args.width % args.heads:
        raise SystemExit("--heads must divide --width and be a multiple of --kv-heads")
    params, rng = init_params(corpus.vocab, args.width, args.layers, rng, args.heads,
                              args.kv_heads)
    names = sorted(params)
    state = optim.adamw_init([params[n] for n in names])
    print(f"corpus: {len(corpus.train):,} training / {len(corpus.val):,} validation characters, "
          f"vocabulary {corpus.vocab}; model d={args.width}, {args.heads} query heads sharing "
          f"{args.kv_heads} key/value heads, "
          f"{args.layers} layers, {sum(v.size for v in params.values()):,} parameters")
    bar = tqdm(range(args.steps), desc="training", file=sys.stdout, disable=args.smoke)
    for step in bar:
        x, y, rng = corpus.batch(corpus.train, args.batch, args.seq, rng)
        variables = {n: ad.variable(params[n]) for n in names}
        loss = loss_ad(variables, x, y, args.heads, args.layers)
        grads = ad.gradients(loss, [variables[n] for n in names])
        grads = P.clip_gradients(1.0, grads)
        lr = args.lr * min(1.0, (step + 1) / 50)
        new, state = optim.adamw_step(state, [params[n] for n in names], grads, lr=lr,
                                      weight_decay=0.01)
        params = dict(zip(names, new))
        bar.set_postfix(loss=f"{float(loss.value):.3f}", refresh=False)

    consts = {n: ad.constant(v) for n, v in params.items()}
    val_losses = []
    for _ in range(2 if args.smoke else 20):
        x, y, rng = corpus.batch(corpus.val, args.batch, args.seq, rng)
        val_losses.append(float(loss_ad(consts, x, y, args.heads, args.layers).value))
    val_loss, unigram = float(np.mean(val_losses)), corpus.unigram_loss()
    print(f"validation loss {val_loss:.4f} nats/char vs unigram baseline {unigram:.4f} "
          f"({'below' if val_loss < unigram else 'NOT below'} by {unigram - val_loss:.4f})")

    prompt = np.array([corpus.index[c] for c in "Return the "], dtype=np.int64)
    capacity = len(prompt) + args.generate
    ids, cached_logits, rng = generate(params, corpus, prompt, args.generate, capacity,
                                       args.heads, args.layers, rng)
    full = full_logits(params, np.array(ids[:len(cached_logits)]), args.heads, args.layers)
    diff = float(np.max(np.abs(full - cached_logits)))
    scale = float(np.max(np.abs(full)))
    same = diff <= 1e-9 * max(scale, 1.0)
    print(f"KV-cache decoding vs full recomputation: max |logit difference| = {diff:.3e} "
          f"over {len(cached_logits)} positions -> {'same logits' if same else 'MISMATCH'}")
    print("sample:", repr(corpus.decode(ids)))
    print(f"total time {time.perf_counter() - started:.1f} s")
    return {"val_loss": val_loss, "unigram": unigram, "cache_max_diff": diff, "cache_same": same}


if __name__ == "__main__":
    main()
