"""What a checked model says about its parameters: the contract between compiler and loader."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ParamSpec:
    """One parameter of an instantiated model, e.g. `layers.0.attention.query.weight`.

    `name` is the dotted path through sub-blocks (array elements by index), `shape` is
    concrete (every generic of the model is bound), `dtype` a Linnet dtype name ("f32", ...).
    """

    name: str
    shape: tuple[int, ...]
    dtype: str

    @property
    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n
