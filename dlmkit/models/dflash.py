"""The DFlash drafter: a small non-causal transformer that drafts a block of tokens at once from
the hidden states of a frozen target model.

Its context is the concatenation of the target's hidden states at ``target_layer_ids``
(``[B, C, len(ids) * target_hidden]``), projected by ``fc`` and normalised, then **injected as
extra keys/values in every layer**: each layer's keys/values are computed from
``[context | block]`` while its queries come from the block alone. The block is the anchor
token followed by ``block_size - 1`` mask tokens, embedded with the *target's* input embeddings;
the drafted logits are the target's LM head applied to the last hidden state. So the drafter's
hidden size must equal the target's, and it has no vocabulary of its own.

The call convention is the one transformers' DFlash speculative decoding uses
(``generate(..., assistant_model=drafter)`` with ``speculation_type="dflash"``)::

    drafter(noise_embeds=[B, Q, H], context_hidden_states=[B, C, n * H_t],
            position_ids=[B, C + Q], attention_mask=None | [B, kv] | [B, 1, Q, kv],
            cache=None | DynamicCache) -> .last_hidden_state [B, Q, H]

``position_ids`` cover the new context then the block; with a cache, earlier context keys are
reused (``kv = cached + C + Q``) and the caller crops the block's entries afterwards. The mask
may be a 2-D key-validity mask (decoding: every key is before the block or in it, so the block
sees all of them), a 4-D bool mask (training: the ``dflash`` mask over ``N`` blocks) or a
FlexAttention ``BlockMask``.
"""

from __future__ import annotations

import torch
from torch import nn
from transformers import PretrainedConfig, PreTrainedModel
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.modeling_outputs import BaseModelOutputWithPast

# Drafter shapes sized for the tiny targets (hidden size and context width come from the target).
DRAFT_PRESETS: dict[str, dict] = {
    "dflash-tiny": dict(num_hidden_layers=1, intermediate_size=384, num_attention_heads=4),
    "dflash-small": dict(num_hidden_layers=2, intermediate_size=768, num_attention_heads=8),
}


class DFlashDraftConfig(PretrainedConfig):
    """Drafter shape plus what speculative decoding needs to drive it: ``target_layer_ids``
    (0-based target layers whose outputs form the context), ``block_size`` (tokens per drafted
    block, anchor included), ``mask_token_id`` and ``target_hidden_size``."""

    model_type = "dlmkit_dflash"

    def __init__(self, hidden_size: int = 128, intermediate_size: int = 384,
                 num_hidden_layers: int = 1, num_attention_heads: int = 4,
                 rms_norm_eps: float = 1e-6, rope_theta: float = 10000.0,
                 max_position_embeddings: int = 2048, block_size: int = 8,
                 mask_token_id: int = 0, target_layer_ids: list[int] | None = None,
                 target_hidden_size: int | None = None, vocab_size: int | None = None,
                 **kwargs) -> None:
        self.hidden_size = hidden_size
        self.intermediate_size = intermediate_size
        self.num_hidden_layers = num_hidden_layers
        self.num_attention_heads = num_attention_heads
        self.rms_norm_eps = rms_norm_eps
        self.rope_theta = rope_theta
        self.max_position_embeddings = max_position_embeddings
        self.block_size = block_size
        self.mask_token_id = mask_token_id
        self.target_layer_ids = list(target_layer_ids or [0])
        self.target_hidden_size = target_hidden_size or hidden_size
        # The target's vocabulary (the drafter borrows its embeddings and LM head).
        self.vocab_size = vocab_size
        super().__init__(**kwargs)
        if hidden_size % num_attention_heads:
            raise ValueError(f"hidden_size {hidden_size} must be a multiple of "
                             f"num_attention_heads {num_attention_heads}")
        if not isinstance(block_size, int) or block_size < 2:
            raise ValueError(f"block_size must be an int >= 2 (an anchor and at least one "
                             f"drafted token), got {block_size!r}")


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    a, b = x.chunk(2, dim=-1)
    return torch.cat([-b, a], dim=-1)


class _Rotary(nn.Module):
    def __init__(self, head_dim: int, theta: float) -> None:
        super().__init__()
        inv = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
        self.register_buffer("inv_freq", inv, persistent=False)

    def forward(self, position_ids: torch.Tensor, dtype) -> tuple[torch.Tensor, torch.Tensor]:
        angles = position_ids.float().unsqueeze(-1) * self.inv_freq  # [B, T, D/2]
        angles = torch.cat([angles, angles], dim=-1).unsqueeze(1)  # [B, 1, T, D]
        return angles.cos().to(dtype), angles.sin().to(dtype)


class _Attention(nn.Module):
    def __init__(self, config: DFlashDraftConfig, layer_idx: int) -> None:
        super().__init__()
        h = config.hidden_size
        self.heads = config.num_attention_heads
        self.head_dim = h // self.heads
        self.layer_idx = layer_idx
        self.q_proj = nn.Linear(h, h, bias=False)
        self.k_proj = nn.Linear(h, h, bias=False)
        self.v_proj = nn.Linear(h, h, bias=False)
        self.o_proj = nn.Linear(h, h, bias=False)

    def _split(self, x: torch.Tensor) -> torch.Tensor:
        return x.view(*x.shape[:2], self.heads, self.head_dim).transpose(1, 2)

    def forward(self, x, context, cos, sin, mask, cache):
        kv_in = x if context is None else torch.cat([context, x], dim=1)
        q = self._split(self.q_proj(x))
        k, v = self._split(self.k_proj(kv_in)), self._split(self.v_proj(kv_in))
        q_len = q.shape[2]
        # Keys span [new context | block], queries only the block: the last q_len positions.
        q = q * cos[:, :, -q_len:] + _rotate_half(q) * sin[:, :, -q_len:]
        k = k * cos + _rotate_half(k) * sin
        if cache is not None:
            k, v = cache.update(k, v, self.layer_idx)
        if mask is not None and not isinstance(mask, torch.Tensor):  # FlexAttention BlockMask
            from torch.nn.attention.flex_attention import flex_attention

            out = flex_attention(q, k, v, block_mask=mask)
        else:
            out = nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return self.o_proj(out.transpose(1, 2).reshape(*x.shape[:2], -1))


class _Layer(GradientCheckpointingLayer):  # model.gradient_checkpointing recomputes it
    def __init__(self, config: DFlashDraftConfig, layer_idx: int) -> None:
        super().__init__()
        h, eps = config.hidden_size, config.rms_norm_eps
        self.input_norm = nn.RMSNorm(h, eps=eps)
        self.attn = _Attention(config, layer_idx)
        self.post_norm = nn.RMSNorm(h, eps=eps)
        self.gate_proj = nn.Linear(h, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(h, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, h, bias=False)

    def forward(self, x, context, cos, sin, mask, cache):
        x = x + self.attn(self.input_norm(x), context, cos, sin, mask, cache)
        y = self.post_norm(x)
        return x + self.down_proj(nn.functional.silu(self.gate_proj(y)) * self.up_proj(y))


class DFlashDrafter(PreTrainedModel):
    """See the module docstring. ``forward`` returns ``BaseModelOutputWithPast``."""

    config_class = DFlashDraftConfig
    base_model_prefix = "drafter"
    main_input_name = "noise_embeds"
    _supports_sdpa = True
    supports_gradient_checkpointing = True

    def __init__(self, config: DFlashDraftConfig) -> None:
        super().__init__(config)
        width = len(config.target_layer_ids) * config.target_hidden_size
        self.fc = nn.Linear(width, config.hidden_size, bias=False)
        self.context_norm = nn.RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.layers = nn.ModuleList(_Layer(config, i) for i in range(config.num_hidden_layers))
        self.norm = nn.RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.rotary = _Rotary(config.hidden_size // config.num_attention_heads,
                              config.rope_theta)
        self.post_init()

    def _init_weights(self, module) -> None:
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, std=0.02)
        elif isinstance(module, nn.RMSNorm):
            nn.init.ones_(module.weight)
        elif isinstance(module, _Rotary):
            head_dim = module.inv_freq.numel() * 2
            module.inv_freq.copy_(1.0 / self.config.rope_theta ** (
                torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))

    def forward(self, noise_embeds: torch.Tensor, context_hidden_states: torch.Tensor | None,
                position_ids: torch.Tensor, attention_mask=None, cache=None,
                use_cache: bool | None = None, **kwargs) -> BaseModelOutputWithPast:
        context = None
        if context_hidden_states is not None and context_hidden_states.shape[1] > 0:
            context = self.context_norm(self.fc(context_hidden_states.to(self.fc.weight.dtype)))
        x = noise_embeds.to(self.fc.weight.dtype)
        q_len, ctx_len = x.shape[1], 0 if context is None else context.shape[1]
        if position_ids.shape[-1] != ctx_len + q_len:
            raise ValueError(f"position_ids must cover the new context and the block "
                             f"({ctx_len} + {q_len}), got {position_ids.shape[-1]}")
        position_ids = position_ids.expand(x.shape[0], -1)
        cos, sin = self.rotary(position_ids, x.dtype)
        mask = attention_mask
        if isinstance(mask, torch.Tensor):
            if mask.dim() == 2:  # key validity [B, kv]: the block sees every valid key
                mask = mask.bool()[:, None, None, :]
            elif mask.dtype != torch.bool:
                raise TypeError(f"a 4-D attention_mask must be bool (True = attend), "
                                f"got {mask.dtype}")
            if bool(mask.all()):
                mask = None  # nothing blocked: the unmasked kernel
        for layer in self.layers:
            x = layer(x, context, cos, sin, mask, cache)
        return BaseModelOutputWithPast(last_hidden_state=self.norm(x), cache=cache)


def _register_auto_classes() -> None:
    """``AutoConfig``/``AutoModel`` resolve ``model_type: dlmkit_dflash`` once this module is
    imported, so an exported drafter loads like any transformers model."""
    from transformers import AutoConfig, AutoModel

    try:
        AutoConfig.register(DFlashDraftConfig.model_type, DFlashDraftConfig)
        AutoModel.register(DFlashDraftConfig, DFlashDrafter)
    except ValueError:  # already registered (module reloaded)
        pass


_register_auto_classes()
