"""Linnet: a small typed language for neural-network blocks, and Nest, its model zoo.

Importing linnet imports none of torch, jax or onnx; each backend loads its framework lazily.
"""
__version__ = "0.1.0"

from .diagnostics import InternalError, LinnetError  # noqa: E402

__all__ = ["LinnetError", "InternalError", "__version__"]
