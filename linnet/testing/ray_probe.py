"""An `Embedder` that notes each model load (the process id, one line a load) in a file, so a
test can tell that every Ray actor loaded its model once and only once.  It lives in the
package because Ray's workers import it by name."""
from __future__ import annotations

import os

from ..nest.ray import Embedder


class CountingEmbedder(Embedder):
    def __init__(self, *args, load_log: str, **kwargs):
        super().__init__(*args, **kwargs)
        with open(load_log, "a", encoding="utf-8") as log:
            log.write(f"{os.getpid()}\n")
