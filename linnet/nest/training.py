"""Fine-tuning a zoo entry: a trainable torch module, a pure JAX function, and saving back.

`nest.load` builds an inference runtime: the program optimised (Q/K/V fused into one weight,
the attention scale folded into the query rows, Linear weights possibly packed for oneDNN)
and every tensor frozen.  None of that is what a user trains, so everything here starts
again from the *unoptimised* program, the one written in the Linnet source, with the
checkpoint bound param by param:

* `torch_module(model)`: the generated `nn.Module` of the root block, each parameter a
  trainable `nn.Parameter` named by its Linnet param path (`bert.encoder.layers.0.up.weight`),
  torch's own kernels (no oneDNN packing), one method per entry that takes torch tensors by
  the entry's input names or transformers' aliases.
* `jax_params(model)` / `jax_function(model, entry)`: the checkpoint as a flat
  `{param path: jax.Array}` dict, and a pure function of it and the inputs (`key=` a PRNG key
  turns dropout on), for `jax.jit` and `jax.grad`.
* `save(model_or_module, folder)`: the params back under the checkpoint's own keys, with
  the files beside the checkpoint (config, tokenizer) that make the folder loadable.
"""
from __future__ import annotations

import inspect
import json
import os
import shutil
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from .. import codes, dtypes
from ..diagnostics import Note, error
from ..middle import ir
from ..runtime import InputValidator

#: The files beside a checkpoint that `save` copies, so the saved folder loads as the source
#: did: transformers' config and tokenizer files, and sentence-transformers' module list.
BESIDE_FILES = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json", "vocab.txt",
                "special_tokens_map.json", "added_tokens.json", "preprocessor_config.json", "modules.json",
                "sentence_bert_config.json", "config_sentence_transformers.json")
#: Folders beside a checkpoint copied whole (sentence-transformers' pooling settings).
BESIDE_FOLDERS = ("1_Pooling",)
CHECKPOINT_NAME = "model.safetensors"


@dataclass
class TrainingSource:
    """The unoptimised program of a loaded model, with what binds it to its checkpoint."""

    ctx: Any            # linnet.backends.LoadContext, its program unoptimised
    report: Any         # linnet.nest.weights.BindingReport: param path -> the TensorInfo it came from
    files: list[Path]   # the checkpoint's .safetensors files
    #: Their names in the repo or folder ("2_Dense/model.safetensors"), where known.
    names: tuple[str, ...] | None = None

    @property
    def program(self) -> ir.Program:
        return self.ctx.program


def training_source(model) -> TrainingSource:
    """Compile `model`'s entry again without optimisation and verify its bindings (headers only;
    the tensors are read when asked for).  Cached on the model: the compile is on disk anyway."""
    cached = model.__dict__.get("_training_source")
    if cached is not None:
        return cached
    from . import prepare

    options = model.load_options
    ctx, info = prepare(model.manifest, dtype=options.get("dtype"), revision=options.get("revision"),
                        weights=options.get("weights"), optimize=())
    source = TrainingSource(ctx, info.report, list(info.files), info.names)
    model.__dict__["_training_source"] = source
    return source


# --------------------------------------------------------------------------- torch


def torch_module(model):
    """A trainable `torch.nn.Module` of `model`'s entry (see the module docstring), in eval mode
    as transformers' `from_pretrained` returns its models: call `.train()` to drop."""
    import torch

    from ..backends.pysource import import_generated, py_name
    from ..backends.torch_runtime import generated_source, torch_param_name

    source = training_source(model)
    program = source.program
    path = generated_source(source.ctx)
    generated = import_generated(path, f"linnet_generated_torch_{path.stem.replace('-', '_')}")
    root = getattr(generated, py_name(program.root))
    trainable = _trainable_class(root, program)
    with torch.device("meta"):
        module = trainable()
    # Copies, so training never writes into a memory-mapped checkpoint or a tensor the
    # inference runtime shares; a tied param (the MLM decoder) stays one tensor.
    copies: dict[int, Any] = {}
    state = {}
    for name, tensor in source.ctx.tensors("pt").items():
        state[torch_param_name(name)] = copies.setdefault(id(tensor), tensor.detach().clone())
    module.load_state_dict(state, strict=True, assign=True)
    for param in module.parameters():
        param.requires_grad_(True)
    module.linnet_source = source
    module.linnet_validators = {name: InputValidator(program, e) for name, e in program.entries.items()}
    return module.eval()


def _trainable_class(root: type, program: ir.Program) -> type:
    """A subclass of the generated root module whose entry methods take keywords and
    transformers' aliases, check the inputs like `model(...)` does, and keep autograd."""
    from ..backends.pysource import py_name

    methods = {py_name(name): _entry_method(root, name, py_name(name)) for name in program.entries}
    methods["__doc__"] = (f"{root.__doc__}\n\nTrainable (linnet.nest.training): params named by Linnet param path; "
                          f"entries: {', '.join(program.entries)}.")
    return type(f"Trainable{root.__name__}", (root,), methods)


def _entry_method(root: type, entry: str, attribute: str):
    generated = getattr(root, attribute)

    def run(self, *args, **kwargs):
        if self.__dict__.get("_linnet_inside"):  # an entry calling another: already checked
            return generated(self, *args, **kwargs)
        inputs = _torch_inputs(self, entry, args, kwargs)
        self.__dict__["_linnet_inside"] = True
        try:
            return generated(self, *inputs)
        finally:
            self.__dict__["_linnet_inside"] = False

    run.__name__ = attribute
    run.__doc__ = f"The `{entry}` entry; inputs as torch tensors (or anything numpy reads), by position or name."
    return run


def _torch_inputs(module, entry: str, args: tuple, kwargs: dict) -> list:
    """The entry's inputs as torch tensors on the module's device, in signature order.

    They are checked as `model(...)` checks them (ranks, dims, id ranges, finite floats) on
    a numpy view, and left-out inputs filled from their defaults; a float tensor the caller
    gave is passed on itself (cast if need be), so gradients reach it too."""
    import torch

    validator = module.linnet_validators[entry]
    given = validator.bind(args, kwargs)
    checked, _ = validator.validate(given)
    device = next(module.parameters()).device
    tensors = []
    for (name, t), array in zip(validator.entry.inputs, checked):
        value = given.get(name)
        if isinstance(value, torch.Tensor) and value.is_floating_point():
            tensors.append(value.to(device=device, dtype=dtypes.by_name(t.dtype).torch_type()))
        elif array is None:  # left out, with a computed default: the generated method computes it
            tensors.append(None)
        else:
            tensors.append(torch.from_numpy(array).to(device))
    return tensors


# --------------------------------------------------------------------------- JAX


def jax_params(model) -> dict:
    """The checkpoint as `{Linnet param path: jax.Array}` (the unoptimised program's params;
    a tied param once)."""
    return dict(training_source(model).ctx.tensors("flax"))


def jax_function(model, entry: str | None = None):
    """`f(params, *inputs, key=None)`: `entry` (default the root entry) as a pure function of a
    `jax_params()`-shaped dict and the inputs (jnp arrays by position, in the entry's order).
    `key`: a PRNG key for dropout (train mode); None is eval mode.  jit- and grad-able."""
    from ..backends.jax_runtime import generated_source
    from ..backends.jax_source import params_tree
    from ..backends.pysource import import_generated

    source = training_source(model)
    program = source.program
    entry = entry or model.manifest.source.entry
    if entry not in program.entries:
        raise error(codes.UNKNOWN_MODEL_ENTRY, f"{model.manifest.name} has no entry `{entry}`; "
                                               f"entries: {', '.join(program.entries)}")
    path = generated_source(source.ctx)
    generated = import_generated(path, f"linnet_generated_jax_{path.stem.replace('-', '_')}")
    function = generated.ENTRIES[entry]
    drops = "rng" in inspect.signature(function).parameters

    def pure(params: Mapping[str, Any], *inputs, key=None):
        tree = params_tree(program, params)
        if drops and key is not None:
            return function(tree, *inputs, rng=generated._linnet_keys(key))
        return function(tree, *inputs)

    pure.__name__ = entry
    pure.__doc__ = f"{model.manifest.name}.{entry}(params, {', '.join(n for n, _ in program.entries[entry].inputs)}, key=None)"
    return pure


# --------------------------------------------------------------------------- saving


def save(model_or_module, folder: str | Path, *, params: Mapping[str, Any] | None = None) -> Path:
    """Write the params to `folder/model.safetensors` under the checkpoint's own keys, plus the
    config and tokenizer files beside the checkpoint; returns the file written.

    model_or_module: a `torch_module()` (its current, trained params; also one wrapped by
    `torch.compile`), or a loaded `Model`
    (its checkpoint's params, or `params=`, e.g. trained `jax_params()`, by param path)."""
    source, tensors = _params_to_save(getattr(model_or_module, "_orig_mod", model_or_module), params)
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    written = _checkpoint_tensors(source, tensors)
    from safetensors.numpy import save_file

    # A key filed under a folder (a sentence-transformers module's, "2_Dense/linear.weight",
    # see weights.read_index) goes back to that folder's own checkpoint file.
    by_file: dict[str, dict[str, np.ndarray]] = defaultdict(dict)
    for key, array in written.items():
        space, _, stored = key.rpartition("/")
        by_file[space][stored] = array
    _copy_beside(source.files, folder)
    for space, tensors in sorted(by_file.items()):
        target = folder / space / CHECKPOINT_NAME if space else folder / CHECKPOINT_NAME
        target.parent.mkdir(parents=True, exist_ok=True)
        # Written beside and renamed: a reader never sees half a file, and saving over the
        # checkpoint the model was read from does not truncate it while it is still mapped.
        partial = target.with_name(f".{CHECKPOINT_NAME}.partial")
        save_file(tensors, str(partial), metadata={"format": "pt"})
        os.replace(partial, target)
    return folder / CHECKPOINT_NAME


def _params_to_save(thing, params) -> tuple[TrainingSource, dict[str, np.ndarray]]:
    from . import Model

    if getattr(thing, "linnet_source", None) is not None:  # a torch_module()
        if params is not None:
            raise error(codes.CANNOT_SAVE, "nest.save(module, params=...): a trainable module saves its own "
                                           "params; pass params= with a loaded Model")
        source = thing.linnet_source
        from ..backends.torch_runtime import torch_param_name

        state = thing.state_dict()
        return source, {path: _to_numpy(state[torch_param_name(path)]) for path, _ in source.program.param_paths()}
    if isinstance(thing, Model):
        source = training_source(thing)
        paths = [path for path, _ in source.program.param_paths()]
        if params is None:
            loaded = source.ctx.tensors("numpy")
            return source, {path: np.asarray(loaded[path]) for path in paths}
        missing = [p for p in paths if p not in params]
        unknown = sorted(set(params) - set(paths))
        if missing or unknown:
            raise error(codes.CANNOT_SAVE, f"nest.save(params=...): the dict must hold every param of "
                                           f"{thing.manifest.name} by path, as jax_params() returns them",
                        None, *([Note(f"missing: {', '.join(missing[:5])}")] if missing else []),
                        *([Note(f"not params of the model: {', '.join(unknown[:5])}")] if unknown else []))
        return source, {path: _to_numpy(params[path]) for path in paths}
    raise error(codes.CANNOT_SAVE, f"nest.save takes a loaded Model or a module from model.torch_module(), "
                                   f"found {type(thing).__name__}")


def _to_numpy(value) -> np.ndarray:
    if hasattr(value, "detach"):
        value = value.detach().cpu()
        if str(value.dtype) == "torch.bfloat16":  # numpy has no bf16: kept exactly in f32
            value = value.float()
        value = value.numpy()
    return np.ascontiguousarray(np.asarray(value))


def _checkpoint_tensors(source: TrainingSource, tensors: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Checkpoint key -> array: each param under the key it was read from (so the source's
    `gamma`/`beta` or `weight`/`bias` spelling and `bert.` prefix stay), a param tied to
    several keys' worth of params written once, and the checkpoint's unbound tensors copied:
    unchanged, or, where one held the same bytes as a bound tensor (a stored copy of a tied
    weight, such as an untied-on-disk MLM decoder), as that param's new value."""
    bound = source.report.bound
    written: dict[str, np.ndarray] = {}
    for path, array in tensors.items():
        key = bound[path].key
        if key not in written:
            written[key] = array
    unbound = _unbound(source)
    copies = _tied_copies(source, unbound)
    for key, info in unbound.items():
        if key in copies:
            written[key] = tensors[copies[key]]
        else:
            written[key] = _read(info)
    return written


def _unbound(source: TrainingSource) -> dict:
    from .weights import read_index

    index = read_index(source.files, source.names)
    return {key: index[key] for key in source.report.unused_keys}


def _tied_copies(source: TrainingSource, unbound: dict) -> dict[str, str]:
    """Unbound checkpoint key -> the param whose stored tensor it equals byte for byte."""
    copies = {}
    for path, info in source.report.bound.items():
        for key, other in unbound.items():
            if key not in copies and (other.shape, other.dtype) == (info.shape, info.dtype) and info.is_float:
                if np.array_equal(_read(other), _read(info)):
                    copies[key] = path
    return copies


def _read(info) -> np.ndarray:
    from safetensors import safe_open

    with safe_open(str(info.file), framework="numpy") as handle:
        return handle.get_tensor(info.file_key)


def _copy_beside(files: list[Path], folder: Path) -> None:
    if not files:
        return
    beside = Path(files[0]).parent
    if beside.resolve() == folder.resolve():
        return
    for name in BESIDE_FILES:
        if (beside / name).is_file():
            shutil.copyfile(beside / name, folder / name)
    for name in BESIDE_FOLDERS:
        if (beside / name).is_dir():
            shutil.copytree(beside / name, folder / name, dirs_exist_ok=True)
    _copy_module_settings(beside, folder)


def _copy_module_settings(beside: Path, folder: Path) -> None:
    """Every folder a sentence-transformers `modules.json` lists, without its weights (which
    `save` writes): the Pooling, Dense and Normalize settings, so the saved folder is the
    same pipeline for sentence-transformers and for `nest.load(folder)`."""
    try:
        modules = json.loads((beside / "modules.json").read_text(encoding="utf-8"))
        paths = [m["path"].strip("/") for m in modules if isinstance(m, dict) and isinstance(m.get("path"), str)]
    except (OSError, ValueError, TypeError, KeyError):
        return
    for path in paths:
        if not path or ".." in Path(path).parts or not (beside / path).is_dir():
            continue
        (folder / path).mkdir(parents=True, exist_ok=True)
        for file in (beside / path).iterdir():
            if file.is_file() and file.suffix not in (".safetensors", ".bin"):
                shutil.copyfile(file, folder / path / file.name)
