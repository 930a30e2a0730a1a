"""A decoder's cache written in place on torch: one preallocated buffer per `generate`.

A decoder's `decode` entry (GPT-2's and the Llama source's) grows its typed cache
`[Slots, 2, B, Heads, P, Dh]` by concatenation: each layer attends over
`concat(cache[slot], column, 3)`, and the result is `concat(cache, new, 4)`. Run as written,
that copies every layer's keys and values twice per step. The torch emitter writes a
`concat` whose first operand is a function's input (or a slot of one) as `_cat_onto(a, b,
dim)` (`torch_source`), which is `torch.cat([a, b], dim)` unless `a` lies in a buffer
registered in the generated module's `_BUFFERS`: then `CacheBuffer.append` writes `b` into
the buffer right after `a` and returns the longer view, no copy of `a`.

`generate` on torch (`linnet/nest/generate.py`, `BufferSteps`) allocates the buffer once,
`[Slots, 2, B, Heads, S + new - 1, Dh]`, copies `prefill`'s cache into its first S
positions, and passes `decode` the filled prefix, a view; each step's appends fill position
P, and the returned cache is the prefix one longer, the same storage throughout.

Why this is exact whatever the entry does with its cache: every element of the buffer is
written at most once (`written`, per slot and position). An append writes only positions
past the view it extends, which no view handed out covers yet; a second append over a
position already written (the Llama decode's final concat writes the columns its layers
wrote) must carry the same values there, checked, or it falls back to `torch.cat`. So a
view, once returned, never changes, and every append returns what `torch.cat` would.
Anything that does not fit (another shape, dtype or stride, a view not at the buffer's
start, no room left) is `torch.cat`.
"""
from __future__ import annotations

import numpy as np


class CacheBuffer:
    """`capacity` positions along `axis` of a cache shaped like `prefix`, its first
    `prefix.shape[axis]` positions `prefix`'s values."""

    def __init__(self, prefix, capacity: int, axis: int):
        shape = list(prefix.shape)
        filled = shape[axis]
        if capacity < filled:
            raise ValueError(f"a buffer of {capacity} positions cannot hold a cache of {filled}")
        shape[axis] = capacity
        self.data = prefix.new_empty(shape)
        self.data.narrow(axis, 0, filled).copy_(prefix)
        self.axis = axis
        self.capacity = capacity
        self.ptr = self.data.untyped_storage().data_ptr()
        #: (slot, position) -> written once: `append` never writes one twice with other values.
        self.written = np.zeros((shape[0], capacity), bool)
        self.written[:, :filled] = True
        #: How many appends wrote in place, and how many fell back to torch.cat (tests read them).
        self.in_place = self.copied = 0

    def view(self, length: int):
        """The first `length` positions: what `decode` is given."""
        return self.data.narrow(self.axis, 0, length)

    def append(self, a, b, dim: int):
        """`torch.cat([a, b], dim)`, written into the buffer after `a` when `a` is a prefix of it."""
        import torch

        slots = self._slots(a, dim)
        n, m = a.shape[dim], b.shape[dim] if b.dim() == a.dim() else -1
        expected = list(a.shape)
        expected[dim] = m
        if (slots is None or m <= 0 or list(b.shape) != expected or b.dtype != a.dtype or b.device != a.device
                or n + m > self.capacity):
            self.copied += 1
            return torch.cat([a, b], dim=dim)
        first, count = slots
        written = self.written[first:first + count, n:n + m]
        whole = written.all(axis=1)
        region = a.as_strided(expected, a.stride(), a.storage_offset() + n * a.stride(dim))
        if written.any():
            # Positions another append wrote: only the same values may go there (else a view
            # already handed out would change); the rest is written below.
            if not (whole | ~written.any(axis=1)).all():
                self.copied += 1
                return torch.cat([a, b], dim=dim)
            done = np.flatnonzero(whole)
            index = torch.from_numpy(done).to(a.device)
            same = (torch.equal(region, b) if a.dim() < self.data.dim()
                    else torch.equal(region.index_select(0, index), b.index_select(0, index)))
            if not same:
                self.copied += 1
                return torch.cat([a, b], dim=dim)
            todo = np.flatnonzero(~whole)
            if len(todo) and a.dim() == self.data.dim():
                for start, stop in _runs(todo):
                    region[start:stop].copy_(b[start:stop])
        else:
            region.copy_(b)
        self.written[first:first + count, n:n + m] = True
        self.in_place += 1
        grown = list(a.shape)
        grown[dim] = n + m
        return a.as_strided(grown, a.stride(), a.storage_offset())

    def _slots(self, a, dim: int):
        """(first slot, slot count) when `a` is the buffer's first positions over a run of
        whole slots (`data[i:j, ..., :n, :]`, or one slot `data[i, ..., :n, :]`), else None."""
        data = self.data
        if a.untyped_storage().data_ptr() != self.ptr or a.device != data.device or a.dtype != data.dtype:
            return None
        offset = a.storage_offset() - data.storage_offset()
        step = data.stride(0)
        if offset < 0 or offset % step:
            return None
        first = offset // step
        if a.dim() == data.dim():  # a run of slots
            inner, axis, count = 1, self.axis, a.shape[0]
            if tuple(a.stride()) != tuple(data.stride()):
                return None
        elif a.dim() == data.dim() - 1:  # one slot
            inner, axis, count = 0, self.axis - 1, 1
            if tuple(a.stride()) != tuple(data.stride())[1:]:
                return None
        else:
            return None
        if dim != axis or first + count > data.shape[0]:
            return None
        for i in range(inner, a.dim()):
            if i != dim and a.shape[i] != data.shape[i + 1 - inner]:
                return None
        return first, count


def _runs(indices: np.ndarray):
    """Consecutive runs of sorted indices as (start, stop) pairs."""
    breaks = np.flatnonzero(np.diff(indices) != 1) + 1
    for run in np.split(indices, breaks):
        yield int(run[0]), int(run[-1]) + 1
