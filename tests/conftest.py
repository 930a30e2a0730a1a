"""Test session setup: a private, empty, offline Hugging Face cache, and checkpoint fixtures.

The environment is set at import time, before anything imports huggingface_hub, because
huggingface_hub reads HF_HOME and HF_HUB_OFFLINE once, when it is first imported. Tests thus
never read or write the user's cache and never reach the network; the checkpoints they need
are placed into the fresh cache by `fixtures.checkpoints`.
"""
import os
import shutil
import sys
import tempfile

if "huggingface_hub" in sys.modules:
    raise RuntimeError("huggingface_hub was imported before tests/conftest.py could point it at a "
                       "private offline cache; the tests would touch the real cache")

_HF_HOME = tempfile.mkdtemp(prefix="linnet-hf-")
os.environ["HF_HOME"] = _HF_HOME
# Variables that would override paths derived from HF_HOME.
for _override in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "TRANSFORMERS_CACHE", "HF_ASSETS_CACHE",
                  "HF_XET_CACHE", "SENTENCE_TRANSFORMERS_HOME"):
    os.environ.pop(_override, None)
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
os.environ["HF_HUB_DISABLE_TELEMETRY"] = "1"
# `linnet.middle.optimize` runs `ir.verify` after every pass, so a pass that breaks the IR is named.
os.environ["LINNET_VERIFY_PASSES"] = "1"
# Loads that do not pass `kernels=` use the default kernels and sessions instead of measuring
# the machine's fastest ones. The measurement runs once per distinct model, and the suite
# loads hundreds of distinct small models: it cost each a few seconds (about 40% of
# tests/test_modernbert.py's time). It only ever picks a candidate within 1e-5 of the
# default's output, and the modules that test it (and the loads users get) ask for it with
# the `measured_kernels` fixture below.
os.environ.setdefault("LINNET_KERNELS", "default")

from pathlib import Path  # noqa: E402

import pytest  # noqa: E402

# `fixtures` is imported by its own name, whether or not tests/ itself becomes a package.
sys.path.insert(0, str(Path(__file__).resolve().parent))

from fixtures.checkpoints import (  # noqa: E402
    SyntheticCheckpoint,
    install_minilm,
    write_synthetic_bert_base,
)


def pytest_sessionfinish(session, exitstatus):
    shutil.rmtree(_HF_HOME, ignore_errors=True)


#: Seconds spent per test file (setup, call and teardown together), for the summary below.
_FILE_SECONDS: dict[str, float] = {}


def pytest_runtest_logreport(report):
    path = report.nodeid.split("::", 1)[0]
    _FILE_SECONDS[path] = _FILE_SECONDS.get(path, 0.0) + report.duration


def pytest_terminal_summary(terminalreporter):
    """The 20 test files that took longest: where a CI run near its time budget can save."""
    if not _FILE_SECONDS:
        return
    total = sum(_FILE_SECONDS.values())
    terminalreporter.section("slowest 20 test files")
    for path, spent in sorted(_FILE_SECONDS.items(), key=lambda kv: -kv[1])[:20]:
        terminalreporter.write_line(f"{spent:8.1f}s {100 * spent / total:5.1f}%  {path}")


@pytest.fixture(scope="session")
def hf_cache() -> Path:
    """The hub cache huggingface_hub uses in this session: `$HF_HOME/hub`."""
    from huggingface_hub import constants

    hub = Path(_HF_HOME) / "hub"
    assert Path(constants.HF_HUB_CACHE) == hub, "huggingface_hub is not using the test cache"
    hub.mkdir(parents=True, exist_ok=True)
    return hub


@pytest.fixture(scope="session")
def bert_base_checkpoint(hf_cache) -> SyntheticCheckpoint:
    """A full-size random bert-base-uncased checkpoint at the zoo's pinned revision (~440 MB)."""
    return write_synthetic_bert_base(hf_cache)


@pytest.fixture(scope="session")
def minilm_checkpoint(hf_cache) -> Path:
    """The real all-MiniLM-L6-v2 files at the zoo's pinned revision; the snapshot folder."""
    return install_minilm(hf_cache)


def _transformers_bert(repo: str, revision: str):
    import torch
    from transformers import BertModel

    # transformers' default attention (SDPA), as users get it from from_pretrained.
    model = BertModel.from_pretrained(repo, revision=revision, dtype=torch.float32)
    return model.eval()


@pytest.fixture(scope="session", autouse=True)
def linnet_cache(tmp_path_factory):
    """Generated sources go to a private cache, never to the user's ~/.cache/linnet."""
    path = tmp_path_factory.mktemp("linnet-cache")
    previous = os.environ.get("LINNET_CACHE")
    os.environ["LINNET_CACHE"] = str(path)
    yield path
    if previous is None:
        os.environ.pop("LINNET_CACHE", None)
    else:
        os.environ["LINNET_CACHE"] = previous


@pytest.fixture(scope="module")
def measured_kernels():
    """Loads in the module measure kernels and session options as a user's default load does
    (`kernels="auto"`), instead of the suite's `LINNET_KERNELS=default`. A module asks for it
    with `pytestmark = pytest.mark.usefixtures("measured_kernels")`, which pytest sets up
    before the module's other module-scoped fixtures (and so before their loads).

    The probes also see a quiet machine: a choice timed while other processes share the CPU is
    not cached (`DecisionCache.record`), and these modules test what is measured and cached,
    which must not hang on whatever else runs beside the suite (that guard has tests of its own)."""
    from linnet.contention import Contention, ContentionMeter

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("LINNET_KERNELS", "auto")
        patch.setattr(ContentionMeter, "stop", lambda self: Contention(0.0, 1.0, os.cpu_count() or 1))
        yield


@pytest.fixture(scope="session")
def transformers_bert_base(bert_base_checkpoint):
    """transformers' BertModel on the synthetic checkpoint, read from the test cache."""
    return _transformers_bert(bert_base_checkpoint.repo, bert_base_checkpoint.revision)


@pytest.fixture(scope="session")
def transformers_minilm(minilm_checkpoint):
    """transformers' BertModel on the real all-MiniLM-L6-v2 weights, read from the test cache."""
    from fixtures.checkpoints import MINILM_REPO, MINILM_REVISION

    return _transformers_bert(MINILM_REPO, MINILM_REVISION)


@pytest.fixture(scope="session")
def smollm2_reference():
    """transformers' answers for the real SmolLM2-135M-Instruct GGUF (tests/fixtures/smollm2.py),
    computed once for the session: its model is loaded once and dropped."""
    from fixtures.smollm2 import compute
    from linnet.testing.smollm2 import gguf_path

    return compute(gguf_path())
