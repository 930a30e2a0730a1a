"""Peak RSS of one method, measured in a fresh process: `python -m bench.probe MODEL KEY WORKDIR`.

All methods share the benchmark's process, whose RSS high-water mark belongs to none of them.
A probe process does, for one method only, what the benchmark does before timing: imports,
one load, one call at each batch size (a method that only encodes: one batch of the corpus
through `encode`) (the first call is where torch.compile and jax.jit
compile, and their memory counts). It then prints its own peak RSS (VmHWM) as one JSON line.
The figure therefore includes the Python interpreter and the frameworks the method imports.
"""
from __future__ import annotations

import json
import resource
import sys
from pathlib import Path


def _vm_hwm_kib() -> int:
    """This process's peak RSS. Not ru_maxrss: Linux carries that over from the parent
    through fork and exec, so a probe started by a big process would report the parent's."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def probe(model: str, key: str, workdir: Path, device: str = "cpu") -> dict:
    from .methods import BY_KEY, Context
    from .weights import resolve
    from .workload import Workload, make_batch

    workload = Workload(device=device)
    method = BY_KEY[key](Context(resolve(model), workload, workdir, probe=True))
    before = _vm_hwm_kib()
    method.build()
    method.load()
    if method.supports("fixed"):
        for size in (workload.latency_batch, workload.throughput_batch):
            method.run(method.prepare(make_batch(size, workload.seq, workload.seed)))
    else:  # the corpus anchor: one batch of texts through encode
        from .corpus import corpus

        method.encode(corpus(workload.corpus_batch, workload.seed))
    peak = _vm_hwm_kib()
    method.close()
    return {"peak_rss_mib": round(peak / 1024, 1), "rss_before_load_mib": round(before / 1024, 1)}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    model, key, workdir = argv[:3]
    print("BENCH-PROBE " + json.dumps(probe(model, key, Path(workdir))), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
