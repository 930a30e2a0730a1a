"""Resolved program -> checked program: every shape and dtype proven, every `where` discharged.

Blocks and functions are checked once, generically: dims are symbols (`D`, `Heads`, `S`) and
the facts in scope are the `where` clauses of the block and the function.  Every call and
every sub-block instantiation must prove the callee's `where` clauses from those facts, so a
program that checks is correct for every instantiation that satisfies its root's clauses
(see `linnet.middle.instantiate`).  The checker records the type of each expression and the generic
bindings of each call; lowering reuses both by substitution.

Errors are collected per statement: a failed statement gives its bindings an error type
that silences follow-on errors, so one run reports several independent problems.

The package is split by concern:

* `program`: what checking produces (`CheckedProgram`, `FnSig`, `BlockSig`, clauses);
* `core`: the program-wide `Checker` state, the per-body `BodyContext`, failing and suggesting;
* `declarations`: constants, block headers and members, function signatures;
* `statements` and `expressions`: function bodies;
* `type_syntax`: type syntax resolved to types; `inference`: generic binding at a call;
* `obligations`: what must be proven from the facts (clauses, matching types, broadcasting);
* `cycles`: blocks that contain themselves, functions that call themselves.
"""
from __future__ import annotations

from ..front.resolve import Program
from .core import Checker
from .cycles import check_call_cycles, check_sub_cycles
from .declarations import check_declarations
from .program import (PARAM_DEFAULTS, BlockSig, BroadcastClause, CallInfo, CheckedProgram, FnSig, GenericInfo,
                      NameInfo, WhereClause)
from .statements import check_body

__all__ = ["PARAM_DEFAULTS", "BlockSig", "BroadcastClause", "CallInfo", "CheckedProgram", "FnSig", "GenericInfo",
           "NameInfo", "WhereClause", "check"]


def check(program: Program) -> CheckedProgram:
    """Check every declaration, then every body whose signature checked; raise every error found."""
    checker = Checker(program)
    check_declarations(checker)
    check_sub_cycles(checker)
    for fn in list(checker.functions.values()):
        if fn.checked:
            checker.current_block = fn.block.node if fn.block else None
            check_body(checker, fn)
    checker.current_block = None
    check_call_cycles(checker)
    return checker.finish()
