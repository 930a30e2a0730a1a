"""ViT (`model_type` "vit"): the source of `nest/vit-base-patch16-224`, for ViTForImageClassification.

config.json's sizes, `id2label` and `layer_norm_eps` become the `ImageClassification` root's
generics, at any square image and patch size the source expresses (the image a whole number
of patches).  Refused by name: another activation than exact GELU, query/key/value layers
without biases, an image the patches do not tile, a non-square image or patch.  The dropout
rates are not read: the source has no dropout, which changes nothing in eval.

Only the classifier class is built.  The source's `Model` block (the trunk without the
classifier) has no entries, and the `vit` layout binds the trunk under the root's `vit.`
sub-block, so a bare ViTModel checkpoint (no prefix, plus a pooler the source lacks) has no
root to load into.
"""
from __future__ import annotations

import json

from ... import codes
from ..layouts import VIT
from ..manifest import ImageSpec
from . import ConfigReader, Family, FamilyConfig, describe, is_count

#: config.json size fields -> the generics they give, with what each is (for messages).
SIZES = (
    ("num_channels", "Channels", "the number of colour channels"),
    ("hidden_size", "D", "the width of the hidden states"),
    ("num_attention_heads", "Heads", "the number of attention heads"),
    ("intermediate_size", "Inner", "the width of the feed-forward layer"),
    ("num_hidden_layers", "Layers", "the number of encoder layers"),
)
#: Square sizes transformers also takes as [height, width].
SQUARES = (
    ("image_size", "Image", "the image's height and width in pixels"),
    ("patch_size", "Patch", "a patch's height and width in pixels"),
)
#: `hidden_act`s the source's MLP computes: exact (erf) GELU.
HIDDEN_ACTS = ("gelu",)
#: transformers' ViTConfig default `layer_norm_eps`, the source's `Eps` default.
DEFAULT_EPS = 1e-12
PREPROCESSOR = "preprocessor_config.json"


class VitFamily(Family):
    name = "vit"
    title = "ViT"
    model_types = ("vit",)
    source_entry = "vit-base-patch16-224"
    layout = VIT
    architectures = {"ViTForImageClassification": "ImageClassification"}
    root_entries = {"ImageClassification": "forward"}
    outputs = {"forward": "logits", "embed": "embedding", "hidden_states": "hidden_states"}
    probe_param = "vit.embeddings.cls_token"

    # ------------------------------------------------------------ config.json

    def read_config(self, reader: ConfigReader, architecture: str, root: str) -> FamilyConfig:
        generics: dict = {}
        for field, generic, meaning in SQUARES:
            _square(reader, field, generic, meaning, generics)
        reader.sizes(SIZES, generics)
        image, patch = generics.get("Image"), generics.get("Patch")
        if image and patch and image % patch:
            reader.unsupported(f"has image_size {image}, which patches of {patch} do not tile (image_size must be a "
                               f"multiple of patch_size; the source cuts the whole image into patches)")
        heads, width = generics.get("Heads"), generics.get("D")
        if heads and width and width % heads:
            reader.unsupported(f"has hidden_size {width}, which {heads} attention heads cannot share equally "
                               f"(hidden_size must be a multiple of num_attention_heads)")
        labels = reader.labels()
        if labels is not None:
            generics["Labels"] = len(labels)
        reader.epsilon("layer_norm_eps", generics, DEFAULT_EPS)
        reader.dtype(generics)
        for message in _unsupported(reader):
            reader.unsupported(message)
        return FamilyConfig(architecture, root, generics, labels)

    def check_dims(self, config: FamilyConfig) -> dict[str, int]:
        """The entries take `[B, Channels, H, W]` images `where H == Image, W == Image`."""
        image = int(config.generics.get("Image", 224))
        return {"B": 1, "H": image, "W": image}

    # ------------------------------------------------------------ beside the checkpoint

    def image(self, repo, config: FamilyConfig) -> ImageSpec | None:
        """The repo's preprocessor_config.json (what `model.preprocess` follows), and
        config.json for the labels; None for a repo without a preprocessor."""
        if repo.find(PREPROCESSOR, what="image preprocessor file") is None:
            return None
        return ImageSpec(preprocessor=PREPROCESSOR, labels="config.json")


def _square(reader: ConfigReader, field: str, generic: str, meaning: str, generics: dict) -> None:
    """A size transformers takes as one integer or [height, width]: the source's are square."""
    value = reader.get(field)
    if isinstance(value, list) and len(value) == 2 and all(is_count(v) for v in value):
        if value[0] != value[1]:
            reader.unsupported(f"sets {field} = {json.dumps(value)} ([height, width]); the ViT source takes "
                               f"square sizes only")
            return
        value = value[0]
    if field not in reader.config:
        reader.sizes(((field, generic, meaning),), generics)  # reports the missing field
    elif not is_count(value):
        reader.problem(codes.HF_CONFIG_FIELD, f"`{field}` must be a positive integer ({meaning}) or "
                                              f"[height, width], found {describe(reader.get(field))}")
    else:
        generics[generic] = value


def _unsupported(reader: ConfigReader) -> list[str]:
    """What the config asks for that the ViT source does not compute, as messages."""
    messages = []
    reader.one_of("hidden_act", "gelu", HIDDEN_ACTS, "ViT source (exact GELU)")
    if reader.get("qkv_bias", True) is not True:
        messages.append(f"sets qkv_bias = {describe(reader.get('qkv_bias'))}; the ViT source's query, key and "
                        f"value layers add a bias (qkv_bias = true) only")
    return messages
