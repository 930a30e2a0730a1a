"""Modules and names: which file a `use` means, and which item a name refers to.

`std.*` modules are files under the standard library folder (`std.nn.norm` is
`std/nn/norm.linnet`).  A package (a folder with `linnet.toml`) names its root module
`src/lib.linnet` after the package, and `pkg.sub` is `src/sub.linnet`.  A single file on its
own may `use` sibling files by their stem.  The resolver parses each module once, follows
its `use`s, and builds each module's scope: its own items plus what it imports.
"""
from __future__ import annotations

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
