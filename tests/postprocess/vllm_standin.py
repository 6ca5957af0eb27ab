"""STAND-IN for vLLM's Qwen2 model (``vllm/model_executor/models/qwen2.py``), for CPU tests.

vLLM cannot run on these machines, and msprobe's ``--consistent_check`` only means something if
the golden side looks like vLLM: its *module names* (fused ``qkv_proj`` and ``gate_up_proj``,
``attn``, per-layer ``rotary_emb``), its *packed* activations (tokens of every request of a step
concatenated on dim 0, no batch dimension) and its fused residual-add RMSNorm that returns
``(normed, residual)``. This module mirrors exactly those three things and nothing else: the
parallel linear layers are plain ``nn.Linear`` subclasses carrying vLLM's class names (no tensor
parallel sharding, no KV cache), and attention is an eager per-request causal softmax.

Weights come from a Hugging Face ``Qwen2ForCausalLM`` (:meth:`VllmQwen2ForCausalLM.from_hf`), with
q/k/v and gate/up concatenated the way vLLM's weight loader does, so the two sides compute the
same function up to float rounding — except where a test deliberately changes one module.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn
from transformers import Qwen2Config, Qwen2ForCausalLM
from transformers.models.qwen2.modeling_qwen2 import Qwen2RotaryEmbedding, apply_rotary_pos_emb


class RMSNorm(nn.Module):
    """vLLM's RMSNorm: with ``residual`` it adds first and returns ``(normed, new_residual)``."""

    def __init__(self, hidden: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden))
        self.eps = eps

    def forward(
        self, x: torch.Tensor, residual: torch.Tensor | None = None
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        if residual is not None:
            x = x + residual
            residual = x
        out = self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps))
        return out if residual is None else (out, residual)


class QKVParallelLinear(nn.Linear):
    """Name only: q, k and v stacked on the output dim (TP size 1)."""


class MergedColumnParallelLinear(nn.Linear):
    """Name only: gate and up stacked on the output dim (TP size 1)."""


class RowParallelLinear(nn.Linear):
    """Name only (TP size 1)."""


class VocabParallelEmbedding(nn.Embedding):
    """Name only (TP size 1)."""


class ParallelLMHead(nn.Linear):
    """Name only (TP size 1)."""


class Attention(nn.Module):
    """Causal attention within each request of a packed step (vLLM's varlen prefill)."""

    def __init__(self, heads: int, kv_heads: int, head_dim: int) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, head_dim

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, seq_lens: torch.Tensor
    ) -> torch.Tensor:
        n = q.shape[0]
        rep = self.heads // self.kv_heads
        qh = q.view(n, self.heads, self.head_dim).transpose(0, 1)
        kh = k.view(n, self.kv_heads, self.head_dim).transpose(0, 1).repeat_interleave(rep, 0)
        vh = v.view(n, self.kv_heads, self.head_dim).transpose(0, 1).repeat_interleave(rep, 0)
        seq = torch.repeat_interleave(torch.arange(len(seq_lens)), seq_lens)
        pos = torch.arange(n)
        allowed = (seq[:, None] == seq[None, :]) & (pos[None, :] <= pos[:, None])
        scores = (qh @ kh.transpose(1, 2)) / self.head_dim**0.5
        scores = scores.masked_fill(~allowed, float("-inf"))
        return (scores.softmax(-1) @ vh).transpose(0, 1).reshape(n, -1)


class Qwen2Attention(nn.Module):
    def __init__(self, c: Qwen2Config) -> None:
        super().__init__()
        self.head_dim = c.hidden_size // c.num_attention_heads
        self.heads, self.kv_heads = c.num_attention_heads, c.num_key_value_heads
        self.q_size, self.kv_size = self.heads * self.head_dim, self.kv_heads * self.head_dim
        self.qkv_proj = QKVParallelLinear(c.hidden_size, self.q_size + 2 * self.kv_size, bias=True)
        self.o_proj = RowParallelLinear(self.q_size, c.hidden_size, bias=False)
        self.rotary_emb = Qwen2RotaryEmbedding(c)
        self.attn = Attention(self.heads, self.kv_heads, self.head_dim)

    def forward(self, positions: torch.Tensor, x: torch.Tensor, seq_lens: torch.Tensor) -> torch.Tensor:
        n = x.shape[0]
        q, k, v = self.qkv_proj(x).split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        cos, sin = self.rotary_emb(x[None], positions[None])
        qh = q.view(1, n, self.heads, self.head_dim).transpose(1, 2)
        kh = k.view(1, n, self.kv_heads, self.head_dim).transpose(1, 2)
        qh, kh = apply_rotary_pos_emb(qh, kh, cos, sin)
        q, k = qh.transpose(1, 2).reshape(n, -1), kh.transpose(1, 2).reshape(n, -1)
        return self.o_proj(self.attn(q, k, v, seq_lens))


class SiluAndMul(nn.Module):
    """vLLM's activation: takes gate‖up, returns silu(gate) * up."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        d = x.shape[-1] // 2
        return F.silu(x[..., :d]) * x[..., d:]


class Qwen2MLP(nn.Module):
    def __init__(self, c: Qwen2Config) -> None:
        super().__init__()
        self.gate_up_proj = MergedColumnParallelLinear(c.hidden_size, 2 * c.intermediate_size, bias=False)
        self.down_proj = RowParallelLinear(c.intermediate_size, c.hidden_size, bias=False)
        self.act_fn = SiluAndMul()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act_fn(self.gate_up_proj(x)))


class Qwen2DecoderLayer(nn.Module):
    def __init__(self, c: Qwen2Config) -> None:
        super().__init__()
        self.self_attn = Qwen2Attention(c)
        self.mlp = Qwen2MLP(c)
        self.input_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)

    def forward(
        self, positions: torch.Tensor, h: torch.Tensor, residual: torch.Tensor | None, seq_lens: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if residual is None:
            residual, h = h, self.input_layernorm(h)
        else:
            h, residual = self.input_layernorm(h, residual)
        h = self.self_attn(positions, h, seq_lens)
        h, residual = self.post_attention_layernorm(h, residual)
        return self.mlp(h), residual


class Qwen2Model(nn.Module):
    def __init__(self, c: Qwen2Config) -> None:
        super().__init__()
        self.embed_tokens = VocabParallelEmbedding(c.vocab_size, c.hidden_size)
        self.layers = nn.ModuleList(Qwen2DecoderLayer(c) for _ in range(c.num_hidden_layers))
        self.norm = RMSNorm(c.hidden_size, c.rms_norm_eps)

    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, seq_lens: torch.Tensor
    ) -> torch.Tensor:
        h, residual = self.embed_tokens(input_ids), None
        for layer in self.layers:
            h, residual = layer(positions, h, residual, seq_lens)
        h, _ = self.norm(h, residual)
        return h


class VllmQwen2ForCausalLM(nn.Module):
    """STAND-IN for vLLM's ``Qwen2ForCausalLM``: call with packed ``input_ids`` [T] and ``positions`` [T]."""

    def __init__(self, c: Qwen2Config) -> None:
        super().__init__()
        self.model = Qwen2Model(c)
        self.lm_head = ParallelLMHead(c.hidden_size, c.vocab_size, bias=False)

    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, seq_lens: Sequence[int]
    ) -> torch.Tensor:
        return self.lm_head(self.model(input_ids, positions, torch.tensor(list(seq_lens))))

    @classmethod
    @torch.no_grad()
    def from_hf(cls, hf: Qwen2ForCausalLM) -> VllmQwen2ForCausalLM:
        """Copy weights, stacking q/k/v and gate/up as vLLM's ``load_weights`` does."""
        model = cls(hf.config)
        sd = hf.state_dict()
        fused: dict[str, torch.Tensor] = {}
        for key, value in sd.items():
            if ".q_proj." in key:
                parts = [value, sd[key.replace("q_proj", "k_proj")], sd[key.replace("q_proj", "v_proj")]]
                fused[key.replace(".q_proj.", ".qkv_proj.")] = torch.cat(parts, 0)
            elif ".gate_proj." in key:
                parts = [value, sd[key.replace("gate_proj", "up_proj")]]
                fused[key.replace(".gate_proj.", ".gate_up_proj.")] = torch.cat(parts, 0)
            elif not any(s in key for s in (".k_proj.", ".v_proj.", ".up_proj.", "rotary_emb")):
                fused[key] = value
        missing, unexpected = model.load_state_dict(fused, strict=False)
        if unexpected or any("rotary_emb" not in m for m in missing):
            raise RuntimeError(f"weight copy mismatch: missing={missing} unexpected={unexpected}")
        return model
