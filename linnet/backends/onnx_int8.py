"""`precision="int8"` on the onnx backend: dynamic int8 matrices, planned against a measured budget.

The export's dense layers are `Gemm` nodes whose weight is an initializer (`onnx_graph`).  ORT's
dynamic quantiser (`onnxruntime.quantization.quantize_dynamic`) takes `MatMul` only, so each
such Gemm (no transposes, alpha = beta = 1, as the emitter writes them) becomes a MatMul of the
same name and an Add of the bias (`as_matmuls`); the quantiser then gives each weight int8
per output channel, each activation a per-call int8 scale, and ORT fuses the result into
`DynamicQuantizeMatMul`.  Products of two activations (attention's Q·K and P·V) stay f32
(`MatMulConstBOnly`).

Which matrices run int8 is a plan, measured rather than assumed (`plan`): the calibration texts
(`calibration=`, else `default_calibration()`: stdlib docstring paragraphs) are encoded through
the `embed` entry by the f32 graph and by candidate int8 graphs, and a candidate is taken when
the per-text cosine to f32 meets the budget: mean loss (1 - mean cosine) <= `max_cosine_loss`
and every text's cosine >= `min_cosine`.  All matrices int8 first; if that misses, each group
of matrices (one role across the layers: `encoder.layers.*.up.forward_packed/Gemm`) is
quantised alone to see what it costs, and groups are kept in f32, the costliest first, until
the rest meets the budget.  No plan with a matrix left in int8 that meets it is E0835, with
what was measured.  The plan is cached per machine and export (`$LINNET_CACHE/kernels/
onnx-int8.json`), and each quantised graph beside the f32 export, named by the matrices it keeps
f32 (the export folder is keyed by the graph, so a changed graph is quantised again).
"""
from __future__ import annotations

import hashlib
import importlib
import logging
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .. import codes
from ..diagnostics import Diagnostic, LinnetError
from .measured import DecisionCache, cpu_model

log = logging.getLogger("linnet.onnx_int8")

#: `precision=` on the onnx backend.
from . import ONNX_PRECISIONS as PRECISIONS  # noqa: E402
#: The default budget (declared with the record's options).
from . import INT8_MAX_COSINE_LOSS as MAX_COSINE_LOSS, INT8_MIN_COSINE as MIN_COSINE  # noqa: E402
#: The entry the plan is measured on (what `model.encode` runs).
ENTRY = "embed"

#: Standard-library modules whose docstring paragraphs are the default calibration texts.
_CALIBRATION_MODULES = ("abc", "ast", "bz2", "cmd", "code", "codecs", "codeop", "colorsys", "copy", "copyreg",
                        "dis", "doctest", "filecmp", "fileinput", "fnmatch", "ftplib", "getpass", "gettext",
                        "hashlib", "imaplib", "io", "keyword", "linecache", "locale", "lzma", "netrc",
                        "numbers", "pdb", "pkgutil", "platform", "poplib", "pstats", "pyclbr", "quopri",
                        "reprlib", "rlcompleter", "runpy", "selectors", "shelve", "smtplib", "socketserver",
                        "stat", "symtable", "sysconfig", "tabnanny", "token", "trace", "tracemalloc", "types",
                        "wave", "zipimport", "urllib.parse", "urllib.request", "xml.dom.minidom", "ftplib",
                        "nturl2path", "plistlib", "py_compile", "compileall", "webbrowser")
#: At most this many default calibration texts.
CALIBRATION_SIZE = 64


def default_calibration() -> list[str]:
    """Up to CALIBRATION_SIZE paragraphs (3-150 words) of standard-library docstrings, short and
    long: real prose every Python has."""
    texts: list[str] = []
    for name in dict.fromkeys(_CALIBRATION_MODULES):
        try:
            doc = importlib.import_module(name).__doc__ or ""
        except Exception:  # noqa: BLE001 - a module this Python lacks: fewer texts
            continue
        for paragraph in doc.split("\n\n")[:3]:
            text = " ".join(paragraph.split())
            if 3 <= len(text.split()) <= 150 and text not in texts:
                texts.append(text)
    return texts[:CALIBRATION_SIZE]


# ------------------------------------------------------------------------- the graphs


def dense_nodes(model) -> list[str]:
    """The names of the Gemm / MatMul nodes whose weight (input B) is an initializer, in graph order."""
    inits = {t.name for t in model.graph.initializer}
    return [n.name for n in model.graph.node
            if n.op_type in ("Gemm", "MatMul") and len(n.input) >= 2 and n.input[1] in inits
            and _plain_gemm(n)]


def _plain_gemm(node) -> bool:
    if node.op_type != "Gemm":
        return True
    values = {a.name: a for a in node.attribute}
    return all(values[k].i == 0 for k in ("transA", "transB") if k in values) and \
        all(values[k].f == 1.0 for k in ("alpha", "beta") if k in values)


def as_matmuls(model) -> None:
    """Each plain Gemm with an initializer weight, in place, as a MatMul of its name (+ an Add of its bias)."""
    import onnx

    wanted = set(dense_nodes(model))
    nodes = []
    for node in model.graph.node:
        if node.op_type != "Gemm" or node.name not in wanted:
            nodes.append(node)
            continue
        product = node.output[0] if len(node.input) < 3 or not node.input[2] else f"{node.output[0]}/product"
        nodes.append(onnx.helper.make_node("MatMul", list(node.input[:2]), [product], name=node.name))
        if product != node.output[0]:
            nodes.append(onnx.helper.make_node("Add", [product, node.input[2]], [node.output[0]],
                                               name=f"{node.name}/bias"))
    del model.graph.node[:]
    model.graph.node.extend(nodes)


def group_of(node: str) -> str:
    """A matrix's group: its name with the layer index starred (one role across the layers)."""
    return re.sub(r"\.\d+\.", ".*.", node)


def quantised_file(folder: Path, file: str, kept_f32: tuple[str, ...], *, candidate: bool = False) -> Path:
    """`file` of the export with every dense matrix but `kept_f32` in int8, written beside it once.

    A `candidate` (a plan being measured) goes to a name of this process's own, so the
    candidates `plan` rejects can be removed without racing another process;
    `_settle_candidates` gives the chosen one its shared name."""
    import onnx
    import onnxruntime as ort
    from onnxruntime.quantization import QuantType, quantize_dynamic

    digest = hashlib.sha256(repr((sorted(kept_f32), ort.__version__)).encode()).hexdigest()[:16]
    path = folder / f"{Path(file).stem}.int8-{digest}.onnx"
    if path.is_file():
        return path
    if candidate:
        path = path.with_name(f"{path.stem}.candidate{os.getpid()}.onnx")
        if path.is_file():
            return path
    model = onnx.load(str(folder / file))  # with its weights (external data beside it)
    as_matmuls(model)
    temporary = path.with_name(f"{path.name}.tmp{os.getpid()}")
    quantize_dynamic(model, temporary, per_channel=True, weight_type=QuantType.QInt8, op_types_to_quantize=["MatMul"],
                     nodes_to_exclude=list(kept_f32), extra_options={"MatMulConstBOnly": True})
    os.replace(temporary, path)
    return path


def _settle_candidates(candidates: list[Path], chosen: Path | None) -> None:
    """Give the chosen candidate its shared name and remove the rest: each plan measures up to
    one file per group of matrices, and an export folder should keep only what loads use."""
    for path in candidates:
        if not path.name.endswith(f".candidate{os.getpid()}.onnx"):
            continue  # a shared file that was there already
        if path == chosen:
            os.replace(path, path.with_name(path.name.replace(f".candidate{os.getpid()}", "")))
        else:
            path.unlink(missing_ok=True)


# ------------------------------------------------------------------------- the plan


@dataclass
class Int8Plan:
    """What `plan` chose, and what it measured (cosine to f32 on the calibration texts)."""

    quantised: int  # dense matrices in int8
    kept_f32: list  # the dense matrices left in f32, by node name
    mean_cosine: float
    min_cosine: float
    texts: int  # calibration texts
    max_cosine_loss: float
    min_cosine_floor: float
    #: Each candidate measured: [groups kept f32, mean cosine, min cosine].
    tried: list = field(default_factory=list)
    #: How activations get their scales: "dynamic" (per call, ORT) or "static" (calibrated, `int8_static`).
    scheme: str = "dynamic"

    def info(self) -> dict:
        return {"plan": "int8", "scheme": self.scheme, "quantised": self.quantised, "kept_f32": list(self.kept_f32),
                "mean_cosine": self.mean_cosine, "min_cosine": self.min_cosine, "calibration_texts": self.texts,
                "max_cosine_loss": self.max_cosine_loss, "min_cosine_floor": self.min_cosine_floor,
                "tried": [list(t) for t in self.tried]}


def machine_key() -> str:
    """What int8 results depend on besides the model: the CPU (its int8 instructions) and ORT."""
    import onnxruntime as ort

    return f"{cpu_model()}|onnxruntime={ort.__version__}"


_CACHE = DecisionCache("onnx-int8.json", machine_key, Int8Plan)


def cosines(got: np.ndarray, want: np.ndarray) -> np.ndarray:
    """Per-row cosine, in f64."""
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    dots = (got * want).sum(axis=1)
    norms = np.linalg.norm(got, axis=1) * np.linalg.norm(want, axis=1)
    return dots / np.maximum(norms, 1e-300)


class DynamicInt8:
    """ORT's dynamic int8 (`quantised_file`): what the onnx backend runs."""

    scheme = "dynamic"
    key = "dynamic"

    @staticmethod
    def file(folder: Path, file: str, kept_f32: tuple[str, ...], *, candidate: bool = False) -> Path:
        return quantised_file(folder, file, kept_f32, candidate=candidate)


def calibration_texts(texts) -> list[str]:
    """`calibration=` as texts (the default set when None); none at all is E0835."""
    texts = default_calibration() if texts is None else [str(t) for t in texts]
    if not texts:
        raise LinnetError(Diagnostic(codes.INT8_BUDGET, "precision='int8' needs calibration texts to measure the "
                                     "plan on; calibration= is empty"))
    return texts


def texts_digest(texts: list[str]) -> str:
    return hashlib.sha256("\0".join(texts).encode()).hexdigest()[:16]


def plan(model, runtime, texts: list[str] | None, max_cosine_loss: float | None, min_cosine: float | None,
         cache_dir: Path | None, quantiser=DynamicInt8) -> Int8Plan:
    """The int8 plan for a loaded f32 model (see the module docstring).  `quantiser` writes a
    candidate's graph (`DynamicInt8`, or `int8_static.StaticInt8` for OpenVINO); `runtime`
    runs the entry on a given graph file for a while (`use_graph`)."""
    import onnx

    max_cosine_loss = MAX_COSINE_LOSS if max_cosine_loss is None else float(max_cosine_loss)
    min_cosine = MIN_COSINE if min_cosine is None else float(min_cosine)
    _check_measurable(model, runtime, max_cosine_loss, min_cosine)
    texts = calibration_texts(texts)
    file = f"model.{ENTRY}.onnx"
    key = "|".join((f"{runtime.folder.name}/{file}", repr(max_cosine_loss), repr(min_cosine),
                    texts_digest(texts), *([] if quantiser.key == "dynamic" else [runtime.backend, quantiser.key])))
    cached = _CACHE.read(cache_dir).get(key)
    if cached is not None:
        return cached
    nodes = dense_nodes(onnx.load(str(runtime.folder / file), load_external_data=False))
    groups: dict[str, list[str]] = {}
    for node in nodes:
        groups.setdefault(group_of(node), []).append(node)
    reference = model.encode(texts, show_progress_bar=False)
    tried: list = []
    candidates: dict[frozenset, Path] = {}

    def measure(kept_groups: list[str]) -> tuple[float, float]:
        kept = tuple(n for g in kept_groups for n in groups[g])
        path = candidates[frozenset(kept)] = quantiser.file(runtime.folder, file, kept, candidate=True)
        with runtime.use_graph(ENTRY, path.name):
            got = model.encode(texts, show_progress_bar=False)
        cos = cosines(got, reference)
        result = float(cos.mean()), float(cos.min())
        tried.append([sorted(kept_groups), *result])
        return result

    def fits(result) -> bool:
        mean, low = result
        return 1.0 - mean <= max_cosine_loss and low >= min_cosine

    kept_groups: list[str] = []
    try:
        result = measure(kept_groups)
        if not fits(result) and len(groups) > 1:
            # What each group costs alone (the rest f32); keep the costliest in f32 first.
            alone = {g: measure([h for h in groups if h != g]) for g in groups}
            if not any(fits(r) for r in alone.values()):
                result = None
            else:
                for g in sorted(groups, key=lambda g: (alone[g][0], alone[g][1])):
                    kept_groups.append(g)
                    if len(kept_groups) == len(groups) - 1:
                        result = alone[next(h for h in groups if h not in kept_groups)]
                        break
                    result = measure(kept_groups)
                    if fits(result):
                        break
    except BaseException:  # a failed measurement leaves no candidate behind either
        _settle_candidates(list(candidates.values()), None)
        raise
    kept = [n for g in kept_groups for n in groups[g]]
    found = result is not None and fits(result)
    _settle_candidates(list(candidates.values()), candidates.get(frozenset(kept)) if found else None)
    if not found:
        best = max(tried, key=lambda t: (t[1], t[2])) if tried else None
        raise LinnetError(Diagnostic(codes.INT8_BUDGET, (
            f"precision='int8': no plan with a matrix in int8 meets the budget (mean cosine loss <= "
            f"{max_cosine_loss}, every cosine >= {min_cosine}) on {len(texts)} calibration texts through "
            f"`{ENTRY}`; measured {len(tried)} plans, the best mean cosine {best[1]:.6f} (min {best[2]:.6f}) "
            f"keeping {len(best[0])} of {len(groups)} groups of matrices f32; raise max_cosine_loss or lower "
            "min_cosine, or load at f32")))
    chosen = Int8Plan(len(nodes) - len(kept), kept, result[0], result[1], len(texts), float(max_cosine_loss),
                      float(min_cosine), tried, quantiser.scheme)
    if cache_dir is not None:
        _CACHE.record(cache_dir, {key: chosen})
    log.info("int8 plan for %s: %d matrices int8, %d f32, mean cosine %.6f, min %.6f", runtime.folder.name,
             chosen.quantised, len(kept), chosen.mean_cosine, chosen.min_cosine)
    return chosen


def check_options(precision: str | None, calibration, max_cosine_loss, min_cosine) -> bool:
    """Whether int8 was asked for; the budget's options without it are refused by name."""
    int8 = precision == "int8"
    if not int8 and (calibration is not None or max_cosine_loss is not None or min_cosine is not None):
        raise LinnetError(Diagnostic(codes.UNKNOWN_BACKEND_OPTION, "calibration=, max_cosine_loss= and min_cosine= "
                                     "are precision='int8' options; give precision='int8' with them"))
    return int8


def _check_measurable(model, runtime, max_cosine_loss: float, min_cosine: float) -> None:
    problem = None
    if ENTRY not in model.entries:
        problem = f"{model.manifest.name} has no `{ENTRY}` entry to measure the plan on"
    elif model.program.entries[ENTRY].result.dtype != "f32":
        problem = f"the model is {model.program.entries[ENTRY].result.dtype}; int8 is planned from an f32 model"
    elif getattr(runtime, "providers", ["CPUExecutionProvider"])[0] != "CPUExecutionProvider":
        problem = f"int8 runs on ORT's CPU provider, and the session runs on {runtime.providers[0]}"
    elif not 0 <= max_cosine_loss <= 2 or not -1 <= min_cosine <= 1:
        problem = (f"max_cosine_loss must be in [0, 2] and min_cosine in [-1, 1], found "
                   f"{max_cosine_loss!r} and {min_cosine!r}")
    if problem:
        raise LinnetError(Diagnostic(codes.INT8_BUDGET, f"precision='int8': {problem}"))
