"""Tests for linnet.dims: the normal form, its simplifications, and reasoning under facts."""
from __future__ import annotations

import operator

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from linnet.dims import DimError, DimExpr, Facts, const, floordiv, mod, sym

a, b, c = sym("a"), sym("b"), sym("c")
B, S, D, Dh, H = sym("B"), sym("S"), sym("D"), sym("Dh"), sym("Heads")
Max = sym("MaxPositions")

PROPERTY = settings(max_examples=200, deadline=None)
# Drawing several trees is dominated by Hypothesis's own cost; fewer examples keep the file fast.
PROPERTY_MANY_TREES = settings(max_examples=100, deadline=None)


# ------------------------------------------------------------------------------ normal form


def test_equal_polynomials_are_equal_values_with_equal_hashes():
    left, right = a * (b + c), a * c + b * a
    assert left == right
    assert hash(left) == hash(right)
    assert len({left, right, (b + c) * a}) == 1


def test_differently_valued_expressions_differ():
    assert a + b != a * b
    assert floordiv(a, b) != mod(a, b)


def test_ints_mix_with_expressions_on_either_side():
    assert 2 * D == D + D
    assert 1 + S == S + 1
    assert 10 - S == -(S - 10)
    assert (12 // H).free_symbols() == {"Heads"}
    assert str(7 % H) == "7 % Heads"


def test_non_dimension_operands_are_rejected():
    with pytest.raises(TypeError):
        D + "x"
    with pytest.raises(TypeError):
        const(1.5)
    with pytest.raises(TypeError):
        sym("")


def test_constant_folding():
    assert (const(6) // 4) == const(1)
    assert (const(7) % 3).as_int() == 1
    assert (const(-7) // 2).as_int() == -4  # Python's floor semantics
    assert (const(-7) % 2).as_int() == 1
    assert (const(2) * 3 + 4 - 1).as_int() == 9


def test_trivial_divisions():
    assert D // 1 == D
    assert (D % 1).as_int() == 0
    assert (0 // D).as_int() == 0
    assert (0 % D).as_int() == 0
    assert D // -1 == -D


def test_exact_division_by_a_monomial_or_constant():
    assert (H * Dh) // H == Dh
    assert ((H * Dh) % H).as_int() == 0
    assert (2 * S + 4) // 2 == S + 2
    assert (6 * B * S * S) // (3 * S) == 2 * B * S


def test_exact_division_by_a_polynomial():
    assert (a * b + a * c) // (b + c) == a
    assert ((a + b) * (a - b)) // (a - b) == a + b
    assert ((a * b + a * c) % (b + c)).as_int() == 0


def test_divisible_terms_split_off():
    assert (2 * S + 1) // 2 == S
    assert ((2 * S + 1) % 2).as_int() == 1
    assert (D + 2 * H) // H == D // H + 2
    assert (D + 2 * H) % H == D % H


def test_common_factors_cancel():
    assert (2 * S) // (2 * B) == S // B
    assert (2 * S + 4) % 6 == 2 * ((S + 2) % 3)
    assert (H * D) // (H * B) == D // B


def test_remainder_of_a_remainder():
    assert (D % H) % H == D % H


def test_inexact_division_stays_symbolic():
    assert (S // 2).as_int() is None
    assert (S // 2) * 2 != S


@pytest.mark.parametrize("make", [lambda: D // 0, lambda: D % 0, lambda: D // (S - S),
                                  lambda: floordiv(3, 0), lambda: mod(D, const(0))])
def test_constant_zero_divisor_is_an_error(make):
    with pytest.raises(DimError):
        make()


def test_dim_error_is_a_value_error():
    assert issubclass(DimError, ValueError)


def test_as_int():
    assert const(5).as_int() == 5
    assert (S - S).as_int() == 0
    assert (S + 1).as_int() is None


def test_free_symbols_include_those_inside_divisions():
    assert (B * S + D // H + (S % Max)).free_symbols() == {"B", "S", "D", "Heads", "MaxPositions"}
    assert const(3).free_symbols() == frozenset()


def test_substitute_everything_gives_a_constant():
    expr = H * (D // H) + 2 * S - 1
    assert expr.substitute({"Heads": 4, "D": 10, "S": 3}) == const(4 * 2 + 6 - 1)


def test_substitute_resimplifies():
    assert (D // H).substitute({"D": H * Dh}) == Dh
    assert (S % 2).substitute({"S": 2 * B + 1}) == const(1)
    assert (a + b).substitute({"a": b}) == 2 * b


def test_substitute_into_a_zero_divisor_is_an_error():
    with pytest.raises(DimError):
        (D // H).substitute({"Heads": 0})


def test_evaluate():
    assert (B * S + D // H - D % H).evaluate({"B": 2, "S": 3, "D": 10, "Heads": 4}) == 6 + 2 - 2
    assert const(7).evaluate({}) == 7


def test_evaluate_errors():
    with pytest.raises(DimError, match="Heads"):
        (D // H).evaluate({"D": 4})
    with pytest.raises(DimError, match="division by zero"):
        (D // H).evaluate({"D": 4, "Heads": 0})
    with pytest.raises(DimError):
        (D % H).evaluate({"D": 4, "Heads": 0})


@pytest.mark.parametrize("expr, text", [
    (D // H, "D / Heads"),
    (H * (D // H), "Heads * (D / Heads)"),
    (B * S, "B * S"),
    (S - 1, "S - 1"),
    (1 - S, "1 - S"),
    (2 * D + 1, "2 * D + 1"),
    (-2 * D, "-2 * D"),
    (D % H, "D % Heads"),
    (const(7), "7"),
    (const(-3), "-3"),
    (const(0), "0"),
    (S * S, "S * S"),
    (2 * (D // H), "2 * (D / Heads)"),
    (-(D // H), "-(D / Heads)"),
    (D // H + 1, "D / Heads + 1"),
    (D // (2 * H), "D / (2 * Heads)"),
    ((S + 1) // 2, "(S + 1) / 2"),
    (D // H // B, "D / Heads / B"),
    (D // (H // 2), "D / (Heads / 2)"),
])
def test_rendering(expr, text):
    assert str(expr) == text


def test_rendering_is_independent_of_construction_order():
    assert str(S * B + 1) == str(1 + B * S) == "B * S + 1"


def test_repr_shows_the_expression():
    assert repr(S - 1) == "DimExpr('S - 1')"


# ------------------------------------------------------------------------------ facts

DIVISIBLE = Facts().with_fact(D % H, "==", 0)


def test_facts_are_immutable():
    empty = Facts()
    extended = empty.with_fact(H, ">", 0)
    assert empty.facts == ()
    assert [str(fact) for fact in extended.facts] == ["Heads > 0"]


def test_unknown_comparison_is_an_error():
    with pytest.raises(DimError):
        Facts().with_fact(H, "=>", 0)
    with pytest.raises(DimError):
        Facts().decide(H, "<>", 0)


def test_a_known_divisibility_proves_the_round_trip():
    assert DIVISIBLE.equal(H * (D // H), D)
    assert not Facts().equal(H * (D // H), D)


def test_exact_division_needs_no_facts():
    assert Facts().equal((H * Dh) // H, Dh)


def test_simplify_with_a_known_divisibility():
    assert DIVISIBLE.simplify(D % H) == const(0)
    assert DIVISIBLE.simplify(3 * H * B * (D // H) + 1) == 3 * B * D + 1
    assert DIVISIBLE.simplify((H + 1) * (D // H)) == D + D // H
    assert DIVISIBLE.simplify((2 * D) % H) == const(0)
    assert DIVISIBLE.simplify(S // (D % H + 1)) == S


def test_simplify_without_facts_changes_nothing():
    expr = H * (D // H) + D % H
    assert Facts().simplify(expr) == expr


def test_divisibility_of_a_multiple_of_the_divisor():
    facts = Facts().with_fact(D % (2 * H), "==", 0)
    assert facts.divides(H, D) is True
    assert facts.divides(H, 3 * D + H * S) is True
    assert facts.divides(H, D + 1) is None
    assert facts.simplify(2 * H * (D // (2 * H))) == D


def test_divides_with_constants_and_polynomials():
    assert Facts().divides(3, 6) is True
    assert Facts().divides(4, 6) is False
    assert Facts().divides(2, 2 * S + 1) is False
    assert Facts().divides(H, H * Dh) is True
    assert Facts().divides(H, D) is None
    assert Facts().divides(0, D) is None


def test_an_equality_with_a_bare_symbol_substitutes():
    facts = Facts().with_fact(D, "==", H * Dh)
    assert facts.simplify(D // H) == Dh
    assert facts.divides(H, D) is True
    assert facts.equal(H * (D // H), D)


def test_chained_equalities_stay_solved():
    facts = Facts().with_fact(a, "==", b + 1).with_fact(b, "==", 2 * c)
    assert facts.simplify(a) == 2 * c + 1
    assert facts.equal(a - b, 1)


def test_decide_with_constants():
    assert Facts().decide(3, "<", 4) is True
    assert Facts().decide(3, "==", 4) is False
    assert Facts().decide(const(3), "!=", 4) is True


def test_decide_uses_non_negativity_of_dims():
    facts = Facts()
    assert facts.decide(B * S, ">=", 0) is True
    assert facts.decide(S + 1, ">", 0) is True
    assert facts.decide(S + 1, "==", 0) is False
    assert facts.decide(S - 1, ">=", 0) is None
    assert facts.decide(S, "<", B) is None
    assert facts.decide(D % H, ">=", 0) is True
    assert facts.decide(H * (D // H), "<=", D) is True


def test_strict_facts_tighten_bounds():
    positive = Facts().with_fact(H, ">", 0)
    assert positive.decide(H, ">=", 1) is True
    assert positive.decide(H, "==", 0) is False
    assert positive.decide(S - 1, ">=", 0) is None
    assert Facts().with_fact(H, "!=", 0).decide(H, ">", 0) is True
    assert Facts().with_fact(S, ">=", 1).decide(S * B - B, ">=", 0) is None  # not linear


def test_decide_with_an_upper_bound_fact():
    facts = Facts().with_fact(S, "<=", Max)
    assert facts.decide(S, "<=", Max) is True
    assert facts.decide(Max, ">=", S) is True
    assert facts.decide(S, ">", Max) is False
    assert facts.decide(S + 1, "<=", Max) is None
    assert facts.decide(S, "<", Max + 1) is True
    assert facts.decide(S, "==", Max) is None


def test_decide_chains_two_facts():
    facts = Facts().with_fact(S, "<=", Max).with_fact(Max, "<", B)
    assert facts.decide(S, "<", B) is True
    assert facts.decide(S, ">=", B) is False


def test_disequality_facts_refute_equality():
    facts = Facts().with_fact(S, "!=", B)
    assert facts.decide(S, "==", B) is False
    assert facts.decide(B, "!=", S) is True


def test_an_unsolvable_equality_still_proves():
    facts = Facts().with_fact(B * S, "==", D * H)
    assert facts.equal(S * B, H * D)
    assert facts.decide(B * S + 1, ">", D * H) is True


def test_a_divisor_made_zero_by_the_facts():
    facts = Facts().with_fact(H, "==", 0)
    with pytest.raises(DimError):
        facts.simplify(D // H)
    assert facts.decide(D // H, ">=", 0) is None
    assert facts.divides(H, D) is None


def test_a_fact_bounding_an_atom_by_its_own_divisor():
    facts = Facts().with_fact(H, ">=", D // H).with_fact(D // H, ">", 2)
    assert facts.decide(D // H, ">=", 3) is True
    assert facts.decide(H, ">=", 3) is True
    assert facts.decide(H, ">=", 4) is None


# ------------------------------------------------------------------------------ properties
#
# Random expression trees are nested tuples, evaluated directly with Python ints so that the
# normal form is checked against Python's `//` and `%`, whatever the signs of the values.

OPERATIONS = {"+": operator.add, "-": operator.sub, "*": operator.mul,
              "//": operator.floordiv, "%": operator.mod}


def trees(names: tuple[str, ...]):
    leaves = st.sampled_from([("sym", name) for name in names]
                             + [("const", value) for value in range(6)])
    return st.recursive(
        leaves,
        lambda children: st.tuples(st.sampled_from(sorted(OPERATIONS)), children, children),
        max_leaves=8)


def build(tree) -> DimExpr:
    kind, *args = tree
    if kind == "sym":
        return sym(args[0])
    if kind == "const":
        return const(args[0])
    return OPERATIONS[kind](build(args[0]), build(args[1]))


def run(tree, env: dict[str, int]) -> int | None:
    """The tree's value, or None where some divisor is 0 (the expression is undefined)."""
    kind, *args = tree
    if kind == "sym":
        return env[args[0]]
    if kind == "const":
        return args[0]
    left, right = run(args[0], env), run(args[1], env)
    if left is None or right is None or (kind in ("//", "%") and right == 0):
        return None
    return OPERATIONS[kind](left, right)


def built(tree) -> DimExpr:
    """The normal form, skipping trees with a divisor that is identically 0."""
    try:
        return build(tree)
    except DimError:
        assume(False)


ABC = trees(("a", "b", "c"))
ENVS = st.fixed_dictionaries({name: st.integers(0, 7) for name in "abc"})


@PROPERTY
@given(ABC, ENVS)
def test_normal_form_evaluates_like_python(tree, env):
    expected = run(tree, env)
    assume(expected is not None)
    assert built(tree).evaluate(env) == expected


@PROPERTY
@given(ABC)
def test_normal_form_is_idempotent(tree):
    expr = built(tree)
    assert expr.substitute({}) == expr
    # What lets `substitute` return an expression none of whose symbols it replaces as it is.
    assert expr._substitute({}) == expr
    assert Facts().simplify(expr) == expr
    assert str(expr) == str(build(tree))


@PROPERTY_MANY_TREES
@given(ABC, ABC, ABC)
def test_ring_laws(x_tree, y_tree, z_tree):
    x, y, z = built(x_tree), built(y_tree), built(z_tree)
    assert x + y == y + x
    assert hash(x * y) == hash(y * x)
    assert (x + y) * z == x * z + y * z
    assert (x - x).as_int() == 0
    assert (x + y) - y == x


@PROPERTY_MANY_TREES
@given(ABC, ABC)
def test_exact_division_recovers_the_factor(x_tree, y_tree):
    x, y = built(x_tree), built(y_tree)
    assume(y.as_int() != 0)
    assert (x * y) // y == x
    assert ((x * y) % y).as_int() == 0


@PROPERTY
@given(ABC, ENVS, st.sampled_from("abc"), st.sampled_from(["int", "expr"]))
def test_substitute_then_evaluate_agrees(tree, env, name, kind):
    expected = run(tree, env)
    assume(expected is not None)
    others = {key: value for key, value in env.items() if key != name}
    if kind == "int":
        replacement, rest = env[name], others
    else:
        # name := z + 1 with a fresh symbol z, so z takes the value env[name] - 1.
        assume(env[name] >= 1)
        replacement, rest = sym("z") + 1, {**others, "z": env[name] - 1}
    assert built(tree).substitute({name: replacement}).evaluate(rest) == expected


@PROPERTY_MANY_TREES
@given(ABC, ABC, st.sampled_from(["a", "b", "c", "z"]))
def test_remembered_substitutions_equal_fresh_ones(tree, replacement_tree, name):
    expr, replacement = built(tree), built(replacement_tree)
    try:
        fresh = expr._substitute({name: replacement})
    except DimError:
        with pytest.raises(DimError):
            expr.substitute({name: replacement, "unused": 3})
        return
    assert expr.substitute({name: replacement, "unused": 3}) == fresh
    assert expr.substitute({name: replacement}) == fresh  # now remembered


@PROPERTY_MANY_TREES
@given(trees(("D", "H", "c")), st.sampled_from(["==", "!=", "<", "<=", ">", ">="]), trees(("D", "H", "c")))
def test_remembered_answers_equal_fresh_ones(x_tree, op, y_tree):
    x, y = built(x_tree), built(y_tree)
    facts = (Facts().with_fact(sym("D") % sym("H"), "==", 0).with_fact(sym("H"), ">", 0)
             .with_fact(sym("c"), "<=", sym("D")))
    first = facts.decide(x, op, y)
    assert Facts(facts.facts).decide(x, op, y) == first  # a new Facts, answered from memory
    assert Facts(facts.facts)._decide(x, op, y) == first  # worked out again


def test_answers_that_may_depend_on_the_order_of_questions_are_not_remembered():
    # (D / H)'s bound needs H's, and H's needs (D / H)'s: whichever is asked second while the
    # first is worked out gets "unknown", so this Facts' answers may depend on their order.
    from linnet.dims import facts as facts_module

    facts = Facts().with_fact(H, ">=", D // H).with_fact(D // H, ">", 2).with_fact(B, "<", 5)
    assert facts.decide(H, ">=", 3) is True
    assert facts._order_dependent
    assert facts.decide(D // H, ">=", 3) is True
    assert not any(key[0] == facts.facts for key in facts_module._DECIDED)


# Facts: D % H == 0 and H > 0, with environments built to satisfy them (D = H * k).
DH = trees(("D", "H", "c"))
DIVISIBLE_FACTS = Facts().with_fact(sym("D") % sym("H"), "==", 0).with_fact(sym("H"), ">", 0)
DIVISIBLE_ENVS = st.builds(lambda h, k, c_value: {"H": h, "D": h * k, "c": c_value},
                           st.integers(1, 6), st.integers(0, 5), st.integers(0, 6))

# Facts: a <= b, c != 0, b % c == 0.
ORDERED_FACTS = (Facts().with_fact(a, "<=", b).with_fact(c, "!=", 0)
                 .with_fact(b % c, "==", 0))
ORDERED_ENVS = st.builds(lambda c_value, k, fraction: {"a": (c_value * k * fraction) // 4,
                                                       "b": c_value * k, "c": c_value},
                         st.integers(1, 5), st.integers(0, 4), st.integers(0, 4))

COMPARE = {"==": operator.eq, "!=": operator.ne, "<": operator.lt, "<=": operator.le,
           ">": operator.gt, ">=": operator.ge}


@PROPERTY
@given(DH, DIVISIBLE_ENVS)
def test_simplify_under_facts_is_sound(tree, env):
    expected = run(tree, env)
    assume(expected is not None)
    assert DIVISIBLE_FACTS.simplify(built(tree)).evaluate(env) == expected


@PROPERTY_MANY_TREES
@given(DH, DH, DIVISIBLE_ENVS)
def test_equal_never_proves_a_falsehood(x_tree, y_tree, env):
    x_value, y_value = run(x_tree, env), run(y_tree, env)
    assume(x_value is not None and y_value is not None)
    x, y = built(x_tree), built(y_tree)
    if DIVISIBLE_FACTS.equal(x, y):
        assert x_value == y_value
    # An equal-under-the-facts variant must be proven and agree.
    D_, H_ = sym("D"), sym("H")
    variant = x + H_ * (D_ // H_) - D_
    assert DIVISIBLE_FACTS.equal(x, variant)
    assert variant.evaluate(env) == x_value


@PROPERTY_MANY_TREES
@given(DH, st.sampled_from(sorted(COMPARE)), DH, DIVISIBLE_ENVS)
def test_decide_is_sound_under_divisibility(x_tree, op, y_tree, env):
    x_value, y_value = run(x_tree, env), run(y_tree, env)
    assume(x_value is not None and y_value is not None)
    verdict = DIVISIBLE_FACTS.decide(built(x_tree), op, built(y_tree))
    if verdict is not None:
        assert verdict == COMPARE[op](x_value, y_value)


@PROPERTY_MANY_TREES
@given(ABC, st.sampled_from(sorted(COMPARE)), ABC, ORDERED_ENVS)
def test_decide_is_sound_under_order_facts(x_tree, op, y_tree, env):
    x_value, y_value = run(x_tree, env), run(y_tree, env)
    assume(x_value is not None and y_value is not None)
    verdict = ORDERED_FACTS.decide(built(x_tree), op, built(y_tree))
    if verdict is not None:
        assert verdict == COMPARE[op](x_value, y_value)
    divides = ORDERED_FACTS.divides(built(y_tree), built(x_tree))
    if divides is not None and y_value != 0:
        assert divides == (x_value % y_value == 0)
