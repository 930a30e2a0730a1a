"""Declarations: constants, blocks (generics, `where`, params, subs) and function signatures.

Checked in three phases over the whole program, before any body: the headers of every item
(so items may use each other in any order), then each block's members, then each function's
signature. A declaration that fails is recorded in `checker.broken`, and its uses later fail
silently rather than repeat the error.
"""
from __future__ import annotations

from ..front import ast
from .. import codes
from ..diagnostics import Note, Span
from ..dims import DimExpr
from ..front.modules import ModuleInfo
from ..front.templates import is_template
from ..types import (ALL_DTYPES, DIM_KIND, DTYPE_KINDS, GENERIC_KINDS, MEMBER_KINDS, REAL_KIND, SHAPE_KIND, Binding, SubArrayT, SubT, TensorT, TupleT,
                     Type, is_float, number_range)
from .core import Checker, fail, item_key, silent, suggest
from .inference import bind_explicit, symbol_name
from .obligations import broadcasts_of, discharge, facts_of
from .program import PARAM_DEFAULTS, BlockSig, FnSig, GenericInfo
from .type_syntax import resolve_dim, resolve_dtype_arg, resolve_member_arg, resolve_real_arg, resolve_type, resolve_where


def check_declarations(checker: Checker) -> None:
    """Every item's header, then every block's members, then every function's signature."""
    modules = list(checker.program.modules.values())
    for module in modules:
        checker.guard(lambda: _collect_headers(checker, module))
    for module in modules:
        for item in module.tree.items:
            block = checker.blocks.get(item_key(module, item.name)) if isinstance(item, ast.Block) else None
            if block is not None:
                checker.current_block = block.node
                checker.guard(lambda: _check_block_members(checker, block))
    for fn in list(checker.functions.values()):
        checker.current_block = fn.block.node if fn.block else None
        checker.guard(lambda: _check_signature(checker, fn))
    checker.current_block = None


# ----------------------------------------------------------------------- headers


def _collect_headers(checker: Checker, module: ModuleInfo) -> None:
    for item in module.tree.items:
        if isinstance(item, ast.Const):
            checker.guard(lambda: _check_const(checker, module, item))
        elif isinstance(item, ast.Block) and is_template(item):
            continue  # a block template is checked where an alias expands it (front/resolve.py)
        elif isinstance(item, ast.Block):
            checker.current_block = item
            if not checker.guard(lambda: _collect_block_header(checker, module, item)):
                checker.broken.add(item_key(module, item.name))
            checker.current_block = None
        elif isinstance(item, ast.Function):
            if not checker.guard(lambda: _collect_free_fn(checker, module, item)):
                checker.broken.add(item_key(module, item.name))


def _check_const(checker: Checker, module: ModuleInfo, node: ast.Const) -> None:
    dtype = node.type.name
    if dtype not in ALL_DTYPES:
        fail(codes.UNKNOWN_DTYPE, f"unknown dtype `{dtype}` for constant `{node.name}`", node.type.span,
             Note(f"dtypes are {', '.join(ALL_DTYPES)}"))
    value = node.value
    if isinstance(value, ast.Unary):
        fail(codes.CONSTANT_NOT_LITERAL, "a constant must be a number literal", value.span)
    if isinstance(value, ast.FloatLit) and not is_float(dtype):
        fail(codes.DTYPE_MISMATCH, f"constant `{node.name}` is declared {dtype} but its value {value.text} is a float",
             value.span)
    low, high = number_range(dtype)
    if isinstance(value, ast.IntLit) and not low <= value.value <= high:
        shown = value.value if len(str(value.value)) <= 30 else str(value.value)[:12] + "..."
        fail(codes.DTYPE_MISMATCH,
             f"constant `{node.name}` is declared {dtype}, which holds [{low:g}, {high:g}], but its "
             f"value is {shown}", value.span)
    checker.consts[item_key(module, node.name)] = (value.value, dtype)


def _generic_infos(params: list[ast.GenericParam], outer: dict[str, GenericInfo],
                   on_block: bool = False) -> list[GenericInfo]:
    infos: list[GenericInfo] = []
    seen = dict(outer)
    for p in params:
        if p.kind not in GENERIC_KINDS:
            fail(codes.BAD_GENERIC_KIND, f"unknown generic kind `{p.kind}` for `{p.name}`", p.span,
                 Note(f"kinds are {', '.join(GENERIC_KINDS)}"))
        if p.kind == REAL_KIND and not on_block:
            # A function's generics are inferred from its arguments, and no argument type holds
            # a number: a rate a function needs is a value parameter (`rate: T`).
            fail(codes.BAD_GENERIC_KIND, f"`{p.name}`: a Real generic belongs to a block, not a function", p.span,
                 Note("pass the number as a value parameter, e.g. `rate: T`"))
        if p.kind in MEMBER_KINDS and not on_block:
            # Likewise no argument type holds a member: the block that calls the function has it.
            fail(codes.BAD_GENERIC_KIND, f"`{p.name}`: an {p.kind} generic belongs to a block, not a function",
                 p.span, Note(f"declare `{p.name}: {p.kind}` on the block whose functions use it"))
        if p.variadic != (p.kind == SHAPE_KIND):
            fail(codes.BAD_GENERIC_KIND,
                 f"`{p.name}`: a `Shape` generic is written `*{p.name}: Shape`, and only it is variadic",
                 p.span)
        if p.name in seen:
            fail(codes.DUPLICATE_NAME, f"generic `{p.name}` is declared twice", p.span,
                 Note("first declared here", seen[p.name].span))
        default = _generic_default(p, seen) if p.default is not None else None
        info = GenericInfo(p.name, p.kind, default, p.span)
        infos.append(info)
        seen[p.name] = info
    return infos


def _generic_default(p: ast.GenericParam, scope: dict[str, GenericInfo]) -> Binding:
    if p.kind in DTYPE_KINDS:
        return resolve_dtype_arg(p.default, p.kind, scope, f"default of `{p.name}`")
    if p.kind == DIM_KIND:
        return resolve_dim(p.default, scope)
    if p.kind == REAL_KIND:
        return resolve_real_arg(p.default, scope, f"default of `{p.name}`")
    if p.kind in MEMBER_KINDS:
        return resolve_member_arg(p.default, p.kind, scope, f"default of `{p.name}`")
    fail(codes.BAD_GENERIC_KIND, "a Shape generic cannot have a default", p.span)


def _collect_block_header(checker: Checker, module: ModuleInfo, node: ast.Block) -> None:
    generics = _generic_infos(node.generics, {}, on_block=True)
    block = BlockSig(item_key(module, node.name), node.name, node, module, generics)
    checker.blocks[block.key] = block
    # Methods first: a bad `where` clause below should not make every call of them an
    # "unknown function" too (the block is marked broken and its methods go unchecked).
    for fn_node in node.functions:
        if not checker.guard(lambda: _collect_method(checker, block, fn_node)) and fn_node.name not in block.functions:
            checker.broken.add(f"{block.key}.{fn_node.name}")
    block.where = [resolve_where(c, block.scope) for c in node.where]
    for clause in broadcasts_of(block.where):
        fail(codes.BROADCAST_ON_BLOCK, f"`{clause}` on block `{block.name}`: a `broadcasts to` clause belongs on the "
             "function whose parameters it describes", clause.span)
    block.facts = facts_of(block.where)


def _collect_method(checker: Checker, block: BlockSig, node: ast.Function) -> None:
    if node.name in block.functions:
        fail(codes.DUPLICATE_NAME, f"`{node.name}` is defined twice in block `{block.name}`", node.name_span,
             Note("first defined here", block.functions[node.name].node.name_span))
    generics = _generic_infos(node.generics, block.scope)
    fn = FnSig(f"{block.key}.{node.name}", node.name, node, block.module, block, generics,
               {**block.scope, **{g.name: g for g in generics}})
    block.functions[node.name] = fn
    checker.functions[fn.key] = fn


def _collect_free_fn(checker: Checker, module: ModuleInfo, node: ast.Function) -> None:
    if node.is_entry:
        fail(codes.ENTRY_OUTSIDE_BLOCK, "`entry` functions belong to a block; use `fn` at module level", node.name_span)
    generics = _generic_infos(node.generics, {})
    fn = FnSig(item_key(module, node.name), node.name, node, module, None, generics,
               {g.name: g for g in generics})
    checker.functions[fn.key] = fn


# ----------------------------------------------------------------- block members


def _check_block_members(checker: Checker, block: BlockSig) -> None:
    scope = block.scope
    for decl in block.node.params:
        if not checker.guard(lambda: _check_param_decl(block, decl, scope)) and decl.name not in block.params:
            checker.broken.add(f"{block.key}#{decl.name}")
    for decl in block.node.subs:
        if not checker.guard(lambda: _check_sub_decl(checker, block, decl, scope)) and decl.name not in block.subs:
            checker.broken.add(f"{block.key}#{decl.name}")


def _check_member_name(block: BlockSig, name: str, span: Span) -> None:
    if name in block.params or name in block.subs:
        first = (block.params.get(name) or block.subs[name])[1]
        fail(codes.DUPLICATE_NAME, f"`{name}` is declared twice in block `{block.name}`", span,
             Note("first declared here", first))


def _check_param_decl(block: BlockSig, decl: ast.ParamDecl, scope) -> None:
    _check_member_name(block, decl.name, decl.span)
    t = resolve_type(decl.type, scope)
    if not isinstance(t, TensorT) or t.rank is None:
        fail(codes.PARAM_NOT_FIXED_RANK,
             f"param `{decl.name}` must be a tensor of fixed rank, found {t}", decl.type.span)
    block.params[decl.name] = (t, decl.span)


def _check_sub_decl(checker: Checker, block: BlockSig, decl: ast.SubDecl, scope) -> None:
    _check_member_name(block, decl.name, decl.span)
    ref = decl.type.element if isinstance(decl.type, ast.SubArrayType) else decl.type
    element = _instantiate_ref(checker, block, ref, decl.name, scope)
    if isinstance(decl.type, ast.SubArrayType):
        block.subs[decl.name] = (SubArrayT(element, resolve_dim(decl.type.count, scope)), decl.span)
    else:
        block.subs[decl.name] = (element, decl.span)


def _instantiate_ref(checker: Checker, block: BlockSig, ref: ast.BlockRef, member: str, scope) -> SubT:
    target = _lookup_item(checker, block.module, ref.name, ref.span)
    if not isinstance(target, BlockSig):
        fail(codes.NOT_A_BLOCK, f"`{ref.name}` is not a block; a `sub` needs a block such as Linear<D, D, T>", ref.span)
    env = bind_explicit(target.generics, ref.args, scope, ref.span, f"block `{target.name}`", target.node.name_span)
    for g in target.generics:
        if g.name not in env and g.default is not None:
            env[g.name] = g.default
    missing = [g.name for g in target.generics if g.name not in env]
    if missing:
        fail(codes.UNINFERRED_GENERIC, f"block `{target.name}` needs {len(target.generics)} generic arguments, "
             f"missing {', '.join(missing)}", ref.span,
             Note(f"`{target.name}` is declared here", target.node.name_span))
    # A block's `where` holds no `broadcasts to` clause (E0213), so there are none to pass.
    discharge(target.where, env, block.facts, [], ref.span, f"instantiating `{target.name}`")
    return SubT(target.key, tuple(env.items()), member)


def _lookup_item(checker: Checker, module: ModuleInfo, name: str, span: Span):
    entry = module.scope.get(name)
    if entry is None:
        fail(codes.UNKNOWN_NAME, f"unknown name `{name}`", span, *suggest(name, list(module.scope)))
    owner, item = entry
    key = item_key(owner, name)
    if isinstance(item, ast.Block):
        if key not in checker.blocks:
            silent()  # its declaration failed, or it is a template used without an alias: reported
        return checker.blocks[key]
    return checker.functions.get(key)


# -------------------------------------------------------------------- signatures


def _check_signature(checker: Checker, fn: FnSig) -> None:
    if fn.block is not None and fn.block.key in checker.broken:
        silent()  # the block's header failed: its facts are unknown, so skip its functions
    node = fn.node
    fn.where = [resolve_where(c, fn.scope) for c in node.where]
    block_clauses = fn.block.where if fn.block else []
    fn.facts = facts_of(block_clauses + fn.where)
    seen: dict[str, Span] = {}
    for p in node.params:
        if p.name in seen:
            fail(codes.DUPLICATE_NAME,
                 f"parameter `{p.name}` is declared twice", p.span, Note("first here", seen[p.name]))
        seen[p.name] = p.span
        fn.params.append((p.name, resolve_type(p.type, fn.scope), p.span))
        if p.default is not None:
            fn.defaults[p.name] = _param_default(fn, p, fn.params[-1][1])
        if p.default_fn is not None:
            fn.computed[p.name] = p.default_fn
            fn.computed_text[p.name] = p.default_text or p.default_expr.name  # a bare name: `= mask`
    if node.result is None:
        fail(codes.MISSING_RESULT_TYPE,
             f"function `{fn.name}` must declare its result type with `-> ...`", node.name_span)
    fn.result = _result_type(node.result, fn.scope)
    if fn.is_entry:
        _check_entry_signature(fn)
    fn.checked = True


def _result_type(node: ast.TypeNode, scope) -> Type:
    """A function's result: one type, or several (`-> (logits: ..., cache: ...)`), each a tensor
    and, when named, every one named once (the names are what the runtime calls the outputs)."""
    if not isinstance(node, ast.TupleTypeNode):
        return resolve_type(node, scope)
    items = []
    for item in node.items:
        t = resolve_type(item, scope)
        if not isinstance(t, TensorT):
            fail(codes.TUPLE_MISUSE, f"each of several results is a tensor; found {t}", item.span)
        items.append(t)
    named = [n for n in node.names if n is not None]
    if named and len(named) != len(node.names):
        fail(codes.TUPLE_MISUSE, "name every result or none of them", node.span,
             Note(f"named: {', '.join(named)}; {len(node.names) - len(named)} without a name"))
    twice = sorted({n for n in named if named.count(n) > 1})
    if twice:
        fail(codes.DUPLICATE_NAME, f"the result `{twice[0]}` is named twice", node.span)
    return TupleT(tuple(items), tuple(node.names))


def _param_default(fn: FnSig, p: ast.Param, t: Type) -> int:
    """`= zeros` / `= ones`: only on entries (what Python callers may omit), only on tensors."""
    if p.default not in PARAM_DEFAULTS:
        fail(codes.BAD_PARAM_DEFAULT, f"unknown default `{p.default}` for parameter `{p.name}`", p.span,
             Note("a parameter may default to `zeros` or `ones` (a tensor of its type filled with 0 or 1)"))
    if not fn.is_entry:
        fail(codes.BAD_PARAM_DEFAULT,
             f"parameter `{p.name}` of `{fn.name}` has a default, but only entry parameters may",
             p.span, Note("calls inside Linnet pass every argument; defaults are for the model's users"))
    if not isinstance(t, TensorT):
        fail(codes.BAD_PARAM_DEFAULT, f"parameter `{p.name}`: `= {p.default}` needs a tensor type, found {t}", p.span)
    return PARAM_DEFAULTS[p.default]


def _check_entry_signature(fn: FnSig) -> None:
    """Entries are what users call: inputs of fixed rank whose dims name every free dim."""
    for g in fn.generics:
        if g.kind != DIM_KIND:
            fail(codes.BAD_ENTRY_SIGNATURE, f"entry `{fn.name}` may only have Dim generics (read from its inputs); "
                 f"`{g.name}` is {g.kind}", g.span)
    readable: set[str] = set()
    for name, t, span in fn.params:
        if not isinstance(t, TensorT) or t.rank is None:
            fail(codes.BAD_ENTRY_SIGNATURE, f"entry parameter `{name}` must be a tensor of fixed rank, found {t}", span)
        if name in fn.defaults or name in fn.computed:
            continue  # a left-out input cannot tell its dims
        readable |= {symbol_name(d) for d in t.dims if isinstance(d, DimExpr) and symbol_name(d)}
    for g in fn.generics:
        if g.name not in readable:
            fail(codes.BAD_ENTRY_SIGNATURE, f"entry `{fn.name}`: dim `{g.name}` must be the whole of some input axis "
                 "without a default, so it can be read from the inputs", g.span)
