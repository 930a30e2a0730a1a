"""What the zoo holds: `nest.list()` and `linnet zoo`, plus the BERT key map variants are bound with.

    from linnet import nest
    for entry in nest.list():
        print(entry.name, entry.params, entry.weights_cached)

Each row comes from the entry's manifest and from its compiled root block: the parameter
count is what instantiating the manifest's generics declares, not a number copied into a
manifest where it could drift.  Compiling an entry takes a fraction of a second, so the
counts are remembered in `$LINNET_CACHE/zoo/`, keyed by the same digest as the compile
cache (the Linnet sources, the manifest and the compiler); a listing after the first is
cheap.  Nothing is downloaded: "cached" only asks the Hugging Face cache whether every
checkpoint file of the pinned revision is already there.

`bert_bindings` gives the bindings of a BERT-family entry as a dict (for an entry written
with a bindings.json of its own, as tests do): the Linnet param paths of
`nest/bert-base-uncased/src/lib.linnet` mapped to Hugging Face checkpoint keys by the BERT
layout, which the zoo's entries name in nest.toml (docs/zoo.md) and `hf:` loading uses.
"""
from __future__ import annotations

import json
import logging
import os
from dataclasses import asdict, dataclass
from pathlib import Path

from .. import dtypes
from ..diagnostics import LinnetError
from .layouts import BERT, LayoutBindings
from .manifest import Manifest, known_entries, load_manifest

log = logging.getLogger("linnet.nest")


@dataclass(frozen=True)
class ZooEntry:
    """One row of the zoo listing.

    `params` counts parameter values (elements) of the root block at the manifest's
    generics; tied weights count once, since they are one param.  `size_bytes` is what
    those values take at their declared dtypes.  `weights_cached` is None for an entry
    without [weights].  `problem` is set, and the sizes are None, when the entry does not
    load or compile; the rest of the zoo is still listed.
    """

    name: str
    title: str
    family: str
    license: str
    tags: tuple[str, ...]
    root: str | None
    params: int | None
    param_tensors: int | None
    size_bytes: int | None
    weights_repo: str | None
    weights_revision: str | None
    weights_cached: bool | None
    problem: str | None = None

    def to_json(self) -> dict:
        row = asdict(self)
        row["tags"] = list(self.tags)
        return row


def list_zoo(folder: Path | None = None) -> list[ZooEntry]:
    """Every zoo entry (a folder with a nest.toml), sorted by name; `nest.list()`."""
    entries = known_entries(folder)
    base = Path(folder) if folder is not None else None
    return [_describe(base / name if base is not None else name) for name in entries]


def _describe(name_or_path: str | Path) -> ZooEntry:
    try:
        manifest = load_manifest(name_or_path)
    except LinnetError as exc:
        return ZooEntry(Path(name_or_path).name, "", "", "", (), None, None, None, None, None, None, None,
                        problem=_first_line(exc))
    sizes, problem = _sizes(manifest), None
    if isinstance(sizes, str):
        sizes, problem = None, sizes
    weights = manifest.weights
    return ZooEntry(
        name=manifest.name, title=manifest.title, family=manifest.family, license=manifest.license,
        tags=manifest.tags, root=manifest.source.root,
        params=sizes["params"] if sizes else None,
        param_tensors=sizes["tensors"] if sizes else None,
        size_bytes=sizes["bytes"] if sizes else None,
        weights_repo=weights.repo if weights else None,
        weights_revision=weights.revision if weights else None,
        weights_cached=_weights_cached(manifest) if weights else None,
        problem=problem,
    )


def _first_line(exc: LinnetError) -> str:
    diagnostic = exc.diagnostics[0]
    return f"error[{diagnostic.code}]: {diagnostic.message.splitlines()[0]}"


# --------------------------------------------------------------------------- sizes


def _sizes(manifest: Manifest) -> dict[str, int] | str:
    """{"params", "tensors", "bytes"} of the entry's root block, or the compile error's first line."""
    from . import _compile_key
    from ..backends import cache_dir

    key = _compile_key(manifest, None, None, ())
    path = cache_dir() / "zoo" / f"{manifest.name}-{key}.json" if key is not None else None
    if path is not None and path.is_file():
        try:
            return json.loads(path.read_text())
        except (OSError, ValueError):
            log.debug("ignoring unreadable zoo size cache %s", path)
    try:
        sizes = _count_params(manifest)
    except LinnetError as exc:
        return _first_line(exc)
    if path is not None:
        _write_json(path, sizes)
    return sizes


def _count_params(manifest: Manifest) -> dict[str, int]:
    from ..compiler import Target, compile_target

    params = compile_target(Target("entry", manifest.dir, manifest)).instance.params
    values = sum(p.numel for p in params)
    size = sum(p.numel * dtypes.by_name(p.dtype).itemsize for p in params)
    return {"params": values, "tensors": len(params), "bytes": size}


def _write_json(path: Path, data: dict) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"{path.name}.tmp{os.getpid()}")
        tmp.write_text(json.dumps(data))
        os.replace(tmp, path)
    except OSError:
        log.debug("could not write the zoo size cache %s", path)


# --------------------------------------------------------------------------- local weights


def _weights_cached(manifest: Manifest) -> bool:
    """Whether every checkpoint file of the pinned revision is in the Hugging Face cache."""
    from huggingface_hub import try_to_load_from_cache

    spec = manifest.weights
    return all(isinstance(try_to_load_from_cache(spec.repo, name, revision=spec.revision), str)
               for name in spec.files)


# --------------------------------------------------------------------------- the listing as text


def format_table(entries: list[ZooEntry]) -> str:
    """The listing as aligned columns: what `linnet zoo` prints."""
    header = ("NAME", "TITLE", "PARAMS", "SIZE", "LICENSE", "WEIGHTS", "TAGS")
    rows = [header] + [_row(e) for e in entries]
    widths = [max(len(row[i]) for row in rows) for i in range(len(header) - 1)]
    lines = ["  ".join([*(cell.ljust(w) for cell, w in zip(row, widths)), row[-1]]).rstrip() for row in rows]
    return "\n".join(lines)


def _row(entry: ZooEntry) -> tuple[str, ...]:
    if entry.problem:
        return (entry.name, entry.title or "-", "?", "?", entry.license or "-", "-", entry.problem)
    cached = {True: "cached", False: "not cached", None: "none"}[entry.weights_cached]
    return (entry.name, entry.title, human_count(entry.params), human_bytes(entry.size_bytes),
            entry.license, cached, ", ".join(entry.tags))


def human_count(n: int | None) -> str:
    """110106428 -> "110.1M"."""
    if n is None:
        return "?"
    for scale, suffix in ((1e9, "B"), (1e6, "M"), (1e3, "K")):
        if n >= scale:
            return f"{n / scale:.1f}{suffix}"
    return str(n)


def human_bytes(n: int | None) -> str:
    """440425712 -> "440.4 MB" (decimal units, as the Hub shows file sizes)."""
    if n is None:
        return "?"
    for scale, suffix in ((1e9, "GB"), (1e6, "MB"), (1e3, "kB")):
        if n >= scale:
            return f"{n / scale:.1f} {suffix}"
    return f"{n} B"


# --------------------------------------------------------------------------- BERT bindings

def bert_bindings(param_names: list[str], *, prefix: str = "bert.", old_layer_norm: bool = True) -> dict[str, str]:
    """A bindings dict for a BERT-family entry: each param path -> its checkpoint key, in order.

    The mapping is the BERT layout (`linnet.nest.layouts.BERT`), the one zoo entries name in
    nest.toml and `hf:` loading binds with.  prefix: "bert." when the checkpoint's encoder
    keys carry it (BertFor* checkpoints), "" for bare BertModel ones.  old_layer_norm: write
    LayerNorms as `gamma`/`beta` (the original google-bert conversions) rather than
    `weight`/`bias`; binding accepts either anyway.
    """
    unmapped = [name for name in param_names if BERT.key(name, prefix) is None]
    if unmapped:
        raise ValueError(f"{unmapped[0]} is not a param path of the BERT package")
    spelling = "gamma/beta" if old_layer_norm else "weight/bias"
    return LayoutBindings(BERT.name, prefix, spelling).bindings(param_names)
