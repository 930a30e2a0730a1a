"""Facts: a scope's `where` clauses, and proofs about dims under them.

`Facts` holds a scope's `where` clauses and proves things with them, soundly but not
completely: equalities that solve for a symbol become substitutions, `p % q == 0` lets
`q * (p / q)` become `p`, and comparisons are decided from lower bounds (every symbol is
>= 0; `c * x + k >= 0` clauses bound atoms; one or two clauses may be subtracted from a
difference whose sign is wanted).  An answer of None means "not proven either way".

The normal form these proofs work on is in `linnet.dims.expr`; facts store normal forms and
call its division helpers, and the normal form never needs a fact.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from itertools import combinations_with_replacement
from typing import Iterable, Mapping

from .expr import (ZERO, Atom, DimError, DimExpr, FloorDiv, Mod, Monomial, Sym, _atom_expr, _coerce, _exact_quotient,
                   _from_coefficients, _monomial_quotient, _rebuild, _scaled, _split_divisible, _symbol_name, mod, sym)

__all__ = ["Fact", "Facts", "COMPARISONS"]


COMPARISONS = frozenset({"==", "!=", "<", "<=", ">", ">="})

#: Rounds of rewriting in `Facts.simplify`; each round removes divisions, so few are needed.
_MAX_REWRITE_ROUNDS = 16

#: `decide`'s answers, shared by every Facts with the same clauses: checking BERT asks about
#: 1,800 questions, 140 of them distinct, and the fuzzer asks them again case after case.
#: Only answers that do not depend on the order of earlier questions are kept (see
#: `Facts._order_dependent`); emptied when full, which only costs time.
_DECIDED: dict[tuple, bool | None] = {}
_DECIDED_MAX = 50_000
_UNKNOWN = object()


@dataclass(frozen=True)
class Fact:
    """One `where` clause: `lhs op rhs`."""

    lhs: DimExpr
    op: str
    rhs: DimExpr

    def __str__(self) -> str:
        return f"{self.lhs} {self.op} {self.rhs}"


@dataclass(frozen=True)
class _Rewrites:
    """What `Facts.simplify` uses: symbols solved from equalities and known multiples."""

    bindings: Mapping[str, DimExpr]                  # eliminated symbol -> its value
    multiples: tuple[tuple[DimExpr, DimExpr], ...]   # (p, q) with p % q == 0 known


@dataclass(frozen=True)
class _Bounds:
    """What `Facts.decide` uses, all in simplified form."""

    nonnegatives: tuple[DimExpr, ...]                # e >= 0 for each e
    nonzeros: tuple[DimExpr, ...]                    # e != 0 for each e
    atom_lower_bounds: Mapping[Atom, int]            # from facts `c*atom + k >= 0`
    excluded_values: Mapping[Atom, frozenset[int]]   # from facts `c*atom + k != 0`


class Facts:
    """What is known in a scope: its `where` clauses, and the reasoning that uses them.

    Immutable: `with_fact` returns a new Facts.  Every symbol is taken to be >= 0.  The
    answers are sound but incomplete: True/False only when proven, None when unknown.
    """

    def __init__(self, facts: Iterable[Fact] = ()):
        self._facts = tuple(facts)
        for fact in self._facts:
            _check_comparison(fact.op)
        # Set once an atom's bound was asked for while being worked out: from then on this
        # Facts' answers depend on the order of the questions, so they bypass `_DECIDED`.
        self._order_dependent = False
        self._pending: set[Atom] = set()

    @property
    def facts(self) -> tuple[Fact, ...]:
        """The clauses, in the order they were added."""
        return self._facts

    def with_fact(self, lhs: DimExpr | int, op: str, rhs: DimExpr | int) -> Facts:
        _check_comparison(op)
        return Facts(self._facts + (Fact(_coerce(lhs), op, _coerce(rhs)),))

    def __repr__(self) -> str:
        return f"Facts([{', '.join(str(fact) for fact in self._facts)}])"

    # -- public reasoning

    def simplify(self, expr: DimExpr | int) -> DimExpr:
        """`expr` rewritten with the facts: solved symbols substituted, remainders known to
        be 0 removed, and `q * (p / q)` replaced by `p` where `p % q == 0` is known.

        Raises DimError when the facts make a divisor the constant 0."""
        expr = _coerce(expr).substitute(self._rewrites.bindings)
        for _ in range(_MAX_REWRITE_ROUNDS):
            rewritten = self._rewrite_once(expr)
            if rewritten == expr:
                break
            expr = rewritten
        return expr

    def equal(self, left: DimExpr | int, right: DimExpr | int) -> bool:
        """True iff `left == right` is provable (False means not proven, not disproven)."""
        return self.decide(left, "==", right) is True

    def decide(self, left: DimExpr | int, op: str, right: DimExpr | int) -> bool | None:
        """Whether `left op right` provably holds (True), provably fails (False), or neither.

        None also when the facts make a divisor in either side 0: such a side has no value."""
        _check_comparison(op)
        left, right = _coerce(left), _coerce(right)
        key = (self._facts, left, op, right)
        if not self._order_dependent:
            known = _DECIDED.get(key, _UNKNOWN)
            if known is not _UNKNOWN:
                return known
        verdict = self._decide(left, op, right)
        if not self._order_dependent:
            if len(_DECIDED) >= _DECIDED_MAX:
                _DECIDED.clear()
            _DECIDED[key] = verdict
        return verdict

    def _decide(self, left: DimExpr, op: str, right: DimExpr) -> bool | None:
        difference = left - right
        try:
            difference = self.simplify(difference)
            if op in ("==", "!=") and self._known_nonzero(difference):
                return op == "!="
            low, high = self._range(difference)
        except DimError:
            return None
        return _decide_from_range(op, low, high)

    def divides(self, divisor: DimExpr | int, dividend: DimExpr | int) -> bool | None:
        """Whether `dividend % divisor == 0` is provable (True), refutable (False), or neither."""
        try:
            den = self.simplify(divisor)
            if den._is_zero:
                return None
            remainder = self.simplify(mod(self.simplify(dividend), den)).as_int()
        except DimError:
            return None
        return None if remainder is None else remainder == 0

    # -- what the clauses say, worked out once per Facts

    @cached_property
    def _rewrites(self) -> _Rewrites:
        bindings: dict[str, DimExpr] = {}
        for fact in self._facts:
            if fact.op == "==":
                bindings = _with_solution(bindings, fact)
        multiples = []
        for fact in self._facts:
            if fact.op == "==":
                divisibility = _as_divisibility(_substituted(fact.lhs - fact.rhs, bindings))
                if divisibility is not None:
                    multiples.append(divisibility)
        return _Rewrites(bindings, tuple(multiples))

    @cached_property
    def _bounds(self) -> _Bounds:
        nonnegatives: list[DimExpr] = []
        nonzeros: list[DimExpr] = []
        for fact in self._facts:
            try:
                difference = self.simplify(fact.lhs - fact.rhs)
            except DimError:
                continue  # a clause dividing by zero under the others says nothing usable
            if fact.op == "!=":
                nonzeros.append(difference)
            else:
                nonnegatives.extend(_as_nonnegatives(difference, fact.op))
        nonnegatives = [e for e in dict.fromkeys(nonnegatives) if e.as_int() is None]
        return _Bounds(tuple(nonnegatives), tuple(nonzeros),
                       _atom_lower_bounds(nonnegatives), _excluded_values(nonzeros))

    @cached_property
    def _atom_bound_cache(self) -> dict[Atom, int | None]:
        return {}

    # -- simplification

    def _rewrite_once(self, expr: DimExpr) -> DimExpr:
        expr = _rebuild(expr, self._simplify_atom)
        for atom in expr.atoms():
            if isinstance(atom, FloorDiv) and self._known_divisible(atom.den, atom.num):
                expr = _rewrite_multiples(expr, atom, remainder=ZERO)
        return expr

    def _simplify_atom(self, atom: Atom) -> DimExpr:
        if isinstance(atom, Sym):
            return _atom_expr(atom)
        num, den = self.simplify(atom.num), self.simplify(atom.den)
        if isinstance(atom, Mod) and self._known_divisible(den, num):
            return ZERO
        return atom.rebuild(num, den)

    def _known_divisible(self, den: DimExpr, num: DimExpr) -> bool:
        """Whether `num % den == 0` follows from polynomial division or from a known
        `p % q == 0` where `den` divides `q` (then every multiple of `p` is a multiple of den)."""
        if den._is_zero:
            return False
        _, rest = _split_divisible(num, den)
        if rest._is_zero:
            return True
        for multiple, divisor in self._rewrites.multiples:
            if _exact_quotient(divisor, den) is None:
                continue
            part, rest = _split_divisible(num, multiple)
            # num = multiple * t + rest; the first part is a multiple of den, so rest must be.
            if not part._is_zero and self._known_divisible(den, rest):
                return True
        return False

    # -- bounds

    def _known_nonzero(self, expr: DimExpr) -> bool:
        return expr in self._bounds.nonzeros or -expr in self._bounds.nonzeros

    def _range(self, difference: DimExpr) -> tuple[int | None, int | None]:
        """Proven bounds `low <= difference <= high` (None where nothing is proven).

        Tries the expression as it is and with `q * (p / q)` expanded to `p - p % q`, the
        identity that holds without facts and exposes remainders, which are >= 0."""
        forms = {difference, self._expand_division_identities(difference)}
        low = _max_known(self._lower_bound(form) for form in forms)
        negated_high = _max_known(self._lower_bound(-form) for form in forms)
        return low, (None if negated_high is None else -negated_high)

    def _expand_division_identities(self, expr: DimExpr) -> DimExpr:
        for atom in expr.atoms():
            if isinstance(atom, FloorDiv):
                expr = _rewrite_multiples(expr, atom, remainder=mod(atom.num, atom.den))
        return self.simplify(expr)

    def _lower_bound(self, expr: DimExpr) -> int | None:
        """A proven lower bound: the best of `expr` alone and `expr` minus one or two known
        non-negative expressions (e = (e - f) + f >= lower_bound(e - f) when f >= 0)."""
        facts = self._bounds.nonnegatives
        candidates = [expr] + [expr - fact for fact in facts] + [
            expr - first - second for first, second in combinations_with_replacement(facts, 2)]
        return _max_known(self._term_wise_lower_bound(candidate) for candidate in candidates)

    def _term_wise_lower_bound(self, expr: DimExpr) -> int | None:
        """The constant plus each term's minimum, when every non-constant term has a positive
        coefficient and atoms with non-negative lower bounds (so it grows with them)."""
        total = 0
        for monomial, coeff in expr.terms:
            if not monomial:
                total += coeff
                continue
            if coeff < 0:
                return None
            minimum = 1
            for atom, power in monomial:
                atom_low = self._atom_lower_bound(atom)
                if atom_low is None or atom_low < 0:
                    return None
                minimum *= atom_low ** power
            total += coeff * minimum
        return total

    def _atom_lower_bound(self, atom: Atom) -> int | None:
        cache = self._atom_bound_cache
        if atom in self._pending:
            self._order_dependent = True
        if atom not in cache:
            # A fact may mention the atom inside its own divisor's bounds; asking again while
            # this one is worked out gets the conservative "unknown" instead of recursing.
            cache[atom] = None
            self._pending.add(atom)
            bound = _max_known((self._intrinsic_lower_bound(atom),
                                self._bounds.atom_lower_bounds.get(atom)))
            excluded = self._bounds.excluded_values.get(atom, frozenset())
            while bound is not None and bound in excluded:
                bound += 1
            cache[atom] = bound
            self._pending.discard(atom)
        return cache[atom]

    def _intrinsic_lower_bound(self, atom: Atom) -> int | None:
        """What an atom's own form guarantees.  A division is only defined where its divisor
        is nonzero, so a divisor proven >= 0 may be taken as > 0 there."""
        if isinstance(atom, Sym):
            return 0  # dims are non-negative
        den_low = self._lower_bound(atom.den)
        if isinstance(atom, Mod):
            return 0 if den_low is not None and den_low >= 0 else None
        num_low = self._lower_bound(atom.num)
        den_value = atom.den.as_int()
        if num_low is not None and den_value is not None and den_value > 0:
            return num_low // den_value  # floor division is monotonic in the numerator
        if num_low is not None and num_low >= 0 and den_low is not None and den_low >= 0:
            return 0
        return None


def _check_comparison(op: str) -> None:
    if op not in COMPARISONS:
        raise DimError(f"unknown comparison {op!r}; expected one of {sorted(COMPARISONS)}")


def _with_solution(bindings: Mapping[str, DimExpr], fact: Fact) -> dict[str, DimExpr]:
    """`bindings` plus the equality `fact` solved for one symbol, keeping every binding free
    of eliminated symbols.  An equality that cannot be solved adds nothing."""
    difference = _substituted(fact.lhs - fact.rhs, bindings)
    name = _solvable_symbol(difference, preferred=(fact.lhs, fact.rhs))
    if name is None:
        return dict(bindings)
    coeff = dict(difference.terms)[sym(name).terms[0][0]]
    # difference == coeff * X + rest == 0 with coeff = +-1, so X == -rest / coeff.
    solution = _scaled(difference - coeff * sym(name), -coeff)
    try:
        updated = {other: value.substitute({name: solution}) for other, value in bindings.items()}
    except DimError:
        return dict(bindings)  # it would make an earlier binding divide by zero: ignore it
    return {**updated, name: solution}


def _substituted(expr: DimExpr, bindings: Mapping[str, DimExpr]) -> DimExpr:
    """`expr` with the bindings applied, or 0 (no information) when they make a divisor 0."""
    try:
        return expr.substitute(bindings)
    except DimError:
        return ZERO


def _solvable_symbol(difference: DimExpr, preferred: tuple[DimExpr, DimExpr]) -> str | None:
    """A symbol X with `difference == +-X + rest` where X does not occur in rest.  A side the
    user wrote as a bare symbol is preferred, so `D == Heads * Dh` eliminates D."""
    candidates = set()
    for monomial, coeff in difference.terms:
        name = _symbol_name(DimExpr(((monomial, 1),)))
        if name is not None and abs(coeff) == 1 \
                and name not in (difference - coeff * sym(name)).free_symbols():
            candidates.add(name)
    for side in preferred:
        if _symbol_name(side) in candidates:
            return _symbol_name(side)
    return min(candidates, default=None)


def _as_divisibility(difference: DimExpr) -> tuple[DimExpr, DimExpr] | None:
    """`(p, q)` when `difference == 0` says `c * (p % q) == 0`, i.e. `p % q == 0`."""
    if len(difference.terms) != 1:
        return None
    monomial, _ = difference.terms[0]
    if len(monomial) == 1 and isinstance(monomial[0][0], Mod):
        atom = monomial[0][0]
        return atom.num, atom.den
    return None


def _as_nonnegatives(difference: DimExpr, op: str) -> list[DimExpr]:
    """`lhs op rhs` as expressions known to be >= 0, given `difference = lhs - rhs`; strict
    comparisons tighten by one because dims are integers."""
    return {
        "==": [difference, -difference],
        ">=": [difference],
        ">": [difference - 1],
        "<=": [-difference],
        "<": [-difference - 1],
    }[op]


def _single_atom_form(expr: DimExpr) -> tuple[Atom, int, int] | None:
    """`(atom, c, k)` when `expr == c * atom + k`, else None."""
    linear = [(monomial, coeff) for monomial, coeff in expr.terms if monomial]
    if len(linear) != 1 or len(linear[0][0]) != 1 or linear[0][0][0][1] != 1:
        return None
    (monomial, coeff), = linear
    constant = dict(expr.terms).get((), 0)
    return monomial[0][0], coeff, constant


def _atom_lower_bounds(nonnegatives: Iterable[DimExpr]) -> dict[Atom, int]:
    """From facts `c * atom + k >= 0` with c > 0: `atom >= ceil(-k / c)`."""
    bounds: dict[Atom, int] = {}
    for expr in nonnegatives:
        form = _single_atom_form(expr)
        if form is not None and form[1] > 0:
            atom, coeff, constant = form
            bounds[atom] = _max_known((bounds.get(atom), -(constant // coeff)))
    return bounds


def _excluded_values(nonzeros: Iterable[DimExpr]) -> dict[Atom, frozenset[int]]:
    """From facts `c * atom + k != 0`: `atom != -k / c` when that is an integer."""
    excluded: dict[Atom, frozenset[int]] = {}
    for expr in nonzeros:
        form = _single_atom_form(expr)
        if form is not None and form[2] % form[1] == 0:
            atom, coeff, constant = form
            excluded[atom] = excluded.get(atom, frozenset()) | {-constant // coeff}
    return excluded


def _max_known(bounds: Iterable[int | None]) -> int | None:
    """The best of several lower bounds, None standing for "no bound"."""
    return max((bound for bound in bounds if bound is not None), default=None)


def _rewrite_multiples(expr: DimExpr, atom: FloorDiv, remainder: DimExpr) -> DimExpr:
    """Rewrite `den * (num / den)` to `num - remainder` wherever `expr` multiplies the atom by
    a multiple of its divisor.  Sound when `remainder` equals `num % den`: always for the
    `Mod` atom itself, and for 0 when the remainder is known to be 0."""
    cofactor, rest = _split_by_atom(expr, atom)
    multiple, leftover = _split_divisible(cofactor, atom.den)
    if multiple._is_zero:
        return expr
    # atom * cofactor == atom * (den * multiple + leftover) and den * atom == num - remainder.
    return (atom.num - remainder) * multiple + _atom_expr(atom) * leftover + rest


def _split_by_atom(expr: DimExpr, atom: Atom) -> tuple[DimExpr, DimExpr]:
    """`(cofactor, rest)` with `expr == atom * cofactor + rest` and no `atom` at top level of rest."""
    single = ((atom, 1),)
    with_atom: dict[Monomial, int] = {}
    without: dict[Monomial, int] = {}
    for monomial, coeff in expr.terms:
        reduced = _monomial_quotient(monomial, single)
        if reduced is None:
            without[monomial] = coeff
        else:
            with_atom[reduced] = coeff
    return _from_coefficients(with_atom), _from_coefficients(without)


def _decide_from_range(op: str, low: int | None, high: int | None) -> bool | None:
    """The truth of `difference op 0` given `low <= difference <= high` (None: unbounded)."""
    def at_least(value: int) -> bool:
        return low is not None and low >= value

    def at_most(value: int) -> bool:
        return high is not None and high <= value

    if op == ">=":
        return _verdict(at_least(0), at_most(-1))
    if op == ">":
        return _verdict(at_least(1), at_most(0))
    if op == "<=":
        return _verdict(at_most(0), at_least(1))
    if op == "<":
        return _verdict(at_most(-1), at_least(0))
    equal = _verdict(at_least(0) and at_most(0), at_least(1) or at_most(-1))
    if op == "==":
        return equal
    return None if equal is None else not equal


def _verdict(proven: bool, refuted: bool) -> bool | None:
    if proven:
        return True
    return False if refuted else None
