"""The cache of measured choices that the three per-machine tuners share (`linnet.backends.measured`)."""
import json
import sys
from dataclasses import dataclass

import numpy as np

from linnet.backends import onnx_options, torch_kernels, xla_options
from linnet.backends.measured import MIN_SPEEDUP, DecisionCache, decide, relative_error, run_child, scale_of


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


def test_choices_timed_on_a_shared_machine_are_not_kept(tmp_path):
    from linnet.contention import SHARED_ABOVE, Contention

    cache = _cache("m")
    cache.record(tmp_path, {"a": _Pick("split", 1.0)}, Contention(SHARED_ABOVE + 0.3, 2.0, 2))
    assert not cache.path(tmp_path).exists()
    cache.record(tmp_path, {"b": _Pick("split", 1.4)}, Contention(SHARED_ABOVE / 2, 2.0, 2))
    cache.record(tmp_path, {"c": _Pick("default", 1.0)}, None)  # unknown (no /proc/stat): kept
    assert cache.read(tmp_path) == {"b": _Pick("split", 1.4), "c": _Pick("default", 1.0)}


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


def test_one_foreign_record_does_not_hide_the_others(tmp_path):
    # A record an older version wrote (an extra field) once emptied the whole machine's cache,
    # and since it was never overwritten every torch load measured every Linear shape again.
    cache = _cache("m")
    path = cache.path(tmp_path)
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"m": {"old": {"name": "x", "speedup": 1.0, "one_row_speedup": 0.5},
                                      "good": {"name": "onednn", "speedup": 1.7}, "junk": [1, 2]}}))
    assert cache.read(tmp_path) == {"good": _Pick("onednn", 1.7)}
    cache.record(tmp_path, {"old": _Pick("default", 1.1)})  # measured again, it replaces the old record
    assert cache.read(tmp_path) == {"good": _Pick("onednn", 1.7), "old": _Pick("default", 1.1)}


def test_each_tuner_keeps_its_own_file(tmp_path):
    files = {torch_kernels._cache_file(tmp_path), onnx_options._cache_file(tmp_path), xla_options._cache_file(tmp_path)}
    assert {p.name for p in files} == {"torch-linear.json", "onnx-session.json", "xla-options.json"}
    assert {p.parent for p in files} == {tmp_path / "kernels"}


# ------------------------------------------------------------------ the shared decision and child


def _timer(ratios: list[dict]):
    """A stand-in for a tuner's timing: each call returns the next set of ratios, for the names asked."""
    calls = []

    def time(candidates: dict) -> dict:
        calls.append(sorted(candidates))
        return {name: ratios[len(calls) - 1][name] for name in candidates}

    return time, calls


def _exact(**changes) -> dict:
    return {name: (change, None, 0.0) for name, change in changes.items()}


def test_one_winner_is_timed_again_and_the_smaller_ratio_kept():
    time, calls = _timer([{"a": 1.5, "b": 0.9}, {"a": 1.2}])
    verdict = decide(_exact(a={"x": 1}, b={"y": 1}), time, lambda changes: None)
    assert calls == [["a", "b"], ["a"]]
    assert verdict.best == "a" and verdict.speedup == 1.2
    assert verdict.measured == {"a": 1.5, "b": 0.9, "a (again)": 1.2}


def test_a_winner_that_loses_the_second_timing_is_not_taken():
    time, _ = _timer([{"a": 1.5}, {"a": 1.01}])
    verdict = decide(_exact(a={"x": 1}), time, lambda changes: None)
    assert verdict.best is None and verdict.speedup == 1.0


def test_several_winners_are_combined_the_faster_overriding_the_slower():
    time, calls = _timer([{"a": 1.2, "b": 1.4}, {"combined": 1.6, "a": 1.2, "b": 1.4}, {"combined": 1.5}])
    asked = []

    def combine(changes):
        asked.append(changes)
        return changes, None, 0.0

    verdict = decide(_exact(a={"x": 1, "z": 1}, b={"x": 2}), time, combine)
    assert asked == [{"x": 2, "z": 1}]  # b (x1.4) overrides a's x; a's z stays
    assert calls[1] == ["a", "b", "combined"]
    assert verdict.best == "combined" and verdict.speedup == 1.5 and verdict.exact["combined"][0] == {"x": 2, "z": 1}


def test_an_inexact_combination_leaves_the_best_single_change():
    time, _ = _timer([{"a": 1.2, "b": 1.4}, {"b": 1.3}])
    verdict = decide(_exact(a={"x": 1}, b={"y": 1}), time, lambda changes: None)
    assert verdict.best == "b" and verdict.speedup == 1.3


def test_nothing_faster_by_the_margin_keeps_the_default():
    time, calls = _timer([{"a": MIN_SPEEDUP - 0.01}])
    assert decide(_exact(a={"x": 1}), time, lambda changes: None).best is None and len(calls) == 1
    assert decide({}, lambda candidates: {}, lambda changes: None).best is None


def test_relative_error_is_against_the_scale_and_refuses_other_shapes():
    want = np.array([4.0, -8.0], np.float32)
    assert relative_error(np.array([4.0, -7.0], np.float32), want, scale_of(want)) == 1.0 / 8.0
    assert scale_of(np.array([0.25], np.float32)) == 1.0  # never below 1
    assert relative_error(np.zeros(3, np.float32), want, 1.0) == float("inf")


def test_a_child_that_dies_says_what_it_was_doing_and_how_it_ended():
    script = ("import json, os, signal, sys\n"
              "request = json.loads(sys.stdin.read())\n"
              "print(json.dumps({'compiling': request['first']}), flush=True)\n"
              "os.kill(os.getpid(), signal.SIGILL)\n")
    outcome = run_child([sys.executable, "-c", script], {"first": "a"}, timeout=60)
    assert outcome.choice() is None and outcome.last("compiling") == "a"
    assert outcome.ending().startswith("SIGILL")


def test_a_child_that_finishes_gives_its_choice():
    script = ("from linnet.backends.measured import child_main\n"
              "class Pick:\n"
              "    def __init__(self, n): self.name, self.speedup = n, 1.5\n"
              "child_main(lambda request, say: say(compiling=request['n']) or Pick(request['n']))\n")
    outcome = run_child([sys.executable, "-c", script], {"n": "onednn"}, timeout=60)
    assert outcome.returncode == 0, outcome.stderr_tail
    assert outcome.choice() == {"name": "onednn", "speedup": 1.5} and outcome.messages[0] == {"compiling": "onednn"}


ZEN4 = "processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: 25\nmodel\t\t: 1\nmodel name\t: AMD EPYC\n\nprocessor\t: 1\n"
ZEN5 = ZEN4.replace("cpu family\t: 25", "cpu family\t: 26").replace("model\t\t: 1", "model\t\t: 2")


def test_the_machine_key_tells_cpu_generations_that_share_a_name():
    """A cloud CPU's model name ("AMD EPYC") is the same for Zen 4 and Zen 5, whose kernels'
    speeds differ; a decision cached on one must not be read on the other."""
    from linnet.backends.measured import cpu_model

    assert cpu_model(ZEN4) == "AMD EPYC (family 25, model 1)"
    assert cpu_model(ZEN5) == "AMD EPYC (family 26, model 2)"
    assert cpu_model("processor\t: 0\nmodel name\t: Apple M2\n") == "Apple M2"  # no family: the name
