"""The prepared corpus format (xattn/data/prepared.py): flat id arrays written atomically, memory-mapped,
checked against their manifest, and giving the batches the in-memory corpus gives."""
import json
import mmap

import numpy as np
import pytest
import torch

from xattn.data import TokenBatchSampler, TokenizedCorpus
from xattn.data.prepared import MANIFEST, MappedCorpus, id_dtype, write_prepared
from xattn.errors import XattnError


def corpus(n: int = 300, vocab: int = 500, seed: int = 0) -> TokenizedCorpus:
    rng = np.random.default_rng(seed)
    lengths = rng.integers(0, 30, size=(2, n))
    return TokenizedCorpus(*([rng.integers(3, vocab, size=k).tolist() for k in side] for side in lengths))


def chunks(c: TokenizedCorpus, size: int = 64):
    for start in range(0, len(c), size):
        yield c.src[start:start + size], c.tgt[start:start + size]


@pytest.fixture
def prepared(tmp_path):
    c = corpus()
    write_prepared(tmp_path / "data", chunks(c), (500, 500), {"inputs": {"train.de": "ab" * 32}})
    return c, tmp_path / "data"


def test_the_mapped_corpus_holds_every_pair_and_batches_as_the_in_memory_one(prepared):
    c, folder = prepared
    mapped = MappedCorpus.open(folder)
    assert len(mapped) == len(c) and mapped.manifest["tokens"]["src"] == sum(map(len, c.src))
    assert all(mapped.sentence("src", i).tolist() == c.src[i] and mapped.sentence("tgt", i).tolist() == c.tgt[i]
               for i in range(len(c)))
    assert isinstance(mapped.ids["src"].base.obj, mmap.mmap) and mapped.ids["src"].dtype == np.uint16
    a, b = (TokenBatchSampler(x.src_lengths(), x.tgt_lengths(), max_tokens=200, seed=3) for x in (c, mapped))
    assert a.batches(2) == b.batches(2)
    for batch in a.batches(2)[:5]:
        x, y = c.collate(batch), mapped.collate(batch)
        assert torch.equal(x.src, y.src) and torch.equal(x.tgt_in, y.tgt_in) and torch.equal(x.tgt_out, y.tgt_out)


def test_ids_take_two_bytes_up_to_65536_pieces_and_four_above(tmp_path):
    assert id_dtype(65536) == np.uint16 and id_dtype(65537) == np.uint32
    c = TokenizedCorpus(corpus(vocab=70000).src, corpus(vocab=500).tgt)
    write_prepared(tmp_path / "wide", chunks(c), (70000, 500), {})
    mapped = MappedCorpus.open(tmp_path / "wide")
    assert mapped.ids["src"].dtype == np.uint32 and mapped.ids["tgt"].dtype == np.uint16
    assert mapped.sentence("src", 7).tolist() == c.src[7] and max(map(max, filter(None, c.src))) > 65535
    with pytest.raises(ValueError, match="an id outside uint16 for the tgt side"):  # a caller's bug, not a user's
        write_prepared(tmp_path / "narrow", chunks(corpus(vocab=70000)), (70000, 500), {})


def test_a_writer_that_fails_leaves_nothing_behind(tmp_path):
    def broken():
        yield from chunks(corpus(), 100)
        raise KeyboardInterrupt
    with pytest.raises(KeyboardInterrupt):
        write_prepared(tmp_path / "data", broken(), (500, 500), {})
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("damage, message", [
    (lambda d: (d / "src.bin").write_bytes((d / "src.bin").read_bytes()[:-2]), "src.bin: "),
    (lambda d: (d / "tgt.blocks").unlink(), "tgt.blocks: missing"),
    (lambda d: (d / "src.lengths").write_bytes(bytes(reversed((d / "src.lengths").read_bytes()))),
     "src.lengths: its SHA-256 differs"),
    (lambda d: (d / MANIFEST).write_text((d / MANIFEST).read_text().replace('"pairs": 300', '"pairs": 299')),
     "the src arrays do not agree"),
    (lambda d: (d / MANIFEST).write_text((d / MANIFEST).read_text().replace('"pairs": 300', '"pairs": 400')),
     "the src arrays do not agree"),  # (more than the arrays hold: an IndexError of NumPy's)
    (lambda d: (d / MANIFEST).unlink(), "not a prepared corpus"),
    (lambda d: (d / MANIFEST).write_text((d / MANIFEST).read_text().replace('"format": 2', '"format": 9')),
     "another format"),
])
def test_a_damaged_directory_is_refused_in_one_line(prepared, damage, message):
    _, folder = prepared
    damage(folder)
    with pytest.raises(XattnError, match=message) as e:
        MappedCorpus.open(folder)
    assert "\n" not in str(e.value)


def test_changed_ids_fail_the_checksum_and_other_inputs_are_named(prepared):
    _, folder = prepared
    data = bytearray((folder / "tgt.bin").read_bytes())
    data[0] ^= 1
    (folder / "tgt.bin").write_bytes(bytes(data))
    with pytest.raises(XattnError, match="tgt.bin: its SHA-256 differs"):  # (sizes agree: every byte is read; ids
        MappedCorpus.open(folder)                                          # out of the vocabulary failed a step)
    with pytest.raises(XattnError, match=r"prepared for other inputs \(\{\"train.de\": \"abab"):
        MappedCorpus.open(folder, expect={"inputs": {"train.de": "cd" * 32}})
    assert json.loads((folder / MANIFEST).read_text())["pairs"] == 300


@pytest.mark.parametrize("change, message", [
    (lambda m: m.update(pairs="x"), 'manifest.json: pairs: expected a whole number >= 0, got "x"'),
    (lambda m: m.update(pairs=True), "manifest.json: pairs: expected a whole number >= 0, got true"),
    (lambda m: m.update(arrays=[]), r"manifest.json: arrays: expected an object describing each array, got \[\]"),
    (lambda m: m["arrays"]["src.bin"].update(dtype="float64"), "arrays.src.bin: .* bytes of float64, not whole ids"),
    (lambda m: m["arrays"]["src.bin"].update(dtype="uint64"), "arrays.src.bin: .* bytes of uint64, not whole ids"),
    (lambda m: m["arrays"]["src.bin"].update(bytes="9"), 'arrays.src.bin: expected its dtype, bytes and sha256'),
])
def test_a_manifest_whose_counts_or_arrays_are_not_what_prepare_writes_is_one_line(prepared, change, message):
    """They were trusted: a count of "x" or a float dtype was a ValueError's traceback at the start of training."""
    _, folder = prepared
    manifest = json.loads((folder / MANIFEST).read_text())
    change(manifest)
    (folder / MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(XattnError, match=message) as e:
        MappedCorpus.open(folder)
    assert "\n" not in str(e.value) and "prepare it again" in str(e.value)
