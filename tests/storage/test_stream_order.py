"""The read order of a bucket stream is pure arithmetic: each epoch the processes read disjoint files that together
hold every record once, windows only permute their own records, and a position maps to the same record however the
order object was reached (which is what makes resume from a count exact)."""

import numpy as np
import pytest

from vit_jax.data.stream_order import MIN_BLOCKS_PER_PROCESS, StreamOrder, make_blocks

SIZES = [50, 0, 37, 61, 44, 58, 49, 40, 55, 52]  # records per file slice (one empty), 446 in all


def orders(count, **kw):
    kw = {"seed": 3, "window": 64, "shuffle": True, **kw}
    return [StreamOrder(SIZES, process_index=p, process_count=count, **kw) for p in range(count)]


def slice_of(records):
    return np.searchsorted(np.cumsum(SIZES), records, side="right")


@pytest.mark.parametrize("count", [1, 2, 3])
def test_every_epoch_every_record_once_and_processes_read_disjoint_files(count):
    procs = orders(count)
    for epoch in range(3):
        per_process = []
        for order in procs:
            start = sum(order.epoch_length(e) for e in range(epoch))
            per_process.append(order.records(np.arange(start, start + order.epoch_length(epoch))))
        everything = np.concatenate(per_process)
        assert sorted(everything.tolist()) == list(range(sum(SIZES)))
        if count > 1 and len(SIZES) >= MIN_BLOCKS_PER_PROCESS * count:  # whole files: nobody shares a file
            files = [set(slice_of(r).tolist()) for r in per_process]
            assert all(not (files[a] & files[b]) for a in range(count) for b in range(a + 1, count))
    assert not np.array_equal(orders(count)[0].records(np.arange(200)), np.arange(200))  # shuffled


def test_windows_permute_only_their_own_records_and_position_is_a_pure_function():
    order = orders(1, window=64)[0]
    stream = order.records(np.arange(1000))
    unshuffled = StreamOrder(SIZES, seed=3, process_index=0, process_count=1, window=64, shuffle=False)
    # Window w of the first epoch holds exactly the records of the same window of the unpermuted block order.
    rows, _ = order.epoch_blocks(0)
    in_order = np.concatenate([np.arange(a, b) for _, a, b in rows])
    for lo in range(0, order.epoch_length(0), 64):
        hi = min(lo + 64, order.epoch_length(0))
        assert sorted(stream[lo:hi]) == sorted(in_order[lo:hi]) and not np.array_equal(stream[lo:hi], in_order[lo:hi])
    assert len(unshuffled.records(np.arange(10))) == 10
    # A fresh object asked for late positions first (as after a resume) gives the same records.
    fresh = orders(1, window=64)[0]
    np.testing.assert_array_equal(fresh.records(np.arange(900, 1000)), stream[900:])
    other_seed = orders(1, window=64, seed=4)[0]
    assert not np.array_equal(other_seed.records(np.arange(100)), stream[:100])


def test_slices_needed_cover_what_positions_read_and_few_files_are_cut_into_blocks():
    order = orders(2, window=50)[1]
    for first in (0, 37, 333):
        needed = set(order.slices(first, first + 40))
        assert set(slice_of(order.records(np.arange(first, first + 40))).tolist()) <= needed
    blocks = make_blocks([1437], process_count=2)  # digits: one file for two processes
    assert len(blocks) == MIN_BLOCKS_PER_PROCESS * 2 and blocks[0, 1] == 0 and blocks[-1, 2] == 1437
    assert np.all(blocks[1:, 1] == blocks[:-1, 2])
    with pytest.raises(ValueError, match="too few"):
        StreamOrder([3], seed=0, process_index=0, process_count=4, window=8, shuffle=True)


def test_eval_order_is_each_process_share_in_file_order():
    procs = orders(3, shuffle=False)
    shares = [o.records(np.arange(o.epoch_length(0))) for o in procs]
    np.testing.assert_array_equal(np.concatenate(shares), np.arange(sum(SIZES)))
