"""The cache of measured choices that the three per-machine tuners share (`linnet.backends.measured`)."""
import json
from dataclasses import dataclass

from linnet.backends import onnx_options, torch_kernels, xla_options
from linnet.backends.measured import DecisionCache


@dataclass(frozen=True)
class _Pick:
    name: str
    speedup: float


def _cache(key: str) -> DecisionCache:
    return DecisionCache("probe.json", lambda: key, _Pick)


def test_choices_round_trip_per_machine(tmp_path):
    here, there = _cache("cpu-a|threads=4"), _cache("cpu-b|threads=8")
    assert here.read(tmp_path) == {} and here.read(None) == {}
    here.record(tmp_path, {"256x1024": _Pick("onednn", 1.4)})
    there.record(tmp_path, {"256x1024": _Pick("default", 1.0)})
    here.record(tmp_path, {"64x64": _Pick("default", 0.9)})  # added to this machine's, not replacing them
    assert here.read(tmp_path) == {"256x1024": _Pick("onednn", 1.4), "64x64": _Pick("default", 0.9)}
    assert there.read(tmp_path) == {"256x1024": _Pick("default", 1.0)}
    stored = json.loads((tmp_path / "kernels" / "probe.json").read_text())
    assert stored["cpu-b|threads=8"] == {"256x1024": {"name": "default", "speedup": 1.0}}


def test_unreadable_or_foreign_cache_reads_empty(tmp_path):
    cache = _cache("m")
    path = cache.path(tmp_path)
    path.parent.mkdir(parents=True)
    path.write_text("{not json")
    assert cache.read(tmp_path) == {}
    path.write_text(json.dumps({"m": {"k": {"name": "x", "other_field": 1}}}))  # another version's record
    assert cache.read(tmp_path) == {}
    cache.record(tmp_path, {"k": _Pick("x", 2.0)})  # an unreadable file is replaced, not a crash
    assert cache.read(tmp_path) == {"k": _Pick("x", 2.0)}


def test_each_tuner_keeps_its_own_file(tmp_path):
    files = {torch_kernels._cache_file(tmp_path), onnx_options._cache_file(tmp_path), xla_options._cache_file(tmp_path)}
    assert {p.name for p in files} == {"torch-linear.json", "onnx-session.json", "xla-options.json"}
    assert {p.parent for p in files} == {tmp_path / "kernels"}
