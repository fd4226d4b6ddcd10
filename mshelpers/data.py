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
`write_mindrecord` / `read_mindrecord` / `mindrecord_dataset` store the windows as MindRecord (mindformers'
usual dataset format on Ascend) and read them back, held to a recorded size and SHA-256 (`check_mindrecord`);
`PastPrefetch` times a pipeline's reader past the batches it had read ahead.
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
    Taught with the rest of data.py in notebooks/01_pynative_baseline.ipynb.
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
    """Entropy rate (nats/token) of the default synthetic corpus; see MarkovSource.
    Taught in notebooks/01_pynative_baseline.ipynb."""
    return MarkovSource(vocab_size, branching, zipf, seed).entropy_floor()


def corpus_path(vocab_size: int, seed: int) -> Path:
    """Where the Markov corpus of this vocabulary and seed is cached (data/).
    Taught with the rest of data.py in notebooks/01_pynative_baseline.ipynb."""
    return DATA_DIR / f"markov_v{vocab_size}_s{seed}.npy"


def corpus_tokens(vocab_size: int = 1024, n_tokens: int = 200_000, seed: int = 0) -> np.ndarray:
    """The synthetic corpus: the committed file in data/ when it matches, else generated.
    Taught with the rest of data.py in notebooks/01_pynative_baseline.ipynb."""
    p = corpus_path(vocab_size, seed)
    if p.exists():
        toks = np.load(p).astype(np.int32)
        if len(toks) >= n_tokens:
            return toks[:n_tokens].astype(np.int32)
    return MarkovSource(vocab_size=vocab_size, seed=seed).sample(n_tokens, seed=seed + 1)


def text_tokens(path: str | os.PathLike) -> np.ndarray:
    """Byte-level tokens (0..255) of a text file: no tokenizer needed.
    Taught in notebooks/10_stability.ipynb."""
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
    Taught in notebooks/04_data_parallel.ipynb.
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
    or the synthetic corpus at its largest.
    Taught with the rest of data.py in notebooks/01_pynative_baseline.ipynb."""
    L = cfg.seq_len + 1
    if cfg.data == "markov":
        return MAX_BLOCKS * _block_windows(cfg)
    return os.path.getsize(cfg.data) // L


def check_fits(cfg) -> None:
    """Refuse a batch larger than the data can fill (it would be cut short silently, every step the same
    rows): one ValueError naming the field, the value and the fix. Reads only the file's size.
    Taught in: no notebook; train.py, train_cli.py call it."""
    per_step = cfg.batch_size * cfg.grad_accum
    have = n_windows_available(cfg)
    if per_step > have:
        accum = f" x grad_accum {cfg.grad_accum}" if cfg.grad_accum != 1 else ""
        raise ValueError(f"RunConfig.batch_size={cfg.batch_size}{accum} needs {per_step} sequences per step, but "
                         f"data={cfg.data!r} holds {have} of seq_len+1={cfg.seq_len + 1} tokens; "
                         f"fix: batch_size <= {have // cfg.grad_accum}, a shorter seq_len, or more data")


def data_id(cfg) -> str:
    """What the data is, for a run's identity: the synthetic corpus by its generator parameters, a text file
    by its size and the SHA-256 of its bytes. A file replaced under the same path gets another id.
    Taught in: no notebook; train_cli.py calls it."""
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
    """Endless iterator of (batch_size/num_shards, seq_len+1) int32 batches for one rank.
    Taught in notebooks/03_mixed_precision.ipynb."""
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
    Taught in notebooks/04_data_parallel.ipynb.
    """
    _check_shards("make_dataset", cfg, num_shards, shard_id)
    import mindspore.dataset as ds
    w = windows(cfg, n_windows)
    d = ds.NumpySlicesDataset({"input_ids": w}, shuffle=False, num_shards=num_shards, shard_id=shard_id)
    return d.batch(cfg.batch_size // num_shards, drop_remainder=True)


# --- a pipeline's reader past its prefetch ---
class PastPrefetch:
    """A feed that, on its first call, drops the batches its pipeline had already read ahead.

    A data pipeline (MindData's workers, a queue) reads ahead while the process does something else: a compile,
    the profiler starting, the steps before a timed window. Batches taken from that queue come at once, however
    slow the reader is, so a window that reads them measures the queue, not the reader. `PastPrefetch(fetch,
    min_wait_s)` calls `fetch()` and drops each batch until one had to wait at least `min_wait_s` (that one had
    to be read: the queue was empty) and returns it; every later call returns `fetch()`. `drained` holds what the first
    call found: {"dropped": batches served from the queue, "wait_s": the first wait, "drain_s": the time it took}.
    Pick `min_wait_s` below the time the reader needs per batch and well above a queued batch's fetch (a
    fraction of a millisecond). Taught in notebooks/08_profiling.ipynb.
    """

    def __init__(self, fetch, min_wait_s: float, max_batches: int = 64) -> None:
        if not callable(fetch):
            raise ValueError(f"PastPrefetch: fetch={fetch!r} is not callable; fix: pass the function that returns "
                             "the next batch")
        if not min_wait_s > 0:
            raise ValueError(f"PastPrefetch: min_wait_s={min_wait_s!r} is invalid; fix: pass a time in seconds > 0, "
                             "below the reader's time per batch")
        if int(max_batches) < 1:
            raise ValueError(f"PastPrefetch: max_batches={max_batches!r} is invalid; fix: pass an integer >= 1")
        self.fetch, self.min_wait_s, self.max_batches = fetch, float(min_wait_s), int(max_batches)
        self.drained: dict | None = None

    def __call__(self):
        if self.drained is None:
            import time
            start = time.perf_counter()
            for k in range(self.max_batches):
                t0 = time.perf_counter()
                batch = self.fetch()
                waited = time.perf_counter() - t0
                if waited >= self.min_wait_s:     # read while we waited: the first batch past the read-ahead
                    self.drained = {"dropped": k, "wait_s": waited, "drain_s": time.perf_counter() - start}
                    return batch
            else:
                raise RuntimeError(f"PastPrefetch: {self.max_batches} batches came without a wait of "
                                   f"{self.min_wait_s:.4g} s (max_batches={self.max_batches}); fix: a min_wait_s "
                                   "below the reader's time per batch, or a larger max_batches than the queue holds")
        return self.fetch()

    def fetch_times(self, n: int) -> list[float]:
        """The reader timed alone: seconds per `fetch()` for `n` batches past the read-ahead (drained first when
        this feed has not been called yet), with nothing else running between them."""
        import time
        if int(n) < 1:
            raise ValueError(f"PastPrefetch.fetch_times: n={n!r} is invalid; fix: pass an integer >= 1")
        if self.drained is None:
            self()
        out = []
        for _ in range(int(n)):
            t0 = time.perf_counter()
            self.fetch()
            out.append(time.perf_counter() - t0)
        return out


# --- MindRecord: the windows written once, read back by MindData ---
MINDRECORD_COLUMN = "input_ids"


class CorruptMindRecord(RuntimeError):
    """A MindRecord file that is not what `write_mindrecord` wrote (truncated, changed, its index missing).
    Taught in notebooks/08_profiling.ipynb."""


def _sha256(path: Path) -> str:
    import hashlib
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            h.update(chunk)
    return h.hexdigest()


def _record_of(path: Path) -> Path:
    return path.with_name(path.name + ".json")


def write_mindrecord(windows, path: str | os.PathLike, *, overwrite: bool = True) -> dict:
    """Write training windows, shape (n, seq_len+1) integer token ids, to one MindRecord file.

    One sample per window, schema {"input_ids": {"type": "int32", "shape": [-1]}}, in the windows' order
    (`mindspore.mindrecord.FileWriter`: `add_schema`, `write_raw_data`, `commit`). MindSpore writes the file and
    its index `<path>.db`; this also writes `<path>.json` with the rows, the length and the file's size and
    SHA-256, which `check_mindrecord` holds the file to (MindRecord keeps no checksum of its data pages).
    Returns {"path", "rows", "seq", "write_s" (FileWriter's work, from opening to commit), "raw_bytes" (the
    windows as int32), "file_bytes" (the file's apparent size), "disk_bytes" (blocks it allocates) and
    "index_bytes"}. Taught in notebooks/08_profiling.ipynb.
    """
    import json
    import time
    w = np.asarray(windows)
    if w.ndim != 2 or w.shape[0] < 1 or w.shape[1] < 1:
        raise ValueError(f"write_mindrecord: windows has shape {w.shape}; fix: pass a non-empty (n, seq_len+1) "
                         "array, e.g. data.windows(cfg)")
    if not np.issubdtype(w.dtype, np.integer):
        raise ValueError(f"write_mindrecord: windows.dtype={w.dtype} is not an integer type; fix: pass token ids "
                         "(np.int32)")
    lo, hi = int(w.min()), int(w.max())
    if lo < np.iinfo(np.int32).min or hi > np.iinfo(np.int32).max:
        raise ValueError(f"write_mindrecord: windows holds {lo if lo < 0 else hi}, outside int32; fix: pass token "
                         "ids that fit in int32")
    path = Path(path)
    if path.suffix != ".mindrecord":
        raise ValueError(f"write_mindrecord: path={str(path)!r} does not end in .mindrecord; fix: name the file "
                         "<name>.mindrecord")
    index, record = path.with_name(path.name + ".db"), _record_of(path)
    if not overwrite and (path.exists() or index.exists()):
        raise FileExistsError(f"write_mindrecord: {path} exists and overwrite=False; fix: overwrite=True or "
                              "another path")
    path.parent.mkdir(parents=True, exist_ok=True)
    record.unlink(missing_ok=True)          # no stale record vouches for a half-written file
    from mindspore.mindrecord import FileWriter
    w32 = np.ascontiguousarray(w, dtype=np.int32)
    rows = [{MINDRECORD_COLUMN: r} for r in w32]
    t0 = time.perf_counter()
    writer = FileWriter(str(path), shard_num=1, overwrite=True)
    writer.add_schema({MINDRECORD_COLUMN: {"type": "int32", "shape": [-1]}}, "training windows")
    writer.write_raw_data(rows)
    writer.commit()
    write_s = time.perf_counter() - t0
    st = path.stat()
    out = {"path": str(path), "rows": int(w32.shape[0]), "seq": int(w32.shape[1]), "write_s": write_s,
           "raw_bytes": int(w32.nbytes), "file_bytes": int(st.st_size), "disk_bytes": int(st.st_blocks) * 512,
           "index_bytes": int(index.stat().st_size)}
    record.write_text(json.dumps({"rows": out["rows"], "seq": out["seq"], "file_bytes": out["file_bytes"],
                                  "sha256": _sha256(path)}))
    return out


def check_mindrecord(path: str | os.PathLike) -> dict:
    """Hold a MindRecord file to what `write_mindrecord` recorded: its index present, its size and SHA-256 the
    ones written. Returns the record ({"rows", "seq", "file_bytes", "sha256"}); raises FileNotFoundError or
    `CorruptMindRecord` in one line otherwise (a truncated file can make MindData's reader fail deep in its
    pipeline, and a changed data page comes back as other tokens). Taught in notebooks/08_profiling.ipynb.
    """
    import json
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"check_mindrecord: {path} does not exist; fix: write it with data.write_mindrecord")
    again = "fix: write it again with data.write_mindrecord"
    index, record = path.with_name(path.name + ".db"), _record_of(path)
    if not index.is_file():
        raise CorruptMindRecord(f"check_mindrecord: {path}'s index {index.name} is missing; {again}")
    if not record.is_file():
        raise CorruptMindRecord(f"check_mindrecord: {path} has no record of what was written ({record.name}); {again}")
    try:
        rec = json.loads(record.read_text())
        want_size, want_sha = int(rec["file_bytes"]), str(rec["sha256"])
    except (ValueError, KeyError, TypeError) as e:
        raise CorruptMindRecord(f"check_mindrecord: {record} is unreadable ({type(e).__name__}); {again}") from None
    size = path.stat().st_size
    if size != want_size:
        raise CorruptMindRecord(f"check_mindrecord: {path} holds {size} bytes where {want_size} were written "
                                f"({'truncated' if size < want_size else 'grown'}); {again}")
    if _sha256(path) != want_sha:
        raise CorruptMindRecord(f"check_mindrecord: {path}'s bytes differ from those written (SHA-256 "
                                f"{want_sha[:12]}… expected): corrupt; {again}")
    return rec


def mindrecord_dataset(path: str | os.PathLike, batch_size: int, *, verify: bool = True,
                       num_parallel_workers: int | None = None):
    """A MindSpore dataset over a file `write_mindrecord` wrote: `mindspore.dataset.MindDataset` in file order
    (shuffle=False), column "input_ids", batched (drop_remainder=True). `verify` first runs `check_mindrecord`
    (one pass over the file's bytes; a timed loop checks once and passes verify=False).
    Taught in notebooks/08_profiling.ipynb.
    """
    if int(batch_size) < 1:
        raise ValueError(f"mindrecord_dataset: batch_size={batch_size!r} is invalid; fix: pass an integer >= 1")
    if verify:
        check_mindrecord(path)
    import mindspore.dataset as ds
    d = ds.MindDataset(str(path), columns_list=[MINDRECORD_COLUMN], shuffle=False,
                       num_parallel_workers=num_parallel_workers)
    return d.batch(int(batch_size), drop_remainder=True)


def read_mindrecord(path: str | os.PathLike) -> np.ndarray:
    """Every window of a file `write_mindrecord` wrote, checked first (`check_mindrecord`), as one (n, seq) int32
    array in file order. A read MindData fails on is raised as `CorruptMindRecord` in one line.
    Taught in notebooks/08_profiling.ipynb.
    """
    rec = check_mindrecord(path)
    import mindspore.dataset as ds
    try:
        d = ds.MindDataset(str(path), columns_list=[MINDRECORD_COLUMN], shuffle=False)
        rows = [r[0] for r in d.create_tuple_iterator(output_numpy=True, num_epochs=1)]
    except RuntimeError as e:
        first = next((ln.strip() for ln in str(e).splitlines() if "ERROR]" in ln), str(e).splitlines()[0])
        raise CorruptMindRecord(f"read_mindrecord: MindData could not read {path} ({first}); fix: write it again "
                                "with data.write_mindrecord") from None
    if len(rows) != rec["rows"]:
        raise CorruptMindRecord(f"read_mindrecord: {path} gave {len(rows)} windows where {rec['rows']} were "
                                "written; fix: write it again with data.write_mindrecord")
    return np.stack(rows).astype(np.int32, copy=False)


def read_tokens_per_s(dataset, epochs: int = 1) -> dict:
    """Read `epochs` passes of a batched MindSpore dataset (numpy out) and time them: {"tokens_per_s",
    "batches_per_s", "tokens", "batches", "s"}. The pipeline's start counts in the time, as it does for a run.
    Taught in notebooks/08_profiling.ipynb.
    """
    import time
    if int(epochs) < 1:
        raise ValueError(f"read_tokens_per_s: epochs={epochs!r} is invalid; fix: pass an integer >= 1")
    t0 = time.perf_counter()
    tokens = batches = 0
    passes = dataset.repeat(int(epochs)) if int(epochs) > 1 else dataset
    for batch in passes.create_tuple_iterator(output_numpy=True, num_epochs=1):
        tokens += int(batch[0].size)
        batches += 1
    s = time.perf_counter() - t0
    if batches == 0:
        raise ValueError("read_tokens_per_s: the dataset gave no batch; fix: a dataset holding at least one batch")
    return {"tokens_per_s": tokens / s, "batches_per_s": batches / s, "tokens": tokens, "batches": batches, "s": s}
