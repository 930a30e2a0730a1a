"""The jax and stablehlo backends' XLA compiler options: measured per machine, exact, cached, optional.

Speed is never asserted.  These tests check that the probe (run for real once, in its child
process) decides, that the decision is cached and reused without starting a child again,
that every option it could pick gives the real all-MiniLM-L6-v2 the base compilation's
numbers within 1e-5 (the base itself: f32 products without YNNPACK, closer to exact), that an inexact candidate is refused however fast, that a user's own
XLA_FLAGS are never overridden, and that the option is validated.
"""
from __future__ import annotations

import json
import subprocess

import numpy as np
import pytest

from linnet import nest
from linnet.backends import xla_options
from linnet.backends.xla_options import XlaChoice
from linnet.diagnostics import LinnetError

# These tests are about the per-machine measurement that `kernels="auto"` runs.
pytestmark = pytest.mark.usefixtures("measured_kernels")

TEXTS = ["The cat sat on the mat.", "Interest rates rose again, the central bank said on Tuesday.", "Hi"]


@pytest.fixture(scope="module")
def measured(linnet_cache, minilm_checkpoint):
    """The real probe, run once: a jax load with no decision cached yet."""
    path = xla_options._cache_file(linnet_cache)
    path.unlink(missing_ok=True)
    model = nest.load("all-minilm-l6-v2", backend="jax", device="cpu")
    return model.runtime.xla_choice, path


def test_the_probe_decides_and_accounts_for_every_candidate(measured):
    choice, _ = measured
    names = set(xla_options.candidates())
    accounted = set(choice.measured) | set(choice.rejected) | set(choice.skipped_for_user_flags)
    assert names <= accounted, f"candidates neither timed, refused nor skipped: {names - accounted}"
    assert choice.measured, "the probe timed nothing"
    assert choice.max_error <= xla_options.TOLERANCE
    if choice.options != xla_options.base_options():  # a timed candidate's (or winners' combination) on the base
        assert choice.speedup >= xla_options.MIN_SPEEDUP
        assert set(choice.options) <= {k for o in xla_options.candidates().values() for k in o} | set(
            xla_options.ACCURATE_F32)


def test_the_decision_is_cached_and_reused_without_a_child(measured, monkeypatch):
    choice, path = measured
    entry = json.loads(path.read_text())[xla_options.machine_key()][xla_options.PROBE_KEY]
    assert entry["options"] == choice.options and entry["measured"] == choice.measured

    def no_child(*args, **kwargs):
        raise AssertionError("started a probe process although the decision is cached")

    monkeypatch.setattr(subprocess, "run", no_child)
    monkeypatch.setattr(subprocess, "Popen", no_child)
    again = nest.load("all-minilm-l6-v2", backend="stablehlo", device="cpu")
    assert again.runtime.xla_choice == choice


def test_the_chosen_and_every_result_changing_candidate_keep_minilm_within_1e5(measured, monkeypatch):
    """The probe's exactness stands in for the model's: check it on the real model's `embed`
    for the options chosen and for every timed candidate whose probe result was not bit-identical
    to the base's (a change of dot library), not only for what this run picked."""
    choice, _ = measured
    default = nest.load("all-minilm-l6-v2", backend="jax", device="cpu", kernels="default")
    assert default.runtime.xla_choice.options == xla_options.base_options()
    tokens = default.tokenizer(TEXTS)
    want = np.asarray(default.embed(**tokens))
    base = xla_options.base_options()
    options = {n: base | xla_options.candidates()[n] for n, e in choice.errors.items() if e > 0 and n != "combined"}
    options["chosen"] = choice.options
    checked = 0
    for name, chosen in options.items():
        if not chosen:
            continue
        monkeypatch.setattr(xla_options, "choose", lambda cache_dir, chosen=chosen: XlaChoice(chosen))
        model = nest.load("all-minilm-l6-v2", backend="jax", device="cpu")
        assert model.runtime.xla_choice.options == chosen
        difference = np.abs(np.asarray(model.embed(**tokens)) - want).max()
        assert difference <= 1e-5, f"{name} ({chosen}): embed differs by {difference:.2e}"
        checked += 1
    assert checked or choice.options == base


def _fake_build(offsets: dict[str, float], built: list):
    """A probe whose candidates differ from the default result by a set offset (numpy only)."""
    result = np.linspace(-3.0, 3.0, 4096, dtype=np.float32)

    def build(options):
        built.append(dict(options))
        if options.get("broken"):
            raise RuntimeError("INVALID_ARGUMENT: No such compile option: 'broken'")
        shift = offsets.get(options.get("which"), 0.0)
        return lambda: result + np.float32(shift)

    return build


def _compiled_text(options) -> str:
    import jax

    x, w = np.ones((64, 96), np.float32), np.ones((128, 96), np.float32)
    return jax.jit(lambda x, w: jax.nn.silu(x @ w.T), compiler_options=options or None).lower(x, w).compile().as_text()


def test_the_base_compiles_f32_products_without_ynnpack_and_closer_to_exact():
    """The base turns off the fusion XLA:CPU would otherwise use (this checks the option still
    means that in this jaxlib), and its products' error from f64 is below the default's."""
    assert "__ynn_fusion" in _compiled_text({}), "jaxlib no longer fuses dots with YNNPACK: revisit ACCURATE_F32"
    assert "__ynn_fusion" not in _compiled_text(xla_options.ACCURATE_F32)
    import jax

    rng = np.random.default_rng(0)
    x, w = rng.standard_normal((128, 576), np.float32), rng.standard_normal((1536, 576), np.float32)
    exact = x.astype(np.float64) @ w.T.astype(np.float64)
    error = {name: np.abs(np.asarray(jax.jit(lambda x, w: x @ w.T, compiler_options=o or None)(x, w)) - exact).mean()
             for name, o in (("default", {}), ("base", xla_options.ACCURATE_F32))}
    assert error["base"] < 0.75 * error["default"], error


def test_a_users_xla_flags_keep_their_own_ynnpack_setting(monkeypatch):
    monkeypatch.setenv("XLA_FLAGS", "--xla_cpu_experimental_ynn_fusion_type=LIBRARY_FUSION_TYPE_DOT")
    assert xla_options.base_options() == {}
    monkeypatch.setenv("XLA_FLAGS", "--xla_cpu_multi_thread_eigen=false")
    assert xla_options.base_options() == xla_options.ACCURATE_F32


def test_an_inexact_candidate_is_refused_however_fast(monkeypatch):
    monkeypatch.setattr(xla_options, "MIN_SPEEDUP", 0.0)  # any timed candidate would be taken
    monkeypatch.delenv("XLA_FLAGS", raising=False)
    built: list = []
    candidates = {"inexact": {"which": "inexact"}, "exact": {"which": "exact"}, "unknown": {"broken": True}}
    choice = xla_options.measure(candidates, _fake_build({"inexact": 1e-3, "exact": 1e-7}, built))
    assert "inexact" not in choice.measured and "inexact" in choice.rejected["inexact"]
    assert "does not compile" in choice.rejected["unknown"]
    assert choice.options.get("which") == "exact" and choice.max_error <= xla_options.TOLERANCE
    assert set(choice.measured) >= {"exact"}


def test_an_option_this_jaxlib_does_not_know_is_refused_not_fatal():
    reference = xla_options.compile_probe({})()
    scale = max(1.0, float(np.abs(reference).max()))
    verdict = xla_options._try(xla_options.compile_probe, {"xla_cpu_no_such_option": True}, reference, scale)
    assert isinstance(verdict, str) and "does not compile" in verdict and "xla_cpu_no_such_option" in verdict


def test_a_users_xla_flags_are_never_overridden(monkeypatch):
    monkeypatch.delenv("XLA_FLAGS", raising=False)
    plain_key = xla_options.machine_key()
    monkeypatch.setenv("XLA_FLAGS", "--xla_cpu_multi_thread_eigen=false --xla_cpu_experimental_ynn_fusion_type=")
    assert xla_options.user_flag_names() == {"xla_cpu_multi_thread_eigen", "xla_cpu_experimental_ynn_fusion_type"}
    assert xla_options.machine_key() != plain_key  # the flags change the baseline: measured apart
    built: list = []
    monkeypatch.setattr(xla_options, "MIN_SPEEDUP", 0.0)
    choice = xla_options.measure(xla_options.candidates(), _fake_build({}, built))
    touched = {"xla_cpu_multi_thread_eigen", "xla_cpu_experimental_ynn_fusion_type"}
    assert not any(touched & set(options) for options in built), "compiled an option the user set"
    assert not touched & set(choice.options)
    expected = sorted(n for n, o in xla_options.candidates().items() if touched & set(o))
    assert choice.skipped_for_user_flags == expected and "single-thread-eigen" in expected


_CRASHING_CHILD = """
import os, signal
import numpy as np
from linnet.backends import xla_options

result = np.linspace(-3.0, 3.0, 4096, dtype=np.float32)
def build(options):
    if options.get("crash"):
        os.kill(os.getpid(), signal.SIGILL)  # as oneDNN's graph dots do on this project's CPU
    return lambda: result
xla_options.compile_probe = build
"""


def test_a_candidate_that_kills_the_child_is_rejected_and_the_rest_measured(monkeypatch):
    """The real parent-child protocol, with a compiler stand-in that dies on one candidate."""
    monkeypatch.delenv("XLA_FLAGS", raising=False)
    real_command = xla_options.child_command
    monkeypatch.setattr(xla_options, "child_command", lambda: real_command(_CRASHING_CHILD))
    candidates = {"first": {"which": 1}, "crash": {"crash": True}, "last": {"which": 2}}
    choice = xla_options.measure_in_child(candidates)
    assert "SIGILL" in choice.rejected["crash"] and "crash" not in choice.measured
    assert set(choice.measured) >= {"first", "last"}


def test_kernels_default_measures_nothing(minilm_checkpoint, monkeypatch):
    def no_probe(*args, **kwargs):
        raise AssertionError("measured although kernels='default'")

    monkeypatch.setattr(xla_options, "choose", no_probe)
    model = nest.load("all-minilm-l6-v2", backend="stablehlo", device="cpu", kernels="default")
    assert model.runtime.xla_choice.options == xla_options.ACCURATE_F32
    with pytest.raises(LinnetError) as caught:
        nest.load("all-minilm-l6-v2", backend="jax", kernels="fastest")
    assert caught.value.diagnostics[0].code == "E0807" and "auto, default" in str(caught.value)
