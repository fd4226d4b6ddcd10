"""Data-parallel shards checked: did the ranks read disjoint samples that together make up the full set?

Each data-parallel rank must read its own shard (`mindspore.dataset`'s num_shards / shard_id, see
`mshelpers.data.make_dataset`); a rank that reads another's samples, or every rank reading everything, trains on
a smaller effective batch without any error. `check_shards` compares the sample ids each rank read.

Example:
    >>> from mshelpers.shards import check_shards
    >>> check_shards([[0, 2, 4], [1, 3, 5]], range(6))["ok"]
    True

Copied alone it needs the standard library.
"""
from __future__ import annotations

from typing import Any, Iterable, Sequence


# ---------------------------------------------------------------- the shard check
def check_shards(per_rank_ids: Sequence[Iterable[Any]], full_ids: Iterable[Any] | None = None) -> dict[str, Any]:
    """Did the ranks read disjoint samples that together make up the full set? (the seeds' shard_id bug)

    `per_rank_ids[r]` lists the ids of the samples rank r read (any hashable: window hashes,
    row indices); `full_ids` the samples one process would read for the same steps.
    Returns counts plus `disjoint`, `union_is_full` and `ok` (both true), and
    `duplicate_share`: the share of all reads that repeat a sample another read already had.

        >>> check_shards([[0, 2, 4], [1, 3, 5]], range(6))["ok"]
        True
        >>> r = check_shards([[0, 1, 2], [0, 1, 2]], range(6))
        >>> r["disjoint"], r["union_is_full"], r["duplicate_share"], r["missing"]
        (False, False, 0.5, 3)

    Taught in notebooks/04_data_parallel.ipynb.
    """
    ranks = [list(ids) for ids in per_rank_ids]
    if len(ranks) < 1 or any(len(r) == 0 for r in ranks):
        raise ValueError(f"check_shards: per_rank_ids has {len(ranks)} ranks, some empty; "
                         "fix: pass one non-empty list of sample ids per rank")
    sets = [set(r) for r in ranks]
    union = set().union(*sets)
    reads = sum(len(r) for r in ranks)
    overlap = sum(len(sets[i] & sets[j]) for i in range(len(sets)) for j in range(i + 1, len(sets)))
    out = {"ranks": len(ranks), "reads": reads, "unique": len(union), "pairwise_overlap": overlap,
           "disjoint": overlap == 0, "duplicate_share": 1 - len(union) / reads}
    if full_ids is not None:
        full = set(full_ids)
        out.update(full=len(full), missing=len(full - union), extra=len(union - full),
                   union_is_full=union == full)
    else:
        out["union_is_full"] = None
    out["ok"] = bool(out["disjoint"] and out["union_is_full"] is not False)
    return out
