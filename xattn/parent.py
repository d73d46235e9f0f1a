"""The `parent` section of a run config: the model a fine-tuned child or a composed model was made from
(xattn.transfer), which loading needs when the child's weights are a delta (xattn.checkpoint)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from xattn.checks import Check, ConfigError, sha256_hex, validate


@dataclass(frozen=True)
class ParentConfig:
    """The model a fine-tuned child was made from (xattn finetune, xattn compose)."""
    path: str | None = None             # the parent's model directory, relative to the child's (or absolute)
    tensors: str | None = None          # SHA-256 of the parent's full weights (checkpoint.tensors_digest)
    delta: bool = True                  # model.safetensors holds only what differs from the parent's weights

    CHECKS: ClassVar[dict[str, Check]] = dict(tensors=sha256_hex)

    def __post_init__(self) -> None:
        validate(self, "parent")
        if (self.path is None) != (self.tensors is None):
            raise ConfigError("parent.tensors", "parent.path and parent.tensors go together")

    @property
    def named(self) -> bool:
        return self.path is not None

    @property
    def needed(self) -> bool:
        """Loading needs the parent: the weights file is a delta."""
        return self.named and self.delta
