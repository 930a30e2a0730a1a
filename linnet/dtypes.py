"""Every dtype Linnet knows, and how each framework and file format spells it.

One frozen `DType` record per dtype holds all of its facts: its kind and width, the range
of numbers it holds, and its name in numpy, PyTorch, JAX, ONNX, Triton and safetensors.
Every other module asks this table (`by_name("f32").torch`, `from_safetensors("BF16")`)
instead of keeping a map of its own, so adding a dtype is one record here.

Spellings are plain data (strings, ONNX's enum numbers), so importing this module imports
no framework; `numpy_type`, `torch_type` and `jax_type` resolve the framework's own object
when a caller that has the framework loaded asks for it.

Besides Linnet's own dtypes (`LINNET`), the table holds the few a checkpoint may store that
the language has no type for (fp8, wide unsigned ints, `STORED_ONLY`): a safetensors header
naming one is still a valid file, and its bytes must be counted.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["DType", "UnknownDType", "LINNET", "STORED_ONLY", "SPELLINGS", "by_name", "from_safetensors",
           "from_numpy", "from_torch", "from_jax", "from_onnx", "from_triton", "from_triton_wire", "lookup",
           "names"]


class UnknownDType(ValueError):
    """A spelling no dtype in the table has."""


@dataclass(frozen=True)
class DType:
    """One dtype and its spelling in each framework (None: the framework has no such type)."""

    name: str         # Linnet's spelling, "f32"
    kind: str         # "float", "int" or "bool"
    bits: int         # storage width; bool takes a byte, as in every framework here
    safetensors: str  # the header's "dtype", "F32"
    numpy: str | None = None        # np.dtype(...).name, "float32"
    torch: str | None = None        # attribute of the torch module, "float32"
    jax: str | None = None          # attribute of jax.numpy, "float32" ("bool_")
    onnx: int | None = None         # onnx.TensorProto.DataType number (stable: part of the file format)
    triton: str | None = None       # DataType of a Triton config.pbtxt, "TYPE_FP32"
    triton_wire: str | None = None  # datatype of a Triton/KServe inference request, "FP32"
    signed: bool = True
    #: The largest finite value of a float dtype (its smallest is the negative).
    float_max: float | None = None
    #: numpy has no such type and ml_dtypes (a JAX dependency) provides it (bf16).
    numpy_extension: bool = False
    #: Whether Linnet programs may use it; False for dtypes only checkpoints store.
    linnet: bool = True

    def __str__(self) -> str:
        return self.name

    @property
    def itemsize(self) -> int:
        """Bytes per element, as stored in a checkpoint or an array."""
        return self.bits // 8

    @property
    def is_float(self) -> bool:
        return self.kind == "float"

    @property
    def is_int(self) -> bool:
        return self.kind == "int"

    @property
    def in_numpy(self) -> bool:
        """Whether plain numpy has this type (bf16 needs ml_dtypes)."""
        return self.numpy is not None and not self.numpy_extension

    def number_range(self) -> tuple[float, float]:
        """The smallest and largest number it holds (finite values, for floats)."""
        if self.kind == "bool":
            return 0, 1
        if self.kind == "int":
            return (-2 ** (self.bits - 1), 2 ** (self.bits - 1) - 1) if self.signed else (0, 2 ** self.bits - 1)
        top = self.float_max if self.float_max is not None else float("inf")
        return -top, top

    def numpy_type(self):
        """numpy's dtype object for it; bf16 comes from ml_dtypes, which registers it with numpy."""
        import numpy as np

        if self.numpy is None:
            raise UnknownDType(f"dtype {self.name} has no numpy type")
        if self.numpy_extension:
            import ml_dtypes  # noqa: F401  (importing it registers bfloat16 with numpy)
        return np.dtype(self.numpy)

    def torch_type(self):
        """The `torch.dtype` object (imports torch)."""
        import torch

        return getattr(torch, self._required("torch"))

    def jax_type(self):
        """The `jax.numpy` scalar type (imports jax)."""
        import jax.numpy as jnp

        return getattr(jnp, self._required("jax"))

    def _required(self, spelling: str) -> Any:
        value = getattr(self, spelling)
        if value is None:
            raise UnknownDType(f"dtype {self.name} has no {spelling} type")
        return value


def _float(name, bits, safetensors, numpy, onnx, triton, float_max, **extra) -> DType:
    # numpy, torch and jax.numpy all name floats alike ("bfloat16"); Triton's config type is
    # its request datatype with TYPE_ before it.
    return DType(name, "float", bits, safetensors, numpy, numpy, numpy, onnx, f"TYPE_{triton}", triton,
                 float_max=float_max, **extra)


def _int(name, bits, signed, onnx) -> DType:
    # "INT32"/"UINT8" is Triton's name; numpy, torch and jax.numpy write it lowercase.
    width = f"{'' if signed else 'U'}INT{bits}"
    numpy = width.lower()
    return DType(name, "int", bits, f"{'I' if signed else 'U'}{bits}", numpy, numpy, numpy, onnx, f"TYPE_{width}",
                 width, signed=signed)


#: Linnet's dtypes.  The order is the one messages list them in: floats narrow to wide,
#: then integers, then bool (see `linnet.types`).
LINNET: tuple[DType, ...] = (
    _float("f16", 16, "F16", "float16", 10, "FP16", 65504.0),
    _float("bf16", 16, "BF16", "bfloat16", 16, "BF16", 3.3895313892515355e38, numpy_extension=True),
    _float("f32", 32, "F32", "float32", 1, "FP32", 3.4028234663852886e38),
    _float("f64", 64, "F64", "float64", 11, "FP64", 1.7976931348623157e308),
    _int("i8", 8, True, 3),
    _int("i16", 16, True, 5),
    _int("i32", 32, True, 6),
    _int("i64", 64, True, 7),
    _int("u8", 8, False, 2),
    DType("bool", "bool", 8, "BOOL", "bool", "bool", "bool_", 9, "TYPE_BOOL", "BOOL", signed=False),
)

#: What a safetensors header may also name: read and sized, never a Linnet type.  Their
#: names are the header's, lowercased, so they can never equal a Linnet name; the torch
#: spelling is the type safetensors reads them as.
STORED_ONLY: tuple[DType, ...] = tuple(
    DType(header.lower(), kind, bits, header, torch=torch, signed=kind == "float", linnet=False)
    for header, kind, bits, torch in (("F8_E4M3", "float", 8, "float8_e4m3fn"), ("F8_E5M2", "float", 8, "float8_e5m2"),
                                      ("U16", "int", 16, "uint16"), ("U32", "int", 32, "uint32"),
                                      ("U64", "int", 64, "uint64")))

#: The fields `lookup` can search by, and what messages call each.
_LABELS = {"name": "Linnet", "safetensors": "safetensors", "numpy": "numpy", "torch": "torch", "jax": "jax.numpy",
           "onnx": "ONNX", "triton": "Triton config", "triton_wire": "Triton request"}
SPELLINGS = tuple(_LABELS)

_INDEX: dict[str, dict[Any, DType]] = {
    spelling: {getattr(d, spelling): d for d in LINNET + STORED_ONLY if getattr(d, spelling) is not None}
    for spelling in SPELLINGS}


def lookup(spelling: str, value: Any) -> DType | None:
    """The dtype that `value` is in `spelling` (one of `SPELLINGS`), or None if none is.

    A value of the wrong type (a list in a hostile header) is simply not found.  Stored-only
    dtypes are found too; check `.linnet` where only Linnet's own will do.
    """
    if spelling not in _INDEX:
        raise ValueError(f"no dtype spelling {spelling!r}; the spellings are {', '.join(SPELLINGS)}")
    try:
        return _INDEX[spelling].get(value)
    except TypeError:  # unhashable
        return None


def _get(spelling: str, value: Any, *, linnet_only: bool = False) -> DType:
    found = lookup(spelling, value)
    if found is None or (linnet_only and not found.linnet):
        known = [getattr(d, spelling) for d in (LINNET if linnet_only else LINNET + STORED_ONLY)
                 if getattr(d, spelling) is not None]
        raise UnknownDType(f"unknown {_LABELS[spelling]} dtype {value!r}; known: {', '.join(map(str, known))}")
    return found


def by_name(name: str) -> DType:
    """A Linnet dtype by its name in the language: `by_name("f32")`."""
    return _get("name", name, linnet_only=True)


def from_safetensors(header_dtype: str) -> DType:
    """The dtype a safetensors header names ("F32", "BF16", "F8_E4M3", ...)."""
    return _get("safetensors", header_dtype)


def from_numpy(dtype: Any) -> DType:
    """The dtype of a numpy dtype, scalar type or name (`np.float32`, `"int64"`)."""
    import numpy as np

    return _get("numpy", np.dtype(dtype).name)


def from_torch(dtype: Any) -> DType:
    """The dtype of a `torch.dtype` or its name (`torch.float32`, `"float32"`, `"torch.float32"`)."""
    return _get("torch", str(dtype).removeprefix("torch."))


def from_jax(dtype: Any) -> DType:
    """The dtype of a jax.numpy type (`jnp.bfloat16`) or its attribute name (`"bool_"`)."""
    if isinstance(dtype, str):
        return _get("jax", dtype)
    import numpy as np

    return _get("numpy", np.dtype(dtype).name)  # jax's types are numpy dtypes (bf16: ml_dtypes')


def from_onnx(elem_type: int) -> DType:
    """The dtype of an ONNX TensorProto element type (`TensorProto.FLOAT` is 1)."""
    return _get("onnx", elem_type)


def from_triton(config_type: str) -> DType:
    """The dtype of a Triton config DataType name ("TYPE_FP32")."""
    return _get("triton", config_type)


def from_triton_wire(datatype: str) -> DType:
    """The dtype of a Triton/KServe request datatype ("FP32")."""
    return _get("triton_wire", datatype)


def names(kind: str | None = None, *, widest_first: bool = False) -> tuple[str, ...]:
    """Linnet's dtype names of one kind ("float", "int", "bool") or all, in table order
    (floats, ints, bool), or with `widest_first` each kind's widest first (f64, f32, ...)."""
    chosen = [d for d in LINNET if kind is None or d.kind == kind]
    if widest_first:
        kinds = list(dict.fromkeys(d.kind for d in LINNET))
        chosen.sort(key=lambda d: (kinds.index(d.kind), -d.bits))  # stable: f16 stays before bf16
    return tuple(d.name for d in chosen)
