"""The README's main job, `linnet quickstart`, and `linnet build`, run in-process."""
from __future__ import annotations

import re

from linnet.cli import main


def test_quickstart_checks_the_zoo_and_ranks_similar_sentences_higher(capsys):
    assert main(["quickstart"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"ok\s+bert-base-uncased\s+110,106,428 params", out)
    assert re.search(r"ok\s+all-minilm-l6-v2\s+22,713,216 params", out)
    rows = [[float(x) for x in re.findall(r"-?\d\.\d\d", line.split("]", 1)[1])[:4]]
            for line in out.splitlines() if re.match(r"\s+\[\d\]", line)]
    assert len(rows) == 4 and all(abs(rows[i][i] - 1.0) < 0.01 for i in range(4))
    # cat/kitten and the two finance sentences are closer than cat/finance
    assert rows[0][1] > rows[0][2] + 0.3 and rows[2][3] > rows[1][3] + 0.3


def test_build_writes_readable_torch_source(tmp_path, capsys):
    assert main(["build", "bert-base-uncased", "--backend", "torch", "-o", str(tmp_path)]) == 0
    source = (tmp_path / "model.py").read_text()
    compile(source, "model.py", "exec")  # valid Python
    for expected in ("class Model(nn.Module):", "class EncoderLayer(nn.Module):", "def split_heads(x):",
                     "F.scaled_dot_product_attention", "lib.linnet:"):
        assert expected in source
