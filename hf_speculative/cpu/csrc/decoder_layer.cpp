// A decoder layer of a Llama-shaped model (Llama, Qwen2, Qwen3, Gemma3) for the few rows of decoding, drafting and
// verification (1-16 tokens; up to 64 where the products take them: layers.py native_rows), in two native calls
// around the model's own KV cache:
//
//     q, k, v = attention_inputs(plan, x, cos, sin)      # input norm, q/k/v products, q/k norms, rotary
//     K, V    = cache.update(k, v, ...)                  # transformers' cache object, in Python (keep / rollback)
//     y       = layer_output(plan, x, q, K, V, mask)     # attention, o-projection, residual, norms, gated MLP, residual
//
// Written out in PyTorch a layer is ~55 small operators on one core, each a few microseconds of dispatch and
// allocation around a few hundred nanoseconds of arithmetic (SmolLM2-135M: 13.5 ms of a 32 ms one-token forward);
// here they are loops over the rows in C++, and the products are skinny_linear.cpp's, on the same blocked weights.
//
// Every row is computed on its own arithmetic: the norms reduce each row in one fixed order, the rotary and
// activations are element-wise, the products and attention keep rows apart (see their files). So a row's result
// is bitwise the same computed alone (plain decoding) or beside the rows of a draft (verification), whatever the
// row count. It is not bitwise PyTorch's layer (other reduction orders, exp and tanh from libm rather than
// PyTorch's vectorized ones): plain decoding takes this path as well, so greedy and speculative outputs still
// agree token for token.
//
// The plan (LayerPlan) holds the layer's blocked weights and shapes, built in Python (hf_speculative/cpu/layers.py)
// and rebuilt when a weight changes.
#include "decoder_layer.h"

#include <immintrin.h>

#include <cmath>

namespace hfs_layer {
namespace {

Linear make_linear(at::Tensor blocked, c10::optional<at::Tensor> bias, c10::optional<at::Tensor> scale,
                   int64_t out) {
  Linear l;
  l.blocked = blocked;
  if (bias.has_value() && bias->defined()) {
    TORCH_CHECK(bias->scalar_type() == at::kFloat && bias->numel() == out, "LayerPlan: a bias [out] float32");
    l.bias = bias->contiguous();
  }
  if (scale.has_value() && scale->defined()) l.scale = *scale;
  l.out = out;
  return l;
}

Norm make_norm(c10::optional<at::Tensor> weight, bool offset, int64_t n) {
  Norm norm;
  if (weight.has_value() && weight->defined()) {
    TORCH_CHECK(weight->scalar_type() == at::kFloat && weight->numel() == n, "LayerPlan: a norm weight [", n,
                "] float32");
    norm.weight = weight->contiguous();
  }
  norm.offset = offset;
  return norm;
}

// y = x / sqrt(mean(x^2) + eps) * w (or * (1 + w)) for one row of n values, in place when y == x. The sum of
// squares runs in 8 lanes over the row in order, then the lanes in a fixed order: the row's own arithmetic.
__attribute__((target("avx2,fma"))) void rms_norm_row(const float* x, float* y, int64_t n, const Norm& norm,
                                                      double eps) {
  __m256 acc = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 v = _mm256_loadu_ps(x + i);
    acc = _mm256_fmadd_ps(v, v, acc);
  }
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, acc);
  float sum = ((lanes[0] + lanes[4]) + (lanes[1] + lanes[5])) + ((lanes[2] + lanes[6]) + (lanes[3] + lanes[7]));
  for (; i < n; ++i) sum += x[i] * x[i];
  const float r = 1.0f / std::sqrt(sum / static_cast<float>(n) + static_cast<float>(eps));
  const float* w = norm.weight.data_ptr<float>();
  if (norm.offset)
    for (int64_t j = 0; j < n; ++j) y[j] = (x[j] * r) * (1.0f + w[j]);
  else
    for (int64_t j = 0; j < n; ++j) y[j] = w[j] * (x[j] * r);
}

// x [M, n] -> a new [M, n]: each row normed.
at::Tensor rms_norm(const at::Tensor& x, const Norm& norm, double eps) {
  auto y = x.new_empty(x.sizes());
  const int64_t rows = x.size(0), n = x.size(1);
  const float* xp = x.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  for (int64_t m = 0; m < rows; ++m) rms_norm_row(xp + m * n, yp + m * n, n, norm, eps);
  return y;
}

// q [M, heads * D] of token rows (b, t) -> out [B, heads, T, D]: the per-head norm (when given), then the rotary
// embedding out = x * cos + rotate_half(x) * sin, with rotate_half(x) = (-x[D/2:], x[:D/2]) (transformers'
// apply_rotary_pos_emb). cos / sin: [Bc, T, D] with Bc 1 or B.
void heads_out(const float* q, int64_t B, int64_t T, int64_t heads, int64_t D, const Norm& norm, double eps,
               const float* cos, const float* sin, int64_t cos_batch_stride, float* out) {
  const int64_t half = D / 2;
  std::vector<float> normed(norm.present() ? D : 0);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t) {
      const float* c = cos + b * cos_batch_stride + t * D;
      const float* s = sin + b * cos_batch_stride + t * D;
      for (int64_t h = 0; h < heads; ++h) {
        const float* x = q + ((b * T + t) * heads + h) * D;
        if (norm.present()) {
          rms_norm_row(x, normed.data(), D, norm, eps);
          x = normed.data();
        }
        float* y = out + ((b * heads + h) * T + t) * D;
        for (int64_t i = 0; i < half; ++i) {
          const float rotated = x[i] * c[i], partner = -x[i + half] * s[i];
          y[i] = rotated + partner;
        }
        for (int64_t i = half; i < D; ++i) {
          const float rotated = x[i] * c[i], partner = x[i - half] * s[i];
          y[i] = rotated + partner;
        }
      }
    }
}

// v [M, kv_heads * D] -> out [B, kv_heads, T, D].
void heads_plain(const float* v, int64_t B, int64_t T, int64_t heads, int64_t D, float* out) {
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t)
      for (int64_t h = 0; h < heads; ++h)
        std::copy(v + ((b * T + t) * heads + h) * D, v + ((b * T + t) * heads + h + 1) * D,
                  out + ((b * heads + h) * T + t) * D);
}

void check_rows(const at::Tensor& x, const LayerPlan& plan) {
  TORCH_CHECK(x.dim() == 3 && x.scalar_type() == at::kFloat && x.size(2) == plan.hidden && x.is_contiguous(),
              "decoder layer: hidden states [B, T, ", plan.hidden, "] float32, contiguous");
}

}  // namespace

// x [B, T, C] -> q [B, H, T, D], k and v [B, Hkv, T, D]. A plan without an input norm takes x as the products'
// input as it is, of their width (EAGLE-3's [norm(embedding); norm(feature)], 2C wide).
std::tuple<at::Tensor, at::Tensor, at::Tensor> attention_inputs(const LayerPlan& plan, at::Tensor x,
                                                                         at::Tensor cos, at::Tensor sin) {
  const int64_t width = plan.q.blocked.size(1);
  TORCH_CHECK(x.dim() == 3 && x.scalar_type() == at::kFloat && x.size(2) == width && x.is_contiguous(),
              "attention_inputs: hidden states [B, T, ", width, "] float32, contiguous");
  const int64_t B = x.size(0), T = x.size(1), D = plan.head_dim;
  TORCH_CHECK(cos.dim() == 3 && sin.sizes() == cos.sizes() && cos.size(1) == T && cos.size(2) == D &&
                  (cos.size(0) == 1 || cos.size(0) == B) && cos.scalar_type() == at::kFloat &&
                  sin.scalar_type() == at::kFloat,
              "decoder layer: cos / sin [1 or B, T, head_dim] float32");
  cos = cos.contiguous();
  sin = sin.contiguous();
  const auto flat = x.view({B * T, width});
  const auto normed = plan.input.present() ? rms_norm(flat, plan.input, plan.eps) : flat;  // [M, C]
  const auto q = plan.q(normed), k = plan.k(normed), v = plan.v(normed);              // [M, H * D], [M, Hkv * D]
  auto qo = x.new_empty({B, plan.heads, T, D});
  auto ko = x.new_empty({B, plan.kv_heads, T, D});
  auto vo = x.new_empty({B, plan.kv_heads, T, D});
  const int64_t stride = cos.size(0) == 1 ? 0 : T * D;
  heads_out(q.data_ptr<float>(), B, T, plan.heads, D, plan.q_norm, plan.eps, cos.data_ptr<float>(),
            sin.data_ptr<float>(), stride, qo.data_ptr<float>());
  heads_out(k.data_ptr<float>(), B, T, plan.kv_heads, D, plan.k_norm, plan.eps, cos.data_ptr<float>(),
            sin.data_ptr<float>(), stride, ko.data_ptr<float>());
  heads_plain(v.data_ptr<float>(), B, T, plan.kv_heads, D, vo.data_ptr<float>());
  return {qo, ko, vo};
}

namespace {

inline float activate(float g, int64_t activation) {
  if (activation == SILU) return g / (1.0f + std::exp(-g));
  const float inner = 0.7978845608028654f * (g + 0.044715f * g * g * g);  // sqrt(2 / pi) (x + 0.044715 x^3)
  return 0.5f * g * (1.0f + std::tanh(inner));
}

}  // namespace

// x [B, T, C] (the layer's input, the residual), q [B, H, T, D], keys / values [B, Hkv, kv, D] (the cache after
// this forward's update), mask None (causal) or bool [B, T, kv]; or, instead of those four, the attention's result
// `attended` [B, T, H, D] computed elsewhere (a mask the kernel's attention does not read). Returns the layer's
// output [B, T, C].
at::Tensor layer_output(const LayerPlan& plan, at::Tensor x, c10::optional<at::Tensor> q,
                           c10::optional<at::Tensor> keys, c10::optional<at::Tensor> values,
                           c10::optional<at::Tensor> mask, c10::optional<at::Tensor> attended) {
  check_rows(x, plan);
  const int64_t B = x.size(0), T = x.size(1), M = B * T, C = plan.hidden;
  at::Tensor a;
  if (attended.has_value() && attended->defined()) {
    a = attended->contiguous();
    TORCH_CHECK(a.scalar_type() == at::kFloat && a.numel() == M * plan.heads * plan.head_dim,
                "layer_output: attended [B, T, H, D] float32");
  } else {
    TORCH_CHECK(q.has_value() && keys.has_value() && values.has_value(), "layer_output: q, keys and values");
    a = few_query_attention(*q, *keys, *values, mask, plan.attention_scale);  // [B, T, H, D]
  }
  auto h = plan.o(a.view({M, plan.heads * plan.head_dim}));  // [M, C]
  float* hp = h.data_ptr<float>();
  const float* xp = x.data_ptr<float>();
  for (int64_t m = 0; m < M; ++m) {  // (Gemma: the attention's output normed first) + the residual
    float* row = hp + m * C;
    if (plan.post_attention.present()) rms_norm_row(row, row, C, plan.post_attention, plan.eps);
    for (int64_t c = 0; c < C; ++c) row[c] = xp[m * C + c] + row[c];
  }
  const auto normed = rms_norm(h, plan.pre_mlp, plan.eps);
  auto gate = plan.gate(normed), up = plan.up(normed);  // [M, I]
  float* gp = gate.data_ptr<float>();
  const float* upp = up.data_ptr<float>();
  const int64_t I = gate.size(1);
  for (int64_t e = 0; e < M * I; ++e) gp[e] = activate(gp[e], plan.activation) * upp[e];
  auto down = plan.down(gate);  // [M, C]
  float* dp = down.data_ptr<float>();
  for (int64_t m = 0; m < M; ++m) {
    float* row = dp + m * C;
    if (plan.post_mlp.present()) rms_norm_row(row, row, C, plan.post_mlp, plan.eps);
    for (int64_t c = 0; c < C; ++c) row[c] = hp[m * C + c] + row[c];
  }
  return down.view({B, T, C});
}

// linears: for each of q, k, v, o, gate, up, down, (blocked, bias, scale, out); norms: input, q, k, post-attention,
// pre-MLP, post-MLP weights (None where the layer has none: an input that comes normed, as EAGLE-3's).
LayerPlan make_plan(std::vector<std::tuple<at::Tensor, Opt, Opt, int64_t>> linears, std::vector<Opt> norms,
                    bool norm_offset, double eps, double attention_scale, int64_t heads, int64_t kv_heads,
                    int64_t head_dim, int64_t hidden, int64_t activation) {
  TORCH_CHECK(linears.size() == 7 && norms.size() == 6, "LayerPlan: 7 linears (q k v o gate up down), 6 norms");
  TORCH_CHECK(head_dim % 2 == 0 && heads % kv_heads == 0, "LayerPlan: an even head dim, heads a multiple of kv heads");
  TORCH_CHECK(activation == SILU || activation == GELU_TANH, "LayerPlan: activation 0 (SiLU) or 1 (GELU, tanh)");
  TORCH_CHECK(norms[4].has_value() && norms[4]->defined(), "LayerPlan: the pre-MLP norm is needed");
  LayerPlan plan;
  Linear* slots[7] = {&plan.q, &plan.k, &plan.v, &plan.o, &plan.gate, &plan.up, &plan.down};
  for (int i = 0; i < 7; ++i) {
    auto& [blocked, bias, scale, out] = linears[i];
    *slots[i] = make_linear(blocked, bias, scale, out);
  }
  plan.input = make_norm(norms[0], norm_offset, plan.q.blocked.size(1));
  plan.q_norm = make_norm(norms[1], norm_offset, head_dim);
  plan.k_norm = make_norm(norms[2], norm_offset, head_dim);
  plan.post_attention = make_norm(norms[3], norm_offset, hidden);
  plan.pre_mlp = make_norm(norms[4], norm_offset, hidden);
  plan.post_mlp = make_norm(norms[5], norm_offset, hidden);
  TORCH_CHECK(plan.q.out == heads * head_dim && plan.k.out == kv_heads * head_dim &&
                  plan.v.out == kv_heads * head_dim && plan.o.out == hidden && plan.down.out == hidden &&
                  plan.gate.out == plan.up.out && plan.k.blocked.size(1) == plan.q.blocked.size(1) &&
                  plan.v.blocked.size(1) == plan.q.blocked.size(1),
              "LayerPlan: the products' sizes do not match the heads and hidden size");
  plan.eps = eps;
  plan.attention_scale = attention_scale;
  plan.heads = heads;
  plan.kv_heads = kv_heads;
  plan.head_dim = head_dim;
  plan.hidden = hidden;
  plan.activation = activation;
  return plan;
}

}  // namespace hfs_layer
