"""What the load-time probes share: timing, and a per-machine cache of what they chose.

`torch_kernels` (a Linear kernel per shape), `onnx_options` (ONNX Runtime session options
per export) and `xla_options` (XLA:CPU compiler options for jax and stablehlo) each time
candidates once per machine and keep the decision in a JSON file under
`$LINNET_CACHE/kernels/`: `{machine key: {what was measured: decision}}`, where the machine key
names what a timing depends on (CPU model, threads, library version). A cache that cannot be
read is an empty one; one that cannot be written is skipped, since a probe only costs time.
Each tuner names its file, machine key and choice record in one `DecisionCache` and keeps
only its candidates, how it measures them and how it applies the winner.
"""
from __future__ import annotations

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


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


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
    try:
        return {k: kind(**v) for k, v in read_decisions(path, machine).items()}
    except TypeError:  # fields of another version of the record
        return {}


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

    def record(self, cache_dir: Path, choices: dict) -> None:
        """Add `choices` ({what was measured: record}) to this machine's, other machines' kept."""
        record_decisions(self.path(cache_dir), self.machine_key(), {k: vars(c) for k, c in choices.items()})
