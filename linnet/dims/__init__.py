"""Symbolic dimension algebra: the arithmetic the type checker does on tensor shapes.

A dimension is a non-negative integer that may be unknown when a block is checked: a
generic such as `D`, `Heads` or `S`, or an expression over generics such as `D / Heads`.
Two modules, by concern:

* `expr`: `DimExpr`, the canonical normal form (a polynomial over symbols, floor divisions
  and remainders) and the simplifications every constructor applies;
* `facts`: `Facts`, a scope's `where` clauses and the sound (not complete) proofs of
  equalities, divisibility and bounds made with them.

`facts` imports `expr`, never the reverse. Import the public names from `linnet.dims`.
"""
from .expr import MAX_DIM, Atom, DimError, DimExpr, FloorDiv, Mod, Sym, const, floordiv, mod, sym
from .facts import COMPARISONS, Fact, Facts

__all__ = [
    "DimError", "DimExpr", "Sym", "FloorDiv", "Mod", "Atom", "Fact", "Facts",
    "const", "sym", "floordiv", "mod", "COMPARISONS", "MAX_DIM",
]
