"""Llama-family decoder over a flattened token batch with a paged KV cache.

Numerics follow transformers' LlamaForCausalLM in fp32 (same RMSNorm order, half-split RoPE with cos/sin built
the same way, SDPA attention) so greedy tokens match it exactly and logits to ~1e-5. Q/K/V and gate/up are each
one fused matmul: a wider GEMM is faster on CPU and changes only summation blocking, not the maths.

Each layer owns views `k_cache, v_cache` of the engine's one KV tensor (kernels/kv_transfer.py has the layout);
`forward` writes the step's K/V at `meta.slot_mapping` and attends through kernels.paged_attention. Logits are
computed only for `logit_rows` (the last token of each sequence that samples this step).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from kvpool.engine_adapter.loader import ModelSpec
from kvpool.kernels.paged_attention import AttentionMetadata, paged_attention, write_kv


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size), requires_grad=False)
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        variance = x.pow(2).mean(-1, keepdim=True)
        return self.weight * (x * torch.rsqrt(variance + self.eps))


def rope_tables(spec: ModelSpec, max_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin [max_len, head_dim], built like transformers' default rotary embedding."""
    dim = spec.head_dim
    inv_freq = 1.0 / (spec.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
    positions = torch.arange(max_len, dtype=torch.int64).float()
    freqs = (inv_freq[:, None] @ positions[None, :]).t()
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos(), emb.sin()


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class Attention(nn.Module):
    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = spec.num_heads, spec.num_kv_heads, spec.head_dim
        q, kv = spec.num_heads * spec.head_dim, spec.num_kv_heads * spec.head_dim
        self.qkv_weight = nn.Parameter(torch.empty(q + 2 * kv, spec.hidden_size), requires_grad=False)
        self.o_weight = nn.Parameter(torch.empty(spec.hidden_size, q), requires_grad=False)
        self.split = (q, kv, kv)
        self.k_cache = torch.empty(0)
        self.v_cache = torch.empty(0)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        tokens = x.shape[0]
        q, k, v = F.linear(x, self.qkv_weight).split(self.split, dim=-1)
        q = q.view(tokens, self.num_heads, self.head_dim)
        k = k.view(tokens, self.num_kv_heads, self.head_dim)
        v = v.view(tokens, self.num_kv_heads, self.head_dim)
        q = q * cos + _rotate_half(q) * sin
        k = k * cos + _rotate_half(k) * sin
        write_kv(self.k_cache, self.v_cache, meta.slot_mapping, k, v)
        o = paged_attention(q, k, v, self.k_cache, self.v_cache, meta)
        return F.linear(o.reshape(tokens, -1), self.o_weight)


class MLP(nn.Module):
    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        self.gate_up_weight = nn.Parameter(torch.empty(2 * spec.intermediate_size, spec.hidden_size),
                                           requires_grad=False)
        self.down_weight = nn.Parameter(torch.empty(spec.hidden_size, spec.intermediate_size), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = F.linear(x, self.gate_up_weight).chunk(2, dim=-1)
        return F.linear(F.silu(gate) * up, self.down_weight)


class DecoderLayer(nn.Module):
    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(spec.hidden_size, spec.rms_norm_eps)
        self.self_attn = Attention(spec)
        self.post_attention_layernorm = RMSNorm(spec.hidden_size, spec.rms_norm_eps)
        self.mlp = MLP(spec)

    def forward(self, x, cos, sin, meta):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, meta)
        return x + self.mlp(self.post_attention_layernorm(x))


class LlamaModel(nn.Module):
    def __init__(self, spec: ModelSpec, max_model_len: int) -> None:
        super().__init__()
        self.spec = spec
        self.embed_tokens = nn.Parameter(torch.empty(spec.vocab_size, spec.hidden_size), requires_grad=False)
        self.layers = nn.ModuleList(DecoderLayer(spec) for _ in range(spec.num_layers))
        self.norm = RMSNorm(spec.hidden_size, spec.rms_norm_eps)
        self.lm_head = self.embed_tokens if spec.tie_word_embeddings else nn.Parameter(
            torch.empty(spec.vocab_size, spec.hidden_size), requires_grad=False)
        cos, sin = rope_tables(spec, max_model_len)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)

    def load(self, state: dict[str, torch.Tensor]) -> None:
        """Copy a transformers-named fp32 state dict (loader.load_gguf) into the fused parameters."""
        with torch.no_grad():
            self.embed_tokens.copy_(state["embed_tokens.weight"])
            self.norm.weight.copy_(state["norm.weight"])
            if not self.spec.tie_word_embeddings:
                self.lm_head.copy_(state["lm_head.weight"])
            for i, layer in enumerate(self.layers):
                p = f"layers.{i}."
                layer.input_layernorm.weight.copy_(state[p + "input_layernorm.weight"])
                layer.post_attention_layernorm.weight.copy_(state[p + "post_attention_layernorm.weight"])
                layer.self_attn.qkv_weight.copy_(torch.cat([state[p + f"self_attn.{n}_proj.weight"]
                                                            for n in "qkv"]))
                layer.self_attn.o_weight.copy_(state[p + "self_attn.o_proj.weight"])
                layer.mlp.gate_up_weight.copy_(torch.cat([state[p + "mlp.gate_proj.weight"],
                                                          state[p + "mlp.up_proj.weight"]]))
                layer.mlp.down_weight.copy_(state[p + "mlp.down_proj.weight"])

    def bind_cache(self, kv_cache: torch.Tensor) -> None:
        """Give every layer its views of the one cache tensor [layers, 2, blocks, bt, kv_heads, head_dim]."""
        for i, layer in enumerate(self.layers):
            layer.self_attn.k_cache = kv_cache[i, 0]
            layer.self_attn.v_cache = kv_cache[i, 1]

    @torch.inference_mode()
    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata,
                logit_rows: torch.Tensor, before_layer=None) -> torch.Tensor:
        """input_ids, positions [T] -> logits [len(logit_rows), vocab] (fp32). `before_layer(i)`, if given, runs
        right before layer i touches the KV cache (a connector's layer-wise load waits there)."""
        x = F.embedding(input_ids, self.embed_tokens)
        cos = self.cos[positions].unsqueeze(1)
        sin = self.sin[positions].unsqueeze(1)
        for i, layer in enumerate(self.layers):
            if before_layer is not None:
                before_layer(i)
            x = layer(x, cos, sin, meta)
        x = self.norm(x[logit_rows])
        return F.linear(x, self.lm_head)
