"""Resolved program -> checked program: every shape and dtype proven, every `where` discharged.

Blocks and functions are checked once, generically: dims are symbols (`D`, `Heads`, `S`) and
the facts in scope are the `where` clauses of the block and the function.  Every call and
every sub-block instantiation must prove the callee's `where` clauses from those facts, so a
program that checks is correct for every instantiation that satisfies its root's clauses
(see `linnet.instantiate`).  The checker records the type of each expression and the generic
bindings of each call; lowering reuses both by substitution.

Errors are collected per statement: a failed statement gives its bindings an error type
that silences follow-on errors, so one run reports several independent problems.
"""
from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from typing import NoReturn

from . import ast
from .diagnostics import Diagnostic, InternalError, LinnetError, Note, Span
from .dims import DimError, DimExpr, Facts, FloorDiv, const, floordiv, mod, sym
from .prims import PRIMS, PrimCall
from .resolve import ModuleInfo, Program
from .types import (ALL_DTYPES, DIM_KIND, DTYPE_KINDS, GENERIC_KINDS, SHAPE_KIND, Binding, DimT, DTypeVar,
                    ErrorT, ListT, NoneT, OptionT, SomeT, SubArrayT, SubT, TensorT, Type, Variadic,
                    WEAK_INT, dims_only, dtype_kind_ok, format_binding, is_float, number_range, scalar, substitute,
                    substitute_dims, weak_fits)


class _Failure(Exception):
    """A check failed; `diagnostic` None means it failed because of an error already reported."""

    def __init__(self, diagnostic: Diagnostic | None):
        self.diagnostic = diagnostic


def _silent() -> NoReturn:
    """Give up on a check whose cause was already reported (a broken declaration it uses)."""
    raise _Failure(None)


def _fail(code: str, message: str, span: Span | None, *notes: Note) -> NoReturn:
    raise _Failure(Diagnostic(code, message, span, tuple(notes)))


# ----------------------------------------------------------------- checked program


@dataclass(frozen=True)
class GenericInfo:
    name: str
    kind: str
    default: Binding | None
    span: Span

    @property
    def is_dtype(self) -> bool:
        return self.kind in DTYPE_KINDS

    def symbol(self) -> Binding:
        """How this generic appears inside types: a dim symbol, a dtype variable or `*S`."""
        if self.kind == DIM_KIND:
            return sym(self.name)
        if self.kind == SHAPE_KIND:
            return (Variadic(self.name),)
        return DTypeVar(self.name, self.kind)


@dataclass(frozen=True)
class WhereClause:
    left: DimExpr
    op: str
    right: DimExpr
    span: Span

    def substitute(self, env) -> "WhereClause":
        dims = dims_only(env)
        return WhereClause(self.left.substitute(dims), self.op, self.right.substitute(dims), self.span)

    def __str__(self) -> str:
        return f"{self.left} {self.op} {self.right}"


@dataclass
class BroadcastClause:
    """`where [*M] broadcasts to [*Lead, Q, K]`: `left` numpy-broadcasts to exactly `right`."""

    left: tuple
    right: tuple
    span: Span

    def substitute(self, env) -> "BroadcastClause":
        return BroadcastClause(substitute_dims(self.left, env), substitute_dims(self.right, env), self.span)

    def __str__(self) -> str:
        return f"[{', '.join(map(_shape_item, self.left))}] broadcasts to [{', '.join(map(_shape_item, self.right))}]"


def _shape_item(d) -> str:
    return f"*{d.name}" if isinstance(d, Variadic) else str(d)


#: Fill values an entry parameter may default to (`attention_mask: Tensor[B, S; i32] = ones`).
PARAM_DEFAULTS = {"zeros": 0, "ones": 1}


@dataclass
class FnSig:
    key: str  # `module::fn` or `module::Block.fn`
    name: str
    node: ast.Function
    module: ModuleInfo
    block: "BlockSig | None"
    generics: list[GenericInfo]  # the function's own
    scope: dict[str, GenericInfo]  # the block's generics and the function's own
    params: list[tuple[str, Type, Span]] = field(default_factory=list)
    result: Type = field(default_factory=ErrorT)
    where: list[WhereClause | BroadcastClause] = field(default_factory=list)
    facts: Facts = field(default_factory=Facts)
    #: Entry parameters the caller may leave out, and the value they are filled with.
    defaults: dict[str, int] = field(default_factory=dict)
    checked: bool = False  # the signature checked, so the body can be

    @property
    def is_entry(self) -> bool:
        return self.node.is_entry

    def signature(self, env=None) -> str:
        env = env or {}
        params = ", ".join(f"{n}: {substitute(t, env)}" for n, t, _ in self.params)
        # `*S` for a Shape generic, as declared (it printed as plain `S`, which reads as a Dim).
        generics = ", ".join(("*" if g.kind == SHAPE_KIND else "") + g.name
                             for g in self.generics if g.name not in env)
        head = f"{self.name}<{generics}>" if generics else self.name
        return f"{head}({params}) -> {substitute(self.result, env)}"


@dataclass
class BlockSig:
    key: str
    name: str
    node: ast.Block
    module: ModuleInfo
    generics: list[GenericInfo]
    where: list[WhereClause] = field(default_factory=list)
    facts: Facts = field(default_factory=Facts)
    params: dict[str, tuple[TensorT, Span]] = field(default_factory=dict)
    subs: dict[str, tuple[SubT | SubArrayT, Span]] = field(default_factory=dict)
    functions: dict[str, FnSig] = field(default_factory=dict)

    @property
    def scope(self) -> dict[str, GenericInfo]:
        return {g.name: g for g in self.generics}


@dataclass(frozen=True)
class CallInfo:
    """What a call resolved to, with the callee's generics bound in the caller's terms."""

    kind: str  # "prim", "fn" (free function), "self" (sibling in the block), "sub" (method on a sub)
    target: str  # prim name or function key
    bindings: tuple[tuple[str, Binding], ...]
    receiver: str | None = None  # sub member or loop variable, for kind "sub"

    @property
    def env(self) -> dict[str, Binding]:
        return dict(self.bindings)


@dataclass(frozen=True)
class NameInfo:
    kind: str  # "local", "param" (block param), "const", "dim"
    target: str  # local name, param name, const key, or dim name


@dataclass
class CheckedProgram:
    program: Program
    blocks: dict[str, BlockSig]
    functions: dict[str, FnSig]
    consts: dict[str, tuple[float | int, str]]
    types: dict[int, Type]  # id(expression node) -> its type, in its function's generics
    calls: dict[int, CallInfo]
    names: dict[int, NameInfo]

    def find_block(self, name: str) -> BlockSig:
        matches = [b for b in self.blocks.values() if b.name == name or b.key == name]
        if not matches:
            raise KeyError(name)
        return matches[0]


# -------------------------------------------------------------------- checking scope


@dataclass
class _Local:
    type: Type
    mutable: bool
    span: Span
    kind: str = "let"  # "let", "var", "param", "loop" (static for) or "some" (if let), for messages


@dataclass
class _FnContext:
    sig: FnSig
    facts: Facts
    locals: list[dict[str, _Local]]  # innermost scope last

    def lookup(self, name: str) -> _Local | None:
        for scope in reversed(self.locals):
            if name in scope:
                return scope[name]
        return None

    def bind(self, name: str, local: _Local) -> None:
        self.locals[-1][name] = local


_OPS_ON_DIMS = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b,
                "/": floordiv, "%": mod}


class Checker:
    def __init__(self, program: Program):
        self.program = program
        self.errors: list[Diagnostic] = []
        self.blocks: dict[str, BlockSig] = {}
        self.functions: dict[str, FnSig] = {}
        self.consts: dict[str, tuple[float | int, str]] = {}
        self.types: dict[int, Type] = {}
        self.calls: dict[int, CallInfo] = {}
        self.names: dict[int, NameInfo] = {}
        # caller key -> [(callee key, span of the call)], for rejecting recursion
        self._call_edges: dict[str, list[tuple[str, Span]]] = {}
        # Declarations that failed (blocks `m::B`, functions `m::f` / `m::B.f`, members
        # `m::B#name`): uses of them fail silently instead of piling up follow-on errors
        # such as "`g` takes 1 argument" for a `g` whose second parameter had a bad type.
        self._broken: set[str] = set()
        self._silenced = 0  # checks given up because of an earlier error

    # ------------------------------------------------------------------ driver
    def run(self) -> CheckedProgram:
        modules = list(self.program.modules.values())
        for module in modules:
            self._guard(self._collect_headers, module)
        for module in modules:
            for item in module.tree.items:
                if isinstance(item, ast.Block):
                    self._guard(self._check_block_members, self.blocks.get(self._key(module, item.name)))
        for fn in list(self.functions.values()):
            self._guard(self._check_signature, fn)
        self._check_sub_cycles()
        for fn in list(self.functions.values()):
            if fn.checked:
                self._check_body(fn)
        self._check_call_cycles()
        if self._silenced and not self.errors:  # a check was skipped for an error never reported
            raise InternalError(f"{self._silenced} check(s) were skipped, but no error was reported")
        if self.errors:
            # In source order (the checker works in phases: declarations, signatures, bodies).
            self.errors.sort(key=lambda d: (d.span.file, d.span.line, d.span.col) if d.span else ("", 0, 0))
            raise LinnetError(self.errors, self.program.sources)
        return CheckedProgram(self.program, self.blocks, self.functions, self.consts, self.types, self.calls,
                              self.names)

    def _check_sub_cycles(self) -> None:
        """A block may not contain itself through its subs: its parameter tree would be infinite."""
        edges = {key: [(sub.element.block if isinstance(sub, SubArrayT) else sub.block, span)
                       for sub, span in block.subs.values()] for key, block in self.blocks.items()}
        for key, path in _cycles(edges):
            names = " -> ".join(k.split("::")[-1] for k in path)
            self.errors.append(Diagnostic(
                "E0211", f"block `{key.split('::')[-1]}` contains itself through its subs: {names}", path.span,
                (Note("a block's sub-blocks must form a tree; this one would never end"),)))

    def _check_call_cycles(self) -> None:
        """Calls are inlined when a model is built, so a function may not (indirectly) call itself."""
        for key, path in _cycles(self._call_edges):
            names = " -> ".join(k.split("::")[-1] for k in path)
            self.errors.append(Diagnostic(
                "E0317", f"`{key.split('::')[-1]}` calls itself: {names}", path.span,
                (Note("Linnet inlines every call, so recursion would never end"),)))

    def _guard(self, step, *args) -> bool:
        """Run one check; a failure is recorded and the rest goes on. True when it passed."""
        if args and args[0] is None:
            return False
        try:
            step(*args)
        except _Failure as failure:
            self._record(failure)
            return False
        return True

    def _record(self, failure: _Failure) -> None:
        if failure.diagnostic is None:
            self._silenced += 1
        else:
            self.errors.append(failure.diagnostic)

    @staticmethod
    def _key(module: ModuleInfo, name: str) -> str:
        return f"{module.name}::{name}"

    # ----------------------------------------------------------------- headers
    def _collect_headers(self, module: ModuleInfo) -> None:
        for item in module.tree.items:
            if isinstance(item, ast.Const):
                self._guard(self._check_const, module, item)
            elif isinstance(item, ast.Block):
                if not self._guard(self._collect_block_header, module, item):
                    self._broken.add(self._key(module, item.name))
            elif isinstance(item, ast.Function):
                if not self._guard(self._collect_free_fn, module, item):
                    self._broken.add(self._key(module, item.name))

    def _check_const(self, module: ModuleInfo, node: ast.Const) -> None:
        dtype = node.type.name
        if dtype not in ALL_DTYPES:
            _fail("E0203", f"unknown dtype `{dtype}` for constant `{node.name}`", node.type.span,
                  Note(f"dtypes are {', '.join(ALL_DTYPES)}"))
        value = node.value
        if isinstance(value, ast.Unary):
            _fail("E0331", "a constant must be a number literal", value.span)
        if isinstance(value, ast.FloatLit) and not is_float(dtype):
            _fail("E0330", f"constant `{node.name}` is declared {dtype} but its value {value.text} is a float",
                  value.span)
        low, high = number_range(dtype)
        if isinstance(value, ast.IntLit) and not low <= value.value <= high:
            shown = value.value if len(str(value.value)) <= 30 else str(value.value)[:12] + "..."
            _fail("E0330", f"constant `{node.name}` is declared {dtype}, which holds [{low:g}, {high:g}], but its "
                  f"value is {shown}", value.span)
        self.consts[self._key(module, node.name)] = (value.value, dtype)

    def _generic_infos(self, params: list[ast.GenericParam], outer: dict[str, GenericInfo]) -> list[GenericInfo]:
        infos: list[GenericInfo] = []
        seen = dict(outer)
        for p in params:
            if p.kind not in GENERIC_KINDS:
                _fail("E0204", f"unknown generic kind `{p.kind}` for `{p.name}`", p.span,
                      Note(f"kinds are {', '.join(GENERIC_KINDS)}"))
            if p.variadic != (p.kind == SHAPE_KIND):
                _fail("E0204", f"`{p.name}`: a `Shape` generic is written `*{p.name}: Shape`, and only it is variadic",
                      p.span)
            if p.name in seen:
                _fail("E0105", f"generic `{p.name}` is declared twice", p.span,
                      Note("first declared here", seen[p.name].span))
            default = self._generic_default(p, seen) if p.default is not None else None
            info = GenericInfo(p.name, p.kind, default, p.span)
            infos.append(info)
            seen[p.name] = info
        return infos

    def _generic_default(self, p: ast.GenericParam, scope: dict[str, GenericInfo]) -> Binding:
        if p.kind in DTYPE_KINDS:
            return self._dtype_arg(p.default, p.kind, scope, f"default of `{p.name}`")
        if p.kind == DIM_KIND:
            return self._dim(p.default, scope)
        _fail("E0204", "a Shape generic cannot have a default", p.span)

    def _collect_block_header(self, module: ModuleInfo, node: ast.Block) -> None:
        generics = self._generic_infos(node.generics, {})
        block = BlockSig(self._key(module, node.name), node.name, node, module, generics)
        self.blocks[block.key] = block
        # Methods first: a bad `where` clause below should not make every call of them an
        # "unknown function" too (the block is marked broken and its methods go unchecked).
        for fn_node in node.functions:
            if not self._guard(self._collect_method, block, fn_node) and fn_node.name not in block.functions:
                self._broken.add(f"{block.key}.{fn_node.name}")
        block.where = [self._where(c, block.scope) for c in node.where]
        for clause in _broadcasts_of(block.where):
            _fail("E0213", f"`{clause}` on block `{block.name}`: a `broadcasts to` clause belongs on the "
                  "function whose parameters it describes", clause.span)
        block.facts = _facts_of(block.where)

    def _collect_method(self, block: BlockSig, node: ast.Function) -> None:
        if node.name in block.functions:
            _fail("E0105", f"`{node.name}` is defined twice in block `{block.name}`", node.name_span,
                  Note("first defined here", block.functions[node.name].node.name_span))
        generics = self._generic_infos(node.generics, block.scope)
        fn = FnSig(f"{block.key}.{node.name}", node.name, node, block.module, block, generics,
                   {**block.scope, **{g.name: g for g in generics}})
        block.functions[node.name] = fn
        self.functions[fn.key] = fn

    def _collect_free_fn(self, module: ModuleInfo, node: ast.Function) -> None:
        if node.is_entry:
            _fail("E0206", "`entry` functions belong to a block; use `fn` at module level", node.name_span)
        generics = self._generic_infos(node.generics, {})
        fn = FnSig(self._key(module, node.name), node.name, node, module, None, generics,
                   {g.name: g for g in generics})
        self.functions[fn.key] = fn

    # ------------------------------------------------------------ block members
    def _check_block_members(self, block: BlockSig) -> None:
        scope = block.scope
        for decl in block.node.params:
            if not self._guard(self._check_param_decl, block, decl, scope) and decl.name not in block.params:
                self._broken.add(f"{block.key}#{decl.name}")
        for decl in block.node.subs:
            if not self._guard(self._check_sub_decl, block, decl, scope) and decl.name not in block.subs:
                self._broken.add(f"{block.key}#{decl.name}")

    def _check_member_name(self, block: BlockSig, name: str, span: Span) -> None:
        if name in block.params or name in block.subs:
            first = (block.params.get(name) or block.subs[name])[1]
            _fail("E0105", f"`{name}` is declared twice in block `{block.name}`", span,
                  Note("first declared here", first))

    def _check_param_decl(self, block: BlockSig, decl: ast.ParamDecl, scope) -> None:
        self._check_member_name(block, decl.name, decl.span)
        t = self._type(decl.type, scope)
        if not isinstance(t, TensorT) or t.rank is None:
            _fail("E0207", f"param `{decl.name}` must be a tensor of fixed rank, found {t}", decl.type.span)
        block.params[decl.name] = (t, decl.span)

    def _check_sub_decl(self, block: BlockSig, decl: ast.SubDecl, scope) -> None:
        self._check_member_name(block, decl.name, decl.span)
        ref = decl.type.element if isinstance(decl.type, ast.SubArrayType) else decl.type
        element = self._instantiate_ref(block, ref, decl.name, scope)
        if isinstance(decl.type, ast.SubArrayType):
            block.subs[decl.name] = (SubArrayT(element, self._dim(decl.type.count, scope)), decl.span)
        else:
            block.subs[decl.name] = (element, decl.span)

    def _instantiate_ref(self, block: BlockSig, ref: ast.BlockRef, member: str, scope) -> SubT:
        target = self._lookup_item(block.module, ref.name, ref.span)
        if not isinstance(target, BlockSig):
            _fail("E0208", f"`{ref.name}` is not a block; a `sub` needs a block such as Linear<D, D, T>", ref.span)
        env = self._bind_explicit(target.generics, ref.args, scope, ref.span, f"block `{target.name}`",
                                  target.node.name_span)
        for g in target.generics:
            if g.name not in env and g.default is not None:
                env[g.name] = g.default
        missing = [g.name for g in target.generics if g.name not in env]
        if missing:
            _fail("E0304", f"block `{target.name}` needs {len(target.generics)} generic arguments, "
                  f"missing {', '.join(missing)}", ref.span,
                  Note(f"`{target.name}` is declared here", target.node.name_span))
        self._discharge(target.where, env, block.facts, ref.span, f"instantiating `{target.name}`")
        return SubT(target.key, tuple(env.items()), member)

    # -------------------------------------------------------------- signatures
    def _check_signature(self, fn: FnSig) -> None:
        if fn.block is not None and fn.block.key in self._broken:
            _silent()  # the block's header failed: its facts are unknown, so skip its functions
        node = fn.node
        fn.where = [self._where(c, fn.scope) for c in node.where]
        block_clauses = fn.block.where if fn.block else []
        fn.facts = _facts_of(block_clauses + fn.where)
        seen: dict[str, Span] = {}
        for p in node.params:
            if p.name in seen:
                _fail("E0105", f"parameter `{p.name}` is declared twice", p.span, Note("first here", seen[p.name]))
            seen[p.name] = p.span
            fn.params.append((p.name, self._type(p.type, fn.scope), p.span))
            if p.default is not None:
                fn.defaults[p.name] = self._param_default(fn, p, fn.params[-1][1])
        if node.result is None:
            _fail("E0209", f"function `{fn.name}` must declare its result type with `-> ...`", node.name_span)
        fn.result = self._type(node.result, fn.scope)
        if fn.is_entry:
            self._check_entry_signature(fn)
        fn.checked = True

    def _param_default(self, fn: FnSig, p: ast.Param, t: Type) -> int:
        """`= zeros` / `= ones`: only on entries (what Python callers may omit), only on tensors."""
        if p.default not in PARAM_DEFAULTS:
            _fail("E0212", f"unknown default `{p.default}` for parameter `{p.name}`", p.span,
                  Note("a parameter may default to `zeros` or `ones` (a tensor of its type filled with 0 or 1)"))
        if not fn.is_entry:
            _fail("E0212", f"parameter `{p.name}` of `{fn.name}` has a default, but only entry parameters may",
                  p.span, Note("calls inside Linnet pass every argument; defaults are for the model's users"))
        if not isinstance(t, TensorT):
            _fail("E0212", f"parameter `{p.name}`: `= {p.default}` needs a tensor type, found {t}", p.span)
        return PARAM_DEFAULTS[p.default]

    def _check_entry_signature(self, fn: FnSig) -> None:
        """Entries are what users call: inputs of fixed rank whose dims name every free dim."""
        for g in fn.generics:
            if g.kind != DIM_KIND:
                _fail("E0210", f"entry `{fn.name}` may only have Dim generics (read from its inputs); "
                      f"`{g.name}` is {g.kind}", g.span)
        readable: set[str] = set()
        for name, t, span in fn.params:
            if not isinstance(t, TensorT) or t.rank is None:
                _fail("E0210", f"entry parameter `{name}` must be a tensor of fixed rank, found {t}", span)
            if name in fn.defaults:
                continue  # a left-out input cannot tell its dims
            readable |= {symbol_name(d) for d in t.dims if isinstance(d, DimExpr) and symbol_name(d)}
        for g in fn.generics:
            if g.name not in readable:
                _fail("E0210", f"entry `{fn.name}`: dim `{g.name}` must be the whole of some input axis "
                      "without a default, so it can be read from the inputs", g.span)

    # ------------------------------------------------------------------ bodies
    def _check_body(self, fn: FnSig) -> None:
        ctx = _FnContext(fn, fn.facts, [{}])
        self.facts = fn.facts
        self.broadcast_facts = _broadcasts_of((fn.block.where if fn.block else []) + fn.where)
        for name, t, span in fn.params:
            ctx.bind(name, _Local(t, False, span, "param"))
        returned = self._check_stmts(fn.node.body, ctx)
        if not returned and not any(d.span and d.span.file == fn.node.span.file and
                                    _inside(d.span, fn.node.span) for d in self.errors):
            self.errors.append(Diagnostic("E0311", f"function `{fn.name}` does not end with `return`",
                                          fn.node.name_span,
                                          (Note(f"it must return {fn.result}", fn.node.result.span),)))

    def _check_stmts(self, stmts: list[ast.Stmt], ctx: _FnContext) -> bool:
        """Check a statement list; True when it always returns."""
        for i, stmt in enumerate(stmts):
            try:
                returned = self._check_stmt(stmt, ctx)
            except _Failure as failure:
                self._record(failure)
                self._poison(stmt, ctx)
                returned = isinstance(stmt, ast.Return)
            if returned:
                if i + 1 < len(stmts):
                    self.errors.append(Diagnostic("E0312", "unreachable statement after `return`",
                                                  stmts[i + 1].span))
                return True
        return False

    def _poison(self, stmt: ast.Stmt, ctx: _FnContext) -> None:
        if isinstance(stmt, ast.Let):
            ctx.bind(stmt.name, _Local(ErrorT(), stmt.mutable, stmt.name_span))
        elif isinstance(stmt, ast.StaticFor) and stmt.collect is not None:
            ctx.bind(stmt.collect.into, _Local(ErrorT(), False, stmt.collect.into_span))

    def _check_stmt(self, stmt: ast.Stmt, ctx: _FnContext) -> bool:
        return getattr(self, f"_check_{type(stmt).__name__.lower()}")(stmt, ctx)

    def _check_let(self, stmt: ast.Let, ctx: _FnContext) -> bool:
        if ctx.lookup(stmt.name) is not None and stmt.name in ctx.locals[-1]:
            _fail("E0105", f"`{stmt.name}` is already bound in this scope", stmt.name_span,
                  Note("first bound here", ctx.lookup(stmt.name).span))
        t = self._expr(stmt.value, ctx)
        if stmt.annotation is not None:
            declared = self._type(stmt.annotation, ctx.sig.scope)
            self._expect_same(declared, t, ctx, stmt.value.span, f"the annotation of `{stmt.name}`",
                              stmt.annotation.span)
            t = declared
        if isinstance(t, (SubT, SubArrayT, NoneT, SomeT)):
            # Options exist only as parameters, decided per call; a local cannot hold one
            # (`if let` would then have nothing to test).
            _fail("E0332", f"`{stmt.name}` cannot hold {t}; locals hold tensors, dims and lists", stmt.value.span)
        ctx.bind(stmt.name, _Local(t, stmt.mutable, stmt.name_span, "var" if stmt.mutable else "let"))
        return False

    def _check_assign(self, stmt: ast.Assign, ctx: _FnContext) -> bool:
        local = ctx.lookup(stmt.name)
        block = ctx.sig.block
        if local is None and block is not None and (stmt.name in block.params or stmt.name in block.subs):
            what = "param" if stmt.name in block.params else "sub"
            _fail("E0313", f"cannot assign to `{stmt.name}`: it is a {what} of block `{block.name}`, "
                  "which functions only read", stmt.name_span,
                  Note("declared here", (block.params.get(stmt.name) or block.subs[stmt.name])[1]))
        if local is None:
            _fail("E0201", f"cannot assign to unknown variable `{stmt.name}`", stmt.name_span,
                  Note("declare it first with `var`"))
        if not local.mutable:
            # Say what the name is: a parameter or a loop variable was never a `let`.
            what = {"param": "it is a parameter of the function",
                    "loop": "it is the variable of a `static for`",
                    "some": "it is bound by `if let some(...)`"}.get(local.kind, "it was bound with `let`")
            _fail("E0313", f"cannot assign to `{stmt.name}`: {what}", stmt.name_span,
                  Note("declare it with `var` to reassign it" if local.kind == "let"
                       else "only names declared with `var` can be reassigned", local.span))
        t = self._expr(stmt.value, ctx)
        self._expect_same(local.type, t, ctx, stmt.value.span, f"variable `{stmt.name}`", local.span)
        return False

    def _check_return(self, stmt: ast.Return, ctx: _FnContext) -> bool:
        t = self._expr(stmt.value, ctx)
        self._expect_same(ctx.sig.result, t, ctx, stmt.value.span, f"the result of `{ctx.sig.name}`",
                          ctx.sig.node.result.span)
        return True

    def _check_staticfor(self, stmt: ast.StaticFor, ctx: _FnContext) -> bool:
        collect = stmt.collect
        if collect is not None and collect.into in ctx.locals[-1]:
            _fail("E0105", f"`{collect.into}` is already bound in this scope", collect.into_span,
                  Note("first bound here", ctx.locals[-1][collect.into].span))
        block = ctx.sig.block
        member = block.subs.get(stmt.iterable) if block else None
        if member is None and block is not None and f"{block.key}#{stmt.iterable}" in self._broken:
            _silent()
        if member is None or not isinstance(member[0], SubArrayT):
            _fail("E0314", f"`static for` runs over a sub-block array of this block; `{stmt.iterable}` is not one",
                  stmt.iterable_span)
        # What is collected is looked up before the body's scope opens: a var of the code
        # around the loop, whose type every pass keeps.
        collected: Type = ErrorT()
        if collect is not None:
            try:
                collected = self._collected_type(stmt, ctx)
            except _Failure as failure:  # reported; the body is still checked
                self._record(failure)
        element = member[0].element
        ctx.locals.append({stmt.var: _Local(SubT(element.block, element.bindings, stmt.var), False,
                                            stmt.var_span or stmt.span, "loop")})
        try:
            self._check_stmts(stmt.body, ctx)
        finally:
            ctx.locals.pop()
        # Any `return` in the body, also one inside an `if let` that returns on one branch only,
        # and pointed at itself rather than at the whole loop.
        ret = _first_return(stmt.body)
        if ret is not None:
            self.errors.append(Diagnostic(
                "E0315", "`return` inside `static for` is not allowed", ret.span,
                (Note("the loop is unrolled over the sub-block array; return after it", stmt.iterable_span),)))
        if collect is not None:
            self._bind_collection(stmt, member[0].count, collected, ctx)
        return False

    def _collected_type(self, stmt: ast.StaticFor, ctx: _FnContext) -> Type:
        """The type of the var that `collect x` names: a tensor `var` declared before the loop."""
        name = stmt.collect.var
        local = ctx.lookup(name.name)
        how = "`collect` takes a `var` declared before the loop, which the loop reassigns"
        if local is None and name.name == stmt.var:
            _fail("E0318", f"`collect {name.name}`: `{name.name}` is this loop's sub-block, not a value",
                  name.span, Note(how))
        if local is None:
            inner = _declared_in(stmt.body, name.name)
            if inner is not None:
                _fail("E0318", f"`collect {name.name}`: `{name.name}` is declared inside the loop, so it does not "
                      "exist before the first pass", name.span, Note("declared here", inner), Note(how))
            self._check_name_expr(name, ctx)  # an unknown name fails here, with a suggestion
            block = ctx.sig.block
            what = ("a param of block" if block and name.name in block.params else
                    "a sub-block of block" if block and name.name in block.subs else None)
            what = f"{what} `{block.name}`" if what else "not a local variable"
            _fail("E0318", f"`collect {name.name}`: `{name.name}` is {what}", name.span, Note(how))
        if isinstance(local.type, ErrorT):
            _silent()
        if not local.mutable:
            what = {"param": "a parameter of the function", "loop": "the variable of a `static for`",
                    "some": "bound by `if let some(...)`"}.get(local.kind, "bound with `let`")
            _fail("E0318", f"`collect {name.name}`: `{name.name}` is {what}, so it would be the same value "
                  "in every pass", name.span, Note("declared here", local.span), Note(how))
        t = local.type
        if not isinstance(t, TensorT):
            _fail("E0318", f"`collect {name.name}`: only tensors are collected, and `{name.name}` is {t}",
                  name.span, Note("declared here", local.span))
        if t.weak:
            _fail("E0318", f"`collect {name.name}`: `{name.name}` is a literal scalar without a dtype of its own",
                  name.span, Note("declared here", local.span),
                  Note(f"give it one where it is declared, e.g. `var {name.name} = cast<f32>(...)`"))
        self.names[id(name)] = NameInfo("local", name.name)
        self.types[id(name)] = t
        return t

    def _bind_collection(self, stmt: ast.StaticFor, count: DimExpr, collected: Type, ctx: _FnContext) -> None:
        """Bind `let into = ... collect x`: x before the loop and after each of `count` passes."""
        collect = stmt.collect
        t: Type = ErrorT() if isinstance(collected, ErrorT) else TensorT((count + const(1),) + collected.dims,
                                                                          collected.dtype)
        if collect.annotation is not None:
            declared = self._type(collect.annotation, ctx.sig.scope)
            end = collect.var.span
            header = Span(end.file, stmt.span.line, stmt.span.col, end.end_line, end.end_col)  # `let ... collect x`
            ctx.bind(collect.into, _Local(declared, False, collect.into_span))
            reason = self._mismatch(declared, t, ctx.facts)
            if reason:
                x = collect.var.name
                _fail("E0307", f"the annotation of `{collect.into}` is {declared}, found {t}", header, Note(reason),
                      Note(f"`collect {x}` gathers `{x}` as the loop starts and after each of its {count} passes: "
                           f"{count + const(1)} values"),
                      Note("declared here", collect.annotation.span))
            return
        ctx.bind(collect.into, _Local(t, False, collect.into_span))

    def _check_ifsome(self, stmt: ast.IfSome, ctx: _FnContext) -> bool:
        t = self._expr(stmt.option, ctx)
        if isinstance(t, ErrorT):
            t = OptionT(ErrorT())  # already reported; still check both branches
        if not isinstance(t, OptionT):
            _fail("E0316", f"`if let some(...)` needs an Option, but `{stmt.option.name}` is {t}", stmt.option.span)
        ctx.locals.append({stmt.binding: _Local(t.inner, False, stmt.binding_span or stmt.span, "some")})
        try:
            then_returns = self._check_stmts(stmt.then_body, ctx)
        finally:
            ctx.locals.pop()
        ctx.locals.append({})
        try:
            else_returns = self._check_stmts(stmt.else_body, ctx)
        finally:
            ctx.locals.pop()
        return then_returns and else_returns

    # -------------------------------------------------------------- expressions
    def _expr(self, node: ast.Expr, ctx: _FnContext) -> Type:
        t = getattr(self, f"_check_{type(node).__name__.lower()}_expr")(node, ctx)
        self.types[id(node)] = t
        return t

    def _check_intlit_expr(self, node: ast.IntLit, ctx) -> Type:
        return DimT(const(node.value))

    def _check_floatlit_expr(self, node: ast.FloatLit, ctx) -> Type:
        return scalar("f32", weak=True)

    def _check_nonelit_expr(self, node: ast.NoneLit, ctx) -> Type:
        return NoneT()

    def _check_listlit_expr(self, node: ast.ListLit, ctx) -> Type:
        items = []
        for item in node.items:
            t = self._expr(item, ctx)
            if isinstance(t, ErrorT):
                return t
            if not isinstance(t, DimT):
                _fail("E0333", f"list literals hold integers and dims (shapes, permutations); found {t}", item.span)
            items.append(t.expr)
        return ListT(tuple(items))

    def _check_name_expr(self, node: ast.Name, ctx: _FnContext) -> Type:
        local = ctx.lookup(node.name)
        if local is not None:
            self.names[id(node)] = NameInfo("local", node.name)
            return local.type
        block = ctx.sig.block
        if block is not None and node.name in block.params:
            self.names[id(node)] = NameInfo("param", node.name)
            return block.params[node.name][0]
        if block is not None and node.name in block.subs:
            return block.subs[node.name][0]
        if block is not None and f"{block.key}#{node.name}" in self._broken:
            return ErrorT()  # a member whose declaration failed
        generic = ctx.sig.scope.get(node.name)
        if generic is not None:
            if generic.kind != DIM_KIND:
                _fail("E0334", f"`{node.name}` is a {generic.kind} generic, not a value", node.span)
            self.names[id(node)] = NameInfo("dim", node.name)
            return DimT(sym(node.name))
        item = ctx.sig.module.scope.get(node.name)
        if item is not None and isinstance(item[1], ast.Const):
            key = self._key(item[0], node.name)
            if key not in self.consts:
                return ErrorT()
            value, dtype = self.consts[key]
            self.names[id(node)] = NameInfo("const", key)
            return DimT(const(int(value))) if dtype in DTYPE_KINDS["Int"] else scalar(dtype, weak=True)
        if item is not None:
            # A function or block is in scope but is not a value: say so, rather than calling
            # the name unknown (and then suggesting the very same name).
            kind = "function" if isinstance(item[1], ast.Function) else "block"
            how = f"call it: `{node.name}(...)`" if kind == "function" else \
                f"declare it with `sub name: {node.name}<...>` and call its functions"
            _fail("E0334", f"`{node.name}` is a {kind}, not a value; {how}", node.span,
                  Note(f"`{node.name}` is declared here", item[1].name_span))
        _fail("E0201", f"unknown name `{node.name}`", node.span, *self._suggest(node.name, self._visible(ctx)))

    def _visible(self, ctx: _FnContext) -> list[str]:
        names = [n for scope in ctx.locals for n in scope] + list(ctx.sig.scope) + list(ctx.sig.module.scope)
        if ctx.sig.block:
            names += list(ctx.sig.block.params) + list(ctx.sig.block.subs)
        return names

    @staticmethod
    def _suggest(name: str, candidates: list[str]) -> tuple[Note, ...]:
        close = difflib.get_close_matches(name, candidates, n=1)
        return (Note(f"did you mean `{close[0]}`?"),) if close else ()

    def _check_unary_expr(self, node: ast.Unary, ctx) -> Type:
        t = self._expr(node.operand, ctx)
        if isinstance(t, DimT):
            return DimT(const(0) - t.expr)
        if isinstance(t, (TensorT, ErrorT)):
            return t
        _fail("E0320", f"cannot negate {t}", node.span)

    def _check_binary_expr(self, node: ast.Binary, ctx: _FnContext) -> Type:
        left, right = self._expr(node.left, ctx), self._expr(node.right, ctx)
        if isinstance(left, ErrorT) or isinstance(right, ErrorT):
            return ErrorT()
        if isinstance(left, DimT) and isinstance(right, DimT):
            try:
                return DimT(_OPS_ON_DIMS[node.op](left.expr, right.expr))
            except DimError as exc:
                _fail("E0335", f"invalid dim arithmetic: {exc}", node.span)
        if node.op == "%":
            _fail("E0320", "`%` applies to dims only", node.span)
        a = self._as_tensor(left, node.left.span, node.op)
        b = self._as_tensor(right, node.right.span, node.op)
        return self._broadcast(a, b, node.span)

    def _as_tensor(self, t: Type, span: Span, op: str) -> TensorT:
        if isinstance(t, TensorT):
            return t
        if isinstance(t, DimT) and t.expr.as_int() is not None:
            return scalar(WEAK_INT, weak=True)  # an integer literal: takes the other side's dtype
        if isinstance(t, DimT):
            _fail("E0336", f"the dim `{t.expr}` is not a tensor; use cast<T>({t.expr}) to use it in `{op}`", span)
        _fail("E0320", f"`{op}` needs tensors, found {t}", span)

    def _broadcast(self, a: TensorT, b: TensorT, span: Span) -> TensorT:
        dtype = self._join_dtypes(a, b, span)
        dims = self._broadcast_dims(a, b, span)
        return TensorT(dims, dtype, a.weak and b.weak)

    def _join_dtypes(self, a: TensorT, b: TensorT, span: Span):
        if a.dtype == b.dtype:
            return a.dtype
        if a.weak and weak_fits(a.dtype, b.dtype):
            return b.dtype
        if b.weak and weak_fits(b.dtype, a.dtype):
            return a.dtype
        _fail("E0330", f"dtype mismatch: {a} and {b}", span, Note("convert one side with cast<T>(...)"))

    def _broadcast_dims(self, a: TensorT, b: TensorT, span: Span) -> tuple:
        for clause in self.broadcast_facts:  # `where [*M] broadcasts to [...]` in scope
            if self._same_shape(a.dims, clause.left) and self._same_shape(b.dims, clause.right):
                return b.dims
            if self._same_shape(b.dims, clause.left) and self._same_shape(a.dims, clause.right):
                return a.dims
        xs, ys = list(a.dims), list(b.dims)
        out = []
        while xs and ys:
            x, y = xs[-1], ys[-1]
            if isinstance(x, Variadic) or isinstance(y, Variadic):
                if x == y and len(xs) == len(ys) and all(
                        p == q or (isinstance(p, DimExpr) and isinstance(q, DimExpr) and self.facts.equal(p, q))
                        for p, q in zip(xs, ys)):
                    return tuple(xs) + tuple(reversed(out))
                _fail("E0321", f"cannot broadcast {a} with {b}: `{x}` and `{y}` have no known alignment", span)
            out.append(self._broadcast_dim(x, y, a, b, span))
            xs.pop(), ys.pop()
        return tuple(xs or ys) + tuple(reversed(out))

    def _broadcast_dim(self, x: DimExpr, y: DimExpr, a, b, span) -> DimExpr:
        if self.facts.equal(x, y):
            return x
        if x.as_int() == 1:
            return y
        if y.as_int() == 1:
            return x
        _fail("E0321", f"shape mismatch: cannot broadcast {a} with {b} (dim {x} vs {y})", span,
              Note("shapes broadcast from the right; each pair of dims must be equal or 1"))

    def _same_shape(self, xs: tuple, ys: tuple, facts: Facts | None = None) -> bool:
        facts = facts or self.facts
        return len(xs) == len(ys) and all(
            x == y or (isinstance(x, DimExpr) and isinstance(y, DimExpr) and facts.equal(x, y)) for x, y in zip(xs, ys))

    # facts of the function being checked, for broadcasting and prims
    facts: Facts = Facts()
    broadcast_facts: list = []

    def _check_index_expr(self, node: ast.Index, ctx: _FnContext) -> Type:
        target = self._expr(node.target, ctx)
        if isinstance(target, ErrorT):
            return target
        if not isinstance(target, TensorT) or target.rank is None:
            _fail("E0322", f"only tensors of known rank can be indexed, found {target}", node.target.span)
        if len(node.items) > target.rank:
            _fail("E0322", f"{len(node.items)} indices for {target}, which has rank {target.rank}", node.span)
        dims = []
        for item, dim in zip(node.items, target.dims):
            if isinstance(item, ast.Slice):
                dims.append(self._slice_dim(item, dim, ctx))
            else:
                self._check_index_value(item, dim, ctx)
        dims.extend(target.dims[len(node.items):])
        return TensorT(tuple(dims), target.dtype)

    def _static_dim(self, node: ast.Expr, ctx) -> DimExpr:
        t = self._expr(node, ctx)
        if not isinstance(t, DimT):
            _fail("E0322", f"indices and slice bounds are integers or dims, found {t}", node.span)
        return t.expr

    def _check_index_value(self, node: ast.Expr, dim: DimExpr, ctx) -> None:
        index = self._static_dim(node, ctx)
        value = index.as_int()
        bound = index + dim if value is not None and value < 0 else index
        if ctx.facts.decide(bound, "<", dim) is False or ctx.facts.decide(bound, ">=", const(0)) is False:
            _fail("E0326", f"index {index} is out of bounds for a dim of size {dim}", node.span)

    def _slice_dim(self, node: ast.Slice, dim: DimExpr, ctx) -> DimExpr:
        start = self._static_dim(node.start, ctx) if node.start is not None else const(0)
        stop = self._static_dim(node.stop, ctx) if node.stop is not None else dim
        # A negative literal bound counts from the end, as in indexing: `x[-2:]`, `x[:-1]`.
        # (Without this, `x[-2:]` of a dim 4 had size 6 and `x[:-1]` was rejected.)
        lo = start + dim if (start.as_int() or 0) < 0 else start
        hi = stop + dim if (stop.as_int() or 0) < 0 else stop
        if (ctx.facts.decide(lo, "<", const(0)) or ctx.facts.decide(hi, ">", dim)
                or ctx.facts.decide(lo, ">", hi)):
            written = f"{start if node.start is not None else ''}:{stop if node.stop is not None else ''}"
            _fail("E0326", f"slice {written} does not fit a dim of size {dim}", node.span,
                  Note(f"a slice a:b needs 0 <= a <= b <= {dim} (negative bounds count from the end)"))
        return hi - lo

    # ------------------------------------------------------------------- calls
    def _check_call_expr(self, node: ast.Call, ctx: _FnContext) -> Type:
        if node.name == "some":
            if len(node.args) != 1 or node.generic_args:
                _fail("E0301", "`some` takes exactly one value", node.span)
            inner = self._expr(node.args[0], ctx)
            return inner if isinstance(inner, ErrorT) else SomeT(inner)
        block = ctx.sig.block
        if block is not None and f"{block.key}.{node.name}" in self._broken:
            _silent()  # a sibling whose declaration failed
        if block is not None and node.name in block.functions:
            callee = block.functions[node.name]
            env = {g.name: g.symbol() for g in block.generics}
            return self._call_fn(node, callee, env, ctx, CallInfo("self", callee.key, ()))
        item = ctx.sig.module.scope.get(node.name)
        if item is not None and isinstance(item[1], ast.Function):
            callee = self.functions.get(self._key(item[0], node.name))
            if callee is None:
                return ErrorT()
            return self._call_fn(node, callee, {}, ctx, CallInfo("fn", callee.key, ()))
        if item is not None and isinstance(item[1], ast.Block):
            _fail("E0208", f"`{node.name}` is a block: declare it with `sub name: {node.name}<...>` and call "
                  "its functions", node.name_span, Note(f"`{node.name}` is declared here", item[1].name_span))
        if node.name in PRIMS:
            return self._call_prim(node, ctx)
        candidates = list(PRIMS) + [n for n, (_, i) in ctx.sig.module.scope.items() if isinstance(i, ast.Function)]
        if block is not None:
            candidates += list(block.functions)
        _fail("E0202", f"unknown function `{node.name}`", node.name_span, *self._suggest(node.name, candidates))

    def _check_methodcall_expr(self, node: ast.MethodCall, ctx: _FnContext) -> Type:
        receiver = self._expr(node.receiver, ctx)
        if isinstance(receiver, ErrorT):
            return receiver
        if isinstance(receiver, SubArrayT):
            _fail("E0314", f"`{node.receiver.name}` is an array of sub-blocks; run over it with "
                  f"`static for x in {node.receiver.name} {{ ... }}`", node.receiver.span)
        if not isinstance(receiver, SubT):
            _fail("E0337", f"`{node.receiver.name}` is {receiver}, not a sub-block with functions",
                  node.receiver.span)
        target = self.blocks[receiver.block]
        callee = target.functions.get(node.method)
        if callee is None and f"{target.key}.{node.method}" in self._broken:
            _silent()
        if callee is None:
            _fail("E0202", f"block `{target.name}` has no function `{node.method}`", node.name_span,
                  *(self._suggest(node.method, list(target.functions)) or
                    (Note(f"`{target.name}` has: {', '.join(target.functions) or 'no functions'}",
                          target.node.name_span),)))
        if not callee.node.public and target.module is not ctx.sig.module:
            _fail("E0106", f"`{target.name}.{node.method}` is private to module `{target.module.name}`",
                  node.name_span, Note("declared here without `pub`", callee.node.name_span))
        info = CallInfo("sub", callee.key, (), receiver.path)
        return self._call_fn(node, callee, dict(receiver.bindings), ctx, info)

    def _call_fn(self, node, callee: FnSig, env: dict, ctx: _FnContext, info: CallInfo) -> Type:
        if not callee.checked:  # its signature failed (reported): check the arguments only
            for arg in node.args:
                self._expr(arg, ctx)
            return ErrorT()
        generic_args = getattr(node, "generic_args", [])
        env = dict(env)
        env.update(self._bind_explicit(callee.generics, generic_args, ctx.sig.scope, node.span,
                                       f"`{callee.name}`", callee.node.name_span))
        if len(node.args) != len(callee.params):
            _fail("E0301", f"`{callee.name}` takes {len(callee.params)} argument"
                  f"{'s' if len(callee.params) != 1 else ''}, found {len(node.args)}", node.span,
                  Note(f"declared as {callee.signature()}", callee.node.name_span))
        arg_types = [self._expr(a, ctx) for a in node.args]
        if any(isinstance(t, ErrorT) for t in arg_types):
            return ErrorT()
        self._infer(callee, env, arg_types, node.args, ctx)
        self._fill_defaults(callee, env, node, arg_types)
        try:
            for (name, param_t, _), arg_t, arg in zip(callee.params, arg_types, node.args):
                self._expect_arg(substitute(param_t, env), arg_t, ctx, arg.span, callee, name)
            self._discharge(callee.where, env, ctx.facts, node.span, f"calling `{callee.name}`")
            result = substitute(callee.result, env)
        except DimError as exc:  # the bindings make a dim of the signature divide by 0
            _fail("E0335", f"calling `{callee.name}`: invalid dim arithmetic ({exc})", node.span,
                  Note(f"with {', '.join(f'{k} = {format_binding(v)}' for k, v in env.items())}"),
                  Note(f"`{callee.name}` is declared as {callee.signature()}", callee.node.name_span))
        self._call_edges.setdefault(ctx.sig.key, []).append((callee.key, node.span))
        self.calls[id(node)] = CallInfo(info.kind, info.target, tuple(env.items()), info.receiver)
        return result

    def _fill_defaults(self, callee: FnSig, env: dict, node, arg_types=()) -> None:
        absent_only = _generics_of_absent_options(callee, arg_types)
        for g in callee.generics:
            if g.name in env or (g.default is None and g.name in absent_only):
                continue  # only an Option passed `none` mentions it: there is nothing to infer from
            if g.default is None:
                _fail("E0304", f"cannot infer generic `{g.name}` of `{callee.name}`; pass it explicitly, "
                      f"e.g. {callee.name}<{', '.join(x.name for x in callee.generics)}>(...)", node.span,
                      Note(f"`{g.name}` is declared here", g.span))
            env[g.name] = g.default

    def _call_prim(self, node: ast.Call, ctx: _FnContext) -> Type:
        prim = PRIMS[node.name]
        if len(node.generic_args) != prim.dtype_generics:
            n = prim.dtype_generics
            _fail("E0303", f"`{prim.name}` takes {n} generic argument{'s' if n != 1 else ''}, "
                  f"found {len(node.generic_args)}", node.span, Note(f"signature: {prim.signature}"))
        dtypes = [self._dtype_arg(a, "DType", ctx.sig.scope, f"generic argument of `{prim.name}`")
                  for a in node.generic_args]
        if len(node.args) not in prim.arity:
            plural = "" if prim.arity == (1,) else "s"
            _fail("E0301", f"`{prim.name}` takes {' or '.join(map(str, prim.arity))} argument{plural}, "
                  f"found {len(node.args)}", node.span, Note(f"signature: {prim.signature}"))
        arg_types = [self._expr(a, ctx) for a in node.args]
        if any(isinstance(t, ErrorT) for t in arg_types):
            return ErrorT()
        call = PrimCall(prim.name, dtypes, arg_types, [a.span for a in node.args], node.span, _PrimCtx(self, ctx))
        result = prim.rule(call)
        self.calls[id(node)] = CallInfo("prim", prim.name, tuple((f"#{i}", d) for i, d in enumerate(dtypes)))
        return result

    # ---------------------------------------------------------- generic binding
    def _bind_explicit(self, generics: list[GenericInfo], args: list, scope, span: Span, what: str,
                       decl: Span | None = None) -> dict:
        if len(args) > len(generics):
            n = len(generics)
            # Only the extra arguments are wrong; `decl` points at the declaration for the list.
            shown = ", ".join(("*" if g.kind == SHAPE_KIND else "") + g.name for g in generics)
            _fail("E0303", f"{what} takes {n} generic argument{'s' if n != 1 else ''}, found {len(args)}", span,
                  *((Note(f"declared with <{shown}>" if generics else "declared without generics", decl),)
                    if decl else ()))
        env: dict[str, Binding] = {}
        for g, arg in zip(generics, args):
            if g.is_dtype:
                env[g.name] = self._dtype_arg(arg, g.kind, scope, f"generic `{g.name}` of {what}")
            elif g.kind == DIM_KIND:
                env[g.name] = self._dim(arg, scope)
            else:
                _fail("E0303", f"the Shape generic `*{g.name}` of {what} is inferred, not passed", arg.span)
        return env

    def _dtype_arg(self, node, kind: str, scope, what: str):
        if not isinstance(node, ast.DimName):
            _fail("E0305", f"{what} must be a dtype ({', '.join(DTYPE_KINDS[kind])}), found a dim expression",
                  node.span)
        if node.name in ALL_DTYPES:
            dtype = node.name
        elif node.name in scope and scope[node.name].is_dtype:
            dtype = DTypeVar(node.name, scope[node.name].kind)
        else:
            known = scope.get(node.name)
            found = f"`{node.name}`, a {known.kind} generic" if known else f"`{node.name}`"
            dtypes = ("dtypes" if kind == "DType" else f"{kind} dtypes") + f" are {', '.join(DTYPE_KINDS[kind])}"
            _fail("E0305", f"{what} must be a dtype, found {found}", node.span,
                  *((Note(f"`{node.name}` is declared here", known.span),) if known else ()), Note(dtypes))
        if not dtype_kind_ok(dtype, kind):
            _fail("E0305", f"{what} must be {kind}, found {dtype}", node.span)
        return dtype

    def _infer(self, callee: FnSig, env: dict, arg_types, arg_nodes, ctx) -> None:
        """Bind the callee's remaining generics from the argument types."""
        own = {g.name: g for g in callee.generics}
        # Weak scalars say little about dtypes, so let the real tensors bind first.
        order = sorted(range(len(arg_types)), key=lambda i: getattr(arg_types[i], "weak", False))
        for i in order:
            self._unify(callee.params[i][1], arg_types[i], own, env, arg_nodes[i].span, callee)

    def _unify(self, pattern: Type, actual: Type, own, env, span, callee) -> None:
        if isinstance(pattern, OptionT):
            if isinstance(actual, SomeT):
                self._unify(pattern.inner, actual.inner, own, env, span, callee)
            return
        if not isinstance(pattern, TensorT) or not isinstance(actual, TensorT):
            return
        if isinstance(pattern.dtype, DTypeVar) and pattern.dtype.name in own and pattern.dtype.name not in env:
            if not actual.weak:
                # An inferred dtype must fit the generic's kind, as an explicit one must:
                # `gelu_erf` of i32 ids would otherwise check, with T: Float bound to i32.
                g = own[pattern.dtype.name]
                if not dtype_kind_ok(actual.dtype, g.kind):
                    _fail("E0330", f"`{callee.name}` needs its generic `{g.name}` to be {g.kind} "
                          f"({', '.join(DTYPE_KINDS[g.kind])}), but this argument has dtype {actual.dtype}",
                          span, Note(f"`{g.name}: {g.kind}` is declared here", g.span))
                env[pattern.dtype.name] = actual.dtype
        dims = list(pattern.dims)
        variadic_at = next((i for i, d in enumerate(dims) if isinstance(d, Variadic)), None)
        if variadic_at is None:
            if len(actual.dims) != len(dims) or any(isinstance(d, Variadic) for d in actual.dims):
                return  # the rank mismatch is reported with the full types by _expect_arg
            pairs = list(zip(dims, actual.dims))
        else:
            prefix, suffix = dims[:variadic_at], dims[variadic_at + 1:]
            if len(actual.dims) < len(prefix) + len(suffix):
                return
            middle = tuple(actual.dims[len(prefix):len(actual.dims) - len(suffix)])
            name = dims[variadic_at].name
            if name in own and name not in env:
                env[name] = middle
            pairs = list(zip(prefix, actual.dims[:len(prefix)])) + list(
                zip(suffix, actual.dims[len(actual.dims) - len(suffix):]))
        for p, a in pairs:
            if isinstance(p, DimExpr) and isinstance(a, DimExpr):
                name = symbol_name(p)
                if name is not None and name in own and name not in env:
                    env[name] = a

    def _expect_arg(self, expected: Type, actual: Type, ctx, span: Span, callee: FnSig, param: str) -> None:
        if isinstance(expected, OptionT):
            if isinstance(actual, NoneT):
                return
            if not isinstance(actual, SomeT):
                _fail("E0306", f"argument `{param}` of `{callee.name}` is {expected}; pass some(x) or none, "
                      f"found {actual}", span)
            expected, actual = expected.inner, actual.inner
        reason = self._mismatch(expected, actual, ctx.facts)
        if reason:
            _fail("E0306", f"argument `{param}` of `{callee.name}`: expected {expected}, found {actual}", span,
                  Note(reason), Note(f"`{callee.name}` is declared as {callee.signature()}", callee.node.name_span))

    def _expect_same(self, expected: Type, actual: Type, ctx, span: Span, what: str, decl_span: Span) -> None:
        if isinstance(expected, ErrorT) or isinstance(actual, ErrorT):
            return
        reason = self._mismatch(expected, actual, ctx.facts)
        if reason:
            _fail("E0307", f"{what} is {expected}, found {actual}", span, Note(reason),
                  Note("declared here", decl_span))

    def _mismatch(self, expected: Type, actual: Type, facts: Facts) -> str | None:
        """Why `actual` does not fit `expected`, or None when it does."""
        if isinstance(expected, ErrorT) or isinstance(actual, ErrorT):
            return None
        if isinstance(expected, TensorT) and isinstance(actual, TensorT):
            if expected.dtype != actual.dtype and not (actual.weak and weak_fits(actual.dtype, expected.dtype)):
                return f"dtype {actual.dtype} is not {expected.dtype}"
            if actual.weak and not actual.dims:
                return None if not expected.dims else f"a scalar is not {expected}"
            if len(expected.dims) != len(actual.dims):
                return f"rank {len(actual.dims)} is not {len(expected.dims)}"
            for i, (e, a) in enumerate(zip(expected.dims, actual.dims)):
                if isinstance(e, Variadic) or isinstance(a, Variadic):
                    if e != a:
                        return f"axis {i}: {a} is not {e}"
                elif not facts.equal(e, a):
                    reason = f"axis {i}: {a} is not {e}"
                    if e.free_symbols() | a.free_symbols():
                        hints = _divisibility_hints(e, a)
                        # `Heads * (D / Heads)` is `D` exactly when Heads divides D: say so.
                        tail = f"; `where {', '.join(hints)}` would prove it" if hints else ""
                        reason += f" (no `where` clause proves {a} == {e}{tail})"
                    return reason
            return None
        if isinstance(expected, DimT) and isinstance(actual, DimT):
            return None if facts.equal(expected.expr, actual.expr) else f"{actual.expr} is not {expected.expr}"
        if type(expected) is type(actual) and expected == actual:
            return None
        if isinstance(expected, TensorT) and isinstance(actual, DimT):
            return "a dim is not a tensor; use cast<T>(...)"
        return f"{actual} is not {expected}"

    def _discharge(self, clauses: list[WhereClause], env, facts: Facts, span: Span, what: str) -> None:
        """Prove a callee's `where` clauses, bound by `env`, from the caller's facts."""
        for clause in clauses:
            if isinstance(clause, BroadcastClause):
                self._discharge_broadcast(clause, env, facts, span, what)
                continue
            values = _describe_bindings(clause, env)
            try:
                bound = clause.substitute(env)
            except DimError as exc:  # e.g. `D % H == 0` with H bound to 0
                _fail("E0401", f"{what}: where clause `{_clause_text(clause)}` has no value ({exc})", span,
                      Note(f"required here{values}", clause.span))
            verdict = facts.decide(bound.left, bound.op, bound.right)
            if verdict:
                continue
            if verdict is False:
                _fail("E0401", f"{what}: where clause `{_clause_text(clause)}` is violated ({bound} is false)",
                      span, Note(f"required here{values}", clause.span))
            _fail("E0402", f"{what}: cannot prove `{bound}`", span,
                  Note(f"required by this where clause{values}", clause.span),
                  Note("add it (or something that implies it) to the caller's `where` clauses"))

    def _discharge_broadcast(self, clause: BroadcastClause, env, facts: Facts, span: Span, what: str) -> None:
        """Prove that the bound left shape broadcasts to exactly the bound right shape."""
        left, right = substitute_dims(clause.left, env), substitute_dims(clause.right, env)
        unbound = {d.name for d in clause.left + clause.right if isinstance(d, Variadic)} - set(env)
        if unbound:  # only an absent Option argument leaves a shape unbound: nothing to broadcast
            return
        shown = f"[{', '.join(map(_shape_item, left))}] broadcasts to [{', '.join(map(_shape_item, right))}]"
        for known in self.broadcast_facts:  # the caller's own clause, passed on
            if self._same_shape(left, known.left, facts) and self._same_shape(right, known.right, facts):
                return
        if self._same_shape(left, right, facts):
            return
        note = Note(f"required by this where clause (`{clause}`)", clause.span)
        if any(isinstance(d, Variadic) for d in left + right) or len(left) > len(right):
            code = "E0401" if len(left) > len(right) and not any(isinstance(d, Variadic) for d in left) else "E0402"
            verdict = "is violated" if code == "E0401" else "cannot be proven"
            _fail(code, f"{what}: `{shown}` {verdict}", span, note,
                  Note("shapes broadcast from the right: each dim of the left shape must equal the right's or be 1"))
        for x, y in zip(reversed(left), reversed(right)):
            if x.as_int() == 1 or facts.equal(x, y):
                continue
            if facts.decide(x, "==", y) is False:
                _fail("E0401", f"{what}: `{shown}` is violated: dim {x} is neither 1 nor {y}", span, note)
            _fail("E0402", f"{what}: cannot prove `{shown}`: dim {x} vs {y}", span, note,
                  Note("add it (or something that implies it) to the caller's `where` clauses"))

    # -------------------------------------------------------------------- types
    def _shape(self, items: list, scope) -> tuple:
        dims = tuple(Variadic(self._variadic_generic(d, scope)) if isinstance(d, ast.Variadic)
                     else self._dim(d, scope) for d in items)
        return dims

    def _variadic_generic(self, d: ast.Variadic, scope) -> str:
        g = scope.get(d.name)
        if g is None or g.kind != SHAPE_KIND:
            _fail("E0205", f"`*{d.name}` needs a generic `*{d.name}: Shape`", d.span)
        return d.name

    def _type(self, node: ast.TypeNode, scope) -> Type:
        if isinstance(node, ast.OptionTypeNode):
            return OptionT(self._type(node.inner, scope))
        if isinstance(node, ast.NamedTypeNode):
            return scalar(self._dtype_name(node, scope))
        dims = []
        variadics = 0
        for d in node.dims:
            if isinstance(d, ast.Variadic):
                g = scope.get(d.name)
                if g is None or g.kind != SHAPE_KIND:
                    _fail("E0205", f"`*{d.name}` needs a generic `*{d.name}: Shape`", d.span)
                variadics += 1
                dims.append(Variadic(d.name))
            else:
                dims.append(self._dim(d, scope))
        if variadics > 1:
            _fail("E0205", "a tensor type may hold at most one `*Shape`", node.span)
        return TensorT(tuple(dims), self._dtype_name(node.dtype, scope))

    def _dtype_name(self, node: ast.NamedTypeNode, scope):
        if node.name in ALL_DTYPES:
            return node.name
        g = scope.get(node.name)
        if g is not None and g.is_dtype:
            return DTypeVar(g.name, g.kind)
        if node.name == "Tensor":
            _fail("E0203", "`Tensor` needs dims and a dtype: Tensor[B, S; f32]", node.span)
        _fail("E0203", f"unknown dtype `{node.name}`", node.span,
              *self._suggest(node.name, list(ALL_DTYPES) + [n for n, g in scope.items() if g.is_dtype]),
              Note(f"dtypes are {', '.join(ALL_DTYPES)}, or a generic declared `T: Float`"))

    def _dim(self, node: ast.DimNode, scope) -> DimExpr:
        if isinstance(node, ast.DimInt):
            return const(node.value)
        if isinstance(node, ast.DimName):
            g = scope.get(node.name)
            if g is None:
                _fail("E0201", f"unknown dim `{node.name}`", node.span,
                      *self._suggest(node.name, [n for n, i in scope.items() if i.kind == DIM_KIND]),
                      Note("dims are generics declared `Name: Dim`"))
            if g.kind != DIM_KIND:
                _fail("E0205", f"`{node.name}` is a {g.kind} generic, not a Dim", node.span)
            return sym(node.name)
        left, right = self._dim(node.left, scope), self._dim(node.right, scope)
        try:
            return _OPS_ON_DIMS[node.op](left, right)
        except DimError as exc:
            _fail("E0335", f"invalid dim expression: {exc}", node.span)

    def _where(self, node, scope) -> WhereClause | BroadcastClause:
        if isinstance(node, ast.BroadcastConstraint):
            left, right = self._shape(node.left, scope), self._shape(node.right, scope)
            if sum(isinstance(d, Variadic) for d in left) > 1 or sum(isinstance(d, Variadic) for d in right) > 1:
                _fail("E0205", "a shape may hold at most one `*Shape`", node.span)
            return BroadcastClause(left, right, node.span)
        return WhereClause(self._dim(node.left, scope), node.op, self._dim(node.right, scope), node.span)

    def _lookup_item(self, module: ModuleInfo, name: str, span: Span):
        entry = module.scope.get(name)
        if entry is None:
            _fail("E0201", f"unknown name `{name}`", span, *self._suggest(name, list(module.scope)))
        owner, item = entry
        key = self._key(owner, name)
        if isinstance(item, ast.Block):
            if key not in self.blocks:
                _silent()  # its declaration failed, and that was reported
            return self.blocks[key]
        return self.functions.get(key)


class _PrimCtx:
    """What a primitive's rule may ask of the checker."""

    def __init__(self, checker: Checker, ctx: _FnContext):
        self.checker, self.ctx = checker, ctx

    def fail(self, code, message, span, *notes):
        _fail(code, message, span, *notes)

    def broadcast(self, a, b, span):
        return self.checker._broadcast(a, b, span)

    def dims_equal(self, a, b):
        return self.ctx.facts.equal(a, b)

    def decide(self, a, op, b):
        return self.ctx.facts.decide(a, op, b)

    def same_numel(self, a, b):
        return self.ctx.facts.equal(_numel(a), _numel(b))


def symbol_name(e: DimExpr) -> str | None:
    """The name when a dim is a bare generic (`S`), else None (`S + 1`, `D / Heads`, `3`)."""
    free = e.free_symbols()
    if len(free) != 1:
        return None
    name = next(iter(free))
    return name if e == sym(name) else None


def _numel(dims) -> DimExpr:
    total = const(1)
    for d in dims:
        total = total * d
    return total


def _facts_of(clauses: list) -> Facts:
    facts = Facts()
    for c in clauses:
        if isinstance(c, WhereClause):
            facts = facts.with_fact(c.left, c.op, c.right)
    return facts


def _type_generics(t) -> set[str]:
    """Names of the generics a type mentions (dims, `*Shape`s, dtype variables)."""
    if isinstance(t, OptionT):
        return _type_generics(t.inner)
    names: set[str] = set()
    if isinstance(t, TensorT):
        for d in t.dims:
            names |= {d.name} if isinstance(d, Variadic) else set(d.free_symbols())
        if isinstance(t.dtype, DTypeVar):
            names.add(t.dtype.name)
    return names


def _generics_of_absent_options(callee: FnSig, arg_types) -> set[str]:
    """Generics mentioned only by Option parameters whose argument is `none`."""
    absent, present = set(), _type_generics(callee.result)
    for (name, param_t, _), arg_t in zip(callee.params, arg_types):
        (absent if isinstance(param_t, OptionT) and isinstance(arg_t, NoneT) else present).update(
            _type_generics(param_t))
    return absent - present


def _broadcasts_of(clauses: list) -> list[BroadcastClause]:
    return [c for c in clauses if isinstance(c, BroadcastClause)]


def _divisibility_hints(*exprs: DimExpr) -> list[str]:
    """`p % q == 0` for each division `p / q` inside the expressions: the clause that
    usually makes such a dim equal to the undivided one."""
    hints: list[str] = []
    for expr in exprs:
        for atom in expr.atoms():
            if isinstance(atom, FloorDiv):
                hint = f"{mod(atom.num, atom.den)} == 0"
                if hint not in hints:
                    hints.append(hint)
    return hints


def _declared_in(stmts: list[ast.Stmt], name: str) -> Span | None:
    """Where `name` is bound by a `let`/`var` somewhere in `stmts` (nested bodies included)."""
    for stmt in stmts:
        if isinstance(stmt, ast.Let) and stmt.name == name:
            return stmt.name_span
        if isinstance(stmt, ast.StaticFor) and stmt.collect is not None and stmt.collect.into == name:
            return stmt.collect.into_span
        for inner in (getattr(stmt, "body", None), getattr(stmt, "then_body", None),
                      getattr(stmt, "else_body", None)):
            found = _declared_in(inner, name) if inner else None
            if found:
                return found
    return None


def _first_return(stmts: list[ast.Stmt]) -> ast.Return | None:
    for stmt in stmts:
        if isinstance(stmt, ast.Return):
            return stmt
        for inner in (getattr(stmt, "body", None), getattr(stmt, "then_body", None),
                      getattr(stmt, "else_body", None)):
            found = _first_return(inner) if inner else None
            if found:
                return found
    return None


class _CyclePath(list):
    """The keys along a cycle (first == last), with the span of the edge that closes it."""

    span: Span


def _cycles(edges: dict[str, list[tuple[str, Span]]]):
    """One cycle per back edge of a depth-first search, as (first node, path); deterministic."""
    state: dict[str, str] = {}  # "open" while on the DFS path, "done" when finished
    for start in sorted(edges):
        if start in state:
            continue
        state[start] = "open"
        stack: list[tuple[str, int]] = [(start, 0)]
        path: list[str] = [start]
        while stack:
            node, i = stack[-1]
            out = edges.get(node, [])
            if i >= len(out):
                stack.pop()
                path.pop()
                state[node] = "done"
                continue
            stack[-1] = (node, i + 1)
            target, span = out[i]
            if state.get(target) == "open":
                cycle = _CyclePath(path[path.index(target):] + [target])
                cycle.span = span
                yield target, cycle
            elif target not in state:
                state[target] = "open"
                stack.append((target, 0))
                path.append(target)


def _inside(inner: Span, outer: Span) -> bool:
    return (outer.line, outer.col) <= (inner.line, inner.col) <= (outer.end_line, outer.end_col)


def _clause_text(clause: WhereClause) -> str:
    return str(clause)


def _describe_bindings(clause: WhereClause, env) -> str:
    names = sorted(clause.left.free_symbols() | clause.right.free_symbols())
    shown = [f"{n} = {format_binding(env[n])}" for n in names if n in env and str(env[n]) != n]
    return f" with {', '.join(shown)}" if shown else ""


def check(program: Program) -> CheckedProgram:
    return Checker(program).run()
