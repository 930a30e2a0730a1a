"""Generated code is safe: hostile names compile and run, and no source text can inject code.

A small model whose every name is a Python keyword, a builtin, an nn.Module attribute or a
name the generated modules use themselves (`class`, `lambda`, `print`, `torch`, `F`, `nn`,
`jnp`, `jax`, `params`, `self`, `np`, ...) is loaded on the torch, JAX and ONNX backends
and must compute what numpy computes from the same weights. The entry lives in a folder
whose name, and a manifest whose title and summary, carry a payload that would run
`os.system` if it ever left a comment; the source's comments carry one too. Only
validated identifiers and numbers may reach generated code: the payload may appear in
comments and docstrings only, and the marker file it would create must never exist.
"""
from __future__ import annotations

import io
import json
import math
import tokenize
import ast as pyast
from pathlib import Path

import numpy as np
import pytest

from linnet.backends import jax_source as jax_backend
from linnet.backends import torch_source as pytorch
from linnet.backends.pysource import comment_text, py_dim, py_name
from linnet.cli.targets import locate
from linnet.compiler import compile_target
from linnet.dims import sym
from linnet.middle.lower import lower

MARKER = "LINNET_PWNED_MARKER"


MARKER_FILE = "linnet-pwned-marker"  # created in the working directory, if the payload ever runs


def payload() -> str:
    """Text that runs a shell command if it ever becomes code, whichever quote it lands in."""
    return (f'x"""\'\'\'\n__import__("os").system("touch {MARKER_FILE}")  # {MARKER}\r\n'
            f'\u2028import os; os.system("touch {MARKER_FILE}")\x0c\\\n#')


SOURCE = """\
// {payload}
module lambda

use std.nn.activations::{{gelu_erf}}
use std.nn.linear::{{Linear}}

// A block named `class` whose members shadow every name generated code relies on.
pub block class<torch: Dim, F: Dim, nn: Dim, T: Float> {{
    param self: Tensor[torch, F; T]
    param np: Tensor[F; T]
    param training: Tensor[F; T]
    sub jnp: Linear<F, nn, T>
    sub jax: [Linear<nn, nn, T>; 2]

    // {payload}
    fn eval<B: Dim, lambda: Dim>(params: Tensor[B, lambda, F; T]) -> Tensor[B, lambda, F; T] {{
        let def = params + np * training
        let None = reshape(def, [B, lambda, F])
        return None * cast<T>(lambda)
    }}

    pub entry forward<B: Dim, S: Dim>(
        print: Tensor[B, S; i32],
        super: Tensor[B, S; i32] = zeros,
    ) -> Tensor[B, S, nn; T] {{
        let import = take(self, print) + reshape(cast<T>(super), [B, S, 1])
        var __import__ = jnp.forward(eval(import))
        // A loop variable named `self` is a sub like any other, not the block itself.
        static for self in jax {{
            __import__ = gelu_erf(self.forward(__import__))
        }}
        return __import__
    }}

    // Entries named like the param `np`, the sub `jnp` and the sub array `jax`: in a
    // generated class the method would hide the member of the same name.
    pub entry np<B: Dim, S: Dim>(print: Tensor[B, S; i32], super: Tensor[B, S; i32] = zeros) -> Tensor[B, S, nn; T] {{
        return forward(print, super)
    }}
    pub entry jnp<B: Dim, S: Dim>(print: Tensor[B, S; i32], super: Tensor[B, S; i32] = zeros) -> Tensor[B, S, nn; T] {{
        return forward(print, super)
    }}
    pub entry jax<B: Dim, S: Dim>(print: Tensor[B, S; i32], super: Tensor[B, S; i32] = zeros) -> Tensor[B, S, nn; T] {{
        return forward(print, super)
    }}
}}
"""


def nest_toml(title: str) -> str:
    return f"""\
[model]
name = "hostile"
title = {json.dumps(title)}
summary = {json.dumps(title)}
license = "MIT"
family = "test"

[source]
path = "src/lib.linnet"
root = "class"
entry = "forward"

[generics]
torch = 11
F = 4
nn = 3
T = "f32"

[check]
B = 2
S = 5

[weights]
repo = "linnet/hostile"
revision = "{'0' * 40}"
files = ["model.safetensors"]
bindings = "bindings.json"
"""


PARAMS = {"self": (11, 4), "np": (4,), "training": (4,), "jnp.weight": (3, 4), "jnp.bias": (3,),
          "jax.0.weight": (3, 3), "jax.0.bias": (3,), "jax.1.weight": (3, 3), "jax.1.bias": (3,)}


@pytest.fixture(scope="module")
def hostile(tmp_path_factory):
    """The entry, in a folder whose very name is a payload, with its weights beside it."""
    base = tmp_path_factory.mktemp("codegen")
    marker = base / MARKER_FILE
    entry = base / payload().replace("/", "|")
    (entry / "src").mkdir(parents=True)
    (entry / "src" / "lib.linnet").write_text(SOURCE.format(payload=payload().replace("\n", " ")),
                                              encoding="utf-8")
    (entry / "nest.toml").write_text(nest_toml(payload()), encoding="utf-8")
    (entry / "linnet.toml").write_text('[package]\nname = "lambda"\nversion = "0.1.0"\nlanguage = "0.1"\n')
    (entry / "bindings.json").write_text(json.dumps({k: f"w.{k}" for k in PARAMS}))
    rng = np.random.default_rng(0)
    tensors = {f"w.{k}": rng.standard_normal(shape).astype(np.float32) for k, shape in PARAMS.items()}
    from safetensors.numpy import save_file

    save_file(tensors, str(base / "model.safetensors"))
    return entry, marker, base / "model.safetensors", {k: tensors[f"w.{k}"] for k in PARAMS}


def reference(w: dict, tokens: np.ndarray, types: np.ndarray) -> np.ndarray:
    x = w["self"][tokens].astype(np.float64) + types[..., None]
    x = (x + w["np"] * w["training"]) * tokens.shape[1]
    h = x @ w["jnp.weight"].T + w["jnp.bias"]
    erf = np.vectorize(math.erf)
    for i in range(2):
        h = h @ w[f"jax.{i}.weight"].T + w[f"jax.{i}.bias"]
        h = 0.5 * h * (1.0 + erf(h / math.sqrt(2.0)))
    return h


def assert_payload_only_in_comments(source: str) -> None:
    """Every token that carries the payload is a comment or a docstring, never code."""
    tree = pyast.parse(source)  # valid Python, to begin with
    docstrings = {id(node.body[0].value) for node in pyast.walk(tree)
                  if isinstance(node, (pyast.ClassDef, pyast.FunctionDef, pyast.Module)) and node.body
                  and isinstance(node.body[0], pyast.Expr) and isinstance(node.body[0].value, pyast.Constant)}
    for node in pyast.walk(tree):
        if isinstance(node, pyast.Constant) and isinstance(node.value, str) and MARKER in node.value:
            assert id(node) in docstrings, node.value
        if isinstance(node, pyast.Name):
            assert node.id not in ("os", "__import__", "exec", "eval", "system"), pyast.unparse(node)
        if isinstance(node, pyast.Import):
            assert all(a.name in ("torch", "torch.nn.functional", "jax", "jax.numpy") for a in node.names), \
                pyast.unparse(node)
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if "system(" in tok.string:
            assert tok.type in (tokenize.COMMENT, tokenize.STRING), tok
    for line in source.splitlines():
        if "system(" in line:
            assert line.lstrip().startswith(("#", '"""')) or "  # " in line, line


@pytest.fixture(autouse=True)
def in_marker_folder(hostile, monkeypatch):
    """Run each test where the payload would leave its marker file."""
    monkeypatch.chdir(hostile[1].parent)


def test_the_hostile_program_checks_and_emits_valid_python(hostile):
    entry, marker, _, _ = hostile
    compiled = compile_target(locate(entry))
    program = lower(compiled.instance)
    for emit in (pytorch.emit, jax_backend.emit):
        for fused in (True, False):
            source = emit(program, fused=fused, title=payload())
            assert_payload_only_in_comments(source)
            assert MARKER in source  # the file path and the title are quoted, as comments
    assert not marker.exists()


def test_generated_names_are_renamed_and_distinct():
    for name in ("class", "lambda", "print", "torch", "F", "nn", "jnp", "jax", "params", "self", "np", "None",
                 "training", "eval", "__import__", "match", "type", "float"):
        assert py_name(name) != name and py_name(name).isidentifier()
    # Renaming is one-to-one: `class` and a Linnet name `class_` stay apart.
    names = ["class", "class_", "class__", "x", "x_", "np", "np_"]
    assert len({py_name(n) for n in names}) == len(names)
    assert py_dim(sym("lambda") * 2 + sym("print")) in ("lambda_ * 2 + print_", "2 * lambda_ + print_",
                                                         "print_ + lambda_ * 2", "print_ + 2 * lambda_")
    with pytest.raises(ValueError):
        py_name("os.system('x')")


@pytest.mark.parametrize("text", ["a\nb", 'x"""y', "x\\", "\r", "\u2028", "\x0c", "\x00", "'''", "\\N{DIGIT ONE}"])
def test_comment_text_stays_on_its_line_and_inside_its_string(text):
    safe = comment_text(text)
    assert "\n" not in safe and "\r" not in safe and safe.isprintable()
    # In a docstring too, it reads back as one string with the same (escaped) text.
    module = pyast.parse(f'"""{safe}"""\n#{safe}\nx = 1\n')
    assert isinstance(module.body[0].value, pyast.Constant) and len(module.body) == 2


@pytest.mark.parametrize("backend", ["torch", "jax", "onnx"])
def test_hostile_names_run_correctly_on_every_backend(hostile, backend):
    from linnet import nest

    entry, marker, weights, w = hostile
    model = nest.load(entry, backend=backend, weights=weights)
    tokens = np.array([[0, 3, 10, 7, 1], [5, 5, 2, 9, 4]], dtype=np.int32)
    types = np.array([[0, 1, 0, 1, 0], [1, 1, 0, 0, 0]], dtype=np.int32)
    out = np.asarray(model(tokens, super=types), dtype=np.float64)
    np.testing.assert_allclose(out, reference(w, tokens, types), rtol=1e-4, atol=1e-4)
    # Keyword arguments use the Linnet names, whatever the generated names are.
    again = np.asarray(model(print=tokens, super=types), dtype=np.float64)
    np.testing.assert_array_equal(again, out)
    # Entries sharing a name with a param, a sub and a sub array still reach those members.
    for clashing in ("np", "jnp", "jax"):
        np.testing.assert_array_equal(np.asarray(model.run(clashing, tokens, super=types), dtype=np.float64), out)
    if model.info.generated is not None and Path(model.info.generated).suffix == ".py":
        assert_payload_only_in_comments(Path(model.info.generated).read_text(encoding="utf-8"))
    assert not marker.exists()


def test_onnx_node_and_initializer_names_are_unique_and_payload_free(hostile):
    from linnet import nest
    from linnet.backends import onnx_graph as onnx_backend

    entry, marker, weights, _ = hostile
    import onnx

    ctx, _ = nest.prepare(entry, weights=weights)
    tensors = ctx.tensors("numpy")
    # `np` is also a param name: the output must keep it and the initializer give way.
    files = onnx_backend.emit(ctx.program, tensors, name="hostile",
                              outputs={"forward": "hidden", "np": "np", "jnp": "jnp", "jax": "jax"})
    model = files[0].model
    onnx.checker.check_model(model, full_check=True)
    names = [n.name for n in model.graph.node] + [t.name for t in model.graph.initializer]
    assert len(names) == len(set(names))
    outputs = [o for n in model.graph.node for o in n.output]
    assert len(outputs) == len(set(outputs))
    assert not any("system(" in name for name in names + outputs)
    assert [i.name for i in model.graph.input] == ["print", "super"]


def test_manifest_name_cannot_name_a_path(tmp_path):
    """[model].name becomes file names (the generated-code cache): only a plain name passes."""
    from linnet.diagnostics import LinnetError
    from linnet.nest.manifest import load_manifest

    for bad in ("../../escape", "a/b", "evil\nname", ".hidden", ""):
        entry = tmp_path / f"e{abs(hash(bad))}"
        (entry / "src").mkdir(parents=True)
        (entry / "src" / "lib.linnet").write_text("module lambda\n")
        (entry / "linnet.toml").write_text('[package]\nname = "lambda"\nversion = "0.1.0"\nlanguage = "0.1"\n')
        (entry / "nest.toml").write_text(nest_toml("t").replace('name = "hostile"', f"name = {json.dumps(bad)}"))
        with pytest.raises(LinnetError) as caught:
            load_manifest(entry)
        assert caught.value.code == "E0912" and "[model].name" in caught.value.render()
