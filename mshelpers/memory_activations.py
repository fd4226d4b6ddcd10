"""Training memory, activations: the bytes one transformer layer keeps for backward (Korthikanti et al. 2022,
with flash attention, grouped-query attention and mindformers' LLaMA block) and the logits of the loss. The one
memory model (the config doctor's `memory_per_stage`, which `memory.estimate` prices every config through) counts
every layer with these two.

    >>> activation_bytes_per_layer(128, 8, 256, 4) == 128 * 8 * 256 * 44
    True

All sizes are bytes. Pure Python, no sibling imports: the module can be copied alone.

Sources:
- Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer
  Models", section 4 and table 2 (activation bytes per layer).
- Dao et al. 2022, "FlashAttention": the s² attention matrix is never materialised.
- Ainslie et al. 2023, "GQA": num_kv_heads < num_heads shrinks K and V.
- mindformers: the Llama 2 performance-tuning notes (select_recompute of SiLU and Mul) and
  mindformers/models/llama/llama_layer.py.
"""
from __future__ import annotations

import math
import numbers
from fractions import Fraction
from typing import Any

ARCHS = ("gpt", "llama")
RECOMPUTE_MODES = ("none", "selective", "full")


def activation_bytes_per_layer(seq_len: int, batch: int, hidden_size: int, n_heads: int, *, tp: int = 1,
                               sequence_parallel: bool = False, recompute: str = "none",
                               bytes_per_value: float = 2, flash_attention: bool = False,
                               num_kv_heads: int | None = None, ffn_hidden_size: int | None = None,
                               arch: str = "gpt") -> int:
    """Activation bytes one transformer layer keeps for backward (Korthikanti et al. 2022).

    With s = seq_len, b = micro-batch per device, h = hidden, a = heads, t = tp, and
    16-bit activations (their section 4.1, table 2), for their GPT block (arch="gpt"):
      none, t = 1           s·b·h·(34 + 5·a·s/h)
      tensor parallel t     s·b·h·(10 + 24/t + 5·a·s/(h·t))   (norms, dropouts unsplit)
      tp + sequence par.    s·b·h·(34 + 5·a·s/h) / t
      selective recompute   drops the 5·a·s/h term (softmax, its dropout, QK^T, attention over V)
      full recompute        2·s·b·h: only the layer input is kept (/t with sequence parallel)
    Where the numbers come from, per s·b·h: 10 unsplit = two LayerNorm inputs 4 + QKV input 2 +
    MLP input 2 + two 1-byte dropout masks 2; 24 split = Q 2 + K 2 + V 2 + out-projection input 2
    + MLP 4·r (the 4h-wide fc1 output and GeLU output, r = ffn/h = 4).
    Extensions, each a term of that count:
      flash_attention   the s² scores are never stored (FlashAttention, Dao et al. 2022): the
                        5·a·s/h term is 0. Its O(s) softmax statistics are ignored.
      num_kv_heads      grouped-query attention: K and V are kv/a as wide, so 2 + 2 becomes
                        2·g + 2·g with g = num_kv_heads/n_heads.
      ffn_hidden_size   MLP width f (default 4h for "gpt"; required for "llama"), r = f/h.
      arch="llama"      mindformers' LLaMA block: RMSNorm, no dropout (unsplit 8 = norm inputs 4
                        + QKV input 2 + MLP input 2), a SwiGLU MLP that stores four f-wide tensors
                        (w1 out, w3 out, SiLU out, product: 8·r), and "selective" recompute as
                        mindformers' default select_recompute patterns (feed_forward.mul and
                        feed_forward.w1.activation.silu: drops SiLU out and product, 4·r) in
                        addition to the attention scores.
    So per s·b·h: gpt = 10 + (4 + 4g + 4r + 5as/h)/t, llama = 8 + (4 + 4g + 8r + 5as/h)/t, and
    with sequence parallel the unsplit part is divided by t as well (the all-gathered inputs of
    the column-parallel linears are re-gathered in backward, not stored; in mindformers that is
    select_comm_recompute of the norms). `bytes_per_value` rescales the whole count from 2 bytes
    to another width (4 for fp32 on CPU); the 1-byte masks are scaled too, which is slightly
    pessimistic. The count is exact arithmetic, rounded up once to whole bytes.

        >>> activation_bytes_per_layer(128, 8, 256, 4)            # 128*8*256*(34+10)
        11534336
        >>> activation_bytes_per_layer(128, 8, 256, 4, recompute="full")
        524288
        >>> activation_bytes_per_layer(128, 8, 256, 4, flash_attention=True) == 128 * 8 * 256 * 34
        True

    Taught in notebooks/06_recompute_memory.ipynb.
    """
    s, b, h, a, t = (_pos_arg("activation_bytes_per_layer", n, v) for n, v in
                     (("seq_len", seq_len), ("batch", batch), ("hidden_size", hidden_size),
                      ("n_heads", n_heads), ("tp", tp)))
    if recompute not in RECOMPUTE_MODES:
        raise ValueError(f"activation_bytes_per_layer: recompute={recompute!r} is invalid; "
                         f"fix: use one of {RECOMPUTE_MODES}")
    if not isinstance(bytes_per_value, numbers.Real) or isinstance(bytes_per_value, bool) or bytes_per_value <= 0:
        raise ValueError(f"activation_bytes_per_layer: bytes_per_value={bytes_per_value!r} is invalid; "
                         "fix: pass the activation width in bytes (2 for fp16/bf16, 4 for fp32)")
    if arch not in ARCHS:
        raise ValueError(f"activation_bytes_per_layer: arch={arch!r} is unknown; fix: use one of {ARCHS}")
    kv = a if num_kv_heads is None else _pos_arg("activation_bytes_per_layer", "num_kv_heads", num_kv_heads)
    if kv > a or a % kv:
        raise ValueError(f"activation_bytes_per_layer: num_kv_heads={kv} must divide n_heads={a}; "
                         "fix: pass a divisor of n_heads (None = multi-head attention)")
    if ffn_hidden_size is None and arch == "llama":
        raise ValueError("activation_bytes_per_layer: ffn_hidden_size=None with arch='llama'; "
                         "fix: pass the SwiGLU width, e.g. 11008 for LLaMA-2 7B")
    f = 4 * h if ffn_hidden_size is None else _pos_arg("activation_bytes_per_layer", "ffn_hidden_size",
                                                         ffn_hidden_size)
    F = Fraction
    g, r = F(kv, a), F(f, h)
    attn = 0 if flash_attention else F(5 * a * s, h)   # the s²-sized attention tensors, per sbh
    if arch == "gpt":
        unsplit, split, selective_drop = F(10), 4 + 4 * g + 4 * r, F(0)
    else:
        unsplit, split, selective_drop = F(8), 4 + 4 * g + 8 * r, 4 * r
    sbh = s * b * h
    if recompute == "full":
        per_sbh = F(2, t if sequence_parallel else 1)
    else:
        split_part = split + (attn if recompute == "none" else -selective_drop)
        per_sbh = (unsplit + split_part) / t if sequence_parallel else unsplit + split_part / t
    return math.ceil(sbh * per_sbh * F(bytes_per_value) / 2)


def output_activation_bytes(seq_len: int, batch: int, vocab_size: int, *, tp: int = 1,
                            bytes_per_value: int = 2) -> int:
    """Logits plus the fp32 softmax of the cross-entropy: 4·s·b·V/t bytes at 16 bits (Korthikanti eq. 4).

        >>> output_activation_bytes(128, 8, 1024)
        4194304

    Taught in notebooks/06_recompute_memory.ipynb (inside estimate).
    """
    s, b, v, t = (_pos_arg("output_activation_bytes", n, x) for n, x in
                  (("seq_len", seq_len), ("batch", batch), ("vocab_size", vocab_size), ("tp", tp)))
    return math.ceil(4 * s * b * v / t * bytes_per_value / 2)


# --- small helpers (each memory_* module keeps its own, so each can be copied alone) ---
def _pos_count(fn: str, name: str, v: Any, zero_ok: bool = False) -> int:
    """A count from an int, a numpy integer or a float with an integral value (7e9); else one ValueError."""
    if isinstance(v, numbers.Real) and not isinstance(v, bool) and math.isfinite(float(v)) \
            and float(v).is_integer() and (int(v) > 0 or zero_ok and int(v) == 0):
        return int(v)
    raise ValueError(f"{fn}: {name}={v!r} is invalid; fix: pass a {'non-negative' if zero_ok else 'positive'} "
                     "integer" + (" (a count has no fraction)" if isinstance(v, float) and math.isfinite(v) else ""))


def _pos_arg(fn: str, name: str, v: Any) -> int:
    return _pos_count(fn, name, v)
