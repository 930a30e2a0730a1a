"""One adapter per array framework (numpy, PyTorch, JAX), for code that handles all three.

The weight loader reads checkpoints into whichever framework a backend runs on, and the
optimiser's bind-time plan concatenates and scales those arrays; both go through the small
class here that stands for the array's framework, instead of guessing from module names
each on its own.  A framework overrides only what it does differently from the base class
(cf. einops' `_backends.py`), and is imported only when one of its arrays is handled, so
importing this module imports none of them.

`framework(name)` finds an adapter by the name safetensors gives the framework ("numpy",
"pt", "flax"); `framework_of(array)` by the type of an array.
"""
from __future__ import annotations

from typing import Any, Sequence

from .dtypes import DType

__all__ = ["Framework", "framework", "framework_of", "FRAMEWORKS"]


class Framework:
    """What the loader and the optimiser need from an array library."""

    #: safetensors' `framework=` for it, and what `load_tensors(framework=...)` accepts.
    names: tuple[str, ...] = ()
    #: The top-level modules its array types are defined in.
    modules: tuple[str, ...] = ()
    #: Whether safetensors' `get_tensor` copies the tensor out of the file's memory map into
    #: an array of this framework's own (numpy, JAX) rather than viewing the map (torch).
    #: A copying read leaves the pages it touched in the process's RSS while the file stays
    #: open, so the loader opens the file once per tensor for these (`linnet.nest.weights`).
    copies_on_read: bool = True
    #: Whether the loader copies each tensor straight from a memory-mapped numpy view with
    #: `from_mapped` instead of through safetensors (see `Jax`).
    reads_mapped: bool = False

    @property
    def safetensors_name(self) -> str:
        return self.names[0]

    def owns(self, array: Any) -> bool:
        return type(array).__module__.split(".")[0] in self.modules

    def concat(self, parts: Sequence[Any], axis: int) -> Any:
        raise NotImplementedError

    def cast(self, array: Any, dtype: DType) -> Any:
        raise NotImplementedError

    def to_numpy(self, array: Any):
        import numpy as np

        return np.asarray(array)

    def scale_rows(self, array: Any, row_scales: Sequence[tuple[int, int, float]], owned: bool) -> Any:
        """`array` with rows [start, stop) multiplied by their factor, in place when `owned`
        (the caller made it, e.g. by concatenating) and writeable, else on a copy."""
        if not (owned and self._writeable(array)):
            array = self._copy(array)
        for start, stop, factor in row_scales:
            array[start:stop] *= self._scalar(array, factor)
        return array

    def _writeable(self, array: Any) -> bool:
        return True

    def _copy(self, array: Any) -> Any:
        raise NotImplementedError

    def _scalar(self, array: Any, factor: float) -> Any:
        return factor


class Numpy(Framework):
    names = ("numpy", "np")
    modules = ("numpy",)

    def concat(self, parts, axis):
        import numpy as np

        return np.concatenate(parts, axis=axis)

    def cast(self, array, dtype):
        return array.astype(dtype.numpy_type())

    def _writeable(self, array):
        return array.flags.writeable  # a memory-mapped checkpoint's arrays are read-only

    def _copy(self, array):
        import numpy as np

        return np.array(array)

    def _scalar(self, array, factor):
        # In the array's own dtype, so an f16 array is not promoted by a Python float.
        return array.dtype.type(factor)


class Torch(Framework):
    names = ("pt",)
    modules = ("torch",)
    copies_on_read = False

    def concat(self, parts, axis):
        import torch

        return torch.cat(parts, dim=axis)

    def cast(self, array, dtype):
        return array.to(dtype.torch_type())

    def to_numpy(self, array):
        return array.detach().cpu().numpy()

    def _copy(self, array):
        return array.clone()


class Jax(Framework):
    names = ("flax",)
    modules = ("jax", "jaxlib")

    def concat(self, parts, axis):
        import jax.numpy as jnp

        return jnp.concatenate(parts, axis=axis)

    # safetensors' flax reader copies each tensor twice (into a bytes object, then into a JAX
    # buffer); the freed bytes fragment the heap, so a second load in the process grew RSS by
    # ~60% of the weights again.  One copy from the mapped file into JAX's own buffer does not.
    reads_mapped = True

    def from_mapped(self, view):
        """A JAX array (default device) copied from `view`, a numpy view of a memory-mapped file."""
        import jax

        # Wait for the copy: the caller unmaps the file once the last view is dropped, and
        # waiting keeps one tensor's pages mapped at a time rather than the whole file's.
        return jax.device_put(view).block_until_ready()

    def cast(self, array, dtype):
        return array.astype(dtype.jax_type())

    def scale_rows(self, array, row_scales, owned):
        for start, stop, factor in row_scales:  # JAX arrays are immutable: each update is a new array
            array = array.at[start:stop].multiply(factor)
        return array


FRAMEWORKS: tuple[Framework, ...] = (Numpy(), Torch(), Jax())
_BY_NAME = {name: f for f in FRAMEWORKS for name in f.names}


def framework(name: str) -> Framework:
    """The adapter safetensors calls `name` ("numpy" or "np", "pt", "flax")."""
    try:
        return _BY_NAME[name]
    except (KeyError, TypeError):
        raise ValueError(f"framework must be one of {sorted(_BY_NAME)}, got {name!r}") from None


def framework_of(array: Any) -> Framework:
    """The adapter for an array's type: numpy arrays, torch tensors, JAX arrays."""
    for candidate in FRAMEWORKS:
        if candidate.owns(array):
            return candidate
    raise TypeError(f"no array framework for {type(array).__module__}.{type(array).__qualname__}: "
                    f"expected a numpy array, a torch tensor or a JAX array")
