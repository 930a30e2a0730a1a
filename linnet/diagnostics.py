"""Diagnostics: the one error type users see, and how it renders.

Every user-facing failure is a `LinnetError` carrying one or more `Diagnostic`s.  A
diagnostic names a code, a message, a primary `Span` (file, line, column, end) and any
number of notes that point at the declaration or `where` clause that explains it.  A bug in
the compiler itself is an `InternalError`, which says so instead of blaming the program.
Codes are the records of `linnet.codes`; a diagnostic with a code not registered there
cannot be made.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .codes import ErrorCode


@dataclass(frozen=True)
class Span:
    """A region of one source file; lines and columns are 1-based, `end_col` exclusive."""

    file: str
    line: int
    col: int
    end_line: int
    end_col: int

    def __str__(self) -> str:
        return f"{self.file}:{self.line}:{self.col}"

    def to_json(self) -> dict:
        return {"file": self.file, "line": self.line, "col": self.col,
                "end_line": self.end_line, "end_col": self.end_col}


@dataclass(frozen=True)
class Note:
    message: str
    span: Span | None = None


@dataclass(frozen=True)
class Diagnostic:
    code: str  # given as a `codes.ErrorCode` (or its registered string), kept as the string
    message: str
    span: Span | None = None
    notes: tuple[Note, ...] = ()
    severity: str = "error"

    def __post_init__(self) -> None:
        # Imported here, not at the top: `import linnet` then does not load the registry, so
        # `python -m linnet.codes` runs it as a fresh module without runpy's double-import warning.
        from . import codes
        try:
            record = codes.lookup(self.code)
        except KeyError as exc:
            raise InternalError(exc.args[0]) from None
        object.__setattr__(self, "code", record.code)

    def with_note(self, message: str, span: Span | None = None) -> "Diagnostic":
        return Diagnostic(self.code, self.message, self.span, self.notes + (Note(message, span),),
                          self.severity)

    def to_json(self) -> dict:
        return {
            "severity": self.severity,
            "code": self.code,
            "message": self.message,
            "span": self.span.to_json() if self.span else None,
            "notes": [{"message": n.message, "span": n.span.to_json() if n.span else None}
                      for n in self.notes],
        }


class LinnetError(Exception):
    """The single public error type: one or more diagnostics about the user's input."""

    def __init__(self, diagnostics: "list[Diagnostic] | Diagnostic", sources: "SourceMap | None" = None):
        if isinstance(diagnostics, Diagnostic):
            diagnostics = [diagnostics]
        self.diagnostics = list(diagnostics)
        self.sources = sources
        super().__init__(self.render())

    @property
    def code(self) -> str:
        return self.diagnostics[0].code

    def render(self) -> str:
        return "\n\n".join(render(d, self.sources) for d in self.diagnostics)

    def __str__(self) -> str:
        return self.render()


class InternalError(Exception):
    """The compiler is wrong, not the program: always a bug to report."""

    def __init__(self, message: str):
        super().__init__(f"internal compiler error (this is a bug in Linnet, please report it): {message}")


def error(code: ErrorCode, message: str, span: Span | None = None, *notes: Note) -> LinnetError:
    return LinnetError(Diagnostic(code, message, span, tuple(notes)))


class SourceMap:
    """File name -> text, so diagnostics can quote the offending line."""

    def __init__(self) -> None:
        self._texts: dict[str, str] = {}

    def add(self, file: str, text: str) -> None:
        self._texts[file] = text

    def line(self, file: str, line: int) -> str | None:
        text = self._texts.get(file)
        if text is None:
            try:
                text = Path(file).read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError):
                return None
            self._texts[file] = text
        # Lines as the parser counts them: only "\n" ends one (str.splitlines would also split
        # at form feeds, U+2028 and lone "\r", and quote the wrong line).
        lines = text.split("\n")
        return lines[line - 1].removesuffix("\r") if 0 < line <= len(lines) else None


def _excerpt(span: Span, sources: SourceMap | None, gutter: int) -> list[str]:
    source_line = sources.line(span.file, span.line) if sources else None
    if source_line is None:
        return []
    end = span.end_col if span.end_line == span.line else len(source_line) + 1
    width = max(1, end - span.col)
    pad = " " * gutter
    # Keep tabs before the span as tabs, so the carets line up however wide a tab shows.
    indent = "".join("\t" if c == "\t" else " " for c in source_line[:span.col - 1])
    indent += " " * (span.col - 1 - len(indent))  # a span just past the end of the line
    return [
        f"{pad} |",
        f"{span.line:>{gutter}} | {source_line}",
        f"{pad} | {indent}{'^' * width}",
    ]


def render(d: Diagnostic, sources: SourceMap | None = None) -> str:
    """`error[E123]: message`, then `--> file:line:col`, the line, and the span underlined."""
    lines = [f"{d.severity}[{d.code}]: {d.message}"]
    spans = [s for s in [d.span, *(n.span for n in d.notes)] if s is not None]
    gutter = max((len(str(s.line)) for s in spans), default=1)
    if d.span is not None:
        lines.append(f"{' ' * gutter}--> {d.span}")
        lines.extend(_excerpt(d.span, sources, gutter))
    for note in d.notes:
        if note.span is not None:
            lines.append(f"{' ' * gutter} = note: {note.message}")
            lines.append(f"{' ' * gutter}--> {note.span}")
            lines.extend(_excerpt(note.span, sources, gutter))
        else:
            lines.append(f"{' ' * gutter} = note: {note.message}")
    return "\n".join(lines)


def to_json(diagnostics: list[Diagnostic]) -> str:
    return json.dumps([d.to_json() for d in diagnostics], indent=2)
