"""What a warm ONNX load imports: only what it runs.

A warm `nest.load` of a zoo entry on the onnx backend spends most of its time in ONNX Runtime's
session; of the rest, imports were the largest part (docs/bench.md, "Time to a first result").
These modules are each needed by another kind of load only, so an ordinary one must not
import them: the `hf:`/saved-folder reader (and sentence-transformers' pipelines), the int8
planner, the decoder graphs, and psutil (physical cores are read from /proc/cpuinfo).
"""
from __future__ import annotations

import json
import subprocess
import sys

from linnet import nest
from linnet.backends.onnx_runtime import physical_cores

NOT_FOR_A_ZOO_ENCODER = ("linnet.nest.hf", "linnet.nest.sentence", "linnet.backends.onnx_int8",
                         "linnet.backends.onnx_decoder", "psutil")

CHILD = """
import json, sys
import numpy as np
from linnet import nest
model = nest.load("all-minilm-l6-v2", backend="onnx", kernels="default")
assert np.asarray(model.forward(tokens=np.array([[101, 7592, 102]], np.int32))).shape == (1, 3, 384)
print(json.dumps(sorted(name for name in sys.argv[1:] if name in sys.modules)))
"""


def test_a_warm_onnx_load_of_a_zoo_encoder_imports_only_what_it_runs(minilm_checkpoint):
    nest.load("all-minilm-l6-v2", backend="onnx", kernels="default")  # the export, made once
    # A new process, as a user's: this one has imported everything the suite has used.
    run = subprocess.run([sys.executable, "-c", CHILD, *NOT_FOR_A_ZOO_ENCODER], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-3000:]
    assert json.loads(run.stdout.strip().splitlines()[-1]) == []


def _cpuinfo(pairs) -> str:
    """/proc/cpuinfo's text for logical CPUs at these (physical id, core id) pairs."""
    return "\n\n".join(f"processor\t: {n}\nvendor_id\t: AuthenticAMD\nphysical id\t: {package}\n"
                       f"core id\t\t: {core}\nflags\t\t: fpu avx2" for n, (package, core) in enumerate(pairs))


def test_physical_cores_are_distinct_package_and_core_pairs():
    two_threads_each = [(package, core) for package in (0, 1) for core in (0, 1, 2) for _ in range(2)]
    assert physical_cores(_cpuinfo(two_threads_each)) == 6
    # Core ids repeat across packages: two packages with cores 0 and 1 are four cores.
    assert physical_cores(_cpuinfo([(0, 0), (0, 1), (1, 0), (1, 1)])) == 4


def test_a_cpuinfo_without_cores_falls_back_to_psutil_or_the_cpu_count():
    import os

    try:
        import psutil

        expected = psutil.cpu_count(logical=False) or os.cpu_count()
    except ImportError:
        expected = os.cpu_count()
    assert physical_cores("processor\t: 0\nmodel name\t: some ARM core\n") == expected
