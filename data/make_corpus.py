"""Regenerate a committed synthetic corpus: python data/make_corpus.py [--vocab 1024] [--seed 0] [--tokens 200000]

Two are committed: --vocab 1024 (the mini preset) and --vocab 256 (tiny, which the CLI tests start ~60 times:
generating it costs about 1 s per process).

The file is a cache: mshelpers.data generates the same tokens when it is missing,
and tests/test_data.py checks that the committed file matches the generator.
"""
import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from mshelpers.data import MarkovSource, corpus_path  # noqa: E402

if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--vocab", type=int, default=1024)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tokens", type=int, default=200_000)
    a = ap.parse_args()
    src = MarkovSource(vocab_size=a.vocab, seed=a.seed)
    toks = src.sample(a.tokens, seed=a.seed + 1).astype(np.int16)
    out = corpus_path(a.vocab, a.seed)
    np.save(out, toks)
    print(f"wrote {out} ({out.stat().st_size:,} bytes), entropy floor {src.entropy_floor():.4f} nats/token")
