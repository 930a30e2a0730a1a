"""The onnx backend's session options: measured per machine and model, exact, cached, optional.

Speed is never asserted (bench/ measures it).  These tests check that whatever the probe
picks gives the default session's numbers within 1e-5, that a candidate outside that is
refused however fast it is, that the choice is cached and reused, that kernels="default"
measures nothing, and that the option is validated.
"""
from __future__ import annotations

import json

import numpy as np
import pytest

from linnet import nest
from linnet.backends import onnx_options
from linnet.diagnostics import LinnetError

# These tests are about the per-machine measurement that `kernels="auto"` runs.
pytestmark = pytest.mark.usefixtures("measured_kernels")

TEXTS = ["The cat sat on the mat.", "Interest rates rose again, the central bank said on Tuesday.", "Hi"]


@pytest.fixture()
def fresh_choice(linnet_cache):
    """No session choice cached yet (the ONNX export itself stays cached for speed)."""
    path = onnx_options._cache_file(linnet_cache)
    path.unlink(missing_ok=True)
    yield path
    path.unlink(missing_ok=True)


def _embed(model):
    return model.embed(**model.tokenizer(TEXTS))


def test_measured_options_match_the_default_session(minilm_checkpoint, fresh_choice):
    auto = nest.load("all-minilm-l6-v2", backend="onnx", device="cpu")
    default = nest.load("all-minilm-l6-v2", backend="onnx", device="cpu", kernels="default")
    choice = auto.runtime.session_choice
    # Every candidate was either timed or refused as inexact; none of them silently skipped.
    timed = {name.removesuffix(" (again)") for name in choice.measured}  # the winner is timed twice
    assert timed <= set(onnx_options.candidates(onnx_options.os.cpu_count() or 1)) | {"combined"}
    assert choice.measured, "the probe measured nothing"
    assert choice.max_error <= onnx_options.TOLERANCE
    assert default.runtime.session_choice.settings == {}
    assert np.abs(_embed(auto) - _embed(default)).max() <= 1e-5
    tokens = auto.tokenizer(TEXTS)
    assert np.abs(auto(**tokens) - default(**tokens)).max() <= 1e-5


def test_the_choice_is_cached_per_machine_and_reused(minilm_checkpoint, fresh_choice, monkeypatch):
    first = nest.load("all-minilm-l6-v2", backend="onnx", device="cpu").runtime.session_choice
    data = json.loads(fresh_choice.read_text())
    assert list(data) == [onnx_options.machine_key()]
    (entry,) = data[onnx_options.machine_key()].values()
    assert entry["settings"] == first.settings and entry["measured"] == first.measured

    def must_not_measure(*args, **kwargs):
        raise AssertionError("measured again although the choice is cached")

    monkeypatch.setattr(onnx_options, "_measure", must_not_measure)
    again = nest.load("all-minilm-l6-v2", backend="onnx", device="cpu").runtime.session_choice
    assert again == first


def test_a_probe_that_runs_out_of_time_is_recorded_so_later_loads_do_not_wait_again(
        minilm_checkpoint, fresh_choice, monkeypatch):
    import subprocess

    calls = []

    def too_slow(*args, **kwargs):
        calls.append(args)
        raise subprocess.TimeoutExpired("probe", onnx_options.CHILD_TIMEOUT_S)

    monkeypatch.setattr(onnx_options, "measure_in_child", too_slow)
    first = nest.load("all-minilm-l6-v2", backend="onnx", device="cpu").runtime.session_choice
    again = nest.load("all-minilm-l6-v2", backend="onnx", device="cpu").runtime.session_choice
    assert len(calls) == 1, "the second load measured (and waited) again"
    assert first.settings == again.settings == {} and onnx_options.TIMED_OUT in again.measured
    assert fresh_choice.exists()


def test_the_probe_sessions_are_opened_in_a_child_process(minilm_checkpoint, fresh_choice, monkeypatch):
    """The loading process opens only the session it keeps: the probe's two at a time, each
    with its own pre-packed weights, are a child's (its memory returned when it exits)."""
    import onnxruntime as ort

    opened = []
    real = ort.InferenceSession

    def counting(path, *args, **kwargs):
        opened.append(path)
        return real(path, *args, **kwargs)

    monkeypatch.setattr(ort, "InferenceSession", counting)
    model = nest.load("all-minilm-l6-v2", backend="onnx", device="cpu")
    assert model.runtime.session_choice.measured, "the probe measured nothing"
    assert fresh_choice.exists()
    assert [p.rsplit("/", 1)[-1] for p in opened] == ["model.forward.onnx"]


def test_the_environment_sets_kernels_for_loads_that_do_not(minilm_checkpoint, fresh_choice, monkeypatch):
    monkeypatch.setenv("LINNET_KERNELS", "default")
    monkeypatch.setattr(onnx_options, "_measure", lambda *a, **k: pytest.fail("measured with LINNET_KERNELS=default"))
    model = nest.load("all-minilm-l6-v2", backend="onnx", device="cpu")
    assert model.runtime.session_choice.settings == {} and not fresh_choice.exists()
    monkeypatch.setenv("LINNET_KERNELS", "fastest")
    with pytest.raises(LinnetError) as caught:
        nest.load("all-minilm-l6-v2", backend="onnx", device="cpu")
    assert caught.value.code == "E0807"
    assert "$LINNET_KERNELS is 'fastest'; expected one of 'auto', 'default'" in str(caught.value)
    # A load's own `kernels=` wins over the environment.
    nest.load("all-minilm-l6-v2", backend="onnx", device="cpu", kernels="default")


def test_kernels_default_measures_nothing(minilm_checkpoint, fresh_choice, monkeypatch):
    monkeypatch.setattr(onnx_options, "_measure", lambda *a, **k: pytest.fail("measured with kernels='default'"))
    model = nest.load("all-minilm-l6-v2", backend="onnx", device="cpu", kernels="default")
    assert model.runtime.session_choice.settings == {}
    assert not fresh_choice.exists()
    # The default session is the documented one: every optimisation, spinning threads, sequential.
    assert model.runtime.options.graph_optimization_level.name == "ORT_ENABLE_ALL"
    assert model.runtime.options.get_session_config_entry("session.intra_op.allow_spinning") == "1"


def test_a_fast_but_inexact_candidate_is_refused(minilm_checkpoint, fresh_choice, monkeypatch):
    """Every candidate 'twice as fast': taken when exact, refused when outside the tolerance."""
    monkeypatch.setattr(onnx_options, "_interleaved_speedups",
                        lambda reference, exact, feeds, output: {name: 2.0 for name in exact})
    model = nest.load("all-minilm-l6-v2", backend="onnx", device="cpu", kernels="default")
    model_file = model.runtime.folder / "model.forward.onnx"
    taken = onnx_options._measure(model_file, ["CPUExecutionProvider"], 2)
    assert taken.settings and taken.speedup == 2.0  # the combination of the single winners
    monkeypatch.setattr(onnx_options, "TOLERANCE", -1.0)  # now no candidate is exact
    refused = onnx_options._measure(model_file, ["CPUExecutionProvider"], 2)
    assert refused.settings == {} and refused.measured == {}


def test_a_winner_that_does_not_win_again_is_not_taken(minilm_checkpoint, fresh_choice, monkeypatch):
    """The best of several noisy ratios is timed once more; a lucky first round is not kept."""
    calls = []

    def first_fast_then_not(reference, exact, feeds, output):
        calls.append(sorted(exact))
        return {name: (2.0 if len(calls) == 1 else 1.0) for name in exact}

    monkeypatch.setattr(onnx_options, "candidates", lambda threads: {"no-spinning": {"allow_spinning": False}})
    monkeypatch.setattr(onnx_options, "_interleaved_speedups", first_fast_then_not)
    model = nest.load("all-minilm-l6-v2", backend="onnx", device="cpu", kernels="default")
    model_file = model.runtime.folder / "model.forward.onnx"
    choice = onnx_options._measure(model_file, ["CPUExecutionProvider"], 2)
    assert calls == [["no-spinning"], ["no-spinning"]]
    assert choice.settings == {} and choice.measured == {"no-spinning": 2.0, "no-spinning (again)": 1.0}
    calls.clear()
    monkeypatch.setattr(onnx_options, "_interleaved_speedups",
                        lambda reference, exact, feeds, output: calls.append(1) or {n: 1.5 - 0.2 * len(calls) for n in exact})
    taken = onnx_options._measure(model_file, ["CPUExecutionProvider"], 2)
    assert taken.settings == {"allow_spinning": False} and taken.speedup == 1.1  # the smaller ratio


def test_settings_become_session_options():
    settings = {**onnx_options.default_settings(3), "graph_optimization_level": "basic", "allow_spinning": False,
                "execution_mode": "parallel"}
    options = onnx_options.session_options(settings)
    assert options.graph_optimization_level.name == "ORT_ENABLE_BASIC"
    assert options.intra_op_num_threads == 3
    assert options.execution_mode.name == "ORT_PARALLEL"
    assert options.get_session_config_entry("session.intra_op.allow_spinning") == "0"


def test_an_unknown_kernels_value_is_refused(minilm_checkpoint):
    with pytest.raises(LinnetError, match="kernels must be one of auto, default") as info:
        nest.load("all-minilm-l6-v2", backend="onnx", kernels="fastest")
    assert info.value.diagnostics[0].code == "E0807"


def _fixed_width_model(tmp_path, preconditions: str | None):
    """x [B, W] reshaped to [1, 5]: runs only with W = 5 (and B = 1); W is a free dim."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    shape = numpy_helper.from_array(np.array([1, 5], np.int64), "shape")
    graph = helper.make_graph([helper.make_node("Reshape", ["x", "shape"], ["y"])], "fixed_width",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["B", "W"])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 5])], initializer=[shape])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    if preconditions is not None:
        helper.set_model_props(model, {"linnet.preconditions": preconditions})
    path = tmp_path / "fixed_width.onnx"
    onnx.save(model, str(path))
    return path


def test_the_probe_uses_the_size_a_precondition_pins(tmp_path):
    # ViT's export says "H == 224, W == 224": no size of PROBE_SIZES runs it, so without the
    # pin its session options were never measured.
    import onnxruntime as ort

    pinned = ort.InferenceSession(str(_fixed_width_model(tmp_path, "W == 5, B > 0")), providers=["CPUExecutionProvider"])
    assert onnx_options.pinned_dims(pinned) == {"W": 5}
    feeds = onnx_options.probe_inputs(pinned)
    assert feeds is not None and feeds["x"].shape == (1, 5)
    unpinned = ort.InferenceSession(str(_fixed_width_model(tmp_path, None)), providers=["CPUExecutionProvider"])
    assert onnx_options.pinned_dims(unpinned) == {}
    assert onnx_options.probe_inputs(unpinned) is None
