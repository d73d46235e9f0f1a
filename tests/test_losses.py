"""The guided-alignment loss (xattn/losses.py) and the word links it learns, carried onto pieces (xattn/links.py)."""
import pytest
import torch

import xattn
from tests.conftest import tiny_config
from xattn.data.batching import collate
from xattn.links import corpus_piece_links, piece_links
from xattn.losses import GuidedAlignment, guided_alignment_loss, supervised_attention


def random_links(B: int, T: int, S: int, seed: int = 0) -> torch.Tensor:
    """Distinct (b, t, s) links on about half the target positions, 1 to 3 per position."""
    g = torch.Generator().manual_seed(seed)
    rows = []
    for b in range(B):
        for t in range(T):
            if torch.rand(1, generator=g) < 0.5:
                for s in torch.randperm(S, generator=g)[:int(torch.randint(1, 4, (1,), generator=g))]:
                    rows.append((b, t, int(s)))
    return torch.tensor(rows, dtype=torch.long)


def targets(links: torch.Tensor, B: int, T: int, S: int) -> torch.Tensor:
    """(B, T, S): each linked position's links normalised over the source; zero rows elsewhere."""
    p = torch.zeros(B, T, S)
    p[links[:, 0], links[:, 1], links[:, 2]] = 1.0
    return p / p.sum(-1, keepdim=True).clamp(min=1)


def test_the_loss_is_zero_exactly_when_attention_equals_the_normalised_links():
    B, T, S = 3, 5, 6
    links = random_links(B, T, S)
    p = targets(links, B, T, S)
    linked = p.sum(-1) > 0  # (B, T)
    free = torch.randn(B, T, S).softmax(-1)
    attention = torch.where(linked.unsqueeze(-1), p, free)  # rows without links: anything
    loss, rows = guided_alignment_loss(attention, links)
    assert rows == int(linked.sum()) and abs(float(loss)) < 1e-6
    other = torch.randn(B, T, S).softmax(-1)
    worse, _ = guided_alignment_loss(other, links)
    cross_entropy = -(p * other.log()).sum()
    entropy = -(p * p.clamp(min=1e-30).log()).sum()
    assert float(worse) > 0 and float(worse) == pytest.approx(float(cross_entropy - entropy), rel=1e-5)


def test_positions_and_rows_without_links_contribute_nothing():
    B, T, S = 2, 4, 5
    links = torch.tensor([[0, 1, 2], [0, 1, 3], [0, 3, 0]])  # row 1 has no links at all
    a = torch.randn(B, T, S).softmax(-1)
    b = a.clone()
    b[0, 0], b[0, 2], b[1] = torch.randn(S).softmax(-1), torch.randn(S).softmax(-1), torch.randn(T, S).softmax(-1)
    assert torch.equal(guided_alignment_loss(a, links)[0], guided_alignment_loss(b, links)[0])
    assert guided_alignment_loss(a, links)[1] == 2
    assert guided_alignment_loss(a, links[:0]) == (0.0, 0)
    # golden value: row (0, 1) wants 1/2 on sources 2 and 3, row (0, 3) all on source 0
    expected = 0.5 * (torch.log(torch.tensor(0.5)) - a[0, 1, 2].log()) + 0.5 * (torch.log(torch.tensor(0.5)) - a[0, 1, 3].log()) \
        - a[0, 3, 0].log()
    assert float(guided_alignment_loss(a, links)[0]) == pytest.approx(float(expected), rel=1e-6)


def test_the_mean_of_chosen_heads_is_supervised():
    cross = torch.randn(2, 4, 3, 5).softmax(-1)  # (B, H, T, S)
    assert torch.allclose(supervised_attention(cross, (1, 3)), (cross[:, 1] + cross[:, 3]) / 2)
    assert torch.allclose(supervised_attention(cross, None), cross.mean(1))


def test_the_gradient_reaches_only_the_supervised_head_and_what_is_below_it():
    torch.manual_seed(0)
    model = xattn.Transformer(tiny_config(n_decoder_layers=2, n_heads=2, d_model=16))
    src = torch.tensor([[5, 6, 7, 8, 2], [9, 10, 11, 2, 0]])
    tgt_in = torch.tensor([[1, 12, 13, 14], [1, 15, 16, 0]])
    links = torch.tensor([[0, 0, 1], [0, 1, 0], [0, 2, 3], [1, 0, 2], [1, 1, 0], [1, 1, 1]])
    guide = GuidedAlignment(layer=0, heads=(1,), weight=1.0)
    out = model(src, tgt_in, cross_layers=guide.cross_layers)
    assert out.cross_attn[1] is None and out.self_attn is None
    term, value, rows = guide(out.cross_attn, links)
    assert rows == 5 and value > 0
    term.backward()
    grads = {name: (p.grad.abs().sum().item() if p.grad is not None else 0.0) for name, p in model.named_parameters()}
    dh = model.cfg.head_dim
    cross = model.decoder.layers[0].cross_attn
    head = {proj: getattr(cross, proj).weight.grad.view(2, dh, -1).abs().sum(dim=(1, 2)) for proj in ("q_proj", "k_proj")}
    for proj, per_head in head.items():  # head 1's queries and keys learn, head 0's do not
        assert per_head[1] > 0 and per_head[0] == 0, proj
    for name, g in grads.items():
        above = name.startswith(("decoder.layers.1.", "generator.", "decoder.layers.0.ffn",
                                 "decoder.layers.0.cross_attn.v_proj", "decoder.layers.0.cross_attn.out_proj"))
        if above:  # what comes after the weights (values, output projection, later layers) gets nothing
            assert g == 0, name
    for name in ("encoder.layers.0.ffn.fc1.weight", "decoder.layers.0.self_attn.q_proj.weight", "src_embed.weight"):
        assert grads[name] > 0, name


def test_word_links_are_carried_onto_every_piece_of_both_words():
    # source "Hausboot rot" as pieces ▁Haus boot ▁rot, target "red houseboat" as ▁red ▁house boat
    pieces = piece_links({(0, 1), (1, 0)}, src_word_of=[0, 0, 1], tgt_word_of=[0, 1, 1])
    assert pieces == [(0, 1), (0, 2), (1, 1), (1, 2), (2, 0)]
    assert piece_links({(0, 0)}, [0, 0, -1], [-1, 0]) == [(0, 1), (1, 1)]  # a piece of no word (</s>) stays out
    assert piece_links({(3, 0)}, [0, 1], [0]) == []  # a word without pieces loses its links


class WordPieces:
    """A tokenizer of fixed pieces per word, to work an example by hand."""

    def __init__(self, table: dict[str, list[int]]):
        self.table = table

    def encode_batch(self, texts):
        return [[i for word in text.split() for i in self.table[word]] for text in texts]


def test_a_corpus_line_of_word_links_becomes_piece_links_and_the_target_shift_is_right():
    class Pair:
        src = WordPieces({"Hausboot": [10, 11], "rot": [12]})
        tgt = WordPieces({"red": [20], "houseboat": [21, 22]})
    rows = [("Hausboot rot", "red houseboat", "0-1 1-0", 1), ("rot", "red", "", 2)]
    src_ids = [Pair.src.encode_batch([r[0]])[0] for r in rows]
    tgt_ids = [Pair.tgt.encode_batch([r[1]])[0] for r in rows]
    flat, counts = corpus_piece_links(rows, src_ids, tgt_ids, Pair, "links.txt")
    assert flat == [[0, 1, 0, 2, 1, 1, 1, 2, 2, 0], []] and counts == {"pairs": 1, "links": 5, "unmatched": 0}
    batch = collate(src_ids, tgt_ids, [0, 1], links=flat)
    # tgt_in = <s> red house boat, tgt_out = red house boat </s>: decoder position t predicts tgt_out[t], the
    # t-th target piece, and learns that piece's links
    assert batch.tgt_out[0].tolist() == [20, 21, 22, 2] and batch.tgt_in[0].tolist() == [1, 20, 21, 22]
    assert sorted(map(tuple, batch.links.tolist())) == [(0, 0, 2), (0, 1, 0), (0, 1, 1), (0, 2, 0), (0, 2, 1)]
    B, T, S = batch.tgt_out.shape + (batch.src.shape[1],)
    right = targets(batch.links, B, T, S)
    assert float(guided_alignment_loss(right + 1e-9, batch.links)[0]) == pytest.approx(0, abs=1e-6)
    shifted = torch.roll(right, 1, dims=1)  # the row of the decoder input instead of the predicted piece
    assert float(guided_alignment_loss(shifted + 1e-9, batch.links)[0]) > 5


def test_a_link_outside_the_words_names_the_file_and_line():
    class Pair:
        src = tgt = WordPieces({"a": [5], "b": [6]})
    rows = [("a b", "a", "0-0", 1), ("a b", "b", "1-0 2-0", 2)]
    ids = [[5, 6], [5, 6]]
    with pytest.raises(xattn.XattnError, match=r"^links\.txt: line 2: link '2-0': index 2 is beyond the 2 words"):
        corpus_piece_links(rows, ids, [[5], [6]], Pair, "links.txt")


def test_words_the_tokenizer_splits_otherwise_lose_their_links_and_are_counted():
    class Pair:
        src = tgt = WordPieces({"a": [5], "b": [6]})
    rows = [("a b", "a", "0-0", 1)]
    flat, counts = corpus_piece_links(rows, [[7]], [[5]], Pair, "links.txt")  # the line's ids are not its words'
    assert flat == [[]] and counts == {"pairs": 0, "links": 0, "unmatched": 1}
