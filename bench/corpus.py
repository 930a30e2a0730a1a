"""The corpus workload's texts: paragraphs of the Python standard library's docstrings.

Real English prose that every machine with Python has offline, in lengths from a short line
to a long paragraph (the spread a user's corpus has).  The paragraphs are those of the
docstrings (`inspect.getdoc`) of the modules in `MODULES`, of their public members and of
the public members of their public classes, split on blank lines, whitespace collapsed,
kept when 20 to 1000 characters long, first occurrence only.  `corpus(size, seed)` draws a
seeded sample of them.  What the sample holds depends on the Python version (docstrings
change between releases), so the workload records the version and a digest of the texts.
"""
from __future__ import annotations

import functools
import hashlib
import importlib
import inspect
import json
import platform
import re
import subprocess
import sys
import warnings

# numpy is imported inside the functions that use it: this file also runs as a script under
# `python -I -S` (`stdlib_paragraphs`), where only the standard library can be imported.

#: The modules whose docstrings make the corpus, in this order (importing them has no side
#: effects beyond the import).
MODULES = (
    "os re json collections itertools functools pathlib typing inspect argparse logging subprocess "
    "threading asyncio email.message http.client urllib.parse datetime decimal fractions statistics "
    "random string textwrap shutil tarfile zipfile csv sqlite3 unittest difflib heapq bisect contextlib "
    "dataclasses enum abc io socket ssl xml.etree.ElementTree html.parser pickle copy pprint calendar "
    "hashlib secrets uuid base64 struct codecs locale gettext configparser tempfile glob fnmatch "
    "traceback warnings weakref types operator numbers math array queue sched selectors signal "
    "multiprocessing concurrent.futures optparse shlex tokenize ast dis pdb timeit tracemalloc zlib "
    "gzip bz2 lzma"
).split()

MIN_CHARS, MAX_CHARS = 20, 1000


def _documented(module) -> list:
    """The module, its public members, and the public members of its public classes."""
    objects = [module] + [v for k, v in sorted(vars(module).items()) if not k.startswith("_")]
    for obj in list(objects):
        if inspect.isclass(obj):
            objects += [v for k, v in sorted(vars(obj).items()) if not k.startswith("_")]
    return objects


@functools.lru_cache(maxsize=1)
def stdlib_paragraphs() -> list[str]:
    """Every distinct docstring paragraph of `MODULES`, in a fixed order, read by a fresh
    interpreter that can load the standard library only (`-I -S`): a process that has
    imported torch has a patched `inspect.getfile` without its docstring, so reading them here
    would make the texts depend on what was imported before."""
    found = subprocess.run([sys.executable, "-I", "-S", __file__], capture_output=True, text=True, check=True)
    return json.loads(found.stdout)


def _paragraphs_here() -> list[str]:
    """`stdlib_paragraphs`, read in this process."""
    seen: set[str] = set()
    paragraphs: list[str] = []
    for name in MODULES:
        for obj in _documented(importlib.import_module(name)):
            try:
                with warnings.catch_warnings():  # typing.io and typing.re warn when touched
                    warnings.simplefilter("ignore", DeprecationWarning)
                    doc = inspect.getdoc(obj)
            except Exception:  # noqa: BLE001 - an odd descriptor without a readable docstring
                doc = None
            for paragraph in re.split(r"\n\s*\n", doc or ""):
                text = " ".join(paragraph.split())
                if MIN_CHARS <= len(text) <= MAX_CHARS and text not in seen:
                    seen.add(text)
                    paragraphs.append(text)
    return paragraphs


def corpus(size: int, seed: int = 0) -> list[str]:
    """`size` paragraphs drawn without replacement (seeded); all of them when there are fewer."""
    paragraphs = stdlib_paragraphs()
    if size >= len(paragraphs):
        return list(paragraphs)  # a copy: the cached list stays as read
    import numpy as np

    picked = np.random.default_rng(seed).choice(len(paragraphs), size=size, replace=False)
    return [paragraphs[i] for i in sorted(picked)]


def describe(texts: list[str]) -> dict:
    """What the workload records about its texts."""
    import numpy as np

    lengths = [len(t) for t in texts]
    digest = hashlib.sha256("\n".join(texts).encode()).hexdigest()[:16]
    return {"texts": len(texts), "python": platform.python_version(), "sha256_16": digest,
            "mean_chars": round(float(np.mean(lengths)), 1) if texts else 0, "max_chars": max(lengths, default=0),
            "source": f"paragraphs of the docstrings of {len(MODULES)} standard-library modules (bench/corpus.py)"}


if __name__ == "__main__":  # what `stdlib_paragraphs` runs, in a fresh `python -I -S`
    print(json.dumps(_paragraphs_here()))
