"""A request's decoding work, bounded up front (`check_work`): hypotheses x each text's maximum output tokens, a token
weighed by its position, so that no request can ask more of the model than `--max-work` however its settings
combine; and the rows it steps at most and at least, which the batcher and the backlog plan with."""
from __future__ import annotations

from xattn.config import DecodeConfig
from xattn.decoding.step import length_problem, positions_problem
from xattn.serve.limits import ApiError, Limits


def check_work(counts: list[int], cfg: DecodeConfig, limits: Limits, first: DecodeConfig | None = None,
               names: list[str] | None = None, asked: set[str] = frozenset(),
               max_positions: int | None = None) -> tuple[int, int, int]:
    """A request's work, bounded up front: over its texts, hypotheses x maximum output tokens, each weighed by its
    position (`positioned`: what one request can ask of the model, however its settings combine), with `first`'s
    too, a search that runs before cfg's (alternatives widen the model's own); each text's maximum output tokens
    within the limit; and a minimum length its maximum cannot reach. Returned: its rows x steps at most (the
    backlog's bound on what it will step; the batcher's long_work), its source rows: hypotheses x source tokens and their </s>, by which
    serve/backlog.py expects the rows it will step; and the rows it steps at least, hypotheses x min_len and the
    </s> step for each text (0 without min_len: then how long it runs is the model's, which the backlog learns).
    `counts`: the source tokens of each sentence, named by `names` (default q[0], q[1], ...); `asked`: the decoding
    fields the request set, which an error about them names (the sentence when it set neither max_len);
    `max_positions`: the model's learned positions (None: sinusoidal), which bound what min_len can ask."""
    names = names or [f"q[{i}]" for i in range(len(counts))]
    most = [cfg.max_output_tokens(n + 1) for n in counts]  # of a source counted with its </s>, as the search counts
    if over := [i for i, (n, m) in enumerate(zip(counts, most)) if n and m > limits.max_output_tokens]:
        i = max(over, key=lambda i: most[i])
        field = " and ".join(k for k in ("max_len_a", "max_len_b") if k in asked) or names[i]
        raise ApiError(422, f"{field}: max_len_a * {counts[i] + 1} source tokens ({names[i]} and </s>) + max_len_b "
                       f"allows {most[i]} output tokens, over the limit of {limits.max_output_tokens}", "limit_exceeded")
    if any(counts) and (problem := positions_problem(cfg, max_positions)):  # the setting's, whatever the text
        raise ApiError(422, f"{problem.name}: {problem.problem}", "invalid_request")
    for i, n in enumerate(counts):  # no output token, or fewer than min_len: translate's rule, decoding.step's
        if problem := length_problem(cfg, n + 1):  # (an empty text has none: it is translated empty)
            raise ApiError(422, f"{names[i]}: {problem.name}: {problem.problem}", "invalid_request")
    rows = cfg.hypotheses + (first.hypotheses if first is not None else 0)
    work = sum(m for n, m in zip(counts, most) if n) * rows  # rows x steps at most (an empty text: no step)
    cost = sum(positioned(m) for n, m in zip(counts, most) if n) * rows
    if cost > limits.max_work:
        each = f"{first.hypotheses} + {cfg.hypotheses}" if first is not None else str(cfg.hypotheses)
        raise ApiError(413, f"the request asks for up to {cost} units of decoding work ({len(counts)} "
                       f"{'sentences' if any(': sentence ' in n for n in names) else 'texts'} x "
                       f"{each} {'samples' if cfg.sampling else 'hypotheses'} x their maximum output tokens, a "
                       f"token at position t weighing 1 + t/{REACH}), over the limit of {limits.max_work}; send "
                       "fewer or shorter texts, or a smaller beam", "too_much_work")
    least = rows * (cfg.min_len + 1) * sum(1 for n in counts if n) if cfg.min_len else 0  # (an empty text: none)
    return work, rows * sum(n + 1 for n in counts if n), least


REACH = 64
"""Output positions after which a decoding step costs a row twice what it costs at the start: a step reads the keys
and values of every position before it, so its cost grows with the position (the figures: benchmarks/README.md,
Serving under load, "The work bound prices long outputs")."""


def positioned(tokens: int) -> int:
    """A text's decoding work for one hypothesis of up to `tokens` output tokens: each token at position t (from 1)
    weighs 1 + t / REACH, so that the bound holds what a request's steps cost, not only how many there are."""
    return tokens + tokens * (tokens + 1) // (2 * REACH)
