"""The front half of the pipeline as one call: a target in, a checked (and instantiated) model out.

`linnet check`, `linnet build` and `nest.load` all start here.  A `Target` is a zoo entry
(with its manifest), a package (a folder with linnet.toml) or a single `.linnet` file; the
command line turns what a user typed into one (`linnet.cli.targets`), the zoo loader builds
one from a manifest.  Nothing here imports the zoo.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from . import codes
from .check import CheckedProgram, check
from .diagnostics import Diagnostic, LinnetError, SourceMap, Span, error
from .dims import MAX_DIM
from .middle.instantiate import Instance, ValueOrigin, instantiate
from .front.resolve import Program, display_path, load_file, load_package


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


def load_program(target: Target, sources: SourceMap | None = None) -> Program:
    sources = sources or SourceMap()
    if target.kind == "file":
        return load_file(target.path, sources)
    if target.kind == "package":
        return load_package(target.path, sources=sources)
    manifest = target.manifest
    return load_package(manifest.source_dir(), manifest.source_file(), sources, client=manifest.source.client)


def compile_target(target: Target, overrides: dict[str, int | str] | None = None,
                   override_source: str = "--set") -> Compiled:
    """Check the program; for a zoo entry also instantiate it and check the [check] dims.

    `overrides` (from `--set NAME=VALUE`) replace values of the manifest's [generics] or
    [check] dims, whichever declares the name; a name in neither goes to the [check] dims
    when some entry of the root block has a dim by that name, else to [generics], where
    instantiation reports it if the root block has no such generic. Diagnostics about an
    override quote it as `{override_source} NAME=VALUE`.
    """
    program = load_program(target)
    checked = check(program)
    compiled = Compiled(target, checked)
    if target.kind != "entry":
        if overrides:  # silently ignoring them would let a user believe they were checked
            names = ", ".join(f"{k}={v}" for k, v in overrides.items())
            raise error(codes.SET_OUTSIDE_ENTRY,
                        f"{override_source} {names}: values can only be set for a zoo entry, whose "
                        f"nest.toml names the root block; {target.path} is a {target.kind}")
        return compiled
    manifest = target.manifest
    generics, dims = dict(manifest.generics), dict(manifest.check)
    entry_dims = _entry_dims(checked, manifest.source.root)
    for name, value in (overrides or {}).items():
        (dims if name in dims or (name in entry_dims and name not in generics) else generics)[name] = value
    nest_file = manifest.dir / "nest.toml"
    origin = Span(display_path(nest_file), 1, 1, 1, 2)
    origins = _value_origins(nest_file, generics, dims, overrides or {}, override_source)
    problems = _bad_check_dims(dims, entry_dims, origins, origin)
    try:
        instance = instantiate(checked, manifest.source.root, generics, origin, origins)
    except LinnetError as err:  # report bad [check] dims in the same run
        raise LinnetError(err.diagnostics + problems, program.sources) from None
    compiled.instance, compiled.generics, compiled.check_dims = instance, generics, dims
    if problems:  # not integers: the preconditions cannot be evaluated with them
        raise LinnetError(problems, program.sources)
    for entry in instance.entries:
        problems.extend(instance.check_dims(entry, dims, origins))
    if problems:
        raise LinnetError(problems, program.sources)
    return compiled


def _entry_dims(checked: CheckedProgram, root: str) -> dict[str, Span]:
    """The dims of the root block's entries (B, S), with the span declaring each."""
    try:
        block = checked.find_block(root)
    except KeyError:
        return {}
    spans: dict[str, Span] = {}
    for fn in block.functions.values():
        for g in fn.generics if fn.is_entry else ():
            spans.setdefault(g.name, g.span)  # the first entry that declares it
    return spans


def _bad_check_dims(dims: dict, entry_dims: dict[str, Span], origins: dict[str, ValueOrigin],
                    origin: Span) -> list[Diagnostic]:
    """An entry dim must be a non-negative integer (`--set S=x` would otherwise crash later)."""
    problems = []
    for name, value in dims.items():
        if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_DIM:
            continue
        message = f"`{name}` is a dim and needs a non-negative integer, found {value!r}"
        if isinstance(value, int) and value > MAX_DIM:
            message = f"`{name}` = {value} is larger than a tensor dim can be ({MAX_DIM:,})"
        where = origins.get(name)
        if where is not None and where.span is None:
            span = entry_dims.get(name, origin)
            problems.append(Diagnostic(codes.BAD_GENERIC_VALUE, f"{message} (given by {where.text})", span))
        else:
            problems.append(Diagnostic(codes.BAD_GENERIC_VALUE, message, where.span if where else origin))
    return problems


_TOML_TABLE = re.compile(r"\s*\[\s*([A-Za-z0-9_.-]+)\s*\]\s*(#.*)?$")
_TOML_KEY = re.compile(r"\s*([A-Za-z0-9_-]+)\s*=")


def _value_origins(nest_file: Path, generics: dict, dims: dict, overrides: dict,
                   override_source: str = "--set") -> dict[str, ValueOrigin]:
    """Where each value was written: its line in nest.toml, or `--set NAME=VALUE`.

    A light line scan (tables and `key =` lines) is enough: the manifest has already been
    validated as TOML, and a name that is not found just keeps the whole-file span.
    """
    shown = display_path(nest_file)
    try:
        lines = nest_file.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError):
        lines = []
    found: dict[tuple[str, str], Span] = {}
    table = ""
    for number, text in enumerate(lines, start=1):
        header = _TOML_TABLE.match(text)
        if header:
            table = header.group(1)
            found.setdefault((table, ""), Span(shown, number, 1, number, len(text.rstrip()) + 1))
            continue
        key = _TOML_KEY.match(text)
        if key:
            col = key.start(1) + 1
            found.setdefault((table, key.group(1)), Span(shown, number, col, number, len(text.rstrip()) + 1))
    origins: dict[str, ValueOrigin] = {}
    for table, values in (("generics", generics), ("check", dims)):
        for name in values:
            if (table, name) in found:
                origins[name] = ValueOrigin(f"{shown} [{table}]", found[(table, name)])
    if ("generics", "") in found:
        origins["[generics]"] = ValueOrigin(f"{shown} [generics]", found[("generics", "")])
    if ("source", "root") in found:
        origins["<root>"] = ValueOrigin(f"{shown} [source].root", found[("source", "root")])
    for name, value in overrides.items():
        origins[name] = ValueOrigin(f"{override_source} {name}={value}")
    return origins
