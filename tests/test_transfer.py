"""Transfer strategies (Gheini et al. 2021): which parameters each one trains, and the parameter accounting."""
import pytest
import torch

import xattn
from tests.conftest import tiny_config
from xattn.errors import XattnError
from xattn.transfer import STRATEGIES, format_parameter_table, parameter_table, strategy, trainable_names


@pytest.fixture
def separate():
    torch.manual_seed(0)
    return xattn.Transformer(tiny_config(share_embeddings=False, tie_output=True))


def test_every_strategy_of_the_paper_is_named():
    assert list(STRATEGIES) == ["scratch", "src", "src+body", "src+xattn", "src+randxattn",
                                "tgt", "tgt+body", "tgt+xattn", "tgt+randxattn"]
    with pytest.raises(XattnError, match=r"--strategy: unknown strategy .src\+enc.; one of scratch, src, src\+body"):
        strategy("src+enc")


@pytest.mark.parametrize("name, side, groups", [
    ("src", "src", {"src"}),
    ("src+xattn", "src", {"src", "xattn"}),
    ("src+randxattn", "src", {"src", "xattn"}),
    ("src+body", "src", {"src", "enc", "dec", "xattn"}),
    ("tgt+xattn", "tgt", {"tgt", "xattn"}),
    ("tgt+body", "tgt", {"tgt", "enc", "dec", "xattn"}),
    ("scratch", "tgt", {"src", "tgt", "enc", "dec", "xattn"}),
])
def test_trainable_parameters_of_each_strategy(separate, name, side, groups):
    names = trainable_names(separate, strategy(name), side)
    by_group = separate.parameter_groups()
    assert names == {n for g in groups for n in by_group[g]}
    assert all(n.startswith("decoder.layers.") for n in by_group["xattn"])
    assert ("decoder.layers.0.cross_attn.q_proj.weight" in names) == ("xattn" in groups)
    assert ("decoder.layers.0.self_attn.q_proj.weight" in names) == ("dec" in groups)


def test_parameter_table_counts_every_parameter_once(separate):
    names = trainable_names(separate, strategy("src+xattn"), "src")
    rows = {r["group"]: r for r in parameter_table(separate, names)}
    total = sum(p.numel() for p in separate.parameters())  # tied output counted once
    assert rows["all"]["total"] == total
    expected = sum(p.numel() for n, p in separate.named_parameters() if n in names)
    assert rows["all"]["trained"] == expected and rows["all"]["share"] == pytest.approx(expected / total)
    assert rows["xattn"]["share"] == 1.0 and rows["enc"]["trained"] == 0 and rows["src"]["share"] == 1.0
    lines = format_parameter_table(list(rows.values()))
    assert lines[0].split() == ["group", "trained", "of", "share"] and lines[-1].startswith("all")
