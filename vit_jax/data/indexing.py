"""Which record goes where: the pure functions that make the pipeline deterministic and topology-independent.

The training stream is the concatenation of per-epoch permutations of the (optionally fraction-subsetted) split.
Global example position p (step * global_batch + row) maps to record `subset[perm_{p // n}[p % n]]`, and its
augmentation randomness comes from a generator seeded by (seed, p). Nothing here depends on the number of
processes or devices: a process only chooses which rows of the global batch it materialises.
"""

from __future__ import annotations

import numpy as np

# Fixed so that fraction subsets are nested (fraction 0.1 is a subset of 0.2) and do not move with the seed.
_SUBSET_SEED = 20_240_601
_AUG_STREAM = 1  # distinguishes augmentation generators from the permutation generators


def subset_indices(num_records: int, fraction: float) -> np.ndarray | None:
    """Records in the `fraction` subset (sorted), or None for the whole split."""
    if not 0.0 < fraction <= 1.0:
        raise ValueError(f"fraction must be in (0, 1], got {fraction}")
    if fraction == 1.0:
        return None
    count = max(1, int(round(num_records * fraction)))
    order = np.random.default_rng(_SUBSET_SEED).permutation(num_records)
    return np.sort(order[:count])


class EpochSchedule:
    """Maps global example positions to record indices: shuffled per epoch, or in order (shuffle=False)."""

    def __init__(self, num_records: int, seed: int, fraction: float = 1.0, shuffle: bool = True) -> None:
        if num_records <= 0:
            raise ValueError("the split is empty")
        self.seed = int(seed)
        self.shuffle = shuffle
        self._subset = subset_indices(num_records, fraction)
        self.size = num_records if self._subset is None else len(self._subset)
        self._perms: dict[int, np.ndarray] = {}

    def _permutation(self, epoch: int) -> np.ndarray:
        if epoch not in self._perms:
            if len(self._perms) >= 2:  # a batch spans at most two epochs (unless batch > split): keep memory flat
                self._perms.pop(min(self._perms))
            dtype = np.int32 if self.size < 2**31 else np.int64
            self._perms[epoch] = np.random.default_rng([self.seed, epoch]).permutation(self.size).astype(dtype)
        return self._perms[epoch]

    def records(self, positions: np.ndarray) -> np.ndarray:
        """Record indices for global example positions (any non-negative ints)."""
        positions = np.asarray(positions, np.int64)
        epochs, within = np.divmod(positions, self.size)
        if self.shuffle:
            out = np.empty_like(positions)
            for epoch in np.unique(epochs):
                sel = epochs == epoch
                out[sel] = self._permutation(int(epoch))[within[sel]]
        else:
            out = within
        return out if self._subset is None else self._subset[out]


def example_rng(seed: int, position: int) -> np.random.Generator:
    """The augmentation generator of the example at global position `position`."""
    return np.random.default_rng([int(seed), int(position), _AUG_STREAM])


def sharding_rows(sharding, global_batch_size: int) -> tuple[int, int]:
    """Rows [lo, hi) of the global batch that this process's devices hold under `sharding`.

    Read from the sharding itself (not from process_index), so any device order is handled; the rows must form
    one contiguous block, which holds for every mesh whose batch axes are laid out process by process.
    """
    ndim = max(1, len(getattr(sharding, "spec", ())))
    index_map = sharding.addressable_devices_indices_map((global_batch_size,) + (1,) * (ndim - 1))
    blocks = sorted({(idx[0].start or 0, global_batch_size if idx[0].stop is None else idx[0].stop)
                     for idx in index_map.values()})
    lo, hi = blocks[0][0], blocks[0][1]
    for start, stop in blocks[1:]:
        assert start <= hi, f"this process's batch rows are not contiguous: {blocks}"
        hi = max(hi, stop)
    return lo, hi
