// elementwise.cu: silu_mul (the gated MLP activation) and the bias broadcast used by matmul.
#include "common.cuh"

// out[r, i] = silu(gate_up[r, i]) * gate_up[r, F + i]
__device__ __forceinline__ float silu_times(float a, float b) { return a / (1.0f + expf(-a)) * b; }

template <typename T>
__device__ __forceinline__ void silu_mul_impl(const T* __restrict__ gu, i64 gu_stride,
                                              T* __restrict__ out, i64 out_stride, int F,
                                              int rows) {
  minillm::pdl_entry();
  const int r = blockIdx.x;  // rows on x (no 65535 limit), column chunks on y
  if (r >= rows) return;
  const T* g = gu + (i64)r * gu_stride;
  T* o = out + (i64)r * out_stride;
  for (int i = blockIdx.y * blockDim.x + threadIdx.x; i < F; i += gridDim.y * blockDim.x) {
    const float a = minillm::to_f(minillm::load_act(g + i));
    const float b = minillm::to_f(minillm::load_act(g + F + i));
    o[i] = minillm::from_f<T>(silu_times(a, b));
  }
}

// The same for bf16 rows whose F, strides and pointers are multiples of 8 elements: 8 columns a
// thread, moved as 16-byte words (the one-element version measured 90 us for 8,192 x 3,072 in a
// prefill step, ~2.5x its bytes at copy bandwidth; part85). Same arithmetic, the same bits.
extern "C" __global__ void silu_mul_bf16_vec8(const bf16* __restrict__ gu, i64 gu_stride,
                                              bf16* __restrict__ out, i64 out_stride, int F, int rows) {
  minillm::pdl_entry();
  const int r = blockIdx.x;
  if (r >= rows) return;
  const bf16* g = gu + (i64)r * gu_stride;
  bf16* o = out + (i64)r * out_stride;
  for (int i = 8 * (blockIdx.y * blockDim.x + threadIdx.x); i < F; i += 8 * gridDim.y * blockDim.x) {
    float a[8], b[8];
    // gate_up: the product just before (load_act: not the read-only path, common.cuh)
    minillm::unpack_bf16x8(minillm::load_act(reinterpret_cast<const uint4*>(g + i)), a);
    minillm::unpack_bf16x8(minillm::load_act(reinterpret_cast<const uint4*>(g + F + i)), b);
#pragma unroll
    for (int e = 0; e < 8; ++e) a[e] = silu_times(a[e], b[e]);
    *reinterpret_cast<uint4*>(o + i) = minillm::pack_bf16x8(a);
  }
}

// out[r, :] = bias (matmul then accumulates x @ w.T onto it with beta = 1: one rounding).
template <typename TO, typename TB>
__device__ __forceinline__ void fill_bias_impl(TO* __restrict__ out, i64 out_stride,
                                               const TB* __restrict__ bias, int N, int rows) {
  minillm::pdl_entry();
  const int r = blockIdx.x;
  if (r >= rows) return;
  TO* o = out + (i64)r * out_stride;
  for (int i = blockIdx.y * blockDim.x + threadIdx.x; i < N; i += gridDim.y * blockDim.x)
    o[i] = minillm::from_f<TO>(minillm::to_f(bias[i]));
}

extern "C" __global__ void silu_mul_bf16(const bf16* gu, i64 gs, bf16* out, i64 os, int F,
                                         int rows) {
  silu_mul_impl<bf16>(gu, gs, out, os, F, rows);
}
extern "C" __global__ void silu_mul_f32(const float* gu, i64 gs, float* out, i64 os, int F,
                                        int rows) {
  silu_mul_impl<float>(gu, gs, out, os, F, rows);
}
extern "C" __global__ void fill_bias_bf16_bf16(bf16* out, i64 os, const bf16* b, int N, int rows) {
  fill_bias_impl<bf16, bf16>(out, os, b, N, rows);
}
extern "C" __global__ void fill_bias_f32_f32(float* out, i64 os, const float* b, int N, int rows) {
  fill_bias_impl<float, float>(out, os, b, N, rows);
}
extern "C" __global__ void fill_bias_f32_bf16(float* out, i64 os, const bf16* b, int N, int rows) {
  fill_bias_impl<float, bf16>(out, os, b, N, rows);
}

// In place over [rows, cols] (row stride `stride`): x *= factor, or with cap > 0 the logit
// soft-cap x = tanh(x / cap) * cap.
template <typename T>
__device__ __forceinline__ void scale_softcap_impl(T* x, i64 stride, int rows, int cols,
                                                   float factor, float cap) {
  minillm::pdl_entry();
  const int r = blockIdx.x;
  if (r >= rows) return;
  T* p = x + (i64)r * stride;
  for (int i = blockIdx.y * blockDim.x + threadIdx.x; i < cols; i += gridDim.y * blockDim.x) {
    const float v = minillm::to_f(p[i]);
    p[i] = minillm::from_f<T>(cap > 0.f ? tanhf(v / cap) * cap : v * factor);
  }
}

// logits[rows[i], ids[i]] = -inf for i < n (min_tokens: EOS / stop tokens may not be drawn yet).
template <typename T>
__device__ __forceinline__ void suppress_tokens_impl(T* logits, i64 stride, const int* rows,
                                                     const int* ids, int n, int n_rows, int V) {
  minillm::pdl_entry();
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const int r = rows[i], t = ids[i];
  MINILLM_CHECK(r >= 0 && r < n_rows && t >= 0 && t < V);
  logits[(i64)r * stride + t] = minillm::from_f<T>(minillm::neg_inf());
}

// logits[rows[i], t] = -inf for every t < V whose bit is clear in mask row i (structured outputs'
// allowed tokens, minillm/engine/structured.py: int32 words, bit t % 32 of word t / 32; tokens at or
// past 32 * words are banned too). Grid (ceil(V / 256), rows), block 256.
template <typename T>
__device__ __forceinline__ void mask_logits_impl(T* logits, i64 stride, const int* rows, const unsigned* mask,
                                                 int words, int n_rows, int V) {
  minillm::pdl_entry();
  const int i = blockIdx.y, t = blockIdx.x * blockDim.x + threadIdx.x;
  if (t >= V) return;
  const int r = rows[i];
  MINILLM_CHECK(r >= 0 && r < n_rows);
  const bool allowed = t < 32 * words && ((mask[(i64)i * words + (t >> 5)] >> (t & 31)) & 1u);
  if (!allowed) logits[(i64)r * stride + t] = minillm::from_f<T>(minillm::neg_inf());
}

// logits[rows[i], ids[i]] = (x > 0 ? x * scale_pos[i] : x * scale_neg[i]) - subtract[i] for i < n
// (repetition, presence and frequency penalties; the host lists each (row, token) once).
template <typename T>
__device__ __forceinline__ void penalize_logits_impl(T* logits, i64 stride, const int* rows, const int* ids,
                                                     const float* scale_pos, const float* scale_neg,
                                                     const float* subtract, int n, int n_rows, int V) {
  minillm::pdl_entry();
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const int r = rows[i], t = ids[i];
  MINILLM_CHECK(r >= 0 && r < n_rows && t >= 0 && t < V);
  T* p = logits + (i64)r * stride + t;
  const float x = minillm::to_f(*p);
  *p = minillm::from_f<T>((x > 0.f ? x * scale_pos[i] : x * scale_neg[i]) - subtract[i]);
}

#define MINILLM_LOGIT_OPS(SUFFIX, T)                                                           \
  extern "C" __global__ void scale_softcap_##SUFFIX(T* x, i64 stride, int rows, int cols,      \
                                                    float factor, float cap) {                 \
    scale_softcap_impl<T>(x, stride, rows, cols, factor, cap);                                 \
  }                                                                                            \
  extern "C" __global__ void suppress_tokens_##SUFFIX(T* logits, i64 stride, const int* rows,  \
                                                      const int* ids, int n, int n_rows, int V) { \
    suppress_tokens_impl<T>(logits, stride, rows, ids, n, n_rows, V);                          \
  }                                                                                            \
  extern "C" __global__ void mask_logits_##SUFFIX(T* logits, i64 stride, const int* rows,      \
                                                  const unsigned* mask, int words, int n_rows, int V) { \
    mask_logits_impl<T>(logits, stride, rows, mask, words, n_rows, V);                         \
  }                                                                                            \
  extern "C" __global__ void penalize_logits_##SUFFIX(                                         \
      T* logits, i64 stride, const int* rows, const int* ids, const float* scale_pos,          \
      const float* scale_neg, const float* subtract, int n, int n_rows, int V) {               \
    penalize_logits_impl<T>(logits, stride, rows, ids, scale_pos, scale_neg, subtract, n,      \
                            n_rows, V);                                                        \
  }

MINILLM_LOGIT_OPS(bf16, bf16)
MINILLM_LOGIT_OPS(f32, float)
