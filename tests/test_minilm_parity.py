"""The prompt gate's MiniLM encoder is transformers' model class on the shipped files, and it
gives the embeddings of the hand-written encoder it replaced and of sentence-transformers on the
same files. No skip: everything it needs is in requirements.txt and requirements-dev.txt, so it
runs in CI."""

from __future__ import annotations

import json

import pytest
import torch

from safety.embeddings import MAX_SEQ_LENGTH, MiniLMEmbedder, default_model_dir

TEXTS = [
    "a red circle on a blue background",
    "a decapitated body",
    "x",
    "un cable desnudo junto a una lámpara",
    "голый провод",
    "裸体の女性",
    "a very long prompt " * 120,  # past 256 tokens: truncated the same way
]


@pytest.fixture(scope="module")
def embedder():
    return MiniLMEmbedder()


def _reference(texts: list[str]) -> torch.Tensor:
    """The encoder this module used before (a 6-layer BERT written out in torch from
    model.safetensors, tokenised with `tokenizers`), kept here as the parity reference."""
    from safetensors.torch import load_file
    from tokenizers import Tokenizer

    F = torch.nn.functional
    folder = default_model_dir()
    tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    tok.no_padding()
    tok.enable_truncation(MAX_SEQ_LENGTH)
    w = load_file(str(folder / "model.safetensors"))
    cfg = json.loads((folder / "config.json").read_text())
    hidden, heads_n, eps = cfg["hidden_size"], cfg["num_attention_heads"], cfg.get("layer_norm_eps", 1e-12)

    def ln(x, p):
        return F.layer_norm(x, (hidden,), w[p + ".weight"], w[p + ".bias"], eps)

    def lin(x, p):
        return F.linear(x, w[p + ".weight"], w[p + ".bias"])

    out = []
    with torch.inference_mode():
        for e in tok.encode_batch(texts):
            ids = torch.tensor([e.ids])
            n = ids.shape[1]
            x = (F.embedding(ids, w["embeddings.word_embeddings.weight"])
                 + F.embedding(torch.arange(n)[None], w["embeddings.position_embeddings.weight"])
                 + w["embeddings.token_type_embeddings.weight"][0])
            x = ln(x, "embeddings.LayerNorm")
            d = hidden // heads_n
            for i in range(cfg["num_hidden_layers"]):
                p = f"encoder.layer.{i}."
                q, k, v = (lin(x, p + f"attention.self.{m}").view(1, n, heads_n, d).transpose(1, 2)
                           for m in ("query", "key", "value"))
                a = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(1, n, hidden)
                x = ln(x + lin(a, p + "attention.output.dense"), p + "attention.output.LayerNorm")
                x = ln(x + lin(F.gelu(lin(x, p + "intermediate.dense")), p + "output.dense"), p + "output.LayerNorm")
            out.append(F.normalize(x.mean(1), dim=1))
    return torch.cat(out)


def test_the_encoder_is_transformers_model_class_loaded_from_the_shipped_files(embedder):
    from transformers import BertModel, PreTrainedTokenizerBase

    assert isinstance(embedder.model, BertModel)
    assert isinstance(embedder.tokenizer, PreTrainedTokenizerBase)
    assert embedder.model_dir == default_model_dir()
    assert not embedder.model.training


def test_it_matches_the_hand_written_encoder_it_replaced(embedder):
    ref = _reference(TEXTS)
    assert float((embedder.encode(TEXTS) - ref).abs().max()) < 1e-4
    assert float((embedder.encode_packed(TEXTS[:4]) - ref[:4]).abs().max()) < 1e-4
    fast = embedder.encode(TEXTS, fast=True)
    assert float((fast * ref).sum(1).min()) > 0.999


def test_it_matches_sentence_transformers_on_the_same_files(embedder):
    from sentence_transformers import SentenceTransformer

    st = SentenceTransformer(str(default_model_dir()), device="cpu", local_files_only=True)
    ref = st.encode(TEXTS, convert_to_tensor=True, normalize_embeddings=True)
    assert float((embedder.encode(TEXTS) - ref).abs().max()) < 1e-4


def test_token_ids_are_the_word_pieces_without_the_special_tokens(embedder):
    ids = embedder.token_ids(["hello world", "a very long prompt " * 120])
    assert ids[0] == [7592, 2088]
    assert len(ids[1]) == MAX_SEQ_LENGTH - 2
