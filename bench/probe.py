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
    cached = _cache_state()
    method.build()
    written = _written_since(cached)
    method.load()
    if method.supports("fixed"):
        for size in (workload.latency_batch, workload.throughput_batch):
            method.run(method.prepare(make_batch(size, workload.seq, workload.seed)))
    else:  # the corpus anchor: one batch of texts through encode
        from .corpus import corpus

        method.encode(corpus(workload.corpus_batch, workload.seed))
    peak = _vm_hwm_kib()
    method.close()
    return {"peak_rss_mib": round(peak / 1024, 1), "rss_before_load_mib": round(before / 1024, 1),
            "children_peak_rss_mib": round(_children_peak_kib() / 1024, 1), "cache_written": written}


def _cache_state() -> dict[str, int]:
    """The Linnet cache's artifacts (generated sources and exports, measured decisions) by
    path, with their modification times."""
    from linnet.backends import cache_dir

    root = cache_dir()
    found = {}
    for pattern in ("generated/*/*", "kernels/*"):
        for path in root.glob(pattern):
            if ".tmp" not in path.name:
                found[path.relative_to(root).as_posix()] = path.stat().st_mtime_ns
    return found


def _written_since(before: dict[str, int]) -> list[str]:
    """What the probe's own first load built or measured.  The benchmark process built every
    method before probing, so this is empty unless a cache key differed (the source tree
    edited during the run, say); then the probe's peak includes that build."""
    return sorted(path for path, stamp in _cache_state().items() if before.get(path) != stamp)


def _children_peak_kib() -> int:
    """The largest peak RSS among the child processes the load ran and waited for (ONNX
    Runtime's and XLA's option probes measure in a child), 0 if none.  A child's ru_maxrss
    starts from this process's RSS when it forked (see `_vm_hwm_kib`), so a child that stays
    smaller than that reports this process's RSS at the fork instead of its own peak."""
    return resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    model, key, workdir = argv[:3]
    print("BENCH-PROBE " + json.dumps(probe(model, key, Path(workdir))), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
