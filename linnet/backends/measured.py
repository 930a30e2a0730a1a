"""What the load-time probes share: timing, and a per-machine cache of what they chose.

`torch_kernels` (a Linear kernel per shape), `onnx_options` (ONNX Runtime session options
per export) and `xla_options` (XLA:CPU compiler options for jax and stablehlo) each time
candidates once per machine and keep the decision in a JSON file under
`$LINNET_CACHE/kernels/`: `{machine key: {what was measured: decision}}`, where the machine key
names what a timing depends on (CPU model, threads, library version). A cache that cannot be
read is an empty one; one that cannot be written is skipped, since a probe only costs time.
Each tuner names its file, machine key and choice record in one `DecisionCache` and keeps
only its candidates, how it times them and how it applies the winner.  What they share is
here, once: the exactness check (`relative_error` against `scale_of` the default's result,
within `TOLERANCE`), the decision among exact candidates (`decide`: beat the default by
`MIN_SPEEDUP`, combine several winners, win a second timing), what is kept (nothing timed while
other processes took over a tenth of the CPU, `linnet.contention`), and the child process a probe
runs in (`run_child` / `child_main`: JSON in on stdin, one JSON line a step out), which the
ONNX and XLA tuners use; torch's Linear probe is a few in-process GEMMs and needs none.
"""
from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import platform
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

log = logging.getLogger("linnet.measured")

#: `nest.load(..., kernels=...)` on every backend: "auto" measures and picks; "default" does not
#: (declared with the backends' other options in their records).
from . import KERNEL_CHOICES  # noqa: E402,F401
#: Largest accepted |candidate - default| per element, relative to max(1, max|default|).
TOLERANCE = 1e-5
#: A candidate must beat the default by this factor to be taken (noise margin).
MIN_SPEEDUP = 1.05


def seconds(fn) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def median(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[len(ordered) // 2]


@functools.lru_cache(maxsize=1)
def proc_cpuinfo() -> str:
    """/proc/cpuinfo's text, read once per process: the kernel builds it on every read, which on
    a many-core machine takes milliseconds, and a load asks for the CPU several times."""
    try:
        return Path("/proc/cpuinfo").read_text()
    except OSError:
        return ""


def cpu_model(cpuinfo: str | None = None) -> str:
    """The CPU as the decisions depend on it: its model name, and on x86 its family and model
    numbers, since a cloud machine's name ("AMD EPYC") is the same for Zen 4 (family 25) and
    Zen 5 (family 26), whose kernels' speeds differ. `cpuinfo` is /proc/cpuinfo's text."""
    if cpuinfo is None:
        cpuinfo = proc_cpuinfo()
    fields: dict[str, str] = {}
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
        if not line.strip():
            break  # the first processor's block says it for all
    name = fields.get("model name") or platform.processor() or platform.machine()
    if fields.get("cpu family") and fields.get("model"):
        return f"{name} (family {fields['cpu family']}, model {fields['model']})"
    return name


def cpu_flags() -> str:
    """The CPU's instruction-set flags (/proc/cpuinfo's `flags`, or `Features` on Arm), hashed:
    a VM can hide AVX-512 from a CPU model that has it, and kernels pick their code by what
    they see. Empty where there is no /proc/cpuinfo."""
    for line in proc_cpuinfo().splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            return hashlib.sha256(value.strip().encode()).hexdigest()[:16]
    return ""


def read_decisions(path: Path, machine: str) -> dict[str, dict]:
    """This machine's decisions in the cache file, as plain dicts (empty when unreadable)."""
    try:
        entries = json.loads(path.read_text()).get(machine, {})
        return entries if isinstance(entries, dict) else {}
    except (OSError, ValueError, AttributeError):
        return {}


def read_choices(path: Path | None, machine: str, kind: type) -> dict:
    """This machine's decisions in the cache file as `kind` records; empty when there is no
    cache (`path` None), it is unreadable, or another version of the caller wrote it."""
    if path is None:
        return {}
    choices = {}
    for key, fields in read_decisions(path, machine).items():
        # One record another version wrote (other fields) is measured again and overwritten;
        # it must not hide the rest, or every load measures every shape again.
        try:
            choices[key] = kind(**fields)
        except TypeError:
            continue
    return choices


def record_decisions(path: Path, machine: str, decisions: dict[str, dict]) -> None:
    """Add `decisions` to this machine's in the cache file, atomically (other machines' kept)."""
    try:
        data = json.loads(path.read_text()) if path.is_file() else {}
    except (OSError, ValueError):
        data = {}
    data.setdefault(machine, {}).update(decisions)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary = path.with_suffix(f".{os.getpid()}.tmp")
        temporary.write_text(json.dumps(data, indent=1, sort_keys=True))
        os.replace(temporary, path)
    except OSError:
        log.debug("could not write the cache %s", path, exc_info=True)


@dataclass(frozen=True)
class DecisionCache:
    """One tuner's cache of measured choices: `<cache dir>/kernels/<file>`, holding
    `{machine_key(): {what was measured: vars(kind record)}}`."""

    file: str
    machine_key: Callable[[], str]
    kind: type

    def path(self, cache_dir: Path) -> Path:
        return cache_dir / "kernels" / self.file

    def read(self, cache_dir: Path | None) -> dict:
        """This machine's choices as `kind` records; empty without a cache dir or a readable file."""
        return read_choices(None if cache_dir is None else self.path(cache_dir), self.machine_key(), self.kind)

    def record(self, cache_dir: Path, choices: dict, contention=None) -> None:
        """Add `choices` ({what was measured: record}) to this machine's, other machines' kept.

        contention: what other processes took while the choices were timed (a
        `linnet.contention.Contention`, None when unknown).  Choices timed on a shared machine
        serve the load that measured them but are not kept, so the next load measures again:
        once cached, a choice is never timed again, and one made while another job held the
        cores stays wrong for good (GPT-2's one-row products were cached as 1.00x and 0.87x
        splits under load, measured 1.13-1.50x alone; its decode fell from 1.54x to 1.29x).
        """
        if contention is not None and contention.shared:
            log.info("%s: choices not cached; %s while they were timed", self.file, contention.describe())
            return
        record_decisions(self.path(cache_dir), self.machine_key(), {k: vars(c) for k, c in choices.items()})


# --------------------------------------------------------------------------- exactness and the decision


def scale_of(reference) -> float:
    """What a difference from `reference` is relative to: max(1, max|reference|)."""
    import numpy as np

    return max(1.0, float(np.max(np.abs(reference)))) if reference.size else 1.0


def relative_error(got, want, scale: float) -> float:
    """max|got - want| / scale in f64; inf when the shapes differ."""
    import numpy as np

    if got.shape != want.shape:
        return float("inf")
    if not got.size:
        return 0.0
    return float(np.max(np.abs(got.astype(np.float64) - want.astype(np.float64)))) / scale


@dataclass(frozen=True)
class Verdict:
    """What `decide` found: the candidate taken (None: the default stands), its speedup (the
    smaller of its two timings), every timed ratio by name, and the exact candidates as timed
    last (with the combination of winners, when it was tried and exact)."""

    best: str | None
    speedup: float
    measured: dict
    exact: dict


def decide(exact: dict, time: Callable[[dict], dict], combine: Callable[[dict], tuple | None],
           min_speedup: float = MIN_SPEEDUP) -> Verdict:
    """The choice every tuner makes the same way, from its exact candidates
    ({name: (changes, how to run it, error)}):

    * time them all against the default (`time(candidates)` -> {name: default's time / its});
    * when several beat it by `min_speedup` (the tuner's MIN_SPEEDUP), merge their changes (the faster overriding the
      slower), and `combine(changes)` gives that candidate (None when it is not exact); it is
      timed with the winners;
    * the best is timed once more against the default alone, and taken only when it wins again:
      the best of several noisy ratios is biased upward, and the choice is kept for good.
    """
    speedups = time(exact)
    winners = [n for n, s in speedups.items() if s >= min_speedup]
    if len(winners) > 1:
        changes: dict = {}
        for name in sorted(winners, key=speedups.get):
            changes.update(exact[name][0])
        combined = combine(changes)
        if combined is not None:
            exact = {"combined": combined} | {n: exact[n] for n in winners}
            retimed = time(exact)
            speedups = retimed | {n: s for n, s in speedups.items() if n not in retimed}
    best = max(speedups, key=speedups.get, default=None)
    measured = {n: round(s, 3) for n, s in speedups.items()}
    if best is None or speedups[best] < min_speedup:
        return Verdict(None, 1.0, measured, exact)
    again = time({best: exact[best]})[best]
    measured[f"{best} (again)"] = round(again, 3)
    speedup = min(speedups[best], again)
    if speedup < min_speedup:
        return Verdict(None, 1.0, measured, exact)
    return Verdict(best, round(speedup, 3), measured, exact)


# --------------------------------------------------------------------------- the child process


def child_command(module: str, prelude: str = "") -> list[str]:
    """A fresh Python running this checkout's `<module>.child_main()` (after `prelude`, Python
    run first in the child; tests use it to stand in for a compiler)."""
    import sys

    root = str(Path(__file__).resolve().parents[2])
    return [sys.executable, "-c", f"import sys; sys.path.insert(0, {root!r}); {prelude}\n"
            f"from {module} import child_main; child_main()"]


@dataclass(frozen=True)
class ChildOutcome:
    """What a measuring child said (its JSON lines, in order) and how it ended."""

    messages: list
    returncode: int
    stderr_tail: str

    def choice(self) -> dict | None:
        """The `{"choice": ...}` the child ends with, None when it died first."""
        return next((m["choice"] for m in self.messages if "choice" in m), None)

    def last(self, key: str):
        """The last value the child gave for `key` (what it was doing when it ended)."""
        return next((m[key] for m in reversed(self.messages) if key in m), None)

    def ending(self) -> str:
        return f"{exit_status(self.returncode)} ({self.stderr_tail})"


def run_child(command: list[str], request, *, timeout: float, env: dict | None = None) -> ChildOutcome:
    """Measure in a child process: `request` as JSON on its stdin, one JSON object a line on its
    stdout.  Why a child: what is measured can crash its process (an XLA option dies with SIGILL)
    or hold memory the loading process should never own (two ORT sessions' packed weights)."""
    import subprocess

    done = subprocess.run(command, input=json.dumps(request), env=env, capture_output=True, text=True,
                          timeout=timeout)
    messages = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    tail = (done.stderr.strip().splitlines() or [""])[-1][:300]
    return ChildOutcome(messages, done.returncode, tail)


def child_main(measure: Callable) -> None:
    """The child's side: the request from stdin, `measure(request, say)` (`say(**message)`
    prints one JSON line at once), the choice record it returns as the last line."""
    import sys

    def say(**message) -> None:
        print(json.dumps(message), flush=True)

    choice = measure(json.loads(sys.stdin.read()), say)
    say(choice=vars(choice))


def exit_status(code: int) -> str:
    import signal

    if code < 0:
        try:
            return signal.Signals(-code).name
        except ValueError:
            return f"signal {-code}"
    return f"exit status {code}"
