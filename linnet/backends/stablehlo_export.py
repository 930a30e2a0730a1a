"""Lowered program -> StableHLO artifact: each entry exported once with symbolic dims.

The generated JAX functions (`linnet.backends.jax_source`) are exported with `jax.export`:

* the params tree is the *first* argument, described by `ShapeDtypeStruct`s, so the
  artifact holds no weights (bert-base's 440 MB stay in the checkpoint) and one export
  serves any checkpoint of the same shapes;
* the entry's own dims (B, S) are symbolic (`jax.export.symbolic_shape`), so one export
  serves every (B, S); the consumer still compiles once per concrete shape;
* the entry's `where` preconditions become symbolic constraints (`S <= 512`).  jax uses
  them while exporting and also writes each as a shape assertion into the module, so the
  artifact itself refuses S = 600 when it is called, with no Linnet code involved;
* a packed entry (`linnet.middle.packing`) takes one argument more, after its inputs: an
  array of a symbolic length `Tokens` whose contents are never read.  Its length is the
  packed rows' length (`jnp.nonzero(size=Tokens)`), which jax cannot take from the mask's
  values, only from a shape; so one export serves every token count, and the caller picks
  the length: at or above the kept count (the runtime passes `packing.token_bucket`, so a
  (B, S) compiles once per bucket, as on the jax backend).  A length below the count would
  drop tokens; the artifact cannot check values, so signature.json states the rule.

Layout of an artifact folder (see `write_artifact`; `linnet build` exports every entry, the
runtime's cache the root entry first and each other on its first call, `export_to`):

    <entry>.jax_export   jax.export serialization (load with jax.export.deserialize)
    <entry>.mlir         the same module as StableHLO text, for people to read
    signature.json       inputs, dims, preconditions, params in pytree order, versions
    model.py             the JAX source the entries were exported from
"""
from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any

from .. import __version__, codes, dtypes
from ..middle import ir
from ..diagnostics import Diagnostic, InternalError, LinnetError
from ..dims import DimExpr, FloorDiv, Mod, Sym

#: The platforms each entry is lowered for: the artifact runs on CPU and on CUDA GPUs.
PLATFORMS = ("cpu", "cuda")

FORMAT = "linnet-stablehlo/1"


# ---------------------------------------------------------------- dims and constraints


def jax_dim(d: DimExpr) -> str:
    """A dim in the syntax `jax.export.symbolic_shape` parses (`floordiv`, `mod`, `*`)."""
    value = d.as_int()
    if value is not None:
        return str(value)
    pieces: list[str] = []
    for monomial, coeff in d.terms:
        factors = [_jax_atom(atom) for atom, power in monomial for _ in range(power)]
        if abs(coeff) != 1 or not factors:
            factors.insert(0, str(abs(coeff)))
        term = "*".join(factors)
        if not pieces:
            pieces.append(term if coeff > 0 else f"0 - {term}")
        else:
            pieces.append(f"{'+' if coeff > 0 else '-'} {term}")
    return " ".join(pieces)


def _jax_atom(atom) -> str:
    if isinstance(atom, Sym):
        return atom.name
    if isinstance(atom, FloorDiv):
        return f"floordiv({jax_dim(atom.num)}, {jax_dim(atom.den)})"
    if isinstance(atom, Mod):
        return f"mod({jax_dim(atom.num)}, {jax_dim(atom.den)})"
    raise InternalError(f"unknown dim atom {atom!r}")


def _constraint(left: DimExpr, op: str, right: DimExpr) -> str | None:
    """A precondition as a jax.export constraint; jax takes `>=`, `<=` and `==` only, so
    strict comparisons move by one (dims are integers) and `!=` has no form."""
    lhs, rhs = jax_dim(left), jax_dim(right)
    return {"<=": f"{lhs} <= {rhs}", ">=": f"{lhs} >= {rhs}", "==": f"{lhs} == {rhs}",
            "<": f"{lhs} <= {jax_dim(right - 1)}", ">": f"{lhs} >= {jax_dim(right + 1)}"}.get(op)


def preconditions(entry: ir.Entry) -> list[dict[str, Any]]:
    """Each `where` clause of the entry: its text, the jax constraint for it (or None), and
    whether jax accepted it into the export."""
    from jax import export as jax_export

    out = []
    for left, op, right, span in entry.preconditions:
        if not (left.free_symbols() | right.free_symbols()):
            continue  # decided when the program was checked
        constraint = _constraint(left, op, right)
        if constraint is not None:
            try:
                jax_export.SymbolicScope([constraint])
            except ValueError:  # a form jax's constraint language does not take
                constraint = None
        out.append({"where": f"{left} {op} {right}", "constraint": constraint, "in_artifact": constraint is not None,
                    "source": f"{span.file}:{span.line}" if span else None})
    return out


# ---------------------------------------------------------------------------- specs


def param_specs(program: ir.Program) -> dict:
    """The params tree as `jax.ShapeDtypeStruct`s (every param shape is concrete)."""
    import jax
    import jax.numpy as jnp

    from .jax_source import params_tree

    def leaf(path: str, t: ir.TensorType):
        shape = tuple(d.as_int() for d in t.dims)
        if None in shape:
            raise InternalError(f"param {path} has a symbolic shape {t}")
        return jax.ShapeDtypeStruct(shape, jnp.dtype(_dtype_name(t.dtype)))

    return params_tree(program, leaf)


def input_specs(entry: ir.Entry, constraints: list[str]) -> list:
    """The entry's inputs with its dims symbolic, all in one scope that holds the constraints;
    a packed entry's token-rows argument last (its length the symbolic `tokens_dim`)."""
    import jax
    import jax.numpy as jnp
    from jax import export as jax_export

    scope = jax_export.SymbolicScope(constraints)
    specs = []
    for _, t in entry.inputs:
        shape = jax_export.symbolic_shape(", ".join(jax_dim(d) for d in t.dims), scope=scope) if t.dims else ()
        specs.append(jax.ShapeDtypeStruct(shape, jnp.dtype(_dtype_name(t.dtype))))
    if entry.packed_by:
        specs.append(jax.ShapeDtypeStruct(jax_export.symbolic_shape(tokens_dim(entry), scope=scope),
                                          jnp.dtype(TOKEN_ROWS_DTYPE)))
    return specs


#: A packed entry's last argument: only its length is read (see the module doc).
TOKEN_ROWS = "token_rows"
TOKEN_ROWS_DTYPE = "bool"


def tokens_dim(entry: ir.Entry) -> str:
    """The symbolic name of a packed entry's token-rows length, apart from the entry's own dims."""
    name = "Tokens"
    while name in entry.dims:
        name += "_"
    return name


def packed_call(function):
    """`function(params, *inputs, token_bucket=n)` as `call(params, *inputs, token_rows)`, `n`
    being the length of `token_rows` (symbolic while exporting)."""
    from .jax_source import BUCKET

    def call(params, *args):
        *inputs, token_rows = args
        return function(params, *inputs, **{BUCKET: token_rows.shape[0]})

    # The entry's own name in jax's messages and profiles (not functools.wraps: jax would read
    # the wrapped signature, which has no `token_rows`).
    call.__name__ = call.__qualname__ = getattr(function, "__name__", "entry")
    return call


def param_paths_in_tree_order(tree) -> list[str]:
    """Dotted param paths in the order jax flattens the tree (dict keys sorted, lists in order)."""
    import jax

    def part(key) -> str:
        return str(key.key) if hasattr(key, "key") else str(key.idx)

    return [".".join(part(k) for k in path) for path, _ in jax.tree_util.tree_flatten_with_path(tree)[0]]


# --------------------------------------------------------------------------- export


def export_entry(program: ir.Program, function, entry_name: str):
    """`jax.export` of one entry: `function(params, *inputs)` with symbolic dims."""
    import jax
    from jax import export as jax_export

    entry = program.entries[entry_name]
    constraints = [p["constraint"] for p in preconditions(entry) if p["constraint"] is not None]
    if entry.packed_by:
        function = packed_call(function)
    try:
        return jax_export.export(jax.jit(function), platforms=PLATFORMS)(
            param_specs(program), *input_specs(entry, constraints))
    except Exception as exc:  # noqa: BLE001 - jax raises many kinds; all mean "cannot export"
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise LinnetError(Diagnostic(codes.STABLEHLO_SYMBOLIC_EXPORT,
                                     f"entry `{entry_name}` cannot be exported to StableHLO with "
                                     f"symbolic dims {', '.join(entry.dims)}: {reason}")) from None


def write_artifact(ctx, out_dir: Path, entries=None) -> list[Path]:
    """Export the entries of `ctx.program` into `out_dir`: every one (`linnet build`), or only
    those named (the runtime's cache, which exports the rest on first use, `export_to`).
    model.py and signature.json describe every entry either way; the files written."""
    from .pysource import import_generated

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    program = ctx.program
    source = write_source(program, ctx.name, out_dir)
    module = import_generated(source, generated_module_name(out_dir))
    written = [source]
    records: dict[str, Any] = {}
    for name in program.entries:
        records[name] = _call_record(ctx, name)
        if entries is None or name in entries:
            seconds, files = export_to(out_dir, program, module, name, ctx.name)
            records[name]["export_seconds"] = round(seconds, 3)
            written += files
    signature = out_dir / "signature.json"
    signature.write_text(json.dumps(_signature(ctx, records), indent=2) + "\n", encoding="utf-8")
    return written + [signature]


def write_source(program: ir.Program, model_name: str, out_dir: Path) -> Path:
    """model.py: the JAX source every entry is exported from."""
    from .jax_source import emit

    source = out_dir / "model.py"
    source.write_text(emit(program, title=f"{model_name}, JAX (exported to StableHLO)"), encoding="utf-8")
    return source


def generated_module_name(out_dir: Path) -> str:
    """The name model.py is imported under: one per folder, as the folder may move (a cache's
    temporary folder is renamed into place), a name never changes what it holds."""
    return "linnet_stablehlo_export_" + re.sub(r"\W", "_", str(out_dir))


def export_to(out_dir: Path, program: ir.Program, module, name: str, model_name: str) -> tuple[float, list[Path]]:
    """Export entry `name` (model.py's `module.ENTRIES[name]`) into `out_dir`: its
    `.jax_export` and `.mlir`, each written under a temporary name and renamed, so a process
    reading the folder meanwhile sees a whole file or none.  The export's seconds, the files."""
    import os

    import jax

    entry = program.entries[name]
    started = time.perf_counter()
    exported = export_entry(program, module.ENTRIES[name], name)
    seconds = time.perf_counter() - started
    text = out_dir / f"{name}.mlir"
    blob = out_dir / f"{name}.jax_export"
    contents = {text: (f"// Linnet {__version__}: {model_name}, entry `{name}`, exported by jax {jax.__version__}.\n"
                       f"// Call: {name}(params, {', '.join(n for n, _ in entry.inputs)}); see signature.json.\n"
                       + exported.mlir_module()).encode("utf-8"),
                blob: exported.serialize()}
    for path, data in contents.items():  # the blob last: it is what a reader looks for
        partial = path.with_name(f"{path.name}.tmp{os.getpid()}")
        partial.write_bytes(data)
        os.replace(partial, path)
    return seconds, [blob, text]


def _call_record(ctx, name: str) -> dict:
    """signature.json's record of how to call entry `name`."""
    entry = ctx.program.entries[name]
    record = {
        "file": f"{name}.jax_export", "mlir": f"{name}.mlir", "dims": list(entry.dims),
        "inputs": [{"name": n, "dtype": _dtype_name(t.dtype), "dims": [_dim_json(d) for d in t.dims]}
                   for n, t in entry.inputs],
        **_results_record(entry, ctx.output_name(name)),
        "preconditions": preconditions(entry),
    }
    if entry.packed_by:
        record["packing"] = _packing_record(entry)
    return record


def _results_record(entry: ir.Entry, base: str) -> dict:
    """`result` for one result; `results`, a list in the exported call's order, for several."""
    records = [{"name": out, "dtype": _dtype_name(t.dtype), "dims": [_dim_json(d) for d in t.dims]}
               for out, t in zip(ir.output_names(entry, base), ir.result_types(entry.result))]
    return {"results": records} if isinstance(entry.result, ir.TupleType) else {"result": records[0]}


def _packing_record(entry: ir.Entry) -> dict:
    """How to call a packed entry: the token-rows argument after its inputs, and the length it needs."""
    mask, positions = entry.packed_by
    kept = f"the count of {mask} != 0" + "".join(f", position {p} of every row counted as kept" for p in positions)
    return {"argument": TOKEN_ROWS, "after": "the inputs", "dtype": TOKEN_ROWS_DTYPE, "dims": [tokens_dim(entry)],
            "kept_positions": {"mask": mask, "fixed": list(positions)},
            "rule": f"the contents are not read; the length is the packed rows' length and must be at least "
                    f"{kept} (fewer drops tokens; more computes extra rows that nothing reads). Linnet's runtime "
                    "passes linnet.middle.packing.token_bucket(count, B * S), so a (B, S) compiles once per bucket",
            "padded_positions": "a result per position (with B and S) holds exactly 0 where a position is not "
                                "kept; one reduced or selected over kept positions equals the padded program's"}


def _dtype_name(dtype: str) -> str:
    """A Linnet dtype as numpy and jax name it ("bfloat16"), as signature.json writes it."""
    return dtypes.by_name(dtype).numpy


def _dim_json(d: DimExpr):
    value = d.as_int()
    return value if value is not None else str(d)


def _signature(ctx, entries: dict) -> dict:
    import jax

    program = ctx.program
    types = dict(program.param_paths())
    keys = ctx.checkpoint_keys()
    params = []
    for path in param_paths_in_tree_order(param_specs(program)):
        t = types[path]
        record = {"path": path, "shape": [d.as_int() for d in t.dims], "dtype": _dtype_name(t.dtype)}
        if path in keys:
            record["checkpoint_key"] = keys[path]
        params.append(record)
    return {
        "format": FORMAT,
        "model": ctx.name,
        "linnet": __version__,
        "jax": jax.__version__,
        "platforms": list(PLATFORMS),
        "call": "jax.export.deserialize(<entry>.jax_export).call(params, *inputs), and a packed entry's "
                "token_rows after the inputs (see its `packing`)",
        "params_tree": "nested dicts keyed by the parts of each dotted `path`; a part that is a number indexes "
                       "a list (a sub-block array); `params` below is in the tree's flattening order",
        "entries": entries,
        "params": params,
    }
