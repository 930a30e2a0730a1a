"""Triton Python-backend model written by `linnet export-triton` (copied as 1/model.py).

Each request is checked against linnet_io.json (taken from the Linnet program at export
time): rank, dtype, dims that agree across inputs, the entry's `where` preconditions (e.g.
S <= 512) and the id ranges of inputs that index embedding tables.  linnet_io.json's `role`
says what happens to a request that passes:

* "serve" (`--runtime python`): ONNX Runtime runs it here.  ONNX Runtime runs every node of
  a graph whatever outputs are asked for, so a request for one output runs
  model.<output>.onnx, the graph cut down to that output; a request for several runs
  model.onnx once.  Sessions open on first use.
* "validate" (`--runtime onnxruntime`): the first step of the ensemble.  Its outputs are the
  inputs, checked and with left-out ones filled with their defaults (`checked_<input>`), and
  Triton's ONNX Runtime backend runs the graph in the next step.  It cannot see which of the
  ensemble's outputs were asked for, so it applies the checks of every output it serves.

This file is also imported by linnet itself (`linnet.serving.triton_model`) and by the tests, so
the validation is plain Python that runs without Triton.
"""
# ruff: noqa: UP031, BLE001 - Triton's Python may be any 3.x the image has: %-formatting, and a
# failure of any kind must become an error response, never an exception out of execute.
import ast
import json
import operator
import os

import numpy as np

try:  # only inside Triton; the validation below is plain Python and testable without it
    import triton_python_backend_utils as pb_utils
except ImportError:  # pragma: no cover
    pb_utils = None

#: The validating step's outputs are its inputs under this prefix (`checked_tokens`).
CHECKED = "checked_"

_COMPARE = {"<=": operator.le, "<": operator.lt, ">=": operator.ge, ">": operator.gt, "==": operator.eq,
            "!=": operator.ne}
# Linnet's `/` on dims is floor division.
_BINARY = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.floordiv,
           ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod}


def dim_value(text, dims):
    """Evaluate a Linnet dim expression ("S", "512", "S / 2 + 1") with the request's dims."""
    def walk(node):
        if isinstance(node, ast.Expression):
            return walk(node.body)
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            return node.value
        if isinstance(node, ast.Name):
            return dims[node.id]  # KeyError: a dim this request does not bind
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -walk(node.operand)
        if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
            return _BINARY[type(node.op)](walk(node.left), walk(node.right))
        raise ValueError("unsupported dim expression: " + text)
    return walk(ast.parse(text, mode="eval"))


def dim_names(text):
    return {n.id for n in ast.walk(ast.parse(text, mode="eval")) if isinstance(n, ast.Name)}


def validate(spec, arrays, requested):
    """None when the request is fine, else a message naming the offending input."""
    dims = {}
    for inp in spec["inputs"]:
        name = inp["name"]
        if name not in arrays and inp.get("default") is not None:
            continue  # filled below, once the other inputs have told the dims
        if name not in arrays:
            return "input '%s' is missing" % name
        array = arrays[name]
        if array.ndim != len(inp["dims"]):
            return "input '%s' must have rank %d [%s], found shape %s" % (
                name, len(inp["dims"]), ", ".join(inp["dims"]), list(array.shape))
        if array.dtype != np.dtype(inp["numpy"]):
            return "input '%s' must be %s, found %s" % (name, inp["dtype"], array.dtype)
        if spec.get("ragged") and array.ndim and array.shape[0] != 1:
            # The batcher concatenates requests' tokens; a request of several rows would be
            # taken for one long sequence.
            return "input '%s' must hold one sequence [1, %s] (the model is served ragged), found shape %s" % (
                name, ", ".join(inp["dims"][1:]), list(array.shape))
        for axis, (want, got) in enumerate(zip(inp["dims"], array.shape)):
            if want.isdigit():
                if int(want) != got:
                    return "input '%s' axis %d must be %s, found %d" % (name, axis, want, got)
            elif want.isidentifier():
                if want in dims and dims[want][0] != got:
                    return "input '%s' has %s = %d on axis %d, but input '%s' has %s = %d: they must agree" % (
                        name, want, got, axis, dims[want][1], want, dims[want][0])
                dims.setdefault(want, (got, name))
    values = {d: v for d, (v, _) in dims.items()}
    for d, (v, name) in dims.items():
        if v == 0:
            return "input '%s' has %s = 0: at least one element is needed along %s" % (name, d, d)
    for inp in spec["inputs"]:
        if inp["name"] not in arrays:
            shape = [int(d) if d.isdigit() else dim_value(d, values) for d in inp["dims"]]
            arrays[inp["name"]] = np.full(shape, inp["default"], dtype=np.dtype(inp["numpy"]))
    outputs = [o for o in spec["outputs"] if o["name"] in requested]
    for out in outputs:
        for left, op, right in out["preconditions"]:
            try:
                lv, rv = dim_value(left, values), dim_value(right, values)
            except KeyError:
                continue
            if not _COMPARE[op](lv, rv):
                used = dim_names(left) | dim_names(right)
                named = [n for d, (v, n) in dims.items() if d in used]
                bound = ", ".join("%s = %d" % (d, v) for d, v in values.items() if d in used)
                return "input '%s': `%s` requires %s %s %s, but %s (the model's limit)" % (
                    named[0] if named else "?", out["entry"], left, op, right, bound)
    limits = {}
    for out in outputs:
        for name, rows in out["bounds"].items():
            limits[name] = min(rows, limits.get(name, rows))
    for name, rows in limits.items():
        array = arrays[name]
        bad = (array < 0) | (array >= rows)
        if bad.any():
            where = [int(i) for i in np.argwhere(bad)[0]]
            return "input '%s' holds %d at %s, but values must be in [0, %d)" % (
                name, int(array[tuple(where)]), where, rows)
    return None


class TritonPythonModel:
    def initialize(self, args):
        import onnxruntime as ort

        here = os.path.join(args["model_repository"], args["model_version"])
        with open(os.path.join(here, "linnet_io.json"), encoding="utf-8") as f:
            self.spec = json.load(f)
        self.output_names = [o["name"] for o in self.spec["outputs"]]
        self.validate_only = self.spec.get("role") == "validate"
        if self.validate_only:
            return  # no graph runs here
        providers = ["CPUExecutionProvider"]
        if args.get("model_instance_kind") == "GPU" and "CUDAExecutionProvider" in ort.get_available_providers():
            providers = [("CUDAExecutionProvider", {"device_id": int(args["model_instance_device_id"])}),
                         "CPUExecutionProvider"]
        self.here, self.providers, self.sessions = here, providers, {}

    def _session(self, requested):
        import onnxruntime as ort

        name = "model.%s.onnx" % requested[0] if len(requested) == 1 else "model.onnx"
        if name not in self.sessions:
            options = ort.SessionOptions()
            if self.spec.get("threads"):  # export-triton --threads; else ONNX Runtime's one per core
                options.intra_op_num_threads = int(self.spec["threads"])
            self.sessions[name] = ort.InferenceSession(os.path.join(self.here, name), options,
                                                       providers=self.providers)
        return self.sessions[name]

    def execute(self, requests):
        responses = []
        for request in requests:
            try:
                responses.append(self._answer(request))
            except Exception as exc:  # a bug or an ONNX Runtime failure: an error response, not a crash
                responses.append(pb_utils.InferenceResponse(
                    output_tensors=[], error=pb_utils.TritonError("%s: %s" % (type(exc).__name__, exc))))
        return responses

    def _answer(self, request):
        arrays = {}
        for inp in self.spec["inputs"]:
            tensor = pb_utils.get_input_tensor_by_name(request, inp["name"])
            if tensor is not None:
                arrays[inp["name"]] = tensor.as_numpy()
        if self.validate_only:
            requested = self.output_names  # the ensemble's request is not visible from a step
        else:
            requested = [n for n in request.requested_output_names() if n in self.output_names] or self.output_names
        problem = validate(self.spec, arrays, requested)
        if problem is not None:
            # INVALID_ARG makes it a client error (HTTP 400) where this Triton has error codes.
            code = getattr(pb_utils.TritonError, "INVALID_ARG", None)
            error = pb_utils.TritonError(problem) if code is None else pb_utils.TritonError(problem, code)
            return pb_utils.InferenceResponse(output_tensors=[], error=error)
        if self.validate_only:
            return pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor(CHECKED + name, np.ascontiguousarray(array)) for name, array in arrays.items()])
        results = self._session(requested).run(requested, {k: np.ascontiguousarray(v) for k, v in arrays.items()})
        return pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor(n, r) for n, r in zip(requested, results)])

    def finalize(self):
        self.sessions = {}
