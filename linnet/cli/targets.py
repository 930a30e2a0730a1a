"""What a path or name given on the command line means: a zoo entry, a package or a file.

`linnet check`, `linnet build` and `linnet export-triton` take any of the three; this turns
the argument into a `compiler.Target`.  It lives with the command line, not the compiler,
because a zoo entry's name is looked up in the zoo (`linnet.nest`), which itself compiles
through `compiler`: the compiler stays free of the zoo.
"""
from __future__ import annotations

from pathlib import Path

from .. import codes
from ..compiler import Target
from ..diagnostics import error
from ..nest.manifest import load_manifest
from ..paths import zoo_dir


def locate(path_or_name: str | Path) -> Target:
    if is_saved_model(path_or_name):  # built from its files, as nest.load builds it
        from ..nest.hf import folder_manifest, hf_manifest

        text = str(path_or_name)
        manifest = hf_manifest(text) if text.startswith("hf:") else folder_manifest(text)
        return Target("entry", manifest.dir, manifest)
    path = Path(path_or_name)
    if path.is_file() and path.suffix == ".linnet":
        return Target("file", path)
    if path.is_dir() and (path / "linnet.toml").is_file() and not (path / "nest.toml").is_file():
        return Target("package", path)
    # What is clearly meant as a file or a folder gets a message about that file or folder,
    # not "no zoo entry named 'src/model.linnet'".
    if path.suffix == ".linnet" and not path.exists():
        raise error(codes.BAD_TARGET_PATH, f"no such file: {path}")
    if path.is_file():
        raise error(codes.BAD_TARGET_PATH, f"{path} is not a Linnet source file (expected a .linnet file, a package "
                                           "folder with linnet.toml, or a zoo entry)")
    if path.is_dir() and not (path / "nest.toml").is_file() and not _is_zoo_name(str(path_or_name)):
        raise error(codes.BAD_TARGET_PATH,
                    f"folder {path} is neither a package (no linnet.toml) nor a zoo entry (no nest.toml)")
    manifest = load_manifest(path_or_name)
    return Target("entry", manifest.dir, manifest)


def is_saved_model(path_or_name: str | Path) -> bool:
    """An `hf:owner/name` repo or a folder transformers / sentence-transformers saved: what
    `nest.load` reads from the model's own files rather than a nest.toml."""
    from ..nest.hf import PREFIX
    from ..nest.manifest import is_model_folder

    return str(path_or_name).startswith(PREFIX) or is_model_folder(path_or_name)


def load_name(path_or_name: str | Path, target: Target) -> str | Path:
    """What `nest.prepare` takes for a located entry: a saved model by its own name (so a
    folder is its own checkpoint), a zoo entry by its folder."""
    return str(path_or_name) if is_saved_model(path_or_name) else target.path


def _is_zoo_name(text: str) -> bool:
    """A bare name of a zoo entry (a local folder of the same name does not shadow it)."""
    if not text or "/" in text or "\\" in text or text in (".", ".."):
        return False
    try:
        return (zoo_dir() / text / "nest.toml").is_file()
    except FileNotFoundError:
        return False
