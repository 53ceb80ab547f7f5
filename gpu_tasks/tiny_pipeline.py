"""Write a tiny, randomly initialised text-to-image pipeline in diffusers' standard layout.

It makes noise, not pictures; it exists so tests and a fresh `make run` exercise the real
loading and denoising code without downloads. Everything is built from configs, seeded.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

WORDS = (
    "a an the and on of in with background small large big tiny red green blue yellow white black "
    "purple orange pink grey gray brown circle square triangle star heart shape shapes cat dog "
    "photo picture painting of portrait landscape"
).split()


def _write_tokenizer_files(folder: Path) -> None:
    # A word-level vocabulary: every character and known word is a token, no merges needed
    # beyond the words themselves. CLIPTokenizer appends </w> to word-final pieces.
    vocab: dict[str, int] = {"<|startoftext|>": 0, "<|endoftext|>": 1}
    for ch in "abcdefghijklmnopqrstuvwxyz0123456789.,!?'-":
        vocab.setdefault(ch, len(vocab))
        vocab.setdefault(ch + "</w>", len(vocab))
    merges: list[str] = []
    for word in WORDS:
        # Build the merge chain that turns the word's characters into one token.
        pieces = list(word[:-1]) + [word[-1] + "</w>"]
        while len(pieces) > 1:
            a, b = pieces[0], pieces[1]
            merged = a + b
            if f"{a} {b}" not in merges:
                merges.append(f"{a} {b}")
            vocab.setdefault(merged, len(vocab))
            pieces = [merged] + pieces[2:]
    (folder / "vocab.json").write_text(json.dumps(vocab))
    (folder / "merges.txt").write_text("#version: 0.2\n" + "\n".join(merges) + "\n")


def build_tokenizer(folder: Path):
    from transformers import CLIPTokenizer

    folder.mkdir(parents=True, exist_ok=True)
    _write_tokenizer_files(folder)
    return CLIPTokenizer(
        vocab=str(folder / "vocab.json"),
        merges=str(folder / "merges.txt"),
        unk_token="<|endoftext|>",
        bos_token="<|startoftext|>",
        eos_token="<|endoftext|>",
        pad_token="<|endoftext|>",
        model_max_length=32,
    )


def write_tiny_pipeline(out: Path, seed: int = 0) -> Path:
    import torch
    from diffusers import AutoencoderKL, DDIMScheduler, StableDiffusionPipeline, UNet2DConditionModel
    from transformers import CLIPTextConfig, CLIPTextModel

    out = Path(out)
    torch.manual_seed(seed)
    with tempfile.TemporaryDirectory() as tmp:
        tokenizer = build_tokenizer(Path(tmp))
        text_encoder = CLIPTextModel(
            CLIPTextConfig(
                vocab_size=len(tokenizer),
                hidden_size=32,
                intermediate_size=64,
                num_hidden_layers=2,
                num_attention_heads=2,
                max_position_embeddings=32,
                bos_token_id=0,
                eos_token_id=1,
                pad_token_id=1,
            )
        )
        unet = UNet2DConditionModel(
            sample_size=16,
            in_channels=4,
            out_channels=4,
            block_out_channels=(32, 64),
            layers_per_block=1,
            down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
            up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"),
            cross_attention_dim=32,
            attention_head_dim=8,
            norm_num_groups=8,
        )
        vae = AutoencoderKL(
            in_channels=3,
            out_channels=3,
            down_block_types=("DownEncoderBlock2D",) * 3,
            up_block_types=("UpDecoderBlock2D",) * 3,
            block_out_channels=(16, 16, 32),
            latent_channels=4,
            norm_num_groups=8,
            sample_size=64,
        )
        scheduler = DDIMScheduler(
            beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear", clip_sample=False,
            set_alpha_to_one=False, steps_offset=1,
        )
        pipe = StableDiffusionPipeline(
            vae=vae,
            text_encoder=text_encoder,
            tokenizer=tokenizer,
            unet=unet,
            scheduler=scheduler,
            safety_checker=None,
            feature_extractor=None,
            requires_safety_checker=False,
        )
        pipe.save_pretrained(out, safe_serialization=True)  # type: ignore[attr-defined]  # diffusers loads lazily
    return out


SHIPPED_MODEL = Path(__file__).resolve().parent.parent / "models" / "shapes-v1"


def model_for_bench(explicit: str, scratch: Path) -> Path:
    """The model a benchmark measures: the one asked for, else the shipped model, else a tiny
    random pipeline written under scratch."""
    if explicit:
        return Path(explicit)
    if (SHIPPED_MODEL / "model_index.json").exists():
        return SHIPPED_MODEL
    return write_tiny_pipeline(Path(scratch) / "tiny-random")
