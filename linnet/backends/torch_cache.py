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
written at most once (`filled`: per slot, the positions written so far). An append writes only positions
past the view it extends, which no view handed out covers yet; a second append over a
position already written (the Llama decode's final concat writes the columns its layers
wrote) must carry the same values there, checked, or it falls back to `torch.cat`. So a
view, once returned, never changes, and every append returns what `torch.cat` would.
Anything that does not fit (another shape, dtype or stride, a view not at the buffer's
start, no room left) is `torch.cat`.
"""
from __future__ import annotations


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
        #: Per slot, how many positions from the first are written: an append writes only the
        #: positions after them, and compares (never rewrites) positions already written.
        self.filled = [filled] * shape[0]
        #: (offset, shape, strides, dtype, dim) of a view -> its (first slot, slot count), or None.
        self._geometry: dict = {}
        #: How many appends wrote in place, and how many fell back to torch.cat (tests read them).
        self.in_place = self.copied = 0

    def view(self, length: int):
        """The first `length` positions: what `decode` is given."""
        return self.data.narrow(self.axis, 0, length)

    def append(self, a, b, dim: int):
        """`torch.cat([a, b], dim)`, written into the buffer after `a` when `a` is a prefix of it.
        Kept to a few tensor calls: it runs once per layer per step."""
        key = (a.storage_offset(), a.shape, a.stride(), a.dtype, dim)
        slots = self._geometry.get(key, False)
        if slots is False:
            slots = self._geometry[key] = self._slots(a, dim)
        shape = a.shape
        n = shape[dim]
        if (slots is None or b.dim() != a.dim() or b.dtype != a.dtype or b.shape[:dim] != shape[:dim]
                or b.shape[dim + 1:] != shape[dim + 1:]):
            return self._cat(a, b, dim)
        m = b.shape[dim]
        if m <= 0 or n + m > self.capacity:
            return self._cat(a, b, dim)
        first, count = slots
        grown = list(shape)
        grown[dim] = n + m
        grown = a.as_strided(grown, a.stride(), a.storage_offset())
        region = grown.narrow(dim, n, m)
        filled = self.filled
        if count == 1 and a.dim() < self.data.dim():  # one slot
            have = filled[first]
            if have == n:
                region.copy_(b)
                filled[first] = n + m
            elif have < n + m or not _equal(region, b):
                return self._cat(a, b, dim)
        else:
            runs = self._runs(first, count, n, m)
            if runs is None:
                return self._cat(a, b, dim)
            written, todo = runs
            for start, stop in written:  # the same values only, else a view handed out would change
                if not _equal(region[start:stop], b[start:stop]):
                    return self._cat(a, b, dim)
            for start, stop in todo:
                region[start:stop].copy_(b[start:stop])
                filled[first + start:first + stop] = [n + m] * (stop - start)
        self.in_place += 1
        return grown

    def _runs(self, first: int, count: int, n: int, m: int):
        """The slots of a run (relative to `first`) whose positions n..n+m are all written, and
        those with none written, as (start, stop) runs each; None if any is partly written or a
        slot's written positions stop short of n (a view over positions never written)."""
        written, todo = [], []
        for index, have in enumerate(self.filled[first:first + count]):
            if have == n:
                runs = todo
            elif have >= n + m:
                runs = written
            else:
                return None
            if runs and runs[-1][1] == index:
                runs[-1] = (runs[-1][0], index + 1)
            else:
                runs.append((index, index + 1))
        return written, todo

    def _cat(self, a, b, dim: int):
        import torch

        self.copied += 1
        return torch.cat([a, b], dim=dim)

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


def _equal(x, y) -> bool:
    import torch

    return torch.equal(x, y)
