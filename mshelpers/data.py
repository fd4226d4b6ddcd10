"""Training data with a known loss floor: a seeded Markov chain over the vocabulary.

A model trained on tokens drawn from a Markov chain can at best predict the next
token's distribution given the current one, so its cross-entropy is bounded below by
the chain's entropy rate  H = sum_i pi_i * H(P_i)  (pi: stationary distribution,
P_i: row i of the transition matrix). `entropy_floor` computes it exactly; the
health layer of every run compares the loss with it.

Example:
    >>> from mshelpers.data import MarkovSource
    >>> src = MarkovSource(vocab_size=1024, seed=0)
    >>> round(src.entropy_floor(), 3)      # nats per token
    1.714
    >>> src.sample(10, seed=1).shape
    (10,)

`make_dataset(cfg, num_shards, shard_id)` wraps the windows in a MindSpore dataset
with sharding; a text file (`cfg.data = "path.txt"`) is read as byte-level tokens.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import numpy as np

DATA_DIR = Path(__file__).resolve().parent.parent / "data"


@dataclass(frozen=True)
class MarkovSource:
    """A sparse random Markov chain: each token has `branching` successors.

    Successors are drawn with Zipf-like popularity (exponent `zipf`), so a few tokens
    are common: a model first learns the unigram frequencies (a quick, visible drop of
    the loss) and then the transitions (a slow approach to the floor).
    """
    vocab_size: int = 1024
    branching: int = 8
    zipf: float = 1.1
    seed: int = 0

    def __post_init__(self) -> None:
        if self.vocab_size < 2:
            raise ValueError(f"MarkovSource.vocab_size={self.vocab_size} is invalid; fix: use >= 2")
        if not 1 <= self.branching <= self.vocab_size:
            raise ValueError(f"MarkovSource.branching={self.branching} is invalid; "
                             f"fix: use 1..vocab_size={self.vocab_size}")

    def transitions(self) -> np.ndarray:
        """The (vocab, vocab) row-stochastic transition matrix."""
        rng = np.random.default_rng(self.seed)
        v = self.vocab_size
        popularity = 1.0 / np.arange(1, v + 1) ** self.zipf
        popularity = popularity[rng.permutation(v)]
        popularity /= popularity.sum()
        T = np.zeros((v, v))
        for i in range(v):
            succ = rng.choice(v, size=self.branching, replace=False, p=popularity)
            T[i, succ] = rng.dirichlet(np.ones(self.branching))
        return T

    def stationary(self) -> np.ndarray:
        """Stationary distribution by power iteration (the chain is ergodic in practice)."""
        T = self.transitions()
        pi = np.full(self.vocab_size, 1.0 / self.vocab_size)
        for _ in range(2000):
            nxt = pi @ T
            if np.abs(nxt - pi).sum() < 1e-13:
                break
            pi = nxt
        return nxt / nxt.sum()

    def entropy_floor(self) -> float:
        """Entropy rate in nats per token: the lowest expected cross-entropy any model can reach."""
        T = self.transitions()
        pi = self.stationary()
        with np.errstate(divide="ignore", invalid="ignore"):
            row_h = -np.nansum(np.where(T > 0, T * np.log(T), 0.0), axis=1)
        return float(pi @ row_h)

    def sample(self, n_tokens: int, seed: int = 0) -> np.ndarray:
        """`n_tokens` tokens of one trajectory, started from the stationary distribution."""
        T = self.transitions()
        cdf = np.cumsum(T, axis=1)
        rng = np.random.default_rng(seed)
        u = rng.random(n_tokens)
        out = np.empty(n_tokens, dtype=np.int32)
        tok = int(np.searchsorted(np.cumsum(self.stationary()), u[0]))
        for k in range(n_tokens):
            out[k] = tok
            tok = min(int(np.searchsorted(cdf[tok], u[k])), self.vocab_size - 1)
        return out


def entropy_floor(vocab_size: int = 1024, branching: int = 8, zipf: float = 1.1, seed: int = 0) -> float:
    """Entropy rate (nats/token) of the default synthetic corpus; see MarkovSource."""
    return MarkovSource(vocab_size, branching, zipf, seed).entropy_floor()


def corpus_path(vocab_size: int, seed: int) -> Path:
    return DATA_DIR / f"markov_v{vocab_size}_s{seed}.npy"


def corpus_tokens(vocab_size: int = 1024, n_tokens: int = 200_000, seed: int = 0) -> np.ndarray:
    """The synthetic corpus: the committed file in data/ when it matches, else generated."""
    p = corpus_path(vocab_size, seed)
    if p.exists():
        toks = np.load(p).astype(np.int32)
        if len(toks) >= n_tokens:
            return toks[:n_tokens].astype(np.int32)
    return MarkovSource(vocab_size=vocab_size, seed=seed).sample(n_tokens, seed=seed + 1)


def text_tokens(path: str | os.PathLike) -> np.ndarray:
    """Byte-level tokens (0..255) of a text file: no tokenizer needed."""
    data = Path(path).read_bytes()
    if len(data) < 2:
        raise ValueError(f"text_tokens: {path} holds {len(data)} bytes; fix: use a file with some text")
    return np.frombuffer(data, dtype=np.uint8).astype(np.int32)


BLOCK_TOKENS = 200_000      # the synthetic corpus grows in blocks of this many tokens (the committed file: one)
MAX_BLOCKS = 10             # at most 2M synthetic tokens (~8 s to generate here); longer runs cycle through them


def _block_windows(cfg) -> int:
    return BLOCK_TOKENS // (cfg.seq_len + 1)


def windows(cfg, n_windows: int | None = None) -> np.ndarray:
    """Non-overlapping training windows of seq_len+1 tokens, shape (n, seq_len+1), int32.

    The order does not depend on `cfg.steps`: the same seed gives the same first N windows whatever
    the run length, so extending a run continues the same stream.
    - The synthetic corpus grows in whole blocks of BLOCK_TOKENS // (seq_len+1) windows, as many as
      the run needs (up to MAX_BLOCKS; a longer run cycles through them). Each block is shuffled on
      its own: block 0 with cfg.seed, block b with (cfg.seed, b). A longer run only appends blocks.
    - A text file's windows are shuffled once with cfg.seed.
    Runs with different seeds see different orders of the same corpus.
    """
    L = cfg.seq_len + 1
    need = n_windows or cfg.steps * cfg.batch_size * cfg.grad_accum
    if cfg.data == "markov":
        per = _block_windows(cfg)
        if per < 1:
            raise ValueError(f"RunConfig.seq_len={cfg.seq_len} is longer than a corpus block of {BLOCK_TOKENS} "
                             "tokens; fix: use a shorter seq_len")
        blocks = min(MAX_BLOCKS, max(1, -(-need // per)))
        toks = corpus_tokens(cfg.vocab_size, blocks * per * L)
        w = toks[: blocks * per * L].reshape(blocks * per, L)
        order = [np.random.default_rng(cfg.seed if b == 0 else [cfg.seed, b]).permutation(per) + b * per
                 for b in range(blocks)]
        return w[np.concatenate(order)]
    toks = text_tokens(cfg.data)
    if cfg.vocab_size < 256:
        raise ValueError(f"RunConfig.vocab_size={cfg.vocab_size} is too small for byte tokens; fix: use >= 256")
    n = len(toks) // L
    if n < 1:
        raise ValueError(f"RunConfig.data={cfg.data!r} holds {len(toks)} tokens, fewer than seq_len+1={L}; "
                         "fix: use a longer file or a shorter seq_len")
    w = toks[: n * L].reshape(n, L)
    return w[np.random.default_rng(cfg.seed).permutation(n)]


def n_windows_available(cfg) -> int:
    """How many windows the data can hold at most (without building them): a text file's size // (seq_len+1),
    or the synthetic corpus at its largest."""
    L = cfg.seq_len + 1
    if cfg.data == "markov":
        return MAX_BLOCKS * _block_windows(cfg)
    return os.path.getsize(cfg.data) // L


def check_fits(cfg) -> None:
    """Refuse a batch larger than the data can fill (it would be cut short silently, every step the same
    rows): one ValueError naming the field, the value and the fix. Reads only the file's size."""
    per_step = cfg.batch_size * cfg.grad_accum
    have = n_windows_available(cfg)
    if per_step > have:
        accum = f" x grad_accum {cfg.grad_accum}" if cfg.grad_accum != 1 else ""
        raise ValueError(f"RunConfig.batch_size={cfg.batch_size}{accum} needs {per_step} sequences per step, but "
                         f"data={cfg.data!r} holds {have} of seq_len+1={cfg.seq_len + 1} tokens; "
                         f"fix: batch_size <= {have // cfg.grad_accum}, a shorter seq_len, or more data")


def data_id(cfg) -> str:
    """What the data is, for a run's identity: the synthetic corpus by its generator parameters, a text file
    by its size and the SHA-256 of its bytes. A file replaced under the same path gets another id."""
    if cfg.data == "markov":
        src = MarkovSource(vocab_size=cfg.vocab_size)
        return (f"markov vocab {src.vocab_size} branching {src.branching} zipf {src.zipf} seed {src.seed} "
                f"blocks of {BLOCK_TOKENS} tokens")
    import hashlib
    h = hashlib.sha256()
    size = 0
    with open(cfg.data, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
            size += len(chunk)
    return f"file of {size} bytes sha256 {h.hexdigest()[:16]}"


def _check_shards(fn: str, cfg, num_shards: int, shard_id: int) -> None:
    if num_shards < 1 or not 0 <= shard_id < num_shards:
        raise ValueError(f"{fn}: shard_id={shard_id} with num_shards={num_shards} is invalid; "
                         "fix: 0 <= shard_id < num_shards")
    if cfg.batch_size % num_shards:
        raise ValueError(f"RunConfig.batch_size={cfg.batch_size} is not divisible by num_shards={num_shards}; "
                         "fix: make the global batch a multiple of the data-parallel size")


def numpy_batches(cfg, num_shards: int = 1, shard_id: int = 0) -> Iterator[np.ndarray]:
    """Endless iterator of (batch_size/num_shards, seq_len+1) int32 batches for one rank."""
    _check_shards("numpy_batches", cfg, num_shards, shard_id)
    check_fits(cfg)
    w = windows(cfg)[shard_id::num_shards]
    per_rank = cfg.batch_size // num_shards
    i = 0
    while True:
        if i + per_rank > len(w):
            i = 0
        yield w[i:i + per_rank]
        i += per_rank


def make_dataset(cfg, num_shards: int = 1, shard_id: int = 0, n_windows: int | None = None):
    """A MindSpore dataset with one int32 column "input_ids" (seq_len+1 tokens), batched per rank.

    Sharding uses MindSpore's own `num_shards`/`shard_id`, so every rank reads a
    disjoint slice. The per-rank batch is cfg.batch_size // num_shards.
    One epoch is `windows(cfg, n_windows)`: `n_windows` is the least number of windows the epoch
    holds, not its size (None: the run's steps x batch x grad_accum). The synthetic corpus grows in
    whole blocks of BLOCK_TOKENS // (seq_len+1) windows, so asking for 64 gives one block (1,550
    windows at seq_len 128); a text file's epoch is the whole file. Read the size from the dataset.
    """
    _check_shards("make_dataset", cfg, num_shards, shard_id)
    import mindspore.dataset as ds
    w = windows(cfg, n_windows)
    d = ds.NumpySlicesDataset({"input_ids": w}, shuffle=False, num_shards=num_shards, shard_id=shard_id)
    return d.batch(cfg.batch_size // num_shards, drop_remainder=True)
