"""The dtype table (`linnet.dtypes`) and the array adapters (`linnet.arrays`), checked against
the frameworks themselves: every spelling is asked of numpy, torch, jax, onnx, safetensors
and tritonclient, never compared with a second copy of the table."""
from __future__ import annotations

import json
import struct

import numpy as np
import pytest

from linnet import arrays, dtypes
from linnet.nest.weights import read_header

torch = pytest.importorskip("torch")

LINNET = [pytest.param(d, id=d.name) for d in dtypes.LINNET]
WITH_NUMPY = [pytest.param(d, id=d.name) for d in dtypes.LINNET if d.numpy is not None]
WITH_TORCH = [pytest.param(d, id=d.name) for d in dtypes.LINNET + dtypes.STORED_ONLY if d.torch is not None]


def _header(path) -> dict:
    with open(path, "rb") as f:
        length = struct.unpack("<Q", f.read(8))[0]
        return json.loads(f.read(length))


# ------------------------------------------------------------------ numpy


@pytest.mark.parametrize("d", WITH_NUMPY)
def test_numpy_type_has_the_width_kind_and_range(d):
    numpy_type = d.numpy_type()
    assert numpy_type.name == d.numpy
    assert numpy_type.itemsize * 8 == d.bits
    assert dtypes.from_numpy(numpy_type) is d
    if d.kind == "bool":
        assert numpy_type.kind == "b" and d.number_range() == (0, 1)
    elif d.kind == "int":
        info = np.iinfo(numpy_type)
        assert numpy_type.kind == ("i" if d.signed else "u")
        assert d.number_range() == (info.min, info.max)
    else:
        import ml_dtypes

        info = ml_dtypes.finfo(numpy_type) if d.numpy_extension else np.finfo(numpy_type)
        assert d.number_range() == (-float(info.max), float(info.max))


def test_in_numpy_says_whether_numpy_itself_defines_the_type():
    for d in dtypes.LINNET:
        assert d.in_numpy == (d.numpy_type().type.__module__ == "numpy"), d.name
    assert not dtypes.by_name("bf16").in_numpy  # its type is ml_dtypes'


# ------------------------------------------------------------------ torch


@pytest.mark.parametrize("d", WITH_TORCH)
def test_torch_type_has_the_width_kind_and_range(d):
    torch_type = d.torch_type()
    assert isinstance(torch_type, torch.dtype)
    assert torch.empty(0, dtype=torch_type).element_size() * 8 == d.bits
    assert torch_type.is_floating_point == d.is_float
    assert dtypes.from_torch(torch_type) is d
    if d.kind == "int" and d.linnet:
        info = torch.iinfo(torch_type)
        assert d.number_range() == (info.min, info.max)
    elif d.is_float and d.linnet:
        assert d.number_range() == (-torch.finfo(torch_type).max, torch.finfo(torch_type).max)


def test_generated_torch_spelling_is_the_torch_attribute():
    from linnet.backends.torch_source import torch_dtype

    for d in dtypes.LINNET:
        assert eval(torch_dtype(d.name), {"torch": torch}) is d.torch_type()


# ------------------------------------------------------------------ jax


@pytest.mark.parametrize("d", LINNET)
def test_jax_type_is_the_same_dtype_as_numpy(d):
    jnp = pytest.importorskip("jax.numpy")
    from linnet.backends.jax_source import jax_dtype

    jax_type = d.jax_type()
    assert jnp.dtype(jax_type) == d.numpy_type()
    assert eval(jax_dtype(d.name), {"jnp": jnp}) is jax_type
    assert dtypes.from_jax(jax_type) is d and dtypes.from_jax(d.jax) is d
    assert jnp.dtype(jax_type).itemsize * 8 == d.bits  # (arrays of 64-bit types need jax_enable_x64)


# ------------------------------------------------------------------ onnx


@pytest.mark.parametrize("d", LINNET)
def test_onnx_elem_type_is_tensorproto_s_number_for_that_numpy_type(d):
    onnx = pytest.importorskip("onnx")

    assert onnx.helper.tensor_dtype_to_np_dtype(d.onnx) == d.numpy_type()
    assert onnx.TensorProto.DataType.Name(d.onnx)  # a real member of the enum
    assert dtypes.from_onnx(d.onnx) is d


# ------------------------------------------------------------------ safetensors


@pytest.mark.parametrize("d", WITH_TORCH)
def test_safetensors_names_a_torch_tensor_of_it_so(d, tmp_path):
    from safetensors import safe_open
    from safetensors.torch import save_file

    path = tmp_path / "one.safetensors"
    save_file({"x": torch.zeros(3, 2, dtype=d.torch_type())}, str(path))
    assert _header(path)["x"]["dtype"] == d.safetensors
    # Linnet's own header reader sizes it by the table: a wrong width would be "corrupt".
    (info,) = read_header(path)
    assert dtypes.from_safetensors(info.dtype) is d and info.nbytes == 6 * d.itemsize
    with safe_open(str(path), framework="pt") as handle:
        assert handle.get_tensor("x").dtype == d.torch_type()


@pytest.mark.parametrize("d", [p for p in WITH_NUMPY if p.values[0].in_numpy])
def test_safetensors_names_a_numpy_array_of_it_so(d, tmp_path):
    from safetensors.numpy import save_file

    path = tmp_path / "one.safetensors"
    save_file({"x": np.zeros((2,), dtype=d.numpy_type())}, str(path))
    assert _header(path)["x"]["dtype"] == d.safetensors


# ------------------------------------------------------------------ triton


@pytest.mark.parametrize("d", LINNET)
def test_triton_spellings_are_tritonclient_s(d):
    pytest.importorskip("tritonclient")
    from tritonclient.grpc import model_config_pb2
    from tritonclient.utils import np_to_triton_dtype

    model_config_pb2.DataType.Value(d.triton)  # raises for a name Triton's config lacks
    assert np_to_triton_dtype(d.numpy_type()) == d.triton_wire
    assert dtypes.from_triton(d.triton) is d and dtypes.from_triton_wire(d.triton_wire) is d


# ------------------------------------------------------------------ lookups


def test_every_spelling_finds_one_dtype():
    for spelling in dtypes.SPELLINGS:
        values = [getattr(d, spelling) for d in dtypes.LINNET + dtypes.STORED_ONLY if getattr(d, spelling) is not None]
        assert len(values) == len(set(values)), spelling


def test_lookups_by_name_and_header():
    assert dtypes.by_name("f32") is dtypes.from_safetensors("F32")
    assert dtypes.from_safetensors("F8_E4M3").is_float and not dtypes.from_safetensors("F8_E4M3").linnet
    assert dtypes.lookup("safetensors", ["F32"]) is None  # unhashable, as in a hostile header
    assert dtypes.lookup("safetensors", "F33") is None


def test_unknown_spellings_say_what_is_known():
    with pytest.raises(dtypes.UnknownDType, match=r"unknown safetensors dtype 'F33'; known: F16, BF16, F32"):
        dtypes.from_safetensors("F33")
    with pytest.raises(dtypes.UnknownDType, match="unknown Linnet dtype 'f8_e4m3'"):
        dtypes.by_name("f8_e4m3")  # a checkpoint may store it, a program may not use it
    with pytest.raises(ValueError, match="no dtype spelling 'tensorflow'"):
        dtypes.lookup("tensorflow", "float32")


def test_kinds_match_what_the_checker_allows():
    from linnet.types import DTYPE_KINDS

    assert set(DTYPE_KINDS["Float"]) == {d.name for d in dtypes.LINNET if d.torch_type().is_floating_point}
    assert set(DTYPE_KINDS["Int"]) == {d.name for d in dtypes.LINNET
                                      if not d.torch_type().is_floating_point and d.torch_type() != torch.bool}


# ------------------------------------------------------------------ array adapters


def _frameworks():
    jnp = pytest.importorskip("jax.numpy")
    return [("numpy", np.asarray), ("pt", torch.from_numpy), ("flax", jnp.asarray)]


def test_each_array_finds_its_framework():
    for name, make in _frameworks():
        array = make(np.zeros((2, 2), np.float32))
        assert arrays.framework_of(array) is arrays.framework(name)
    with pytest.raises(TypeError, match="no array framework for builtins.list"):
        arrays.framework_of([1.0])
    with pytest.raises(ValueError, match="framework must be one of"):
        arrays.framework("tf")


def test_concat_scale_and_cast_agree_across_frameworks():
    a = np.arange(6, dtype=np.float32).reshape(3, 2)
    b = np.arange(6, 10, dtype=np.float32).reshape(2, 2)
    want = np.concatenate([a, b]) * np.array([[0.5], [0.5], [1], [2], [2]], np.float32)
    for name, make in _frameworks():
        framework = arrays.framework(name)
        joined = framework.concat([make(a), make(b)], 0)
        scaled = framework.scale_rows(joined, [(0, 2, 0.5), (3, 5, 2.0)], owned=True)
        np.testing.assert_array_equal(framework.to_numpy(scaled), want, err_msg=name)
        half = framework.cast(scaled, dtypes.by_name("f16"))
        assert framework.to_numpy(half).dtype == np.float16, name


def test_scale_rows_leaves_an_array_it_does_not_own_alone():
    source = np.ones((2, 2), np.float32)
    source.setflags(write=False)  # as a memory-mapped checkpoint's arrays are
    for name, make in _frameworks():
        framework = arrays.framework(name)
        original = make(source.copy()) if name == "pt" else make(source)
        scaled = framework.scale_rows(original, [(0, 1, 4.0)], owned=False)
        np.testing.assert_array_equal(framework.to_numpy(original), np.ones((2, 2)), err_msg=name)
        np.testing.assert_array_equal(framework.to_numpy(scaled)[:, 0], [4.0, 1.0], err_msg=name)
