"""Each backend's record declares the options its runtime takes (`linnet.backends.Backend.options`),
and `nest.load(..., **backend_options)` is checked against them before anything is compiled."""
from __future__ import annotations

import importlib
import inspect

import pytest

from linnet import nest
from linnet.backends import RECORDS, check_options
from linnet.diagnostics import LinnetError


def _refusal(backend: str, **options) -> LinnetError:
    with pytest.raises(LinnetError) as caught:
        check_options(backend, options)
    return caught.value


@pytest.mark.parametrize("backend", sorted(RECORDS))
def test_a_record_declares_exactly_its_runtime_keywords(backend):
    record = RECORDS[backend]
    runtime = importlib.import_module(record.module)
    keywords = [name for name, p in inspect.signature(runtime.open_runtime).parameters.items()
                if p.kind is p.KEYWORD_ONLY and name != "device"]
    assert sorted(keywords) == sorted(record.option_names())


def test_the_options_that_worked_before_the_records_still_pass():
    # The keywords nest.load took by name before: mode/kernels (torch), providers/kernels/
    # share_weights (onnx), kernels (jax, stablehlo).
    assert check_options("torch", {"mode": "compile", "kernels": "default"}) == {"mode": "compile", "kernels": "default"}
    assert check_options("onnx", {"providers": ["CPUExecutionProvider"], "kernels": "auto", "share_weights": True})
    assert check_options("onnx", {"providers": "CPUExecutionProvider"})
    assert check_options("jax", {"kernels": "default"}) == {"kernels": "default"}
    assert check_options("stablehlo", {"kernels": "auto"}) == {"kernels": "auto"}


def test_an_option_given_as_none_is_left_out():
    assert check_options("torch", {"mode": None, "providers": None, "share_weights": None}) == {}


def test_an_unknown_option_names_the_ones_the_backend_takes():
    error = _refusal("onnx", mode="compile")
    assert error.code == "E0807"
    assert "has no option mode; it takes providers, kernels, share_weights" in str(error)


def test_an_option_of_the_wrong_type_names_the_type():
    error = _refusal("onnx", share_weights="yes")
    assert error.code == "E0809" and "share_weights must be True or False, found 'yes' (str)" in str(error)
    error = _refusal("torch", kernels=1)
    assert error.code == "E0809" and "kernels must be a str, found 1 (int)" in str(error)


def test_a_word_outside_the_choices_keeps_its_code():
    assert _refusal("torch", mode="fastest").code == "E0802"
    assert _refusal("torch", kernels="fastest").code == "E0802"
    error = _refusal("stablehlo", kernels="fastest")
    assert error.code == "E0807" and "kernels must be one of auto, default for the stablehlo backend" in str(error)


def test_load_refuses_a_wrong_type_before_compiling(monkeypatch):
    def no_compile(*args, **kwargs):
        raise AssertionError("compiled before the options were checked")

    monkeypatch.setattr(nest, "_manifest", no_compile)
    with pytest.raises(LinnetError) as caught:
        nest.load("all-minilm-l6-v2", backend="onnx", share_weights="yes")
    assert caught.value.code == "E0809"
