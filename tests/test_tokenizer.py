import random

import pytest

from xattn.errors import XattnError
from xattn.tokenizer import (
    BOS_ID, EOS_ID, PAD_ID, SMALL_BATCH, UNK_ID, Tokenizer, TokenizerPair, load_tokenizers, train_sentencepiece, train_tokenizers,
)

EN = "the a one dog cat man woman child runs jumps sits over under near red blue big small ball park street".split()
DE = "der die das ein eine hund katze mann frau kind rennt springt sitzt über unter neben rot blau groß klein".split()


def sentences(words: list[str], n: int = 200, seed: int = 0) -> list[str]:
    rnd = random.Random(seed)
    return [" ".join(rnd.choice(words) for _ in range(rnd.randint(3, 9))).capitalize() + "." for _ in range(n)]


@pytest.fixture(scope="module")
def joint_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("joint")
    train_tokenizers(sentences(DE), sentences(EN), out, vocab_size=120, joint=True)
    return out


def test_roundtrip_and_special_ids(joint_dir):
    tok = Tokenizer.load(joint_dir / "spm.model")
    assert (tok.pad_id, tok.bos_id, tok.eos_id, tok.unk_id) == (PAD_ID, BOS_ID, EOS_ID, UNK_ID) == (0, 1, 2, 3)
    assert 30 < tok.vocab_size <= 120
    text = "Ein Hund rennt über die Straße."
    ids = tok.encode(text)
    assert ids and min(ids) > UNK_ID
    assert tok.decode(ids) == text
    assert tok.decode([BOS_ID, *ids, EOS_ID, PAD_ID, PAD_ID]) == text
    assert "".join(tok.pieces(ids)).replace("▁", " ").strip() == text
    assert tok.pieces([PAD_ID, BOS_ID, EOS_ID, UNK_ID]) == ["<pad>", "<s>", "</s>", "<unk>"]
    assert tok.encode_batch([text, "Der Mann."]) == [ids, tok.encode("Der Mann.")]


@pytest.mark.parametrize("n", [0, 1, SMALL_BATCH - 1, SMALL_BATCH, SMALL_BATCH + 5])
def test_batches_small_and_large_encode_as_one_call_on_the_whole_list(joint_dir, n):
    tok = Tokenizer.load(joint_dir / "spm.model")
    texts = sentences(DE, n, seed=n) if n else []
    assert tok.encode_batch(texts) == tok._sp.encode(texts, out_type=int)  # below SMALL_BATCH: one text a call
    bad = [*texts, "Ein Hund.", 7][-max(n, 2):]  # the last text is no string
    with pytest.raises(XattnError, match=rf"^texts\[{len(bad) - 1}\]: expected a string, got int"):
        tok.encode_batch(bad)
    with pytest.raises(XattnError, match=r"^texts\[0\]: not valid Unicode"):
        tok.encode_batch(["\ud800", *texts])
    with pytest.raises(XattnError, match=r"^texts\[0\]: expected a string, got bytes"):  # SentencePiece would take it
        tok.encode_batch([b"Ein Hund.", *texts])
    utf16 = "Ein Hund.".encode("utf-16-le").decode("utf-8")  # valid UTF-8: a NUL after each letter
    with pytest.raises(XattnError, match=rf"^texts\[{len(texts)}\]: holds a NUL character \(at character 2\)"):
        tok.encode_batch([*texts, utf16])  # as the command line and the server refuse it; an unknown piece before


def test_unseen_character_maps_to_unk(joint_dir):
    tok = Tokenizer.load(joint_dir / "spm.model")
    assert UNK_ID in tok.encode("Ein 猫.")


def test_joint_layout_loads_one_shared_model(joint_dir):
    assert sorted(p.name for p in joint_dir.iterdir()) == ["spm.model"]
    pair = load_tokenizers(joint_dir)
    assert pair.joint and pair.src is pair.tgt
    assert pair.files == (joint_dir / "spm.model",)


def test_separate_layout_and_training_is_deterministic(tmp_path):
    first = train_tokenizers(sentences(DE), sentences(EN), tmp_path / "a", vocab_size=80, joint=False)
    second = train_tokenizers(sentences(DE), sentences(EN), tmp_path / "b", vocab_size=80, joint=False)
    assert isinstance(first, TokenizerPair) and not first.joint
    assert sorted(p.name for p in (tmp_path / "a").iterdir()) == ["spm.src.model", "spm.tgt.model"]
    loaded = load_tokenizers(tmp_path / "a")
    assert not loaded.joint and loaded.src.path.name == "spm.src.model"
    german = "Die Katze sitzt."
    assert loaded.src.encode(german) == second.src.encode(german) != loaded.tgt.encode(german)
    assert loaded.src.pieces(range(loaded.src.vocab_size)) == second.src.pieces(range(second.src.vocab_size))


def test_retraining_in_another_layout_replaces_the_old_files(tmp_path):
    train_tokenizers(sentences(DE), sentences(EN), tmp_path, vocab_size=80, joint=False)
    train_tokenizers(sentences(DE), sentences(EN), tmp_path, vocab_size=80, joint=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["spm.model"]


def test_bpe_with_vocab_larger_than_corpus_allows(tmp_path):
    tok = train_sentencepiece(sentences(EN, n=50), tmp_path / "bpe.model", vocab_size=5000, model_type="bpe")
    assert tok.vocab_size < 5000 and tok.path == tmp_path / "bpe.model"


def test_user_errors(tmp_path):
    with pytest.raises(XattnError, match="no tokenizer found"):
        load_tokenizers(tmp_path)
    (tmp_path / "spm.src.model").write_bytes(b"junk")
    with pytest.raises(XattnError, match="spm.tgt.model is missing"):
        load_tokenizers(tmp_path)
    with pytest.raises(XattnError, match="not a SentencePiece model"):
        Tokenizer.load(tmp_path / "spm.src.model")
    with pytest.raises(XattnError, match="no non-empty sentences"):
        train_sentencepiece(["", "  "], tmp_path / "x.model", vocab_size=100)
    with pytest.raises(XattnError, match="model_type"):
        train_sentencepiece(["a b"], tmp_path / "x.model", vocab_size=100, model_type="wordpiece")
