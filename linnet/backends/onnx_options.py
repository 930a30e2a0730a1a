"""The machine's fastest exact ONNX Runtime session options for a model, chosen by measuring.

Which session options run a graph fastest depends on the CPU, its cores, what else runs on
it and the graph: ORT's graph optimisation levels rewrite the graph differently (the issue
measured ORT's transformer fusions *slower* than the plain graph on this project's machine),
spinning worker threads trade CPU for latency, and a parallel executor helps only graphs with
independent branches.  So nothing is assumed: at load, on CPU, the root entry's model is
opened with each candidate in `candidates()` (one change from the default session each), each
is timed against the default session in alternating rounds of a few calls on one probe input
(at most two sessions open at a time: each holds its own pre-packed weights), and a
candidate is taken only when it is faster by
`MIN_SPEEDUP` and its output is within `TOLERANCE` of the default session's (relative to the
output's magnitude, as `torch_kernels` does for Linear).  When several single changes win,
their combination is measured too; the winner is then timed against the default once more
and kept only if it wins again.  All of it runs in a child process (`measure_in_child`), so
the two sessions' memory is never the loading process's.  The decision is cached per machine (CPU model, logical
cores, onnxruntime version) and model (the export's cache folder, which names its content)
under `$LINNET_CACHE/kernels/onnx-session.json`, so later loads open one session only.

`nest.load(..., backend="onnx", kernels="default")` skips all of this and uses the default
session (`default_settings`); so does any provider other than the CPU one.
"""
from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from . import measured
from .measured import MIN_SPEEDUP, TOLERANCE, DecisionCache, cpu_model, decide, median, relative_error, scale_of, seconds

log = logging.getLogger("linnet.onnx")

#: Seconds the timed rounds may take in all (the rounds shrink for slow models, never below 3).
PROBE_BUDGET_S = 4.0
#: Sizes tried for each free dim of the probe input, largest first (a model with fewer
#: positions than the first fails on it and gets the next).
PROBE_SIZES = (128, 32, 8)
#: Calls per session in each round, the first untimed.  Each session has its own worker
#: threads, which spin for a while after a call (unless spinning is off); timed one call
#: apiece, every session would run against the last one's spinning threads, and the
#: no-spinning candidate won a probe (x1.08) that lost in steady use (MiniLM B=1: 10.9 ms
#: against 9.0 ms with the default session, in one interleaved bench run).
BLOCK = 4
#: Seconds the probe's child process may take (bert-base measures in ~15 s on 2 busy cores).
CHILD_TIMEOUT_S = 300
#: What a recorded choice's `measured` holds when the probe ran out of time (`choose`).
TIMED_OUT = "probe timed out"

LEVELS = ("basic", "extended", "all")


@dataclass(frozen=True)
class SessionChoice:
    settings: dict                      # what differs from the default session ({} = the default)
    speedup: float = 1.0                # default's time / the chosen session's in the probe
    max_error: float = 0.0              # relative max |difference| from the default session
    measured: dict = field(default_factory=dict)  # candidate name -> speedup (for logs and info)

    def describe(self) -> str:
        if not self.settings:
            return "default session options"
        return ", ".join(f"{k}={v}" for k, v in sorted(self.settings.items())) + f" (x{self.speedup:.2f})"


def default_settings(threads: int) -> dict:
    """The session Linnet opens without measuring: every graph optimisation, one intra-op
    thread per physical core, sequential execution, spinning threads (ORT's default)."""
    return {"graph_optimization_level": "all", "intra_op_num_threads": threads, "allow_spinning": True,
            "execution_mode": "sequential"}


def session_options(settings: dict):
    """An `onnxruntime.SessionOptions` from a full settings dict (`default_settings` keys)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = {"off": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
                                        "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
                                        "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
                                        "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL}[
        settings["graph_optimization_level"]]
    options.intra_op_num_threads = int(settings["intra_op_num_threads"])
    options.add_session_config_entry("session.intra_op.allow_spinning", "1" if settings["allow_spinning"] else "0")
    if settings["execution_mode"] == "parallel":
        options.execution_mode = ort.ExecutionMode.ORT_PARALLEL
        options.inter_op_num_threads = 2
    else:
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    return options


def candidates(threads: int) -> dict[str, dict]:
    """Name -> the changes from the default session to measure (each one change)."""
    found = {f"level={level}": {"graph_optimization_level": level} for level in LEVELS if level != "all"}
    logical = os.cpu_count() or threads
    if logical != threads:
        found[f"threads={logical}"] = {"intra_op_num_threads": logical}
    found["no-spinning"] = {"allow_spinning": False}
    found["parallel"] = {"execution_mode": "parallel"}
    return found


def choose(model_file: Path, providers: list, threads: int, *, cache_dir: Path | None,
           model_key: str) -> SessionChoice:
    """The fastest exact settings for `model_file` on this machine, measured once and cached."""
    cached = _CACHE.read(cache_dir).get(model_key)
    if cached is not None:
        return cached
    import subprocess

    from ..contention import ContentionMeter

    meter = ContentionMeter()
    try:
        choice = measure_in_child(model_file, providers, threads)
        contention = meter.stop()  # a choice timed on a shared machine is used, not kept
    except subprocess.TimeoutExpired:
        # A machine too busy to finish the probe in CHILD_TIMEOUT_S: the default session is
        # recorded as the choice, or every later load of this model would wait that long again.
        log.warning("measuring ONNX Runtime session options for %s took over %d s; using and recording "
                    "the defaults (remove %s to measure again)", model_file, CHILD_TIMEOUT_S,
                    _CACHE.path(cache_dir) if cache_dir is not None else "the record")
        choice = SessionChoice({}, measured={TIMED_OUT: 0.0})
        contention = None
    except Exception:  # noqa: BLE001 - measuring is an optimisation; the default session stands
        log.warning("could not measure ONNX Runtime session options for %s; using the defaults",
                    model_file, exc_info=True)
        return SessionChoice({})
    if cache_dir is not None:
        _CACHE.record(cache_dir, {model_key: choice}, contention)
    log.info("ONNX Runtime session for %s: %s (measured: %s)", model_file.name, choice.describe(),
             ", ".join(f"{k} x{v:.2f}" for k, v in choice.measured.items()))
    return choice


def _measure(model_file: Path, providers: list, threads: int) -> SessionChoice:
    import onnxruntime as ort

    base = default_settings(threads)
    open_session = lambda changes: ort.InferenceSession(  # noqa: E731
        str(model_file), sess_options=session_options({**base, **changes}), providers=providers)
    reference_session = open_session({})
    feeds = probe_inputs(reference_session)
    if feeds is None:
        return SessionChoice({})
    output = reference_session.get_outputs()[0].name
    reference = reference_session.run([output], feeds)[0]
    scale = scale_of(reference)
    # At most two sessions are open at a time (the default and one candidate): each holds its
    # own pre-packed copy of every weight (two peak at 1.1 GB for bert-base), so opening all
    # candidates together would multiply a first load's peak memory by their number.
    def exact_candidate(changes: dict):
        """(changes, how to open its session, error) when within TOLERANCE of the default, else None."""
        error = relative_error(open_session(changes).run([output], feeds)[0], reference, scale)
        if not error <= TOLERANCE:  # also refuses NaN
            return None
        return changes, lambda: open_session(changes), error

    exact = {name: c for name, c in ((n, exact_candidate(ch)) for n, ch in candidates(threads).items())
             if c is not None}
    verdict = decide(exact, lambda timed: _interleaved_speedups(reference_session, timed, feeds, output),
                     exact_candidate, MIN_SPEEDUP)
    if verdict.best is None:
        return SessionChoice({}, measured=verdict.measured)
    changes, _, error = verdict.exact[verdict.best]
    return SessionChoice(dict(changes), verdict.speedup, error, verdict.measured)


def pinned_dims(session) -> dict[str, int]:
    """Free dims the export's preconditions hold to one size (`linnet.preconditions` metadata,
    "H == 224, W == 224" for ViT, whose position embeddings fix the image size): no size of
    `PROBE_SIZES` would run those."""
    try:
        text = session.get_modelmeta().custom_metadata_map.get("linnet.preconditions", "")
    except Exception:  # noqa: BLE001 - a file from elsewhere: no metadata, no pins
        return {}
    return {name: int(value) for name, value in re.findall(r"\b([A-Za-z_]\w*) == (\d+)\b", text)}


def measure_in_child(model_file: Path, providers: list, threads: int) -> SessionChoice:
    """`_measure` in a fresh Python process (`measured.run_child`).  The measurement holds two
    sessions, each with its own pre-packed copy of the weights (1.1 GB peak for bert-base,
    twice a loaded model's); in a child, that memory is the child's and is all returned when it
    exits, where in the loading process it would raise the process's peak for good and, freed,
    mostly stay resident (glibc keeps the heap: 1.25 GB after the measurement in-process, for
    a model that then needs 0.55 GB).  The child times the same sessions on the same file."""
    request = {"model_file": str(model_file), "providers": [list(p) if isinstance(p, tuple) else p for p in providers],
               "threads": threads}
    outcome = measured.run_child(measured.child_command(__name__), request, timeout=CHILD_TIMEOUT_S)
    if outcome.choice() is None:
        raise RuntimeError(f"the session-option probe process ended with {outcome.ending()}")
    return SessionChoice(**outcome.choice())


def child_main() -> None:
    """The child's side (`measured.child_main`): the request as JSON on stdin."""
    def measure(request: dict, say) -> SessionChoice:
        providers = [tuple(p) if isinstance(p, list) else p for p in request["providers"]]
        return _measure(Path(request["model_file"]), providers, int(request["threads"]))

    measured.child_main(measure)


def probe_inputs(session) -> dict | None:
    """Inputs for timing: ones for integer inputs (a valid token id, token type and mask
    everywhere), seeded normal values for float ones; free dims 1 for a batch-like first dim,
    the size a precondition pins (`pinned_dims`), else the largest of `PROBE_SIZES` the model
    runs.  None when no size runs."""
    generator = np.random.default_rng(0)
    output = session.get_outputs()[0].name
    pinned = pinned_dims(session)
    for size in PROBE_SIZES:
        feeds = {}
        for arg in session.get_inputs():
            dims = [d if isinstance(d, int) else (1 if i == 0 else pinned.get(d, size))
                    for i, d in enumerate(arg.shape)]
            dtype = _NUMPY.get(arg.type)
            if dtype is None:
                return None
            kind = np.dtype(dtype).kind
            feeds[arg.name] = (np.ones(dims, dtype) if kind in "iub"
                               else generator.standard_normal(dims).astype(dtype))
        try:
            session.run([output], feeds)
            return feeds
        except Exception:  # noqa: BLE001 - too long for the model: try a shorter one
            continue
    return None


_NUMPY = {"tensor(int32)": np.int32, "tensor(int64)": np.int64, "tensor(float)": np.float32,
          "tensor(float16)": np.float16, "tensor(bool)": np.bool_, "tensor(double)": np.float64}


def _interleaved_speedups(reference_session, exact: dict, feeds: dict, output: str) -> dict[str, float]:
    """Each candidate's median speedup over the default session, the two timed in alternating
    rounds; a candidate's session (`exact[name][1]` opens it) is open only while it is timed."""
    run = lambda session: session.run([output], feeds)  # noqa: E731
    one_call = seconds(lambda: run(reference_session))
    per_pair = max(1e-6, PROBE_BUDGET_S / max(1, len(exact)))
    rounds = int(min(7, max(3, per_pair / max(one_call * 2 * BLOCK, 1e-6))))
    speedups = {}
    for name, (_, open_candidate, _) in exact.items():
        candidate = open_candidate()
        run(candidate)  # warm-up: the first run allocates and packs
        pair = {"default": reference_session, name: candidate}
        times: dict[str, list[float]] = {n: [] for n in pair}
        for r in range(rounds):
            for key in (list(pair) if r % 2 == 0 else list(pair)[::-1]):
                session = pair[key]
                run(session)  # untimed: the other session's spinning threads wind down meanwhile
                times[key].append(median([seconds(lambda: run(session)) for _ in range(BLOCK - 1)]))
        speedups[name] = median(times["default"]) / median(times[name])
        del candidate, pair
    return speedups


# --------------------------------------------------------------------------- the per-machine cache


def machine_key() -> str:
    """What a timing depends on besides the model: CPU model, logical cores, ORT version."""
    import onnxruntime as ort

    return f"{cpu_model()}|cores={os.cpu_count()}|onnxruntime={ort.__version__}"


_CACHE = DecisionCache("onnx-session.json", machine_key, SessionChoice)
_cache_file = _CACHE.path
