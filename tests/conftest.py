import os
from pathlib import Path

import pytest
import torch

import xattn

SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
MULTI30K = Path(os.environ.get("XATTN_DATA", SHARED_DATA / "multi30k"))


def tiny_config(**overrides) -> xattn.ModelConfig:
    base = dict(src_vocab_size=40, tgt_vocab_size=50, d_model=16, n_heads=2, n_encoder_layers=2,
                n_decoder_layers=2, d_ff=32, dropout=0.0)
    return xattn.ModelConfig(**(base | overrides))


@pytest.fixture
def tiny_model():
    torch.manual_seed(0)
    return xattn.Transformer(tiny_config()).eval()


# Tests use tiny models; one thread avoids contention on small machines and keeps results repeatable.
torch.set_num_threads(1)
