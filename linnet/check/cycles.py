"""Program-wide cycles: a block that contains itself through its subs, a function that calls itself.

Both would never end once the program is built (the parameter tree is expanded and every
call inlined), so each cycle is one error, at the edge that closes it.
"""
from __future__ import annotations

from .. import codes
from ..diagnostics import Diagnostic, Note, Span
from ..types import SubArrayT
from .core import Checker


def check_sub_cycles(checker: Checker) -> None:
    """A block may not contain itself through its subs: its parameter tree would be infinite."""
    edges = {key: [(sub.element.block if isinstance(sub, SubArrayT) else sub.block, span)
                   for sub, span in block.subs.values()] for key, block in checker.blocks.items()}
    for key, path in _cycles(edges):
        names = " -> ".join(k.split("::")[-1] for k in path)
        checker.errors.append(Diagnostic(
            codes.RECURSIVE_BLOCK,
            f"block `{key.split('::')[-1]}` contains itself through its subs: {names}", path.span,
            (Note("a block's sub-blocks must form a tree; this one would never end"),)))


def check_call_cycles(checker: Checker) -> None:
    """Calls are inlined when a model is built, so a function may not (indirectly) call itself."""
    for key, path in _cycles(checker.call_edges):
        names = " -> ".join(k.split("::")[-1] for k in path)
        checker.errors.append(Diagnostic(
            codes.RECURSIVE_CALL, f"`{key.split('::')[-1]}` calls itself: {names}", path.span,
            (Note("Linnet inlines every call, so recursion would never end"),)))


class _CyclePath(list):
    """The keys along a cycle (first == last), with the span of the edge that closes it."""

    span: Span


def _cycles(edges: dict[str, list[tuple[str, Span]]]):
    """One cycle per back edge of a depth-first search, as (first node, path); deterministic."""
    state: dict[str, str] = {}  # "open" while on the DFS path, "done" when finished
    for start in sorted(edges):
        if start in state:
            continue
        state[start] = "open"
        stack: list[tuple[str, int]] = [(start, 0)]
        path: list[str] = [start]
        while stack:
            node, i = stack[-1]
            out = edges.get(node, [])
            if i >= len(out):
                stack.pop()
                path.pop()
                state[node] = "done"
                continue
            stack[-1] = (node, i + 1)
            target, span = out[i]
            if state.get(target) == "open":
                cycle = _CyclePath(path[path.index(target):] + [target])
                cycle.span = span
                yield target, cycle
            elif target not in state:
                state[target] = "open"
                stack.append((target, 0))
                path.append(target)
