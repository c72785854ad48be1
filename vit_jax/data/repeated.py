"""Repeated augmentation (Hoffer et al. 2020; DeiT's RASampler idea): each image appears k times in every global
batch, each copy with its own augmentation draw.

Which copy goes where is a pure function of (seed, step, row), like the rest of the training stream (indexing.py),
so resume is exact and the batch is the same for any number of processes or devices. A global batch of B rows holds
B / k distinct images; copy c of the batch's j-th image is row `c * (B / k) + j`. The k copies of an image are thus
B / k rows apart, spread over the batch as evenly as it allows: with the batch's rows laid out process by process
(and device by device), an image's copies land on k different processes whenever k <= the process count (DeiT puts
them on different GPUs for the same reason: a process's slice holds as many distinct images as possible).

The distinct images come from the usual stream of per-epoch permutations: the batch at step s takes unique
positions [s * B/k, (s + 1) * B/k) of it, so an "epoch" of N training examples shows N / k distinct images k times
each, as DeiT's sampler does. Each copy keeps the augmentation generator of its own global position, so the k draws
differ.
"""

from __future__ import annotations

import numpy as np

from vit_jax.data.indexing import EpochSchedule
from vit_jax.errors import ConfigError


def check_repeats(repeats: int, global_batch_size: int) -> None:
    """A one-line ConfigError unless `repeats` copies of each image fit whole in a global batch."""
    if repeats < 1:
        raise ConfigError(f"data.repeated_augmentation={repeats}: give the copies per image, 1 (off) or more, e.g. 3")
    if global_batch_size % repeats:
        raise ConfigError(f"data.repeated_augmentation={repeats} does not divide batch_size={global_batch_size}: "
                          "each global batch holds every image's copies whole")


def copy_layout(rows: np.ndarray, global_batch_size: int, repeats: int) -> tuple[np.ndarray, np.ndarray]:
    """(distinct image slot within the batch, copy number) of batch rows."""
    distinct = global_batch_size // repeats
    rows = np.asarray(rows, np.int64)
    return rows % distinct, rows // distinct


class RepeatedSchedule:
    """Maps global example positions to records with every image repeated `repeats` times per global batch."""

    def __init__(self, schedule: EpochSchedule, global_batch_size: int, repeats: int) -> None:
        check_repeats(repeats, global_batch_size)
        self.schedule, self.global_batch_size, self.repeats = schedule, global_batch_size, repeats
        self.size = schedule.size

    def unique_positions(self, positions: np.ndarray) -> np.ndarray:
        """The position in the stream of distinct images that each global example position shows."""
        positions = np.asarray(positions, np.int64)
        step, row = np.divmod(positions, self.global_batch_size)
        slot, _ = copy_layout(row, self.global_batch_size, self.repeats)
        return step * (self.global_batch_size // self.repeats) + slot

    def records(self, positions: np.ndarray) -> np.ndarray:
        """Record indices for global example positions (as EpochSchedule.records)."""
        return self.schedule.records(self.unique_positions(positions))
