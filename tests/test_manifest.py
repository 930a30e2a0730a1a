"""nest.toml / linnet.toml parsing: the real zoo entries load, and each kind of mistake is
reported with the file and the field it is in."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from linnet.diagnostics import LinnetError
from linnet.nest.layouts import LayoutBindings
from linnet.nest.manifest import CODES, find_entry, known_entries, load_manifest
from linnet.paths import zoo_dir

BERT_REVISION = "86b5e0934494bd15c9632b12f734a8a67f723594"

VALID_NEST = """\
[model]
name = "tiny"
title = "Tiny"
summary = "A test entry."
license = "MIT"
family = "bert"
tags = ["test"]

[links]
huggingface = "https://huggingface.co/org/tiny"

[source]
path = "src/lib.linnet"
root = "Model"
entry = "forward"

[generics]
D = 8
T = "f32"

[check]
B = 1

[weights]
repo = "org/tiny"
revision = "0123456789abcdef0123456789abcdef01234567"
files = ["model.safetensors"]
bindings = "bindings.json"
sha256 = { "model.safetensors" = "%s" }
""" % ("ab" * 32)

VALID_LINNET = """\
[package]
name = "tiny"
version = "0.1.0"
language = "0.1"
"""


def write_entry(parent: Path, name: str = "tiny", nest: str = VALID_NEST,
                linnet: str | None = VALID_LINNET) -> Path:
    entry = parent / name
    entry.mkdir(parents=True)
    (entry / "nest.toml").write_text(nest)
    if linnet is not None:
        (entry / "linnet.toml").write_text(linnet)
    return entry


def load_error(entry: Path) -> LinnetError:
    with pytest.raises(LinnetError) as caught:
        load_manifest(entry)
    return caught.value


def only_diagnostic(entry: Path):
    err = load_error(entry)
    assert len(err.diagnostics) == 1, err.render()
    return err.diagnostics[0]


# --------------------------------------------------------------------------- the real zoo


def test_bert_base_manifest_loads():
    m = load_manifest("bert-base-uncased")
    assert m.dir == zoo_dir() / "bert-base-uncased"
    assert (m.name, m.family, m.license) == ("bert-base-uncased", "bert", "Apache-2.0")
    assert m.source.path == m.dir / "src" / "lib.linnet" and m.source.zoo is None
    assert (m.source.root, m.source.entry) == ("PreTraining", "forward")
    assert m.generics == {"Vocab": 30522, "MaxPositions": 512, "TypeVocab": 2, "D": 768,
                          "Heads": 12, "Inner": 3072, "Layers": 12, "T": "f32"}
    assert m.check == {"B": 1, "S": 8}
    assert m.weights.repo == "google-bert/bert-base-uncased"
    assert m.weights.revision == BERT_REVISION
    assert m.weights.files == ("model.safetensors",)
    assert m.weights.bindings == LayoutBindings("bert", "bert.", "gamma/beta")
    assert not (m.dir / "bindings.json").exists()  # the layout is the one copy of the mapping
    assert m.weights.sha256 == {}
    assert (m.package.name, m.package.version, m.package.language) == ("bert", "0.1.0", "0.1")
    assert m.source_dir() == m.dir and m.source_manifest() is m


def test_minilm_manifest_reuses_the_bert_source():
    m = load_manifest("all-minilm-l6-v2")
    assert m.source.zoo == "bert-base-uncased" and m.source.path is None
    assert m.generics["D"] == 384 and m.generics["Inner"] == 1536 and m.generics["Layers"] == 6
    assert m.weights.repo == "sentence-transformers/all-MiniLM-L6-v2"
    assert m.weights.revision == "1110a243fdf4706b3f48f1d95db1a4f5529b4d41"
    assert m.weights.bindings == LayoutBindings("bert", "", "weight/bias")
    assert m.weights.sha256 == {
        "model.safetensors": "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db"}
    bert = zoo_dir() / "bert-base-uncased"
    assert m.source_dir() == bert
    assert m.source_file() == bert / "src" / "lib.linnet"
    assert m.source_manifest().name == "bert-base-uncased"


def test_every_zoo_entry_loads_and_is_named_after_its_folder():
    names = known_entries()
    assert {"bert-base-uncased", "all-minilm-l6-v2"} <= set(names)
    for name in names:
        assert load_manifest(name).name == name


def test_codes_are_documented():
    assert all(re.fullmatch(r"E09\d\d", code) and meaning for code, meaning in CODES.items())


# --------------------------------------------------------------------------- finding entries


def test_find_entry_by_folder_and_by_name(tmp_path):
    entry = write_entry(tmp_path)
    assert find_entry(entry) == entry.resolve()
    assert find_entry(str(entry)) == entry.resolve()
    assert find_entry(entry / "nest.toml") == entry.resolve()
    assert find_entry("bert-base-uncased") == zoo_dir() / "bert-base-uncased"


def test_unknown_entry_lists_the_known_ones():
    with pytest.raises(LinnetError) as caught:
        find_entry("bert-base-uncasd")
    text = caught.value.render()
    assert caught.value.code == "E0901"
    assert "'bert-base-uncasd'" in text
    assert "did you mean 'bert-base-uncased'?" in text
    assert "all-minilm-l6-v2" in text and "bert-base-uncased" in text


def test_folder_without_nest_toml_is_not_an_entry(tmp_path):
    with pytest.raises(LinnetError, match="holds none of nest.toml, modules.json, config.json") as caught:
        find_entry(tmp_path)
    assert caught.value.code == "E1110"


# --------------------------------------------------------------------------- nest.toml mistakes


def test_the_valid_fixture_entry_loads(tmp_path):
    m = load_manifest(write_entry(tmp_path))
    assert m.generics == {"D": 8, "T": "f32"} and m.tags == ("test",)
    assert m.weights.sha256 == {"model.safetensors": "ab" * 32}


def test_branch_revision_is_rejected_at_its_line(tmp_path):
    bad = VALID_NEST.replace('revision = "0123456789abcdef0123456789abcdef01234567"',
                             'revision = "main"')
    d = only_diagnostic(write_entry(tmp_path, nest=bad))
    assert d.code == "E0908"
    assert d.message == 'nest.toml: [weights].revision must be a 40-hex commit id, found "main"'
    line = bad.splitlines().index('revision = "main"') + 1
    assert d.span.file.endswith("nest.toml") and d.span.line == line and d.span.col == 1


@pytest.mark.parametrize("revision", ["0123456789ABCDEF0123456789ABCDEF01234567", "0123abc", "v1.0"])
def test_revision_must_be_lowercase_40_hex(tmp_path, revision):
    bad = VALID_NEST.replace("0123456789abcdef0123456789abcdef01234567", revision)
    assert only_diagnostic(write_entry(tmp_path, nest=bad)).code == "E0908"


@pytest.mark.parametrize("line, table, field", [
    ('title = "Tiny"', "model", "title"),
    ('root = "Model"', "source", "root"),
    ('files = ["model.safetensors"]', "weights", "files"),
    ('bindings = "bindings.json"', "weights", "bindings"),
])
def test_missing_field_names_table_and_field(tmp_path, line, table, field):
    d = only_diagnostic(write_entry(tmp_path, nest=VALID_NEST.replace(line + "\n", "")))
    assert d.code == "E0904"
    assert d.message == f"nest.toml: [{table}] is missing required field `{field}`"
    assert d.span.line == VALID_NEST.splitlines().index(f"[{table}]") + 1  # points at the header


def test_missing_table(tmp_path):
    without_source = re.sub(r"\[source\]\n(.+\n)+\n", "", VALID_NEST)
    d = only_diagnostic(write_entry(tmp_path, nest=without_source))
    assert d.code == "E0904" and d.message == "nest.toml: required table [source] is missing"


@pytest.mark.parametrize("old, new, message", [
    ('tags = ["test"]', 'tags = "test"',
     'nest.toml: [model].tags must be an array of strings, found "test"'),
    ('files = ["model.safetensors"]', 'files = "model.safetensors"',
     'nest.toml: [weights].files must be an array of strings, found "model.safetensors"'),
    ('title = "Tiny"', "title = 3", "nest.toml: [model].title must be a string, found int 3"),
    ("B = 1", "B = 1.5", "nest.toml: [check].B must be an integer, found float 1.5"),
    ("B = 1", "B = true", "nest.toml: [check].B must be an integer, found boolean true"),
    ("D = 8", "D = [8]", "nest.toml: [generics].D must be a number, a dtype name or a member name, found an array"),
    ('huggingface = "https://huggingface.co/org/tiny"', "huggingface = 1",
     "nest.toml: [links].huggingface must be a string, found int 1"),
])
def test_wrong_type_names_field_and_found_value(tmp_path, old, new, message):
    d = only_diagnostic(write_entry(tmp_path, nest=VALID_NEST.replace(old, new)))
    assert d.code == "E0905" and d.message == message
    assert d.span.line == VALID_NEST.splitlines().index(old) + 1


def test_table_given_as_a_value(tmp_path):
    bad = re.sub(r"\[check\]\nB = 1\n", "", VALID_NEST).replace("[model]", "check = 3\n\n[model]")
    d = only_diagnostic(write_entry(tmp_path, nest=bad))
    assert d.code == "E0905" and d.message == "nest.toml: [check] must be a table, found int 3"


def test_generic_dtype_must_be_a_linnet_dtype(tmp_path):
    d = only_diagnostic(write_entry(tmp_path, nest=VALID_NEST.replace('T = "f32"', 'T = "float32"')))
    assert d.code == "E0912"
    assert d.message.startswith('nest.toml: [generics].T must be a number, a dtype name (f64, f32')
    assert d.message.endswith('or a member name (Activation: gelu_erf, gelu_tanh, relu, silu), found "float32"')


def test_a_generic_string_near_a_member_suggests_the_members(tmp_path):
    d = only_diagnostic(write_entry(tmp_path, nest=VALID_NEST.replace('T = "f32"', 'T = "gelu"')))
    assert d.code == "E0912"
    assert d.message.endswith('found "gelu"; did you mean "gelu_erf" or "gelu_tanh"?')


def test_unknown_field_is_an_error_with_a_suggestion(tmp_path):
    bad = VALID_NEST.replace('bindings = "bindings.json"', 'bindings = "bindings.json"\nrevison = "x"')
    d = only_diagnostic(write_entry(tmp_path, nest=bad))
    assert d.code == "E0906"
    assert d.message == "nest.toml: [weights] has unknown field `revison` (did you mean `revision`?)"
    assert d.span.line == bad.splitlines().index('revison = "x"') + 1


def test_unknown_table_is_an_error_with_a_suggestion(tmp_path):
    d = only_diagnostic(write_entry(tmp_path, nest=VALID_NEST + '\n[genrics]\nX = 1\n'))
    assert d.code == "E0906"
    assert d.message == "nest.toml: unknown table [genrics] (did you mean [generics]?)"


def test_unknown_top_level_field(tmp_path):
    d = only_diagnostic(write_entry(tmp_path, nest='version = "1"\n' + VALID_NEST))
    assert d.code == "E0906" and d.message == "nest.toml: unknown top-level field `version`"
    assert d.span.line == 1


@pytest.mark.parametrize("field, old, escaping", [
    ("[source].path", 'path = "src/lib.linnet"', "../other/lib.linnet"),
    ("[source].path", 'path = "src/lib.linnet"', "/etc/lib.linnet"),
    ("[source].path", 'path = "src/lib.linnet"', "src/../../lib.linnet"),
    ("[weights].bindings", 'bindings = "bindings.json"', "../bindings.json"),
    ("[weights].bindings", 'bindings = "bindings.json"', "C:\\\\bindings.json"),
])
def test_paths_may_not_leave_the_entry(tmp_path, field, old, escaping):
    key = old.split(" = ")[0]
    d = only_diagnostic(write_entry(tmp_path, nest=VALID_NEST.replace(old, f'{key} = "{escaping}"')))
    assert d.code == "E0907"
    assert d.message.startswith(f"nest.toml: {field} must be a relative path inside the entry folder")


# --------------------------------------------------------------------------- declared layouts

FILE_BINDINGS = 'bindings = "bindings.json"'


def with_bindings(value: str) -> str:
    return VALID_NEST.replace(FILE_BINDINGS, f"bindings = {value}")


def test_a_declared_layout_is_read_with_its_spellings(tmp_path):
    m = load_manifest(write_entry(tmp_path, nest=with_bindings('{ layout = "bert", prefix = "" }')))
    assert m.weights.bindings == LayoutBindings("bert", "", "weight/bias")  # torch's spelling by default


@pytest.mark.parametrize("value, code, message", [
    ('{ layout = "t5", prefix = "" }', "E0912",
     '[weights].bindings.layout must name a declared layout ("bert", "gpt2", "llama", "qwen2", "vit", "modernbert"), found "t5"'),
    ('{ layout = "bert", prefix = "model." }', "E0912",
     '[weights].bindings.prefix must be one the "bert" layout\'s checkpoints use: "bert." (every BertFor* '
     'class); "" (BertModel); found "model."'),
    ('{ layout = "bert", prefix = "", layer_norm = "scale/shift" }', "E0912",
     '[weights].bindings.layer_norm must be "weight/bias" or "gamma/beta", found "scale/shift"'),
    ('{ layout = "bert" }', "E0904", "[weights].bindings is missing required field `prefix`"),
    ('{ layout = "bert", prefix = "", layer_norms = "gamma/beta" }', "E0906",
     "[weights].bindings has unknown field `layer_norms` (did you mean `layer_norm`?)"),
    ('{ layout = 1, prefix = "" }', "E0905", "[weights].bindings.layout must be a string, found int 1"),
    ("3", "E0905", "[weights].bindings must be a string (a bindings file) or a table (a declared layout), "
                   "found int 3"),
])
def test_a_bad_declared_layout_is_named_at_its_line(tmp_path, value, code, message):
    bad = with_bindings(value)
    d = only_diagnostic(write_entry(tmp_path, nest=bad))
    assert (d.code, d.message) == (code, f"nest.toml: {message}")
    assert d.span.line == bad.splitlines().index(f"bindings = {value}") + 1


def test_symlink_out_of_the_entry_is_caught(tmp_path):
    entry = write_entry(tmp_path / "zoo")
    (entry / "src").symlink_to(tmp_path)  # src/ now resolves outside the entry
    d = only_diagnostic(entry)
    assert d.code == "E0907" and "[source].path" in d.message


def test_repository_file_may_not_climb(tmp_path):
    bad = VALID_NEST.replace('files = ["model.safetensors"]', 'files = ["../model.safetensors"]')
    bad = bad.replace('"model.safetensors" = ', '"../model.safetensors" = ')
    d = only_diagnostic(write_entry(tmp_path, nest=bad))
    assert d.code == "E0907" and "[weights].files entry '../model.safetensors'" in d.message


def test_sha256_pin_must_be_64_hex(tmp_path):
    d = only_diagnostic(write_entry(tmp_path, nest=VALID_NEST.replace("ab" * 32, "abc123")))
    assert d.code == "E0909"
    assert d.message == ('nest.toml: [weights].sha256."model.safetensors" must be 64 lowercase hex '
                         'digits, found "abc123"')


def test_sha256_pin_must_name_a_listed_file(tmp_path):
    bad = VALID_NEST.replace('{ "model.safetensors" =', '{ "model-00001.safetensors" =')
    d = only_diagnostic(write_entry(tmp_path, nest=bad))
    assert d.code == "E0909" and "pins 'model-00001.safetensors', which is not in" in d.message


def test_repo_must_be_an_owner_name_id(tmp_path):
    d = only_diagnostic(write_entry(tmp_path, nest=VALID_NEST.replace('"org/tiny"\n', '"tiny"\n')))
    assert d.code == "E0912" and d.message.startswith("nest.toml: [weights].repo must be")


def test_empty_file_list(tmp_path):
    bad = VALID_NEST.replace('files = ["model.safetensors"]', "files = []").replace(
        'sha256 = { "model.safetensors" = "%s" }\n' % ("ab" * 32), "")
    d = only_diagnostic(write_entry(tmp_path, nest=bad))
    assert d.code == "E0912" and "[weights].files must list at least one" in d.message


def test_source_needs_exactly_one_of_path_and_zoo(tmp_path):
    both = VALID_NEST.replace('path = "src/lib.linnet"', 'path = "src/lib.linnet"\nzoo = "bert-base-uncased"')
    d = only_diagnostic(write_entry(tmp_path / "a", nest=both))
    assert d.code == "E0910" and d.message.endswith("found both")
    neither = VALID_NEST.replace('path = "src/lib.linnet"\n', "")
    d = only_diagnostic(write_entry(tmp_path / "b", nest=neither))
    assert d.code == "E0910" and d.message.endswith("found neither")
    assert d.message.startswith("nest.toml: [source] must give exactly one of `path`")


def test_a_mistyped_source_path_is_one_problem(tmp_path):
    d = only_diagnostic(write_entry(tmp_path, nest=VALID_NEST.replace('path = "src/lib.linnet"', "path = 1")))
    assert d.code == "E0905" and d.message == "nest.toml: [source].path must be a string, found int 1"


def test_weights_table_is_optional(tmp_path):
    without = VALID_NEST[:VALID_NEST.index("[weights]")]
    assert load_manifest(write_entry(tmp_path, nest=without)).weights is None


def test_every_problem_is_reported_at_once(tmp_path):
    bad = (VALID_NEST.replace('title = "Tiny"\n', "")
           .replace("0123456789abcdef0123456789abcdef01234567", "main")
           .replace("D = 8", "D = [8]"))  # (a float is a Real generic's value now)
    err = load_error(write_entry(tmp_path, nest=bad, linnet=VALID_LINNET.replace('version', 'verison')))
    assert [d.code for d in err.diagnostics] == ["E0904", "E0905", "E0908", "E0904", "E0906"]
    assert [d.message.split(":")[0] for d in err.diagnostics] == ["nest.toml"] * 3 + ["linnet.toml"] * 2


def test_toml_syntax_error_has_line_and_column(tmp_path):
    bad = VALID_NEST.replace('license = "MIT"', "license = MIT")
    d = only_diagnostic(write_entry(tmp_path, nest=bad))
    assert d.code == "E0903" and d.message.startswith("nest.toml: invalid TOML: Invalid value")
    assert (d.span.line, d.span.col) == (bad.splitlines().index("license = MIT") + 1, 11)


def test_rendering_quotes_the_offending_line(tmp_path):
    from linnet.diagnostics import SourceMap

    bad = VALID_NEST.replace("0123456789abcdef0123456789abcdef01234567", "main")
    err = load_error(write_entry(tmp_path, nest=bad))
    text = LinnetError(err.diagnostics, SourceMap()).render()
    assert 'revision = "main"' in text and "^^^^" in text and "nest.toml:" in text


# --------------------------------------------------------------------------- linnet.toml mistakes


def test_missing_linnet_toml(tmp_path):
    d = only_diagnostic(write_entry(tmp_path, linnet=None))
    assert d.code == "E0902" and d.message.startswith("linnet.toml: ") and d.message.endswith("is missing")


def test_linnet_toml_fields(tmp_path):
    d = only_diagnostic(write_entry(tmp_path / "a", linnet=VALID_LINNET.replace('language = "0.1"\n', "")))
    assert d.code == "E0904" and d.message == "linnet.toml: [package] is missing required field `language`"
    d = only_diagnostic(write_entry(tmp_path / "b", linnet=VALID_LINNET + "\n[dependencies]\nstd = '1'\n"))
    assert d.code == "E0906" and d.message == "linnet.toml: unknown table [dependencies]"
    d = only_diagnostic(write_entry(tmp_path / "c", linnet="[package\n"))
    assert d.code == "E0903" and d.message.startswith("linnet.toml: invalid TOML") and d.span.line == 1


# --------------------------------------------------------------------------- [source].zoo


def _zoo_nest(target: str) -> str:
    return VALID_NEST.replace('path = "src/lib.linnet"', f'zoo = "{target}"')


def test_zoo_source_prefers_a_sibling_entry(tmp_path):
    base = write_entry(tmp_path, "base")
    reuser = write_entry(tmp_path, "reuser", nest=_zoo_nest("base"))
    m = load_manifest(reuser)
    assert m.source_dir() == base and m.source_file() == base / "src" / "lib.linnet"


def test_zoo_source_falls_back_to_the_zoo(tmp_path):
    m = load_manifest(write_entry(tmp_path, nest=_zoo_nest("bert-base-uncased")))
    assert m.source_dir() == zoo_dir() / "bert-base-uncased"


def test_zoo_source_unknown_entry(tmp_path):
    m = load_manifest(write_entry(tmp_path, nest=_zoo_nest("no-such-entry")))
    with pytest.raises(LinnetError) as caught:
        m.source_dir()
    assert caught.value.code == "E0911"
    assert "[source].zoo names 'no-such-entry', but there is no such zoo entry" in str(caught.value)


def test_zoo_source_loop(tmp_path):
    write_entry(tmp_path, "a", nest=_zoo_nest("b"))
    write_entry(tmp_path, "b", nest=_zoo_nest("a"))
    with pytest.raises(LinnetError, match="in a loop: a -> b -> a") as caught:
        load_manifest(tmp_path / "a").source_dir()
    assert caught.value.code == "E0911"


def test_zoo_source_must_be_a_name(tmp_path):
    d = only_diagnostic(write_entry(tmp_path, nest=_zoo_nest("../elsewhere")))
    assert d.code == "E0912" and "[source].zoo must be a zoo entry name" in d.message
