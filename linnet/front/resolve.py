"""Modules and names: which file a `use` means, and which item a name refers to.

`std.*` modules are files under the standard library folder (`std.nn.norm` is
`std/nn/norm.linnet`).  A package (a folder with `linnet.toml`) names its root module
`src/lib.linnet` after the package, and `pkg.sub` is `src/sub.linnet`.  A single file on its
own may `use` sibling files by their stem.  The resolver parses each module once, follows
its `use`s, and builds each module's scope: its own items plus what it imports.
"""
from __future__ import annotations

import dataclasses
import tomllib
from dataclasses import dataclass
from pathlib import Path

from . import ast
from .. import codes
from ..diagnostics import Diagnostic, LinnetError, Note, SourceMap, Span
from .modules import ModuleInfo
from .parser import parse_file
from .templates import Templates, is_template, with_instance_note
from ..paths import std_dir


@dataclass
class Program:
    """Every module reachable from the roots, each with a resolved scope."""

    modules: dict[str, ModuleInfo]
    roots: list[ModuleInfo]
    sources: SourceMap


@dataclass
class _Locator:
    """Maps a module path (`std.nn.norm`, `bert`, `bert.heads`) to a file."""

    package_name: str | None = None
    package_src: Path | None = None
    loose_dir: Path | None = None

    def find(self, parts: list[str]) -> Path | None:
        if parts[0] == "std":
            return _existing(std_dir().joinpath(*parts[1:]).with_suffix(".linnet")) if len(parts) > 1 else None
        if self.package_name is not None and parts[0] == self.package_name and self.package_src:
            if len(parts) == 1:
                return _existing(self.package_src / "lib.linnet")
            return _existing(self.package_src.joinpath(*parts[1:]).with_suffix(".linnet"))
        if self.loose_dir is not None:
            return _existing(self.loose_dir.joinpath(*parts).with_suffix(".linnet"))
        return None


def _existing(path: Path) -> Path | None:
    return path if path.is_file() else None


def display_path(path: Path) -> str:
    """Paths in diagnostics: relative to the working directory when that is shorter."""
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


class Resolver:
    def __init__(self, locator: _Locator, sources: SourceMap | None = None):
        self.locator = locator
        self.sources = sources or SourceMap()
        self.modules: dict[str, ModuleInfo] = {}
        self.errors: list[Diagnostic] = []
        self._loading: list[str] = []  # the chain of modules being loaded, to report cycles
        self._importing: list[Span] = []  # the `use` that is loading each module after the first

    def load(self, name: str | None, path: Path) -> ModuleInfo:
        """Parse and resolve one module; `name=None` takes the declared name (or the stem)."""
        if name in self.modules:
            return self.modules[name]
        tree = parse_file(path, self.sources, display_path(path))
        if name is None:
            name = tree.name or path.stem
        self._check_declared_name(tree, name)
        info = ModuleInfo(name, path, tree)
        self.modules[name] = info
        self._loading.append(name)
        self._build_scope(info)
        self._loading.pop()
        return info

    def _check_declared_name(self, tree: ast.Module, expected: str) -> None:
        if tree.name is not None and tree.name != expected:
            self.errors.append(Diagnostic(
                codes.MODULE_PATH_MISMATCH, f"this file is module `{expected}` but declares `module {tree.name}`",
                tree.name_span))

    def _build_scope(self, info: ModuleInfo) -> None:
        for item in info.tree.items:
            if item.name in info.scope:
                _, first = info.scope[item.name]
                self.errors.append(Diagnostic(
                    codes.DUPLICATE_NAME, f"`{item.name}` is defined twice in module `{info.name}`", item.name_span,
                    (Note("first defined here", first.name_span),)))
                continue
            info.scope[item.name] = (info, item)
        for use in info.tree.uses:
            self._resolve_use(info, use)

    def _resolve_use(self, info: ModuleInfo, use: ast.Use) -> None:
        target_name = ".".join(use.path)
        if target_name in self._loading:
            start = self._loading.index(target_name)
            chain = " -> ".join(self._loading[start:] + [target_name])
            # Each earlier link of the cycle, so the whole loop can be seen.
            notes = tuple(Note(f"`{self._loading[i]}` imports `{self._loading[i + 1]}` here", span)
                          for i, span in zip(range(start, len(self._loading) - 1), self._importing[start:]))
            self.errors.append(Diagnostic(codes.IMPORT_CYCLE, f"import cycle: {chain}", use.path_span, notes))
            return
        path = self.locator.find(use.path)
        if path is None:
            self.errors.append(Diagnostic(codes.UNKNOWN_MODULE, f"unknown module `{target_name}`", use.path_span,
                                          (Note(self._where_modules_come_from()),)))
            return
        self._importing.append(use.path_span)
        try:
            target = self.load(target_name, path)
        finally:
            self._importing.pop()
        for name, span in use.names:
            self._import_name(info, target, name, span)

    def _import_name(self, info: ModuleInfo, target: ModuleInfo, name: str, span: Span) -> None:
        item = target.own_items().get(name)
        if item is None:
            known = ", ".join(sorted(target.own_items())) or "nothing"
            self.errors.append(Diagnostic(codes.UNKNOWN_IMPORT, f"module `{target.name}` has no item `{name}`", span,
                                          (Note(f"`{target.name}` defines: {known}"),)))
            return
        if not item.public:
            self.errors.append(Diagnostic(
                codes.PRIVATE_ITEM, f"`{name}` is private to module `{target.name}`", span,
                (Note("declared here without `pub`", item.name_span),)))
            return
        if name in info.scope:
            _, existing = info.scope[name]
            self.errors.append(Diagnostic(codes.DUPLICATE_NAME, f"`{name}` is imported but already defined here", span,
                                          (Note("the other definition", existing.name_span),)))
            return
        info.scope[name] = (target, item)

    def _where_modules_come_from(self) -> str:
        roots = ["`std.*` from the standard library"]
        if self.locator.package_name:
            roots.append(f"`{self.locator.package_name}.*` from this package's src/")
        if self.locator.loose_dir:
            roots.append("sibling files by name")
        return "modules are " + ", ".join(roots)

    def finish(self, roots: list[ModuleInfo]) -> Program:
        Templates(self.errors, self.modules).expand()
        _Delegations(self.errors).expand(self.modules.values())
        _expand_defaults(self.errors, self.modules.values())
        if self.errors:
            raise LinnetError(self.errors, self.sources)
        return Program(self.modules, roots, self.sources)


def read_package_name(package_dir: Path) -> str:
    """The `[package].name` of a `linnet.toml`, which is also the root module's name."""
    manifest = package_dir / "linnet.toml"
    try:
        data = tomllib.loads(manifest.read_text(encoding="utf-8"))
        name = data["package"]["name"]
    except (OSError, tomllib.TOMLDecodeError, KeyError, TypeError) as exc:
        raise LinnetError(Diagnostic(codes.BAD_PACKAGE_NAME,
                                     f"{display_path(manifest)}: cannot read [package].name ({exc})",
                                     Span(display_path(manifest), 1, 1, 1, 2))) from None
    if not isinstance(name, str) or not name.isidentifier():
        raise LinnetError(Diagnostic(codes.BAD_PACKAGE_NAME,
                                     f"{display_path(manifest)}: [package].name must be an identifier",
                                     Span(display_path(manifest), 1, 1, 1, 2)))
    return name


def load_package(package_dir: Path, source_path: Path | None = None,
                 sources: SourceMap | None = None, *, client: Path | None = None) -> Program:
    """Resolve a package from its folder; the root module is `source_path` or `src/lib.linnet`.

    client: a module file outside the package that imports it (`use bert::{Encoder}`), such
    as the block `linnet.nest.sentence` writes for a sentence-transformers pipeline; it becomes
    the root, under the name its `module` line declares (else its file name), and finds the
    package's modules as the package's own files do.
    """
    name = read_package_name(package_dir)
    root_file = source_path or package_dir / "src" / "lib.linnet"
    resolver = Resolver(_Locator(name, root_file.parent), sources)
    if client is not None:
        return resolver.finish([resolver.load(None, client)])
    root = resolver.load(name, root_file)
    return resolver.finish([root])


def load_file(path: Path, sources: SourceMap | None = None) -> Program:
    """Resolve a single file; it may `use` std and sibling files."""
    resolver = Resolver(_Locator(loose_dir=path.parent), sources)
    root = resolver.load(None, path)
    return resolver.finish([root])


def load_std(sources: SourceMap | None = None) -> Program:
    """Every module of the standard library, for checking std itself."""
    resolver = Resolver(_Locator(), sources)
    roots = []
    for file in sorted(std_dir().rglob("*.linnet")):
        parts = ["std", *file.relative_to(std_dir()).with_suffix("").parts]
        roots.append(resolver.load(".".join(parts), file))
    return resolver.finish(roots)
class _Delegations:
    """Expands `pub use field.{entry, other as name}` in blocks into ordinary forwarding functions.

    Each delegated function is the callee's declaration with the sub-block's generic arguments put
    in for the callee block's generics: the same generics, inputs (defaults too), result and where
    clauses, whose spans stay the callee's so a precondition message points at the clause that
    states it.  Its body is `return field.entry(inputs...)`, so the checker, lowering and every
    backend see a plain function.  Blocks are expanded callee first (a delegation may name a
    delegated entry); a chain that comes back to a block being expanded is a cycle.
    """

    def __init__(self, errors: list[Diagnostic]):
        self.errors = errors
        self.state: dict[int, str] = {}  # id(block) -> "expanding" | "done"
        self.home: dict[int, ModuleInfo] = {}

    def expand(self, modules) -> None:
        blocks = []
        for info in modules:
            for item in info.tree.items:
                if isinstance(item, ast.Block) and not is_template(item):
                    self.home[id(item)] = info
                    blocks.append(item)
        for block in blocks:
            self._block(block, None)

    def _block(self, block: ast.Block, via: ast.Delegate | None) -> bool:
        """Expand `block`'s delegations; False where it is part of a cycle (reported at `via`)."""
        state = "done" if block.delegates_expanded else self.state.get(id(block))
        if state == "done":
            return True
        if state == "expanding":
            if via is not None:
                self.errors.append(Diagnostic(
                    codes.DELEGATION_CYCLE, f"`{via.field}.{via.callee}` delegates back to block `{block.name}`, "
                    "whose delegations are being expanded", via.callee_span))
            return False
        self.state[id(block)] = "expanding"
        reported = len(self.errors)
        info = self.home[id(block)]
        defined = {f.name: f.name_span for f in block.functions}
        delegated: dict[str, Span] = {}
        placed: list[tuple[int, ast.Function]] = []
        for delegate in block.delegates:
            function = self._function(block, info, delegate)
            if delegate.name in defined or delegate.name in delegated:
                first = defined.get(delegate.name) or delegated[delegate.name]
                how = "defined" if delegate.name in defined else "delegated"
                self.errors.append(Diagnostic(
                    codes.DELEGATION_CLASH, f"block `{block.name}` already has `{delegate.name}`: it is {how} "
                    "in the block", delegate.name_span, (Note(f"{how} here", first),)))
                continue
            delegated[delegate.name] = delegate.name_span
            if function is not None:
                placed.append((delegate.position, function))
        # Where the `use` stands among the block's functions, so entries keep the written order.
        for shift, (position, function) in enumerate(placed):
            block.functions.insert(position + shift, function)
        self.errors[reported:] = [with_instance_note(d, block) for d in self.errors[reported:]]
        self.state[id(block)] = "done"
        if block.delegates:
            block.delegates_expanded = True  # a block with nothing to expand stays as parsed
        return True

    def _function(self, block: ast.Block, info: ModuleInfo, d: ast.Delegate) -> ast.Function | None:
        sub = next((s for s in block.subs if s.name == d.field), None)
        if sub is None:
            param = next((p for p in block.params if p.name == d.field), None)
            if param is not None:
                self._bad(d.field_span, f"`{d.field}` is a param of block `{block.name}`, not a sub-block; "
                          "only a sub-block's entries can be delegated")
            else:
                self._bad(d.field_span, f"block `{block.name}` has no sub-block `{d.field}`",
                          "delegation names a `sub` of this block: `pub use <sub>.<entry>`")
            return None
        if not isinstance(sub.type, ast.BlockRef):
            self._bad(d.field_span, f"`{d.field}` is an array of blocks; delegation needs a single sub-block",
                      "write the entry by hand, e.g. with `static for` over the array")
            return None
        target = info.scope.get(sub.type.name)
        if target is None or not isinstance(target[1], ast.Block) or is_template(target[1]):
            return None  # the checker reports the sub's unknown or non-block type
        callee_block: ast.Block = target[1]
        if not self._block(callee_block, d):
            return None
        callee = next((f for f in callee_block.functions if f.name == d.callee), None)
        if callee is None and any(other.name == d.callee for other in callee_block.delegates):
            return None  # a delegation that failed, reported where it is
        if callee is None:
            names = ", ".join(f"`{f.name}`" for f in callee_block.functions) or "none"
            self._bad(d.callee_span, f"block `{callee_block.name}` (sub-block `{d.field}`) has no entry "
                      f"`{d.callee}`", f"its functions: {names}")
            return None
        mapping = {}
        for index, generic in enumerate(callee_block.generics):
            if index < len(sub.type.args):
                mapping[generic.name] = sub.type.args[index]
            elif generic.default is not None:
                mapping[generic.name] = generic.default
        for generic in callee.generics:
            mapping.pop(generic.name, None)
        copy = lambda node: _substitute(node, mapping)  # noqa: E731
        span = d.span
        result: ast.Expr = ast.MethodCall(ast.Name(d.field, d.field_span), d.callee,
                                          [ast.Name(p.name, d.callee_span) for p in callee.params],
                                          span, d.callee_span)
        result_type = copy(callee.result)
        body: list = []
        if d.then is not None:
            lifted = self._then(block, d, result_type)
            if lifted is None:
                return None
            if isinstance(result_type, ast.TupleTypeNode):
                # Several results: `let (r0, r1) = field.entry(...)`, then `f(r0, r1)`.
                locals_ = _fresh_names([p.name for p in callee.params], len(result_type.items))
                body.append(ast.Destructure(locals_, [d.then_span] * len(locals_), result, span))
                result = ast.Call(d.then, [], [ast.Name(n, d.then_span) for n in locals_], span, d.then_span)
            else:
                result = ast.Call(d.then, [], [result], span, d.then_span)
            result_type = lifted
        body.append(ast.Return(result, span))
        return ast.Function(d.name, d.public, callee.is_entry, copy(callee.generics), copy(callee.params),
                            result_type, copy(callee.where), body, span, d.name_span, callee.doc)

    def _then(self, block: ast.Block, d: ast.Delegate, delegated: ast.TypeNode | None) -> ast.TypeNode | None:
        """The result of `then f` over the delegated entry's result `delegated`, or None (reported).

        `f` is one of the block's own functions with one tensor input per result of the entry
        (several results are passed as several inputs, in order); its generics are read off those
        inputs against the results dim by dim, and its declared result, with them put in, is
        the lifted entry's result.  The checker then checks the call `f(field.entry(...))` (or
        `f(r0, r1)` after `let (r0, r1) = field.entry(...)`) itself.
        """
        then = next((f for f in block.functions if f.name == d.then), None)
        if then is None:
            names = ", ".join(f"`{f.name}`" for f in block.functions) or "none"
            self._bad(d.then_span, f"block `{block.name}` has no function `{d.then}` to pass `{d.callee}`'s "
                      "result through", f"its functions: {names}")
            return None
        results = delegated.items if isinstance(delegated, ast.TupleTypeNode) else [delegated]
        if len(then.params) != len(results) or then.result is None:
            wanted = "one input" if len(results) == 1 else f"{len(results)} inputs, one per result of `{d.callee}`,"
            inputs = f"{len(then.params)} input{'' if len(then.params) == 1 else 's'}"
            self._then_mismatch(d, then, f"`{then.name}` takes {inputs}"
                                + ("" if then.result is not None else " and declares no result")
                                + f"; `then` needs a function of {wanted} with a declared result")
            return None
        bindings: dict = {}
        for index, (param, given) in enumerate(zip(then.params, results)):
            found = _bind_generics(then.generics, param.type, given, bindings)
            if isinstance(found, str):
                which = "result" if len(results) == 1 else f"result {index}"
                self._then_mismatch(d, then, f"`{d.callee}`'s {which} does not fit `{then.name}`'s input "
                                    f"`{param.name}`: {found}")
                return None
            bindings = found
        unbound = [g.name for g in then.generics if g.name not in bindings]
        if unbound:
            self._then_mismatch(d, then, f"`{then.name}`'s generic{'s' if len(unbound) > 1 else ''} "
                                + ", ".join(f"`{n}`" for n in unbound)
                                + f" cannot be read off `{d.callee}`'s result")
            return None
        return _substitute(then.result, bindings)

    def _then_mismatch(self, d: ast.Delegate, then: ast.Function, message: str) -> None:
        self.errors.append(Diagnostic(codes.DELEGATION_THEN_MISMATCH, message, d.then_span,
                                      (Note(f"`{then.name}` is declared here", then.name_span),)))

    def _bad(self, span: Span, message: str, note: str | None = None) -> None:
        notes = (Note(note, None),) if note else ()
        self.errors.append(Diagnostic(codes.BAD_DELEGATION, message, span, notes))


def _fresh_names(taken: list[str], count: int) -> list[str]:
    """`count` local names, none of them in `taken` (the delegated entry's inputs)."""
    names, index = [], 0
    while len(names) < count:
        name = f"result_{index}"
        while name in taken:
            name += "_"
        names.append(name)
        index += 1
    return names


def _bind_generics(generics: list[ast.GenericParam], pattern, given, known: dict | None = None) -> "dict | str":
    """`pattern`'s generic names matched against the type `given`, on top of the bindings
    `known`: name -> node, or why they do not fit."""
    names = {g.name for g in generics}
    if not isinstance(pattern, ast.TensorTypeNode) or not isinstance(given, ast.TensorTypeNode):
        return "both must be plain tensor types"
    if any(isinstance(n, ast.Variadic) for n in (*pattern.dims, *given.dims)):
        return "a variadic shape cannot be matched here"
    if len(pattern.dims) != len(given.dims):
        return f"it has {len(given.dims)} dims, the input {len(pattern.dims)}"
    bindings: dict = dict(known or {})
    pairs = [*zip(pattern.dims, given.dims), (pattern.dtype, given.dtype)]
    for want, got in pairs:
        if isinstance(want, (ast.DimName, ast.NamedTypeNode)) and want.name in names:
            if want.name in bindings and _text(bindings[want.name]) != _text(got):
                return f"`{want.name}` would be both `{_text(bindings[want.name])}` and `{_text(got)}`"
            bindings[want.name] = got
    return bindings


def _text(node) -> str:
    """A signature node as comparable text, without its spans."""
    if isinstance(node, (ast.DimName, ast.NamedTypeNode)):
        return node.name
    if dataclasses.is_dataclass(node) and not isinstance(node, Span):
        inner = ", ".join(_text(getattr(node, f.name)) for f in dataclasses.fields(node) if f.name != "span")
        return f"{type(node).__name__}({inner})"
    return repr(node)


def _substitute(node, mapping: dict):
    """A copy of a signature node with the callee block's generics replaced by the sub's arguments."""
    if isinstance(node, list):
        return [_substitute(n, mapping) for n in node]
    if isinstance(node, ast.DimName) and node.name in mapping:
        return _substitute(mapping[node.name], {})
    if isinstance(node, ast.NamedTypeNode) and node.name in mapping:
        arg = mapping[node.name]
        if isinstance(arg, (ast.DimName, ast.NamedTypeNode)):
            return ast.NamedTypeNode(arg.name, node.span)
        return node
    names = ast.field_names(node)
    if names is not None:
        return dataclasses.replace(node, **{name: _substitute(getattr(node, name), mapping) for name in names})
    return node


def _expand_defaults(errors: list[Diagnostic], modules) -> None:
    """Computed defaults (`position_ids: Tensor[B, S; i32] = positions(attention_mask)`).

    Every function's defaults must be trailing (E0113).  A default that is an expression over
    earlier parameters becomes a function of the block, `<entry>_default_<param>`, taking the
    parameters it reads, with the entry's generics and where clauses and the parameter's
    declared type as its result, so the checker checks it like any function (a wrong type
    says "the default of `p` is ..."), lowering gives it an ir.Function, and each backend
    calls it when the input is left out.  The parameter names it in `default_fn`.
    """
    for info in modules:
        for item in info.tree.items:
            if isinstance(item, ast.Block) and not is_template(item):
                made = []
                reported = len(errors)
                for fn in item.functions:
                    made += [(fn, f) for f in _defaults_of(errors, fn, item)]
                errors[reported:] = [with_instance_note(d, item) for d in errors[reported:]]
                for fn, extra in reversed(made):
                    item.functions.insert(item.functions.index(fn) + 1, extra)
            elif isinstance(item, ast.Function):
                _defaults_of(errors, item, None)


def _defaults_of(errors: list[Diagnostic], fn: ast.Function, block: ast.Block | None) -> list[ast.Function]:
    names = [p.name for p in fn.params]
    first: ast.Param | None = None
    made: list[ast.Function] = []
    for i, p in enumerate(fn.params):
        if p.default is None and p.default_expr is None:
            if first is not None:
                errors.append(Diagnostic(
                    codes.DEFAULT_NOT_TRAILING, f"parameter `{p.name}` of `{fn.name}` has no default, but "
                    f"`{first.name}` before it has one", p.span,
                    (Note(f"`{first.name}`'s default is here; only trailing parameters may have defaults "
                          "(move the defaulted parameters last)", first.span),)))
            continue
        first = first or p
        if p.default_fn is not None:
            continue  # expanded already (a tree resolved twice)
        computed = p.default_expr is not None and (p.default is None or p.default in names)
        if not computed:
            continue  # `= zeros` / `= ones`, or an unknown word the checker reports
        later = [n for n in _names_in(p.default_expr) if n.name in names[i:]]
        if later:
            n = later[0]
            what = "itself" if n.name == p.name else f"`{n.name}`, declared after it"
            errors.append(Diagnostic(
                codes.DEFAULT_LATER_PARAM, f"the default of `{p.name}` reads {what}", n.span,
                (Note("a default is computed from the parameters before it, in order; move "
                      f"`{p.name}` after `{n.name}`" if n.name != p.name else
                      "a default is computed from the parameters before it", None),)))
            continue
        if block is None or not fn.is_entry:
            errors.append(Diagnostic(
                codes.BAD_PARAM_DEFAULT, f"parameter `{p.name}` of `{fn.name}` has a default, but only entry "
                "parameters may", p.span,
                (Note("calls inside Linnet pass every argument; defaults are for the model's users", None),)))
            continue
        read = {n.name for n in _names_in(p.default_expr)}
        inputs = [dataclasses.replace(q, default=None, default_expr=None, default_fn=None)
                  for q in fn.params[:i] if q.name in read]
        name = f"{fn.name}_default_{p.name}"
        span = p.default_expr.span
        made.append(ast.Function(name, False, False, fn.generics, inputs, p.type, fn.where,
                                 [ast.Return(p.default_expr, span)], span, span,
                                 f"The default of `{fn.name}`'s `{p.name}`.", default_of=(fn.name, p.name)))
        p.default, p.default_fn = None, name
    return made


def _names_in(node) -> list[ast.Name]:
    """The plain names an expression reads (not callees, not a method call's receiver)."""
    if isinstance(node, ast.Name):
        return [node]
    if isinstance(node, ast.MethodCall):
        return [n for a in node.args for n in _names_in(a)]
    if isinstance(node, list):
        return [n for a in node for n in _names_in(a)]
    if dataclasses.is_dataclass(node) and not isinstance(node, Span):
        return [n for f in dataclasses.fields(node) if f.name not in ("span", "name_span")
                for n in _names_in(getattr(node, f.name))]
    return []
