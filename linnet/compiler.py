"""The front end as one call: a path or zoo name in, a checked (and instantiated) model out.

`linnet check`, `linnet build` and `nest.load` all start here, so they agree on what a path
means: a zoo entry (a folder with nest.toml, or its name), a package (a folder with
linnet.toml) or a single `.linnet` file.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from .check import CheckedProgram, check
from .diagnostics import Diagnostic, LinnetError, SourceMap, Span
from .instantiate import Instance, instantiate
from .resolve import Program, display_path, load_file, load_package


@dataclass
class Target:
    """What a user pointed at, resolved to something the front end can compile."""

    kind: str  # "entry", "package" or "file"
    path: Path
    manifest: object | None = None  # linnet.nest.manifest.Manifest for an entry


@dataclass
class Compiled:
    target: Target
    checked: CheckedProgram
    instance: Instance | None = None
    generics: dict[str, int | str] = field(default_factory=dict)
    check_dims: dict[str, int] = field(default_factory=dict)


def locate(path_or_name: str | Path) -> Target:
    path = Path(path_or_name)
    if path.is_file() and path.suffix == ".linnet":
        return Target("file", path)
    if path.is_dir() and (path / "linnet.toml").is_file() and not (path / "nest.toml").is_file():
        return Target("package", path)
    from .nest.manifest import load_manifest  # the zoo is optional for plain files and packages

    manifest = load_manifest(path_or_name)
    return Target("entry", manifest.dir, manifest)


def load_program(target: Target, sources: SourceMap | None = None) -> Program:
    sources = sources or SourceMap()
    if target.kind == "file":
        return load_file(target.path, sources)
    if target.kind == "package":
        return load_package(target.path, sources=sources)
    manifest = target.manifest
    return load_package(manifest.source_dir(), manifest.source_file(), sources)


def compile_target(target: Target, overrides: dict[str, int | str] | None = None) -> Compiled:
    """Check the program; for a zoo entry also instantiate it and check the [check] dims.

    `overrides` (from `--set NAME=VALUE`) replace values of the manifest's [generics] or
    [check] dims, whichever declares the name; a name in neither goes to [generics], where
    instantiation reports it if the root block has no such generic.
    """
    program = load_program(target)
    checked = check(program)
    compiled = Compiled(target, checked)
    if target.kind != "entry":
        return compiled
    manifest = target.manifest
    generics, dims = dict(manifest.generics), dict(manifest.check)
    for name, value in (overrides or {}).items():
        (dims if name in dims else generics)[name] = value
    origin = Span(display_path(manifest.dir / "nest.toml"), 1, 1, 1, 2)
    instance = instantiate(checked, manifest.source.root, generics, origin)
    compiled.instance, compiled.generics, compiled.check_dims = instance, generics, dims
    problems: list[Diagnostic] = []
    for entry in instance.entries:
        problems.extend(instance.check_dims(entry, dims))
    if problems:
        raise LinnetError(problems, program.sources)
    return compiled
