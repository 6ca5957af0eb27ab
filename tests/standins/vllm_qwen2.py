"""STAND-IN for vLLM's Qwen2 (``vllm/model_executor/models/qwen2.py``) and its model runner's forward, on CPU.

vLLM cannot run here (no NPU, no CANN). What the tests need from it is the *shape contract* of
vLLM's forward and the *names* msprobe records, which this module reproduces and nothing else:

- every activation is 2-D ``[num_tokens, width]``: the requests of one step are concatenated
  along dim 0 in the model runner's packing order (``input_batch.req_ids``), no batch dimension;
- attention is block-diagonal: each request attends causally to its own tokens only, through a
  per-step "forward context" (vLLM's ``attn_metadata``), never through a module argument;
- the module tree and class names follow vLLM's ``Qwen2ForCausalLM``: fused ``qkv_proj``
  (``QKVParallelLinear``) and ``gate_up_proj`` (``MergedColumnParallelLinear``), per-layer
  ``rotary_emb``, ``attn``, ``act_fn``, and the residual-carrying RMSNorm that returns
  ``(normed, residual)``; so the dump keys look like a vLLM dump's and
  ``msprobe compare --consistent_check`` maps them. The parallel layers are plain ``nn.Linear`` /
  ``nn.Embedding`` subclasses carrying vLLM's class names (TP size 1: no sharding, no KV cache);
- logits are computed after the forward, by a ``logits_processor`` module over the last token
  of each request (``[num_reqs, vocab]``), as vLLM's ``compute_logits`` does.

Weights can be copied from a transformers ``Qwen2ForCausalLM`` (:meth:`Qwen2ForCausalLM.from_hf`),
q/k/v and gate/up concatenated the way vLLM's weight loader does, so a packed forward can be
checked against the real transformers model and paired with a training-side dump.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator, Sequence

import torch
import torch.nn.functional as F
from torch import nn

_SEQ_LENS: contextvars.ContextVar[tuple[int, ...] | None] = contextvars.ContextVar("seq_lens", default=None)


@contextlib.contextmanager
def forward_context(seq_lens: Sequence[int]) -> Iterator[None]:
    """Per-step attention metadata: the token count of each packed request, in packing order."""
    token = _SEQ_LENS.set(tuple(int(n) for n in seq_lens))
    try:
        yield
    finally:
        _SEQ_LENS.reset(token)


class QKVParallelLinear(nn.Linear):
    """Name only: q, k and v stacked on the output dim (TP size 1)."""


class MergedColumnParallelLinear(nn.Linear):
    """Name only: gate and up stacked on the output dim (TP size 1)."""


class RowParallelLinear(nn.Linear):
    """Name only (TP size 1)."""


class VocabParallelEmbedding(nn.Embedding):
    """Name only (TP size 1)."""


class ParallelLMHead(nn.Linear):
    """Name only (TP size 1); like vLLM's, never called: ``logits_processor`` applies its weight."""


class RMSNorm(nn.Module):
    """vLLM's RMSNorm: with a residual it adds first and returns ``(normed, new_residual)``."""

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
        dtype = x.dtype
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        out = self.weight * h.to(dtype)
        return out if residual is None else (out, residual)


class RotaryEmbedding(nn.Module):
    """Neox-style rotary embedding over ``[num_tokens, heads*head_dim]``, indexed by position."""

    def __init__(self, head_dim: int, theta: float) -> None:
        super().__init__()
        self.head_dim = head_dim
        inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def _rotate(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        t = x.view(x.shape[0], -1, self.head_dim)
        x1, x2 = t.chunk(2, dim=-1)
        rotated = torch.cat((-x2, x1), dim=-1)
        return (t * cos + rotated * sin).to(x.dtype).reshape(x.shape)

    def forward(
        self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = positions.float()[:, None] * self.inv_freq[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)[:, None, :]
        return self._rotate(q, emb.cos(), emb.sin()), self._rotate(k, emb.cos(), emb.sin())


class Attention(nn.Module):
    """Block-diagonal causal attention: the stand-in for vLLM's paged attention kernel.

    By default one SDPA call per request (exact, and cheap at test sizes). ``one_kernel=True``
    makes it one SDPA call per layer over the whole step with a block-diagonal causal mask: the
    same maths, but on a GPU a per-request Python loop would dominate a step that vLLM runs as
    one kernel (``bench/bench_overhead_gpu.py``).
    """

    def __init__(self, num_heads: int, num_kv_heads: int, head_dim: int, one_kernel: bool = False) -> None:
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.one_kernel = one_kernel

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        seq_lens = _SEQ_LENS.get()
        if seq_lens is None or sum(seq_lens) != q.shape[0]:
            raise RuntimeError("Attention needs forward_context(seq_lens) covering every packed token")
        if self.one_kernel:
            return self._masked(q, k, v, seq_lens)
        group = self.num_heads // self.num_kv_heads
        outs = []
        start = 0
        for n in seq_lens:
            qs = q[start : start + n].view(n, self.num_heads, self.head_dim).transpose(0, 1)
            ks = k[start : start + n].view(n, self.num_kv_heads, self.head_dim).transpose(0, 1)
            vs = v[start : start + n].view(n, self.num_kv_heads, self.head_dim).transpose(0, 1)
            ks = ks.repeat_interleave(group, dim=0)
            vs = vs.repeat_interleave(group, dim=0)
            o = F.scaled_dot_product_attention(qs, ks, vs, is_causal=True)
            outs.append(o.transpose(0, 1).reshape(n, self.num_heads * self.head_dim))
            start += n
        return torch.cat(outs, dim=0)

    def _masked(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, seq_lens: tuple[int, ...]
    ) -> torch.Tensor:
        n = q.shape[0]
        seg = torch.repeat_interleave(
            torch.arange(len(seq_lens), device=q.device), torch.tensor(seq_lens, device=q.device)
        )
        idx = torch.arange(n, device=q.device)
        mask = (seg[:, None] == seg[None, :]) & (idx[:, None] >= idx[None, :])
        group = self.num_heads // self.num_kv_heads
        qs = q.view(n, self.num_heads, self.head_dim).transpose(0, 1)
        ks = k.view(n, self.num_kv_heads, self.head_dim).transpose(0, 1).repeat_interleave(group, dim=0)
        vs = v.view(n, self.num_kv_heads, self.head_dim).transpose(0, 1).repeat_interleave(group, dim=0)
        o = F.scaled_dot_product_attention(qs, ks, vs, attn_mask=mask)
        return o.transpose(0, 1).reshape(n, self.num_heads * self.head_dim)


class Qwen2Attention(nn.Module):
    def __init__(
        self, hidden: int, num_heads: int, num_kv_heads: int, theta: float, one_kernel: bool = False
    ) -> None:
        super().__init__()
        self.head_dim = hidden // num_heads
        self.q_size = num_heads * self.head_dim
        self.kv_size = num_kv_heads * self.head_dim
        self.qkv_proj = QKVParallelLinear(hidden, self.q_size + 2 * self.kv_size, bias=True)
        self.o_proj = RowParallelLinear(self.q_size, hidden, bias=False)
        self.rotary_emb = RotaryEmbedding(self.head_dim, theta)
        self.attn = Attention(num_heads, num_kv_heads, self.head_dim, one_kernel)

    def forward(self, positions: torch.Tensor, hidden_states: torch.Tensor) -> torch.Tensor:
        qkv = self.qkv_proj(hidden_states)
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q, k = self.rotary_emb(positions, q, k)
        return self.o_proj(self.attn(q, k, v))


class SiluAndMul(nn.Module):
    """vLLM's activation: takes gate‖up, returns silu(gate) * up."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = x.chunk(2, dim=-1)
        return F.silu(gate) * up


class Qwen2MLP(nn.Module):
    def __init__(self, hidden: int, intermediate: int) -> None:
        super().__init__()
        self.gate_up_proj = MergedColumnParallelLinear(hidden, 2 * intermediate, bias=False)
        self.down_proj = RowParallelLinear(intermediate, hidden, bias=False)
        self.act_fn = SiluAndMul()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act_fn(self.gate_up_proj(x)))


class Qwen2DecoderLayer(nn.Module):
    def __init__(self, cfg: object, one_kernel: bool = False) -> None:
        super().__init__()
        hidden = cfg.hidden_size  # type: ignore[attr-defined]
        eps = cfg.rms_norm_eps  # type: ignore[attr-defined]
        self.self_attn = Qwen2Attention(
            hidden,
            cfg.num_attention_heads,  # type: ignore[attr-defined]
            cfg.num_key_value_heads,  # type: ignore[attr-defined]
            float(getattr(cfg, "rope_theta", 10000.0)),
            one_kernel,
        )
        self.mlp = Qwen2MLP(hidden, cfg.intermediate_size)  # type: ignore[attr-defined]
        self.input_layernorm = RMSNorm(hidden, eps)
        self.post_attention_layernorm = RMSNorm(hidden, eps)

    def forward(
        self, positions: torch.Tensor, hidden_states: torch.Tensor, residual: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if residual is None:
            residual = hidden_states
            hidden_states = self.input_layernorm(hidden_states)
        else:
            hidden_states, residual = self.input_layernorm(hidden_states, residual)
        hidden_states = self.self_attn(positions, hidden_states)
        hidden_states, residual = self.post_attention_layernorm(hidden_states, residual)
        return self.mlp(hidden_states), residual


class Qwen2Model(nn.Module):
    def __init__(self, cfg: object, one_kernel: bool = False) -> None:
        super().__init__()
        self.embed_tokens = VocabParallelEmbedding(cfg.vocab_size, cfg.hidden_size)  # type: ignore[attr-defined]
        self.layers = nn.ModuleList(
            [Qwen2DecoderLayer(cfg, one_kernel) for _ in range(cfg.num_hidden_layers)]  # type: ignore[attr-defined]
        )
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)  # type: ignore[attr-defined]

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        hidden_states = self.embed_tokens(input_ids)
        residual = None
        for layer in self.layers:
            hidden_states, residual = layer(positions, hidden_states, residual)
        hidden_states, _ = self.norm(hidden_states, residual)
        return hidden_states


class LogitsProcessor(nn.Module):
    """vLLM's LogitsProcessor: applies the (uncalled) ``lm_head`` weight to the sampled rows."""

    def forward(self, lm_head: nn.Module, hidden_states: torch.Tensor) -> torch.Tensor:
        return F.linear(hidden_states, lm_head.weight)


class Qwen2ForCausalLM(nn.Module):
    """STAND-IN for vLLM's ``Qwen2ForCausalLM``: packed ``input_ids`` [T] and ``positions`` [T] in,
    hidden states [T, hidden] out, inside :func:`forward_context`; logits via :meth:`compute_logits`.

    ``cfg`` is a transformers ``Qwen2Config`` or anything with its field names.
    ``one_kernel``: see :class:`Attention`.
    """

    def __init__(self, cfg: object, one_kernel: bool = False) -> None:
        super().__init__()
        self.model = Qwen2Model(cfg, one_kernel)
        self.lm_head = ParallelLMHead(cfg.hidden_size, cfg.vocab_size, bias=False)  # type: ignore[attr-defined]
        self.logits_processor = LogitsProcessor()

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids, positions)

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.logits_processor(self.lm_head, hidden_states)

    @classmethod
    def from_hf(cls, hf_model: nn.Module) -> Qwen2ForCausalLM:
        """Same weights as a transformers ``Qwen2ForCausalLM``, fused the way vLLM loads them."""
        cfg = hf_model.config
        model = cls(cfg).to(next(hf_model.parameters()).dtype)
        src = hf_model.state_dict()
        dst: dict[str, torch.Tensor] = {}
        for name in model.state_dict():
            if ".qkv_proj." in name:
                stem, kind = name.split(".qkv_proj.")
                dst[name] = torch.cat([src[f"{stem}.{p}_proj.{kind}"] for p in ("q", "k", "v")], dim=0)
            elif ".gate_up_proj." in name:
                stem = name.split(".gate_up_proj.")[0]
                dst[name] = torch.cat([src[f"{stem}.gate_proj.weight"], src[f"{stem}.up_proj.weight"]], dim=0)
            elif name == "lm_head.weight" and name not in src:
                dst[name] = src["model.embed_tokens.weight"]
            else:
                dst[name] = src[name]
        model.load_state_dict(dst)
        return model


def pack(requests: Sequence[Sequence[int]]) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
    """vLLM's packing of a prefill step: ids and positions concatenated, plus each request's length."""
    ids = torch.tensor([t for r in requests for t in r], dtype=torch.long)
    positions = torch.cat([torch.arange(len(r)) for r in requests])
    return ids, positions, [len(r) for r in requests]


def forward_step(
    model: Qwen2ForCausalLM, ids: torch.Tensor, positions: torch.Tensor, seq_lens: Sequence[int]
) -> tuple[torch.Tensor, torch.Tensor]:
    """One model-runner step on packed inputs: the forward, then logits at each request's last token."""
    with torch.no_grad(), forward_context(seq_lens):
        hidden = model(ids, positions)
        last = torch.tensor(list(seq_lens), device=hidden.device).cumsum(0) - 1
        logits = model.compute_logits(hidden[last])
    return hidden, logits


def run_step(model: Qwen2ForCausalLM, requests: Sequence[Sequence[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """One prefill step of whole prompts: :func:`pack`, then :func:`forward_step`."""
    return forward_step(model, *pack(requests))
