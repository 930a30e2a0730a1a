"""Symbolic dimension algebra: the arithmetic the type checker does on tensor shapes.

A dimension is a non-negative integer that may be unknown when a block is checked: a
generic such as `D`, `Heads` or `S`, or an expression over generics such as `D / Heads`.
Expressions are built from integer constants and symbols with `+ - * / %`, where `/` is
floor division (exact when the divisor divides) and `%` the matching remainder.

Semantics
---------
`/` and `%` mean exactly Python's `//` and `%`, for every sign.  Dims are never negative,
but a subexpression such as `S - 1` can be, so every rewrite the constructors apply holds
for any values at which the divisors are nonzero (the expression is undefined elsewhere).

Normal form
-----------
A `DimExpr` is a polynomial with integer coefficients over *atoms*:

* `Sym(name)`, a generic dimension;
* `FloorDiv(num, den)`, a floor division that could not be simplified away;
* `Mod(num, den)`, a remainder that could not be simplified away.

It is stored as a tuple of `(monomial, coefficient)` pairs with nonzero coefficients, and a
monomial is a tuple of `(atom, power)` pairs with positive powers.  Both are sorted by
`sort_key` (symbols by name, then floor divisions, then remainders, each by its
arguments, which are themselves normal forms), so the tuple is canonical: expressions equal
as polynomials are equal `DimExpr` values with equal hashes, e.g. `a*(b+c) == a*c + b*a`.

Canonical as polynomials over atoms is not the same as complete over the integers:
`H * (D / H) + D % H` is `D` for every `H != 0` but has a different normal form.  Proofs
that need such identities, or the `where` clauses of a scope, go through `Facts`.

Simplifications applied by every constructor (none needs a fact):

* constant folding: `6 / 4` is `1`, `7 % 3` is `1`;
* exact division: when the divisor divides the numerator as a polynomial the quotient
  replaces the division, so `(Heads * Dh) / Heads` is `Dh`, `(2*S + 4) / 2` is `S + 2`,
  `x / 1` is `x`, `0 / x` is `0`, and the matching remainders are `0`;
* splitting off divisible terms: `(q*r + s) / q` is `r + s / q` and `(q*r + s) % q` is
  `s % q` when `q` is a single term;
* cancelling a common factor: `(2*S) / (2*T)` is `S / T`, `(2*S) % (2*T)` is `2 * (S % T)`;
* `(x % q) % q` is `x % q`.

A constant zero divisor raises `DimError`.

`Facts` (in `linnet.dims.facts`) proves what the normal form alone cannot.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property, cmp_to_key
from typing import Callable, Mapping, Union

__all__ = ["DimError", "DimExpr", "Sym", "FloorDiv", "Mod", "Atom", "const", "sym", "floordiv", "mod"]


#: The largest value a dim may take: every backend stores a tensor's dims as 64-bit signed
#: integers (numpy, torch, ONNX's TensorShapeProto, XLA).
MAX_DIM = 2**63 - 1


class DimError(ValueError):
    """A dimension computation that has no value: division by zero, an unbound symbol."""


# ------------------------------------------------------------------------------ atoms


@dataclass(frozen=True)
class Sym:
    """A generic dimension, such as `D` or `Heads`."""

    name: str

    @cached_property
    def sort_key(self) -> tuple:
        return (0, self.name)

    def free_symbols(self) -> frozenset[str]:
        return frozenset((self.name,))

    def evaluate(self, env: Mapping[str, int]) -> int:
        try:
            return env[self.name]
        except KeyError:
            raise DimError(f"no value for dimension {self.name!r}") from None

    def __str__(self) -> str:
        return self.name


@dataclass(frozen=True)
class _Division:
    """What `FloorDiv` and `Mod` share: two normal-form arguments."""

    num: DimExpr
    den: DimExpr

    _KIND = 0         # position among atom kinds in the canonical order
    _OPERATOR = ""    # how Linnet spells the operation

    @cached_property
    def sort_key(self) -> tuple:
        return (self._KIND, self.num.sort_key, self.den.sort_key)

    def free_symbols(self) -> frozenset[str]:
        return self.num.free_symbols() | self.den.free_symbols()

    def evaluate(self, env: Mapping[str, int]) -> int:
        den = self.den.evaluate(env)
        if den == 0:
            raise DimError(f"division by zero in {self} (the divisor {self.den} is 0)")
        return self._apply(self.num.evaluate(env), den)

    def rebuild(self, num: DimExpr, den: DimExpr) -> DimExpr:
        """The same operation on new arguments, simplified by its constructor."""
        raise NotImplementedError

    @staticmethod
    def _apply(num: int, den: int) -> int:
        raise NotImplementedError

    def __str__(self) -> str:
        return f"{_render_dividend(self.num)} {self._OPERATOR} {_render_divisor(self.den)}"


@dataclass(frozen=True)
class FloorDiv(_Division):
    """`num / den` in Linnet: floor division that did not simplify away."""

    _KIND = 1
    _OPERATOR = "/"

    def rebuild(self, num: DimExpr, den: DimExpr) -> DimExpr:
        return floordiv(num, den)

    @staticmethod
    def _apply(num: int, den: int) -> int:
        return num // den


@dataclass(frozen=True)
class Mod(_Division):
    """`num % den`: the remainder matching `FloorDiv`, with the sign of `den` as in Python."""

    _KIND = 2
    _OPERATOR = "%"

    def rebuild(self, num: DimExpr, den: DimExpr) -> DimExpr:
        return mod(num, den)

    @staticmethod
    def _apply(num: int, den: int) -> int:
        return num % den


Atom = Union[Sym, FloorDiv, Mod]
Monomial = tuple[tuple[Atom, int], ...]
Terms = tuple[tuple[Monomial, int], ...]


# ------------------------------------------------------------------------------ monomials


def _monomial(powers: Mapping[Atom, int]) -> Monomial:
    return tuple(sorted(((atom, power) for atom, power in powers.items() if power),
                        key=lambda item: item[0].sort_key))


def _monomial_key(monomial: Monomial) -> tuple:
    return tuple((atom.sort_key, power) for atom, power in monomial)


def _monomial_product(left: Monomial, right: Monomial) -> Monomial:
    powers = dict(left)
    for atom, power in right:
        powers[atom] = powers.get(atom, 0) + power
    return _monomial(powers)


def _monomial_quotient(monomial: Monomial, divisor: Monomial) -> Monomial | None:
    """`monomial / divisor` when every atom of the divisor occurs often enough, else None."""
    powers = dict(monomial)
    for atom, power in divisor:
        left = powers.get(atom, 0) - power
        if left < 0:
            return None
        powers[atom] = left
    return _monomial(powers)


def _monomial_gcd(left: Monomial, right: Monomial) -> Monomial:
    right_powers = dict(right)
    return _monomial({atom: min(power, right_powers.get(atom, 0)) for atom, power in left})


def _degree(monomial: Monomial) -> int:
    return sum(power for _, power in monomial)


def _graded_lex_compare(left: Monomial, right: Monomial) -> int:
    """Order monomials by total degree, then lexicographically by exponent, atoms taken in
    canonical order.  This is a monomial order (compatible with multiplication), which is
    what makes the leading-term test in `_exact_quotient` a proof of non-divisibility."""
    if _degree(left) != _degree(right):
        return -1 if _degree(left) < _degree(right) else 1
    for (left_atom, left_power), (right_atom, right_power) in zip(left, right):
        if left_atom != right_atom:
            # The side holding the earlier atom has a positive exponent where the other has 0.
            return 1 if left_atom.sort_key < right_atom.sort_key else -1
        if left_power != right_power:
            return -1 if left_power < right_power else 1
    return 0


_GRADED_LEX = cmp_to_key(_graded_lex_compare)


# ------------------------------------------------------------------------------ DimExpr


@dataclass(frozen=True, repr=False)
class DimExpr:
    """A dimension expression in normal form (see the module docstring).

    Build values with `const`, `sym`, the arithmetic operators, `floordiv` and `mod`; the
    `terms` tuple must already be canonical, so do not construct `DimExpr(...)` directly.
    """

    terms: Terms

    # -- inspection

    def as_int(self) -> int | None:
        """The value when the expression is a constant, else None."""
        if not self.terms:
            return 0
        if len(self.terms) == 1 and not self.terms[0][0]:
            return self.terms[0][1]
        return None

    def free_symbols(self) -> frozenset[str]:
        """Every symbol name that occurs, including inside divisions and remainders."""
        return self._symbols

    @cached_property
    def _symbols(self) -> frozenset[str]:
        return frozenset().union(*(atom.free_symbols() for atom in self.atoms()))

    def atoms(self) -> tuple[Atom, ...]:
        """The distinct top-level atoms, in canonical order."""
        return tuple(dict.fromkeys(atom for monomial, _ in self.terms for atom, _ in monomial))

    @cached_property
    def sort_key(self) -> tuple:
        return tuple((_monomial_key(monomial), coeff) for monomial, coeff in self.terms)

    @property
    def _is_zero(self) -> bool:
        return not self.terms

    # -- rewriting and evaluation

    def substitute(self, mapping: Mapping[str, DimExpr | int]) -> DimExpr:
        """Replace symbols by expressions or ints and simplify the result again.

        Raises DimError when a divisor becomes the constant 0."""
        replacements = {name: _coerce(value) for name, value in mapping.items()}
        # Only the replacements of its own symbols matter; with none, rebuilding gives the
        # same normal form again (every atom was made by the constructor it is rebuilt with).
        used = tuple(sorted(((name, value) for name, value in replacements.items() if name in self._symbols),
                            key=lambda item: item[0]))
        if not used:
            return self
        key = (self, used)
        result = _SUBSTITUTED.get(key)
        if result is None:
            result = self._substitute(dict(used))
            if len(_SUBSTITUTED) >= _SUBSTITUTED_MAX:
                _SUBSTITUTED.clear()
            _SUBSTITUTED[key] = result
        return result

    def _substitute(self, replacements: Mapping[str, DimExpr]) -> DimExpr:
        def replace(atom: Atom) -> DimExpr:
            if isinstance(atom, Sym):
                return replacements.get(atom.name, _atom_expr(atom))
            return atom.rebuild(atom.num.substitute(replacements),
                                atom.den.substitute(replacements))

        return _rebuild(self, replace)

    def evaluate(self, env: Mapping[str, int]) -> int:
        """The value for the given symbol values; DimError on a missing symbol or a zero divisor."""
        return sum(coeff * math.prod(atom.evaluate(env) ** power for atom, power in monomial)
                   for monomial, coeff in self.terms)

    # -- operators: ints are accepted on either side

    def __add__(self, other: DimExpr | int) -> DimExpr:
        other = _operand(other)
        return NotImplemented if other is None else _sum(self, other)

    __radd__ = __add__

    def __sub__(self, other: DimExpr | int) -> DimExpr:
        other = _operand(other)
        return NotImplemented if other is None else _sum(self, _scaled(other, -1))

    def __rsub__(self, other: DimExpr | int) -> DimExpr:
        other = _operand(other)
        return NotImplemented if other is None else _sum(other, _scaled(self, -1))

    def __mul__(self, other: DimExpr | int) -> DimExpr:
        other = _operand(other)
        return NotImplemented if other is None else _product(self, other)

    __rmul__ = __mul__

    def __floordiv__(self, other: DimExpr | int) -> DimExpr:
        other = _operand(other)
        return NotImplemented if other is None else floordiv(self, other)

    def __rfloordiv__(self, other: DimExpr | int) -> DimExpr:
        other = _operand(other)
        return NotImplemented if other is None else floordiv(other, self)

    def __mod__(self, other: DimExpr | int) -> DimExpr:
        other = _operand(other)
        return NotImplemented if other is None else mod(self, other)

    def __rmod__(self, other: DimExpr | int) -> DimExpr:
        other = _operand(other)
        return NotImplemented if other is None else mod(other, self)

    def __neg__(self) -> DimExpr:
        return _scaled(self, -1)

    def __pos__(self) -> DimExpr:
        return self

    # -- text

    def __str__(self) -> str:
        return _render(self)

    def __repr__(self) -> str:
        return f"DimExpr({str(self)!r})"


#: `substitute`'s results, by expression and the replacements of its symbols: checking BERT
#: substitutes about 4,600 times, some 70 distinct substitutions.  Emptied when full.
_SUBSTITUTED: dict[tuple, DimExpr] = {}
_SUBSTITUTED_MAX = 50_000


def _from_coefficients(coefficients: Mapping[Monomial, int]) -> DimExpr:
    """The canonical DimExpr for a monomial -> coefficient mapping (zeros dropped)."""
    terms = [(monomial, coeff) for monomial, coeff in coefficients.items() if coeff]
    terms.sort(key=lambda term: _monomial_key(term[0]))
    return DimExpr(tuple(terms))


def _atom_expr(atom: Atom) -> DimExpr:
    return DimExpr(((((atom, 1),), 1),))


ZERO = DimExpr(())
ONE = DimExpr((((), 1),))


def const(value: int) -> DimExpr:
    """The constant `value`."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"a dimension constant must be an int, not {type(value).__name__}")
    return DimExpr((((), value),)) if value else ZERO


def sym(name: str) -> DimExpr:
    """The generic dimension called `name`."""
    if not isinstance(name, str) or not name:
        raise TypeError(f"a dimension symbol needs a non-empty name, not {name!r}")
    made = _SYMBOLS.get(name)
    if made is None:  # one value per name, so its hash and sort key are worked out once
        if len(_SYMBOLS) >= 10_000:
            _SYMBOLS.clear()
        made = _SYMBOLS[name] = _atom_expr(Sym(name))
    return made


_SYMBOLS: dict[str, DimExpr] = {}


def _operand(value: object) -> DimExpr | None:
    """`value` as a DimExpr when it is one or an int, else None (for NotImplemented)."""
    if isinstance(value, DimExpr):
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        return const(value)
    return None


def _coerce(value: DimExpr | int) -> DimExpr:
    result = _operand(value)
    if result is None:
        raise TypeError(f"expected a DimExpr or an int, not {type(value).__name__}")
    return result


# ------------------------------------------------------------------------------ ring operations


def _sum(left: DimExpr, right: DimExpr) -> DimExpr:
    coefficients = dict(left.terms)
    for monomial, coeff in right.terms:
        coefficients[monomial] = coefficients.get(monomial, 0) + coeff
    return _from_coefficients(coefficients)


def _scaled(expr: DimExpr, factor: int) -> DimExpr:
    return _from_coefficients({monomial: coeff * factor for monomial, coeff in expr.terms})


def _product(left: DimExpr, right: DimExpr) -> DimExpr:
    coefficients: dict[Monomial, int] = {}
    for left_monomial, left_coeff in left.terms:
        for right_monomial, right_coeff in right.terms:
            monomial = _monomial_product(left_monomial, right_monomial)
            coefficients[monomial] = coefficients.get(monomial, 0) + left_coeff * right_coeff
    return _from_coefficients(coefficients)


def _power(expr: DimExpr, exponent: int) -> DimExpr:
    result = ONE
    for _ in range(exponent):
        result = _product(result, expr)
    return result


def _rebuild(expr: DimExpr, replace_atom: Callable[[Atom], DimExpr]) -> DimExpr:
    """`expr` with every top-level atom replaced by `replace_atom(atom)`, multiplied out."""
    total = ZERO
    for monomial, coeff in expr.terms:
        term = const(coeff)
        for atom, power in monomial:
            term = _product(term, _power(replace_atom(atom), power))
        total = _sum(total, term)
    return total


# ------------------------------------------------------------------------------ division


def _check_divisor(den: DimExpr) -> None:
    if den._is_zero:
        raise DimError("division by zero: the divisor is the constant 0")


def floordiv(numerator: DimExpr | int, denominator: DimExpr | int) -> DimExpr:
    """`numerator / denominator` in Linnet (Python's `//`), simplified."""
    num, den = _coerce(numerator), _coerce(denominator)
    _check_divisor(den)
    if num.as_int() is not None and den.as_int() is not None:
        return const(num.as_int() // den.as_int())
    quotient, rest = _split_divisible(num, den)
    if rest._is_zero:
        return quotient
    if not quotient._is_zero:
        # floor((q*r + s) / q) == r + floor(s / q) for integers r, s and any q != 0.
        return _sum(quotient, floordiv(rest, den))
    common = _common_factor(num, den)
    if common is not None:
        # floor((k*a) / (k*b)) == floor(a / b) for any k != 0, and k != 0 wherever k*b != 0.
        return floordiv(_divide_exactly(num, common), _divide_exactly(den, common))
    return _atom_expr(FloorDiv(num, den))


def mod(numerator: DimExpr | int, denominator: DimExpr | int) -> DimExpr:
    """`numerator % denominator` (Python's `%`), simplified."""
    num, den = _coerce(numerator), _coerce(denominator)
    _check_divisor(den)
    if num.as_int() is not None and den.as_int() is not None:
        return const(num.as_int() % den.as_int())
    _, rest = _split_divisible(num, den)
    if rest._is_zero:
        return ZERO
    if rest != num:
        return mod(rest, den)  # (q*r + s) % q == s % q
    if _is_remainder_by(num, den):
        return num  # (x % q) % q == x % q: the inner result already lies in the range of q.
    common = _common_factor(num, den)
    if common is not None:
        # (k*a) % (k*b) == k * (a % b) for any k != 0.
        reduced = mod(_divide_exactly(num, common), _divide_exactly(den, common))
        return _product(common, reduced)
    return _atom_expr(Mod(num, den))


def _split_divisible(num: DimExpr, den: DimExpr) -> tuple[DimExpr, DimExpr]:
    """Split `num` as `den * quotient + rest` as polynomials.

    For a single-term divisor every term it divides (coefficient and atoms) goes to the
    quotient and the others stay in `rest`.  For a longer divisor only exact division is
    tried, since a partial quotient would depend on the arbitrary monomial order.
    """
    if len(den.terms) != 1:
        exact = _exact_quotient(num, den)
        return (exact, ZERO) if exact is not None else (ZERO, num)
    (den_monomial, den_coeff), = den.terms
    quotient: dict[Monomial, int] = {}
    rest: dict[Monomial, int] = {}
    for monomial, coeff in num.terms:
        reduced = _monomial_quotient(monomial, den_monomial)
        if reduced is not None and coeff % den_coeff == 0:
            quotient[reduced] = coeff // den_coeff
        else:
            rest[monomial] = coeff
    return _from_coefficients(quotient), _from_coefficients(rest)


def _exact_quotient(num: DimExpr, den: DimExpr) -> DimExpr | None:
    """The polynomial `num / den` when it has integer coefficients, else None.

    Multivariate division by one polynomial under a monomial order: if the leading term of
    what is left is not a multiple of the divisor's leading term, the divisor cannot divide.
    """
    if den._is_zero:
        return None
    lead_monomial = max((monomial for monomial, _ in den.terms), key=_GRADED_LEX)
    lead_coeff = dict(den.terms)[lead_monomial]
    remainder = dict(num.terms)
    quotient: dict[Monomial, int] = {}
    while remainder:
        monomial = max(remainder, key=_GRADED_LEX)
        factor = _monomial_quotient(monomial, lead_monomial)
        if factor is None or remainder[monomial] % lead_coeff:
            return None
        step = remainder[monomial] // lead_coeff
        quotient[factor] = step  # leading monomials strictly decrease, so factors are distinct
        for den_monomial, den_coeff in den.terms:
            target = _monomial_product(factor, den_monomial)
            left = remainder.get(target, 0) - step * den_coeff
            if left:
                remainder[target] = left
            else:
                remainder.pop(target, None)
    return _from_coefficients(quotient)


def _divide_exactly(num: DimExpr, den: DimExpr) -> DimExpr:
    quotient, rest = _split_divisible(num, den)
    assert rest._is_zero, f"{den} does not divide {num}"
    return quotient


def _common_factor(num: DimExpr, den: DimExpr) -> DimExpr | None:
    """The largest single term (positive gcd of coefficients times common atoms) dividing
    both, or None when that is 1."""
    terms = num.terms + den.terms
    content = math.gcd(*(coeff for _, coeff in terms))
    shared = terms[0][0]
    for monomial, _ in terms[1:]:
        shared = _monomial_gcd(shared, monomial)
    if content == 1 and not shared:
        return None
    return DimExpr(((shared, content),))


def _symbol_name(expr: DimExpr) -> str | None:
    """The name when `expr` is exactly one symbol, else None."""
    atoms = expr.atoms()
    if len(atoms) == 1 and isinstance(atoms[0], Sym) and expr == _atom_expr(atoms[0]):
        return atoms[0].name
    return None


def _is_remainder_by(expr: DimExpr, den: DimExpr) -> bool:
    """Whether `expr` is exactly the atom `something % den`."""
    if len(expr.terms) != 1:
        return False
    monomial, coeff = expr.terms[0]
    if coeff != 1 or len(monomial) != 1:
        return False
    atom, power = monomial[0]
    return power == 1 and isinstance(atom, Mod) and atom.den == den


# ------------------------------------------------------------------------------ rendering


def _render(expr: DimExpr) -> str:
    if expr._is_zero:
        return "0"
    (first_monomial, first_coeff), *others = _display_order(expr.terms)
    parts = ["-" if first_coeff < 0 else "",
             _render_term(first_monomial, abs(first_coeff), after_minus=first_coeff < 0)]
    for monomial, coeff in others:
        parts.append(" - " if coeff < 0 else " + ")
        parts.append(_render_term(monomial, abs(coeff)))
    return "".join(parts)


def _display_order(terms: Terms) -> list[tuple[Monomial, int]]:
    """Canonical order with the constant last, and a positive term first when there is one,
    so that users read `S - 1` and `1 - S` rather than `-1 + S` and `-S + 1`."""
    ordered = [term for term in terms if term[0]] + [term for term in terms if not term[0]]
    first_positive = next((i for i, (_, coeff) in enumerate(ordered) if coeff > 0), 0)
    ordered.insert(0, ordered.pop(first_positive))
    return ordered


def _render_term(monomial: Monomial, magnitude: int, after_minus: bool = False) -> str:
    factors: list[object] = [] if magnitude == 1 and monomial else [magnitude]
    for atom, power in monomial:
        factors.extend([atom] * power)
    # `/` and `%` bind like `*`, so a division is bracketed inside a product (where
    # `H * D / H` would mean `(H * D) / H`) and after a unary minus.
    bracket_divisions = len(factors) > 1 or after_minus
    return " * ".join(
        f"({factor})" if bracket_divisions and isinstance(factor, _Division) else str(factor)
        for factor in factors)


def _render_dividend(expr: DimExpr) -> str:
    """The left operand of `/` or `%`: operators of the same precedence associate left,
    so only sums and negated terms need brackets."""
    text = str(expr)
    needs_brackets = len(expr.terms) > 1 or (expr.terms and expr.terms[0][1] < 0)
    return f"({text})" if needs_brackets else text


def _render_divisor(expr: DimExpr) -> str:
    """The right operand of `/` or `%`: bare only when it is a symbol or a natural number."""
    value = expr.as_int()
    bare = (value is not None and value >= 0) or _symbol_name(expr) is not None
    return str(expr) if bare else f"({expr})"


# ------------------------------------------------------------------------------ facts
