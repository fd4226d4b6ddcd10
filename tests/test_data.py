import time
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


@pytest.mark.parametrize("vocab", [1024, 256])      # mini's and tiny's vocabularies
def test_committed_corpus_matches_generator(vocab):
    committed = np.load(corpus_path(vocab, 0))
    regenerated = MarkovSource(vocab_size=vocab, seed=0).sample(200_000, seed=1)
    assert len(committed) == 200_000 and np.array_equal(committed, regenerated)
    assert committed.max() < vocab and committed.min() >= 0


def test_windows_shape_and_seed_shuffle():
    cfg = RunConfig.preset("mini").replace(steps=3)
    w0, w1 = windows(cfg), windows(cfg.replace(seed=1))
    assert w0.shape[1] == cfg.seq_len + 1 and w0.dtype == np.int32
    assert not np.array_equal(w0[:8], w1[:8])
    assert np.array_equal(np.sort(w0, axis=0), np.sort(w1, axis=0))   # same corpus, other order


def test_shards_are_disjoint_and_cover_everything():
    cfg = RunConfig.preset("tiny").replace(batch_size=4, vocab_size=1024)   # the committed corpus: fast
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
    cfg = RunConfig.preset("tiny").replace(vocab_size=1024)
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
    assert toks[:5].tolist() == list(b"hello") and toks.dtype == np.int32
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


def test_numpy_batches_wrap_around_to_the_first_window(tmp_path):
    """Endless: past the last full batch it starts again from window 0 (10 windows, batch 4: 0-3, 4-7, 0-3)."""
    cfg = RunConfig.preset("tiny").replace(batch_size=4, seq_len=7, vocab_size=256)
    p = tmp_path / "t.txt"
    p.write_bytes(bytes(range(80)))                   # 80 bytes = exactly 10 windows of 8 tokens
    cfg = cfg.replace(data=str(p))
    w = windows(cfg)
    assert w.shape == (10, 8)
    it = numpy_batches(cfg)
    got = [next(it) for _ in range(4)]
    for b, rows in zip(got, ([0, 1, 2, 3], [4, 5, 6, 7], [0, 1, 2, 3], [4, 5, 6, 7])):
        np.testing.assert_array_equal(b, w[rows])
    half = numpy_batches(cfg, num_shards=2, shard_id=1)  # rank 1 holds windows 1, 3, 5, 7, 9: batches of 2
    np.testing.assert_array_equal(np.concatenate([next(half) for _ in range(3)]), w[[1, 3, 5, 7, 1, 3]])


def test_shard_errors_name_the_function_and_the_fix():
    cfg = RunConfig.preset("tiny")
    for fn in (numpy_batches, make_dataset):
        with pytest.raises(ValueError) as e:
            next(iter(fn(cfg, num_shards=2, shard_id=-1)))
        assert str(e.value) == (f"{fn.__name__}: shard_id=-1 with num_shards=2 is invalid; "
                                "fix: 0 <= shard_id < num_shards")
        with pytest.raises(ValueError, match="shard_id=0 with num_shards=0"):
            next(iter(fn(cfg, num_shards=0, shard_id=0)))
    with pytest.raises(ValueError) as e:
        make_dataset(cfg, num_shards=3, shard_id=0)
    assert str(e.value) == ("RunConfig.batch_size=4 is not divisible by num_shards=3; "
                            "fix: make the global batch a multiple of the data-parallel size")


def test_make_dataset_defaults_to_one_shard_with_the_whole_batch():
    cfg = RunConfig.preset("tiny").replace(vocab_size=1024)
    d = make_dataset(cfg, n_windows=12)     # n_windows sizes a generated corpus; the committed one is larger
    assert d.get_col_names() == ["input_ids"]
    w = windows(cfg, 12)
    batches = [b[0] for b in d.create_tuple_iterator(output_numpy=True)]
    assert len(batches) == len(w) // 4 and {b.shape for b in batches} == {(4, cfg.seq_len + 1)}   # nothing sharded
    np.testing.assert_array_equal(np.concatenate(batches), w[: len(batches) * 4])


def test_default_corpus_and_floor():
    toks = corpus_tokens()
    assert len(toks) == 200_000 and toks.dtype == np.int32
    assert np.array_equal(toks, np.load(corpus_path(1024, 0))[:200_000])
    assert round(entropy_floor(), 3) == 1.714
    assert entropy_floor(64, 4, 1.1, 3) == MarkovSource(vocab_size=64, branching=4, zipf=1.1, seed=3).entropy_floor()
    assert entropy_floor(64, 4, 1.1, 3) != entropy_floor(64, 4, 1.1, 4) != entropy_floor(64, 4, 1.3, 4)


def test_text_tokens_needs_two_bytes(tmp_path):
    p = tmp_path / "two.txt"
    p.write_bytes(b"hi")
    assert text_tokens(p).tolist() == [104, 105]
    p.write_bytes(b"h")
    with pytest.raises(ValueError, match="holds 1 bytes"):
        text_tokens(p)


def test_markov_source_bounds_and_default_seed():
    assert MarkovSource(vocab_size=2, branching=2).transitions().shape == (2, 2)   # the smallest valid chain
    with pytest.raises(ValueError, match=r"^MarkovSource.vocab_size=1 is invalid; fix: use >= 2$"):
        MarkovSource(vocab_size=1, branching=1)
    MarkovSource(vocab_size=16, branching=16)                                       # every token a successor
    for b in (0, 17):
        with pytest.raises(ValueError, match=rf"^MarkovSource.branching={b} is invalid; fix: use 1..vocab_size=16$"):
            MarkovSource(vocab_size=16, branching=b)
    src = MarkovSource(vocab_size=64, branching=4, seed=3)
    assert np.array_equal(src.sample(50), src.sample(50, seed=0))


def test_generated_corpus_for_other_vocab_sizes_is_the_seeded_chain():
    toks = corpus_tokens(64, 500, seed=2)                  # no committed file: generated
    assert np.array_equal(toks, MarkovSource(vocab_size=64, seed=2).sample(500, seed=3))
    assert toks.dtype == np.int32 and toks.max() < 64


def test_windows_grow_the_corpus_in_whole_blocks_as_the_run_needs():
    # 8 steps x batch 4 x accum 200 = 6400 windows of 33 tokens: more than one block of 200,000 // 33 = 6060
    # windows (the committed corpus), so the corpus grows by a whole second block: 12,120 windows. (Before
    # issue 26 it grew to exactly 6400 and reshuffled them all, so the order depended on the run length.)
    cfg = RunConfig.preset("tiny").replace(vocab_size=1024, steps=8, batch_size=4, grad_accum=200)
    assert len(windows(cfg)) == 2 * 6060
    assert len(windows(cfg.replace(grad_accum=1))) == 200_000 // 33                   # the corpus floor: one block


def test_data_order_does_not_depend_on_the_run_length():
    """Issue 26 F4: the same seed gives the same first N batches whatever `steps` is, so extending a run
    continues the same stream. mini needs 8 x 129 tokens a step: 100 steps fit one 200,000-token block,
    200 steps need a second one; before the fix the two runs shared none of their first 105 batches."""
    mini = RunConfig.preset("mini")
    short, long_ = numpy_batches(mini.replace(steps=100)), numpy_batches(mini.replace(steps=200))
    a = np.stack([next(short) for _ in range(100)])
    b = np.stack([next(long_) for _ in range(200)])
    np.testing.assert_array_equal(a, b[:100])
    assert len({r.tobytes() for r in b.reshape(-1, mini.seq_len + 1)}) == 200 * 8   # no window twice in 200
    # one block's order is the seeded permutation of its windows, exactly as before the fix
    w = windows(mini.replace(steps=100))
    toks = corpus_tokens(1024, (200_000 // 129) * 129)
    np.testing.assert_array_equal(w, toks.reshape(-1, 129)[np.random.default_rng(0).permutation(200_000 // 129)])


def test_a_batch_larger_than_the_data_is_refused(tmp_path):
    """Issue 26 F11: 1000 sequences per step from a file holding 606 is one ValueError, not a silent cut."""
    from mshelpers.data import check_fits, data_id
    p = tmp_path / "t.txt"
    p.write_bytes(b"x" * (606 * 33 + 5))                  # 606 windows of seq_len+1 = 33, plus 5 spare bytes
    cfg = RunConfig.preset("tiny").replace(data=str(p), vocab_size=256, batch_size=1000)
    with pytest.raises(ValueError) as e:
        next(numpy_batches(cfg))
    assert str(e.value) == (f"RunConfig.batch_size=1000 needs 1000 sequences per step, but data={str(p)!r} holds "
                            "606 of seq_len+1=33 tokens; fix: batch_size <= 606, a shorter seq_len, or more data")
    check_fits(cfg.replace(batch_size=606))               # exactly full: fine
    with pytest.raises(ValueError, match="batch_size=4 x grad_accum 200 needs 800 sequences"):
        check_fits(cfg.replace(batch_size=4, grad_accum=200))
    with pytest.raises(ValueError, match="holds 60600 of seq_len"):   # the synthetic corpus has a size too
        check_fits(cfg.replace(data="markov", batch_size=60601))
    # the data's identity: size and content for a file, generator parameters for the synthetic corpus
    before = data_id(cfg)
    p.write_bytes(b"y" * (606 * 33 + 5))                  # same size, other bytes
    assert before.startswith(f"file of {606 * 33 + 5} bytes sha256 ") and data_id(cfg) != before
    assert data_id(cfg.replace(data="markov")) != data_id(cfg.replace(data="markov", vocab_size=1024))


def test_windows_need_one_full_window(tmp_path):
    cfg = RunConfig.preset("tiny").replace(vocab_size=256, seq_len=7)
    p = tmp_path / "t.txt"
    p.write_bytes(b"12345678")                             # exactly one window of seq_len+1 = 8
    assert windows(cfg.replace(data=str(p))).tolist() == [list(b"12345678")]
    p.write_bytes(b"1234567")
    with pytest.raises(ValueError) as e:
        windows(cfg.replace(data=str(p)))
    assert str(e.value) == (f"RunConfig.data={str(p)!r} holds 7 tokens, fewer than seq_len+1=8; "
                            "fix: use a longer file or a shorter seq_len")


def test_batches_at_an_exact_fit_and_no_ragged_last_batch(tmp_path):
    cfg = RunConfig.preset("tiny").replace(batch_size=4, seq_len=9, vocab_size=256)
    p = tmp_path / "t.txt"
    p.write_bytes(bytes(range(80)))                        # exactly 8 windows of 10: two full batches
    cfg = cfg.replace(data=str(p))
    w, it = windows(cfg), numpy_batches(cfg)
    for rows in ([0, 1, 2, 3], [4, 5, 6, 7], [0, 1, 2, 3]):
        np.testing.assert_array_equal(next(it), w[rows])
    d = make_dataset(cfg.replace(batch_size=8, data="markov", vocab_size=1024, seq_len=32))
    assert d.get_dataset_size() == (200_000 // 33) // 8        # 6060 windows: 757 batches, the last 4 dropped
    # 7000 windows need two blocks of 6060: the corpus grows by whole blocks (issue 26), 12,120 windows
    assert make_dataset(cfg.replace(data="markov", vocab_size=1024, seq_len=32),
                        n_windows=7000).get_dataset_size() == 12120 // 4


def test_data_id_of_a_file_counts_every_byte_past_the_first_mebibyte(tmp_path):
    import hashlib
    from mshelpers.config import RunConfig
    from mshelpers.data import data_id
    blob = bytes(range(256)) * 6144 + b"tail"                       # 1.5 MiB and 4 bytes: two reads of 1 MiB
    path = tmp_path / "corpus.bin"
    path.write_bytes(blob)
    want = f"file of {len(blob)} bytes sha256 {hashlib.sha256(blob).hexdigest()[:16]}"
    assert data_id(RunConfig.preset("tiny").replace(data=str(path))) == want == \
        "file of 1572868 bytes sha256 " + hashlib.sha256(blob).hexdigest()[:16]


def test_windows_are_whole_blocks_each_shuffled_with_its_own_seed():
    import numpy as np
    from mshelpers.config import RunConfig
    from mshelpers.data import BLOCK_TOKENS, corpus_tokens, windows
    cfg = RunConfig.preset("tiny").replace(seq_len=1023, batch_size=4, steps=60, seed=7)    # 240 windows
    L, per = 1024, BLOCK_TOKENS // 1024                          # 195 windows a block: 2 blocks
    w = windows(cfg)
    rows = corpus_tokens(cfg.vocab_size, 2 * per * L)[: 2 * per * L].reshape(2 * per, L)
    order = np.concatenate([np.random.default_rng(7).permutation(per),          # block 0: the seed
                            np.random.default_rng([7, 1]).permutation(per) + per])   # block 1: (seed, 1)
    assert w.shape == (2 * per, L) and np.array_equal(w, rows[order])


def test_windows_of_one_per_block_work_and_longer_than_a_block_is_one_line():
    from mshelpers.config import RunConfig
    from mshelpers.data import windows
    one = RunConfig.preset("tiny").replace(seq_len=150_000)      # 150,001 tokens: one window per block
    assert windows(one, n_windows=1).shape == (1, 150_001)
    with pytest.raises(ValueError) as e:
        windows(RunConfig.preset("tiny").replace(seq_len=200_000), n_windows=1)
    assert str(e.value) == ("RunConfig.seq_len=200000 is longer than a corpus block of 200000 tokens; "
                            "fix: use a shorter seq_len")


# --- MindRecord (notebook 08): written once, read back exactly, held to what was written ---
from mshelpers.data import (CorruptMindRecord, PastPrefetch, check_mindrecord, mindrecord_dataset,  # noqa: E402
                            read_mindrecord, read_tokens_per_s, write_mindrecord)


def _tiny_windows(n=40):
    return windows(RunConfig.preset("tiny").replace(vocab_size=1024), n)[:n]


def test_mindrecord_round_trip_is_exact_in_order(tmp_path):
    w = _tiny_windows()
    info = write_mindrecord(w, tmp_path / "w.mindrecord")
    assert (info["rows"], info["seq"], info["raw_bytes"]) == (len(w), w.shape[1], w.astype(np.int32).nbytes)
    assert info["file_bytes"] > 0 and info["index_bytes"] > 0 and info["write_s"] > 0
    back = read_mindrecord(tmp_path / "w.mindrecord")
    assert back.dtype == np.int32 and np.array_equal(back, w)
    rows = [b[0] for b in mindrecord_dataset(tmp_path / "w.mindrecord", 8).create_tuple_iterator(output_numpy=True)]
    assert np.array_equal(np.concatenate(rows), w[:len(w) // 8 * 8])
    r = read_tokens_per_s(mindrecord_dataset(tmp_path / "w.mindrecord", 8, verify=False), epochs=2)
    assert r["batches"] == 2 * (len(w) // 8) and r["tokens"] == r["batches"] * 8 * w.shape[1] and r["tokens_per_s"] > 0
    assert check_mindrecord(tmp_path / "w.mindrecord")["rows"] == len(w)


def test_mindrecord_int64_tokens_within_int32_are_written_as_int32(tmp_path):
    w = _tiny_windows(16).astype(np.int64)
    write_mindrecord(w, tmp_path / "w.mindrecord")
    assert np.array_equal(read_mindrecord(tmp_path / "w.mindrecord"), w)


@pytest.mark.parametrize("bad, match", [
    (np.arange(10, dtype=np.int32), r"windows has shape \(10,\); fix: pass a non-empty \(n, seq_len\+1\)"),
    (np.zeros((0, 5), np.int32), r"windows has shape \(0, 5\); fix:"),
    (np.zeros((2, 5), np.float32), r"windows.dtype=float32 is not an integer type; fix: pass token ids"),
    (np.full((2, 5), 2**40, np.int64), r"windows holds 1099511627776, outside int32; fix:"),
])
def test_write_mindrecord_refuses_bad_windows_in_one_line(tmp_path, bad, match):
    with pytest.raises(ValueError, match=match) as e:
        write_mindrecord(bad, tmp_path / "w.mindrecord")
    assert "\n" not in str(e.value) and not (tmp_path / "w.mindrecord").exists()


def test_write_mindrecord_refuses_another_suffix_and_an_existing_file_without_overwrite(tmp_path):
    with pytest.raises(ValueError, match=r"path='.*w.bin' does not end in .mindrecord; fix: name the file"):
        write_mindrecord(_tiny_windows(8), tmp_path / "w.bin")
    write_mindrecord(_tiny_windows(8), tmp_path / "w.mindrecord")
    with pytest.raises(FileExistsError, match="exists and overwrite=False; fix: overwrite=True"):
        write_mindrecord(_tiny_windows(8), tmp_path / "w.mindrecord", overwrite=False)


def _written(tmp_path):
    p = tmp_path / "w.mindrecord"
    write_mindrecord(_tiny_windows(), p)
    return p


def test_a_truncated_mindrecord_is_one_line_before_mindata_reads_it(tmp_path):
    p = _written(tmp_path)
    data = p.read_bytes()
    p.write_bytes(data[:len(data) // 2])
    for call in (lambda: read_mindrecord(p), lambda: mindrecord_dataset(p, 8)):
        with pytest.raises(CorruptMindRecord, match=rf"holds {len(data) // 2} bytes where {len(data)} were written "
                                                    r"\(truncated\); fix: write it again") as e:
            call()
        assert "\n" not in str(e.value)


def test_a_changed_data_byte_is_caught_although_mindrecord_keeps_no_checksum(tmp_path):
    p = _written(tmp_path)
    data = bytearray(p.read_bytes())
    nz = np.flatnonzero(np.frombuffer(bytes(data), np.uint8))
    data[int(nz[-len(nz) // 3])] ^= 0x01              # one bit, inside the written data: same size
    p.write_bytes(bytes(data))
    with pytest.raises(CorruptMindRecord, match=r"bytes differ from those written \(SHA-256 .*\): corrupt; fix:") as e:
        read_mindrecord(p)
    assert "\n" not in str(e.value)


def test_missing_file_index_or_record_is_one_line(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"nope.mindrecord does not exist; fix: write it"):
        check_mindrecord(tmp_path / "nope.mindrecord")
    p = _written(tmp_path)
    (tmp_path / "w.mindrecord.json").write_text("{not json")
    with pytest.raises(CorruptMindRecord, match=r"w.mindrecord.json is unreadable \(JSONDecodeError\); fix:"):
        check_mindrecord(p)
    (tmp_path / "w.mindrecord.json").unlink()
    with pytest.raises(CorruptMindRecord, match=r"has no record of what was written \(w.mindrecord.json\); fix:"):
        check_mindrecord(p)
    p = _written(tmp_path)
    (tmp_path / "w.mindrecord.db").unlink()
    with pytest.raises(CorruptMindRecord, match=r"index w.mindrecord.db is missing; fix: write it again"):
        read_mindrecord(p)


def test_read_and_batch_arguments_are_refused_in_one_line(tmp_path):
    p = _written(tmp_path)
    with pytest.raises(ValueError, match=r"batch_size=0 is invalid; fix: pass an integer >= 1"):
        mindrecord_dataset(p, 0)
    with pytest.raises(ValueError, match=r"epochs=0 is invalid; fix:"):
        read_tokens_per_s(mindrecord_dataset(p, 8), epochs=0)


# --- PastPrefetch (notebook 08): the reader timed past the batches it read ahead ---
def _reader_thread(per_item_s, queue_size, n=40):
    """A real read-ahead pipeline: a thread that takes `per_item_s` per item and fills a bounded queue."""
    import queue
    import threading
    q = queue.Queue(maxsize=queue_size)

    def read():
        for i in range(n):
            time.sleep(per_item_s)
            q.put(i)
    threading.Thread(target=read, daemon=True).start()
    return q


def test_past_prefetch_drops_the_read_ahead_batches_and_then_waits_for_the_reader():
    q = _reader_thread(0.03, queue_size=4)
    time.sleep(0.4)                                    # the queue fills while "the process compiles"
    assert q.full()
    feed = PastPrefetch(q.get, min_wait_s=0.015)
    first = feed()
    # the 4 queued and the one the reader held, waiting for room: 5 came at once; the 6th was read meanwhile
    assert feed.drained["dropped"] == 5 and feed.drained["wait_s"] >= 0.015 and first == 5
    t0 = time.perf_counter()
    feed(); feed()
    assert time.perf_counter() - t0 >= 0.05           # each fresh item waits for the reader (30 ms)
    times = feed.fetch_times(3)
    assert len(times) == 3 and min(times) >= 0.02      # the reader alone: 30 ms per item, nothing queued
    with pytest.raises(ValueError, match=r"n=0 is invalid; fix:"):
        feed.fetch_times(0)


def test_past_prefetch_refuses_bad_arguments_and_a_reader_that_never_waits():
    with pytest.raises(ValueError, match=r"fetch=3 is not callable; fix:"):
        PastPrefetch(3, 0.1)
    with pytest.raises(ValueError, match=r"min_wait_s=0 is invalid; fix:"):
        PastPrefetch(lambda: 1, 0)
    with pytest.raises(ValueError, match=r"max_batches=0 is invalid; fix:"):
        PastPrefetch(lambda: 1, 0.1, max_batches=0)
    with pytest.raises(RuntimeError, match=r"5 batches came without a wait of 0.1 s \(max_batches=5\); fix:") as e:
        PastPrefetch(lambda: 1, 0.1, max_batches=5)()
    assert "\n" not in str(e.value)
