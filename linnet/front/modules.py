"""What the resolver knows of one module: its file, its syntax tree and its scope."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from . import ast


@dataclass
class ModuleInfo:
    name: str
    path: Path
    tree: ast.Module
    # name -> (defining module, item); own items and imports alike.
    scope: dict[str, "tuple[ModuleInfo, ast.Item]"] = field(default_factory=dict)
    #: For the module the resolver makes to hold one expanded block alias: the template's module,
    #: whose scope (plus the blocks passed in) the expanded block's names resolve in. It shares
    #: the alias's module name, so its block's key is the alias's (`bert::SequenceClassification`).
    expanded_from: "ModuleInfo | None" = None

    def own_items(self) -> dict[str, ast.Item]:
        return {item.name: item for item in self.tree.items}
