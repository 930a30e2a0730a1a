"""Compiler fuzzing: mutated Linnet programs must compile or fail with well-formed diagnostics.

The corpus is every Linnet source Linnet ships or tests with: the BERT package of the zoo,
the standard library (`std/nn/*.linnet`) and the golden programs (`tests/golden/errors/*` as
single files, `tests/golden/packages/*` as zoo entries). A case takes one of them and

* mutates tokens: deletes, duplicates, swaps or replaces them, inserts keywords, punctuation
  or arbitrary text;
* mutates the tree: replaces integer and float literals with edge values, dtypes with other
  dtypes, dims with other dims or dim expressions, adds, drops or re-kinds generics;
* mutates a zoo entry's `nest.toml` values ([generics], [check]);
* or replaces the whole file by random text or bytes.

It then runs what `linnet check` and `nest.load` run: parse, resolve, check and, for zoo
entries, instantiate, the `[check]` dims, lower, the PyTorch and JAX source emitters (their
output must be valid Python) and, for programs with under a million parameters, the ONNX
graph with zero tensors of the parameter shapes, through `onnx.checker`.

The only acceptable outcomes are success and a `LinnetError` whose every diagnostic has a
span inside the text of its file (1-based line and column) and renders. Anything else --
another exception, an `InternalError`, a case running over 2 s, a worker that dies -- is a
failure, saved with its reproducing sources under `--out`. (The 2 s are CPU time, so a busy
machine does not make slow cases look hung; a worker silent for a minute is killed.)

    python -m linnet.testing.fuzz --cases 100000 --seed 1 --jobs 2 --out fuzz-failures
    python -m linnet.testing.fuzz --seed 1 --case 4711       # replay one case, with its traceback

Cases are deterministic: case `i` of seed `s` is drawn from `random.Random(f"{s}:{i}")`.
`tests/test_fuzz.py` runs a few hundred cases through hypothesis (`case_from_random`).

Why one long module: a generator per kind of hostile input (tokens, syntax, types, files),
sharing one case format and one replay command.
"""
from __future__ import annotations

import argparse
import functools
import gc
import json
import multiprocessing as mp
import random
import re
import resource
import shutil
import signal
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

from ..diagnostics import InternalError, LinnetError, Span
from ..paths import std_dir, zoo_dir

#: CPU seconds one case may run before it counts as a hang, plus some per block instance once
CASE_TIMEOUT_S, EMIT_S_PER_INSTANCE = 2.0, 0.01  # lowered (emission is linear in them, ~4 ms each)
#: Programs with more parameter elements than this skip the ONNX graph (zero tensors cost memory).
ONNX_MAX_PARAMS = 1_000_000
#: Address-space limit of a fuzz worker process, so a runaway allocation is a MemoryError.
WORKER_MEMORY_BYTES = 4 << 30

_REPO_ROOT = Path(__file__).resolve().parent.parent.parent
GOLDEN_DIR = _REPO_ROOT / "tests" / "golden"
BERT_ENTRY = "bert-base-uncased"

# The BERT entry at a small size, so that successful cases reach every emitter quickly.
SMALL_GENERICS = {"Vocab": 50, "MaxPositions": 16, "TypeVocab": 2, "D": 16, "Heads": 2, "Inner": 32,
                  "Layers": 2, "T": '"f32"'}

# Whitespace and comments stay attached to the token before them, so a mutation moves code.
TOKEN = re.compile(r"//[^\n]*|[A-Za-z_][A-Za-z0-9_]*|[0-9]+(?:\.[0-9]*)?(?:[eE][+-]?[0-9]+)?|::|->|<=|>=|==|!="
                   r"|\S")
IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
INT = re.compile(r"[0-9]+")
FLOAT = re.compile(r"[0-9]+(?:\.[0-9]*)?(?:[eE][+-]?[0-9]+)?")

DTYPES = ["f64", "f32", "f16", "bf16", "i64", "i32", "i16", "i8", "u8", "bool", "f8", "T", "Float", "Int"]
KINDS = ["Dim", "Float", "Int", "Shape", "Dtype", "Type", "Real", "Activation"]
# Member names go where dims and dtypes do (`Feed<D, silu>`), and near misses (`gelu`).
MEMBERS = ["gelu_erf", "gelu_tanh", "relu", "silu", "gelu", "Activation"]
KEYWORDS = ["fn", "entry", "block", "sub", "param", "let", "var", "return", "static", "for", "in", "if", "else",
            "some", "none", "where", "use", "module", "pub", "const", "broadcasts", "to", "zeros", "ones",
            "Tensor", "Option", "cast", "reshape", "permute", "take", "matmul", "softmax", "sum", "mean",
            "collect", "then"]
# Names that must never reach generated code unchanged (Python keywords, builtins, imports).
HOSTILE_NAMES = ["class", "lambda", "print", "torch", "F", "nn", "jnp", "jax", "params", "self", "np", "import",
                 "def", "None", "True", "__import__", "exec", "eval", "os", "sys", "_dims", "_linnet", "lax",
                 "math", "Tensor", "float", "int", "match", "case", "type", "super", "object", "__init__"]
SNIPPETS = ["fn ", "entry ", "block ", "sub ", "param ", "let ", "var ", "return ", "static for ", "if let ",
            "some(", "none", "where ", "<", ">", "(", ")", "{", "}", "[", "]", ",", ";", ":", "*", "/", "%",
            "-", "+", "=", "== ", "Tensor[", "Option[", "0", "-1", "1.5", "1e-3", "$", "use ", "module ", "pub ",
            "const ", "::", ".", "f32 ", "i32 ", "Dim", "Float", "Shape", "*S", "\n", "// c\n", "\t", "\u00e9",
            "broadcasts to ", " then ", "= zeros", "= ones", "= positions(attention_mask)", "= tokens", "..", "[:, 0]", "[0:1]", "[-1]", "cast<f32>(", "\r\n", "\r",
            "let (a, b) = ", "return (x, x)", "-> (Tensor[; f32], Tensor[; f32]) ", "-> (a: Tensor[; f32], b: Tensor[; f32]) ",
            "\x00", "\ufeff", "//", "/*", "\"", "'", "\\", "#", "`"]
INTERESTING_INTS = ["0", "1", "2", "3", "7", "16", "-1", "255", "4096", "2147483647", "2147483648",
                    "9223372036854775807", "9223372036854775808", "100000000000000000000000000000",
                    "0000", "01", "1" * 400]
INTERESTING_FLOATS = ["0.0", "1.0", "-0.0", "1e308", "1e309", "1e-320", "2.5", "1e-12", "0.5e", "1.",
                      "3.4028235e38", "65504.0", "1" * 400 + ".0"]
DIM_EXPRS = ["0", "1", "2", "D", "S", "B", "Heads", "D / Heads", "D * 2", "D - D", "D / 0", "D % 0", "D % Heads",
             "D + 1", "-D", "D * D * D * D", "Inner", "Vocab", "MaxPositions", "*S", "N", "X", "D / (D - D)",
             "(D)", "1 - 2", "D*0", "99999999999999999999"]
TOML_VALUES = ["0", "1", "2", "3", "7", "-1", "-8", "1024", "100000", "1000000000", "100000000000000000000",
               "2.5", "true", '"f16"', '"bf16"', '"f64"', '"i32"', '"bool"', '"x"', '""', "[1]", "{}"]


@functools.lru_cache(maxsize=256)
def _tokens(text: str) -> tuple[str, tuple[str, ...]]:
    """The text as a prefix and tokens, each with the whitespace and comments after it (worked
    out once per corpus file: it was a tenth of a case's time)."""
    matches = list(TOKEN.finditer(text))
    if not matches:
        return text, ()
    starts = [m.start() for m in matches[1:]] + [len(text)]
    return text[:matches[0].start()], tuple(m.group(0) + text[m.end():nxt] for m, nxt in zip(matches, starts))


@functools.lru_cache(maxsize=256)
def _names(text: str) -> tuple[str, ...]:
    """The identifiers of a text, sorted: what a "rename" draws from."""
    return tuple(sorted({_core(t) for t in _tokens(text)[1] if IDENT.fullmatch(_core(t))})) or ("x",)


def _core(token: str) -> str:
    return token.rstrip()


def _with_core(token: str, core: str) -> str:
    return core + token[len(token.rstrip()):]


# --------------------------------------------------------------------------- the corpus


@dataclass(frozen=True)
class Target:
    """One mutable source of the corpus: `file` relative to the workspace, and how it is run."""

    label: str
    file: str           # path of the mutated file inside the workspace
    kind: str           # "entry" (a zoo entry), "std" (a std module, run with the BERT entry), "file"
    run: str            # what to compile: a workspace-relative entry folder or .linnet file


def corpus() -> list[Target]:
    targets = [Target("bert", f"zoo/{BERT_ENTRY}/src/lib.linnet", "entry", f"zoo/{BERT_ENTRY}")]
    for path in sorted(std_dir().rglob("*.linnet")):
        rel = path.relative_to(std_dir()).as_posix()
        targets.append(Target(f"std/{rel}", f"std/{rel}", "std", f"zoo/{BERT_ENTRY}"))
    if GOLDEN_DIR.is_dir():
        for path in sorted((GOLDEN_DIR / "errors").glob("*.linnet")):
            targets.append(Target(f"golden/{path.name}", f"golden/errors/{path.name}", "file",
                                  f"golden/errors/{path.name}"))
        for path in sorted((GOLDEN_DIR / "packages").glob("*/src/lib.linnet")):
            name = path.parent.parent.name
            targets.append(Target(f"golden/{name}", f"golden/packages/{name}/src/lib.linnet", "entry",
                                  f"golden/packages/{name}"))
    return targets


class Workspace:
    """A private copy of std/, the BERT entry (at a small size, without [weights]) and the
    golden programs, which cases overwrite and restore. The resolver is pointed at its std/."""

    def __init__(self, root: Path | None = None):
        self.root = Path(root or tempfile.mkdtemp(prefix="linnet-fuzz-"))
        shutil.copytree(std_dir(), self.root / "std", dirs_exist_ok=True)
        entry = self.root / "zoo" / BERT_ENTRY
        shutil.copytree(zoo_dir() / BERT_ENTRY, entry, dirs_exist_ok=True)
        (entry / "nest.toml").write_text(small_manifest((zoo_dir() / BERT_ENTRY / "nest.toml").read_text("utf-8")),
                                         encoding="utf-8")
        if GOLDEN_DIR.is_dir():
            shutil.copytree(GOLDEN_DIR, self.root / "golden", dirs_exist_ok=True)
        self.pristine: dict[str, bytes] = {}
        for path in self.root.rglob("*"):
            if path.is_file():
                self.pristine[path.relative_to(self.root).as_posix()] = path.read_bytes()
        import linnet.front.resolve as resolve

        self._std = self.root / "std"
        self._saved = (resolve.std_dir, resolve.parse_file)
        resolve.std_dir = lambda: self._std  # the resolver imported it by name
        resolve.parse_file = _cached_parse_file(self.pristine, self.root)

    def text(self, rel: str) -> str:
        return self.pristine[rel].decode("utf-8")

    def write(self, files: dict[str, bytes]) -> None:
        for rel, data in files.items():
            (self.root / rel).write_bytes(data)

    def restore(self, files) -> None:
        for rel in files:
            (self.root / rel).write_bytes(self.pristine[rel])

    def close(self) -> None:
        import linnet.front.resolve as resolve

        resolve.std_dir, resolve.parse_file = self._saved
        shutil.rmtree(self.root, ignore_errors=True)


def _cached_parse_file(pristine: dict[str, bytes], root: Path):
    """`parse_file` that reuses the tree of an unmutated file (parsing is half of a case's
    time). Mutated text is always parsed.

    The front end edits some trees in place: the resolver inserts delegated entries and
    computed defaults, template expansion splices generics into block aliases. What it puts
    there can come from another file, one a later case mutates, so a tree with anything to
    expand (`_edited_in_place`) is handed out as a fresh copy each time (unpickling is ~15x
    faster than parsing); the others are shared. tests/test_fuzz.py checks that every reused
    tree still equals a fresh parse after a run of cases."""
    import pickle

    from ..front.parser import parse_file

    trees: dict[tuple[str, str], object] = {}  # a shared tree, or the pickle of one edited in place

    def parse(path: Path, sources=None, display_name: str | None = None):
        try:
            rel = Path(path).resolve().relative_to(root.resolve()).as_posix()
            data = Path(path).read_bytes()
        except (ValueError, OSError):
            return parse_file(path, sources, display_name)
        if pristine.get(rel) != data:
            return parse_file(path, sources, display_name)
        key = (rel, display_name or str(path))
        if key not in trees:
            tree = parse_file(path, sources, display_name)
            trees[key] = pickle.dumps(tree) if _edited_in_place(tree) else tree
            return tree  # fresh either way; only the kept pickle must stay as parsed
        if sources is not None:
            sources.add(display_name or str(path), data.decode("utf-8-sig"))
        kept = trees[key]
        return pickle.loads(kept) if isinstance(kept, bytes) else kept

    parse.trees = trees  # for tests: the trees kept for reuse
    return parse


def _edited_in_place(tree) -> bool:
    """Whether the front end would change `tree` while resolving it: block aliases, delegations
    (`pub use`), computed defaults and generic splices (refused and dropped outside an alias)."""
    import dataclasses

    from ..front import ast

    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.BlockAlias, ast.Delegate, ast.GenericSplice, ast.SpliceArg)):
            return True
        if isinstance(node, ast.Param) and node.default_expr is not None:
            return True
        if isinstance(node, list):
            stack.extend(node)
        elif dataclasses.is_dataclass(node) and not isinstance(node, Span):
            stack.extend(getattr(node, f.name) for f in dataclasses.fields(node))
    return False


def small_manifest(text: str) -> str:
    """The BERT nest.toml with small generics and no [weights]: emission needs no checkpoint
    (and no [tokenizer], whose files come from the [weights] repo)."""
    text = re.sub(r"\n\[(weights|tokenizer)\].*?(?=\n\[|\Z)", "\n", text, flags=re.S)
    for name, value in SMALL_GENERICS.items():
        text = re.sub(rf"(?m)^{name}\s*=.*$", f"{name} = {value}", text)
    return text


# --------------------------------------------------------------------------- mutations


@dataclass
class Case:
    """One fuzz case: the files to write into the workspace and the target to compile."""

    index: int
    target: Target
    files: dict[str, bytes]
    ops: list[str] = field(default_factory=list)


def _mutate_tokens(rng: random.Random, text: str, names: tuple[str, ...], ops: list[str]) -> str:
    prefix, tokens = _tokens(text)
    tokens = list(tokens)
    if not tokens:
        return text + rng.choice(SNIPPETS)
    for _ in range(rng.choice([1, 1, 1, 1, 1, 2, 2, 3, 4, 6])):
        if not tokens:
            break
        i = rng.randrange(len(tokens))
        op = rng.choice(["delete", "duplicate", "swap", "swap-adjacent", "insert", "rename", "hostile-name",
                         "text", "int", "float", "dtype", "dim", "kind", "generic-add", "generic-drop",
                         "keyword", "delete-run", "duplicate-run"])
        core = _core(tokens[i])
        if op == "delete":
            del tokens[i]
        elif op == "delete-run":
            del tokens[i:i + rng.randint(2, 40)]
        elif op == "duplicate":
            tokens.insert(i, tokens[i])
        elif op == "duplicate-run":
            tokens[i:i] = tokens[i:i + rng.randint(2, 40)]
        elif op == "swap":
            j = rng.randrange(len(tokens))
            tokens[i], tokens[j] = tokens[j], tokens[i]
        elif op == "swap-adjacent" and i + 1 < len(tokens):
            tokens[i], tokens[i + 1] = tokens[i + 1], tokens[i]
        elif op == "insert":
            tokens.insert(i, rng.choice(SNIPPETS))
        elif op == "keyword":
            tokens.insert(i, rng.choice(KEYWORDS) + " ")
        elif op == "text":
            tokens.insert(i, _random_text(rng, rng.randint(1, 12)))
        elif op in ("rename", "hostile-name"):
            if IDENT.fullmatch(core):
                new = rng.choice(names if op == "rename" else HOSTILE_NAMES)
                # Rename every occurrence half of the time, so the program may stay valid.
                if rng.random() < 0.5:
                    tokens = [_with_core(t, new) if _core(t) == core else t for t in tokens]
                else:
                    tokens[i] = _with_core(tokens[i], new)
        elif op == "int":
            picks = [k for k, t in enumerate(tokens) if INT.fullmatch(_core(t))]
            if picks:
                k = rng.choice(picks)
                tokens[k] = _with_core(tokens[k], rng.choice(INTERESTING_INTS))
        elif op == "float":
            picks = [k for k, t in enumerate(tokens) if FLOAT.fullmatch(_core(t)) and not INT.fullmatch(_core(t))]
            if picks:
                k = rng.choice(picks)
                tokens[k] = _with_core(tokens[k], rng.choice(INTERESTING_FLOATS + INTERESTING_INTS[:4]))
        elif op == "dtype":
            picks = [k for k, t in enumerate(tokens) if _core(t) in DTYPES or _core(t) in MEMBERS]
            if picks:
                k = rng.choice(picks)
                tokens[k] = _with_core(tokens[k], rng.choice(DTYPES + MEMBERS))
        elif op == "dim":
            # A dim inside a type (`Tensor[B, S, D; T]`) or a generic argument (`Linear<D, Inner>`).
            picks = [k for k, t in enumerate(tokens) if IDENT.fullmatch(_core(t)) and _core(t)[0].isupper()
                     and k > 0 and _core(tokens[k - 1]) in ("[", ",", "<", "*")]
            if picks:
                k = rng.choice(picks)
                tokens[k] = _with_core(tokens[k], rng.choice(DIM_EXPRS))
        elif op == "kind":
            picks = [k for k, t in enumerate(tokens) if _core(t) in KINDS]
            if picks:
                k = rng.choice(picks)
                tokens[k] = _with_core(tokens[k], rng.choice(KINDS))
        elif op == "generic-add":
            picks = [k for k, t in enumerate(tokens) if _core(t) == "<"]
            if picks:
                k = rng.choice(picks)
                tokens.insert(k + 1, rng.choice(["X: Dim, ", "T: Float, ", "S: Shape, ", "Q: Dim = 4, ", "D, ",
                                                 "7, ", "f32, ", "N: Dim where N > 0, "]))
        elif op == "generic-drop":
            picks = [k for k, t in enumerate(tokens) if _core(t) == "," and k + 1 < len(tokens)]
            if picks:
                k = rng.choice(picks)
                del tokens[k:k + 2]
        ops.append(op)
    return prefix + "".join(tokens)


def _random_text(rng: random.Random, n: int) -> str:
    alphabet = rng.choice([
        "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_",
        "()[]{}<>,;:=+-*/%.!&|^~?@#$\"'\\` \n\t",
        "abcXYZ019 ()[]{}<>,;:=+-*/.\n",
        "\u00e9\u4e2d\u0000\u200b\ufeff\u2028\u202e\U0001f600\r\x0b\x0c",
    ])
    return "".join(rng.choice(alphabet) for _ in range(n))


def _mutate_manifest(rng: random.Random, text: str, ops: list[str]) -> str:
    lines = text.split("\n")
    table, keys = "", []
    for k, line in enumerate(lines):
        header = re.match(r"\[(\w+)\]", line)
        if header:
            table = header.group(1)
        elif table in ("generics", "check") and re.match(r"\w+\s*=", line):
            keys.append(k)
    if not keys:
        return text
    for _ in range(rng.randint(1, 3)):
        k = rng.choice(keys)
        name = lines[k].split("=")[0].strip()
        op = rng.choice(["value", "value", "value", "drop", "rename"])
        if op == "value":
            lines[k] = f"{name} = {rng.choice(TOML_VALUES)}"
        elif op == "drop":
            lines[k] = ""
        elif "=" in lines[k]:
            lines[k] = f"{rng.choice(['X', 'd', 'Heads2', 'S', 'B', 'T'])} = {lines[k].split('=', 1)[1].strip()}"
        ops.append(f"toml-{op}")
    return "\n".join(lines)


def case_from_random(rng: random.Random, targets: list[Target], workspace: Workspace, index: int = 0) -> Case:
    """Draw one case: a target, and what to write over its sources."""
    # The BERT package and std reach every stage; the golden programs are many but small.
    group = rng.choices(["bert", "std", "golden"], weights=[45, 25, 30])[0]
    pool = [t for t in targets if t.label.startswith(group)] or targets
    target = rng.choice(pool)
    text = workspace.text(target.file)
    ops: list[str] = []
    files: dict[str, bytes] = {}
    names = _names(text)
    roll = rng.random()
    if roll < 0.04:
        ops.append("random-text")
        files[target.file] = _random_text(rng, rng.randint(0, 200)).encode("utf-8", "surrogatepass")
    elif roll < 0.06:
        ops.append("random-bytes")
        files[target.file] = bytes(rng.randrange(256) for _ in range(rng.randint(0, 64)))
    else:
        mutated = _mutate_tokens(rng, text, names, ops) if roll < 0.90 or target.kind != "entry" else text
        files[target.file] = mutated.encode("utf-8", "surrogatepass")
    if target.kind == "entry" and (roll >= 0.90 or rng.random() < 0.05):
        manifest = f"{target.run}/nest.toml"
        files[manifest] = _mutate_manifest(rng, workspace.text(manifest), ops).encode("utf-8")
    return Case(index, target, files, ops)


def make_case(seed: int, index: int, targets: list[Target], workspace: Workspace) -> Case:
    return case_from_random(random.Random(f"{seed}:{index}"), targets, workspace, index)


# --------------------------------------------------------------------------- running


class Hang(BaseException):
    """A case ran over CASE_TIMEOUT_S (a BaseException, so no `except Exception` swallows it)."""


@dataclass
class Outcome:
    status: str               # "ok", "error" (a well-formed LinnetError), "bad-span", "crash", "hang"
    detail: str = ""
    stage: str = ""
    codes: tuple[str, ...] = ()


def _alarm(signum, frame):
    raise Hang()


def _file_text(file: str, err: LinnetError, root: Path) -> str | None:
    texts = getattr(err.sources, "_texts", {}) if err.sources is not None else {}
    if file in texts:
        return texts[file]
    for candidate in (Path(file), root / file):
        try:
            return candidate.read_bytes().decode("utf-8-sig", errors="replace")
        except OSError:
            continue
    return None


def span_problems(err: LinnetError, root: Path) -> list[str]:
    """What is wrong with the spans of an error's diagnostics (nothing, for a good error)."""
    problems = []
    if not err.diagnostics:
        return ["a LinnetError without diagnostics"]
    for d in err.diagnostics:
        spans = [("span", d.span)] + [(f"note {n.message[:40]!r}", n.span) for n in d.notes if n.span is not None]
        if d.span is None:
            problems.append(f"{d.code} has no span: {d.message[:200]}")
            spans = spans[1:]
        if not re.fullmatch(r"E\d{4}", d.code):
            problems.append(f"bad code {d.code!r}")
        for what, span in spans:
            if not span.file:
                problems.append(f"{d.code} {what}: no file")
                continue
            text = _file_text(span.file, err, root)
            if text is None:
                problems.append(f"{d.code} {what}: file {span.file!r} cannot be read")
                continue
            lines = text.split("\n")  # the compiler's lines: lark counts "\n" only
            if not (1 <= span.line <= len(lines)):
                problems.append(f"{d.code} {what}: line {span.line} outside 1..{len(lines)} of {span.file}")
                continue
            line = lines[span.line - 1]
            if not (1 <= span.col <= len(line) + 1):
                problems.append(f"{d.code} {what}: column {span.col} outside 1..{len(line) + 1} of "
                                f"{span.file}:{span.line}")
            if (span.end_line, span.end_col) < (span.line, span.col):
                problems.append(f"{d.code} {what}: ends before it starts ({span})")
    try:
        err.render()
        json.dumps([d.to_json() for d in err.diagnostics])
    except Exception as exc:  # noqa: BLE001 - any failure to render is the finding
        problems.append(f"rendering fails: {type(exc).__name__}: {exc}")
    return problems


def compile_case(case: Case, workspace: Workspace, stage: list[str]) -> None:
    """Everything a case runs; raises whatever the compiler raises."""
    from ..compiler import compile_target
    from ..cli.targets import locate

    root = workspace.root
    stage[0] = "check"
    if case.target.kind == "std":
        from ..check import check
        from ..front.resolve import load_std

        check(load_std())
    compiled = compile_target(locate(root / case.target.run))
    if compiled.instance is None:
        return
    emit_all(compiled, stage)


def emit_all(compiled, stage: list[str]) -> None:
    """Lower an instantiated program and run every emitter that needs no weights."""
    from ..backends import jax_source as jax_backend
    from ..backends import torch_source as pytorch
    from ..middle.lower import lower

    stage[0] = "lower"
    program = lower(compiled.instance)
    _extend_budget(EMIT_S_PER_INSTANCE * len(program.instances()))
    for name, emit in (("torch", pytorch.emit), ("jax", jax_backend.emit)):
        for fused in (True, False):
            stage[0] = f"emit-{name}{'' if fused else '-unfused'}"
            source = emit(program, fused=fused)
            stage[0] = f"compile-{name}"
            compile(source, f"<generated {name}>", "exec")
    params = compiled.instance.params
    total = 0
    for p in params:
        size = 1
        for d in p.shape:
            size *= d
        total += size
    if total <= ONNX_MAX_PARAMS and _have("onnx"):
        import numpy as np
        import onnx

        from .. import dtypes
        from ..backends import onnx_graph as onnx_backend

        stage[0] = "emit-onnx"
        if any(not dtypes.by_name(p.dtype).in_numpy for p in params):
            return  # numpy has no bf16; the backend converts through ml_dtypes at load time
        tensors = {p.name: np.zeros(p.shape, dtype=dtypes.by_name(p.dtype).numpy_type()) for p in params}
        outputs = {e: f"{e}_out" for e in program.entries}
        for model_file in onnx_backend.emit(program, tensors, name="fuzz", outputs=outputs,
                                            generics=compiled.generics):
            stage[0] = "onnx-checker"
            onnx.checker.check_model(model_file.model)


def _extend_budget(seconds: float) -> None:  # more CPU time for the running case, if timed
    remaining, _ = signal.getitimer(signal.ITIMER_PROF)
    if remaining > 0:
        signal.setitimer(signal.ITIMER_PROF, remaining + seconds)


def _have(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


def run_case(case: Case, workspace: Workspace, timeout: float = CASE_TIMEOUT_S) -> Outcome:
    stage = ["write"]
    workspace.write(case.files)
    # CPU time (ITIMER_PROF), so a busy machine does not turn slow cases into "hangs"; the
    # parent's wall-clock watchdog catches a worker stuck where no signal is handled.
    previous = signal.signal(signal.SIGPROF, _alarm) if timeout else None
    try:
        if timeout:
            signal.setitimer(signal.ITIMER_PROF, timeout)
        try:
            compile_case(case, workspace, stage)
        finally:
            if timeout:
                signal.setitimer(signal.ITIMER_PROF, 0)
    except Hang:
        return Outcome("hang", f"over {timeout} s", stage[0])
    except LinnetError as err:
        problems = span_problems(err, workspace.root)
        codes = tuple(d.code for d in err.diagnostics)
        if problems:
            return Outcome("bad-span", "\n".join(problems) + "\n\n" + _safe_render(err), stage[0], codes)
        return Outcome("error", "", stage[0], codes)
    except RecursionError:
        return Outcome("crash", traceback.format_exc(limit=-30), stage[0])
    except (Exception, InternalError):  # noqa: BLE001 - every other exception is a finding
        return Outcome("crash", traceback.format_exc(limit=-30), stage[0])
    finally:
        if previous is not None:
            signal.signal(signal.SIGPROF, previous)
        workspace.restore(case.files)
    return Outcome("ok", "", stage[0])


def _safe_render(err: LinnetError) -> str:
    try:
        return err.render()
    except Exception as exc:  # noqa: BLE001
        return f"(cannot render: {exc!r}) " + "; ".join(f"{d.code}: {d.message}" for d in err.diagnostics)


def failure_signature(outcome: Outcome) -> str:
    """What distinguishes one bug from another: the exception type and the innermost frame."""
    if outcome.status == "crash":
        lines = [l for l in outcome.detail.strip().splitlines() if l.strip()]
        frames = [l.strip() for l in lines if l.strip().startswith("File ")]
        return f"crash {lines[-1][:120] if lines else ''} @ {frames[-1] if frames else ''}"
    if outcome.status == "bad-span":
        first = outcome.detail.splitlines()[0] if outcome.detail else ""
        return "bad-span " + re.sub(r"\d+", "N", first)[:160]
    return f"{outcome.status} at {outcome.stage}"


def save_failure(out: Path, seed: int, case: Case, outcome: Outcome) -> Path:
    folder = out / f"seed{seed}-case{case.index}"
    folder.mkdir(parents=True, exist_ok=True)
    for rel, data in case.files.items():
        dest = folder / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_bytes(data)
    (folder / "README.txt").write_text(
        f"status: {outcome.status} (stage {outcome.stage})\ntarget: {case.target.label} -> {case.target.run}\n"
        f"mutations: {', '.join(case.ops)}\nreplay: python -m linnet.testing.fuzz --seed {seed} --case {case.index}\n"
        f"The files here replace the same paths of the fuzz workspace (std/, zoo/{BERT_ENTRY}/ at a small size, "
        f"golden/).\n\n{outcome.detail}\n", encoding="utf-8")
    return folder


# --------------------------------------------------------------------------- the dedicated run


def _worker(worker: int, jobs: int, seed: int, start: int, cases: int, queue, current) -> None:
    try:
        resource.setrlimit(resource.RLIMIT_AS, (WORKER_MEMORY_BYTES, WORKER_MEMORY_BYTES))
    except (ValueError, OSError):
        pass
    workspace = Workspace()
    targets = corpus()
    # Imports (onnx, the backends) and the parse cache are warmed first, outside any timeout.
    run_case(Case(-1, targets[0], {}), workspace, timeout=0)
    _quiet_collector()
    try:
        for index in range(start + worker, start + cases, jobs):
            current.value = index
            try:
                case = make_case(seed, index, targets, workspace)
            except Exception:  # noqa: BLE001 - a bug of the fuzzer, reported like a finding
                case = Case(index, targets[0], {}, ["(case generation failed)"])
                outcome = Outcome("crash", "fuzzer: " + traceback.format_exc(), "generate")
            else:
                outcome = run_case(case, workspace)
            if outcome.status in ("ok", "error"):
                queue.put((index, outcome.status, case.target.label, None))
            else:
                queue.put((index, outcome.status, case.target.label,
                           (outcome, {k: v for k, v in case.files.items()}, case.ops)))
    finally:
        workspace.close()
        queue.put(("done", worker))


def _quiet_collector() -> None:
    """Keep what the warm-up made (onnx, numpy, the parsed corpus) out of the garbage
    collector's passes, and run them less often: each program is a cycle (a module's scope
    names the module), so with the default thresholds full passes over every live object were
    a third of a case's CPU time. Costs some 30 MB more at peak."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(50_000, 20, 100)


def fuzz(cases: int, seed: int = 0, jobs: int = 1, out: Path = Path("fuzz-failures"), start: int = 0,
         progress: bool = True) -> dict:
    """Run `cases` cases over `jobs` worker processes; failures are saved under `out`."""
    ctx = mp.get_context("fork")
    queue = ctx.Queue()
    workers, currents = [], []
    # Workers are restarted after a crash of the process itself (a segfault, the memory limit).
    targets_for_save = corpus()
    by_label = {t.label: t for t in targets_for_save}
    for w in range(jobs):
        current = ctx.Value("q", -1)
        proc = ctx.Process(target=_worker, args=(w, jobs, seed, start, cases, queue, current), daemon=True)
        proc.start()
        workers.append(proc)
        currents.append(current)
    counts = {"ok": 0, "error": 0, "bad-span": 0, "crash": 0, "hang": 0, "worker-died": 0}
    by_target: dict[str, int] = {}
    signatures: dict[str, list[int]] = {}
    done, started, last_report = 0, time.perf_counter(), time.perf_counter()
    finished_workers = set()
    last_seen = [time.perf_counter()] * jobs
    while len(finished_workers) < jobs:
        try:
            message = queue.get(timeout=1.0)
        except Exception:  # noqa: BLE001 - queue.Empty
            message = None
        now = time.perf_counter()
        if message is not None and message[0] == "done":
            finished_workers.add(message[1])
            continue
        if message is not None:
            index, status, label, failure = message
            last_seen[(index - start) % jobs] = now
            counts[status] += 1
            by_target[label] = by_target.get(label, 0) + 1
            done += 1
            if failure is not None:
                outcome, files, ops = failure
                case = Case(index, by_label[label], files, ops)
                folder = save_failure(out, seed, case, outcome)
                sig = failure_signature(outcome)
                signatures.setdefault(sig, []).append(index)
                if len(signatures[sig]) == 1:
                    print(f"\nNEW FAILURE {sig}\n  saved in {folder}", file=sys.stderr, flush=True)
        for w, proc in enumerate(workers):
            # A worker that died, or is stuck past its own alarm (in C code), loses its case.
            stuck = now - last_seen[w] > 10 * CASE_TIMEOUT_S + 30
            died = not proc.is_alive() and proc.exitcode != 0  # 0: its "done" is still queued
            if w not in finished_workers and (died or stuck):
                if proc.is_alive():
                    proc.kill()
                proc.join()
                index = currents[w].value
                counts["worker-died"] += 1
                signatures.setdefault(f"worker died (exit {proc.exitcode})", []).append(index)
                print(f"\nWORKER {w} DIED at case {index} (exit {proc.exitcode})", file=sys.stderr, flush=True)
                done += 1
                remaining_start = index + jobs
                if remaining_start < start + cases:
                    current = ctx.Value("q", -1)
                    # Keep worker w's stride: cases remaining_start, remaining_start + jobs, ...
                    proc = ctx.Process(target=_worker, args=(0, jobs, seed, remaining_start,
                                                             start + cases - remaining_start, queue, current),
                                       daemon=True)
                    proc.start()
                    workers[w], currents[w] = proc, current
                    last_seen[w] = now
                else:
                    finished_workers.add(w)
        if progress and now - last_report > 30:
            last_report = now
            rate = done / (now - started)
            print(f"{done}/{cases} cases, {rate:.1f}/s, {counts}", file=sys.stderr, flush=True)
    elapsed = time.perf_counter() - started
    return {"seed": seed, "cases": done, "seconds": round(elapsed, 1), "rate": round(done / elapsed, 1),
            "counts": counts, "by_target": by_target,
            "failures": {sig: {"count": len(ix), "first_cases": ix[:5]} for sig, ix in signatures.items()}}


def replay(seed: int, index: int) -> Outcome:
    workspace = Workspace()
    try:
        targets = corpus()
        run_case(Case(-1, targets[0], {}), workspace, timeout=0)  # warm up, as the workers do
        case = make_case(seed, index, targets, workspace)
        print(f"case {index}: {case.target.label}, mutations {', '.join(case.ops)}")
        for rel, data in case.files.items():
            print(f"--- {rel} ---\n{data.decode('utf-8', 'replace')}")
        return run_case(case, workspace)
    finally:
        workspace.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m linnet.testing.fuzz", description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", type=int, default=10_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--start", type=int, default=0, help="index of the first case")
    parser.add_argument("--jobs", type=int, default=1)
    parser.add_argument("--out", type=Path, default=Path("fuzz-failures"))
    parser.add_argument("--case", type=int, help="replay this one case and show its outcome")
    parser.add_argument("--json", type=Path, help="also write the summary here")
    args = parser.parse_args(argv)
    if args.case is not None:
        outcome = replay(args.seed, args.case)
        print(f"\noutcome: {outcome.status} at {outcome.stage} {outcome.codes}\n{outcome.detail}")
        return 0 if outcome.status in ("ok", "error") else 1
    summary = fuzz(args.cases, args.seed, args.jobs, args.out, args.start)
    text = json.dumps(summary, indent=2)
    print(text)
    if args.json:
        args.json.write_text(text + "\n", encoding="utf-8")
    bad = sum(v for k, v in summary["counts"].items() if k not in ("ok", "error"))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
