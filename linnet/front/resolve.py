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
from dataclasses import dataclass, field
from pathlib import Path

from . import ast
from .. import codes
from ..diagnostics import Diagnostic, LinnetError, Note, SourceMap, Span
from .parser import parse_file
from ..paths import std_dir


@dataclass
class ModuleInfo:
    name: str
    path: Path
    tree: ast.Module
    # name -> (defining module, item); own items and imports alike.
    scope: dict[str, "tuple[ModuleInfo, ast.Item]"] = field(default_factory=dict)
    #: For the module the resolver makes to hold one expanded block alias: the template's module,
    #: whose scope (plus the blocks passed in) the expanded block's names resolve in. It shares
    #: the alias's module name, so its block's key is the alias's (`bert::SequenceClassification`).
    expanded_from: "ModuleInfo | None" = None

    def own_items(self) -> dict[str, ast.Item]:
        return {item.name: item for item in self.tree.items}


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
        _Templates(self.errors, self.modules).expand()
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


BLOCK_KIND = "Block"


def is_template(block) -> bool:
    """A block template: a block with a `Block` generic, checked only where an alias expands it."""
    return isinstance(block, ast.Block) and any(g.kind == BLOCK_KIND for g in block.generics)


class _Templates:
    """Expands block aliases (`pub block X<...> = Template<Model<...>, D, Labels>`) into blocks.

    A template is a block with `Block` generics (`Enc: Block`), used only as whole `sub` types
    (`sub bert: Enc`). It is not checked on its own: each alias makes a copy of it, named as the
    alias and with the alias's generics, whose `where` clauses are the alias's then the template's,
    and whose members are the template's with every template generic replaced by the alias's
    argument: a block argument (`Model<Vocab, ..., Eps>`, in the alias's generics) for a `Block`
    generic, a dim, dtype, number or member for the others (in types, generic arguments and
    expressions alike). The copy lives in a module of its own, named as the alias's module, whose
    scope is the template module's plus the blocks passed in, so the template's names mean what
    they mean where it is written, and the checker checks it as any block, at the template's spans.
    Delegations and computed defaults are expanded after, on the copy.
    """

    def __init__(self, errors: list[Diagnostic], modules: dict[str, ModuleInfo]):
        self.errors = errors
        self.modules = modules
        self.done: dict[int, tuple[ModuleInfo, ast.Block] | None] = {}  # id(alias) -> its expansion
        self.active: set[int] = set()

    def expand(self) -> None:
        self.spliced: dict[int, bool] = {}  # id(alias) -> whether its splices were all made
        self.splice_done: set[int] = set()  # the aliases whose splices are finished (made or not)
        for info in list(self.modules.values()):
            for item in info.tree.items:
                if isinstance(item, ast.BlockAlias):
                    self._splice(info, item)
                else:
                    self._refuse_splices(item)
        for info in list(self.modules.values()):
            for item in info.tree.items:
                if isinstance(item, ast.BlockAlias):
                    self._alias(info, item)
                elif isinstance(item, ast.Block):
                    self._check_template(info, item) if is_template(item) else self._check_subs(info, item)
        # Every scope that names an alias (its own module's, importers') now names its block.
        for info in list(self.modules.values()):
            for name, (owner, item) in list(info.scope.items()):
                made = self.done.get(id(item)) if isinstance(item, ast.BlockAlias) else None
                if made is not None:
                    info.scope[name] = made

    def _refuse_splices(self, item) -> None:
        """`..X` and `X<..>` belong to block aliases; elsewhere they are refused and dropped."""
        owners = [item, *getattr(item, "functions", [])]
        for owner in owners:
            generics = getattr(owner, "generics", None)
            if generics and any(isinstance(g, ast.GenericSplice) for g in generics):
                for g in generics:
                    if isinstance(g, ast.GenericSplice):
                        self._bad(codes.BAD_GENERIC_SPLICE, g.span, f"`..{g.name}` splices generics into a block "
                                  "alias only (`block X<..Model, ...> = Template<Model<..>, ...>`)")
                owner.generics = [g for g in generics if not isinstance(g, ast.GenericSplice)]
        for node in _nodes(item):
            if isinstance(node, (ast.BlockRef, ast.Call)):
                args = node.args if isinstance(node, ast.BlockRef) else node.generic_args
                for arg in [a for a in args if isinstance(a, ast.SpliceArg)]:
                    self._bad(codes.BAD_GENERIC_SPLICE, arg.span, "`<..>` passes a block its generics by name in a "
                              "block alias's target only")
                    args.remove(arg)

    def _splice(self, info: ModuleInfo, alias: ast.BlockAlias) -> bool:
        """Replace `..X` in `alias`'s generics by X's generics and clauses, and `X<..>` in its target
        by X's generic names; False where a splice could not be made (reported)."""
        key = id(alias)
        if key in self.spliced:
            return self.spliced[key]
        self.spliced[key] = False  # until done: a splice that comes back here is a cycle
        generics: list[ast.GenericParam] = []
        where: list = []
        ok = True
        declared = {g.name for g in alias.generics if isinstance(g, ast.GenericParam)}
        for g in alias.generics:
            if not isinstance(g, ast.GenericSplice):
                generics.append(g)
                continue
            source = self._splice_source(info, g.name, g.span)
            if source is None:
                ok = False
                continue
            for spliced in source.generics:
                if spliced.name in declared:
                    self._bad(codes.BAD_GENERIC_SPLICE, g.span, f"`..{g.name}` brings generic `{spliced.name}`, which "
                              f"alias `{alias.name}` also declares", Note(f"`{g.name}` declares it here", spliced.span))
                    ok = False
                    continue
                declared.add(spliced.name)
                generics.append(_instantiate(spliced, {}, {}))
            where += _instantiate(source.where, {}, {})
        # `Model<..>`: the block's generics by name, wherever the target passes one.
        for node in _nodes(alias.target):
            if isinstance(node, ast.BlockRef) and any(isinstance(a, ast.SpliceArg) for a in node.args):
                splice = next(a for a in node.args if isinstance(a, ast.SpliceArg))
                source = self._splice_source(info, node.name, node.span)
                if len(node.args) != 1:
                    self._bad(codes.BAD_GENERIC_SPLICE, splice.span, "`<..>` stands alone: every generic of "
                              f"`{node.name}` by its own name")
                    ok = False
                elif source is not None:
                    node.args = [ast.DimName(p.name, splice.span) for p in source.generics]
                else:
                    ok = False
                node.args = [a for a in node.args if not isinstance(a, ast.SpliceArg)]
        alias.generics, alias.where = generics, [*where, *alias.where]
        self.spliced[key] = ok
        self.splice_done.add(key)
        return ok

    def _splice_source(self, info: ModuleInfo, name: str, span: Span):
        """The block (or alias, spliced first) whose generics `..name` / `name<..>` brings."""
        found = info.scope.get(name)
        item = found[1] if found else None
        if isinstance(item, ast.BlockAlias):
            if self.spliced.get(id(item)) is False and id(item) not in self.splice_done:
                self._bad(codes.BAD_GENERIC_SPLICE, span, f"`{name}`'s generics are being spliced: the splices "
                          "form a cycle")
                return None
            return item if self._splice(found[0], item) else None
        if isinstance(item, ast.Block) and not is_template(item):
            return item
        what = "a block template" if is_template(item) else "not a block" if item is not None else "unknown"
        self._bad(codes.BAD_GENERIC_SPLICE, span, f"`{name}` is {what}; a splice brings the generics of a block")
        return None

    def _bad(self, code, span: Span, message: str, *notes: Note) -> None:
        self.errors.append(Diagnostic(code, message, span, notes))

    def _check_subs(self, info: ModuleInfo, block: ast.Block) -> None:
        for sub in block.subs:
            ref = sub.type.element if isinstance(sub.type, ast.SubArrayType) else sub.type
            found = info.scope.get(ref.name)
            if found is not None and is_template(found[1]):
                self._bad(codes.MISUSED_BLOCK_GENERIC, ref.span,
                          f"`{ref.name}` is a block template (generic over blocks); it cannot be a `sub` "
                          "as it is", Note(f"name an instance of it first: `block Name<...> = {ref.name}<...>`, "
                                           "then use `Name<...>`", found[1].name_span))

    def _check_template(self, info: ModuleInfo, block: ast.Block) -> None:
        """A `Block` generic has no default and appears only as a whole `sub` type."""
        names = {g.name for g in block.generics if g.kind == BLOCK_KIND}
        for g in block.generics:
            if g.kind == BLOCK_KIND and (g.default is not None or g.variadic):
                self._bad(codes.MISUSED_BLOCK_GENERIC, g.span, f"`Block` generic `{g.name}` cannot have a default "
                          "or be variadic", Note("every alias of the template passes a block for it"))
        subs = [s.type for s in block.subs if isinstance(s.type, ast.BlockRef) and s.type.name in names
                and not s.type.args]
        for node in _nodes([block.where, block.params, block.subs, block.functions, block.delegates]):
            if isinstance(node, ast.BlockRef) and node.name in names and node not in subs:
                self._bad(codes.MISUSED_BLOCK_GENERIC, node.span, f"`{node.name}` is a `Block` generic: it is used "
                          "as a whole `sub` type (`sub name: " + node.name + "`), without arguments or an array",
                          Note("the block passed for it comes with its own arguments"))
            elif isinstance(node, (ast.DimName, ast.Name, ast.NamedTypeNode)) and node.name in names:
                self._bad(codes.MISUSED_BLOCK_GENERIC, node.span, f"`{node.name}` is a `Block` generic, not a "
                          "dim, dtype or value", Note("it can only be the type of a `sub`"))

    def _alias(self, info: ModuleInfo, alias: ast.BlockAlias):
        """The (module, block) an alias expands to, or None (reported)."""
        key = id(alias)
        if key in self.done:
            return self.done[key]
        if key in self.active:
            self._bad(codes.BAD_BLOCK_ALIAS, alias.name_span, f"block alias `{alias.name}` refers back to itself")
            return None
        self.active.add(key)
        try:
            made = self._expand(info, alias)
        finally:
            self.active.discard(key)
        self.done[key] = made
        return made

    def _block_arg(self, info: ModuleInfo, arg, generic: ast.GenericParam):
        """A block argument as (its BlockRef in the alias's terms, its module, its block), or None."""
        if isinstance(arg, ast.DimName):
            arg = ast.BlockRef(arg.name, [], arg.span)
        if not isinstance(arg, ast.BlockRef):
            self._bad(codes.BAD_BLOCK_ALIAS, arg.span, f"`{generic.name}` is a `Block` generic: it needs a block "
                      "such as `Model<D, Heads>`", Note("declared here", generic.span))
            return None
        found = info.scope.get(arg.name)
        item = found[1] if found else None
        owner = found[0] if found else None
        if isinstance(item, ast.BlockAlias):
            made = self._alias(found[0], item)
            if made is None:
                return None
            owner, item = made
        if not isinstance(item, ast.Block) or is_template(item):
            what = "unknown" if item is None else ("a block template" if is_template(item) else "not a block")
            self._bad(codes.BAD_BLOCK_ALIAS, arg.span, f"`{arg.name}` is {what}; `{generic.name}` needs a block",
                      Note("declared here", generic.span))
            return None
        return ast.BlockRef(item.name, arg.args, arg.span), owner, item

    def _expand(self, info: ModuleInfo, alias: ast.BlockAlias):
        target = alias.target
        found = info.scope.get(target.name)
        template = found[1] if found else None
        if not is_template(template):
            what = ("an alias" if isinstance(template, ast.BlockAlias) else "a block without a `Block` generic"
                    if isinstance(template, ast.Block) else "not a block" if template is not None else "unknown")
            self._bad(codes.BAD_BLOCK_ALIAS, target.span, f"`{target.name}` is {what}; a block alias names a block "
                      "template, a block with a `Block` generic (`Enc: Block`)")
            return None
        home = found[0]
        if len(target.args) > len(template.generics):
            self._bad(codes.BAD_BLOCK_ALIAS, target.span, f"`{template.name}` takes {len(template.generics)} generic "
                      f"arguments, given {len(target.args)}", Note("declared here", template.name_span))
            return None
        values: dict[str, object] = {}
        blocks: dict[str, ast.BlockRef] = {}
        scope = dict(home.scope)
        ok = True
        for index, g in enumerate(template.generics):
            arg = target.args[index] if index < len(target.args) else None
            if g.kind == BLOCK_KIND:
                made = self._block_arg(info, arg, g) if arg is not None else None
                if arg is None:
                    self._bad(codes.BAD_BLOCK_ALIAS, target.span, f"`{template.name}` needs a block for its `Block` "
                              f"generic `{g.name}`", Note("declared here", g.span))
                if made is None:
                    ok = False
                    continue
                ref, owner, block = made
                blocks[g.name] = ref
                scope[block.name] = (owner, block)
            elif isinstance(arg, ast.BlockRef):
                self._bad(codes.BAD_BLOCK_ALIAS, arg.span, f"`{g.name}` is a {g.kind} generic; a block is passed "
                          "only for a `Block` generic", Note("declared here", g.span))
                ok = False
            elif arg is not None:
                values[g.name] = arg
            elif g.default is not None:
                values[g.name] = _instantiate(g.default, values, {})
            else:
                self._bad(codes.BAD_BLOCK_ALIAS, target.span, f"`{template.name}` needs a value for its generic "
                          f"`{g.name}`", Note("declared here", g.span))
                ok = False
        if not ok:
            return None
        copy = lambda node: _instantiate(node, values, blocks)  # noqa: E731
        block = ast.Block(alias.name, alias.public, alias.generics, [*alias.where, *copy(template.where)],
                          copy(template.params), copy(template.subs), copy(template.functions), alias.span,
                          alias.name_span, alias.doc or template.doc, copy(template.delegates),
                          instance_of=(template.name, alias.name_span))
        module = ModuleInfo(info.name, home.path, ast.Module(None, None, [], [block], home.tree.file), scope,
                            expanded_from=home)
        self.modules[f"{info.name}::{alias.name}"] = module
        return module, block


def with_instance_note(diagnostic: Diagnostic, block: "ast.Block | None") -> Diagnostic:
    """`diagnostic` with a note naming the alias, when it was found in a block an alias expanded."""
    if block is None or block.instance_of is None:
        return diagnostic
    template, span = block.instance_of
    note = Note(f"in `{block.name}`, the instance of template `{template}` declared here", span)
    return dataclasses.replace(diagnostic, notes=(*diagnostic.notes, note))


def _nodes(node):
    """Every syntax node under `node` (lists and dataclasses), depth first."""
    if isinstance(node, list):
        for n in node:
            yield from _nodes(n)
    elif dataclasses.is_dataclass(node) and not isinstance(node, Span):
        yield node
        for f in dataclasses.fields(node):
            yield from _nodes(getattr(node, f.name))


def _as_expr(node, span: Span):
    """A generic argument (a dim, a number) where a template's body reads the generic as a value."""
    if isinstance(node, ast.DimName):
        return ast.Name(node.name, span)
    if isinstance(node, ast.DimInt):
        return ast.IntLit(node.value, span)
    if isinstance(node, ast.DimBinary):
        return ast.Binary(node.op, _as_expr(node.left, span), _as_expr(node.right, span), span)
    return _instantiate(node, {}, {})


def _instantiate(node, values: dict, blocks: dict):
    """A copy of a template's node with its generics replaced: `values` (name -> generic argument)
    in dims, dtypes, generic arguments and expressions, `blocks` (name -> BlockRef) in `sub` types."""
    if isinstance(node, list):
        return [_instantiate(n, values, blocks) for n in node]
    if isinstance(node, ast.BlockRef) and node.name in blocks and not node.args:
        ref = blocks[node.name]
        return ast.BlockRef(ref.name, _instantiate(ref.args, {}, {}), node.span)
    if isinstance(node, ast.DimName) and node.name in values:
        return _instantiate(values[node.name], {}, {})
    if isinstance(node, ast.NamedTypeNode) and node.name in values:
        arg = values[node.name]
        return ast.NamedTypeNode(arg.name, node.span) if isinstance(arg, (ast.DimName, ast.NamedTypeNode)) else node
    if isinstance(node, ast.Name) and node.name in values:
        return _as_expr(values[node.name], node.span)
    if dataclasses.is_dataclass(node) and not isinstance(node, Span):
        changes = {f.name: _instantiate(getattr(node, f.name), values, blocks) for f in dataclasses.fields(node)}
        return dataclasses.replace(node, **changes)
    return node


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
        block.delegates_expanded = True
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
        if d.then is not None:
            lifted = self._then(block, d, result_type)
            if lifted is None:
                return None
            result_type = lifted
            result = ast.Call(d.then, [], [result], span, d.then_span)
        return ast.Function(d.name, d.public, callee.is_entry, copy(callee.generics), copy(callee.params),
                            result_type, copy(callee.where), [ast.Return(result, span)], span, d.name_span,
                            callee.doc)

    def _then(self, block: ast.Block, d: ast.Delegate, delegated: ast.TypeNode | None) -> ast.TypeNode | None:
        """The result of `then f` over the delegated entry's result `delegated`, or None (reported).

        `f` is one of the block's own functions with one tensor input; its generics are read off
        that input against `delegated` dim by dim, and its declared result, with them put in, is
        the lifted entry's result.  The checker then checks the call `f(field.entry(...))` itself.
        """
        then = next((f for f in block.functions if f.name == d.then), None)
        if then is None:
            names = ", ".join(f"`{f.name}`" for f in block.functions) or "none"
            self._bad(d.then_span, f"block `{block.name}` has no function `{d.then}` to pass `{d.callee}`'s "
                      "result through", f"its functions: {names}")
            return None
        if len(then.params) != 1 or then.result is None:
            self._then_mismatch(d, then, f"`{then.name}` takes {len(then.params)} inputs"
                                + ("" if then.result is not None else " and declares no result")
                                + "; `then` needs a function of one input with a declared result")
            return None
        bindings = _bind_generics(then.generics, then.params[0].type, delegated)
        if isinstance(bindings, str):
            self._then_mismatch(d, then, f"`{d.callee}`'s result does not fit `{then.name}`'s input "
                                f"`{then.params[0].name}`: {bindings}")
            return None
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


def _bind_generics(generics: list[ast.GenericParam], pattern, given) -> "dict | str":
    """`pattern`'s generic names matched against the type `given`: name -> node, or why they do not fit."""
    names = {g.name for g in generics}
    if not isinstance(pattern, ast.TensorTypeNode) or not isinstance(given, ast.TensorTypeNode):
        return "both must be plain tensor types"
    if any(isinstance(n, ast.Variadic) for n in (*pattern.dims, *given.dims)):
        return "a variadic shape cannot be matched here"
    if len(pattern.dims) != len(given.dims):
        return f"it has {len(given.dims)} dims, the input {len(pattern.dims)}"
    bindings: dict = {}
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
    if dataclasses.is_dataclass(node) and not isinstance(node, Span):
        changes = {f.name: _substitute(getattr(node, f.name), mapping) for f in dataclasses.fields(node)}
        return dataclasses.replace(node, **changes)
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
