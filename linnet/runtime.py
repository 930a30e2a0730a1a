"""Checking inputs at run time, the same way for every backend.

An entry's signature says what its inputs must be: rank, integer or float dtype, dims that
agree across inputs (every `S` is the same `S`), and `where` preconditions over those dims
(`S <= 512`).  Lowering also tells which inputs index an embedding table, so ids outside
`[0, rows)` are caught here with the argument named, not deep inside a gather kernel.
A float input must hold floats (integers, such as raw uint8 pixels, are refused rather than
cast) and only finite values.
Inputs are validated as numpy arrays (token tensors are small) and cast to the declared
dtype; each backend then moves them to its own tensors.
"""
from __future__ import annotations

import collections
import functools
from dataclasses import dataclass

import numpy as np

from . import codes, dtypes
from .middle import ir
from .diagnostics import Diagnostic, InternalError, LinnetError, Note
from .dims import DimError, sym

_COMPARE = {"<=": np.less_equal, "<": np.less, ">=": np.greater_equal, ">": np.greater, "==": np.equal,
            "!=": np.not_equal}


@dataclass(frozen=True)
class IndexBound:
    """Values of an input select rows of a table: they must lie in [0, rows)."""

    rows: int
    table: str  # the block param, for messages


def index_bounds(program: ir.Program, entry: ir.Entry) -> dict[str, IndexBound]:
    """Entry inputs that reach a `take` as its ids, followed through calls."""
    bounds: dict[str, IndexBound] = {}
    visited: set[tuple[str, tuple]] = set()

    # `origin`: function param -> the entry input it carries; `tables`: function param -> the
    # block param it carries, so a message names `word_embeddings`, not std's `table`.
    def carried(a) -> str | None:
        """The local `a` reads, seen through the gather of packed rows (`linnet.middle.packing`)."""
        while isinstance(a, ir.Op) and a.op == "pack_rows":
            a = a.args[0]
        return a.name if isinstance(a, ir.Ref) else None

    def scan_expr(expr, fn: ir.Function, origin: dict[str, str], tables: dict[str, str]) -> None:
        if isinstance(expr, ir.Op):
            ids = carried(expr.args[1]) if expr.op == "take" else None
            if ids in origin:
                table = expr.args[0]
                rows = table.type.dims[0].as_int()
                if rows is not None:
                    name = _table_name(table, tables)
                    current = bounds.get(origin[ids])
                    if current is None or rows < current.rows:
                        bounds[origin[ids]] = IndexBound(rows, name)
            for a in expr.args:
                scan_expr(a, fn, origin, tables)
        elif isinstance(expr, ir.Call):
            callee = program.functions[expr.function]
            mapping = {p: origin[carried(a)] for (p, _), a in zip(callee.params, expr.args)
                       if carried(a) in origin}
            passed = {p: _table_name(a, tables) for (p, _), a in zip(callee.params, expr.args)
                      if isinstance(a, ir.ParamRef) or (isinstance(a, ir.Ref) and a.name in tables)}
            for a in expr.args:
                scan_expr(a, fn, origin, tables)
            if mapping:
                scan_function(callee, mapping, passed)

    def scan_stmts(stmts, fn, origin, tables) -> None:
        for stmt in stmts:
            if isinstance(stmt, ir.Loop):
                scan_stmts(stmt.body, fn, origin, tables)
            else:
                scan_expr(stmt.value, fn, origin, tables)

    def scan_function(fn: ir.Function, origin: dict[str, str], tables: dict[str, str]) -> None:
        key = (fn.id, tuple(sorted(origin.items())), tuple(sorted(tables.items())))
        if key in visited:
            return
        visited.add(key)
        scan_stmts(fn.body, fn, origin, tables)

    fn = program.functions[entry.function]
    scan_function(fn, {name: name for name, _ in entry.inputs}, {})
    return bounds


def _table_name(table: ir.Expr, tables: dict[str, str]) -> str:
    if isinstance(table, ir.ParamRef):
        return table.name
    if isinstance(table, ir.Ref):
        return tables.get(table.name, table.name)
    return "a table"


def _signature_of(entry: ir.Entry) -> str:
    fills = {0: " = zeros", 1: " = ones"}
    computed = {n: f" = {c.text}" for n, c in entry.computed.items()}
    params = ", ".join(f"{n}: {t}{fills.get(entry.defaults.get(n), computed.get(n, ''))}" for n, t in entry.inputs)
    return f"{entry.name}({params}) -> {entry.result}"


@functools.lru_cache(maxsize=None)
def _named_results(entry_name: str, names: tuple[str, ...]):
    """One named-tuple class per entry and result names, so equal results compare and pickle alike."""
    return collections.namedtuple(f"{entry_name}_results", names)


def results(entry: ir.Entry, value):
    """What `model.<entry>(...)` returns: one array, or for several results a tuple of arrays
    (whatever sequence the backend gave), a named tuple when the results are named."""
    if not isinstance(entry.result, ir.TupleType):
        return value
    values = tuple(value)
    if len(values) != len(entry.result.items):
        raise InternalError(f"entry {entry.name}: the backend gave {len(values)} results, "
                            f"declared {entry.result}")
    if None in entry.result.names:
        return values
    return _named_results(entry.name, entry.result.names)(*values)


#: transformers' names for BERT's inputs, accepted as keywords wherever an entry has the
#: Linnet name they stand for, so code written for `BertModel(input_ids=...)` runs unchanged.
INPUT_ALIASES = {"input_ids": "tokens", "token_type_ids": "token_types"}


class InputError(LinnetError):
    """An input that does not fit the entry's signature; the message names the argument."""


def _input_error(entry: ir.Entry, message: str, *notes: str) -> InputError:
    return InputError(Diagnostic(codes.BAD_INPUT, message, None,
                                 tuple(Note(n) for n in notes) + (Note(f"signature: {_signature_of(entry)}"),)))


def to_numpy(value, name: str, entry: ir.Entry) -> np.ndarray:
    """Accept numpy arrays, torch/JAX tensors, nested lists and scalars; refuse ragged lists."""
    try:
        if hasattr(value, "detach") and hasattr(value, "cpu"):  # torch.Tensor, without importing torch
            value = value.detach().cpu().numpy()  # (bf16 has no numpy form: TypeError)
        array = np.asarray(value)
    except (ValueError, TypeError, RuntimeError, OverflowError) as exc:
        raise _input_error(entry, f"`{name}` is not a rectangular array of numbers numpy can read: {exc}") from None
    if array.dtype == object:
        raise _input_error(entry, f"`{name}` is not a rectangular array of numbers (ragged or mixed nested lists)")
    return array


class InputValidator:
    """Validates and converts the inputs of one entry."""

    def __init__(self, program: ir.Program, entry: ir.Entry):
        self.entry = entry
        self.bounds = index_bounds(program, entry)

    def __call__(self, args: tuple, kwargs: dict) -> tuple[list[np.ndarray], dict[str, int]]:
        return self.validate(self.bind(args, kwargs))

    def validate(self, values: dict) -> tuple[list[np.ndarray], dict[str, int]]:
        """The inputs `bind` returned, checked and converted: numpy arrays in signature order
        (left-out ones filled from their `= zeros` / `= ones` defaults; None for a left-out one
        with a computed default, which the backend computes), and the dims they bind."""
        given = [(name, t) for name, t in self.entry.inputs if values.get(name) is not None]
        arrays = {name: to_numpy(values[name], name, self.entry) for name, _ in given}
        dims: dict[str, int] = {}
        for name, t in given:
            self._check_dtype(name, t, arrays[name])
            self._bind_dims(name, t, arrays[name], dims)
        for name, t in given:
            self._check_derived_dims(name, t, arrays[name], dims)
        self._check_nonempty(dims)
        self._check_preconditions(dims)
        converted = []
        for name, t in self.entry.inputs:
            numpy_type = dtypes.by_name(t.dtype).numpy_type()
            if name not in arrays and name in self.entry.computed:
                converted.append(None)  # left out: the backend computes it from the inputs before it
                continue
            if name not in arrays:  # left out: filled as its `= zeros` / `= ones` default says
                shape = tuple(d.evaluate(dims) for d in t.dims)
                converted.append(np.full(shape, self.entry.defaults[name], dtype=numpy_type))
                continue
            self._check_bounds(name, arrays[name])
            self._check_finite(name, t, arrays[name])
            # (np.ascontiguousarray would make a rank-0 input rank 1)
            converted.append(np.asarray(arrays[name], dtype=numpy_type, order="C"))
        return converted, dims

    def bind(self, args: tuple, kwargs: dict) -> dict:
        """Input name -> the value given for it, by position, name or transformers' alias."""
        names = [n for n, _ in self.entry.inputs]
        if len(args) > len(names):
            raise _input_error(self.entry, f"`{self.entry.name}` takes {len(names)} inputs, got {len(args)}")
        values = dict(zip(names, args))
        kwargs = self._resolve_aliases(kwargs, names)
        for key, value in kwargs.items():
            if key not in names:
                raise _input_error(self.entry, f"`{self.entry.name}` has no input `{key}`")
            if key in values:
                raise _input_error(self.entry, f"`{key}` given twice")
            values[key] = value
        missing = [n for n in names if values.get(n) is None and n not in self.entry.defaults
                   and n not in self.entry.computed]
        if missing:
            raise _input_error(self.entry, f"`{self.entry.name}` is missing input {', '.join(f'`{m}`' for m in missing)}")
        return values

    def _resolve_aliases(self, kwargs: dict, names: list[str]) -> dict:
        """`input_ids=` as `tokens=` (and so on) where the entry has `tokens` and no input of
        the alias's own name; both at once is refused, as neither could win silently."""
        resolved = {}
        for key, value in kwargs.items():
            name = INPUT_ALIASES.get(key)
            if name is None or key in names or name not in names:
                resolved[key] = value
                continue
            if name in kwargs:
                raise InputError(Diagnostic(codes.ALIAS_AND_NAME,
                                            f"`{key}` and `{name}` both given: `{key}` is transformers' name for "
                                            f"`{name}`; give one of them", None,
                                            (Note(f"signature: {_signature_of(self.entry)}"),)))
            resolved[name] = value
        return resolved

    def _check_dtype(self, name: str, t: ir.TensorType, array: np.ndarray) -> None:
        want_int = dtypes.by_name(t.dtype).is_int
        kind = array.dtype.kind
        if want_int and kind not in "iu":
            raise _input_error(self.entry, f"`{name}` must hold integers ({t}), found dtype {array.dtype}",
                               "token ids and type ids are integers; convert with .astype(int) if the values are whole")
        if not want_int and kind in "iub":
            # Raw pixels (uint8 0..255) where scaled floats are declared would run and give
            # nonsense, so integers are refused rather than cast.
            raise _input_error(self.entry, f"`{name}` must hold floats ({t}), found dtype {array.dtype}",
                               "an image model takes preprocessed pixels: `model.preprocess(images)` makes them "
                               "from files, PIL images or uint8 arrays")
        if not want_int and kind != "f":
            raise _input_error(self.entry, f"`{name}` must hold numbers ({t}), found dtype {array.dtype}")

    def _bind_dims(self, name: str, t: ir.TensorType, array: np.ndarray, dims: dict[str, int]) -> None:
        if array.ndim != t.rank:
            raise _input_error(self.entry, f"`{name}` must have rank {t.rank} ({t}), found shape {tuple(array.shape)}")
        for axis, (expected, actual) in enumerate(zip(t.dims, array.shape)):
            value = expected.as_int()
            if value is not None:
                if value != actual:
                    raise _input_error(self.entry, f"`{name}` axis {axis} must be {value} ({t}), found {actual}")
                continue
            names = [d for d in self.entry.dims if expected == sym(d)]
            if not names:
                continue
            dim = names[0]
            if dim in dims and dims[dim] != actual:
                first = next(n for n, tt in self.entry.inputs if any(d == sym(dim) for d in tt.dims))
                raise _input_error(self.entry, f"`{name}` has {dim} = {actual} on axis {axis}, but `{first}` has "
                                   f"{dim} = {dims[dim]}: inputs must agree on {dim}")
            dims[dim] = actual

    def _check_derived_dims(self, name: str, t: ir.TensorType, array: np.ndarray, dims: dict[str, int]) -> None:
        """Axes declared as an expression of other inputs' dims (decode's mask is [B, P + 1])
        must have that value; `_bind_dims` binds only whole dims."""
        for axis, (expected, actual) in enumerate(zip(t.dims, array.shape)):
            if expected.as_int() is not None or any(expected == sym(d) for d in self.entry.dims):
                continue
            try:
                value = expected.evaluate(dims)
            except DimError:
                continue
            if value != actual:
                bound = ", ".join(f"{d} = {dims[d]}" for d in sorted(expected.free_symbols()) if d in dims)
                raise _input_error(self.entry, f"`{name}` axis {axis} must be {expected} = {value} ({t}, with "
                                   f"{bound}), found {actual}")

    def _check_nonempty(self, dims: dict[str, int]) -> None:
        for dim, value in dims.items():
            if value == 0:
                raise _input_error(self.entry, f"{dim} = 0: `{self.entry.name}` needs at least one element along {dim}")

    def _check_preconditions(self, dims: dict[str, int]) -> None:
        for left, op, right, span in self.entry.preconditions:
            try:
                lv, rv = left.evaluate(dims), right.evaluate(dims)
            except DimError:
                continue
            if not _COMPARE[op](lv, rv):
                values = ", ".join(f"{d} = {dims[d]}" for d in sorted(left.free_symbols() | right.free_symbols()) if d in dims)
                raise InputError(Diagnostic(
                    codes.PRECONDITION_FAILED, f"`{self.entry.name}` requires {left} {op} {right}, but {values}", span,
                    (Note("declared by this `where` clause (the model's limit; e.g. truncate longer sequences)"),)))

    def _check_finite(self, name: str, t: ir.TensorType, array: np.ndarray) -> None:
        """A NaN or infinity in a float input would spread through every output (attention mixes
        all positions), so it is refused with where it is."""
        if array.dtype.kind != "f" or array.size == 0:
            return
        finite = np.isfinite(array)
        if not finite.all():
            where = tuple(int(i) for i in np.argwhere(~finite)[0])
            raise _input_error(self.entry, f"`{name}` holds {array[where]} at {list(where)}: every value of a float "
                               f"input ({t}) must be finite")

    def _check_bounds(self, name: str, array: np.ndarray) -> None:
        bound = self.bounds.get(name)
        if bound is None or array.size == 0:
            return
        low, high = array.min(), array.max()
        if low < 0 or high >= bound.rows:
            bad = array[(array < 0) | (array >= bound.rows)]
            where = tuple(int(i) for i in np.argwhere((array < 0) | (array >= bound.rows))[0])
            raise _input_error(self.entry, f"`{name}` holds {int(bad.flat[0])} at {list(where)}, but it indexes "
                               f"`{bound.table}`, which has {bound.rows} rows: values must be in [0, {bound.rows})")
