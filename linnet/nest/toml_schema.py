"""Strict, typed reading of the two TOML files of a zoo entry (`nest.toml`, `linnet.toml`).

`linnet.nest.manifest` says what each table must hold; this module is how it reads them.
Every read records a problem instead of raising, so one run reports every mistake in a file
at once, each a `Diagnostic` pointing at the line that holds the field: a missing or mistyped
field, an unknown key (in a strict schema, a typo), a path that leaves the entry folder.
"""
from __future__ import annotations

import difflib
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path, PurePosixPath, PureWindowsPath
from typing import Any, Callable

from .. import codes
from ..diagnostics import Diagnostic, Note, Span

# Where tomllib puts a syntax error's position in its message.
_TOML_POSITION = re.compile(r"\s*\(at line (\d+), column (\d+)\)\s*$")


def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)  # TOML `true` is not a 1


def is_identifier(value: Any) -> bool:
    return isinstance(value, str) and value.isidentifier() and value.isascii()


def is_str(value: Any) -> bool:
    return isinstance(value, str)


@dataclass(frozen=True)
class Kind:
    """What a field must be: the phrase used in messages, and the test."""

    phrase: str
    accepts: Callable[[Any], bool]


STR = Kind("a string", is_str)
STR_LIST = Kind("an array of strings", lambda v: isinstance(v, list) and all(map(is_str, v)))
TABLE = Kind("a table", lambda v: isinstance(v, dict))
STR_OR_TABLE = Kind("a string (a bindings file) or a table (a declared layout)",
                      lambda v: isinstance(v, (str, dict)))
BOOL = Kind("a boolean (true or false)", lambda v: isinstance(v, bool))
INT = Kind("an integer", is_int)


def describe(value: Any) -> str:
    """A found value as messages quote it: `"main"`, `integer 3`, `an array`, ..."""
    if isinstance(value, str):
        return f'"{value}"'
    if isinstance(value, bool):
        return f"boolean {str(value).lower()}"
    if isinstance(value, (int, float)):
        return f"{type(value).__name__} {value}"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, dict):
        return "a table"
    return type(value).__name__


def escapes(path: str) -> bool:
    """Whether a manifest path is absolute (on any OS) or climbs with `..`."""
    posix, windows = PurePosixPath(path), PureWindowsPath(path)
    return (not path or posix.is_absolute() or windows.is_absolute() or bool(windows.drive)
            or ".." in posix.parts or ".." in windows.parts)


class TomlFile:
    """One parsed TOML file, its text (to point diagnostics at lines) and its problems so far."""

    def __init__(self, path: Path, text: str, data: dict[str, Any]):
        self.path = path
        self.lines = text.splitlines()
        self.data = data
        self.problems: list[Diagnostic] = []

    @classmethod
    def read(cls, path: Path, problems: list[Diagnostic]) -> "TomlFile | None":
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            reason = "is missing" if isinstance(exc, FileNotFoundError) else f"cannot be read: {exc}"
            problems.append(Diagnostic(codes.UNREADABLE_MANIFEST, f"{path.name}: {path} {reason}"))
            return None
        try:
            return cls(path, text, tomllib.loads(text))
        except tomllib.TOMLDecodeError as exc:
            problems.append(syntax_error(path, str(exc)))
            return None

    def root(self, allowed: tuple[str, ...]) -> "Root":
        return Root(self, allowed)

    def problem(self, code: codes.ErrorCode, table: str | None, key: str | None, message: str) -> None:
        span = self.locate(table, key)
        notes = () if span else (Note(f"in {self.path}"),)
        self.problems.append(Diagnostic(code, f"{self.path.name}: {message}", span, notes))

    def locate(self, table: str | None, key: str | None) -> Span | None:
        """The line that defines `key` in `[table]` (or the table's header), if it is simple to find.

        A line scan, not a TOML parser: it finds `key = ...` under a `[table]` header, which
        is how manifests are written; anything fancier simply gets no span.
        """
        current, header = None, None
        key_pattern = re.compile(rf"\s*([\"']?){re.escape(key)}\1\s*=") if key else None
        for number, line in enumerate(self.lines, start=1):
            stripped = line.strip()
            if stripped.startswith("[") and not stripped.startswith("[["):
                current = stripped[1:].split("]", 1)[0].strip()
                if current == table:
                    header = self._span(number, line)
                continue
            if current == table and key_pattern is not None and key_pattern.match(line):
                return self._span(number, line)
        return header

    def _span(self, number: int, line: str) -> Span:
        start = len(line) - len(line.lstrip()) + 1
        return Span(str(self.path), number, start, number, len(line.rstrip()) + 1)


def syntax_error(path: Path, message: str) -> Diagnostic:
    # tomllib puts the position into the message text: "Invalid value (at line 3, column 10)".
    found = _TOML_POSITION.search(message)
    if not found:
        return Diagnostic(codes.INVALID_TOML, f"{path.name}: invalid TOML: {message}", None, (Note(f"in {path}"),))
    line, col = int(found.group(1)), int(found.group(2))
    reason = message[:found.start()]
    return Diagnostic(codes.INVALID_TOML, f"{path.name}: invalid TOML: {reason}",
                      Span(str(path), line, col, line, col + 1))


class Table:
    """Typed, recorded access to one `[table]`: each read records a problem instead of raising."""

    def __init__(self, file: TomlFile, name: str | None, data: dict[str, Any] | None):
        self.file = file
        self.name = name
        self.present = data is not None
        self.data = data or {}
        self.taken: set[str] = set()

    def label(self, key: str | None) -> str:
        if self.name is None:
            return f"[{key}]"
        return f"[{self.name}]" if key is None else f"[{self.name}].{key}"

    def problem(self, code: codes.ErrorCode, key: str | None, message: str) -> None:
        self.file.problem(code, self.name, key, message)

    def take(self, key: str, kind: Kind, *, required: bool = True) -> Any:
        """The field's value, or None (after recording why) if it is missing or mistyped."""
        self.taken.add(key)
        if key not in self.data:
            if required and self.present:
                self.problem(codes.MISSING_FIELD, None, f"{self.label(None)} is missing required field `{key}`")
            return None
        value = self.data[key]
        if not kind.accepts(value):
            self.problem(codes.WRONG_FIELD_TYPE, key, f"{self.label(key)} must be {kind.phrase}, found "
                                                      f"{describe(value)}")
            return None
        return value

    def map(self, phrase: str, accepts: Callable[[Any], bool]) -> dict[str, Any]:
        """A table whose keys are free (generics, links): every value checked, every key taken."""
        result = {}
        for key, value in self.data.items():
            self.taken.add(key)
            if accepts(value):
                result[key] = value
            else:
                self.problem(codes.WRONG_FIELD_TYPE, key, f"{self.label(key)} must be {phrase}, found "
                                                          f"{describe(value)}")
        return result

    def inside_entry(self, entry_dir: Path, key: str, relative: str) -> Path | None:
        """`entry_dir / relative`, if that stays inside the entry (also through symlinks)."""
        resolved = entry_dir / relative
        inside = not escapes(relative) and resolved.resolve().is_relative_to(entry_dir.resolve())
        if not inside:
            self.problem(codes.PATH_OUTSIDE_ENTRY, key, f"{self.label(key)} must be a relative path inside the entry "
                                                        f"folder, found \"{relative}\"")
            return None
        return resolved

    def finish(self) -> None:
        """Report keys nobody asked for: in a strict schema they are typos."""
        for key in self.data:
            if key not in self.taken:
                hint = did_you_mean(key, self.taken)
                self.problem(codes.UNKNOWN_FIELD, key, f"{self.label(None)} has unknown field `{key}`{hint}")


class Root(Table):
    """The top level of a file: only the allowed tables may appear, each must be a table."""

    def __init__(self, file: TomlFile, allowed: tuple[str, ...]):
        super().__init__(file, None, file.data)
        self.allowed = allowed
        for key, value in file.data.items():
            if key in allowed:
                continue
            hint = did_you_mean(key, allowed, brackets=True)
            if isinstance(value, dict):
                self.file.problem(codes.UNKNOWN_FIELD, key, None, f"unknown table [{key}]{hint}")
            else:
                self.file.problem(codes.UNKNOWN_FIELD, None, key, f"unknown top-level field `{key}`{hint}")

    def table(self, name: str, *, required: bool) -> Table:
        data = self.data.get(name)
        if name not in self.data and required:
            self.file.problem(codes.MISSING_FIELD, None, None, f"required table [{name}] is missing")
        elif name in self.data and not isinstance(data, dict):
            self.file.problem(codes.WRONG_FIELD_TYPE, None, name, f"[{name}] must be a table, found {describe(data)}")
            data = None
        return Table(self.file, name, data)


def did_you_mean(word: str, options: Any, *, brackets: bool = False) -> str:
    close = difflib.get_close_matches(word, list(options), n=1)
    if not close:
        return ""
    return f" (did you mean [{close[0]}]?)" if brackets else f" (did you mean `{close[0]}`?)"
