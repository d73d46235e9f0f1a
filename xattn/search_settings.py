"""Which search a decoding config asks for, and which of its settings that search uses: the rule that the command
line, the API and the server all go by (DecodeConfig, xattn/config.py, has it from SearchSettings). Without torch."""
from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from typing import Any, ClassVar

from xattn.checks import Unused


class SearchSettings:
    """What DecodeConfig's fields mean for the search: greedy or beam search (beam_size), or sampling."""

    beam_size: int
    sampling: bool
    num_samples: int
    n_best: int

    SAMPLING_ONLY: ClassVar[frozenset[str]] = frozenset({"temperature", "top_k", "top_p", "num_samples", "seed"})
    BEAM_ONLY: ClassVar[frozenset[str]] = frozenset({"beam_size", "n_best", "coverage_penalty", "stopping"})
    WIDE_BEAM_ONLY: ClassVar[frozenset[str]] = frozenset({"coverage_penalty", "stopping"})
    """Settings of beam search that greedy search (a beam of 1) has no use for."""

    @property
    def hypotheses(self) -> int:
        """Rows decoded per input: samples when sampling, else the beam."""
        return self.num_samples if self.sampling else self.beam_size

    @property
    def returned(self) -> int:
        """Translations returned per input: the samples when sampling, else the beam's n_best."""
        return self.num_samples if self.sampling else self.n_best

    def with_choices(self, changes: Mapping[str, Any]) -> dict[str, Any]:
        """A user's `changes` to this config (a model's own; CLI flags or request fields, as field names) with what
        follows from them: this config's n_best follows a smaller beam down, unless the changes name n_best."""
        beam = changes.get("beam_size", self.beam_size)  # (not a number: the config's checks name beam_size)
        follows = "n_best" not in changes and type(beam) is int and self.n_best > beam
        return {**changes, "n_best": beam} if follows else dict(changes)

    def set_besides(self, base: SearchSettings) -> list[str]:
        """The settings of this config that differ both from the defaults and from `base` (a model's own): what
        a caller set, for refuse_unused."""
        default = type(self)()
        return [f.name for f in dataclasses.fields(self)
                if getattr(self, f.name) not in (getattr(default, f.name), getattr(base, f.name))]

    @property
    def ignored(self) -> frozenset[str]:
        """The settings this config's kind of search has no use for: the beam's when sampling, the sampler's when
        searching, and the coverage penalty and stopping rule with a beam of 1."""
        return self.BEAM_ONLY if self.sampling else \
            self.SAMPLING_ONLY | (self.WIDE_BEAM_ONLY if self.beam_size == 1 else frozenset())

    def only_used(self, base: SearchSettings) -> SearchSettings:
        """This config with the settings its kind of search ignores (`ignored`) back at `base`'s: for a search that
        runs beside another with more settings (a server's greedy first search beside a wider beam)."""
        return dataclasses.replace(self, **{key: getattr(base, key) for key in self.ignored})

    def refuse_unused(self, given: Iterable[str]) -> None:
        """Of the settings a user gave (`given`, field names), the first that this config's kind of search
        would ignore is a ConfigError naming it: the beam's when sampling, the sampler's when searching, the
        coverage penalty and stopping rule with a beam of 1. Front ends map the names to their own."""
        if unused := sorted(set(given) & self.ignored):
            key = unused[0]
            raise Unused(f"decode.{key}", "applies to beam search, not to sampling (samples: decode.num_samples)"
                              if self.sampling else "applies to sampling only; set decode.sampling"
                              if key in self.SAMPLING_ONLY else "applies to beam search with decode.beam_size 2 or "
                              "more (decode.beam_size is 1: greedy search)")
