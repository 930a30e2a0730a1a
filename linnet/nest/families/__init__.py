"""Model families: how a transformers `config.json` becomes one of the zoo's Linnet sources.

`nest.load("hf:owner/name")` and `nest.load("./folder")` read a repo laid out as transformers
writes it.  What differs between architectures is declared here, one `Family` per zoo source,
next to its key layout (`linnet.nest.layouts`):

* which `model_type`s it reads, which zoo entry holds its Linnet source, and which root block
  each transformers class (`architectures[0]`) becomes;
* `read_config`: config.json's fields -> the root's generics, every setting the source cannot
  compute refused by name (`ConfigReader` collects every problem into one error);
* the key layout and which of its prefixes a checkpoint uses; checks only the checkpoint can
  answer (a tied decoder);
* where its tokenizer or image preprocessor comes from, and for a text encoder the block that
  gives token embeddings to a sentence-transformers pipeline (`EncoderSpec`).

`linnet.nest.hf` runs the steps every family shares.  A new family is one module here plus its
Linnet source and layout; `FAMILIES` lists them by `model_type`.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Iterable

from ... import codes, dtypes
from ...diagnostics import Diagnostic, LinnetError, Note, error
from ..layouts import Layout
from ..manifest import CONFIG_JSON, GenerateSpec, ImageSpec, TokenizerSpec

if TYPE_CHECKING:
    from ..hf import RepoFiles
    from ..weights import TensorInfo


@dataclass(frozen=True)
class EncoderSpec:
    """The block of a family's source that turns token ids into token embeddings `[B, S, D]`,
    which a sentence-transformers pipeline (`linnet.nest.sentence`) pools.

    `block` is instantiated as `sub <sub>: block<...>` in the pipeline's root with the
    family's generics, so its params keep the paths the family's layout binds; `function` is
    called as `sub.function(tokens, token_types, attention_mask)`.  `width` and `positions`
    name the generics holding the embedding width and the longest input.
    """

    block: str
    sub: str
    function: str = "forward"
    width: str = "D"
    positions: str = "MaxPositions"
    #: The function's inputs, all `[B, S; i32]`, each with its entry default (None: required).
    inputs: tuple[tuple[str, str | None], ...] = (("tokens", None), ("token_types", "zeros"),
                                                  ("attention_mask", "ones"))
    #: The input that is 1 at a real token: what pooling averages over.
    mask: str = "attention_mask"


@dataclass(frozen=True)
class FamilyConfig:
    """What config.json says, checked: the transformers class, the root block, its generics."""

    architecture: str
    root: str
    generics: dict[str, int | str | float]
    #: What each logit means, by index (`id2label`); None for a root without labels.
    labels: tuple[str, ...] | None = None
    generation: GenerateSpec | None = None
    #: Facts a family's own checkpoint checks need later (BERT: whether the decoder is tied).
    settings: dict[str, Any] = field(default_factory=dict)


class ConfigReader:
    """config.json's fields read with one message per problem, all reported together."""

    def __init__(self, config: dict[str, Any], name: str, path, family: "Family"):
        self.config = config
        self.name = name
        self.note = Note(f"the file is {path}")
        self.family = family
        self.problems: list[Diagnostic] = []

    def problem(self, code: codes.ErrorCode, message: str) -> None:
        self.problems.append(Diagnostic(code, f"{self.name}: {CONFIG_JSON} {message}", None, (self.note,)))

    def unsupported(self, message: str) -> None:
        self.problem(codes.HF_UNSUPPORTED_CONFIG, message)

    def get(self, key: str, default: Any = None) -> Any:
        return self.config.get(key, default)

    def sizes(self, fields: tuple[tuple[str, str, str], ...], generics: dict) -> None:
        """Each `(field, generic, meaning)`: a positive integer config field -> a Dim generic."""
        for name, generic, meaning in fields:
            value = self.config.get(name)
            if name not in self.config:
                self.problem(codes.HF_CONFIG_FIELD,
                             f"has no `{name}` ({meaning}); a {self.family.title} config must give it")
            elif not is_count(value):
                self.problem(codes.HF_CONFIG_FIELD,
                             f"`{name}` must be a positive integer ({meaning}), found {describe(value)}")
            else:
                generics[generic] = value

    def real(self, name: str, generic: str, generics: dict, default: float, *, low: float = 0.0,
             high: float = float("inf"), what: str = "a positive number") -> None:
        """A float config field (an epsilon, a rate) -> a Real generic; absent: `default`."""
        value = self.config.get(name, default)
        if value is None:
            value = default
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value < high:
            self.problem(codes.HF_CONFIG_FIELD, f"`{name}` must be {what}, found {describe(value)}")
        else:
            generics[generic] = float(value)

    def one_of(self, name: str, default: str, computed: Iterable[str], source: str) -> str | None:
        """A string setting the family's source computes only some values of (an activation):
        the value, or None with the refusal recorded."""
        value = self.config.get(name, default)
        computed = tuple(computed)
        if isinstance(value, str) and value in computed:
            return value
        self.unsupported(f"sets {name} = {describe(value)}; the {source} computes "
                         f"{', '.join(map(json.dumps, computed))} only")
        return None

    def epsilon(self, name: str, generics: dict, default: float) -> None:
        """A LayerNorm epsilon field -> the `Eps` generic every family's source has; absent:
        `default` (transformers' for the family); it must be above 0."""
        what = "a positive number (LayerNorm's epsilon)"
        self.real(name, "Eps", generics, default, what=what)
        if generics.get("Eps") == 0.0:
            self.problem(codes.HF_CONFIG_FIELD, f"`{name}` must be {what}, found 0.0")

    def dtype(self, generics: dict) -> None:
        """transformers names the dtype as torch does ("float32"): `dtype`, `torch_dtype` before v5."""
        found = dtypes.lookup("torch", self.config.get("dtype", self.config.get("torch_dtype")))
        if found is not None and found.linnet and found.is_float:
            generics["T"] = found.name

    def labels(self) -> tuple[str, ...] | None:
        """Label names by logit index: `id2label`, else `num_labels` generic names, else two
        (transformers' defaults)."""
        id2label = self.config.get("id2label")
        if id2label is None:
            count = self.config.get("num_labels", 2)
            if not is_count(count):
                self.problem(codes.HF_CONFIG_FIELD, f"`num_labels` must be a positive integer, found {describe(count)}")
                return None
            return tuple(f"LABEL_{i}" for i in range(count))
        keys = list(id2label) if isinstance(id2label, dict) else []
        wanted = [str(i) for i in range(len(keys))]
        if not keys or sorted(keys, key=lambda k: (len(k), k)) != wanted:
            self.problem(codes.HF_CONFIG_FIELD, "`id2label` must map the label ids 0, 1, ..., N-1 to names, found "
                                                f"{describe(id2label) if not keys else 'ids ' + ', '.join(keys)}")
            return None
        return tuple(str(id2label[key]) for key in wanted)

    def finish(self) -> None:
        if self.problems:
            raise LinnetError(self.problems)


class Family:
    """One zoo source as `hf:` and folders build it; subclasses override what differs."""

    #: The manifest's `family`, and this family's name in messages.
    name: ClassVar[str]
    title: ClassVar[str]
    #: config.json `model_type`s this family reads.
    model_types: ClassVar[tuple[str, ...]]
    #: The zoo entry whose Linnet source every model of the family runs.
    source_entry: ClassVar[str]
    layout: ClassVar[Layout]
    #: transformers class (`architectures[0]`) -> root block of the source.
    architectures: ClassVar[dict[str, str]]
    #: The entry `model(...)` runs for each root.
    root_entries: ClassVar[dict[str, str]]
    #: Names of the entries' results in exported graphs (as the zoo entries name them).
    outputs: ClassVar[dict[str, str]] = {}
    #: The block a sentence-transformers pipeline pools; None: the family has none.
    encoder: ClassVar[EncoderSpec | None] = None
    #: A param every root has, whose key tells which layout prefix a checkpoint uses.
    probe_param: ClassVar[str]

    # ------------------------------------------------------------ config.json

    def read_config(self, reader: ConfigReader, architecture: str, root: str) -> FamilyConfig:
        raise NotImplementedError

    def check_dims(self, config: FamilyConfig) -> dict[str, int]:
        """The `[check]` dims `linnet check` evaluates the entries' preconditions at."""
        return {"B": 1, "S": min(8, int(config.generics.get("MaxPositions", 8)))}

    # ------------------------------------------------------------ the checkpoint

    def key_prefix(self, index: dict[str, "TensorInfo"], architecture: str, namespace: str = "") -> str:
        """The layout prefix the checkpoint's keys use: the first whose probe key is stored,
        else the one the layout declares for `architecture`'s class, else the first."""
        for prefix in self.layout.prefixes:
            key = self.layout.key(self.probe_param, namespace + prefix)
            if key is not None and key in index:
                return namespace + prefix
        for prefix, classes in self.layout.prefixes.items():
            if architecture in classes:
                return namespace + prefix
        return namespace + next(iter(self.layout.prefixes))

    def key(self, param: str, prefix: str) -> str | None:
        """The key a param is stored under, in the layout's spelling."""
        return self.layout.key(param, prefix)

    def spelling_in(self, index: dict[str, "TensorInfo"], key: str) -> str:
        """`key` as this checkpoint spells it (BERT's TF-era LayerNorm names); as it is here."""
        return key

    def check_checkpoint(self, name: str, index: dict[str, "TensorInfo"], config: FamilyConfig,
                         files: list, prefix: str) -> None:
        """Checks only the stored tensors can answer, after every param is bound."""

    # ------------------------------------------------------------ beside the checkpoint

    def tokenizer(self, repo: "RepoFiles", config: FamilyConfig) -> TokenizerSpec | None:
        """The repo's tokenizer: `tokenizer.json` when there is one; None when it ships none."""
        if repo.find("tokenizer.json", what="tokenizer file") is not None:
            return TokenizerSpec(("tokenizer.json",), None)
        return None

    def image(self, repo: "RepoFiles", config: FamilyConfig) -> ImageSpec | None:
        """The repo's image preprocessing, for a family that takes pictures."""
        return None


def require_tied(name: str, stored: "TensorInfo", table: "TensorInfo", files: list, why: str) -> None:
    """A stored output matrix (`stored`, e.g. an LM head) must be the embedding `table` byte for
    byte, since the family's source computes with the table itself (`why` says so)."""
    if (stored.shape, stored.dtype) != (table.shape, table.dtype) or tensor_bytes(stored) != tensor_bytes(table):
        raise error(codes.HF_UNTIED_DECODER,
                    f"{name}: the checkpoint's {stored.key} differs from its embeddings {table.key}; {why}, "
                    f"so it cannot run this checkpoint exactly",
                    None, Note(f"the checkpoint is {', '.join(map(str, files))}"))


def tensor_bytes(info: "TensorInfo") -> bytes:
    """One tensor's raw bytes, found through its file's header (already validated)."""
    with open(info.file, "rb") as f:
        length = int.from_bytes(f.read(8), "little")
        start, end = json.loads(f.read(length))[info.file_key]["data_offsets"]
        f.seek(8 + length + start)
        return f.read(end - start)


def is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def describe(value: Any) -> str:
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, bool) or value is None:
        return json.dumps(value)
    if isinstance(value, (int, float)):
        return repr(value)
    return "a list" if isinstance(value, list) else "an object" if isinstance(value, dict) else type(value).__name__


def _registry() -> dict[str, Family]:
    from .bert import BertFamily
    from .gpt2 import Gpt2Family
    from .llama import LlamaFamily, Qwen2Family
    from .modernbert import ModernBertFamily
    from .vit import VitFamily

    families = [BertFamily(), Gpt2Family(), LlamaFamily(), Qwen2Family(), VitFamily(), ModernBertFamily()]
    return {model_type: family for family in families for model_type in family.model_types}


#: Every family `hf:` builds, by config.json `model_type`.
FAMILIES: dict[str, Family] = _registry()


def family_for(model_type: Any, name: str, note: Note) -> Family:
    """The family that reads `model_type`, or a named error listing the ones that exist."""
    family = FAMILIES.get(model_type) if isinstance(model_type, str) else None
    if family is None:
        raise error(codes.HF_MODEL_TYPE,
                    f"{name}: {CONFIG_JSON} has model_type {describe(model_type)}, which no Linnet source "
                    f"reads; hf: and folders build model types {', '.join(map(json.dumps, FAMILIES))}",
                    None, note)
    return family
