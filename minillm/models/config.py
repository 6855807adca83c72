"""ModelConfig: the shape of a Llama-family transformer, whatever file it came from.

Both loaders (HF directories and GGUF files) produce one of these plus a dict of weights under
the canonical names below, so the model code and the backends never look at file formats.

Canonical weight names (float32 NumPy arrays on load; a backend converts them once):
    embed                      [vocab, hidden]
    layers.{i}.attn_norm       [hidden]
    layers.{i}.q / k / v       [heads*head_dim | kv_heads*head_dim, hidden]   (HF [out, in] layout)
    layers.{i}.q_bias/k_bias/v_bias   (Qwen2 only)
    layers.{i}.q_norm / k_norm [head_dim]                                   (Qwen3 only)
    layers.{i}.o               [hidden, heads*head_dim]
    layers.{i}.mlp_norm        [hidden]
    layers.{i}.gate / up       [ffn, hidden]
    layers.{i}.down            [hidden, ffn]
    norm                       [hidden]
    lm_head                    [vocab, hidden]  (absent when tied: the embedding is used)
"""

from __future__ import annotations

from dataclasses import dataclass, field

SUPPORTED_ARCHITECTURES = ("llama", "qwen2", "qwen3")


@dataclass
class RopeScaling:
    """rope_scaling as the HF configs ship it; kind "default" means plain RoPE."""

    kind: str = "default"  # default | linear | llama3 | yarn | dynamic
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    attention_factor: float | None = None


@dataclass
class ModelConfig:
    arch: str  # llama | qwen2 | qwen3
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: RopeScaling = field(default_factory=RopeScaling)
    max_position_embeddings: int = 4096
    tie_word_embeddings: bool = False
    attention_bias: bool = False  # q/k/v biases (Qwen2)
    qk_norm: bool = False  # per-head RMSNorm on q and k (Qwen3)
    torch_dtype: str = "float32"  # the dtype the weights were stored in
    bos_token_id: int | None = None
    eos_token_ids: list[int] = field(default_factory=list)
    pad_token_id: int | None = None
    # DFlash2 drafters: a grouped dynamic causal convolution (kernel size, channels a group) before
    # and after each layer's attention and MLP (models/transformer.py's CausalConv); 0: none
    conv_kernel_size: int = 0
    conv_group_size: int = 0

    def __post_init__(self) -> None:
        if self.arch not in SUPPORTED_ARCHITECTURES:
            raise ValueError(
                f"unsupported architecture {self.arch!r}; supported: {', '.join(SUPPORTED_ARCHITECTURES)}"
            )
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"num_heads {self.num_heads} is not a multiple of num_kv_heads {self.num_kv_heads}"
            )

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    @property
    def conv_width(self) -> int:
        """Columns of a conv's kernel projection: 2 halves x kernel_size taps x groups (0: no convs)."""
        if not self.conv_kernel_size:
            return 0
        return 2 * self.conv_kernel_size * (self.hidden_size // self.conv_group_size)

    def kv_bytes_per_token(self, dtype_bytes: int) -> int:
        """Bytes of K and V one token occupies across all layers."""
        return 2 * self.num_layers * self.kv_size * dtype_bytes
