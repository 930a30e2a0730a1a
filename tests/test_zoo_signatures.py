"""Every zoo entry's signatures, as `linnet check --format json` prints them, pinned.

Users call these entries by name and export them to Triton, so a signature that changes or an
entry that disappears breaks them: the test fails on either, naming the entry. An entry added
since the file was written fails too, until it is pinned. After a deliberate change, rewrite
the file with

    LINNET_UPDATE_GOLDEN=1 python -m pytest tests/test_zoo_signatures.py

and review `git diff tests/golden/signatures.json`.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from linnet.cli import _check_one
from linnet.paths import zoo_dir

REPO = Path(__file__).resolve().parent.parent
GOLDEN = REPO / "tests" / "golden" / "signatures.json"
UPDATE = os.environ.get("LINNET_UPDATE_GOLDEN") == "1"
ENTRIES = sorted(p.parent.name for p in zoo_dir().glob("*/nest.toml"))


def _signatures(entry: str) -> dict[str, str]:
    report, _ = _check_one(str(zoo_dir() / entry), {})
    return {name: e["signature"] for name, e in report["entries"].items()}


@pytest.fixture(scope="module")
def pinned() -> dict:
    if UPDATE:
        GOLDEN.write_text(json.dumps({e: _signatures(e) for e in ENTRIES}, indent=1, sort_keys=True) + "\n")
    assert GOLDEN.is_file(), f"{GOLDEN.relative_to(REPO)} is missing; rerun with LINNET_UPDATE_GOLDEN=1"
    return json.loads(GOLDEN.read_text())


def test_the_file_pins_every_zoo_entry(pinned):
    assert len(ENTRIES) >= 14, ENTRIES
    assert sorted(pinned) == ENTRIES, "zoo entries added or removed since the signatures were pinned"


@pytest.mark.parametrize("entry", ENTRIES)
def test_signatures_stay(entry, pinned):
    now, before = _signatures(entry), pinned.get(entry, {})
    changed = {n: (before[n], now[n]) for n in before if n in now and now[n] != before[n]}
    assert not changed, f"{entry}: signatures changed (old, new): {changed}"
    assert not set(before) - set(now), f"{entry}: entries removed: {sorted(set(before) - set(now))}"
    assert not set(now) - set(before), f"{entry}: new entries not pinned yet: {sorted(set(now) - set(before))}"
