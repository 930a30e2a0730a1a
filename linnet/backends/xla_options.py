"""The machine's fastest exact XLA:CPU compiler options for the jax and stablehlo backends, measured.

Every CPU compilation starts from `ACCURATE_F32`, whatever `kernels=` says: XLA:CPU with its
YNNPACK fusions off.  jaxlib 0.10 hands f32 dots (with their fused elementwise code and
reductions) to YNNPACK, whose sums carry 2-4x the rounding error of Eigen's or MKL's; over
SmolLM2's 30 layers that put the logits 1.22e-4 from transformers', past the 1e-4 that torch
and ONNX Runtime meet (9.4e-5 with the fusions off).  It is treated like fast math: a speed
that costs accuracy the user did not ask to give up.  A user's `XLA_FLAGS` that names the flag
stands (that is also how to ask for YNNPACK back).

XLA:CPU has several ways to run the same program (its own loop emitter and Eigen, YNNPACK
fusions for dots, oneDNN thunks, several vector widths and schedulers), and which is fastest
depends on the CPU, its cores and what else runs on it.  So nothing is assumed: at load, on a
CPU device, a small program shaped like one encoder layer at MiniLM's size (`probe_program`:
Q/K/V, attention softmax, output projection, erf GELU feed-forward, two layer norms, B=4,
S=128) is compiled once per candidate in `candidates()` (one change from `ACCURATE_F32` each),
and all are timed interleaved in one child process (`measure_in_child`).  A candidate is taken
only when it is faster by `MIN_SPEEDUP` and its result is within `TOLERANCE` of the base
compilation's (relative to the result's magnitude, as `torch_kernels` and `onnx_options` do);
where several single changes win, their combination is measured too, and the winner is timed
once more against the base alone (the smaller of its two speedups counts), so a lucky round
on a busy machine is not cached as a win.

Why a child: an option can crash XLA instead of failing (oneDNN's graph dots die with SIGILL on
this project's AMD CPU), and a crash must cost one candidate, not the user's process.  An option
this jaxlib does not know fails that candidate's compilation with an error; either way the
candidate is dropped and listed in `rejected` with the reason.

How the choice is applied: as `jax.jit(..., compiler_options=...)` on each entry, not through
`XLA_FLAGS`.  The options are XLA's `DebugOptions`, the fields `XLA_FLAGS` sets, but given per
compilation: they reach only Linnet's own executables, and they work the same whether or not
jax's backend was initialised before `nest.load` (`XLA_FLAGS` is read once, at that
initialisation, and an unknown flag there ends the process: "Unknown flag in XLA_FLAGS").

A user's own `XLA_FLAGS` stands: a candidate that sets a flag named there is not measured
(never overridden), and the flags are part of the cache key, since they change the baseline.

Options that cannot be proven exact on a probe are not candidates: fast math
(`xla_cpu_enable_fast_math`, reassociation and approximate functions), fast min/max
(`xla_cpu_enable_fast_min_max`: NaN handling, which finite probe inputs never exercise),
platform-dependent math.  Compile-time-only options (`xla_cpu_parallel_codegen_split_count`)
are not either: the probe times calls, not compilations.

The decision is cached per machine (CPU model, logical cores, jaxlib version, `XLA_FLAGS`)
under `$LINNET_CACHE/kernels/xla-options.json`; `nest.load(..., kernels="default")` measures
nothing and compiles with `ACCURATE_F32`; any device other than the CPU compiles with XLA's
defaults.
"""
from __future__ import annotations

import dataclasses
import logging
import os
import shlex
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from . import measured
from .measured import MIN_SPEEDUP, TOLERANCE, DecisionCache, cpu_model, decide, median, relative_error, scale_of, seconds

log = logging.getLogger("linnet.xla")

#: Seconds the timed rounds may take in all (never fewer than 3 rounds, at most 9).
PROBE_BUDGET_S = 1.5
#: The probe layer: batch, sequence, model width, heads, feed-forward width (MiniLM's layer).
PROBE_SHAPE = {"batch": 4, "seq": 128, "width": 384, "heads": 12, "ff": 1536}
#: What the cache entry is keyed by: the probe program, its base and its shape (either new measures again).
PROBE_KEY = "layer-v2:" + "x".join(str(v) for v in PROBE_SHAPE.values())


#: Where every CPU compilation starts: YNNPACK's fusions off, so Eigen runs the dots and XLA's own
#: emitter the elementwise code and reductions.  Measured on a [128, 576] x [576, 1536] product
#: (max error from f64 3.7e-5 against YNNPACK's 1.1e-4) and on the real SmolLM2 (above).
ACCURATE_F32 = {"xla_cpu_experimental_ynn_fusion_type": ""}


def base_options(environ=os.environ) -> dict:
    """`ACCURATE_F32` less any flag the user's `XLA_FLAGS` sets: theirs stands."""
    taken = user_flag_names(environ)
    return {k: v for k, v in ACCURATE_F32.items() if k not in taken}


@dataclass(frozen=True)
class XlaChoice:
    options: dict                       # compiler options given to jax.jit ({} = XLA's defaults)
    speedup: float = 1.0                # the base's time / the chosen options' on the probe
    max_error: float = 0.0              # relative max |difference| from the base's result
    measured: dict = field(default_factory=dict)  # candidate name -> speedup (exact ones)
    rejected: dict = field(default_factory=dict)  # candidate name -> why it was not timed
    skipped_for_user_flags: list = field(default_factory=list)  # candidates XLA_FLAGS already decides
    errors: dict = field(default_factory=dict)    # candidate name -> its max_error (timed ones)

    def describe(self) -> str:
        if not self.options:
            return "XLA's default compiler options"
        named = ", ".join(f"{k}={v}" for k, v in sorted(self.options.items()))
        return named if self.options == ACCURATE_F32 else f"{named} (x{self.speedup:.2f} on the probe)"


def candidates() -> dict[str, dict]:
    """Name -> the compiler options to measure, each one change from `ACCURATE_F32` (jaxlib 0.10:
    oneDNN off, multi-threaded Eigen, 256-bit vectors).  YNNPACK is no candidate (see above)."""
    return {  # the experimental library paths first: one that crashes XLA costs least there
        "onednn-graph-dots": {"xla_cpu_use_onednn": True,
                              "xla_cpu_experimental_onednn_fusion_type": "LIBRARY_FUSION_TYPE_DOT"},
        "onednn-custom-call": {"xla_cpu_experimental_onednn_custom_call": True},
        "xnnpack-dots": {"xla_cpu_experimental_xnn_fusion_type": "LIBRARY_FUSION_TYPE_DOT"},
        "single-thread-eigen": {"xla_cpu_multi_thread_eigen": False},
        "vector-width-512": {"xla_cpu_prefer_vector_width": 512},
        "concurrency-scheduler": {"xla_cpu_enable_concurrency_optimized_scheduler": True},
        "optimization-level-3": {"xla_backend_optimization_level": 3},
    }


def user_flag_names(environ=os.environ) -> set[str]:
    """The flag names set in `XLA_FLAGS` ("--xla_cpu_use_onednn=true" -> "xla_cpu_use_onednn")."""
    try:
        words = shlex.split(environ.get("XLA_FLAGS", ""))
    except ValueError:
        words = environ.get("XLA_FLAGS", "").split()
    return {w.lstrip("-").split("=", 1)[0] for w in words if w.startswith("-")}


def choose(*, cache_dir: Path | None) -> XlaChoice:
    """The fastest exact compiler options on this machine, measured once and cached."""
    cached = _CACHE.read(cache_dir).get(PROBE_KEY)
    if cached is not None:
        return cached
    from ..contention import ContentionMeter

    meter = ContentionMeter()
    try:
        choice = measure_in_child(candidates())
    except Exception:  # noqa: BLE001 - measuring is an optimisation; the base options stand
        log.warning("could not measure XLA compiler options; using the base options", exc_info=True)
        return XlaChoice(base_options())
    if cache_dir is not None:
        _CACHE.record(cache_dir, {PROBE_KEY: choice}, meter.stop())  # not kept if timed on a shared machine
    log.info("XLA:CPU compiler options: %s (measured: %s%s)", choice.describe(),
             ", ".join(f"{k} x{v:.2f}" for k, v in choice.measured.items()),
             "".join(f"; {k} rejected: {why}" for k, why in choice.rejected.items()))
    return choice


def measure(candidate_options: dict[str, dict], build, announce=lambda name: None) -> XlaChoice:
    """Compile the probe with the base options and with each candidate on top of them, drop the
    inexact and unknown ones, time the rest.

    `build(options)` compiles the probe and returns a call giving its result as numpy
    (`compile_probe`; tests pass another).  `announce(name)` is called before each candidate
    compiles, so a parent process can tell which one took its child down."""
    taken_by_user = user_flag_names()
    skipped = sorted(n for n, o in candidate_options.items() if taken_by_user & set(o))
    base = base_options()
    candidate_options = {n: base | o for n, o in candidate_options.items()}
    reference_call = build(dict(base))
    reference = reference_call()
    scale = scale_of(reference)
    exact: dict[str, tuple[dict, object, float]] = {}
    rejected: dict[str, str] = {}
    for name, options in candidate_options.items():
        if name in skipped:
            continue
        announce(name)
        verdict = _try(build, options, reference, scale)
        if isinstance(verdict, str):
            rejected[name] = verdict
        else:
            exact[name] = (options, *verdict)
    errors = {n: v[2] for n, v in exact.items()}

    def time(timed: dict) -> dict[str, float]:
        announce(None)  # timing: a crash now is no candidate's alone
        return _interleaved_speedups(reference_call, timed)

    def combine(options: dict):
        announce("combined")
        verdict = _try(build, options, reference, scale)
        if isinstance(verdict, str):
            rejected["combined"] = verdict
            return None
        errors["combined"] = verdict[1]
        return (options, *verdict)

    decided = decide(exact, time, combine, MIN_SPEEDUP)
    if decided.best is None:
        return XlaChoice(base, measured=decided.measured, rejected=rejected, skipped_for_user_flags=skipped,
                         errors=errors)
    options, _, error = decided.exact[decided.best]
    return XlaChoice(dict(options), decided.speedup, error, decided.measured, rejected, skipped, errors)


def _try(build, options: dict, reference: np.ndarray, scale: float):
    """(call, error) when `options` compile and stay within TOLERANCE; else why not (a str)."""
    try:
        call = build(dict(options))
        result = call()
    except Exception as exc:  # noqa: BLE001 - an option this jaxlib does not know, or cannot use
        return f"does not compile here: {str(exc).splitlines()[0][:160]}"
    if result.shape != reference.shape:
        return f"result shape {result.shape}, not {reference.shape}"
    error = relative_error(result, reference, scale)
    if not error <= TOLERANCE:  # also refuses NaN
        return f"inexact: max relative difference {error:.2e} > {TOLERANCE:g}"
    return call, error


def _interleaved_speedups(reference_call, exact: dict) -> dict[str, float]:
    """Each candidate's median speedup over the base compilation, timed in rotating rounds."""
    calls = {"default": reference_call} | {n: v[1] for n, v in exact.items()}
    if len(calls) == 1:
        return {}
    for call in calls.values():  # warm-up: first runs allocate
        call()
    one_call = seconds(reference_call)
    rounds = int(min(9, max(3, PROBE_BUDGET_S / max(one_call * len(calls), 1e-6))))
    times: dict[str, list[float]] = {n: [] for n in calls}
    names = list(calls)
    for r in range(rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            times[name].append(seconds(calls[name]))
    base = median(times["default"])
    return {n: base / median(times[n]) for n in exact}


# --------------------------------------------------------------------------- the child process

#: Seconds a child may take before it is given up (the probe takes a few on 2 busy cores).
CHILD_TIMEOUT_S = 120


def measure_in_child(candidate_options: dict[str, dict]) -> XlaChoice:
    """`measure` in a fresh Python process: an option can crash XLA (oneDNN's graph dots die
    with SIGILL on this project's AMD CPU), and a crash must cost a candidate, not the load.
    The child names each candidate before it compiles it; when the child dies, the one it
    named last is recorded as rejected and a new child measures the rest."""
    crashed: dict[str, str] = {}
    for _ in range(len(candidate_options) + 1):
        remaining = {n: o for n, o in candidate_options.items() if n not in crashed}
        outcome = _run_child(remaining)
        if isinstance(outcome, XlaChoice):
            return dataclasses.replace(outcome, rejected={**crashed, **outcome.rejected})
        name, why = outcome
        if name is None or name == "combined":  # not one candidate's fault: no choice to make
            raise RuntimeError(f"the XLA probe process failed while timing: {why}")
        crashed[name] = why
    raise RuntimeError("the XLA probe process kept failing")


def _run_child(candidate_options: dict[str, dict]):
    """The child's XlaChoice, or (the candidate it was compiling or None, why it ended)."""
    env = dict(os.environ, JAX_PLATFORMS="cpu")  # the probe is XLA:CPU's; no GPU to start
    outcome = measured.run_child(child_command(), candidate_options, timeout=CHILD_TIMEOUT_S, env=env)
    if outcome.choice() is not None:
        return XlaChoice(**outcome.choice())
    return outcome.last("compiling"), f"the process ended with {outcome.ending()} while compiling it"


def child_command(prelude: str = "") -> list[str]:
    """The child's command line: this module's `child_main` (after `prelude`; tests use it to
    stand in for the compiler)."""
    return measured.child_command(__name__, prelude)


def child_main() -> None:
    """The child's side: candidates as JSON on stdin; it says which one it compiles before each
    (`{"compiling": name}`), so the parent can tell which one took it down."""
    measured.child_main(lambda candidates, say: measure(candidates, compile_probe, lambda name: say(compiling=name)))


# --------------------------------------------------------------------------- the probe program


def probe_program(x, p):
    """One post-norm encoder layer (BERT's): what the jax backend's MiniLM and bert entries spend
    their time on, in the same jnp operations the generated code uses."""
    import jax
    import jax.numpy as jnp

    batch, seq, width = x.shape
    heads = PROBE_SHAPE["heads"]

    def layer_norm(h, gamma, beta):
        mean = jnp.mean(h, axis=-1, keepdims=True)
        var = jnp.mean(jnp.square(h - mean), axis=-1, keepdims=True)
        return (h - mean) * jax.lax.rsqrt(var + 1e-12) * gamma + beta

    qkv = (x @ p["qkv_w"].T + p["qkv_b"]).reshape(batch, seq, 3, heads, width // heads)
    q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
    scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) * (width // heads) ** -0.5
    context = jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(scores, axis=-1), v).reshape(batch, seq, width)
    h = layer_norm(x + context @ p["out_w"].T + p["out_b"], p["ln1_g"], p["ln1_b"])
    up = jax.nn.gelu(h @ p["up_w"].T + p["up_b"], approximate=False)
    return layer_norm(h + up @ p["down_w"].T + p["down_b"], p["ln2_g"], p["ln2_b"])


def probe_inputs() -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """Seeded inputs and weights at `PROBE_SHAPE`, scaled like a trained BERT's (std 0.02-1)."""
    s = PROBE_SHAPE
    rng = np.random.default_rng(0)
    normal = lambda *shape, std=0.05: (rng.standard_normal(shape) * std).astype(np.float32)  # noqa: E731
    x = normal(s["batch"], s["seq"], s["width"], std=1.0)
    params = {"qkv_w": normal(3 * s["width"], s["width"]), "qkv_b": normal(3 * s["width"]),
              "out_w": normal(s["width"], s["width"]), "out_b": normal(s["width"]),
              "up_w": normal(s["ff"], s["width"]), "up_b": normal(s["ff"]),
              "down_w": normal(s["width"], s["ff"]), "down_b": normal(s["width"]),
              "ln1_g": 1 + normal(s["width"]), "ln1_b": normal(s["width"]),
              "ln2_g": 1 + normal(s["width"]), "ln2_b": normal(s["width"])}
    return x, params


def compile_probe(options: dict):
    """`probe_program` compiled on the CPU with `options`; returns a call giving its result."""
    import jax

    device = jax.devices("cpu")[0]
    x, params = jax.device_put(probe_inputs(), device)
    compiled = jax.jit(probe_program, compiler_options=options or None).lower(x, params).compile()
    return lambda: np.asarray(compiled(x, params).block_until_ready())


# --------------------------------------------------------------------------- the per-machine cache


def machine_key() -> str:
    """What a timing depends on: CPU model, logical cores, jaxlib version, the user's XLA_FLAGS."""
    import jaxlib

    flags = " ".join(os.environ.get("XLA_FLAGS", "").split())
    return f"{cpu_model()}|cores={os.cpu_count()}|jaxlib={jaxlib.__version__}|XLA_FLAGS={flags}"


_CACHE = DecisionCache("xla-options.json", machine_key, XlaChoice)
_cache_file = _CACHE.path
