"""Block templates and block aliases, expanded into ordinary blocks before checking.

A block with a `Block` generic (`Enc: Block`) is a template; `pub block X<...> = Template<...>`
is an alias that names one instance of it.  `Templates.expand` turns every alias into a block
written out (docs/language.md, "Block templates"), so the checker, lowering and the backends only
ever see plain blocks.
"""
from __future__ import annotations

import dataclasses
import itertools

from . import ast
from .. import codes
from ..diagnostics import Diagnostic, Note, Span
from .modules import ModuleInfo




BLOCK_KIND = "Block"


def is_template(block) -> bool:
    """A block template: a block with a `Block` generic, checked only where an alias expands it."""
    return isinstance(block, ast.Block) and any(g.kind == BLOCK_KIND for g in block.generics)


class Templates:
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
    """Every syntax node under `node` (lists and dataclasses), depth first.  A node's fields
    are read as the walk reaches them, so the caller may change the node it was just given."""
    pending = [iter((node,))]  # a stack, not recursion: every resolve walks every tree
    while pending:
        for child in pending[-1]:
            if isinstance(child, list):
                pending.append(iter(child))
                break
            names = ast.field_names(child)
            if names is not None:
                yield child
                pending.append(map(getattr, itertools.repeat(child), names))
                break
        else:
            pending.pop()


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
    names = ast.field_names(node)
    if names is not None:
        return dataclasses.replace(node, **{name: _instantiate(getattr(node, name), values, blocks) for name in names})
    return node
