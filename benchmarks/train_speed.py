"""Training throughput: xattn against Hugging Face MarianMTModel of the same size, in one run.

Both models: d=256, 3+3 layers, 4 heads, FFN 1024, ReLU, post-LN, sinusoidal positions, scaled and
shared embeddings, the same joint SentencePiece vocabulary (8000) trained on Multi30k de-en.
Both train with the same step: autocast (bf16 by default), label-smoothed cross-entropy, backward,
gradient clipping, AdamW. Throughput = non-padding target tokens per second.

(a) identical padded batches (xattn's token batches, 4096 tokens), sides alternating, median of repeats;
    HF both with its default SDPA attention and with its eager attention; the faster one is the peer;
(b) one Multi30k epoch with each side's own batching (HF with its faster attention from (a)): xattn token-budget batches (4096 tokens,
    length-bucketed), HF 64 shuffled sentences per batch padded to the longest (as a HF Trainer
    with DataCollatorForSeq2Seq does);
(c) xattn alone, bf16 autocast against float32 on the identical batches of (a): what train.amp=auto buys.

usage: python benchmarks/train_speed.py [--amp bf16|none] [--batches 20] [--repeats 3] [--no-epoch]
"""
from __future__ import annotations

import argparse
import random
import statistics
import tempfile
import time

import torch
from common import data_dir, write_result
from transformers import MarianConfig, MarianMTModel

import xattn
from xattn.data import TokenBatchSampler, tokenize_pairs
from xattn.datasets import multi30k
from xattn.tokenizer import train_tokenizers
from xattn.losses import label_smoothed_loss

D, LAYERS, HEADS, FFN, VOCAB = 256, 3, 4, 1024, 8000


def build_models(vocab: int, hf_attention: str = "sdpa"):
    torch.manual_seed(0)
    ours = xattn.Transformer(xattn.ModelConfig(src_vocab_size=vocab, tgt_vocab_size=vocab, d_model=D, n_heads=HEADS,
                                               n_encoder_layers=LAYERS, n_decoder_layers=LAYERS, d_ff=FFN, dropout=0.1,
                                               share_embeddings=True, tie_output=True))
    hf_cfg = MarianConfig(vocab_size=vocab, d_model=D, encoder_layers=LAYERS, decoder_layers=LAYERS,
                          encoder_attention_heads=HEADS, decoder_attention_heads=HEADS, encoder_ffn_dim=FFN,
                          decoder_ffn_dim=FFN, activation_function="relu", dropout=0.1, attention_dropout=0.0,
                          activation_dropout=0.0, scale_embedding=True, share_encoder_decoder_embeddings=True,
                          max_position_embeddings=512, pad_token_id=0, eos_token_id=2, decoder_start_token_id=1,
                          attn_implementation=hf_attention)
    theirs = MarianMTModel(hf_cfg)
    return ours, theirs


def forward_xattn(model, batch):
    return model(batch.src, batch.tgt_in).logits


def forward_hf(model, batch):
    return model(input_ids=batch.src, attention_mask=batch.src.ne(0), decoder_input_ids=batch.tgt_in,
                 decoder_attention_mask=batch.tgt_in.ne(0)).logits


class Stepper:
    """The training step both sides share: autocast forward, smoothed loss, backward, clip, AdamW."""

    def __init__(self, model, forward, amp: torch.dtype | None):
        self.model, self.forward, self.amp = model.train(), forward, amp
        self.optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.98))

    def __call__(self, batch) -> int:
        with torch.autocast("cpu", dtype=self.amp or torch.float32, enabled=self.amp is not None):
            logits = self.forward(self.model, batch)
            loss, _ = label_smoothed_loss(logits, batch.tgt_out, 0, 0.1)
        (loss / batch.n_tgt_tokens).backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return batch.n_tgt_tokens


def throughput(step: Stepper, batches) -> float:
    start, tokens = time.perf_counter(), 0
    for batch in batches:
        tokens += step(batch)
    return tokens / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--amp", choices=["bf16", "none"], default="bf16")
    parser.add_argument("--batches", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--no-epoch", action="store_true", help="skip (b)")
    args = parser.parse_args()
    amp = torch.bfloat16 if args.amp == "bf16" else None

    pairs = multi30k("de", "en", "train", data_dir())
    with tempfile.TemporaryDirectory() as tmp:
        tokenizers = train_tokenizers([s for s, _ in pairs], [t for _, t in pairs], tmp, VOCAB, joint=True)
    corpus = tokenize_pairs(pairs, tokenizers)
    ours, theirs = build_models(tokenizers.src.vocab_size)
    eager = build_models(tokenizers.src.vocab_size, "eager")[1]
    n_params = {"xattn": sum(p.numel() for p in ours.parameters()),
                "hf_marian": sum(p.numel() for p in theirs.parameters() if p.requires_grad)}
    steppers = {"xattn": Stepper(ours, forward_xattn, amp), "hf_marian_sdpa": Stepper(theirs, forward_hf, amp),
                "hf_marian_eager": Stepper(eager, forward_hf, amp)}

    sampler = TokenBatchSampler(corpus.src_lengths(), corpus.tgt_lengths(), 4096, shuffle=True, seed=1)
    token_batches = [corpus.collate(ix) for ix in sampler.batches(0)]
    same = token_batches[: args.batches]
    for step in steppers.values():
        throughput(step, same[:3])  # warm up
    rates = {name: [] for name in steppers}
    for _ in range(args.repeats):
        for name, step in steppers.items():
            rates[name].append(throughput(step, same))
    a = {name: round(statistics.median(r), 1) for name, r in rates.items()}
    best_hf = max(("hf_marian_sdpa", "hf_marian_eager"), key=lambda name: a[name])
    result = {"amp": args.amp, "parameters": n_params,
              "a_identical_batches": {"batches": len(same), "repeats": args.repeats, "tokens_per_s": a,
                                      "all_runs": rates, "hf_best": best_hf,
                                      "ratio": round(a["xattn"] / a[best_hf], 3)}}
    print("(a)", result["a_identical_batches"])

    other = None if amp is None else Stepper(build_models(tokenizers.src.vocab_size)[0], forward_xattn, None)
    if other is not None:
        throughput(other, same[:3])
        fp32 = [throughput(other, same) for _ in range(args.repeats)]
        mixed = statistics.median(rates["xattn"])
        result["c_xattn_bf16_vs_fp32"] = {"tokens_per_s": {"bf16": round(mixed, 1),
                                                           "fp32": round(statistics.median(fp32), 1)},
                                          "ratio": round(mixed / statistics.median(fp32), 3)}
        print("(c)", result["c_xattn_bf16_vs_fp32"])

    if not args.no_epoch:
        order = list(range(len(corpus)))
        random.Random(1).shuffle(order)
        hf_batches = [corpus.collate(order[i:i + 64]) for i in range(0, len(order), 64)]
        b = {"xattn": throughput(steppers["xattn"], token_batches),
             "hf_marian": throughput(steppers[best_hf], hf_batches)}
        pad = {"xattn": sampler.padding_fraction(sampler.batches(0)),
               "hf_marian": 1 - sum(len(corpus.src[i]) + len(corpus.tgt[i]) + 2 for i in order)
               / sum(len(hb) * (hb.src.shape[1] + hb.tgt_in.shape[1]) for hb in hf_batches)}
        result["b_one_epoch"] = {"batches": {"xattn": len(token_batches), "hf_marian": len(hf_batches)},
                                 "padding_fraction": {k: round(v, 3) for k, v in pad.items()},
                                 "tokens_per_s": {k: round(v, 1) for k, v in b.items()},
                                 "ratio": round(b["xattn"] / b["hf_marian"], 3)}
        print("(b)", result["b_one_epoch"])
    print("->", write_result(f"train_speed_{args.amp}", result))


if __name__ == "__main__":
    main()
