"""Diagnostic codes as data: one `ErrorCode` record per code, the only place a code is defined.

Each record carries its code (`E0320`, what users see in `error[E0320]`), a slug
(`bad-operand`), the stage of the pipeline that reports it and a one-line summary.  The
module-level constant for a record is its slug in UPPER_SNAKE (`BAD_OPERAND`), so a raise
site reads `Diagnostic(codes.BAD_OPERAND, ...)` and a misspelt code is an `AttributeError`,
not a new code nobody documented.  `linnet.diagnostics` refuses any code not registered here.

A code is never reused for another meaning: one that nothing raises any more stays
registered with `reserved="why"`.  The diagnostics table in docs/language.md is generated
from this registry (`python -m linnet.codes --markdown`) and a test keeps the two equal.

This module imports nothing from linnet, so a tool can load it on its own.  It runs past
the usual length only because it lists every code: the logic is its first and last screens.
"""
from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from typing import Final, Iterable

#: The stages that report diagnostics, in pipeline order.
STAGES: Final = ("parse", "resolve", "check", "instantiate", "lower", "runtime", "backend", "triton",
                 "manifest", "weights", "hf", "tokenizer", "cli", "images")

_CODE = re.compile(r"E\d{4}")
_SLUG = re.compile(r"[a-z][a-z0-9]*(-[a-z0-9]+)*")


@dataclass(frozen=True, eq=False)
class ErrorCode:
    """One diagnostic code.  Renders as its code string, and compares equal to it."""

    code: str
    slug: str
    stage: str
    summary: str
    reserved: str | None = None  # why a registered code is raised nowhere; None while in use

    def __post_init__(self) -> None:
        if not _CODE.fullmatch(self.code):
            raise ValueError(f"error code {self.code!r} is not E and four digits")
        if not _SLUG.fullmatch(self.slug):
            raise ValueError(f"{self.code}: slug {self.slug!r} is not lowercase words joined by '-'")
        if self.stage not in STAGES:
            raise ValueError(f"{self.code}: unknown stage {self.stage!r}; stages are {', '.join(STAGES)}")
        if not self.summary.strip() or "\n" in self.summary:
            raise ValueError(f"{self.code}: the summary must be one non-empty line")

    @property
    def constant(self) -> str:
        """The name this record has in this module: the slug in UPPER_SNAKE."""
        return self.slug.upper().replace("-", "_")

    def __str__(self) -> str:
        return self.code

    # Equal to its code string too, so `err.code == codes.BAD_INPUT` and `== "E0701"` agree.
    def __eq__(self, other: object) -> bool:
        if isinstance(other, ErrorCode):
            return self.code == other.code
        if isinstance(other, str):
            return self.code == other
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self.code)


_REGISTERED: list[ErrorCode] = []


def _register(code: str, slug: str, stage: str, summary: str, reserved: str | None = None) -> ErrorCode:
    record = ErrorCode(code, slug, stage, summary, reserved)
    _REGISTERED.append(record)
    return record


# -- parse: reading source files (front/parser.py)
BAD_CHARACTER: Final = _register("E0001", "bad-character", "parse",
    "syntax: a character that cannot start any token")
UNEXPECTED_TOKEN: Final = _register("E0002", "unexpected-token", "parse",
    "syntax: an unexpected token or end of file; the message lists what was expected")
UNREADABLE_SOURCE: Final = _register("E0003", "unreadable-source", "parse",
    "a source file cannot be read, or is not UTF-8 text")
NESTING_TOO_DEEP: Final = _register("E0004", "nesting-too-deep", "parse",
    "an expression nested too deeply (over 200 levels); split it with `let`")

# -- resolve: modules, imports and the paths given to the compiler (front/resolve.py, cli/targets.py)
UNKNOWN_MODULE: Final = _register("E0101", "unknown-module", "resolve", "`use` of a module that does not exist")
UNKNOWN_IMPORT: Final = _register("E0102", "unknown-import", "resolve",
    "`use` of a name the module does not define")
IMPORT_CYCLE: Final = _register("E0103", "import-cycle", "resolve", "the modules import each other in a cycle")
MODULE_PATH_MISMATCH: Final = _register("E0104", "module-path-mismatch", "resolve",
    "a file's `module` line does not match the path it is loaded as")
DUPLICATE_NAME: Final = _register("E0105", "duplicate-name", "resolve",
    "a name (item, member, generic, parameter, local) declared twice in one scope")
PRIVATE_ITEM: Final = _register("E0106", "private-item", "resolve",
    "an item or block function used from another module without `pub`")
BAD_PACKAGE_NAME: Final = _register("E0107", "bad-package-name", "resolve",
    "`linnet.toml` has no readable `[package].name`, or it is not an identifier")
BAD_TARGET_PATH: Final = _register("E0108", "bad-target-path", "resolve",
    "a path given to `linnet check`/`build` is missing, or is neither a `.linnet` file, a package nor "
    "a zoo entry")
BAD_DELEGATION: Final = _register("E0109", "bad-delegation", "resolve",
    "`use field.entry` in a block names no member, a member that is not a single block, or an entry "
    "that block does not have")
DELEGATION_CLASH: Final = _register("E0110", "delegation-clash", "resolve",
    "a delegated name is also defined in the block, or delegated twice")
DELEGATION_CYCLE: Final = _register("E0111", "delegation-cycle", "resolve",
    "delegated entries that forward to each other in a cycle")
DELEGATION_THEN_MISMATCH: Final = _register("E0112", "delegation-then-mismatch", "resolve",
    "`use field.entry then f`: `f` does not take one tensor input, or the entry's result does not fit "
    "that input so `f`'s generics and result cannot be read off it")
DEFAULT_NOT_TRAILING: Final = _register("E0113", "default-not-trailing", "resolve",
    "a parameter without a default after one with a default: only trailing parameters may have defaults")
DEFAULT_LATER_PARAM: Final = _register("E0114", "default-later-param", "resolve",
    "a computed default (`= positions(mask)`) that reads its own parameter or a later one")
BAD_BLOCK_ALIAS: Final = _register("E0115", "bad-block-alias", "resolve",
    "`block X<...> = Template<...>`: the target is not a block template (a block with a `Block` "
    "generic), or its arguments do not fit: too many or too few, a non-block for a `Block` generic, "
    "a block for any other")
MISUSED_BLOCK_GENERIC: Final = _register("E0116", "misused-block-generic", "resolve",
    "a `Block` generic used other than as a whole `sub` type (with arguments, a default, in a type or "
    "an expression), or a block template used as a `sub` without an alias")
BAD_GENERIC_SPLICE: Final = _register("E0117", "bad-generic-splice", "resolve",
    "`..Block` among generics or `Block<..>` as arguments outside a block alias, a spliced name that is "
    "no block (or a template), or a spliced generic the alias also declares")

# -- check: types, dims and where clauses (check/, prims.py)
UNKNOWN_NAME: Final = _register("E0201", "unknown-name", "check", "an unknown name or dim")
UNKNOWN_FUNCTION: Final = _register("E0202", "unknown-function", "check",
    "an unknown function, or a block has no function by that name")
UNKNOWN_DTYPE: Final = _register("E0203", "unknown-dtype", "check",
    "an unknown dtype, or `Tensor` without dims and a dtype")
BAD_GENERIC_KIND: Final = _register("E0204", "bad-generic-kind", "check",
    "an unknown generic kind, a misused `*` / `Shape`, or a `Shape` with a default")
MISUSED_SHAPE: Final = _register("E0205", "misused-shape", "check",
    "`*S` without a `Shape` generic, a `Dim` place given another kind, or two `*` in one type")
ENTRY_OUTSIDE_BLOCK: Final = _register("E0206", "entry-outside-block", "check", "an `entry` outside a block")
PARAM_NOT_FIXED_RANK: Final = _register("E0207", "param-not-fixed-rank", "check",
    "a `param` that is not a tensor of fixed rank")
NOT_A_BLOCK: Final = _register("E0208", "not-a-block", "check",
    "a block used where a function is expected, a non-block in `sub`, or a block whose declaration "
    "has errors")
MISSING_RESULT_TYPE: Final = _register("E0209", "missing-result-type", "check",
    "a function without a result type")
BAD_ENTRY_SIGNATURE: Final = _register("E0210", "bad-entry-signature", "check",
    "an entry with a non-`Dim` generic, an input not of fixed rank, or a dim not readable from its "
    "inputs")
RECURSIVE_BLOCK: Final = _register("E0211", "recursive-block", "check",
    "a block that contains itself through its sub-blocks")
BAD_PARAM_DEFAULT: Final = _register("E0212", "bad-param-default", "check",
    "a parameter default other than `zeros`/`ones`, on a non-entry function, or on a non-tensor")
BROADCAST_ON_BLOCK: Final = _register("E0213", "broadcast-on-block", "check",
    "a `broadcasts to` clause on a block (it belongs on a function)")
ARGUMENT_COUNT: Final = _register("E0301", "argument-count", "check", "wrong number of arguments")
GENERIC_ARGUMENT_COUNT: Final = _register("E0303", "generic-argument-count", "check",
    "wrong number of generic arguments, or a `Shape` generic passed explicitly")
UNINFERRED_GENERIC: Final = _register("E0304", "uninferred-generic", "check",
    "a generic neither given nor inferable, or a block missing generic arguments")
BAD_DTYPE_ARGUMENT: Final = _register("E0305", "bad-dtype-argument", "check",
    "a generic argument that is not a dtype of the required kind")
BAD_REAL_ARGUMENT: Final = _register("E0308", "bad-real-argument", "check",
    "a `Real` generic given something other than a number literal or a Real generic")
UNKNOWN_MEMBER: Final = _register("E0309", "unknown-member", "check",
    "a generic of an enum-like kind (`Activation`) given a name that is not one of its members")
BAD_MEMBER_ARGUMENT: Final = _register("E0310", "bad-member-argument", "check",
    "a generic of an enum-like kind given a number or another kind's generic, or a member where "
    "its kind is not expected")
ARGUMENT_TYPE: Final = _register("E0306", "argument-type", "check",
    "an argument that does not fit its parameter (or an `Option` not given as `some(x)`/`none`)")
DECLARED_TYPE: Final = _register("E0307", "declared-type", "check",
    "a value that does not fit its declared type: result, annotation or `var`")
MISSING_RETURN: Final = _register("E0311", "missing-return", "check",
    "a function that does not end with `return`")
UNREACHABLE_STATEMENT: Final = _register("E0312", "unreachable-statement", "check",
    "a statement after `return`")
ASSIGN_TO_LET: Final = _register("E0313", "assign-to-let", "check", "assignment to a `let` binding")
NOT_A_SUB_ARRAY: Final = _register("E0314", "not-a-sub-array", "check",
    "`static for` over something that is not a sub-block array, or a method call on a whole array")
RETURN_IN_STATIC_FOR: Final = _register("E0315", "return-in-static-for", "check",
    "`return` inside `static for`")
IF_LET_NOT_OPTION: Final = _register("E0316", "if-let-not-option", "check",
    "`if let some(...)` on something that is not an `Option`")
RECURSIVE_CALL: Final = _register("E0317", "recursive-call", "check",
    "a function that calls itself, directly or through others")
BAD_COLLECT: Final = _register("E0318", "bad-collect", "check",
    "`collect v` of something other than a tensor `var` declared before the loop (a `let`, a "
    "parameter, a name declared inside the loop, a dim, a literal scalar)")
SHAPE_FROM_PASS_NUMBER: Final = _register("E0319", "shape-from-pass-number", "check",
    "a tensor whose shape depends on a `static for` pass number (every pass must see the same types)")
BAD_OPERAND: Final = _register("E0320", "bad-operand", "check",
    "an operation applied to values it does not take (e.g. `%` on tensors, negating a sub-block)")
SHAPE_MISMATCH: Final = _register("E0321", "shape-mismatch", "check",
    "shapes that do not broadcast, or shapes a primitive does not accept (`matmul`, `transpose`, "
    "`take`)")
BAD_INDEX: Final = _register("E0322", "bad-index", "check",
    "indexing a tensor of unknown rank, too many indices, a non-integer index, or a primitive that "
    "needs a known rank")
AXIS_OUT_OF_RANGE: Final = _register("E0323", "axis-out-of-range", "check",
    "an axis out of range, or inside a `*S` run")
RESHAPE_COUNT: Final = _register("E0324", "reshape-count", "check",
    "`reshape` whose element counts cannot be proven equal")
NOT_A_PERMUTATION: Final = _register("E0325", "not-a-permutation", "check",
    "`permute` with a list that is not a permutation of the axes")
INDEX_OUT_OF_BOUNDS: Final = _register("E0326", "index-out-of-bounds", "check",
    "an index or slice provably out of bounds (or, from a `static for` pass number, not proven in bounds), "
    "or a constant index no 64-bit index can hold")
DTYPE_MISMATCH: Final = _register("E0330", "dtype-mismatch", "check",
    "dtypes that do not match, a dtype a primitive does not take, or a number (literal, constant or "
    "dim) outside the range of the dtype it meets")
CONSTANT_NOT_LITERAL: Final = _register("E0331", "constant-not-literal", "check",
    "a constant whose value is not a number literal")
BAD_LOCAL: Final = _register("E0332", "bad-local", "check",
    "a local bound to something it cannot hold (a sub-block, an `Option`)")
BAD_LIST_ITEM: Final = _register("E0333", "bad-list-item", "check",
    "a list literal holding something other than integers and dims")
NOT_A_VALUE: Final = _register("E0334", "not-a-value", "check", "a generic, function or block used as a value")
BAD_DIM_EXPRESSION: Final = _register("E0335", "bad-dim-expression", "check",
    "an invalid dim expression, such as division by the constant 0")
DIM_AS_TENSOR: Final = _register("E0336", "dim-as-tensor", "check",
    "a dim used directly as a tensor; `cast<T>(dim)` converts it")
TUPLE_ARITY: Final = _register("E0338", "tuple-arity", "check",
    "a `return (...)` or `let (...) =` with a different number of values than the function's results")
TUPLE_MISUSE: Final = _register("E0339", "tuple-misuse", "check",
    "several results used as one value (a call returning a tuple outside `let (...) =` and `return`, a "
    "tuple literal outside `return`), or one value where several are declared")
NOT_A_SUB_BLOCK: Final = _register("E0337", "not-a-sub-block", "check",
    "a method call on something that is not a sub-block")
WHERE_VIOLATED: Final = _register("E0401", "where-violated", "check",
    "a `where` clause that is false for the values it is given")
WHERE_UNPROVEN: Final = _register("E0402", "where-unproven", "check",
    "a `where` clause the caller's facts cannot prove")

# -- instantiate: concrete generics and check dims (middle/instantiate.py, compiler.py)
CHECK_DIMS_PRECONDITION: Final = _register("E0403", "check-dims-precondition", "instantiate",
    "an entry precondition false at the `[check]` dims or `--set` values")
UNKNOWN_ROOT: Final = _register("E0501", "unknown-root", "instantiate",
    "the zoo entry's `[source].root` names no block in the package")
MISSING_GENERIC_VALUE: Final = _register("E0502", "missing-generic-value", "instantiate",
    "a root generic without a value (no `[generics]` entry, no default)")
BAD_GENERIC_VALUE: Final = _register("E0503", "bad-generic-value", "instantiate",
    "a value of the wrong kind: a root generic or a check dim that is not a non-negative integer, or "
    "a dtype outside its kind")
UNKNOWN_GENERIC: Final = _register("E0504", "unknown-generic", "instantiate",
    "`[generics]` or `--set` names a generic the root block does not have")
IMPOSSIBLE_SHAPE: Final = _register("E0505", "impossible-shape", "instantiate",
    "a shape that cannot exist with the concrete values (a negative dim, a division by zero, a "
    "collecting loop over a sub array of length 0), or a model of more than 100,000 block instances")
SET_OUTSIDE_ENTRY: Final = _register("E0506", "set-outside-entry", "instantiate",
    "`--set` given for a file or package: values can only be set for a zoo entry")
BAD_MEMBER_VALUE: Final = _register("E0507", "bad-member-value", "instantiate",
    "`[generics]` or `--set` gives a generic of an enum-like kind (`Activation`) a value that is not "
    "one of its members")

# -- lower: the backend-neutral IR (middle/lower.py)
DIM_NOT_IN_INPUTS: Final = _register("E0601", "dim-not-in-inputs", "lower",
    "lowering: a function needs a dim at run time that no input axis carries")
BAD_ACTIVATION: Final = _register("E0602", "bad-activation", "lower",
    "lowering: `activation(x, kind)` given a kind that names no activation (0 gelu_erf, 1 gelu_tanh, "
    "2 relu, 3 silu)")

# -- runtime: calling a loaded model (runtime.py and the backends' runtimes)
BAD_INPUT: Final = _register("E0701", "bad-input", "runtime",
    "run time: inputs that do not fit the entry: missing or extra, wrong rank, dtype or size, dims "
    "that disagree across inputs, an empty dim, an id outside its table, integers where floats are "
    "declared, or a NaN or infinity in a float input")
PRECONDITION_FAILED: Final = _register("E0702", "precondition-failed", "runtime",
    "run time: an entry precondition (such as `S <= 512`) fails for the given inputs")
UNKNOWN_MODEL_ENTRY: Final = _register("E0703", "unknown-model-entry", "runtime",
    "run time: the model has no entry by that name")
ALIAS_AND_NAME: Final = _register("E0704", "alias-and-name", "runtime",
    "run time: an input given both by its name and by its transformers alias (`tokens` and "
    "`input_ids`, `token_types` and `token_type_ids`)")
NOT_A_DECODER: Final = _register("E0705", "not-a-decoder", "runtime",
    "`generate`: the model's `prefill` or `decode` entry does not return two results, the next "
    "token's scores [B, Vocab] and the cache that `decode` takes")

# -- backend: nest.load's options and the backends' own limits (backends/, nest/__init__.py)
BAD_DEVICE: Final = _register("E0801", "bad-device", "backend",
    "torch, JAX, StableHLO or OpenVINO backend: an unknown device, or CUDA/GPU asked for but not available "
    "(OpenVINO: any device but the CPU)")
BAD_TORCH_MODE: Final = _register("E0802", "bad-torch-mode", "backend",
    "torch backend: an unknown `mode` or `kernels`, or `cudagraphs` without CUDA")
UNKNOWN_BACKEND: Final = _register("E0804", "unknown-backend", "backend", "`nest.load`: an unknown backend")
ENTRY_WITHOUT_WEIGHTS: Final = _register("E0805", "entry-without-weights", "backend",
    "`nest.load`: the entry declares no `[weights]`")
NO_FLOAT_GENERIC: Final = _register("E0806", "no-float-generic", "backend",
    "`nest.load`: `dtype=` given, but the root block has no `Float` generic")
UNKNOWN_BACKEND_OPTION: Final = _register("E0807", "unknown-backend-option", "backend",
    '`nest.load`: an option the chosen backend does not take (e.g. `mode=` with `backend="onnx"`)')
MISSING_PACKAGE: Final = _register("E0808", "missing-package", "backend",
    "the chosen backend needs a Python package that is not installed (the message names the `linnet[...]` "
    "extra that installs it)")
BAD_BACKEND_OPTION_TYPE: Final = _register("E0809", "bad-backend-option-type", "backend",
    "`nest.load`: a backend option of the wrong type (e.g. `share_weights=\"yes\"`); the message names the type")
STABLEHLO_REFUSED_INPUTS: Final = _register("E0820", "stablehlo-refused-inputs", "backend",
    "the StableHLO artifact refused the inputs (jax's explanation is quoted)")
STABLEHLO_SYMBOLIC_EXPORT: Final = _register("E0821", "stablehlo-symbolic-export", "backend",
    "an entry cannot be exported to StableHLO with symbolic dims (names the entry and jax's reason)")
ONNX_UNSUPPORTED: Final = _register("E0830", "onnx-unsupported", "backend",
    "the ONNX backend cannot express a construct (a primitive or dim expression with no ONNX form, or "
    "a param the weights lack)")
ONNX_PROVIDER_UNAVAILABLE: Final = _register("E0831", "onnx-provider-unavailable", "backend",
    "an ONNX Runtime execution provider this installation does not have (the message lists the "
    "available ones)")
ONNX_BAD_DEVICE: Final = _register("E0832", "onnx-bad-device", "backend",
    "a device the ONNX backend cannot use: unknown, `cuda` without onnxruntime-gpu, or both `device=` "
    "and `providers=`")
BUILD_DTYPE_MISMATCH: Final = _register("E0833", "build-dtype-mismatch", "backend",
    "`build(dtype=...)` disagrees with the dtype the program was prepared with")
OPENVINO_PRECISION: Final = _register("E0834", "openvino-precision", "backend",
    "the openvino backend: a compiled model that reads back another inference precision than the one "
    "asked for")
INT8_BUDGET: Final = _register("E0835", "int8-budget", "backend",
    "the onnx backend's `precision=\"int8\"`: no plan quantising at least one matrix meets the cosine "
    "budget (`max_cosine_loss`, `min_cosine`) on the calibration texts, or the model has nothing to "
    "measure it on (an `embed` entry, f32, the CPU provider)")

# -- triton: writing a Triton model repository (serving/triton.py)
TRITON_BAD_OPTION: Final = _register("E0840", "triton-bad-option", "triton",
    "`export-triton`: unknown Triton runtime, or `max_batch_size` not a whole number ≥ 0")
TRITON_BAD_MODEL_NAME: Final = _register("E0841", "triton-bad-model-name", "triton",
    "the model name cannot be a Triton model folder name")
TRITON_NO_BATCH_DIM: Final = _register("E0842", "triton-no-batch-dim", "triton",
    "inputs and outputs do not share a leading batch dim (export with `max_batch_size=0`)")
TRITON_INCOMPATIBLE_ENTRIES: Final = _register("E0843", "triton-incompatible-entries", "triton",
    "the entries cannot be served as one Triton model (different inputs, a duplicate input/output "
    "name, or no entries)")
TRITON_BAD_DTYPE: Final = _register("E0844", "triton-bad-dtype", "triton",
    "a dtype Triton cannot serve as asked: differs from the prepared one, has no Triton type, or bf16 "
    "with the python runtime")
TRITON_BAD_REPOSITORY: Final = _register("E0845", "triton-bad-repository", "triton",
    "the repository path is a file, or the model folder exists without a `config.pbtxt`")
TRITON_RAGGED_UNSUPPORTED: Final = _register("E0846", "triton-ragged-unsupported", "triton",
    "`export-triton --ragged` cannot serve this: an output with neither a row per request nor one per "
    "token (`hidden_states`, `attentions`), inputs that are not `[B, S]` tokens, or not the onnxruntime "
    "runtime with batching")
TRITON_SEVERAL_RESULTS: Final = _register("E0847", "triton-several-results", "triton",
    "an entry with several results (`-> (A, B)`), which Triton export did not serve",
    reserved="served since: each result is an output of its own, named as in the ONNX graph")

# -- manifest: nest.toml and linnet.toml (nest/manifest.py)
UNKNOWN_ZOO_ENTRY: Final = _register("E0901", "unknown-zoo-entry", "manifest",
    "no zoo entry by that name, or the folder has no `nest.toml`")
UNREADABLE_MANIFEST: Final = _register("E0902", "unreadable-manifest", "manifest",
    "a manifest file is missing or is not readable UTF-8 text")
INVALID_TOML: Final = _register("E0903", "invalid-toml", "manifest", "a manifest file is not valid TOML")
MISSING_FIELD: Final = _register("E0904", "missing-field", "manifest",
    "a required table or field is missing from a manifest")
WRONG_FIELD_TYPE: Final = _register("E0905", "wrong-field-type", "manifest",
    "a manifest field has the wrong type")
UNKNOWN_FIELD: Final = _register("E0906", "unknown-field", "manifest",
    "an unknown table or field in a manifest (usually a typo)")
PATH_OUTSIDE_ENTRY: Final = _register("E0907", "path-outside-entry", "manifest",
    "a manifest path is absolute or climbs out of the entry folder")
BAD_REVISION: Final = _register("E0908", "bad-revision", "manifest",
    "`[weights].revision` is not a 40-hex-digit commit id")
BAD_SHA256_PIN: Final = _register("E0909", "bad-sha256-pin", "manifest",
    "a `[weights].sha256` pin is not 64 hex digits, pins a file not in `[weights].files`, or a file of a "
    "`[weights.package]` copy has no pin (a `gguf` copy: its own `sha256`)")
BAD_SOURCE: Final = _register("E0910", "bad-source", "manifest",
    "`[source]` does not give exactly one of `path` and `zoo`")
BAD_SOURCE_ZOO: Final = _register("E0911", "bad-source-zoo", "manifest",
    "`[source].zoo` names no zoo entry, or reused entries form a loop")
BAD_FIELD_VALUE: Final = _register("E0912", "bad-field-value", "manifest",
    "a manifest value of the right type that is not accepted (e.g. a `[model].name` that is not a "
    "plain name)")
BAD_OUTPUTS: Final = _register("E0913", "bad-outputs", "manifest",
    "`[outputs]` in nest.toml names an entry the root block does not have, or gives two entries the "
    "same output name")

# -- weights: checkpoint files and bindings (nest/weights.py)
FILE_UNAVAILABLE: Final = _register("E1001", "file-unavailable", "weights",
    "a file of the entry's Hub repo (a checkpoint or a tokenizer file) is not available: not cached "
    "while offline, or the download failed")
SHA256_MISMATCH: Final = _register("E1002", "sha256-mismatch", "weights",
    "a checkpoint file's sha256 differs from the pin in `nest.toml`")
NOT_SAFETENSORS: Final = _register("E1003", "not-safetensors", "weights",
    "`weights=` is not a safetensors checkpoint (missing, another format, or a pickle, which is never "
    "opened)")
CORRUPT_SAFETENSORS: Final = _register("E1004", "corrupt-safetensors", "weights",
    "a safetensors file is corrupt: truncated, a bad header or `__metadata__`, offsets outside its "
    "data, tensors that overlap or leave gaps, or a shape overflowing 64 bits")
DUPLICATE_TENSOR_KEY: Final = _register("E1005", "duplicate-tensor-key", "weights",
    "the same tensor key in two checkpoint files")
UNBOUND_PARAM: Final = _register("E1006", "unbound-param", "weights", "a model parameter has no binding")
BINDING_UNKNOWN_PARAM: Final = _register("E1007", "binding-unknown-param", "weights",
    "a binding names a parameter the model does not have")
BINDING_MISSING_KEY: Final = _register("E1008", "binding-missing-key", "weights",
    "a binding names a key the checkpoint does not have")
PARAM_SHAPE_MISMATCH: Final = _register("E1009", "param-shape-mismatch", "weights",
    "a parameter's shape differs from its checkpoint tensor's")
PARAM_DTYPE_MISMATCH: Final = _register("E1010", "param-dtype-mismatch", "weights",
    "a parameter's dtype differs from its checkpoint tensor's")
BAD_BINDINGS_FILE: Final = _register("E1011", "bad-bindings-file", "weights",
    "a bindings file is not a JSON object mapping parameter names to keys")
WEIGHTS_NOT_GIVEN: Final = _register("E1012", "weights-not-given", "weights",
    "the entry declares no `[weights]` and no `weights=` was passed")
BAD_WEIGHTS_DTYPE: Final = _register("E1013", "bad-weights-dtype", "weights",
    "an unknown or non-float dtype name was asked for")
CANNOT_SAVE: Final = _register("E1020", "cannot-save", "weights",
    "`nest.save` was given something it cannot save: not a loaded model or a trainable module, "
    "or `params=` without every param of the model")
PLACEHOLDER_REVISION: Final = _register("E1016", "placeholder-revision", "weights",
    "the entry pins the all-zero placeholder revision (written offline, never looked up), so there "
    "is no commit to download: pass `revision=` or `weights=`")
TF_CHECKPOINT_UNREADABLE: Final = _register("E1014", "tf-checkpoint-unreadable", "weights",
    "`linnet convert-tf`: a TensorFlow checkpoint (`.index` and `.data-*` files) that is missing, "
    "truncated, compressed, or holds a tensor kind it cannot convert")
TF_CHECKPOINT_NAME: Final = _register("E1015", "tf-checkpoint-name", "weights",
    "`linnet convert-tf`: a variable name that transformers' BERT layout has no key for, or a "
    "missing or unreadable `bert_config.json`")

# -- hf: entries built from a Hugging Face repo (nest/hf.py)
BAD_HF_NAME: Final = _register("E1101", "bad-hf-name", "hf",
    '`nest.load("hf:...")`: the name is not `hf:owner/name`')
HF_CONFIG_NOT_OBJECT: Final = _register("E1102", "hf-config-not-object", "hf",
    "`hf:`: the repo's `config.json` is not a JSON object")
HF_CONFIG_FIELD: Final = _register("E1103", "hf-config-field", "hf",
    "`hf:`: the repo's `config.json` lacks a field it needs (sizes, `model_type`, `architectures`), "
    "or gives one a value of the wrong type")
HF_MODEL_TYPE: Final = _register("E1104", "hf-model-type", "hf",
    "`hf:` or a folder: the repo's `model_type` is not one a zoo source reads (`linnet.nest.families`)")
HF_ARCHITECTURE: Final = _register("E1105", "hf-architecture", "hf",
    "`hf:` or a folder: the repo's `architectures[0]` is not one of the transformers classes its family builds")
HF_UNSUPPORTED_CONFIG: Final = _register("E1106", "hf-unsupported-config", "hf",
    "`hf:` or a folder: the config asks for what the family's source does not compute (an activation it "
    "lacks, relative positions, scaled RoPE, a sliding attention window, a decoder, heads that do not divide "
    "the width, a QA head without two labels)")
HF_BAD_SHARD_INDEX: Final = _register("E1107", "hf-bad-shard-index", "hf",
    "`hf:`: the repo's `model.safetensors.index.json` is not a valid shard index")
HF_UNTIED_DECODER: Final = _register("E1108", "hf-untied-decoder", "hf",
    "`hf:` or a folder: a checkpoint's output layer is not its word-embedding table (untied weights: a "
    "BERT masked-LM decoder, a GPT-2 `lm_head`, or `tie_word_embeddings: false`)")
HF_BINDINGS_UNWRITABLE: Final = _register("E1109", "hf-bindings-unwritable", "hf",
    "`hf:`: the generated bindings cannot be written (neither the Linnet cache nor the temporary "
    "folder is writable)")
NOT_A_MODEL_FOLDER: Final = _register("E1110", "not-a-model-folder", "hf",
    "`nest.load(folder)`: the folder holds neither a zoo entry's `nest.toml` nor a transformers "
    "`config.json` (or a sentence-transformers `modules.json`)")
UNSUPPORTED_PIPELINE_MODULE: Final = _register("E1111", "unsupported-pipeline-module", "hf",
    "a sentence-transformers `modules.json` names a module Linnet cannot run (a custom class, `CNN`, "
    "`LSTM`, `WordWeights`, ...) or a setting of one it can (an activation, another input or output)")
BAD_PIPELINE_FILE: Final = _register("E1112", "bad-pipeline-file", "hf",
    "a sentence-transformers file (`modules.json`, a module's `config.json`, "
    "`sentence_bert_config.json`, `config_sentence_transformers.json`) is unreadable or malformed")
BAD_GGUF: Final = _register("E1113", "bad-gguf", "hf",
    "`nest.load(\"x.gguf\")`: the file is not a GGUF that gguf's reader can read (truncated, another "
    "format), or it holds what Linnet cannot load exactly: an architecture other than llama, a tensor "
    "type other than F32/F16/Q4_0/Q4_1/Q8_0, a missing or unknown tensor, scaled RoPE; or, as a zoo "
    "entry's weights (`weights=`, or a `[weights.package]` copy), metadata that disagrees with the entry's "
    "generics")

# -- tokenizer: building and calling tokenizers (nest/tokenizer.py)
BAD_TOKENIZER_FILE: Final = _register("E1201", "bad-tokenizer-file", "tokenizer",
    "a tokenizer file is not a usable `vocab.txt` (unreadable, empty, lacking BERT's special tokens) "
    "or `tokenizer.json`")
NO_TOKENIZER: Final = _register("E1202", "no-tokenizer", "tokenizer",
    "`model.tokenizer` / `nest.load_tokenizer`: the entry declares no `[tokenizer]`, or (built in "
    "code) no `[weights]` repo to fetch its files from")
TEXT_TOO_LONG: Final = _register("E1203", "text-too-long", "tokenizer",
    "a text (or pair) is longer than `max_length` (default MaxPositions) and `truncation=False`")
BAD_TOKENIZER_INPUT: Final = _register("E1204", "bad-tokenizer-input", "tokenizer",
    "the tokenizer was given something it does not take: not a string, list of strings or pairs; text "
    "that is not valid Unicode (a lone surrogate); a bad `max_length` or `padding`; rows of "
    "different lengths with `padding=False`")

# -- cli: the `linnet` command's own checks (cli/run.py)
TASK_UNAVAILABLE: Final = _register("E1301", "task-unavailable", "cli",
    "`linnet run --task T`: the model lacks the entry that task needs (`mlm`, `embed`, `logits`, "
    "`pool`, an `[image]` table for classify-image, `prefill`/`decode` for generate), or fill-mask was asked with no `[MASK]` in any text")
EMBED_BAD_INPUT: Final = _register("E1302", "embed-bad-input", "cli",
    "`linnet embed` / `nest.bulk`: the input is not a .txt, .jsonl or .parquet file, a line is not a "
    "JSON object, the text column is missing, or a text is not a string")
EMBED_OUTPUT_MISMATCH: Final = _register("E1303", "embed-output-mismatch", "cli",
    "`linnet embed`: the output folder holds shards of another job (another input file, model or "
    "setting), or files that are not shards, so resuming into it would mix two embeddings")
MISSING_EXTRA: Final = _register("E1304", "missing-extra", "cli",
    "a feature needs an optional extra that is not installed (`linnet[ray]`: Ray Data, and pyarrow "
    "for Parquet shards); the message says what to install")


# -- images: an image model's preprocessing and labels (nest/images.py)
NO_IMAGE_PREPROCESSOR: Final = _register("E1401", "no-image-preprocessor", "images",
    "`model.preprocess` / `model.labels`: the entry declares no `[image]` (or no `labels` file), or "
    "no `[weights]` repo to fetch its files from")
BAD_IMAGE_CONFIG: Final = _register("E1402", "bad-image-config", "images",
    "a `preprocessor_config.json` or `config.json` is not usable: unreadable, not a JSON object, a "
    "setting of the wrong type, a resampling filter Pillow lacks, or labels that are not `id2label`")
BAD_IMAGE_INPUT: Final = _register("E1403", "bad-image-input", "images",
    "`model.preprocess` was given something it does not take: not a path, PIL image or uint8 array "
    "([H, W], [H, W, 3] or [H, W, 4]), or a file Pillow cannot read")

def index(records: Iterable[ErrorCode]) -> dict[str, ErrorCode]:
    """Code string -> record; two records with one code or one slug are a registry bug."""
    by_code: dict[str, ErrorCode] = {}
    by_slug: dict[str, ErrorCode] = {}
    for record in records:
        for table, key in ((by_code, record.code), (by_slug, record.slug)):
            if key in table:
                raise ValueError(f"{key!r} is registered twice: {table[key].code} and {record.code}")
            table[key] = record
    return dict(sorted(by_code.items()))


BY_CODE: Final = index(_REGISTERED)


def _check_constant_names() -> None:
    """Each record is bound to the constant its slug names, so the slug alone finds it."""
    bound = {name: value for name, value in globals().items() if isinstance(value, ErrorCode)}
    for record in BY_CODE.values():
        if bound.get(record.constant) is not record:
            raise ValueError(f"{record.code} ({record.slug}) must be bound to the name {record.constant}")


_check_constant_names()


def lookup(code: ErrorCode | str) -> ErrorCode:
    """The registered record of `code`; KeyError for a code nobody registered."""
    record = BY_CODE.get(str(code))
    if record is None:
        raise KeyError(f"{code!r} is not a registered diagnostic code (see linnet/codes.py)")
    return record


def summaries(stage: str) -> dict[str, str]:
    """Code -> summary of the codes `stage` reports (each stage module's `CODES`)."""
    if stage not in STAGES:
        raise ValueError(f"unknown stage {stage!r}")
    return {r.code: r.summary for r in BY_CODE.values() if r.stage == stage}


def _meaning(record: ErrorCode) -> str:
    text = record.summary if record.reserved is None else \
        f"reserved, not raised any more: {record.reserved} (it meant: {record.summary})"
    return text.replace("|", "\\|")


def markdown_table(records: Iterable[ErrorCode] | None = None) -> str:
    """The diagnostics table of docs/language.md (of every registered code unless told), in code order."""
    rows = BY_CODE.values() if records is None else sorted(records, key=lambda r: r.code)
    lines = ["| Code | Name | Stage | Meaning |", "| --- | --- | --- | --- |"]
    lines += [f"| `{r.code}` | `{r.slug}` | {r.stage} | {_meaning(r)} |" for r in rows]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args != ["--markdown"]:
        print("usage: python -m linnet.codes --markdown   (prints the table for docs/language.md)",
              file=sys.stderr)
        return 2
    sys.stdout.write(markdown_table())
    return 0


if __name__ == "__main__":
    sys.exit(main())
