"""The checker's state: what the whole program has gathered, and what one function body knows.

`Checker` holds the program-wide tables every phase fills (signatures, recorded types and
calls, errors, declarations that failed). `BodyContext` is the state of checking one body
(the function, its facts, its scopes of locals); it is made per body and passed to every
function that needs it, never kept on the checker.

A check that fails raises `Failure` through `fail`; the phase that ran it records the
diagnostic and goes on, so one run reports several independent problems.
"""
from __future__ import annotations

import difflib
from dataclasses import dataclass
from typing import Callable, NoReturn

from .. import codes
from ..diagnostics import Diagnostic, InternalError, LinnetError, Note, Span
from ..dims import Facts
from ..front import ast
from ..front.modules import ModuleInfo
from ..front.resolve import Program
from ..front.templates import with_instance_note
from ..types import Type
from .program import BlockSig, BroadcastClause, CallInfo, CheckedProgram, FnSig, NameInfo


class Failure(Exception):
    """A check failed; `diagnostic` None means it failed because of an error already reported."""

    def __init__(self, diagnostic: Diagnostic | None):
        self.diagnostic = diagnostic


def silent() -> NoReturn:
    """Give up on a check whose cause was already reported (a broken declaration it uses)."""
    raise Failure(None)


def fail(code: codes.ErrorCode, message: str, span: Span | None, *notes: Note) -> NoReturn:
    raise Failure(Diagnostic(code, message, span, tuple(notes)))


def suggest(name: str, candidates: list[str]) -> tuple[Note, ...]:
    """A "did you mean" note for the closest candidate, if one is close."""
    close = difflib.get_close_matches(name, candidates, n=1)
    return (Note(f"did you mean `{close[0]}`?"),) if close else ()


def item_key(module: ModuleInfo, name: str) -> str:
    """The program-wide key of a module item: `module::name`."""
    return f"{module.name}::{name}"


class Checker:
    """Program-wide state of one check run."""

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
        self.call_edges: dict[str, list[tuple[str, Span]]] = {}
        # Declarations that failed (blocks `m::B`, functions `m::f` / `m::B.f`, members
        # `m::B#name`): uses of them fail silently instead of piling up follow-on errors
        # such as "`g` takes 1 argument" for a `g` whose second parameter had a bad type.
        self.broken: set[str] = set()
        self.silenced = 0  # checks given up because of an earlier error
        #: The block whose members or functions are being checked, so an error inside a block a
        #: block alias expanded (at its template's text) names that alias in a note.
        self.current_block: "ast.Block | None" = None

    def guard(self, step: Callable[[], object]) -> bool:
        """Run one check; a failure is recorded and the rest goes on. True when it passed."""
        try:
            step()
        except Failure as failure:
            self.record(failure)
            return False
        return True

    def record(self, failure: Failure) -> None:
        if failure.diagnostic is None:
            self.silenced += 1
        else:
            self.errors.append(with_instance_note(failure.diagnostic, self.current_block))

    def finish(self) -> CheckedProgram:
        """The checked program, or every error reported, in source order."""
        if self.silenced and not self.errors:  # a check was skipped for an error never reported
            raise InternalError(f"{self.silenced} check(s) were skipped, but no error was reported")
        if self.errors:
            # In source order (the checker works in phases: declarations, signatures, bodies).
            self.errors.sort(key=lambda d: (d.span.file, d.span.line, d.span.col) if d.span else ("", 0, 0))
            raise LinnetError(self.errors, self.program.sources)
        return CheckedProgram(self.program, self.blocks, self.functions, self.consts, self.types, self.calls,
                              self.names)


@dataclass
class Local:
    type: Type
    mutable: bool
    span: Span
    kind: str = "let"  # "let", "var", "param", "loop" (static for), "index" (its pass number) or "some" (if let)


@dataclass
class BodyContext:
    """Checking one function body: the function, what is known in it, and its locals."""

    checker: Checker
    sig: FnSig
    facts: Facts  # the block's and the function's `where` clauses
    broadcasts: list[BroadcastClause]  # its `where [...] broadcasts to [...]` clauses
    locals: list[dict[str, Local]]  # innermost scope last

    def lookup(self, name: str) -> Local | None:
        for scope in reversed(self.locals):
            if name in scope:
                return scope[name]
        return None

    def bind(self, name: str, local: Local) -> None:
        self.locals[-1][name] = local
