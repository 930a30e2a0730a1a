"""The session opened at load, from ORT's optimised graph with its weights already pre-packed.

Opening a session on ONNX Runtime's CPU provider optimises the graph and then pre-packs every
constant MatMul/Gemm weight into MLAS's panel layout.  On bert-base that packing is most of the
0.37-0.43 s a session takes to open, and most of a warm load (docs/bench.md, "Time to a first
result").  ORT can write both results out (`optimized_model_filepath` with
`session.save_external_prepacked_constant_initializers`): a session opened on that file with
graph optimisation off reads the packed weights instead of packing them again, and computes
the same bits as one that packed them (tests/test_onnx_prepacked.py checks it).

The saved graph belongs to one machine and one ORT: MLAS picks its panel layout by the CPU's
instruction set, and ORT warns that an "all"-level graph may hold hardware-specific nodes.
So it is keyed by the CPU (model and flags), onnxruntime's version and the session settings,
and kept under `$LINNET_CACHE/onnx-prepacked/`, one folder per export and key.  It costs disk:
about the weights' size twice (ORT writes the plain initializers and the packed ones; 775 MB
for bert-base), which is why only the session a load opens is saved, and only for models
whose weights reach `MIN_WEIGHT_BYTES` (below that, packing takes a few milliseconds).

Anything that goes wrong here (an ORT without the option, a full disk, a damaged saved file)
is logged and the session is opened as before: this is a shortcut, never a different answer.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
from pathlib import Path

from .measured import cpu_flags, cpu_model
from .onnx_files import WEIGHTS_FILE

log = logging.getLogger("linnet.onnx")

#: Weights (the export's weights files) below this are packed at each load: it takes
#: milliseconds, and a saved copy would only cost disk.
MIN_WEIGHT_BYTES = 64 << 20
#: The saved graph's weights file, beside it in the key's folder.
DATA_FILE = "prepacked.bin"
#: Written last: a folder without it is an interrupted save, never read.
COMPLETE = "complete"


def worth_saving(folder: Path) -> bool:
    """Whether the export's weights are large enough for their packing to matter."""
    return sum(p.stat().st_size for p in folder.glob(WEIGHTS_FILE + "*")) >= MIN_WEIGHT_BYTES


def saved_folder(cache: Path, folder: Path, file: str, settings: dict) -> Path:
    """Where the optimised, pre-packed copy of `folder/file` lives for this machine and ORT."""
    import onnxruntime as ort

    key = json.dumps({"cpu": cpu_model(), "flags": cpu_flags(), "onnxruntime": ort.__version__,
                      "settings": settings, "file": file}, sort_keys=True)
    digest = hashlib.sha256(key.encode()).hexdigest()[:24]
    return cache / "onnx-prepacked" / folder.name / f"{Path(file).stem}-{digest}"


def open_session(source: Path, saved: Path, options_for, providers: list):
    """A session on `source`: from its saved pre-packed copy in `saved` when there is one
    (returned with "loaded"), else opened on `source` while ORT saves that copy ("saved").
    options_for(graph_optimization=bool) gives the session options.  (None, reason) when
    neither worked out, so the caller opens its session as before."""
    import onnxruntime as ort

    if (saved / COMPLETE).exists():
        options = options_for(graph_optimization=False)  # already optimised, as saved
        try:
            return ort.InferenceSession(str(saved / source.name), sess_options=options,
                                        providers=providers), "loaded"
        except Exception as error:  # noqa: BLE001 - a damaged copy: drop it, save it again
            log.warning("the saved pre-packed graph %s could not be opened (%s); saving it again",
                        saved, str(error).splitlines()[0] if str(error) else type(error).__name__)
            shutil.rmtree(saved, ignore_errors=True)
    return _open_and_save(source, saved, options_for, providers)


def _open_and_save(source: Path, saved: Path, options_for, providers: list):
    import onnxruntime as ort

    partial = saved.with_name(f"{saved.name}.partial-{os.getpid()}")
    shutil.rmtree(partial, ignore_errors=True)
    options = options_for(graph_optimization=True)
    options.optimized_model_filepath = str(partial / source.name)
    options.add_session_config_entry("session.optimized_model_external_initializers_file_name", DATA_FILE)
    options.add_session_config_entry("session.optimized_model_external_initializers_min_size_in_bytes", "1024")
    options.add_session_config_entry("session.save_external_prepacked_constant_initializers", "1")
    # ORT warns on every such save that an "all"-level graph is machine-specific; the key says so.
    options.log_severity_level = 3
    try:
        partial.mkdir(parents=True, exist_ok=True)
        session = ort.InferenceSession(str(source), sess_options=options, providers=providers)
        (partial / COMPLETE).write_text("")
    except Exception as error:  # noqa: BLE001 - no copy saved; the caller opens the session as before
        log.warning("could not save ONNX Runtime's pre-packed graph of %s (%s); loads will pack it",
                    source, str(error).splitlines()[0] if str(error) else type(error).__name__)
        shutil.rmtree(partial, ignore_errors=True)
        return None, "not saved"
    try:
        partial.rename(saved)
    except OSError:  # another process saved it first: theirs is the same graph
        shutil.rmtree(partial, ignore_errors=True)
    return session, "saved"

