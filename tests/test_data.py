import numpy as np
import pytest

from mshelpers.config import RunConfig
from mshelpers.data import (MarkovSource, corpus_path, corpus_tokens, entropy_floor, make_dataset,
                            numpy_batches, text_tokens, windows)


def test_floor_matches_empirical_conditional_entropy():
    src = MarkovSource(vocab_size=64, branching=4, seed=3)
    toks = src.sample(200_000, seed=0)
    T = src.transitions()
    # mean -log P(next | current) over a long sample estimates the entropy rate
    nll = -np.log(T[toks[:-1], toks[1:]]).mean()
    assert abs(nll - src.entropy_floor()) < 0.02


def test_floor_bounds():
    f = entropy_floor(1024)
    assert 0 < f < np.log(8) < np.log(1024)   # 8 successors per token
    assert MarkovSource(vocab_size=16, branching=1).entropy_floor() == pytest.approx(0.0, abs=1e-12)


def test_committed_corpus_matches_generator():
    committed = np.load(corpus_path(1024, 0))
    regenerated = MarkovSource(vocab_size=1024, seed=0).sample(5000, seed=1)
    assert np.array_equal(committed[:5000], regenerated)
    assert committed.max() < 1024 and committed.min() >= 0


def test_windows_shape_and_seed_shuffle():
    cfg = RunConfig.preset("mini").replace(steps=3)
    w0, w1 = windows(cfg), windows(cfg.replace(seed=1))
    assert w0.shape[1] == cfg.seq_len + 1 and w0.dtype == np.int32
    assert not np.array_equal(w0[:8], w1[:8])
    assert np.array_equal(np.sort(w0, axis=0), np.sort(w1, axis=0))   # same corpus, other order


def test_shards_are_disjoint_and_cover_everything():
    cfg = RunConfig.preset("tiny").replace(batch_size=4)
    n = 64
    seen = []
    for shard in range(2):
        rows = [r for batch in make_dataset(cfg, num_shards=2, shard_id=shard, n_windows=n)
                .create_tuple_iterator(output_numpy=True) for r in batch[0]]
        seen.append({r.tobytes() for r in rows})
    full = {r.tobytes() for r in windows(cfg, n)}
    assert not seen[0] & seen[1]
    assert seen[0] | seen[1] == full


def test_numpy_batches_per_rank_shape_and_bad_shard():
    cfg = RunConfig.preset("tiny")
    b = next(numpy_batches(cfg, num_shards=2, shard_id=1))
    assert b.shape == (cfg.batch_size // 2, cfg.seq_len + 1)
    with pytest.raises(ValueError, match="shard_id=2"):
        next(numpy_batches(cfg, num_shards=2, shard_id=2))
    with pytest.raises(ValueError, match="batch_size=4 is not divisible by num_shards=3"):
        next(numpy_batches(cfg, num_shards=3, shard_id=0))


def test_text_file_is_byte_tokens(tmp_path):
    p = tmp_path / "t.txt"
    p.write_text("hello world " * 200)
    toks = text_tokens(p)
    assert toks[:5].tolist() == list(b"hello")
    w = windows(RunConfig.preset("tiny").replace(data=str(p), vocab_size=256))
    assert w.max() < 256
    with pytest.raises(ValueError, match="vocab_size=64 is too small"):
        windows(RunConfig.preset("tiny").replace(data=str(p), vocab_size=64))


@pytest.mark.parametrize("num_shards", [2, 4])
def test_numpy_batches_shards_are_disjoint_and_make_up_the_unsharded_batch(num_shards):
    """No msrun: each rank's rows, step by step, are disjoint and together are the one-process batch."""
    cfg = RunConfig.preset("tiny").replace(batch_size=8, vocab_size=1024)   # the committed corpus: fast
    steps = 5
    full = numpy_batches(cfg)
    ranks = [numpy_batches(cfg, num_shards=num_shards, shard_id=r) for r in range(num_shards)]
    seen = [set() for _ in range(num_shards)]
    for _ in range(steps):
        want = {row.tobytes() for row in next(full)}
        parts = [next(it) for it in ranks]
        assert all(b.shape == (8 // num_shards, cfg.seq_len + 1) for b in parts)
        rows = [{row.tobytes() for row in b} for b in parts]
        assert sum(len(r) for r in rows) == 8                      # no row twice, inside or across ranks
        assert set().union(*rows) == want                          # together: the unsharded batch
        for r in range(num_shards):
            seen[r] |= rows[r]
    assert all(not (seen[a] & seen[b]) for a in range(num_shards) for b in range(a + 1, num_shards))
    assert sum(len(x) for x in seen) == 8 * steps                  # several steps, never a repeat
