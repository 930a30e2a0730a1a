"""Source text -> syntax tree, with lark doing the parsing.

The grammar lives in `grammar.lark`; this module turns lark's parse tree into the dataclasses
of `linnet.front.ast`, keeping a `Span` on every node, and turns lark's exceptions into
diagnostics that say what was expected.

Why over 500 lines: one transformer method per grammar rule, kept beside the rule-level
error messages they share; the grammar itself is in grammar.lark.
"""
from __future__ import annotations

import codecs
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from lark import Lark, Token, Transformer, Tree, v_args
from lark.lexer import PatternStr
from lark.exceptions import UnexpectedCharacters, UnexpectedEOF, UnexpectedInput, UnexpectedToken, VisitError

from . import ast
from .. import codes
from ..diagnostics import Diagnostic, LinnetError, Note, SourceMap, Span

# Friendly names for lark's terminal names in "expected ..." messages.
_TOKEN_NAMES = {
    "NAME": "a name", "INT": "an integer", "FLOAT": "a float", "LBRACE": "'{'", "RBRACE": "'}'",
    "LPAR": "'('", "RPAR": "')'", "LSQB": "'['", "RSQB": "']'", "LESSTHAN": "'<'", "MORETHAN": "'>'",
    "COMMA": "','", "COLON": "':'", "SEMICOLON": "';'", "EQUAL": "'='", "CMP": "a comparison",
    "PLUS": "'+'", "MINUS": "'-'", "STAR": "'*'", "SLASH": "'/'", "PERCENT": "'%'", "DOT": "'.'",
    "$END": "end of file", "PUB": "'pub'", "SPLICE": "'..'",
}


@cache
def _parser() -> Lark:
    grammar = (Path(__file__).parent / "grammar.lark").read_text(encoding="utf-8")
    return Lark(grammar, parser="lalr", propagate_positions=True, maybe_placeholders=False)


def parse(text: str, file: str, sources: SourceMap | None = None) -> ast.Module:
    """Parse one module; raises LinnetError (code E0001/E0002) on a syntax error."""
    if sources is not None:
        sources.add(file, text)
    try:
        tree = _parser().parse(text)
    except UnexpectedInput as exc:
        raise LinnetError(_syntax_diagnostic(exc, text, file), sources) from None
    # Every later stage walks the tree recursively; a tree deeper than Python's recursion can
    # follow (a sum of 600 terms) is a clear diagnostic here rather than a RecursionError there.
    deep = _too_deep(tree, MAX_DEPTH)
    if deep is not None:
        raise LinnetError(Diagnostic(
            codes.NESTING_TOO_DEEP, f"this expression nests too deeply for the compiler (more than {MAX_DEPTH} levels)",
            _span(file, deep.meta) if not deep.meta.empty else Span(file, 1, 1, 1, 1),
            (Note("split it into several `let` statements"),)), sources)
    try:
        module = _ToAst(file, text).transform(tree)
    except VisitError as exc:
        if isinstance(exc.orig_exc, LinnetError):
            err = exc.orig_exc
            err.sources = sources
            raise LinnetError(err.diagnostics, sources) from None
        raise
    module.file = file
    return module


#: How deep a syntax tree may be (BERT's is 15; each binary operator adds one level).
MAX_DEPTH = 200


def _too_deep(tree: Tree, limit: int) -> Tree | None:
    """The first node found below depth `limit`, searched without recursion; None if none."""
    stack = [(tree, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > limit:
            return node
        stack.extend((child, depth + 1) for child in node.children if isinstance(child, Tree))
    return None


def _describe_terminal(name: str) -> str:
    """How an expected terminal reads in a message: `'->'`, `'}'`, `a name`."""
    if name in _TOKEN_NAMES:
        return _TOKEN_NAMES[name]
    try:
        pattern = _parser().get_terminal(name).pattern
    except KeyError:
        return name.lower()
    # Keywords and punctuation are plain strings (`'->'`, `'return'`); lark names anonymous
    # ones `__ANON_<n>`, which would mean nothing to a user.
    return repr(pattern.value) if isinstance(pattern, PatternStr) else name.lower()


_EXPRESSION_START = {"a name", "an integer", "a float", "'('", "'['", "'-'", "'some'", "'none'"}
_COMPARISONS = {"'<'", "'>'", "'<='", "'>='", "'=='", "'!='"}
_OPERATORS = {"'+'", "'-'", "'*'", "'/'", "'%'"}


def _describe_expected(expected: set[str]) -> str:
    names = {_describe_terminal(t) for t in expected}
    # Whole families read better than their members: "an expression", not eight tokens.
    groups = []
    if {"a name", "an integer", "'('"} <= names:
        names -= _EXPRESSION_START
        groups.append("an expression")
    if {"'Tensor'", "'Option'", "a name", "'('"} <= names:  # after `->`: a result type
        names -= {"'Tensor'", "'Option'", "a name", "'('"}
        groups.append("a type (Tensor[...], Option[...], a dtype, or several results in parentheses)")
    if {"'Tensor'", "'Option'", "a name"} <= names:
        names -= {"'Tensor'", "'Option'", "a name"}
        groups.append("a type (Tensor[...], Option[...] or a dtype)")
    if _COMPARISONS <= names:
        names -= _COMPARISONS
        groups.append("a comparison (==, !=, <, <=, >, >=)")
    if _OPERATORS - {"'-'"} <= names:
        names -= _OPERATORS
        groups.append("an operator (+ - * / %)")
    listed = groups + sorted(names)
    if len(listed) > 8:
        listed = listed[:8] + ["..."]
    return ", ".join(listed)


def _expected_terminals(exc: UnexpectedInput) -> set[str]:
    """The terminals the parser would really take at the error.

    LALR's `expected` set is approximate (merged states add tokens that cannot follow);
    the interactive parser tries each one, which is exact and only costs time on errors.
    """
    interactive = getattr(exc, "interactive_parser", None)
    if interactive is not None:
        try:
            return set(interactive.accepts())
        except Exception:  # noqa: BLE001 - fall back to lark's approximation
            pass
    return set(getattr(exc, "expected", None) or getattr(exc, "accepts", None) or ())


def _syntax_diagnostic(exc: UnexpectedInput, text: str, file: str) -> Diagnostic:
    line = getattr(exc, "line", None) or 1
    col = getattr(exc, "column", None) or 1
    at_eof = isinstance(exc, UnexpectedEOF) or isinstance(exc, UnexpectedToken) and exc.token.type == "$END"
    if at_eof:
        # Lines as lark counts them: only "\n" ends one (not form feeds, U+2028, ...); the
        # end of file sits after the last line's text, not on the empty line after its "\n".
        lines = text.removesuffix("\n").split("\n")
        line, col = len(lines), len(lines[-1]) + 1
        found, width = "end of file", 1
    elif isinstance(exc, UnexpectedToken):
        found, width = repr(str(exc.token)), max(1, len(str(exc.token)))
    elif isinstance(exc, UnexpectedCharacters):
        found, width = repr(text[exc.pos_in_stream]) if exc.pos_in_stream < len(text) else "end of file", 1
    else:  # pragma: no cover - lark raises one of the above
        found, width = "something unexpected", 1
    if isinstance(exc, UnexpectedCharacters):
        code, message = codes.BAD_CHARACTER, f"unexpected character {found}"
    else:
        expected = _expected_terminals(exc)
        code = codes.UNEXPECTED_TOKEN
        message = f"unexpected {found}"
        if expected:
            message += f"; expected {_describe_expected(set(expected))}"
    span = Span(file, line, col, line, col + width)
    notes: tuple[Note, ...] = ()
    opener = _unclosed_bracket(text) if at_eof else None
    if opener is not None:
        # The usual cause of a file ending too early is a bracket left open: say which one
        # rather than listing every token the parser could take next (LALR's list is long).
        o_line, o_col, char = opener
        message = f"unexpected end of file; expected `{_CLOSERS[char]}` to close the `{char}` at line {o_line}"
        notes = (Note(f"this `{char}` is never closed", Span(file, o_line, o_col, o_line, o_col + 1)),)
    return Diagnostic(code, message, span, notes)


_CLOSERS = {"(": ")", "[": "]", "{": "}"}


def _unclosed_bracket(text: str) -> tuple[int, int, str] | None:
    """The innermost bracket still open at the end of `text` (line, col, char), ignoring comments."""
    stack: list[tuple[int, int, str]] = []
    pairs = {")": "(", "]": "[", "}": "{"}
    for number, source_line in enumerate(text.split("\n"), start=1):  # lark's line numbers
        code_part = source_line.split("//", 1)[0]
        for index, char in enumerate(code_part, start=1):
            if char in "([{":
                stack.append((number, index, char))
            elif char in pairs and stack and stack[-1][2] == pairs[char]:
                stack.pop()
    return stack[-1] if stack else None


def _span(file: str, meta) -> Span:
    return Span(file, meta.line, meta.column, meta.end_line, meta.end_column)


def _tok_span(file: str, tok: Token) -> Span:
    return Span(file, tok.line, tok.column, tok.end_line, tok.end_column)


_DIM_OPS = {"dim_add": "+", "dim_sub": "-", "dim_mul": "*", "dim_div": "/", "dim_mod": "%"}
_EXPR_OPS = {"add": "+", "sub": "-", "mul": "*", "div": "/", "mod": "%"}


@v_args(meta=True)
class _ToAst(Transformer):
    """One method per grammar rule; each returns the `linnet.front.ast` node for it."""

    def __init__(self, file: str, text: str = ""):
        super().__init__()
        self.file = file
        self.text = text

    def _s(self, meta) -> Span:
        return _span(self.file, meta)

    def _t(self, tok: Token) -> Span:
        return _tok_span(self.file, tok)

    # -- module level
    def start(self, meta, children):
        name = name_span = None
        uses, items = [], []
        for child in children:
            if isinstance(child, tuple) and child[0] == "module":
                _, name, name_span = child
            elif isinstance(child, ast.Use):
                uses.append(child)
            else:
                items.append(child)
        span = self._s(meta) if not meta.empty else Span(self.file, 1, 1, 1, 1)
        return ast.Module(name, name_span, uses, items, self.file, span)

    def module_decl(self, meta, children):
        parts, span = children[0]
        return ("module", ".".join(parts), span)

    def path(self, meta, children):
        return [str(t) for t in children], self._s(meta)

    def use_name(self, meta, children):
        return str(children[0]), self._t(children[0])

    def use_many(self, meta, children):
        (parts, path_span), *names = children
        return ast.Use(parts, names, self._s(meta), path_span)

    use_one = use_many

    def visibility(self, meta, children):
        return bool(children)

    def const_decl(self, meta, children):
        public, name, type_, value = children
        return ast.Const(str(name), public, type_, value, self._s(meta), self._t(name))

    @staticmethod
    def _header(rest) -> tuple[list, list, list]:
        """A block's or alias's generics and where clauses, and what else follows them."""
        generics, where, others = [], [], []
        for child in rest:
            if isinstance(child, tuple) and child[0] == "generics":
                generics = child[1]
            elif isinstance(child, tuple) and child[0] == "where":
                where = child[1]
            else:
                others.append(child)
        return generics, where, others

    def block_decl(self, meta, children):
        public, name, *rest = children
        generics, where, members = self._header(rest)
        return ast.Block(
            name=str(name), public=public, generics=generics, where=where,
            params=[m for m in members if isinstance(m, ast.ParamDecl)],
            subs=[m for m in members if isinstance(m, ast.SubDecl)],
            functions=[m for m in members if isinstance(m, ast.Function)],
            span=self._s(meta), name_span=self._t(name),
            delegates=self._delegates(members),
        )

    def block_alias(self, meta, children):
        public, name, *rest = children
        generics, where, [target] = self._header(rest)
        return ast.BlockAlias(str(name), public, generics, where, target, self._s(meta), self._t(name))

    def block_arg(self, meta, children):
        name, args = children
        return ast.BlockRef(str(name), args, self._s(meta))

    @staticmethod
    def _delegates(members) -> list[ast.Delegate]:
        delegates, functions = [], 0
        for member in members:
            if isinstance(member, ast.Function):
                functions += 1
            elif isinstance(member, list):
                for delegate in member:
                    delegate.position = functions
                    delegates.append(delegate)
        return delegates

    def delegate_decl(self, meta, children):
        public, field, *names = children
        then = names.pop() if names and isinstance(names[-1], _DelegateThen) else _DelegateThen(None, None)
        return [ast.Delegate(public, str(field), self._t(field), callee, callee_span, name, name_span,
                             self._s(meta), then=then.name, then_span=then.span)
                for callee, callee_span, name, name_span in names]

    def delegate_then(self, meta, children):
        (name,) = children
        return _DelegateThen(str(name), self._t(name))

    def delegate_name(self, meta, children):
        callee, *alias = children
        target = alias[0] if alias else callee
        return (str(callee), self._t(callee), str(target), self._t(target))

    def param_decl(self, meta, children):
        name, type_ = children
        return ast.ParamDecl(str(name), type_, self._s(meta))

    def sub_decl(self, meta, children):
        name, type_ = children
        return ast.SubDecl(str(name), type_, self._s(meta))

    def block_ref(self, meta, children):
        name = children[0]
        args = children[1] if len(children) > 1 else []
        return ast.BlockRef(str(name), args, self._s(meta))

    def sub_array(self, meta, children):
        element, count = children
        return ast.SubArrayType(element, count, self._s(meta))

    def fn_decl(self, meta, children):
        public, kind, name, *rest = children
        generics, where, params, result, body = [], [], [], None, []
        for child in rest:
            if isinstance(child, tuple) and child[0] == "generics":
                generics = child[1]
            elif isinstance(child, tuple) and child[0] == "where":
                where = child[1]
            elif isinstance(child, tuple) and child[0] == "params":
                params = child[1]
            elif isinstance(child, tuple) and child[0] == "body":
                body = child[1]
            else:
                result = child
        return ast.Function(str(name), public, str(kind) == "entry", generics, params, result, where,
                            body, self._s(meta), self._t(name))

    def fn_kind(self, meta, children):
        return str(children[0])

    def fn_params(self, meta, children):
        return ("params", list(children))

    def fn_param(self, meta, children):
        name, type_, *default = children
        if not default:
            return ast.Param(str(name), type_, self._s(meta))
        (value,) = default
        if isinstance(value, ast.Name):  # `= ones`, or `= other_param` (the resolver tells which)
            return ast.Param(str(name), type_, self._s(meta), value.name, value)
        # The default as written, for signatures (`= positions(attention_mask)`); a type has no `=`.
        written = self.text[meta.start_pos:meta.end_pos].split("=", 1)[-1]
        return ast.Param(str(name), type_, self._s(meta), None, value, default_text=" ".join(written.split()))

    def generic_params(self, meta, children):
        return ("generics", list(children))

    def generic_param(self, meta, children):
        name, kind, *default = children
        return ast.GenericParam(str(name), str(kind), default[0] if default else None, False, self._s(meta))

    def generic_splice(self, meta, children):
        _, name = children
        return ast.GenericSplice(str(name), self._s(meta))

    def splice_arg(self, meta, children):
        return ast.SpliceArg(self._s(meta))

    def variadic_param(self, meta, children):
        name, kind = children
        return ast.GenericParam(str(name), str(kind), None, True, self._s(meta))

    def where_clause(self, meta, children):
        return ("where", list(children))

    def constraint(self, meta, children):
        left, op, right = children
        return ast.Constraint(left, op, right, self._s(meta))

    def broadcast_constraint(self, meta, children):
        left, right = children
        return ast.BroadcastConstraint(left, right, self._s(meta))

    def shape(self, meta, children):
        return children[0] if children else []

    def cmp(self, meta, children):
        return str(children[0])

    # -- types
    def tensor_type(self, meta, children):
        if len(children) == 1:
            return ast.TensorTypeNode([], children[0], self._s(meta))
        dims, dtype = children
        return ast.TensorTypeNode(dims, dtype, self._s(meta))

    def tensor_dims(self, meta, children):
        return list(children)

    def variadic_dim(self, meta, children):
        return ast.Variadic(str(children[0]), self._s(meta))

    def option_type(self, meta, children):
        return ast.OptionTypeNode(children[0], self._s(meta))

    def tuple_type(self, meta, children):
        return ast.TupleTypeNode([t for _, t in children], [n for n, _ in children], self._s(meta))

    def tuple_item(self, meta, children):
        return (str(children[0]), children[1]) if len(children) == 2 else (None, children[0])

    def named_type(self, meta, children):
        return ast.NamedTypeNode(str(children[0]), self._s(meta))

    # -- dims
    def dim_name(self, meta, children):
        return ast.DimName(str(children[0]), self._s(meta))

    def dim_int(self, meta, children):
        return ast.DimInt(int(children[0]), self._s(meta))

    def _dim_binary(self, op, meta, children):
        left, right = children
        return ast.DimBinary(op, left, right, self._s(meta))

    def dim_add(self, meta, children):
        return self._dim_binary("+", meta, children)

    def dim_sub(self, meta, children):
        return self._dim_binary("-", meta, children)

    def dim_mul(self, meta, children):
        return self._dim_binary("*", meta, children)

    def dim_div(self, meta, children):
        return self._dim_binary("/", meta, children)

    def dim_mod(self, meta, children):
        return self._dim_binary("%", meta, children)

    def generic_args(self, meta, children):
        return list(children)

    # -- statements
    def body(self, meta, children):
        return ("body", list(children))

    def let_stmt(self, meta, children):
        return self._binding(meta, children, mutable=False)

    def var_stmt(self, meta, children):
        return self._binding(meta, children, mutable=True)

    def _binding(self, meta, children, mutable):
        name = children[0]
        annotation = children[1] if len(children) == 3 else None
        return ast.Let(str(name), mutable, annotation, children[-1], self._s(meta), self._t(name))

    def destructure_stmt(self, meta, children):
        *names, value = children
        return ast.Destructure([str(n) for n in names], [self._t(n) for n in names], value, self._s(meta))

    def assign_stmt(self, meta, children):
        name, value = children
        return ast.Assign(str(name), value, self._s(meta), self._t(name))

    def return_stmt(self, meta, children):
        return ast.Return(children[0], self._s(meta))

    def loop_head(self, meta, children):
        var, iterable = children
        return None, var, iterable

    def enumerate_head(self, meta, children):
        index, var, iterable = children
        return index, var, iterable

    def for_stmt(self, meta, children):
        (index, var, iterable), (_, body) = children
        return self._static_for(meta, index, var, iterable, body, None)

    def collect_stmt(self, meta, children):
        into, *annotation, (index, var, iterable), collected, (_, body) = children
        collect = ast.Collect(str(into), self._t(into), ast.Name(str(collected), self._t(collected)),
                              annotation[0] if annotation else None)
        return self._static_for(meta, index, var, iterable, body, collect)

    def _static_for(self, meta, index, var, iterable, body, collect):
        return ast.StaticFor(str(var), str(iterable), body, self._s(meta), self._t(iterable), self._t(var), collect,
                             str(index) if index is not None else None,
                             self._t(index) if index is not None else None)

    def if_some_stmt(self, meta, children):
        binding, option, (_, then_body), *rest = children
        else_body = rest[0][1] if rest else []
        return ast.IfSome(str(binding), ast.Name(str(option), self._t(option)), then_body, else_body,
                          self._s(meta), self._t(binding))

    # -- expressions
    def _binary(self, op, meta, children):
        left, right = children
        return ast.Binary(op, left, right, self._s(meta))

    def add(self, meta, children):
        return self._binary("+", meta, children)

    def sub(self, meta, children):
        return self._binary("-", meta, children)

    def mul(self, meta, children):
        return self._binary("*", meta, children)

    def div(self, meta, children):
        return self._binary("/", meta, children)

    def mod(self, meta, children):
        return self._binary("%", meta, children)

    def neg(self, meta, children):
        operand = children[0]
        if isinstance(operand, ast.IntLit):
            return ast.IntLit(-operand.value, self._s(meta))
        if isinstance(operand, ast.FloatLit):
            return ast.FloatLit(-operand.value, "-" + operand.text, self._s(meta))
        return ast.Unary("-", operand, self._s(meta))

    def call(self, meta, children):
        name = children[0]
        generic_args = children[1] if len(children) == 3 else []
        return ast.Call(str(name), generic_args, children[-1], self._s(meta), self._t(name))

    def some_call(self, meta, children):
        span = self._s(meta)
        name_span = Span(self.file, span.line, span.col, span.line, span.col + 4)
        return ast.Call("some", [], children[0], span, name_span)

    def method_call(self, meta, children):
        receiver, method, args = children
        return ast.MethodCall(ast.Name(str(receiver), self._t(receiver)), str(method), args, self._s(meta),
                              self._t(method))

    def args(self, meta, children):
        return list(children)

    def name(self, meta, children):
        return ast.Name(str(children[0]), self._s(meta))

    def int_lit(self, meta, children):
        return ast.IntLit(int(children[0]), self._s(meta))

    def float_lit(self, meta, children):
        text = str(children[0])
        return ast.FloatLit(float(text), text, self._s(meta))

    def none_lit(self, meta, children):
        return ast.NoneLit(self._s(meta))

    def tuple_lit(self, meta, children):
        return ast.TupleLit(list(children), self._s(meta))

    def list_lit(self, meta, children):
        return ast.ListLit(children[0], self._s(meta))

    def index(self, meta, children):
        target, items = children
        return ast.Index(target, items, self._s(meta))

    def index_items(self, meta, children):
        return list(children)

    def slice(self, meta, children):
        # `a:b`, `:b`, `a:` or `:`; the COLON token tells which side a lone bound is on.
        colon = next(i for i, c in enumerate(children) if isinstance(c, Token) and c.type == "COLON")
        start = children[0] if colon == 1 else None
        stop = children[colon + 1] if colon + 1 < len(children) else None
        return ast.Slice(start, stop, self._s(meta))

    def __default__(self, data, children, meta):  # pragma: no cover - every rule is handled
        raise AssertionError(f"unhandled grammar rule {data}")


def parse_file(path: Path, sources: SourceMap | None = None, display_name: str | None = None) -> ast.Module:
    name = display_name or str(path)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise LinnetError(Diagnostic(codes.UNREADABLE_SOURCE, f"cannot read {name}: {exc.strerror or exc}",
                                     Span(name, 1, 1, 1, 1)), sources) from None
    # A byte-order mark (some Windows editors write one) is not source text; dropped first, so
    # the decoder's positions count the source's own bytes.
    if data.startswith(codecs.BOM_UTF8):
        data = data[len(codecs.BOM_UTF8):]
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[:exc.start].count(b"\n") + 1
        # A column counts characters, as every other span does (the bytes before the bad one
        # decode, or the error would be there).
        line_start = data.rfind(b"\n", 0, exc.start) + 1
        col = len(data[line_start:exc.start].decode("utf-8")) + 1
        raise LinnetError(Diagnostic(codes.UNREADABLE_SOURCE,
                                     f"{name} is not UTF-8 text: byte 0x{data[exc.start]:02x} at "
                                     f"line {line}, column {col} cannot be decoded", Span(name, line, col, line, col + 1),
                                     (Note("Linnet sources are UTF-8; re-save the file as UTF-8"),)),
                          sources) from None
    return parse(text, name, sources)


@dataclass(frozen=True)
class _DelegateThen:
    """The `then f` of a delegation, before it is copied onto each delegated name."""

    name: str | None
    span: "Span | None"
