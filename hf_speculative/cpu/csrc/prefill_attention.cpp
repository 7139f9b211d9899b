// Causal attention of a prefill (every query row a position of the prompt, no cache before it) on a CPU, fp32, one
// core: what PyTorch's CPU flash attention does for `is_causal=True`, at nearly twice its arithmetic rate here
// (SmolLM2-135M, 767 tokens, 9 heads of 64 over 3 KV heads: 13.5 ms a layer in PyTorch 2.13, one thread, AMD EPYC).
//
// For each head, the query rows in blocks of QB: the block's scores against the keys its last row sees, as a small
// product on 16-key tiles of the keys transposed (keys [kv, D] -> [D, kv] once per KV head, shared by the heads of its
// group), QB rows x 32 keys of sums in registers (a query value broadcast, a tile row loaded, per input dim); then
// per row its causal prefix's softmax (exp of the scores minus their max, summed in key order), and the weighted sum of
// the values, QB rows x 32 dims in registers (a weight broadcast, a value row loaded, per key), divided by the sum.
// Rows past a row's prefix hold weight 0. fp32 throughout; not bitwise SDPA (another order of sums, a polynomial
// exp), as SDPA is not bitwise itself across its block sizes. Prefill runs once, before plain decoding and
// verification alike, so their outputs still agree token for token.
//
// Query row i sees keys 0..i (q == kv). D a multiple of 16, at most 256.
#include "exp.h"
#include "tensor.h"
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

namespace {

constexpr int QB = 8;    // query rows a block: 8 x 2 tiles of sums, 16 of the 32 registers
constexpr int TILE = 16;  // keys a tile (one register)

// Scores of M <= QB rows (queries q, row stride D) against keys [0, n) of the transposed keys kt [D, ld]: s[r * ld + j]
// = scale * sum_d q[r, d] kt[d, j], for n rounded up to 32 (kt is zero past the keys).
template <int M>
__attribute__((target("avx512f,fma"))) void block_scores(const float* q, int64_t D, const float* kt, int64_t ld,
                                                         int64_t n, float scale, float* s) {
  for (int64_t j = 0; j < n; j += 2 * TILE) {
    __m512 a[M], b[M];
    for (int r = 0; r < M; ++r) a[r] = b[r] = _mm512_setzero_ps();
    for (int64_t d = 0; d < D; ++d) {
      const __m512 k0 = _mm512_loadu_ps(kt + d * ld + j), k1 = _mm512_loadu_ps(kt + d * ld + j + TILE);
      for (int r = 0; r < M; ++r) {
        const __m512 qv = _mm512_set1_ps(q[r * D + d]);
        a[r] = _mm512_fmadd_ps(qv, k0, a[r]);
        b[r] = _mm512_fmadd_ps(qv, k1, b[r]);
      }
    }
    const __m512 sv = _mm512_set1_ps(scale);
    for (int r = 0; r < M; ++r) {
      _mm512_storeu_ps(s + r * ld + j, _mm512_mul_ps(a[r], sv));
      _mm512_storeu_ps(s + r * ld + j + TILE, _mm512_mul_ps(b[r], sv));
    }
  }
}

// Row r's weights in place: exp(s - max) over its `seen` keys, 0 after them up to n (rounded to 32); returns 1 / sum.
__attribute__((target("avx512f,fma"))) float row_weights(float* s, int64_t seen, int64_t n) {
  __m512 mv = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  int64_t j = 0;
  for (; j + TILE <= seen; j += TILE) mv = _mm512_max_ps(mv, _mm512_loadu_ps(s + j));
  const __mmask16 tail = static_cast<__mmask16>((1u << (seen - j)) - 1u);
  if (seen > j) mv = _mm512_mask_max_ps(mv, tail, mv, _mm512_loadu_ps(s + j));
  const __m512 m = _mm512_set1_ps(_mm512_reduce_max_ps(mv));
  __m512 sum = _mm512_setzero_ps();
  for (j = 0; j + TILE <= seen; j += TILE) {
    const __m512 e = exp16(_mm512_sub_ps(_mm512_loadu_ps(s + j), m));
    _mm512_storeu_ps(s + j, e);
    sum = _mm512_add_ps(sum, e);
  }
  if (seen > j) {
    const __m512 e = _mm512_maskz_mov_ps(tail, exp16(_mm512_sub_ps(_mm512_loadu_ps(s + j), m)));
    _mm512_storeu_ps(s + j, e);
    sum = _mm512_add_ps(sum, e);
    j += TILE;
  }
  for (; j < n; j += TILE) _mm512_storeu_ps(s + j, _mm512_setzero_ps());
  return 1.0f / _mm512_reduce_add_ps(sum);
}

// out rows (stride `ostride`) = (weights [M, n] (row stride ld) x values [n, D] (row stride vstride)) * inv[r],
// 32 dims a pass.
template <int M>
__attribute__((target("avx512f,fma"))) void block_values(const float* w, int64_t ld, int64_t n, const float* v,
                                                         int64_t vstride, int64_t D, const float* inv, float* out,
                                                         int64_t ostride) {
  for (int64_t c = 0; c < D; c += 2 * TILE) {
    __m512 a[M], b[M];
    for (int r = 0; r < M; ++r) a[r] = b[r] = _mm512_setzero_ps();
    for (int64_t j = 0; j < n; ++j) {
      const __m512 v0 = _mm512_loadu_ps(v + j * vstride + c), v1 = _mm512_loadu_ps(v + j * vstride + c + TILE);
      for (int r = 0; r < M; ++r) {
        const __m512 p = _mm512_set1_ps(w[r * ld + j]);
        a[r] = _mm512_fmadd_ps(p, v0, a[r]);
        b[r] = _mm512_fmadd_ps(p, v1, b[r]);
      }
    }
    for (int r = 0; r < M; ++r) {
      const __m512 iv = _mm512_set1_ps(inv[r]);
      _mm512_storeu_ps(out + r * ostride + c, _mm512_mul_ps(a[r], iv));
      _mm512_storeu_ps(out + r * ostride + c + TILE, _mm512_mul_ps(b[r], iv));
    }
  }
}

using ScoresFn = void (*)(const float*, int64_t, const float*, int64_t, int64_t, float, float*);
using ValuesFn = void (*)(const float*, int64_t, int64_t, const float*, int64_t, int64_t, const float*, float*,
                          int64_t);
constexpr ScoresFn SCORES[QB] = {block_scores<1>, block_scores<2>, block_scores<3>, block_scores<4>,
                                 block_scores<5>, block_scores<6>, block_scores<7>, block_scores<8>};
constexpr ValuesFn VALUES[QB] = {block_values<1>, block_values<2>, block_values<3>, block_values<4>,
                                 block_values<5>, block_values<6>, block_values<7>, block_values<8>};

}  // namespace

bool has_prefill_attention() {
  static const bool yes = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") != 0;
  }();
  return yes;
}

// query [B, H, L, D], key / value [B, Hkv, L, D] (the last dim contiguous): causal attention, row i over keys 0..i.
// Returns [B, L, H, D].
at::Tensor prefill_attention(at::Tensor query, at::Tensor key, at::Tensor value, double scale) {
  TORCH_CHECK(has_prefill_attention(), "prefill_attention: this CPU has no AVX-512F");
  TORCH_CHECK(query.scalar_type() == at::kFloat && key.scalar_type() == at::kFloat &&
                  value.scalar_type() == at::kFloat,
              "prefill_attention: fp32 tensors");
  TORCH_CHECK(query.dim() == 4 && key.dim() == 4 && value.dim() == 4, "prefill_attention: 4-D tensors");
  const int64_t B = query.size(0), H = query.size(1), L = query.size(2), D = query.size(3);
  const int64_t Hkv = key.size(1);
  TORCH_CHECK(D % (2 * TILE) == 0 && D <= 256, "prefill_attention: head dim a multiple of 32, at most 256");
  TORCH_CHECK(Hkv > 0 && H % Hkv == 0 && key.size(0) == B && value.size(0) == B && value.size(1) == Hkv &&
                  key.size(2) == L && value.size(2) == L && key.size(3) == D && value.size(3) == D,
              "prefill_attention: query [B, H, L, D], key and value [B, Hkv, L, D] with H a multiple of Hkv");
  auto q = query.contiguous();
  auto v = value.stride(3) == 1 ? value : value.contiguous();
  auto k = key.stride(3) == 1 ? key : key.contiguous();
  auto out = query.new_empty({B, L, H, D});
  const int64_t group = H / Hkv, ld = (L + 2 * TILE - 1) / (2 * TILE) * (2 * TILE);
  const float* qp = q.data_ptr<float>();
  const float* kp = k.data_ptr<float>();
  const float* vp = v.data_ptr<float>();
  float* op = out.data_ptr<float>();
  const float sc = static_cast<float>(scale);
  at::parallel_for(0, B * Hkv, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> kt(D * ld), s(QB * ld), inv(QB);
    for (int64_t bg = begin; bg < end; ++bg) {
      const int64_t b = bg / Hkv, g = bg % Hkv;
      const float* kg = kp + b * k.stride(0) + g * k.stride(1);
      const float* vg = vp + b * v.stride(0) + g * v.stride(1);
      std::fill(kt.begin(), kt.end(), 0.0f);
      for (int64_t j = 0; j < L; ++j)  // [L, D] -> [D, ld]
        for (int64_t d = 0; d < D; ++d) kt[d * ld + j] = kg[j * k.stride(2) + d];
      for (int64_t h = g * group; h < (g + 1) * group; ++h) {
        const float* qh = qp + (b * H + h) * L * D;
        for (int64_t i0 = 0; i0 < L; i0 += QB) {
          const int64_t m = std::min<int64_t>(QB, L - i0);
          const int64_t n = i0 + m;  // keys the block's last row sees
          const int64_t n32 = (n + 2 * TILE - 1) / (2 * TILE) * (2 * TILE);
          SCORES[m - 1](qh + i0 * D, D, kt.data(), ld, n32, sc, s.data());
          for (int64_t r = 0; r < m; ++r) inv[r] = row_weights(s.data() + r * ld, i0 + r + 1, n32);
          VALUES[m - 1](s.data(), ld, n, vg, v.stride(2), D, inv.data(), op + ((b * L + i0) * H + h) * D, H * D);
        }
      }
    }
  });
  return out;
}
