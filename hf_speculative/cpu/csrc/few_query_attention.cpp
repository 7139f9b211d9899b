// Attention for a few query tokens (plain decoding: one; verifying a draft: 2-64) on a CPU, in fp32: the rows of a
// 16-bit model's short forwards (hf_speculative/cpu/attention.py), widened to fp32. Each block of 8 keys is read once
// for all the query rows of a kv head's group, the values for 3 rows at a time in blocks of 64 keys (a block stays in
// L1 across the passes over its dims, so the values are read from memory once: at 8 rows x 4,096 tokens a step of
// SmolLM2 took 173 against 182 ms with a pass over every key per 32 dims). Where the CPU has AVX-512VL the same 8-lane
// code runs with 32 registers: scores two rows at a time (each key block loaded once for both), values 6 rows a pass,
// and a row's max over 8 lanes at a time; 49 -> 54 GFLOP/s at 16 rows x 800 keys (9 heads of 64 over 3), the same
// bits (each row's sums are the same FMA chains and reductions).
//
// For query row i of head h (kv head g = h / (H / Hkv)), over the keys it may see, in ascending position j:
//     s_j = scale * dot(q[h, i], k[g, j])            (one 8-lane FMA chain over D in order, a fixed reduction)
//     m = max_j s_j,  p_j = exp(s_j - m)             (a polynomial exp, 8 lanes at a time)
//     l = sum_j p_j,  out[i, h] = (sum_j p_j v[g, j]) / l      (sums in ascending j)
// Every quantity of a row depends only on that row's query and the keys and values it sees, never on the other
// rows, their number or the thread count: a verification row is bitwise what plain decoding computes at the same
// position (the same keys visible), as the kernel's products are.
//
// What a row sees: without a mask, the causal prefix (row i of q sees kv - q + i + 1 keys); with a mask [B, q, kv]
// (bool), the positions it marks (a tree's prefix, ancestors and itself). D must be a multiple of 8.
#include "exp.h"
#include "tensor.h"
#include <immintrin.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <algorithm>
#include <vector>

namespace {

__attribute__((target("avx2,fma"))) inline float hsum8(__m256 v) {  // a fixed order: (0+4, 1+5, 2+6, 3+7), pairs
  const __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 t = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(t, _mm_shuffle_ps(t, t, 1)));
}

// 8 keys' sums (one register each) reduced to one register of 8 scores, in a fixed order per key:
// ((x0 + x1) + (x2 + x3)) + ((x4 + x5) + (x6 + x7)) of its lanes.
__attribute__((target("avx2,fma"))) inline __m256 reduce8(const __m256* a) {
  const __m256 s0123 = _mm256_hadd_ps(_mm256_hadd_ps(a[0], a[1]), _mm256_hadd_ps(a[2], a[3]));
  const __m256 s4567 = _mm256_hadd_ps(_mm256_hadd_ps(a[4], a[5]), _mm256_hadd_ps(a[6], a[7]));
  return _mm256_add_ps(_mm256_permute2f128_ps(s0123, s4567, 0x20), _mm256_permute2f128_ps(s0123, s4567, 0x31));
}

// The scores of one query against 8 keys: 8 FMA chains over D (one per key, in order), each reduced by reduce8,
// whatever the other keys are.
__attribute__((target("avx2,fma"))) inline __m256 dots8(const float* q, const float* const* rows, int64_t chunks) {
  __m256 a[8];
  const __m256 q0 = _mm256_loadu_ps(q);
  for (int u = 0; u < 8; ++u) a[u] = _mm256_mul_ps(q0, _mm256_loadu_ps(rows[u]));
  for (int64_t c = 1; c < chunks; ++c) {
    const __m256 qc = _mm256_loadu_ps(q + 8 * c);
    for (int u = 0; u < 8; ++u) a[u] = _mm256_fmadd_ps(qc, _mm256_loadu_ps(rows[u] + 8 * c), a[u]);
  }
  return reduce8(a);
}

// Keys (and values) 64 positions ahead of the ones being read are prefetched into L2: at long contexts a kv head's
// keys and values (1 MB each at 4,096 tokens of 64 dims) come from memory, where the hardware's prefetchers alone
// read ~13 GB/s here. SmolLM2, 8 rows x 4,096 tokens, one new token a row: every layer's attention 115-118 -> 72-73
// ms (21 GB/s), the step 143-146 -> 101-102 ms (benchmarks/long_context_step.py; 32 keys ahead or 128, or into L1,
// were slower). Prefetches only move lines: the results are bitwise the same.
constexpr int64_t KEY_PREFETCH = 64;  // keys ahead

// The 8 keys from `t` (those below `upto`), every 64-byte line of their `chunks` 8-float chunks.
inline void prefetch_keys(const float* k, int64_t key_stride, int64_t t, int64_t upto, int64_t chunks) {
  for (int64_t u = t; u < std::min(t + 8, upto); ++u)
    for (int64_t c = 0; c < chunks; c += 2) _mm_prefetch(reinterpret_cast<const char*>(k + u * key_stride + 8 * c),
                                                         _MM_HINT_T1);
}

// Scores of every query row against keys 0..upto-1 (padded to 8: past `upto`, key 0 again, unused), scaled, into
// scores[r * (upto + 8) + j]. AVX2: one row at a time (dots8).
__attribute__((target("avx2,fma"))) void scores_avx2(const float* const* queries, int64_t R, const float* k,
                                                     int64_t key_stride, int64_t upto, int64_t chunks, float scale,
                                                     float* scores) {
  const __m256 sv = _mm256_set1_ps(scale);
  const float* rows[8];
  for (int64_t t = 0; t < upto; t += 8) {
    for (int u = 0; u < 8; ++u) rows[u] = k + (t + u < upto ? t + u : 0) * key_stride;
    prefetch_keys(k, key_stride, t + KEY_PREFETCH, upto, chunks);
    for (int64_t r = 0; r < R; ++r)
      _mm256_storeu_ps(scores + r * (upto + 8) + t, _mm256_mul_ps(dots8(queries[r], rows, chunks), sv));
  }
}

// The same scores, two rows at a time where AVX-512VL gives 32 vector registers: each block of 8 keys is loaded
// once for both rows, whose 16 sums stay in registers beside it (AVX2's 16 registers would spill them). Each (row,
// key) score is dots8's: the same FMA chain over D and the same reduction, so the results are bitwise equal.
__attribute__((target("avx512f,avx512vl,fma"))) void scores_avx512(const float* const* queries, int64_t R,
                                                                    const float* k, int64_t key_stride, int64_t upto,
                                                                    int64_t chunks, float scale, float* scores) {
  const __m256 sv = _mm256_set1_ps(scale);
  const float* rows[8];
  for (int64_t t = 0; t < upto; t += 8) {
    for (int u = 0; u < 8; ++u) rows[u] = k + (t + u < upto ? t + u : 0) * key_stride;
    prefetch_keys(k, key_stride, t + KEY_PREFETCH, upto, chunks);
    int64_t r = 0;
    for (; r + 2 <= R; r += 2) {
      const float* q0 = queries[r];
      const float* q1 = queries[r + 1];
      __m256 a[8], b[8];
      const __m256 x0 = _mm256_loadu_ps(q0), y0 = _mm256_loadu_ps(q1);
      for (int u = 0; u < 8; ++u) {
        const __m256 kv = _mm256_loadu_ps(rows[u]);
        a[u] = _mm256_mul_ps(x0, kv);
        b[u] = _mm256_mul_ps(y0, kv);
      }
      for (int64_t c = 1; c < chunks; ++c) {
        const __m256 xc = _mm256_loadu_ps(q0 + 8 * c), yc = _mm256_loadu_ps(q1 + 8 * c);
        for (int u = 0; u < 8; ++u) {
          const __m256 kv = _mm256_loadu_ps(rows[u] + 8 * c);
          a[u] = _mm256_fmadd_ps(xc, kv, a[u]);
          b[u] = _mm256_fmadd_ps(yc, kv, b[u]);
        }
      }
      _mm256_storeu_ps(scores + r * (upto + 8) + t, _mm256_mul_ps(reduce8(a), sv));
      _mm256_storeu_ps(scores + (r + 1) * (upto + 8) + t, _mm256_mul_ps(reduce8(b), sv));
    }
    for (; r < R; ++r)
      _mm256_storeu_ps(scores + r * (upto + 8) + t, _mm256_mul_ps(dots8(queries[r], rows, chunks), sv));
  }
}

bool cpu_has_avx512vl() {
  static const bool yes = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl");
  }();
  return yes;
}

// The largest of p[0..n-1]: 8 lanes at a time, then the lanes and the last 1-7 (a max is the same in any order).
__attribute__((target("avx2,fma"))) float max_of(const float* p, int64_t n) {
  float m = -std::numeric_limits<float>::infinity();
  int64_t t = 0;
  if (n >= 8) {
    __m256 mv = _mm256_loadu_ps(p);
    for (t = 8; t + 8 <= n; t += 8) mv = _mm256_max_ps(mv, _mm256_loadu_ps(p + t));
    alignas(32) float lanes[8];
    _mm256_store_ps(lanes, mv);
    for (int u = 0; u < 8; ++u) m = lanes[u] > m ? lanes[u] : m;
  }
  for (; t < n; ++t) m = p[t] > m ? p[t] : m;
  return m;
}

// exp(s - m) of a row's visible scores `p` (n of them, in place), 8 at a time; returns their sum, in that order.
__attribute__((target("avx2,fma"))) float softmax_weights(float* p, int64_t n, float m) {
  const __m256 mv = _mm256_set1_ps(m);
  __m256 sum = _mm256_setzero_ps();
  int64_t t = 0;
  for (; t + 8 <= n; t += 8) {
    const __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(p + t), mv));
    _mm256_storeu_ps(p + t, e);
    sum = _mm256_add_ps(sum, e);
  }
  if (t < n) {  // the last 1-7, padded with -inf (weight 0)
    alignas(32) float tail[8];
    for (int64_t u = 0; u < 8; ++u) tail[u] = t + u < n ? p[t + u] : -std::numeric_limits<float>::infinity();
    const __m256 e = exp8(_mm256_sub_ps(_mm256_load_ps(tail), mv));
    _mm256_store_ps(tail, e);
    for (int64_t u = 0; t + u < n; ++u) p[t + u] = tail[u];
    sum = _mm256_add_ps(sum, e);
  }
  return hsum8(sum);
}

// NR rows' weighted sums of NC 8-lane chunks of the values (the chunk `c0` on), over keys j0..j1-1 in order; a row
// adds only the keys it sees. Constant loop bounds keep the NR x NC sums in registers; between blocks of keys they
// wait in `partial` (row r's sums at partial + r * partial_stride + 8 * c: stored and loaded, never rounded), so the
// sums are those of one pass over every key. The first block starts them at 0, the last one writes them out.
// (One body, inlined into a function per instruction set below: the AVX-512VL one gets 32 registers for it.)
#define HFS_VALUES_PARAMS                                                                                         \
  const float *v, int64_t value_stride, int64_t j0, int64_t j1, const float *weights, int64_t weight_stride,      \
      const unsigned char *seen, int64_t seen_stride, const float *inv, float *const *outs, int64_t c0,             \
      float *partial, int64_t partial_stride, bool first, bool last, int64_t prefetch_to
#define HFS_VALUES_ARGS                                                                                            \
  v, value_stride, j0, j1, weights, weight_stride, seen, seen_stride, inv, outs, c0, partial, partial_stride, first, \
      last, prefetch_to
template <int NR, int NC>
__attribute__((always_inline)) inline void values_body(HFS_VALUES_PARAMS) {
  __m256 acc[NR][NC];
  for (int r = 0; r < NR; ++r)
    for (int c = 0; c < NC; ++c)
      acc[r][c] = first ? _mm256_setzero_ps() : _mm256_loadu_ps(partial + r * partial_stride + 8 * c);
  for (int64_t j = j0; j < j1; ++j) {
    const float* vr = v + j * value_stride;
    if (prefetch_to > j + KEY_PREFETCH)  // the same dims of a key ahead, in the next block
      for (int c = 0; c < NC; c += 2) _mm_prefetch(reinterpret_cast<const char*>(vr + KEY_PREFETCH * value_stride +
                                                                                 8 * c), _MM_HINT_T1);
    __m256 vv[NC];
    for (int c = 0; c < NC; ++c) vv[c] = _mm256_loadu_ps(vr + 8 * c);
    for (int r = 0; r < NR; ++r) {
      if (!seen[r * seen_stride + j]) continue;
      const __m256 p = _mm256_broadcast_ss(weights + r * weight_stride + j);
      for (int c = 0; c < NC; ++c) acc[r][c] = _mm256_fmadd_ps(p, vv[c], acc[r][c]);
    }
  }
  if (!last) {
    for (int r = 0; r < NR; ++r)
      for (int c = 0; c < NC; ++c) _mm256_storeu_ps(partial + r * partial_stride + 8 * c, acc[r][c]);
    return;
  }
  for (int r = 0; r < NR; ++r) {
    const __m256 iv = _mm256_set1_ps(inv[r]);
    for (int c = 0; c < NC; ++c) _mm256_storeu_ps(outs[r] + 8 * (c0 + c), _mm256_mul_ps(acc[r][c], iv));
  }
}

// AVX2: 16 registers, so up to 3 rows x 4 chunks a pass.
template <int NR, int NC>
__attribute__((target("avx2,fma"))) void values_pass(HFS_VALUES_PARAMS) {
  values_body<NR, NC>(HFS_VALUES_ARGS);
}

// AVX-512VL: the same 8-lane code with 32 registers, so up to 6 rows x 4 chunks a pass (24 sums, the 4 chunks of a
// key's values and a weight): each key's values are loaded once for twice as many rows (AVX2's 3 rows already spill
// a sum). Each row's sums are the same FMA chains. (Masking unseen keys out of the FMAs instead of branching was
// slower here: 48 against 54 GFLOP/s at 16 rows x 800 keys.)
template <int NR, int NC>
__attribute__((target("avx512f,avx512vl,fma"))) void values_pass512(HFS_VALUES_PARAMS) {
  values_body<NR, NC>(HFS_VALUES_ARGS);
}

using ValuesFn = void (*)(HFS_VALUES_PARAMS);
constexpr int MAX_VALUE_ROWS = 6;  // rows a pass, AVX-512VL (AVX2: 3)
constexpr ValuesFn VALUES_AVX2[3] = {values_pass<1, 4>, values_pass<2, 4>, values_pass<3, 4>};
constexpr ValuesFn VALUES_AVX512[MAX_VALUE_ROWS] = {values_pass512<1, 4>, values_pass512<2, 4>, values_pass512<3, 4>,
                                                     values_pass512<4, 4>, values_pass512<5, 4>, values_pass512<6, 4>};

// Keys a block of the values pass takes: 64 rows of 64 dims are 16 KB, so a block read from memory by the first pass
// over its dims stays in L1 for the other passes (a head of 128 dims: 32 KB, in L2).
constexpr int64_t VALUE_BLOCK = 64;

// All query rows of one kv head's group (R = heads of the group x query tokens) at once, so that each block of 8 keys
// and of 8 values is read from memory once for all of them and from L1 after. A row's arithmetic is its own (see the
// file's comment): scores for every key up to the furthest any row sees (a key's dot does not depend on the keys
// computed beside it), then per row its visible keys in order.
__attribute__((target("avx2,fma"))) void attend_group(const float* const* queries, int64_t R, const float* k,
                                                      const float* v, int64_t key_stride, int64_t value_stride,
                                                      const std::vector<int64_t>* const* seen, int64_t upto,
                                                      int64_t d, float scale, float* scores, float* weights,
                                                      float* const* outs) {
  const int64_t chunks = d / 8;
  (cpu_has_avx512vl() && R > 1 ? scores_avx512 : scores_avx2)(queries, R, k, key_stride, upto, chunks, scale, scores);
  // softmax per row over its visible keys in order; the weights then stored by key position (only the visible
  // positions are read after)
  std::vector<float> inv(R);
  std::vector<unsigned char> visible(R * upto, 0);
  for (int64_t r = 0; r < R; ++r) {
    const std::vector<int64_t>& row_seen = *seen[r];
    const int64_t n = static_cast<int64_t>(row_seen.size());
    float* sr = scores + r * (upto + 8);
    float m = -std::numeric_limits<float>::infinity();
    if (n > 0 && row_seen[n - 1] == n - 1) {  // (ascending, distinct:) keys 0..n-1, the causal prefix: in place
      m = max_of(sr, n);
      inv[r] = 1.0f / softmax_weights(sr, n, m);
      std::fill(visible.begin() + r * upto, visible.begin() + r * upto + n, 1);
      continue;
    }
    float* w = weights + r * (upto + 8);
    for (int64_t t = 0; t < n; ++t) w[t] = sr[row_seen[t]];
    m = max_of(w, n);
    inv[r] = 1.0f / softmax_weights(w, n, m);
    float* pos = scores + r * (upto + 8);  // the scores are read: their place holds the weights by position
    for (int64_t t = n - 1; t >= 0; --t) pos[row_seen[t]] = w[t];  // (row_seen ascending: no weight overwritten early)
    for (int64_t t = 0; t < n; ++t) visible[r * upto + row_seen[t]] = 1;
  }
  // values: up to 3 rows at a time (AVX-512VL: 6), 32 dims a pass (their sums in registers), the keys in ascending
  // order; each row adds the keys it sees, one FMA each, in that order: its own sums whatever rows are beside it. The
  // keys are taken in blocks of VALUE_BLOCK, every pass over a block before the next block, so that the values are
  // read from memory once (a head's values at a long context do not stay in cache from one pass to the next)
  std::vector<float> partial(R * d);  // the passes' sums between blocks, [R, d]
  const bool wide = cpu_has_avx512vl();
  const int64_t group_rows = wide ? MAX_VALUE_ROWS : 3;
  for (int64_t j0 = 0; j0 < upto; j0 += VALUE_BLOCK) {
    const int64_t j1 = std::min(j0 + VALUE_BLOCK, upto);
    const bool first = j0 == 0, last = j1 == upto;
    for (int64_t r0 = 0; r0 < R; r0 += group_rows) {
      const int64_t rows_here = std::min<int64_t>(group_rows, R - r0);
      const float* weight_rows = scores + r0 * (upto + 8);
      const unsigned char* seen_rows = visible.data() + r0 * upto;
      const int64_t ws = upto + 8;
      float* part = partial.data() + r0 * d;
      for (int64_t c0 = 0; c0 < chunks; c0 += 4) {
        const float* vc = v + 8 * c0;
        float* pc = part + 8 * c0;
        if (chunks - c0 >= 4)
          (wide ? VALUES_AVX512 : VALUES_AVX2)[rows_here - 1](vc, value_stride, j0, j1, weight_rows, ws, seen_rows,
                                                              upto, inv.data() + r0, outs + r0, c0, pc, d, first,
                                                              last, r0 == 0 ? upto : 0);
        else  // fewer than 32 dims left: one chunk a pass
          for (int64_t c = c0; c < chunks; ++c)
            for (int64_t r = 0; r < rows_here; ++r)
              values_pass<1, 1>(v + 8 * c, value_stride, j0, j1, weight_rows + r * ws, ws, seen_rows + r * upto, upto,
                                inv.data() + r0 + r, outs + r0 + r, c, part + r * d + 8 * c, d, first, last,
                                r0 == 0 && r == 0 ? upto : 0);
      }
    }
  }
}

}  // namespace

// query [B, H, q, D], key / value [B, Hkv, kv, D] (any strides with the last dim contiguous), mask: None (causal)
// or bool [B, q, kv]. Returns [B, q, H, D].
at::Tensor few_query_attention(at::Tensor query, at::Tensor key, at::Tensor value,
                                  c10::optional<at::Tensor> mask, double scale) {
  TORCH_CHECK(query.dtype() == at::kFloat && key.dtype() == at::kFloat && value.dtype() == at::kFloat,
              "few_query_attention: fp32 tensors");
  TORCH_CHECK(query.dim() == 4 && key.dim() == 4 && value.dim() == 4, "few_query_attention: 4-D tensors");
  const int64_t B = query.size(0), H = query.size(1), Q = query.size(2), D = query.size(3);
  const int64_t Hkv = key.size(1), KV = key.size(2);
  TORCH_CHECK(D % 8 == 0 && D <= 128, "few_query_attention: head dim a multiple of 8, at most 128");
  TORCH_CHECK(H % Hkv == 0 && key.size(0) == B && value.size(2) == KV && value.size(1) == Hkv, "shapes");
  TORCH_CHECK(key.stride(3) == 1 && value.stride(3) == 1, "few_query_attention: contiguous head dim");
  auto q = query.contiguous();
  auto out = query.new_empty({B, Q, H, D});
  at::Tensor m;
  if (mask.has_value()) {
    m = mask->to(at::kBool).contiguous();
    TORCH_CHECK(m.dim() == 3 && m.size(0) == B && m.size(1) == Q && m.size(2) == KV, "mask [B, q, kv]");
  }
  const float* qp = q.data_ptr<float>();
  const float* kp = key.data_ptr<float>();
  const float* vp = value.data_ptr<float>();
  float* op = out.data_ptr<float>();
  const bool* mp = mask.has_value() ? m.data_ptr<bool>() : nullptr;
  const int64_t group = H / Hkv;
  at::parallel_for(0, B * Hkv, 1, [&](int64_t begin, int64_t end) {
    const int64_t R = group * Q;
    std::vector<std::vector<int64_t>> visible_of(Q);  // the keys each query token sees, of batch row `listed`
    int64_t listed = -1;
    std::vector<const std::vector<int64_t>*> seen(R);  // a row's keys: its token's list (the group's heads share it)
    std::vector<float> scores(R * (KV + 8)), weights(R * (KV + 8));
    std::vector<const float*> queries(R);
    std::vector<float*> outs(R);
    for (int64_t bg = begin; bg < end; ++bg) {
      const int64_t b = bg / Hkv, g = bg % Hkv;
      if (b != listed) {  // once per batch row, for all its kv heads
        for (int64_t i = 0; i < Q; ++i) {
          std::vector<int64_t>& visible = visible_of[i];
          visible.clear();
          if (mp == nullptr) {
            for (int64_t j = 0; j < KV - Q + i + 1; ++j) visible.push_back(j);
          } else {
            const bool* row = mp + (b * Q + i) * KV;
            for (int64_t j = 0; j < KV; ++j)
              if (row[j]) visible.push_back(j);
          }
        }
        listed = b;
      }
      int64_t upto = 0, live = 0;
      for (int64_t i = 0; i < Q; ++i) {
        const std::vector<int64_t>& visible = visible_of[i];
        for (int64_t hh = 0; hh < group; ++hh) {
          const int64_t h = g * group + hh;
          float* orow = op + ((b * Q + i) * H + h) * D;
          if (visible.empty()) {  // a padding row that sees nothing: zeros (SDPA would give NaN)
            std::fill(orow, orow + D, 0.0f);
            continue;
          }
          seen[live] = &visible;
          queries[live] = qp + ((b * H + h) * Q + i) * D;
          outs[live] = orow;
          ++live;
        }
        if (!visible.empty()) upto = std::max(upto, visible.back() + 1);
      }
      if (live)
        attend_group(queries.data(), live, kp + b * key.stride(0) + g * key.stride(1),
                     vp + b * value.stride(0) + g * value.stride(1), key.stride(2), value.stride(2), seen.data(), upto,
                     D,
                     static_cast<float>(scale), scores.data(), weights.data(), outs.data());
    }
  });
  return out;
}
