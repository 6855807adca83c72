"""Rotary position embedding tables, including the rope_scaling kinds Llama/Qwen checkpoints ship."""

from __future__ import annotations

import math

import numpy as np

from minillm.models.config import ModelConfig

SUPPORTED_ROPE_SCALING = ("default", "linear", "llama3", "yarn")


def inv_freq_and_scale(cfg: ModelConfig) -> tuple[np.ndarray, float]:
    """Inverse frequencies [head_dim/2] and the factor cos/sin are multiplied by."""
    d = cfg.head_dim
    inv = 1.0 / (cfg.rope_theta ** (np.arange(0, d, 2, dtype=np.float64) / d))
    rs = cfg.rope_scaling
    if rs.kind == "default":
        return inv, 1.0
    if rs.kind == "linear":
        return inv / rs.factor, 1.0
    if rs.kind == "llama3":
        old = rs.original_max_position_embeddings
        low_wl = old / rs.low_freq_factor
        high_wl = old / rs.high_freq_factor
        wl = 2 * math.pi / inv
        out = np.where(wl > low_wl, inv / rs.factor, inv)
        smooth = (old / wl - rs.low_freq_factor) / (rs.high_freq_factor - rs.low_freq_factor)
        mid = (wl <= low_wl) & (wl >= high_wl)
        out = np.where(mid, (1 - smooth) * out / rs.factor + smooth * out, out)
        return out, 1.0
    if rs.kind == "yarn":
        old = rs.original_max_position_embeddings
        scale = rs.attention_factor if rs.attention_factor is not None else 0.1 * math.log(rs.factor) + 1.0

        def dim_for(rot: float) -> float:
            return d * math.log(old / (rot * 2 * math.pi)) / (2 * math.log(cfg.rope_theta))

        low = max(math.floor(dim_for(rs.beta_fast)), 0)
        high = min(math.ceil(dim_for(rs.beta_slow)), d - 1)
        if low == high:
            high += 0.001
        ramp = np.clip((np.arange(d // 2, dtype=np.float64) - low) / (high - low), 0, 1)
        extrapolation = 1 - ramp
        out = (inv / rs.factor) * (1 - extrapolation) + inv * extrapolation
        return out, scale
    raise ValueError(
        f"unsupported rope_scaling type {rs.kind!r}; supported: {', '.join(SUPPORTED_ROPE_SCALING)}"
    )


def cos_sin_table(cfg: ModelConfig, max_positions: int) -> np.ndarray:
    """[max_positions, head_dim] float32: cos in the first half of each row, sin in the second."""
    inv, scale = inv_freq_and_scale(cfg)
    angles = np.arange(max_positions, dtype=np.float64)[:, None] * inv[None, :]
    return np.concatenate([np.cos(angles) * scale, np.sin(angles) * scale], axis=1).astype(np.float32)
