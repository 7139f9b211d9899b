// y = x W^T + b for a few rows of a bf16 model (plain decoding: one; verifying a draft: 2-16), on the CPU's bf16
// dot products (AVX512-BF16), reading the weight once for all rows.
//
// The weight is a pair-blocked copy of a bf16 nn.Linear weight W [out, in]: wb [ceil(out / 16), ceil(in / 2), 16, 2],
// wb[j, p, c, e] = W[16 j + c, 2 p + e] (zero past `out` and `in`). One 64-byte load holds a block's 16 output
// columns for two inputs, which is what VDPBF16PS multiplies with a pair of inputs broadcast to every lane: 32
// multiply-adds an instruction, twice the rate of fp32 FMAs, so verifying a few rows costs little more than one
// (the fp32 kernel's products are bound by the core's FMAs from ~4 rows). Each output is one chain of those
// instructions in input order (per pair: the odd input's product, then the even one's, each added in fp32 with
// round-to-nearest-even, denormals flushed), plus the bias, rounded once to bf16: a row's result is bitwise the
// same computed alone (plain decoding) or with the rows of a draft (verification), for any row count or thread
// count. Streams and registers as skinny_linear.cpp's AVX-512 code.
#include "tensor.h"
#include <ATen/ops/constant_pad_nd.h>
#include <c10/util/BFloat16.h>
#include <immintrin.h>

#include <algorithm>
#include <cstdint>

// AVX512-BF16 intrinsics need GCC 10 / clang 9 or newer; an older compiler builds the rest of the kernel, and bf16
// models then stay on PyTorch's products (has_bf16_dot() is false)
#if (defined(__clang__) && __clang_major__ >= 9) || (!defined(__clang__) && defined(__GNUC__) && __GNUC__ >= 10)
#define HFS_BF16_DOT 1
#else
#define HFS_BF16_DOT 0
#endif

namespace {

constexpr int64_t BLOCK = 16;          // output columns per block: one 16-lane register of sums
constexpr int64_t MAX_ROWS = 16;       // rows per pass: 16 sums + the weight in 32 registers
constexpr int64_t AHEAD_BYTES = 2048;  // one stream (13+ rows): prefetch 2 KiB ahead of it

struct Args {
  const uint32_t* x;  // [M, pairs]: two bf16 inputs in each 32-bit word, the even one in the low half
  const uint32_t* wb;  // [blocks, pairs, 16]: two bf16 weights of one output column in each word
  const c10::BFloat16* b;
  c10::BFloat16* y;
  int64_t pairs, out;
};

// Block j's sums [rows][16] + bias into y [rows, out] as bf16 (round to nearest even), cut at `out`.
void store(const float* sums, int rows, const c10::BFloat16* b, c10::BFloat16* y, int64_t out, int64_t j) {
  const int64_t o = j * BLOCK, width = std::min(BLOCK, out - o);
  for (int m = 0; m < rows; ++m)
    for (int64_t c = 0; c < width; ++c) {
      const float v = sums[m * BLOCK + c];
      y[m * out + o + c] = c10::BFloat16(b ? v + static_cast<float>(b[o + c]) : v);
    }
}

#if HFS_BF16_DOT
template <int M, int S>
__attribute__((target("avx512f,avx512bf16"))) void blocks(const Args& a, int64_t begin, int64_t end) {
  const uint32_t* wb = a.wb;  // the arguments as locals: through `a` they could alias the outputs
  const uint32_t* x = a.x;
  const int64_t pairs = a.pairs, step = (end - begin + S - 1) / S, ahead = AHEAD_BYTES / sizeof(uint32_t);
  for (int64_t t = 0; t < step; ++t) {
    const uint32_t* r[S];
    int64_t j[S];
    __m512 acc[S][M];
    for (int s = 0; s < S; ++s) {
      j[s] = begin + t + s * step;
      r[s] = wb + std::min(j[s], end - 1) * pairs * BLOCK;  // past the range: read a valid block, drop it
      for (int m = 0; m < M; ++m) acc[s][m] = _mm512_setzero_ps();
    }
    for (int64_t p = 0; p < pairs; ++p) {
      if (S == 1) _mm_prefetch(reinterpret_cast<const char*>(r[0] + p * BLOCK + ahead), _MM_HINT_T0);
      __m512i w[S];
#pragma GCC unroll 8
      for (int s = 0; s < S; ++s) w[s] = _mm512_loadu_si512(r[s] + p * BLOCK);
#pragma GCC unroll 16
      for (int m = 0; m < M; ++m) {
        const __m512i xm = _mm512_set1_epi32(static_cast<int>(x[m * pairs + p]));
#pragma GCC unroll 8
        for (int s = 0; s < S; ++s) acc[s][m] = _mm512_dpbf16_ps(acc[s][m], (__m512bh)xm, (__m512bh)w[s]);
      }
    }
    alignas(64) float sums[S][M][BLOCK];
#pragma GCC unroll 8
    for (int s = 0; s < S; ++s)
#pragma GCC unroll 16
      for (int m = 0; m < M; ++m) _mm512_store_ps(sums[s][m], acc[s][m]);
    for (int s = 0; s < S; ++s)
      if (j[s] < end) store(sums[s][0], M, a.b, a.y, a.out, j[s]);
  }
}

template <int M>
void rows(const Args& a) {
  // streams as the sums allow (S x M <= 24 of the 32 registers): several streams read memory faster on one core
  constexpr int S = M <= 4 ? 4 : M <= 6 ? 3 : M <= 12 ? 2 : 1;
  at::parallel_for(0, (a.out + BLOCK - 1) / BLOCK, 64, [&](int64_t begin, int64_t end) {
    blocks<M, S>(a, begin, end);
  });
}

using RowsFn = void (*)(const Args&);
constexpr RowsFn ROWS[MAX_ROWS] = {rows<1>, rows<2>,  rows<3>,  rows<4>,  rows<5>,  rows<6>,  rows<7>,  rows<8>,
                                   rows<9>, rows<10>, rows<11>, rows<12>, rows<13>, rows<14>, rows<15>, rows<16>};
#endif

}  // namespace

bool has_bf16_dot() {
#if HFS_BF16_DOT
  static const bool yes = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bf16");
  }();
  return yes;
#else
  return false;
#endif
}

// x: [M, in] bfloat16; wb: [ceil(out / 16), ceil(in / 2), 16, 2] bfloat16, contiguous; bias: [out] bfloat16 or
// None. Returns [M, out] bfloat16.
at::Tensor skinny_linear_bf16(at::Tensor x, at::Tensor wb, c10::optional<at::Tensor> bias, int64_t out) {
  TORCH_CHECK(has_bf16_dot(), "skinny_linear_bf16: this CPU has no AVX512-BF16 dot products");
  TORCH_CHECK(x.dim() == 2 && wb.dim() == 4 && wb.size(2) == BLOCK && wb.size(3) == 2 &&
                  wb.size(1) == (x.size(1) + 1) / 2,
              "skinny_linear_bf16: x [M, in], pair-blocked weight [ceil(out / 16), ceil(in / 2), 16, 2]");
  TORCH_CHECK(wb.size(0) == (out + BLOCK - 1) / BLOCK,
              "skinny_linear_bf16: the blocked weight does not have `out` columns");
  TORCH_CHECK(x.scalar_type() == at::kBFloat16 && wb.scalar_type() == at::kBFloat16,
              "skinny_linear_bf16: x and the blocked weight bfloat16");
  TORCH_CHECK(wb.is_contiguous(), "skinny_linear_bf16: the blocked weight must be contiguous (block_pairs)");
  x = x.contiguous();
  if (x.size(1) % 2) x = at::constant_pad_nd(x, {0, 1});  // an odd input count: a zero input pairs the last one
  at::Tensor b;
  if (bias.has_value() && bias->defined()) {
    b = bias->contiguous();
    TORCH_CHECK(b.scalar_type() == at::kBFloat16 && b.numel() == out, "skinny_linear_bf16: bias [out] bfloat16");
  }
  const int64_t m_total = x.size(0), pairs = wb.size(1);
  auto y = x.new_empty({m_total, out});
  const auto* xw = reinterpret_cast<const uint32_t*>(x.data_ptr<at::BFloat16>());
  auto* yw = reinterpret_cast<c10::BFloat16*>(y.data_ptr<at::BFloat16>());
  Args a{xw, reinterpret_cast<const uint32_t*>(wb.data_ptr<at::BFloat16>()),
         b.defined() ? reinterpret_cast<const c10::BFloat16*>(b.data_ptr<at::BFloat16>()) : nullptr, yw, pairs, out};
#if HFS_BF16_DOT
  for (int64_t m0 = 0; m0 < m_total; m0 += MAX_ROWS) {
    const int64_t m = std::min(MAX_ROWS, m_total - m0);
    a.x = xw + m0 * pairs;
    a.y = yw + m0 * out;
    ROWS[m - 1](a);
  }
#endif
  return y;
}
