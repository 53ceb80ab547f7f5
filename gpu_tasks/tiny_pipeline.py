"""Write a tiny, randomly initialised text-to-image pipeline in diffusers' standard layout, of
any of the families the worker serves (FAMILIES): SD 1.x, SDXL, SD3, Flux, PixArt-Sigma.

It makes noise, not pictures; it exists so tests and a fresh `make run` exercise the real
loading and denoising code without downloads. Everything is built from configs, seeded; the
tokenizers are built locally (a word-level CLIP BPE, and a word-level T5-style tokenizer for the
families that use T5), the text encoders are transformers' CLIP and T5 classes from configs.
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


FAMILIES = ("sd15", "sdxl", "sd3", "flux", "pixart")


def build_t5_tokenizer(max_length: int = 32):
    """A word-level tokenizer with T5's special tokens (pad 0, eos 1, unk 2), built in memory."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "</s>": 1, "<unk>": 2}
    for word in WORDS:
        vocab.setdefault(word, len(vocab))
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.post_processor = processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", 1)])
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="</s>", unk_token="<unk>",
                                   model_max_length=max_length)


def _clip_config(vocab_size: int, hidden: int = 32, projection: int = 32):
    from transformers import CLIPTextConfig

    return CLIPTextConfig(vocab_size=vocab_size, hidden_size=hidden, intermediate_size=64, num_hidden_layers=2,
                          num_attention_heads=2, max_position_embeddings=32, bos_token_id=0, eos_token_id=1,
                          pad_token_id=1, projection_dim=projection)


def _t5_encoder(vocab_size: int, d_model: int = 32):
    from transformers import T5Config, T5EncoderModel

    return T5EncoderModel(T5Config(vocab_size=vocab_size, d_model=d_model, d_kv=8, d_ff=64, num_layers=2,
                                   num_heads=2, relative_attention_num_buckets=8, pad_token_id=0, eos_token_id=1))


def _vae(latent_channels: int, **extra):
    from diffusers import AutoencoderKL

    return AutoencoderKL(in_channels=3, out_channels=3, down_block_types=("DownEncoderBlock2D",) * 3,
                         up_block_types=("UpDecoderBlock2D",) * 3, block_out_channels=(16, 16, 32),
                         latent_channels=latent_channels, norm_num_groups=8, sample_size=64, **extra)


def write_tiny_family(out: Path, family: str, seed: int = 0) -> Path:
    """A tiny random pipeline of `family` (one of FAMILIES), saved under out. Latents are 1/4 of
    the image side (a 3-block VAE), so 64x64 images denoise 16x16 latents."""
    if family == "sd15":
        return write_tiny_pipeline(out, seed)
    import torch

    out = Path(out)
    torch.manual_seed(seed)
    with tempfile.TemporaryDirectory() as tmp:
        pipe = _BUILDERS[family](Path(tmp))
        pipe.save_pretrained(out, safe_serialization=True)
    return out


def _build_sdxl(tmp: Path):
    from diffusers import EulerDiscreteScheduler, StableDiffusionXLPipeline, UNet2DConditionModel
    from transformers import CLIPTextModel, CLIPTextModelWithProjection

    tokenizer = build_tokenizer(tmp / "t1")
    tokenizer_2 = build_tokenizer(tmp / "t2")
    text_encoder = CLIPTextModel(_clip_config(len(tokenizer)))
    text_encoder_2 = CLIPTextModelWithProjection(_clip_config(len(tokenizer_2)))
    unet = UNet2DConditionModel(
        sample_size=16, in_channels=4, out_channels=4, block_out_channels=(32, 64), layers_per_block=1,
        down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"), up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"),
        attention_head_dim=(2, 4), use_linear_projection=True, addition_embed_type="text_time",
        addition_time_embed_dim=8, transformer_layers_per_block=(1, 1), projection_class_embeddings_input_dim=80,
        cross_attention_dim=64, norm_num_groups=8,
    )
    scheduler = EulerDiscreteScheduler(beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear",
                                       timestep_spacing="leading", steps_offset=1)
    return StableDiffusionXLPipeline(vae=_vae(4, scaling_factor=0.13025), text_encoder=text_encoder,
                                     text_encoder_2=text_encoder_2, tokenizer=tokenizer, tokenizer_2=tokenizer_2,
                                     unet=unet, scheduler=scheduler, force_zeros_for_empty_prompt=True)


def _build_sd3(tmp: Path):
    from diffusers import FlowMatchEulerDiscreteScheduler, SD3Transformer2DModel, StableDiffusion3Pipeline
    from transformers import CLIPTextModelWithProjection

    tokenizer = build_tokenizer(tmp / "t1")
    tokenizer_2 = build_tokenizer(tmp / "t2")
    tokenizer_3 = build_t5_tokenizer()
    transformer = SD3Transformer2DModel(sample_size=16, patch_size=2, in_channels=16, num_layers=2,
                                        attention_head_dim=8, num_attention_heads=4, joint_attention_dim=32,
                                        caption_projection_dim=32, pooled_projection_dim=64, out_channels=16,
                                        pos_embed_max_size=32)
    return StableDiffusion3Pipeline(
        transformer=transformer, scheduler=FlowMatchEulerDiscreteScheduler(shift=3.0),
        vae=_vae(16, scaling_factor=1.5305, shift_factor=0.0609, use_quant_conv=False, use_post_quant_conv=False),
        text_encoder=CLIPTextModelWithProjection(_clip_config(len(tokenizer))), tokenizer=tokenizer,
        text_encoder_2=CLIPTextModelWithProjection(_clip_config(len(tokenizer_2))), tokenizer_2=tokenizer_2,
        text_encoder_3=_t5_encoder(len(tokenizer_3)), tokenizer_3=tokenizer_3,
    )


def _build_flux(tmp: Path):
    from diffusers import FlowMatchEulerDiscreteScheduler, FluxPipeline, FluxTransformer2DModel
    from transformers import CLIPTextModel

    tokenizer = build_tokenizer(tmp / "t1")
    tokenizer_2 = build_t5_tokenizer()
    transformer = FluxTransformer2DModel(patch_size=1, in_channels=64, num_layers=1, num_single_layers=1,
                                         attention_head_dim=16, num_attention_heads=2, joint_attention_dim=32,
                                         pooled_projection_dim=32, guidance_embeds=True, axes_dims_rope=(4, 4, 8))
    scheduler = FlowMatchEulerDiscreteScheduler(shift=3.0, use_dynamic_shifting=True, base_image_seq_len=256,
                                                max_image_seq_len=4096, base_shift=0.5, max_shift=1.15)
    return FluxPipeline(
        transformer=transformer, scheduler=scheduler,
        vae=_vae(16, scaling_factor=0.3611, shift_factor=0.1159, use_quant_conv=False, use_post_quant_conv=False),
        text_encoder=CLIPTextModel(_clip_config(len(tokenizer))), tokenizer=tokenizer,
        text_encoder_2=_t5_encoder(len(tokenizer_2)), tokenizer_2=tokenizer_2,
    )


def _build_pixart(tmp: Path):
    from diffusers import DPMSolverMultistepScheduler, PixArtSigmaPipeline, PixArtTransformer2DModel

    tokenizer = build_t5_tokenizer()
    transformer = PixArtTransformer2DModel(sample_size=16, num_layers=2, patch_size=2, attention_head_dim=8,
                                           num_attention_heads=3, caption_channels=32, in_channels=4,
                                           cross_attention_dim=24, out_channels=8, attention_bias=True,
                                           activation_fn="gelu-approximate", num_embeds_ada_norm=1000,
                                           norm_type="ada_norm_single", norm_elementwise_affine=False, norm_eps=1e-6)
    scheduler = DPMSolverMultistepScheduler(beta_start=0.0001, beta_end=0.02, beta_schedule="linear")
    return PixArtSigmaPipeline(tokenizer=tokenizer, text_encoder=_t5_encoder(len(tokenizer)), vae=_vae(4),
                               transformer=transformer, scheduler=scheduler)


_BUILDERS = {"sdxl": _build_sdxl, "sd3": _build_sd3, "flux": _build_flux, "pixart": _build_pixart}


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
