"""Did other work share the CPU while something was timed?

The load average cannot tell: on a 2-core machine a bench's own two compute threads (plus a
Triton server it starts) already push it to 2 or more.  What matters is CPU time that
*other* processes took, so this module reads the machine's busy time from /proc/stat and
subtracts what this process and its descendants used over the same interval.  The share of
the machine's capacity the others used is what the bench reports, and what the load-time
kernel probes (`linnet.backends.measured`) check before they cache a choice.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

#: Above this share of the machine's CPU capacity taken by other processes, a bench run is
#: labelled as shared and its ratios as rough, and a probe's choice is not cached.
SHARED_ABOVE = 0.10

_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _machine_busy_seconds() -> float | None:
    """CPU seconds all processes have spent running since boot (idle and iowait excluded)."""
    try:
        fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
    except OSError:
        return None
    values = [int(v) for v in fields]
    idle = values[3] + (values[4] if len(values) > 4 else 0)
    # guest time is already inside user time; count user..steal only.
    return (sum(values[:8]) - idle) / _TICKS


def _children(pid: int) -> list[int]:
    found = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            found.extend(int(c) for c in (task / "children").read_text().split())
        except (OSError, ValueError):
            continue
    return found


def _process_seconds(pid: int) -> float:
    """utime + stime of one live process, 0 if it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0.0
    fields = stat.rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICKS


def _own_seconds() -> float:
    """CPU seconds of this process, its waited-for children, and its live descendants."""
    times = os.times()
    total = times.user + times.system + times.children_user + times.children_system
    pending = _children(os.getpid())
    while pending:
        pid = pending.pop()
        total += _process_seconds(pid)
        pending.extend(_children(pid))
    return total


@dataclass
class Contention:
    """What other processes took while a measured stretch ran."""

    others_share: float  # of the machine's capacity (cores x wall time), 0..1
    wall_s: float
    cores: int

    @property
    def shared(self) -> bool:
        return self.others_share > SHARED_ABOVE

    def describe(self) -> str:
        return (f"other processes used {100 * self.others_share:.0f}% of the {self.cores} cores' time "
                f"over the {self.wall_s:.0f} s run")


class ContentionMeter:
    """Start it before the measured work, call `stop()` after."""

    def __init__(self):
        self._wall = time.monotonic()
        self._busy = _machine_busy_seconds()
        self._own = _own_seconds()

    def stop(self) -> Contention | None:
        busy = _machine_busy_seconds()
        if busy is None or self._busy is None:
            return None
        wall = time.monotonic() - self._wall
        cores = os.cpu_count() or 1
        others = max(0.0, (busy - self._busy) - (_own_seconds() - self._own))
        return Contention(min(1.0, others / (wall * cores)) if wall > 0 else 0.0, wall, cores)
