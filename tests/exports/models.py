"""Small torch models to export: HuggingFace transformers from configs, plain-torch CNNs.

Every builder makes its model from a config with seeded random weights (no download),
perturbs every parameter and buffer (default LayerNorm/BatchNorm weights of ones and zeros
would otherwise be folded away by the exporters, hiding the patterns real models have) and
returns the module in eval mode with example inputs.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # configs only: nothing is ever downloaded

import torch
from torch import nn

from onnxfuse.zoo.models import Transformer

SEQ = 8
BATCH = 2
IMAGE = 32


@dataclass(frozen=True)
class ModelSpec:
    """One model to export, and what the anchors need to know about it."""

    name: str
    family: str  # a key of BUILDERS: bert, albert, gpt2, vit, t5, llama, swin, cnn...
    config: dict[str, Any]  # everything the builder reads; part of the cache key
    # onnxruntime.transformers.optimizer model_type; None: not a transformer
    ort_model_type: str | None
    num_heads: int = 0
    hidden_size: int = 0
    notes: str = ""
    # input name -> axes that are dynamic (axis -> dim name)
    dynamic: dict[str, dict[int, str]] = field(default_factory=dict)
    # the exporters ("legacy", "dynamo") that can export it; None: every one
    exporters: tuple[str, ...] | None = None

    @property
    def transformer(self) -> Transformer | None:
        """What onnxruntime's transformers optimizer is told (None: not a transformer)."""
        if self.ort_model_type is None:
            return None
        return Transformer(self.ort_model_type, self.num_heads, self.hidden_size)


@dataclass
class Built:
    module: nn.Module
    inputs: dict[str, torch.Tensor]  # in forward() order
    outputs: list[str]


def _perturb(module: nn.Module, seed: int) -> None:
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in module.parameters():
            noise = torch.randn(parameter.shape, generator=generator) * 0.05
            parameter.add_(noise.to(parameter.dtype))
        for name, buffer in module.named_buffers():
            if name.endswith("running_var"):
                buffer.copy_(0.5 + torch.rand(buffer.shape, generator=generator))
            elif name.endswith("running_mean"):
                buffer.copy_(torch.randn(buffer.shape, generator=generator) * 0.1)


def _token_inputs(
    vocab: int, mask: bool, seed: int, batch: int = BATCH, seq: int = SEQ
) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    inputs = {"input_ids": torch.randint(0, vocab, (batch, seq), generator=generator)}
    if mask:
        attention_mask = torch.ones(batch, seq, dtype=torch.int64)
        attention_mask[batch - 1, seq - 3 :] = 0  # padding in the last sequence: the mask matters
        inputs["attention_mask"] = attention_mask
    return inputs


def _sizes(c: dict[str, Any]) -> tuple[int, int]:
    """(batch, seq): the test set's defaults unless a bench-size config sets them."""
    return c.get("batch", BATCH), c.get("seq", SEQ)


class _HiddenState(nn.Module):
    """Calls a HuggingFace model with keyword inputs and returns one tensor."""

    def __init__(self, model: nn.Module, names: list[str], output: str) -> None:
        super().__init__()
        self.model, self.names, self.output = model, names, output

    def forward(self, *args: torch.Tensor) -> torch.Tensor:
        result = self.model(**dict(zip(self.names, args)), use_cache=False)
        return getattr(result, self.output)


def _hf(model: nn.Module, inputs: dict[str, torch.Tensor], output: str, seed: int) -> Built:
    _perturb(model, seed)
    wrapper = _HiddenState(model, list(inputs), output).eval()
    model.eval()
    return Built(wrapper, inputs, [output])


def build_bert(c: dict[str, Any]) -> Built:
    from transformers import BertConfig, BertModel

    torch.manual_seed(c["seed"])
    config = BertConfig(
        vocab_size=c["vocab"],
        hidden_size=c["hidden"],
        num_hidden_layers=c["layers"],
        num_attention_heads=c["heads"],
        intermediate_size=c["hidden"] * 2,
        max_position_embeddings=max(64, _sizes(c)[1]),
        attn_implementation=c["attention"],
    )
    inputs = _token_inputs(c["vocab"], c["mask"], c["seed"], *_sizes(c))
    return _hf(BertModel(config, add_pooling_layer=False), inputs, "last_hidden_state", c["seed"])


def build_albert(c: dict[str, Any]) -> Built:
    """ALBERT: every layer runs the same weights, so each weight has one reader per layer."""
    from transformers import AlbertConfig, AlbertModel

    torch.manual_seed(c["seed"])
    config = AlbertConfig(
        vocab_size=c["vocab"],
        embedding_size=c["hidden"] // 2,
        hidden_size=c["hidden"],
        num_hidden_layers=c["layers"],
        num_attention_heads=c["heads"],
        intermediate_size=c["hidden"] * 2,
        max_position_embeddings=64,
        attn_implementation=c["attention"],
    )
    inputs = _token_inputs(c["vocab"], c["mask"], c["seed"], *_sizes(c))
    model = AlbertModel(config, add_pooling_layer=False)
    return _hf(model, inputs, "last_hidden_state", c["seed"])


def _image_encoder(config_class, model_class, c: dict[str, Any]) -> Built:
    """A ViT-like encoder (ViT, BEiT) on a batch of random images, without its pooler."""
    torch.manual_seed(c["seed"])
    config = config_class(
        hidden_size=c["hidden"],
        num_hidden_layers=c["layers"],
        num_attention_heads=c["heads"],
        intermediate_size=c["hidden"] * 2,
        image_size=IMAGE,
        patch_size=8,
        attn_implementation=c["attention"],
    )
    generator = torch.Generator().manual_seed(c["seed"])
    pixels = torch.randn(BATCH, 3, IMAGE, IMAGE, generator=generator)
    model = model_class(config, add_pooling_layer=False)
    return _hf(model, {"pixel_values": pixels}, "last_hidden_state", c["seed"])


def build_vit(c: dict[str, Any]) -> Built:
    from transformers import ViTConfig, ViTModel

    return _image_encoder(ViTConfig, ViTModel, c)


def build_t5(c: dict[str, Any]) -> Built:
    from transformers import T5Config, T5EncoderModel, T5ForConditionalGeneration

    torch.manual_seed(c["seed"])
    config = T5Config(
        vocab_size=c["vocab"],
        d_model=c["hidden"],
        d_kv=c["hidden"] // c["heads"],
        d_ff=c["hidden"] * 2,
        num_layers=c["layers"],
        num_decoder_layers=c["layers"],
        num_heads=c["heads"],
        relative_attention_num_buckets=8,
        attn_implementation=c["attention"],
    )
    inputs = _token_inputs(c["vocab"], True, c["seed"], *_sizes(c))
    if c["decoder"]:
        generator = torch.Generator().manual_seed(c["seed"] + 1)
        inputs["decoder_input_ids"] = torch.randint(
            0, c["vocab"], (BATCH, SEQ), generator=generator
        )
        return _hf(T5ForConditionalGeneration(config), inputs, "logits", c["seed"])
    return _hf(T5EncoderModel(config), inputs, "last_hidden_state", c["seed"])


def build_llama(c: dict[str, Any]) -> Built:
    from transformers import LlamaConfig, LlamaModel

    torch.manual_seed(c["seed"])
    config = LlamaConfig(
        vocab_size=c["vocab"],
        hidden_size=c["hidden"],
        intermediate_size=c["hidden"] * 2,
        num_hidden_layers=c["layers"],
        num_attention_heads=c["heads"],
        num_key_value_heads=c["kv_heads"],
        max_position_embeddings=64,
        attn_implementation=c["attention"],
    )
    inputs = _token_inputs(c["vocab"], True, c["seed"], *_sizes(c))
    return _hf(LlamaModel(config), inputs, "last_hidden_state", c["seed"])


class _Gpt2(nn.Module):
    """GPT-2 LM head; with `past`, key/value caches in and out as plain tensors."""

    def __init__(self, model: nn.Module, layers: int, past: bool) -> None:
        super().__init__()
        self.model, self.layers, self.past = model, layers, past

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, *past: torch.Tensor):
        if not self.past:
            return self.model(
                input_ids=input_ids, attention_mask=attention_mask, use_cache=False
            ).logits
        from transformers import DynamicCache

        cache = DynamicCache()
        for layer in range(self.layers):
            cache.update(past[2 * layer], past[2 * layer + 1], layer)
        result = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            cache=cache,
            use_cache=True,
        )
        present = []
        returned = getattr(result, "cache", None) or result.past_key_values
        for layer in returned.layers:
            present += [layer.keys, layer.values]
        return (result.logits, *present)


class _CausalLm(nn.Module):
    """A causal LM with its KV cache in and out as plain tensors, named as onnxruntime-genai's
    model builder names them (past_key_values.{i}.key, present.{i}.value), so that one set
    of feeds runs the export and the builder's model."""

    def __init__(self, model: nn.Module, layers: int) -> None:
        super().__init__()
        self.model, self.layers = model, layers

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        position_ids: torch.Tensor,
        *past: torch.Tensor,
    ):
        from transformers import DynamicCache

        cache = DynamicCache()
        for layer in range(self.layers):
            cache.update(past[2 * layer], past[2 * layer + 1], layer)
        result = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            cache=cache,
            use_cache=True,
        )
        present = []
        returned = getattr(result, "cache", None) or result.past_key_values
        for layer in returned.layers:
            present += [layer.keys, layer.values]
        return (result.logits, *present)


# HuggingFace (config, model) class names of the decoder families bench/llm.py measures.
CAUSAL_LM_CLASSES = {
    "llama": ("LlamaConfig", "LlamaForCausalLM"),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM"),
    "phi3": ("Phi3Config", "Phi3ForCausalLM"),
    "mistral": ("MistralConfig", "MistralForCausalLM"),
    "gemma": ("GemmaConfig", "GemmaForCausalLM"),
}


def causal_lm_config(c: dict[str, Any]):
    """The HuggingFace config of a causal-LM spec (also saved for onnxruntime-genai's builder)."""
    import transformers

    config_class = getattr(transformers, CAUSAL_LM_CLASSES[c["arch"]][0])
    # Phi-3 scales its rotary angles (LongRoPE) past an original length of 4096, which the
    # tiny model's 256 positions would then be; other configs have no such field.
    extra = {"original_max_position_embeddings": c["max_positions"]} if c["arch"] == "phi3" else {}
    return config_class(
        **extra,
        vocab_size=c["vocab"],
        hidden_size=c["hidden"],
        intermediate_size=c["hidden"] * 2,
        num_hidden_layers=c["layers"],
        num_attention_heads=c["heads"],
        num_key_value_heads=c["kv_heads"],
        head_dim=c["hidden"] // c["heads"],
        max_position_embeddings=c["max_positions"],
        attn_implementation=c["attention"],
        # Phi-3's defaults (32000) lie outside the tiny vocabulary
        pad_token_id=c["pad"],
        bos_token_id=c["pad"] + 1,
        eos_token_id=c["pad"] + 2,
    )


def causal_lm_inputs(c: dict[str, Any], batch: int, seq: int, past: int, seed: int = 0):
    """input_ids, attention_mask (past + seq, the last sequence left-padded by 2), position_ids
    (counted from the first unpadded token, as HuggingFace's generate computes them) and a
    random past KV cache."""
    generator = torch.Generator().manual_seed(seed)
    head_dim = c["hidden"] // c["heads"]
    inputs = {"input_ids": torch.randint(0, c["vocab"], (batch, seq), generator=generator)}
    mask = torch.ones(batch, past + seq, dtype=torch.int64)
    mask[batch - 1, :2] = 0
    inputs["attention_mask"] = mask
    inputs["position_ids"] = (mask.cumsum(-1) - 1).clamp(min=0)[:, past:]
    for layer in range(c["layers"]):
        for kind in ("key", "value"):
            inputs[f"past_key_values.{layer}.{kind}"] = torch.randn(
                batch, c["kv_heads"], past, head_dim, generator=generator
            )
    return inputs


def build_causal_lm(c: dict[str, Any]) -> Built:
    import transformers

    torch.manual_seed(c["seed"])
    model = getattr(transformers, CAUSAL_LM_CLASSES[c["arch"]][1])(causal_lm_config(c))
    _perturb(model, c["seed"])
    model.eval()
    inputs = causal_lm_inputs(c, batch=2, seq=4, past=8, seed=c["seed"])
    outputs = ["logits"] + [
        f"present.{layer}.{kind}" for layer in range(c["layers"]) for kind in ("key", "value")
    ]
    return Built(_CausalLm(model, c["layers"]).eval(), inputs, outputs)


def build_gpt2(c: dict[str, Any]) -> Built:
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(c["seed"])
    config = GPT2Config(
        vocab_size=c["vocab"],
        n_embd=c["hidden"],
        n_layer=c["layers"],
        n_head=c["heads"],
        n_positions=64,
        bos_token_id=0,  # the default 50256 is outside the small vocabulary
        eos_token_id=0,
        attn_implementation=c["attention"],
    )
    model = GPT2LMHeadModel(config)
    _perturb(model, c["seed"])
    model.eval()
    inputs = _token_inputs(c["vocab"], True, c["seed"], *_sizes(c))
    outputs = ["logits"]
    if c["past"]:
        past_len = 5
        generator = torch.Generator().manual_seed(c["seed"] + 1)
        head = c["hidden"] // c["heads"]
        inputs["attention_mask"] = torch.ones(BATCH, past_len + SEQ, dtype=torch.int64)
        for layer in range(c["layers"]):
            for kind in ("key", "value"):
                inputs[f"past_{kind}_{layer}"] = torch.randn(
                    BATCH, c["heads"], past_len, head, generator=generator
                )
                outputs.append(f"present_{kind}_{layer}")
    return Built(_Gpt2(model, c["layers"], c["past"]).eval(), inputs, outputs)


class _Call(nn.Module):
    """Calls a HuggingFace module (an encoder: no cache) with keyword inputs, one tensor out."""

    def __init__(self, model: nn.Module, names: list[str], output: str) -> None:
        super().__init__()
        self.model, self.names, self.output = model, names, output

    def forward(self, *args: torch.Tensor) -> torch.Tensor:
        return getattr(self.model(**dict(zip(self.names, args))), self.output)


def build_whisper(c: dict[str, Any]) -> Built:
    """Whisper's audio encoder: two Conv1d over mel features, then pre-LN self-attention
    blocks without mask; the K projection has no bias, Q is scaled after its bias."""
    from transformers import WhisperConfig, WhisperModel

    torch.manual_seed(c["seed"])
    config = WhisperConfig(
        vocab_size=c["vocab"],
        d_model=c["hidden"],
        encoder_layers=c["layers"],
        decoder_layers=c["layers"],
        encoder_attention_heads=c["heads"],
        decoder_attention_heads=c["heads"],
        encoder_ffn_dim=c["hidden"] * 2,
        decoder_ffn_dim=c["hidden"] * 2,
        num_mel_bins=c["mel"],
        max_source_positions=c["frames"],
        max_target_positions=64,
        pad_token_id=1,  # the defaults (50256, 50257) are outside the small vocabulary
        bos_token_id=0,
        eos_token_id=0,
        decoder_start_token_id=0,
        attn_implementation=c["attention"],
    )
    generator = torch.Generator().manual_seed(c["seed"])
    features = torch.randn(BATCH, c["mel"], 2 * c["frames"], generator=generator)
    inputs = {"input_features": features}
    if c.get("decoder"):
        # Encoder and decoder: causal self-attention, then cross-attention over the
        # encoder's output, whose K projection has no bias either.
        inputs["decoder_input_ids"] = torch.randint(
            0, c["vocab"], (BATCH, SEQ), generator=generator
        )
        return _hf(WhisperModel(config), inputs, "last_hidden_state", c["seed"])
    model = WhisperModel(config).get_encoder()
    _perturb(model, c["seed"])
    model.eval()
    return Built(
        _Call(model, list(inputs), "last_hidden_state").eval(), inputs, ["last_hidden_state"]
    )


def build_opt(c: dict[str, Any]) -> Built:
    """OPT: pre-LN decoder blocks with the causal and padding mask; Q scaled after its bias."""
    from transformers import OPTConfig, OPTModel

    torch.manual_seed(c["seed"])
    config = OPTConfig(
        vocab_size=c["vocab"],
        hidden_size=c["hidden"],
        word_embed_proj_dim=c["hidden"],
        num_hidden_layers=c["layers"],
        num_attention_heads=c["heads"],
        ffn_dim=c["hidden"] * 2,
        max_position_embeddings=64,
        pad_token_id=1,
        bos_token_id=0,
        eos_token_id=0,
        attn_implementation=c["attention"],
    )
    inputs = _token_inputs(c["vocab"], True, c["seed"], *_sizes(c))
    return _hf(OPTModel(config), inputs, "last_hidden_state", c["seed"])


def build_beit(c: dict[str, Any]) -> Built:
    """BEiT: ViT-like pre-LN blocks with layer scale; its K projection has no bias."""
    from transformers import BeitConfig, BeitModel

    return _image_encoder(BeitConfig, BeitModel, c)


def build_segformer(c: dict[str, Any]) -> Built:
    """SegFormer's Mix Transformer encoder: efficient self-attention whose K and V come
    from a strided-conv reduction of the sequence (sr_ratio), so Q, K, V read two inputs."""
    from transformers import SegformerConfig, SegformerModel

    torch.manual_seed(c["seed"])
    config = SegformerConfig(
        num_encoder_blocks=2,
        depths=[1, 1],
        sr_ratios=[2, 1],
        hidden_sizes=[c["hidden"] // 2, c["hidden"]],
        patch_sizes=[7, 3],
        strides=[4, 2],
        num_attention_heads=[1, c["heads"]],
        mlp_ratios=[2, 2],
        decoder_hidden_size=c["hidden"],
        attn_implementation=c["attention"],
    )
    generator = torch.Generator().manual_seed(c["seed"])
    pixels = torch.randn(BATCH, 3, IMAGE, IMAGE, generator=generator)
    return _hf(SegformerModel(config), {"pixel_values": pixels}, "last_hidden_state", c["seed"])


def _encoder(model: nn.Module, inputs: dict[str, torch.Tensor], seed: int) -> Built:
    """An encoder called without use_cache (which these models do not take)."""
    _perturb(model, seed)
    model.eval()
    names = list(inputs)
    return Built(_Call(model, names, "last_hidden_state").eval(), inputs, ["last_hidden_state"])


def build_bert_family(c: dict[str, Any]) -> Built:
    """BERT-like encoders whose embeddings differ from BERT's: RoBERTa counts positions
    from its padding index over the tokens that are not padding, DistilBERT has no token
    types, ELECTRA projects a smaller embedding up to the hidden size."""
    import transformers

    torch.manual_seed(c["seed"])
    sizes = {
        "vocab_size": c["vocab"],
        "num_hidden_layers": c["layers"],
        "num_attention_heads": c["heads"],
        "intermediate_size": c["hidden"] * 2,
        "attn_implementation": c["attention"],
    }
    arch = c["arch"]
    if arch == "roberta":
        config = transformers.RobertaConfig(
            hidden_size=c["hidden"], max_position_embeddings=66, pad_token_id=1, **sizes
        )
        model = transformers.RobertaModel(config, add_pooling_layer=False)
    elif arch == "electra":
        config = transformers.ElectraConfig(
            hidden_size=c["hidden"], embedding_size=c["hidden"] // 2, **sizes
        )
        model = transformers.ElectraModel(config)
    else:
        config = transformers.DistilBertConfig(
            vocab_size=c["vocab"],
            dim=c["hidden"],
            n_layers=c["layers"],
            n_heads=c["heads"],
            hidden_dim=c["hidden"] * 2,
            attn_implementation=c["attention"],
        )
        model = transformers.DistilBertModel(config)
    inputs = _token_inputs(c["vocab"], c["mask"], c["seed"], *_sizes(c))
    return _encoder(model, inputs, c["seed"])


def build_clip_text(c: dict[str, Any]) -> Built:
    """CLIP's text encoder: pre-LN blocks under a causal mask and the padding mask,
    QuickGELU (x * sigmoid(1.702 x)) in the feed-forward."""
    from transformers import CLIPTextConfig, CLIPTextModel

    torch.manual_seed(c["seed"])
    config = CLIPTextConfig(
        vocab_size=c["vocab"],
        hidden_size=c["hidden"],
        intermediate_size=c["hidden"] * 2,
        num_hidden_layers=c["layers"],
        num_attention_heads=c["heads"],
        max_position_embeddings=16,
        pad_token_id=1,
        bos_token_id=0,
        eos_token_id=2,
        attn_implementation=c["attention"],
    )
    inputs = _token_inputs(c["vocab"], True, c["seed"], *_sizes(c))
    return _encoder(CLIPTextModel(config), inputs, c["seed"])


def build_swin(c: dict[str, Any]) -> Built:
    """Swin: attention inside 4x4 windows, every other block on windows shifted by half
    a window with a mask computed from the feature map's size, a relative-position bias
    gathered from a table, patch merging between stages."""
    from transformers import SwinConfig, SwinModel

    torch.manual_seed(c["seed"])
    config = SwinConfig(
        image_size=IMAGE,
        patch_size=2,
        embed_dim=c["hidden"] // 2,
        depths=[2, 2],
        num_heads=[c["heads"] // 2, c["heads"]],
        window_size=4,
        mlp_ratio=2.0,
        attn_implementation=c["attention"],
    )
    generator = torch.Generator().manual_seed(c["seed"])
    pixels = torch.randn(BATCH, 3, IMAGE, IMAGE, generator=generator)
    model = SwinModel(config, add_pooling_layer=False)
    return _encoder(model, {"pixel_values": pixels}, c["seed"])


def build_wav2vec2(c: dict[str, Any]) -> Built:
    """wav2vec2: a strided Conv1d feature extractor (group norm, GELU), a grouped
    convolutional position embedding, then post-LN self-attention blocks."""
    from transformers import Wav2Vec2Config, Wav2Vec2Model

    torch.manual_seed(c["seed"])
    config = Wav2Vec2Config(
        hidden_size=c["hidden"],
        num_hidden_layers=c["layers"],
        num_attention_heads=c["heads"],
        intermediate_size=c["hidden"] * 2,
        conv_dim=(16, 16),
        conv_stride=(5, 2),
        conv_kernel=(10, 3),
        num_conv_pos_embeddings=16,
        num_conv_pos_embedding_groups=4,
        attn_implementation=c["attention"],
    )
    generator = torch.Generator().manual_seed(c["seed"])
    audio = torch.randn(BATCH, c["samples"], generator=generator)
    return _encoder(Wav2Vec2Model(config), {"input_values": audio}, c["seed"])


class _ResidualBlock(nn.Module):
    def __init__(self, channels: int, stride: int) -> None:
        super().__init__()
        out = channels * stride
        self.conv1 = nn.Conv2d(channels, out, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(out)
        self.conv2 = nn.Conv2d(out, out, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(out)
        self.shortcut = (
            nn.Sequential(nn.Conv2d(channels, out, 1, stride, bias=False), nn.BatchNorm2d(out))
            if stride != 1
            else nn.Identity()
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(self.bn2(self.conv2(y)) + self.shortcut(x))


def _repeat(blocks: list[nn.Module]) -> nn.Module:
    """One block as itself (the test models' module tree), several as a Sequential."""
    return blocks[0] if len(blocks) == 1 else nn.Sequential(*blocks)


class ResNetSmall(nn.Module):
    """A ResNet-18-style stem, two stages of basic blocks, global pooling, classifier."""

    def __init__(self, width: int, depth: int = 1) -> None:
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(3, width, 3, 1, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU()
        )
        self.pool = nn.MaxPool2d(2)
        # depth 1 builds exactly the modules (and so the seeded weights) of the test model
        self.stage1 = _repeat([_ResidualBlock(width, 1) for _ in range(depth)])
        self.stage2 = _repeat(
            [_ResidualBlock(width, 2)] + [_ResidualBlock(2 * width, 1) for _ in range(depth - 1)]
        )
        self.head = nn.Linear(width * 2, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.stage2(self.stage1(self.pool(self.stem(x))))
        return self.head(torch.flatten(nn.functional.adaptive_avg_pool2d(y, 1), 1))


class _InvertedResidual(nn.Module):
    """MobileNetV2/V3 block: expand 1x1, depthwise 3x3, project 1x1, residual if shapes agree."""

    def __init__(self, channels: int, out: int, stride: int, act: type[nn.Module]) -> None:
        super().__init__()
        hidden = channels * 4
        self.block = nn.Sequential(
            nn.Conv2d(channels, hidden, 1, bias=False),
            nn.BatchNorm2d(hidden),
            act(),
            nn.Conv2d(hidden, hidden, 3, stride, 1, groups=hidden, bias=False),
            nn.BatchNorm2d(hidden),
            act(),
            nn.Conv2d(hidden, out, 1, bias=False),
            nn.BatchNorm2d(out),
        )
        self.residual = stride == 1 and channels == out

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.block(x)
        return x + y if self.residual else y


class MobileNetSmall(nn.Module):
    def __init__(self, width: int, act: str, depth: int = 1) -> None:
        super().__init__()
        activation = {"relu6": nn.ReLU6, "hardswish": nn.Hardswish}[act]
        self.stem = nn.Sequential(
            nn.Conv2d(3, width, 3, 2, 1, bias=False), nn.BatchNorm2d(width), activation()
        )
        self.blocks = nn.Sequential(
            _InvertedResidual(width, width, 1, activation),
            _InvertedResidual(width, width * 2, 2, activation),
            *(_InvertedResidual(width * 2, width * 2, 1, activation) for _ in range(depth)),
        )
        self.head = nn.Linear(width * 2, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.blocks(self.stem(x))
        return self.head(torch.flatten(nn.functional.adaptive_avg_pool2d(y, 1), 1))


class _SqueezeExcite(nn.Module):
    """Squeeze-excitation: global pool, reduce 1x1, activation, expand 1x1, gate, scale."""

    def __init__(self, channels: int, squeezed: int, act: type[nn.Module], gate: type[nn.Module]):
        super().__init__()
        self.reduce = nn.Conv2d(channels, squeezed, 1)
        self.act = act()
        self.expand = nn.Conv2d(squeezed, channels, 1)
        self.gate = gate()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scale = nn.functional.adaptive_avg_pool2d(x, 1)
        return x * self.gate(self.expand(self.act(self.reduce(scale))))


def _conv_bn(channels: int, out: int, kernel: int, stride: int, groups: int = 1) -> list:
    conv = nn.Conv2d(channels, out, kernel, stride, kernel // 2, groups=groups, bias=False)
    return [conv, nn.BatchNorm2d(out)]


class _MBConv(nn.Module):
    """MobileNetV3 bneck / EfficientNet MBConv: expand 1x1, depthwise kxk, optional
    squeeze-excitation, project 1x1 (no activation), residual when the shapes agree."""

    def __init__(
        self,
        channels: int,
        out: int,
        *,
        expand: int,
        kernel: int,
        stride: int,
        act: type[nn.Module],
        se: tuple[type[nn.Module], type[nn.Module]] | None,
        se_ratio: float,
    ) -> None:
        super().__init__()
        hidden = channels * expand
        layers: list[nn.Module] = []
        if expand != 1:
            layers += [*_conv_bn(channels, hidden, 1, 1), act()]
        layers += [*_conv_bn(hidden, hidden, kernel, stride, groups=hidden), act()]
        if se is not None:
            layers.append(_SqueezeExcite(hidden, max(4, int(channels * se_ratio)), *se))
        layers += _conv_bn(hidden, out, 1, 1)
        self.block = nn.Sequential(*layers)
        self.residual = stride == 1 and channels == out

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.block(x)
        return x + y if self.residual else y


class MobileNetV3Small(nn.Module):
    """MobileNetV3-style: hardswish, squeeze-excitation gated by hardsigmoid, 5x5 depthwise
    convs in the later blocks, a 1x1 conv + hardswish head before pooling."""

    def __init__(self, width: int, depth: int = 1) -> None:
        super().__init__()
        se = (nn.ReLU, nn.Hardsigmoid)
        common = {"act": nn.Hardswish, "se_ratio": 0.25}
        self.stem = nn.Sequential(*_conv_bn(3, width, 3, 2), nn.Hardswish())
        blocks = [
            _MBConv(width, width, expand=1, kernel=3, stride=2, se=se, **common),
            _MBConv(width, 2 * width, expand=4, kernel=3, stride=2, se=None, **common),
        ]
        blocks += [
            _MBConv(2 * width, 2 * width, expand=3, kernel=5, stride=1, se=se, **common)
            for _ in range(depth)
        ]
        blocks.append(_MBConv(2 * width, 3 * width, expand=4, kernel=5, stride=2, se=se, **common))
        blocks += [
            _MBConv(3 * width, 3 * width, expand=4, kernel=5, stride=1, se=se, **common)
            for _ in range(depth)
        ]
        self.blocks = nn.Sequential(*blocks)
        self.last = nn.Sequential(*_conv_bn(3 * width, 6 * width, 1, 1), nn.Hardswish())
        self.head = nn.Sequential(
            nn.Linear(6 * width, 8 * width), nn.Hardswish(), nn.Linear(8 * width, 10)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.last(self.blocks(self.stem(x)))
        return self.head(torch.flatten(nn.functional.adaptive_avg_pool2d(y, 1), 1))


class EfficientNetSmall(nn.Module):
    """EfficientNet-B0-style: SiLU everywhere, MBConv with squeeze-excitation gated by
    sigmoid (ratio 0.25 of the block's input), 3x3 and 5x5 depthwise stages."""

    def __init__(self, width: int, depth: int = 1) -> None:
        super().__init__()
        se = (nn.SiLU, nn.Sigmoid)
        common = {"act": nn.SiLU, "se": se, "se_ratio": 0.25}
        self.stem = nn.Sequential(*_conv_bn(3, width, 3, 2), nn.SiLU())
        # (out, expand, kernel, stride): B0's stage pattern, channels scaled to `width`
        stages = [(width, 1, 3, 1), (2 * width, 6, 3, 2), (3 * width, 6, 5, 2)]
        blocks: list[nn.Module] = []
        channels = width
        for out, expand, kernel, stride in stages:
            for index in range(depth):
                first = index == 0
                blocks.append(
                    _MBConv(
                        channels,
                        out,
                        expand=expand,
                        kernel=kernel,
                        stride=stride if first else 1,
                        **common,
                    )
                )
                channels = out
        self.blocks = nn.Sequential(*blocks)
        self.last = nn.Sequential(*_conv_bn(channels, 4 * width, 1, 1), nn.SiLU())
        self.head = nn.Linear(4 * width, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.last(self.blocks(self.stem(x)))
        return self.head(torch.flatten(nn.functional.adaptive_avg_pool2d(y, 1), 1))


class _ConvNeXtBlock(nn.Module):
    """Depthwise 7x7, to NHWC, LayerNorm, Linear 4x, GELU, Linear back, layer scale, to NCHW,
    residual: the block as the ConvNeXt reference code writes it."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.dwconv = nn.Conv2d(dim, dim, 7, padding=3, groups=dim)
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.pwconv1 = nn.Linear(dim, 4 * dim)
        self.act = nn.GELU()
        self.pwconv2 = nn.Linear(4 * dim, dim)
        # the reference starts at 1e-6; a trained model's scales are far from that
        self.gamma = nn.Parameter(torch.full((dim,), 0.5))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.dwconv(x).permute(0, 2, 3, 1)
        y = self.pwconv2(self.act(self.pwconv1(self.norm(y))))
        return x + (self.gamma * y).permute(0, 3, 1, 2)


class _ChannelsFirstNorm(nn.Module):
    """LayerNorm over the channels of an NCHW tensor (ConvNeXt's stem and downsampling)."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(dim, eps=1e-6)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)


class ConvNeXtSmall(nn.Module):
    """ConvNeXt-style: patchify stem (4x4, stride 4) + norm, two stages of ConvNeXt blocks
    with a norm + 2x2 stride-2 conv between them, global pooling, LayerNorm, classifier."""

    def __init__(self, width: int, depth: int = 1) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, width, 4, 4), _ChannelsFirstNorm(width))
        self.stage1 = nn.Sequential(*(_ConvNeXtBlock(width) for _ in range(depth)))
        self.down = nn.Sequential(_ChannelsFirstNorm(width), nn.Conv2d(width, 2 * width, 2, 2))
        self.stage2 = nn.Sequential(*(_ConvNeXtBlock(2 * width) for _ in range(depth)))
        self.norm = nn.LayerNorm(2 * width, eps=1e-6)
        self.head = nn.Linear(2 * width, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.stage2(self.down(self.stage1(self.stem(x))))
        return self.head(self.norm(y.mean((2, 3))))


def _cnn_module(c: dict[str, Any]) -> nn.Module:
    depth = c.get("depth", 1)
    arch = c["arch"]
    if arch == "resnet":
        return ResNetSmall(c["width"], depth)
    if arch == "mobilenet":
        return MobileNetSmall(c["width"], c["act"], depth)
    if arch == "mobilenetv3":
        return MobileNetV3Small(c["width"], depth)
    if arch == "efficientnet":
        return EfficientNetSmall(c["width"], depth)
    if arch == "convnext":
        return ConvNeXtSmall(c["width"], depth)
    raise ValueError(f"unknown CNN architecture {arch!r}")


def build_cnn(c: dict[str, Any]) -> Built:
    torch.manual_seed(c["seed"])
    model = _cnn_module(c)
    _perturb(model, c["seed"])
    generator = torch.Generator().manual_seed(c["seed"])
    batch, image = c.get("batch", BATCH), c.get("image", IMAGE)
    pixels = torch.randn(batch, 3, image, image, generator=generator)
    return Built(model.eval(), {"pixel_values": pixels}, ["logits"])


BUILDERS: dict[str, Callable[[dict[str, Any]], Built]] = {
    "bert": build_bert,
    "albert": build_albert,
    "vit": build_vit,
    "t5": build_t5,
    "llama": build_llama,
    "gpt2": build_gpt2,
    "whisper": build_whisper,
    "opt": build_opt,
    "beit": build_beit,
    "segformer": build_segformer,
    "bert-family": build_bert_family,
    "clip-text": build_clip_text,
    "swin": build_swin,
    "wav2vec2": build_wav2vec2,
    "cnn": build_cnn,
    "causal_lm": build_causal_lm,
}

_TOKENS = {"input_ids": {0: "batch", 1: "seq"}, "attention_mask": {0: "batch", 1: "seq"}}
_IMAGES = {"pixel_values": {0: "batch"}}


def _text(name: str, family: str, ort_type: str | None, notes: str = "", **config) -> ModelSpec:
    config = {"seed": 0, "vocab": 100, "layers": 2, "attention": "eager", **config}
    dynamic = {k: v for k, v in _TOKENS.items() if k != "attention_mask" or config.get("mask", 1)}
    if config.get("decoder"):
        dynamic["decoder_input_ids"] = {0: "batch", 1: "decoder_seq"}
    return ModelSpec(
        name, family, config, ort_type, config["heads"], config["hidden"], notes, dynamic
    )


def _gpt2(name: str, past: bool, **config) -> ModelSpec:
    spec = _text(name, "gpt2", "gpt2", past=past, **config)
    if past:
        dynamic = {"input_ids": {0: "batch", 1: "seq"}, "attention_mask": {0: "batch", 1: "total"}}
        for layer in range(spec.config["layers"]):
            for kind in ("key", "value"):
                dynamic[f"past_{kind}_{layer}"] = {0: "batch", 2: "past"}
        spec = ModelSpec(**{**spec.__dict__, "dynamic": dynamic})
    return spec


# The model set. Hidden sizes 32-64, two layers: the whole set exports in minutes on 2 cores.
MODELS: list[ModelSpec] = [
    _text("bert-mask", "bert", "bert", hidden=32, heads=4, mask=True),
    _text("bert-nomask", "bert", "bert", hidden=32, heads=4, mask=False),
    _text("bert-sdpa-h64", "bert", "bert", hidden=64, heads=2, mask=True, attention="sdpa"),
    # Weights shared by 4 layers; ALBERT's own model type in onnxruntime's optimizer is bert.
    _text("albert", "albert", "bert", hidden=64, heads=4, layers=4, mask=True),
    _gpt2("gpt2", past=False, hidden=32, heads=4),
    _gpt2("gpt2-past", past=True, hidden=32, heads=4),
    ModelSpec(
        "vit",
        "vit",
        {"seed": 0, "hidden": 32, "heads": 4, "layers": 2, "attention": "eager"},
        "vit",
        4,
        32,
        dynamic=_IMAGES,
    ),
    _text("t5-encoder", "t5", "t5", hidden=32, heads=4, decoder=False, mask=True),
    _text("t5-seq2seq", "t5", "t5", hidden=32, heads=4, decoder=True, mask=True),
    _text("llama-gqa", "llama", "gpt2", hidden=64, heads=4, kv_heads=2, mask=True),
    # Whisper's audio encoder: attention with no mask and no bias term, K without bias.
    ModelSpec(
        "whisper-encoder",
        "whisper",
        {
            "seed": 0,
            "vocab": 100,
            "hidden": 64,
            "heads": 4,
            "layers": 2,
            "mel": 16,
            "frames": 16,
            "attention": "eager",
        },
        "bart",
        4,
        64,
        dynamic={"input_features": {0: "batch"}},
    ),
    ModelSpec(
        "whisper-seq2seq",
        "whisper",
        {
            "seed": 0,
            "vocab": 100,
            "hidden": 64,
            "heads": 4,
            "layers": 2,
            "mel": 16,
            "frames": 16,
            "attention": "eager",
            "decoder": True,
        },
        "bart",
        4,
        64,
        dynamic={
            "input_features": {0: "batch"},
            "decoder_input_ids": {0: "batch", 1: "decoder_seq"},
        },
        # the legacy exporter has no aten::diff, which the decoder's mask construction uses
        exporters=("dynamo",),
    ),
    ModelSpec(
        "whisper-encoder-sdpa",
        "whisper",
        {
            "seed": 0,
            "vocab": 100,
            "hidden": 64,
            "heads": 4,
            "layers": 2,
            "mel": 16,
            "frames": 16,
            "attention": "sdpa",
        },
        "bart",
        4,
        64,
        dynamic={"input_features": {0: "batch"}},
    ),
    _text("opt", "opt", "opt", hidden=64, heads=4, mask=True),
    _text("opt-sdpa", "opt", "opt", hidden=64, heads=4, mask=True, attention="sdpa"),
    ModelSpec(
        "beit",
        "beit",
        {"seed": 0, "hidden": 32, "heads": 4, "layers": 2, "attention": "eager"},
        "vit",
        4,
        32,
        dynamic=_IMAGES,
    ),
    ModelSpec(
        "segformer",
        "segformer",
        {"seed": 0, "hidden": 32, "heads": 2, "attention": "eager"},
        "vit",
        2,
        32,
        dynamic=_IMAGES,
    ),
    ModelSpec(
        "resnet-small", "cnn", {"seed": 0, "arch": "resnet", "width": 16}, None, dynamic=_IMAGES
    ),
    ModelSpec(
        "mobilenet-relu6",
        "cnn",
        {"seed": 0, "arch": "mobilenet", "width": 16, "act": "relu6"},
        None,
        dynamic=_IMAGES,
    ),
    ModelSpec(
        "mobilenet-hardswish",
        "cnn",
        {"seed": 0, "arch": "mobilenet", "width": 16, "act": "hardswish"},
        None,
        dynamic=_IMAGES,
    ),
]


# Encoders, speech and vision families beside the ones above, each with dynamic axes.
MODELS += [
    _text("roberta", "bert-family", "bert", arch="roberta", hidden=32, heads=4, mask=True),
    _text("distilbert", "bert-family", "bert", arch="distilbert", hidden=32, heads=4, mask=True),
    _text("electra", "bert-family", "bert", arch="electra", hidden=32, heads=4, mask=True),
    _text("clip-text", "clip-text", "clip", hidden=32, heads=4, mask=True),
    ModelSpec(
        "swin",
        "swin",
        {"seed": 0, "hidden": 32, "heads": 4, "attention": "eager"},
        "swin",
        4,
        32,
        dynamic=_IMAGES,
    ),
    ModelSpec(
        "wav2vec2",
        "wav2vec2",
        {"seed": 0, "hidden": 32, "heads": 4, "layers": 2, "samples": 400, "attention": "eager"},
        "bert",
        4,
        32,
        dynamic={"input_values": {0: "batch", 1: "samples"}},
    ),
]


def _cnn(name: str, dynamic: bool = True, **config) -> ModelSpec:
    return ModelSpec(name, "cnn", {"seed": 0, **config}, None, dynamic=_IMAGES if dynamic else {})


MODELS += [
    _cnn("mobilenetv3-small", arch="mobilenetv3", width=16),
    _cnn("efficientnet-small", arch="efficientnet", width=16),
    _cnn("convnext-small", arch="convnext", width=16),
]
MODELS_BY_NAME = {spec.name: spec for spec in MODELS}
CNN_NAMES = [spec.name for spec in MODELS if spec.family == "cnn"]

# Bench sizes (bench/latency.py, bench/speed.py), never in the test set: big enough that
# latency is milliseconds and optimization time is not all fixed cost. CNNs: one 224x224
# image, static shapes (as CNNs are deployed; torch.export also cannot keep a dynamic batch
# whose example is 1 through ConvNeXt's norms); transformers: BERT-base's depth and width
# (12 layers, hidden 768, 12 heads; the builder's feed-forward is 2x hidden, BERT-base's 4x),
# GPT-2 and Llama at two depths, 2 sequences (the last one padded) of 32 tokens.
_BENCH_TEXT = {"vocab": 1000, "batch": 2, "seq": 32}
BENCH_MODELS: list[ModelSpec] = [
    _cnn("resnet-bench", False, arch="resnet", width=32, depth=2, image=224, batch=1),
    _cnn(
        "mobilenetv2-bench",
        False,
        arch="mobilenet",
        width=32,
        act="relu6",
        depth=3,
        image=224,
        batch=1,
    ),
    _cnn("mobilenetv3-bench", False, arch="mobilenetv3", width=32, depth=2, image=224, batch=1),
    _cnn("efficientnet-bench", False, arch="efficientnet", width=32, depth=2, image=224, batch=1),
    _cnn("convnext-bench", False, arch="convnext", width=48, depth=3, image=224, batch=1),
    _text("bert-base", "bert", "bert", hidden=768, heads=12, layers=12, mask=True, **_BENCH_TEXT),
    _gpt2("gpt2-l4", past=False, hidden=768, heads=12, layers=4, **_BENCH_TEXT),
    _gpt2("gpt2-l12", past=False, hidden=768, heads=12, layers=12, **_BENCH_TEXT),
    _text(
        "llama-l4",
        "llama",
        "gpt2",
        hidden=512,
        heads=8,
        kv_heads=4,
        layers=4,
        mask=True,
        **_BENCH_TEXT,
    ),
    _text(
        "llama-l12",
        "llama",
        "gpt2",
        hidden=512,
        heads=8,
        kv_heads=4,
        layers=12,
        mask=True,
        **_BENCH_TEXT,
    ),
]
BENCH_MODELS_BY_NAME = {spec.name: spec for spec in BENCH_MODELS}


def _causal_lm(arch: str) -> ModelSpec:
    config = {
        "seed": 0,
        "arch": arch,
        "vocab": 1000,
        "hidden": 256,
        "layers": 4,
        "heads": 4,
        "kv_heads": 2,
        "max_positions": 256,
        "attention": "sdpa",
        "pad": 0,
    }
    dynamic = {
        "input_ids": {0: "batch", 1: "seq"},
        "attention_mask": {0: "batch", 1: "total"},
        "position_ids": {0: "batch", 1: "seq"},
    }
    for layer in range(config["layers"]):
        for kind in ("key", "value"):
            dynamic[f"past_key_values.{layer}.{kind}"] = {0: "batch", 2: "past"}
    return ModelSpec(f"{arch}-kv", "causal_lm", config, "gpt2", 4, 256, dynamic=dynamic)


# Decoders with a KV cache (bench/llm.py, tests/models/test_decode.py): hidden 256, 4 layers,
# 4 heads sharing 2 KV heads, HuggingFace's default (sdpa) attention.
CAUSAL_LM_MODELS: list[ModelSpec] = [_causal_lm(arch) for arch in CAUSAL_LM_CLASSES]
CAUSAL_LM_MODELS_BY_NAME = {spec.name: spec for spec in CAUSAL_LM_MODELS}


def build(spec: ModelSpec) -> Built:
    return BUILDERS[spec.family](spec.config)


# (model, exporter, opset) the benches measure: the CNNs as the current default (dynamo)
# exporter writes them, BERT-base by both exporters, the decoders by the legacy exporter.
BENCH_EXPORTS: tuple[tuple[str, str, int], ...] = (
    ("resnet-bench", "dynamo", 18),
    ("mobilenetv2-bench", "dynamo", 18),
    ("mobilenetv3-bench", "dynamo", 18),
    ("efficientnet-bench", "dynamo", 18),
    ("convnext-bench", "dynamo", 18),
    ("bert-base", "legacy", 17),
    ("bert-base", "dynamo", 18),
    ("gpt2-l4", "legacy", 17),
    ("gpt2-l12", "legacy", 17),
    ("llama-l4", "legacy", 17),
    ("llama-l12", "legacy", 17),
)
