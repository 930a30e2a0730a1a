"""Padding-free execution: per-token work runs on the packed real tokens, `[Tokens, ...]`.

A padded batch `[B, S]` spends most of its time on padding (55% of the positions of a typical
batch of sentences).  Most of a transformer acts on each position alone (Linear, layer norm,
activations, embedding lookups, residual adds); only attention mixes positions.  This pass
proves which values carry the token axes B and S and which ops act per position along them,
and rewrites an entry so that:

* per-token work runs on `[Tokens, ...]`, the kept positions gathered (`pack_rows`) in
  row-major order, `Tokens` being their count at run time (`pack_index`);
* an op that needs `[B, S]` (attention, a permute that moves S, a reduction over S) gets the
  value put back (`unpack_rows`, zeros at the positions not kept), and its output is gathered
  again where per-token work resumes.

What the pass proves (a dataflow analysis over the IR, per value, see `Form`):

* *token axes*: where B and S sit in the value's padded type, followed through broadcasting,
  reshape, permute, indexing and calls (each function is specialised for the forms of its
  arguments, so `Linear.forward` gets a packed clone);
* *exactness*: a value equals the padded program's everywhere, or only at kept positions
  (once per-token work ran packed, the positions not kept hold zeros instead of what padding
  computed);
* *pad facts* of the padded program: what a value holds where the mask input is 0 (0, 1,
  true, or an additive mask <= -10000).  They follow from the mask itself (`mask == 0`,
  `1 - cast(...)`, `select(mask == 0, -10000, 0)`, reshapes), so no name is trusted.

An op that mixes positions may read a value that is exact only at kept positions in three
cases, each exact: attention whose additive mask is proven <= -10000 at every padded key
(those keys get softmax weight exp(-10000 + ...) = 0 in f32, as in the padded program), a
product with a factor proven 0 at padding (a masked mean pooling; both programs add 0 there),
and an index of a fixed position (`hidden[:, 0, :]`), which adds that position to the kept
set.  Any other mixing op (a cumsum or a mean over S, a shift) over such a value makes the
pass refuse the entry, and it says why in `Optimized.notes`.  Every kept position, padding
included, is computed exactly as the padded program computes it, so outputs there agree with
it within the rounding of a smaller GEMM; positions that are not kept read exactly 0.

The pass needs the entry input `attention_mask` (`[B, S]` integers, transformers' name for
the padding mask): the attention masks must be proven to come from it.  The name is the
program's statement that its zeros are padding, whose outputs nobody reads; that is what
licenses returning 0 there instead of what the padded program computes.  Another integer
input that happens to shape an attention mask (token ids compared with a pad id) is not
taken as one: its zero positions may be real positions whose outputs matter.  One module of
its own, longer than most (~660 lines) because the analysis and the rewrite share the form of
every value, and splitting them would pass that state between two modules.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from functools import reduce

from . import ir
from .. import ops
from ..dims import DimExpr, const, sym
from ..kernels import ALL as FUSED_KERNELS, ATTENTION, ATTENTION_DROPOUT, WINDOWED_ATTENTION

ZERO, ONE, TRUE, NEG = "zero", "one", "true", "neg"
#: An additive mask at or below this removes a key exactly: exp(-10000) is 0 in f32 and f16.
NEG_LIMIT = -1e4

#: The `source` of the two index functions the pass writes (no Linnet file holds them).
_ROWS, _SLOTS = "linnet.packing::kept_rows", "linnet.packing::kept_slots"


class Refusal(Exception):
    """The entry cannot be packed exactly; the message says which op and why."""


@dataclass(frozen=True)
class Form:
    """What the pass knows of one value."""

    axes: tuple[int, int] | None = None  # where B and S sit in the padded type
    packed: bool = False  # held as [..., Tokens, ...]: B and S (adjacent) merged into the kept positions
    exact: bool = True  # equals the padded program everywhere (else at kept positions only)
    pad: str | None = None  # what the padded program holds where the mask is 0
    zero_fill: bool = False  # holds 0 at the positions not kept (it came from an unpack)


PLAIN = Form()


def _product(dims) -> DimExpr:
    return reduce(lambda a, b: a * b, dims, const(1))


def _meet(a: Form, b: Form) -> Form:
    if a.axes != b.axes or a.packed != b.packed:
        raise Refusal("a variable holds values of different token layouts in a loop")
    return Form(a.axes, a.packed, a.exact and b.exact, a.pad if a.pad == b.pad else None, a.zero_fill and b.zero_fill)


class _Packer:
    """The packing of one entry, for one choice of the mask input."""

    def __init__(self, program: ir.Program, entry: ir.Entry, mask: str, tokens: str, shared: dict):
        self.program, self.entry, self.mask = program, entry, mask
        self.B, self.S = dict(entry.inputs)[mask].dims
        self.tokens = sym(tokens)
        self.rows_type = ir.TensorType((self.tokens,), "i64")
        self.slots_type = ir.TensorType((self.B, self.S), "i64")
        # Entries packed by the same mask share their specialisations (`pool` calls `forward`).
        store = shared.setdefault((mask, tokens), ({}, {}, {}))
        self.clones = ir.Specialisations(program, "packed", store[0], store[1], shared.setdefault("ids", set()))
        self.memo: dict[tuple, tuple[str, Form, bool]] = self.clones.memo
        self.functions: dict[str, ir.Function] = self.clones.made
        # The fixed positions each specialisation reads, its callees' included: an entry that
        # reuses one (`logits` calling the `pool` that `pool` packed) keeps them too.
        self.memo_positions: dict[tuple, set[int]] = store[2]
        self.positions: set[int] = set()  # fixed positions an index reads, kept too
        self.packed_ops = 0

    def token_axes(self, t: ir.TensorType | None) -> tuple[int, int] | None:
        if t is None:
            return None
        for i in range(t.rank - 1):
            if t.dims[i] == self.B and t.dims[i + 1] == self.S:
                return (i, i + 1)
        return None

    def packed_type(self, t: ir.TensorType, axis: int) -> ir.TensorType:
        return ir.TensorType(t.dims[:axis] + (self.tokens,) + t.dims[axis + 2:], t.dtype)

    # ------------------------------------------------------------ functions
    def specialise(self, fn_id: str, forms: tuple[Form, ...], *, entry: bool = False) -> tuple[str, Form, bool]:
        """(the function for these argument forms, its result's form, whether it takes the
        packing indices as two extra arguments)."""
        key = (fn_id, forms, entry)
        if key in self.memo:
            self.positions |= self.memo_positions.get(key, set())
        else:
            outer, self.positions = self.positions, set()
            fn = self.program.functions[fn_id]
            body = _Body(self, fn, forms, entry)
            stmts, result = body.run()
            if not body.changed:
                self.memo[key] = (fn_id, result, False)
            else:
                new_id, needs = self._clone(fn, forms, stmts, body)
                self.memo[key] = (new_id, result, needs)
            self.memo_positions[key] = set(self.positions)
            self.positions |= outer
        return self.memo[key]

    def _clone(self, fn: ir.Function, forms, stmts, body: "_Body") -> tuple[str, bool]:
        params = [(name, self.packed_type(t, f.axes[0]) if f.packed else t)
                  for (name, t), f in zip(fn.params, forms)]
        packed_params = {name for (name, _), f in zip(fn.params, forms) if f.packed}
        sources = {d: s for d, s in fn.dim_sources.items() if s[0] not in packed_params}
        # The indices are passed only to a function that converts, or reads B or S from a
        # param that is packed now; a fused std function (layer_norm) keeps its signature.
        needs = _mentions(stmts, {body.rows, body.slots}) or len(sources) < len(fn.dim_sources)
        if needs:
            params += [(body.rows, self.rows_type), (body.slots, self.slots_type)]
            sources.update({str(self.tokens): (body.rows, 0), str(self.B): (body.slots, 0),
                            str(self.S): (body.slots, 1)})
        else:
            sources.update({str(self.tokens): (name, f.axes[0]) for (name, _), f in zip(fn.params, forms) if f.packed})
        packed = [f"`{name}`" for name in sorted(packed_params)]
        note = (f"packed: {', '.join(packed)} hold only the kept tokens, [{self.tokens}, ...] for [B, S, ...]"
                if packed else f"packed inside: per-token work runs on the kept tokens, [{self.tokens}, ...]")
        return self.clones.clone(fn, params, stmts, body.result_type, sources, note), needs


class _Body:
    """One function rewritten for the forms of its arguments."""

    def __init__(self, packer: _Packer, fn: ir.Function, forms: tuple[Form, ...], entry: bool):
        self.p, self.fn, self.entry = packer, fn, entry
        taken = {n for n, _ in fn.params} | ir.bound_names(fn.body)
        self.rows = ir.fresh("token_rows", taken)
        self.slots = ir.fresh("token_slots", taken)
        self.env: dict[str, Form] = {name: f for (name, _), f in zip(fn.params, forms)}
        self.changed = any(f.packed for f in forms)
        self.result: Form = PLAIN
        self.result_type = fn.result

    def run(self):
        stmts = self._stmts(self.fn.body, self.env, loop_vars=None)
        return stmts, self.result

    def refuse(self, e, why: str):
        line = getattr(e, "line", self.fn.span.line)
        raise Refusal(f"`{self.fn.name}` ({self.fn.source}, line {line}): {why}")

    # ----------------------------------------------------------- statements
    def _stmts(self, stmts, env, loop_vars):
        out = []
        for stmt in stmts:
            if isinstance(stmt, ir.Loop):
                out.append(self._loop(stmt, env))
                continue
            new, form = self._expr(stmt.value, env)
            if isinstance(stmt, ir.Return):
                if self.entry and form.packed:
                    new, form = self.to_padded(new, form, stmt.value.type, stmt.line)
                if self.entry and not form.exact and not form.zero_fill:
                    self.refuse(stmt, "the result would hold undefined values at padded positions")
                self.result = form
                self.result_type = new.type
                out.append(ir.Return(new, stmt.line))
                continue
            if isinstance(stmt, ir.Assign) and loop_vars is not None and stmt.name in loop_vars:
                before = loop_vars[stmt.name]
                if before.packed and not form.packed:
                    new, form = self.to_packed(new, form, stmt.value.type, stmt.line)
                elif form.packed and not before.packed:
                    new, form = self.to_padded(new, form, stmt.value.type, stmt.line)
            env[stmt.name] = form
            out.append(type(stmt)(stmt.name, new, stmt.line))
        return out

    def _loop(self, loop: ir.Loop, env):
        assigned = {s.name for s in loop.body if isinstance(s, ir.Assign)}
        if loop.stop is not None and loop.stop - loop.start == 1:
            # One pass (a pass `linnet.middle.rows` peeled off): nothing is carried into a next
            # pass, so a variable may leave it in another layout than it came in.
            assigned = set()
        for _ in range(4):
            trial = dict(env)
            body = self._stmts(loop.body, trial, {n: env[n] for n in assigned if n in env})
            merged = {n: _meet(env[n], trial[n]) for n in assigned if n in env}
            if all(merged[n] == env[n] for n in merged):
                break
            env.update(merged)
        else:
            self.refuse(loop, "the forms of the loop's variables do not settle")
        env.update(trial)
        collect = loop.collect
        if collect is not None:
            var = env[collect.var]
            t = collect.type
            if var.packed:
                t = ir.TensorType((t.dims[0],) + self.p.packed_type(ir.TensorType(t.dims[1:], t.dtype),
                                                                     var.axes[0]).dims, t.dtype)
            axes = None if var.axes is None else (var.axes[0] + 1, var.axes[1] + 1)
            env[collect.into] = replace(var, axes=axes)
            collect = ir.Collect(collect.into, collect.var, t)
        return replace(loop, body=tuple(body), collect=collect)

    # ---------------------------------------------------------- conversions
    def to_padded(self, new, form: Form, padded: ir.TensorType, line: int):
        if not form.packed:
            return new, form
        self.changed = True
        op = ir.Op("unpack_rows", (new, ir.Ref(self.slots, self.p.slots_type)), padded, line,
                   (("axis", form.axes[0]),))
        return op, Form(form.axes, False, form.pad == ZERO, form.pad, True)

    def to_packed(self, new, form: Form, padded: ir.TensorType, line: int):
        if form.packed:
            return new, form
        self.changed = True
        a = form.axes[0]
        op = ir.Op("pack_rows", (new, ir.Ref(self.rows, self.p.rows_type)), self.p.packed_type(padded, a), line,
                   (("axis", a),))
        return op, replace(form, packed=True, zero_fill=False)

    # ---------------------------------------------------------- expressions
    def _expr(self, e: ir.Expr, env) -> tuple[ir.Expr, Form]:
        if isinstance(e, ir.Ref):
            form = env.get(e.name, PLAIN)
            t = self.p.packed_type(e.type, form.axes[0]) if form.packed else e.type
            return ir.Ref(e.name, t), form
        if isinstance(e, ir.Call):
            return self._call(e, env)
        if isinstance(e, ir.Op):
            return self._op(e, env)
        return e, PLAIN  # params, numbers, dims, none

    def _call(self, e: ir.Call, env):
        callee = self.p.program.functions[e.function]
        args = [self._expr(a, env) for a in e.args]
        # Attention with dropout on its probabilities mixes tokens the same way: dropout is
        # per element, and padded keys are removed before it.  So does windowed attention: its
        # window only adds a term <= 0 to the padding mask it is given.
        if callee.source in (ATTENTION, ATTENTION_DROPOUT, WINDOWED_ATTENTION):
            return self._attention(e, args)
        new_args, forms = [], []
        for a, (new, form) in zip(e.args, args):
            # A heavy value exact only at kept positions is packed before the call: the callee's
            # per-token work then runs packed, and the garbage at padding is never computed.
            if (not form.packed and not form.exact and _adjacent(form) and a.type.rank > form.axes[1] + 1):
                new, form = self.to_packed(new, form, a.type, e.line)
            new_args.append(new)
            forms.append(form)
        fn_id, result, needs = self.p.specialise(e.function, tuple(forms))
        if needs and callee.source in FUSED_KERNELS:
            # A backend writes this std function as one fused kernel over its params, so its body
            # must not convert: the arguments are packed here instead.
            for i, (a, f) in enumerate(zip(e.args, forms)):
                if f.axes is not None and not f.packed and _adjacent(f):
                    new_args[i], forms[i] = self.to_packed(new_args[i], f, a.type, e.line)
            fn_id, result, needs = self.p.specialise(e.function, tuple(forms))
            if needs:
                self.refuse(e, f"`{callee.name}` is a fused kernel, and its arguments cannot all be packed")
        if fn_id == e.function:
            return replace(e, args=tuple(new_args)), result
        self.changed = True
        extra = (ir.Ref(self.rows, self.p.rows_type), ir.Ref(self.slots, self.p.slots_type)) if needs else ()
        t = self.p.packed_type(e.type, result.axes[0]) if result.packed else e.type
        return ir.Call(fn_id, tuple(new_args) + extra, t, e.line, e.receiver), result

    def _attention(self, e: ir.Call, args):
        padded = [self.to_padded(new, form, a.type, e.line) if form.packed else (new, form)
                  for a, (new, form) in zip(e.args, args)]
        if any(new is not old for (new, _), (old, _) in zip(padded, args)):
            self.changed = True
        forms = [f for _, f in padded]
        out = replace(e, args=tuple(n for n, _ in padded))
        q, k, v, scale, mask = (list(forms) + [PLAIN] * 5)[:5]
        if all(f.exact for f in forms):
            return out, Form(forms[0].axes)
        rank = e.args[0].type.rank
        mask_t = e.args[4].type if len(e.args) > 4 and not isinstance(e.args[4], ir.Absent) else None
        if mask_t is None or not mask.exact or mask.pad != NEG or mask.axes is None:
            self.refuse(e, "attention reads keys computed only at kept positions, and its mask is not proven "
                           f"<= {NEG_LIMIT:g} at every padded key")
        shift = rank - mask_t.rank
        mask_axes = (mask.axes[0] + shift, mask.axes[1] + shift)
        for f in (k, v):
            if not f.exact and f.axes != (mask_axes[0], rank - 2):
                self.refuse(e, "the keys' token axes are not the axes the mask removes padding along")
        if mask_axes[1] != rank - 1 or not scale.exact or (not q.exact and q.axes is None):
            self.refuse(e, "the mask does not remove padded keys along the key axis")
        return out, Form(q.axes, exact=q.exact)

    def _op(self, e: ir.Op, env):
        if ops.OPS[e.op].made_by == __name__:
            self.refuse(e, "the program is already packed")
        args = [self._expr(a, env) for a in e.args]
        forms = [f for _, f in args]
        out_axes, packable = self._token_rule(e, forms)
        # Only an op whose token operands hold B and S side by side can read them packed.
        packable = packable and all(_adjacent(f) for f in forms if f.axes is not None)
        pad = self._pad_fact(e, forms)
        token_forms = [f for f in forms if f.axes is not None]
        want_packed = packable and (any(f.packed for f in forms) or any(not f.exact for f in token_forms)
                                    or e.type.rank > out_axes[1] + 1)
        if want_packed:
            new_args = [self.to_packed(n, f, a.type, e.line)[0] if f.axes is not None else n
                        for a, (n, f) in zip(e.args, args)]
            self.p.packed_ops += 1
            self.changed = True
            return self._packed_op(e, new_args, out_axes), Form(out_axes, True, False, pad)
        padded = [self.to_padded(n, f, a.type, e.line) if f.axes is not None else (n, f)
                  for a, (n, f) in zip(e.args, args)]
        forms = [f for _, f in padded]
        new = replace(e, args=tuple(n for n, _ in padded))
        return new, Form(out_axes, False, self._exact(e, forms, out_axes), pad, self._zero_fill(e, forms))

    # ------------------------------------------------------------- the rules
    def _token_rule(self, e: ir.Op, forms) -> tuple[tuple[int, int] | None, bool]:
        """(token axes of the result, whether the op can run packed); raises Refusal for an op that
        mixes positions and reads a value exact only at kept positions."""
        op, t, record = e.op, e.type, ops.OPS[e.op]
        if all(f.axes is None for f in forms):
            return self.p.token_axes(t) if op == "iota" else None, False
        if record.elementwise:
            axes, ok = None, True
            for a, f in zip(e.args, forms):
                rank = a.type.rank if hasattr(a, "type") and isinstance(a.type, ir.TensorType) else 0
                if f.axes is None:
                    # A value without token axes broadcasts into the trailing axes only.
                    continue
                mapped = (f.axes[0] + t.rank - rank, f.axes[1] + t.rank - rank)
                if axes is not None and mapped != axes:
                    return self._mixing(e, forms, None)
                axes = mapped
                ok = ok and rank == t.rank
            for a, f in zip(e.args, forms):
                rank = a.type.rank if isinstance(getattr(a, "type", None), ir.TensorType) else 0
                if f.axes is None and rank > t.rank - axes[1] - 1:
                    ok = False  # it has an axis of its own at B or S (a [S, D] table of positions)
            return axes, ok and axes[1] == axes[0] + 1
        x = forms[0]
        if op == "reshape":
            return self._reshape_rule(e, x)
        if op == "permute":
            perm = e.attr("perm")
            axes = (perm.index(x.axes[0]), perm.index(x.axes[1])) if x.axes else None
            return axes, axes is not None and axes[1] == axes[0] + 1
        if op == "transpose":
            r = t.rank
            if x.axes and max(x.axes) < r - 2:
                return x.axes, _adjacent(x)
            return self._mixing(e, forms, None)
        if record.along_axis:
            axis = e.attr("axis") % t.rank
            if x.axes and axis not in x.axes:
                return x.axes, _adjacent(x)
            # Along a token axis: a scan keeps the axes where they were, a reduction drops one.
            return self._mixing(e, forms, x.axes if record.kind == ops.SCAN else None)
        if op == "concat":
            # Along another axis than B and S, with both parts holding them where the result
            # does (RoPE's angles twice over): each position's parts side by side.
            axis = e.attr("axis") % t.rank
            if x.axes and axis not in x.axes and all(f.axes == x.axes for f in forms):
                return x.axes, _adjacent(x)
            return self._mixing(e, forms, None)
        if op == "take":
            if forms[0].axes is None and forms[1].axes is not None:
                return forms[1].axes, _adjacent(forms[1])
            return self._mixing(e, forms, None)
        if op == "matmul":
            a, b = forms
            if b.axes is None and a.axes and max(a.axes) < e.args[0].type.rank - 1 and e.args[1].type.rank == 2:
                return a.axes, _adjacent(a)
            return self._mixing(e, forms, None)
        if op == "index":
            return self._index_rule(e, x, forms)
        return self._mixing(e, forms, None)

    def _reshape_rule(self, e: ir.Op, x: Form):
        if x.axes is None:
            return None, False
        src, shape = e.args[0].type.dims, e.attr("shape")
        b, s = x.axes
        if list(shape).count(self.p.B) == 1 and list(shape).count(self.p.S) == 1:
            ob, os_ = shape.index(self.p.B), shape.index(self.p.S)
            if (ob < os_ and _product(src[:b]) == _product(shape[:ob])
                    and _product(src[b + 1:s]) == _product(shape[ob + 1:os_])):
                return (ob, os_), s == b + 1 and os_ == ob + 1 and tuple(src[:b]) == tuple(shape[:ob])
        return self._mixing(e, [x], None)

    def _index_rule(self, e: ir.Op, x: Form, forms):
        items = e.attr("items")
        full = ("slice", const(0), None)
        b, s = x.axes

        def position(axis):  # where an axis lands once the indexed axes before it are dropped
            return sum(1 for it in items[:axis] if it[0] != "index") + (axis - len(items) if axis >= len(items) else 0)

        if all(items[i] == full for i in (b, s) if i < len(items)):
            axes = (position(b), position(s))
            return axes, axes[1] == axes[0] + 1
        fixed = _fixed_positions(items[s]) if s < len(items) else None
        if (b >= len(items) or items[b] == full) and fixed and not _unpacked_exact(x):
            self.p.positions.update(fixed)  # read fixed positions: keep them
            return None, False
        return self._mixing(e, forms, None)

    def _mixing(self, e: ir.Op, forms, axes):
        if any(not _unpacked_exact(f) for f in forms):
            self.refuse(e, f"`{e.op}` mixes token positions and would read positions that packing "
                           "does not compute; not packed across it")
        return axes, False

    def _exact(self, e: ir.Op, forms, axes) -> bool:
        if all(f.exact for f in forms):
            return True
        if e.op == "index" and not forms[0].exact and axes is None:
            return True  # a kept fixed position (see _index_rule)
        if e.op == "mul":  # a factor that is 0 at padding: both programs hold 0 there
            return any(f.exact and f.pad == ZERO for f in forms)
        if e.op == "select":  # at padding it picks `a`, which is exact
            cond, a, _ = forms
            return cond.exact and cond.pad == TRUE and a.exact
        return False

    def _zero_fill(self, e: ir.Op, forms) -> bool:
        token = [f for f in forms if f.axes is not None]
        rule = ops.OPS[e.op].zero_fill
        if rule == ops.ZERO_IF_ANY:
            return any(f.zero_fill for f in token)
        return rule == ops.ZERO_IF_ALL and bool(token) and all(f.zero_fill for f in token)

    def _pad_fact(self, e: ir.Op, forms) -> str | None:
        """What the padded program holds at padding, from the facts of the operands."""
        op = e.op
        facts = [f.pad for f in forms]
        consts = [a.value if isinstance(a, ir.Scalar) else None for a in e.args]
        if op == "equal" and facts[0] == ZERO and consts[1] == 0:
            return TRUE
        if op == "cast":
            if facts[0] == TRUE:
                return ONE if e.attr("dtype") != "bool" else TRUE
            return facts[0] if facts[0] in (ZERO, ONE, NEG) else None
        if ops.OPS[op].moves_data or (op == "neg" and facts[0] == ZERO):
            return facts[0]
        if op == "sub" and consts[0] == 1 and facts[1] == ONE:
            return ZERO
        if op == "mul":
            if ZERO in facts:
                return ZERO
            if facts[0] == ONE or facts[1] == ONE:
                return facts[1] if facts[0] == ONE else facts[0]
        if op == "add" and facts == [ZERO, ZERO]:
            return ZERO
        if op == "select" and facts[0] == TRUE:
            picked = consts[1]
            if picked is not None:
                return NEG if picked <= NEG_LIMIT else ZERO if picked == 0 else ONE if picked == 1 else None
            return facts[1]
        return None

    def _packed_op(self, e: ir.Op, args, out_axes) -> ir.Op:
        a = out_axes[0]
        t = self.p.packed_type(e.type, a)
        attrs = dict(e.attrs)
        if e.op == "reshape":
            shape = attrs["shape"]
            attrs["shape"] = shape[:a] + (self.p.tokens,) + shape[a + 2:]
        elif e.op == "permute":
            perm = attrs["perm"]
            sb = perm[a]
            attrs["perm"] = tuple(q - 1 if q > sb else q for i, q in enumerate(perm) if i != a + 1)
        elif attrs.get("axis", -1) > a:
            # Any op's `axis` attr (a reduction's, a scan's, concat's) counts the result's axes,
            # which lose one after B where B and S merge; a negative one counts from the end.
            attrs["axis"] -= 1
        elif e.op == "index":
            items, sb = attrs["items"], self._index_source_axis(e, a)
            attrs["items"] = tuple(it for i, it in enumerate(items) if i != sb + 1)  # S merged into B
        return ir.Op(e.op, tuple(args), t, e.line, tuple((k, attrs[k]) for k, _ in e.attrs))

    @staticmethod
    def _index_source_axis(e: ir.Op, out_axis: int) -> int:
        """The input axis of `e`'s operand that lands at `out_axis` of the result."""
        kept = [i for i, it in enumerate(e.attr("items")) if it[0] != "index"]
        return kept[out_axis] if out_axis < len(kept) else out_axis + len(e.attr("items")) - len(kept)


def _fixed_positions(item) -> range | None:
    """The positions an index item reads when they are constants: `k`, or `k:k + n`, where
    `linnet.middle.rows` has restricted the rest of a layer to the rows that are read."""
    start = item[1].as_int()
    if start is None or start < 0:
        return None
    if item[0] == "index":
        return range(start, start + 1)
    stop = item[2].as_int() if item[2] is not None else None
    return range(start, stop) if stop is not None and stop > start else None


def _unpacked_exact(f: Form) -> bool:
    """Whether the value equals the padded program's everywhere once it is in [B, S] form."""
    return f.pad == ZERO if f.packed else f.exact


def _mentions(stmts, names: set[str]) -> bool:
    """Whether any statement reads one of `names`."""
    return any(isinstance(e, ir.Ref) and e.name in names for e in ir.exprs(stmts))


def _adjacent(f: Form) -> bool:
    return f.axes is not None and f.axes[1] == f.axes[0] + 1


# ------------------------------------------------------------------- the pass


def pack_tokens(out, exact: bool = True) -> None:
    """The pass: each entry whose padding can be proven away runs packed (see the module doc).

    Entries it packs get a line in `out.applied`; the others a line in `out.notes` saying why.
    """
    program = out.program
    shared: dict = {}
    for name, entry in list(program.entries.items()):
        if ir.returns_several(program, entry):
            out.notes.append(f"{name}: not packed: it has several results somewhere, which packing does not follow")
            continue
        reasons = []
        for mask in _mask_candidates(program, entry):
            try:
                packer = _attempt(program, entry, mask, shared)
            except Refusal as refusal:
                reasons.append(f"with `{mask}` as the mask, {refusal}")
                continue
            if packer.result[0] == entry.function:
                reasons.append(f"with `{mask}` as the mask, nothing runs per token")
                continue
            _install(program, entry, packer)
            kept = "".join(f" and position {p}" for p in sorted(packer.positions))
            out.applied.append(f"{name}: per-token work runs on the kept tokens ({mask} != 0{kept}), "
                               f"[{packer.tokens}, ...] for [B, S, ...]")
            break
        else:
            why = "; ".join(reasons) or f"no [B, S] integer input named `{MASK_INPUT}` gives the padding"
            out.notes.append(f"{name}: not packed: {why}")


#: The one input name that declares padding (see the module doc).
MASK_INPUT = "attention_mask"


def _mask_candidates(program: ir.Program, entry: ir.Entry) -> list[str]:
    """`attention_mask`, when the entry takes it as `[X, Y]` integers over two of its dims
    (a candidate, not a decision: the pass still proves or refuses it)."""
    from .. import dtypes

    return [n for n, t in entry.inputs if n == MASK_INPUT and t.rank == 2 and dtypes.by_name(t.dtype).kind == "int"
            and all(str(d) in entry.dims for d in t.dims) and t.dims[0] != t.dims[1]]


def _attempt(program: ir.Program, entry: ir.Entry, mask: str, shared: dict) -> _Packer:
    taken = {d for e in program.entries.values() for d in e.dims}
    tokens = "Tokens"
    for _ in range(2):  # a second run once the fixed positions the entry reads are known
        while tokens in taken:
            tokens += "_"
        packer = _Packer(program, entry, mask, tokens, shared)
        fn = program.functions[entry.function]
        forms = tuple(Form(packer.token_axes(t), pad=ZERO if n == mask else None) for n, t in fn.params)
        packer.result = packer.specialise(entry.function, forms, entry=True)
        wanted = "Tokens" + "".join(f"_{p}" for p in sorted(packer.positions))
        if wanted == tokens.rstrip("_"):
            return packer
        tokens = wanted
    return packer


def _install(program: ir.Program, entry: ir.Entry, packer: _Packer) -> None:
    program.functions.update(packer.functions)
    fn = program.functions[entry.function]
    packed_id, result, needs = packer.result
    line, mask = fn.span.line, packer.mask
    mask_type = dict(fn.params)[mask]
    rows_fn, slots_fn = _index_functions(program, packer, fn, mask_type)
    taken = {n for n, _ in fn.params}
    keep: ir.Expr = ir.Ref(mask, mask_type)
    body: list = []
    for p in sorted(packer.positions):  # a fixed position the entry reads is kept too
        cond = ir.Op("equal", (ir.Op("iota", (), ir.TensorType((packer.S,), mask_type.dtype), line,
                                     (("n", packer.S), ("dtype", mask_type.dtype))),
                               ir.Scalar(float(p), ir.TensorType((), mask_type.dtype))),
                     ir.TensorType((packer.S,), "bool"), line)
        keep = ir.Op("select", (cond, ir.Scalar(1.0, ir.TensorType((), mask_type.dtype)), keep), mask_type, line)
    if packer.positions:
        name = ir.fresh("keep", taken)
        body.append(ir.Let(name, keep, line))
        keep = ir.Ref(name, mask_type)
    rows, slots = ir.fresh("token_rows", taken), ir.fresh("token_slots", taken)
    body.append(ir.Let(rows, ir.Call(rows_fn, (keep,), packer.rows_type, line), line))
    body.append(ir.Let(slots, ir.Call(slots_fn, (keep,), packer.slots_type, line), line))
    args = tuple(ir.Ref(n, t) for n, t in fn.params)
    if needs:
        args += (ir.Ref(rows, packer.rows_type), ir.Ref(slots, packer.slots_type))
    body.append(ir.Return(ir.Call(packed_id, args, fn.result, line, ir.SIBLING if fn.block else None), line))
    kept = "".join(f" or at position {p}" for p in sorted(packer.positions))
    notes = [f"packing (linnet.middle.packing): per-token work runs on the {packer.tokens} positions where "
             f"{mask} != 0{kept}, as [{packer.tokens}, ...]; attention sees [B, S, ...] (unpacked per call)"]
    if not result.exact:
        notes.append("positions that are not kept hold exactly 0 in the result")
    wrapper = ir.fresh(f"{fn.id}_entry", program.functions)
    program.functions[wrapper] = ir.Function(wrapper, fn.name, fn.source, fn.block, list(fn.params), body,
                                             fn.result, fn.span, fn.generics, dict(entry.dim_sources), notes)
    fn.name = f"{fn.name}_padded"  # kept for callers that are not packed (another entry)
    entry.function = wrapper
    entry.packed_by = (mask, tuple(sorted(packer.positions)))


def kept_count(entry: ir.Entry, inputs: dict) -> int:
    """How many positions a packed entry keeps for these inputs (name -> array): the nonzero
    mask positions and the fixed positions it reads (what `kept_rows` will find)."""
    import numpy as np

    mask_name, positions = entry.packed_by
    keep = np.asarray(inputs[mask_name]) != 0
    fixed = [p for p in positions if p < keep.shape[1]]
    if fixed:
        keep = keep.copy()
        keep[:, fixed] = True
    return int(keep.sum())


def token_bucket(count: int, limit: int) -> int:
    """The packed rows' length for a backend with static shapes (JAX): the first of 16, 24, 32,
    48, 64, 96, ... (powers of two and 1.5 times them) at or above `count`, at most `limit`
    (B * S, every position).  So a program compiles once per bucket, not once per count, and
    wastes at most a third of its per-token work on the extra rows."""
    bucket = 16
    while bucket < count:
        bucket = bucket * 3 // 2 if bucket & (bucket - 1) == 0 else bucket * 4 // 3
    return min(bucket, limit)


def _index_functions(program: ir.Program, packer: _Packer, fn: ir.Function, mask_type: ir.TensorType):
    """The free functions `kept_rows(keep)` and `kept_slots(keep)`, made once per program and mask."""
    line, B, S = fn.span.line, packer.B, packer.S
    # One pair per mask and kept set (named by its Tokens dim), so entries that pack alike
    # share them, and with them the work after (ONNX emits a call once per argument values).
    made = {(f.source, f.params[0][1], f.generics.get("Tokens")): f.id for f in program.functions.values()
            if f.source in (_ROWS, _SLOTS)}
    tokens = str(packer.tokens)
    if (_ROWS, mask_type, tokens) in made:
        return made[(_ROWS, mask_type, tokens)], made[(_SLOTS, mask_type, tokens)]
    keep = ir.Ref("keep", mask_type)
    i64 = ir.TensorType((B, S), "i64")
    rows_id = ir.fresh("kept_rows", program.functions)
    program.functions[rows_id] = ir.Function(
        rows_id, "kept_rows", _ROWS, None, [("keep", mask_type)],
        [ir.Return(ir.Op("pack_index", (keep,), packer.rows_type, line, (("dim", packer.tokens),)), line)],
        packer.rows_type, fn.span, {"Tokens": tokens}, {str(B): ("keep", 0), str(S): ("keep", 1)},
        ["the flat positions (b * S + s) of the kept tokens, in order: the packed rows"])
    flags = ir.Op("sub", (ir.Scalar(1.0, ir.TensorType((), "i64")),
                          ir.Op("cast", (ir.Op("equal", (keep, ir.Scalar(0.0, ir.TensorType((), mask_type.dtype))),
                                               ir.TensorType((B, S), "bool"), line),), i64, line, (("dtype", "i64"),))),
                  i64, line)
    flat = ir.TensorType((B * S,), "i64")
    running = ir.Op("cumsum", (ir.Op("reshape", (ir.Ref("flags", i64),), flat, line, (("shape", (B * S,)),)),),
                    flat, line, (("axis", 0),))
    slots = ir.Op("mul", (ir.Op("reshape", (running,), i64, line, (("shape", (B, S)),)), ir.Ref("flags", i64)),
                  i64, line)
    slots_id = ir.fresh("kept_slots", program.functions)
    program.functions[slots_id] = ir.Function(
        slots_id, "kept_slots", _SLOTS, None, [("keep", mask_type)],
        [ir.Let("flags", flags, line), ir.Return(slots, line)], packer.slots_type, fn.span, {"Tokens": tokens},
        {str(B): ("keep", 0), str(S): ("keep", 1)},
        ["1 + the packed row of each kept position, 0 where a position is not kept"])
    return rows_id, slots_id
