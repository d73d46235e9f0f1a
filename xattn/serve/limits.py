"""The limits of `xattn serve` and its client-facing error, importable without the `serve` extra."""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar


@dataclass(frozen=True)
class Limits:
    """What one request may ask for; `xattn serve` has a flag for each."""
    max_chars: int = 5000              # characters of all items together
    max_items: int = 32                # items of a list `q`
    max_source_tokens: int = 256       # subword tokens of one sentence (serve/sentences.py)
    max_beam: int = 16
    max_n_best: int = 8                # also `alternatives` + 1
    max_samples: int = 8
    max_output_tokens: int = 512       # decode.max_len_a * source tokens + max_len_b
    max_work: int = 256_000            # a request's decoding work: per text, hypotheses x its maximum output tokens,
    #                                    a token at position t weighing 1 + t/64 (work.positioned)
    long_work: int = 4096              # work above which a request runs alone, beside the next batches, in turns
    long_after_s: float = 0.1          # a call still running after this long per request runs beside the next ones too
    max_attention_values: int = 1_000_000  # numbers in a response's attention, full or mean (an upper bound)
    queue_size: int = 256              # requests waiting, or in calls no longer waited for: more is 429
    timeout_s: float = 30.0            # a request not answered by then is 504
    max_backlog_s: float | None = None  # behind, a request that the work ahead would keep waiting longer is 429
    #                                    (serve/backlog.py); None: half of timeout_s
    max_batch: int = 64                # sentences in one translate call
    batch_wait_ms: float = 5.0         # under load, how long the batcher may wait for a batch as large as the last

    SEARCH_LIMITS: ClassVar[dict[str, str]] = {"beam_size": "max_beam", "n_best": "max_n_best", "num_samples": "max_samples"}
    """The limit of each decode setting that has one (Limits' field; the flag --max-beam, ...)."""

    def over(self, decode) -> list[tuple[str, int, int]]:
        """The settings of a DecodeConfig's kind of search above these limits, as (name, value, limit): its samples
        when it samples, else its beam and n-best (a sampling search's beam is not used)."""
        used = ("num_samples",) if decode.sampling else ("beam_size", "n_best")
        return [(name, getattr(decode, name), getattr(self, self.SEARCH_LIMITS[name])) for name in used
                if getattr(decode, name) > getattr(self, self.SEARCH_LIMITS[name])]

    @property
    def backlog_s(self) -> float:
        """Seconds of estimated work ahead beyond which a request is refused (max_backlog_s, or half the timeout)."""
        return self.max_backlog_s if self.max_backlog_s is not None else self.timeout_s / 2


class ApiError(Exception):
    """A client-facing error: HTTP status, message and type (the JSON body), extra headers."""

    def __init__(self, status: int, message: str, error_type: str, headers: dict | None = None):
        super().__init__(message)
        self.status, self.message, self.error_type, self.headers = status, message, error_type, headers or {}

    def body(self) -> dict:
        return {"error": self.message, "error_type": self.error_type}


NAME_SHOWN = 60
"""Characters of a field's name an error shows (an unknown key of 50 KB came back whole)."""


def shown(name: str) -> str:
    """A field's name as an error shows it: cut to NAME_SHOWN characters, with its length."""
    return name if len(name) <= NAME_SHOWN else f"{name[:NAME_SHOWN]}… ({len(name)} characters)"
