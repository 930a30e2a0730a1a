"""`linnet check` as users run it: a subprocess, its exit code, stdout and stderr."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
BERT_SOURCE = REPO / "nest" / "bert-base-uncased" / "src" / "lib.linnet"

INPUTS = ("(tokens: Tensor[B, S; i32], token_types: Tensor[B, S; i32] = zeros, "
          "attention_mask: Tensor[B, S; i32] = ones)")
FORWARD = f"entry forward<B, S>{INPUTS} -> Tensor[B, S, 768; f32] where S <= 512"
POOL = f"entry pool<B, S>{INPUTS} -> Tensor[B, 768; f32] where S <= 512"


def linnet(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess:
    # The checkout on the path, so `-m linnet.cli` also works from another directory.
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-m", "linnet.cli", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=120, env=env)


def position_of(path: Path, needle: str, occurrence: int = 0, after: str = "") -> str:
    """`line:col` of the n-th occurrence (negative: from the end) of `needle` in a file, 1-based,
    counting only lines after the first one that holds `after`."""
    lines = path.read_text(encoding="utf-8").splitlines()
    start = next(i for i, line in enumerate(lines) if after in line) if after else 0
    found = [(number, line.index(needle) + 1) for number, line in
             enumerate(lines[start:], start=start + 1) if needle in line]
    line, col = found[occurrence]
    return f"{line}:{col}"


#: bert-base-uncased's root block, whose entries and `where` clauses `linnet check` reports.
BERT_ROOT = "pub block PreTraining<"


def clause_of(block: str, function: str) -> str:
    """Where `block`'s function `function` states its `S <= MaxPositions` clause (the next one after it)."""
    lines = BERT_SOURCE.read_text(encoding="utf-8").splitlines()
    start = next(i for i, line in enumerate(lines) if f"pub block {block}<" in line)
    header = next(i for i in range(start, len(lines)) if f" {function}<" in lines[i] and "pub " in lines[i])
    number = next(i for i in range(header, len(lines)) if "where S <= MaxPositions" in lines[i])
    return f"{number + 1}:{lines[number].index('where S') + 1 + len('where ')}"


def assert_no_traceback(result: subprocess.CompletedProcess) -> None:
    assert "Traceback" not in result.stderr + result.stdout
    assert "internal compiler error" not in result.stderr


def test_check_bert_succeeds_with_signatures_and_parameter_count():
    result = linnet("check", "nest/bert-base-uncased")
    assert result.returncode == 0, result.stderr
    assert FORWARD in result.stdout
    assert POOL in result.stdout
    assert "params: 110,106,428 in 206 tensors" in result.stdout
    assert ("at B=1, S=8: (tokens: Tensor[1, 8; i32], token_types: Tensor[1, 8; i32], "
            "attention_mask: Tensor[1, 8; i32]) -> Tensor[1, 8, 768; f32]") in result.stdout
    assert result.stderr == ""


def test_check_by_zoo_name_from_another_directory(tmp_path):
    result = linnet("check", "all-minilm-l6-v2", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "params: 22,713,216 in 103 tensors" in result.stdout


def test_sequence_too_long_names_the_precondition():
    result = linnet("check", "nest/bert-base-uncased", "--set", "S=600")
    assert result.returncode == 1
    assert_no_traceback(result)
    # A delegated entry (`pub use bert.{...}`, `pub use encoder.{...}`) is pointed at the clause of
    # the block that writes the function out: Encoder's for the encoder's entries, Model's for
    # `pool`/`embed`, PreTraining's own for its heads.
    for entry, block, written in (
            ("forward", "Encoder", "forward"), ("hidden_states", "Encoder", "hidden_states"),
            ("pool", "Model", "pool"), ("embed", "Model", "embed"),
            ("forward_positioned", "Encoder", "forward_positioned"),
            ("forward_embeds", "Encoder", "forward_embedded"),
            ("forward_head_masked", "Encoder", "forward_head_masked"), ("forward_full", "Encoder", "forward_full"),
            ("attentions", "Encoder", "attentions"),
            ("mlm", "PreTraining", "mlm"), ("nsp", "PreTraining", "nsp")):
        assert f"entry `{entry}` cannot run" in result.stderr
        assert f"lib.linnet:{clause_of(block, written)}" in result.stderr, entry
    assert "S <= MaxPositions" in result.stderr
    assert "600" in result.stderr and "512" in result.stderr
    assert "--set S=600" in result.stderr
    assert "14 errors" in result.stderr  # every entry declares it (11, and the 3 losses)
    assert result.stdout == ""


def test_heads_that_do_not_divide_d():
    result = linnet("check", "nest/bert-base-uncased", "--set", "Heads=10")
    assert result.returncode == 1
    assert_no_traceback(result)
    assert "D % Heads == 0" in result.stderr
    assert f"lib.linnet:{position_of(BERT_SOURCE, 'D % Heads == 0', after=BERT_ROOT)}" in result.stderr
    assert "D = 768, Heads = 10" in result.stderr
    # The manifest's own value is pointed at by line, not as "nest.toml:1:1".
    assert "nest.toml:1:1" not in result.stderr
    assert "nest.toml:" in result.stderr


@pytest.mark.parametrize("value", ["Heads=0", "D=-1", "T=i32", "Width=3", "S=x", "B=-2"])
def test_bad_values_are_errors_not_crashes(value):
    result = linnet("check", "nest/bert-base-uncased", "--set", value)
    assert result.returncode == 1, result.stderr
    assert_no_traceback(result)
    assert "error[E0" in result.stderr
    assert f"--set {value}" in result.stderr


@pytest.mark.parametrize("value", ["TypeVocab=100000000000000000000", "S=9223372036854775808"])
def test_a_dim_past_64_bits_is_refused_by_name(value):
    """Was (fuzz seed 11, cases 42943 and 69090): `TypeVocab = 10**20` with `D = 0` checked, and
    its [10**20, 0] table then failed inside numpy, which stores dims as int64."""
    result = linnet("check", "nest/bert-base-uncased", "--set", value)
    assert result.returncode == 1, result.stderr
    assert_no_traceback(result)
    assert "error[E0503]" in result.stderr and "is larger than a tensor dim can be" in result.stderr


def test_json_output_for_success():
    result = linnet("check", "nest/bert-base-uncased", "--format", "json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["ok"] is True and report["diagnostics"] == []
    assert report["param_count"] == 110_106_428 and report["param_tensors"] == 206
    assert report["entries"]["forward"]["preconditions"] == ["S <= 512"]
    assert report["entries"]["pool"]["signature"] == POOL.removeprefix("entry ")


def test_json_output_for_errors_has_spans():
    result = linnet("check", "nest/bert-base-uncased", "--set", "S=600", "--format", "json")
    assert result.returncode == 1
    report = json.loads(result.stdout)
    assert report["ok"] is False
    assert [d["code"] for d in report["diagnostics"]] == ["E0403"] * 14  # one per entry, the 3 losses too
    forward = next(d for d in report["diagnostics"] if d["message"].startswith("entry `forward` "))
    span = forward["span"]
    line, col = map(int, clause_of("Encoder", "forward").split(":"))  # delegated down to Encoder.forward
    assert span["file"].endswith("lib.linnet") and (span["line"], span["col"]) == (line, col)
    assert span["end_col"] - span["col"] == len("S <= MaxPositions")
    assert any(n["span"] and n["span"]["file"].endswith("nest.toml") for n in forward["notes"])


def test_json_output_for_several_paths_is_a_list():
    result = linnet("check", "std/nn/norm.linnet", "tests/golden/errors/unknown_name.linnet", "--format", "json")
    assert result.returncode == 1
    reports = json.loads(result.stdout)
    assert [r["ok"] for r in reports] == [True, False]
    assert reports[1]["diagnostics"][0]["code"] == "E0201"


@pytest.mark.parametrize("bad", ["S", "=3", "S=", "9x=1", "a b=1"])
def test_malformed_set_is_a_usage_error(bad):
    result = linnet("check", "nest/bert-base-uncased", "--set", bad)
    assert result.returncode == 2
    assert "--set expects NAME=VALUE" in result.stderr
    assert_no_traceback(result)


def test_no_command_or_unknown_format_is_a_usage_error():
    assert linnet().returncode == 2
    assert linnet("check", "nest/bert-base-uncased", "--format", "yaml").returncode == 2


@pytest.mark.parametrize("path, needle", [
    ("does/not/exist.linnet", "no such file: does/not/exist.linnet"),
    ("no-such-model", "no zoo entry named 'no-such-model'"),
    ("tests", "neither a package (no linnet.toml) nor a zoo entry (no nest.toml)"),
    ("pyproject.toml", "is not a Linnet source file"),
])
def test_missing_or_wrong_paths_are_clear_errors(path, needle):
    result = linnet("check", path)
    assert result.returncode == 1
    assert needle in result.stderr
    assert_no_traceback(result)


def test_check_single_files_and_std():
    std = sorted(str(p.relative_to(REPO)) for p in (REPO / "std").rglob("*.linnet"))
    result = linnet("check", *std)
    assert result.returncode == 0, result.stderr
    for path in std:
        assert f"{path}: ok (file," in result.stdout


def test_check_a_failing_file_renders_the_diagnostic():
    result = linnet("check", "tests/golden/errors/broadcast_mismatch.linnet")
    assert result.returncode == 1
    expected = (REPO / "tests/golden/errors/broadcast_mismatch.txt").read_text(encoding="utf-8").rstrip()
    assert result.stderr.startswith(expected)
    assert result.stderr.rstrip().endswith("broadcast_mismatch.linnet: 1 error")


def test_a_package_folder(tmp_path):
    (tmp_path / "src").mkdir()
    (tmp_path / "linnet.toml").write_text('[package]\nname = "pkg"\nversion = "0.1.0"\nlanguage = "0.1"\n')
    (tmp_path / "src" / "lib.linnet").write_text(
        "module pkg\nuse pkg.helpers::{twice}\n"
        "pub fn f<S: Dim>(x: Tensor[S; f32]) -> Tensor[S; f32] {\n    return twice(x)\n}\n")
    (tmp_path / "src" / "helpers.linnet").write_text(
        "module pkg.helpers\npub fn twice<S: Dim>(x: Tensor[S; f32]) -> Tensor[S; f32] {\n    return x + x\n}\n")
    result = linnet("check", str(tmp_path))
    assert result.returncode == 0, result.stderr
    assert "ok (package, 2 functions checked)" in result.stdout


def test_wall_time_of_checking_bert():
    """Measured, not asserted: the wall time of `linnet check nest/bert-base-uncased`."""
    started = time.perf_counter()
    result = linnet("check", "nest/bert-base-uncased")
    elapsed = time.perf_counter() - started
    assert result.returncode == 0
    reported = next(line for line in result.stdout.splitlines() if "checked in" in line).strip()
    print(f"\nlinnet check nest/bert-base-uncased: {elapsed:.2f} s wall (process), {reported}")


def test_set_on_a_file_is_an_error_not_ignored():
    result = linnet("check", "std/nn/norm.linnet", "--set", "S=3")
    assert result.returncode == 1
    assert "error[E0506]: --set S=3: values can only be set for a zoo entry" in result.stderr
