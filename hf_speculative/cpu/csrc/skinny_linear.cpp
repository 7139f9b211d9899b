// y = x W^T + b for a few rows x (plain decoding: one; verifying a draft: 2-16), reading the weight
// once for all rows.
//
// The weight is a blocked copy of an nn.Linear weight W [out, in]: wb [ceil(out / 16), in, 16],
// wb[j, i, c] = W[16 j + c, i] (zero past `out`). A block's 16 output columns are accumulated in
// registers for up to 8 rows while its in x 16 values are read as one sequential stream, so the
// product runs at the machine's memory bandwidth whatever the row count (the column-major panels
// of the first version kept the sums in L1 and read 16-row strides of the weight: 1.3x slower for
// 4 rows). Every output is one FMA chain in input order plus the bias, whatever the number of
// rows, threads, blocks or streams: a row's result is bitwise the same computed alone (plain
// decoding) or with the rows of a draft (verification).
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <immintrin.h>

#include <algorithm>

namespace {

constexpr int64_t BLOCK = 16;     // output columns per block: two AVX2 registers
constexpr int64_t MAX_ROWS = 8;   // rows per pass over the weight (2 x 8 accumulators: a few spill)
constexpr int64_t AHEAD = 32;     // one stream (4+ rows): prefetch 2 KiB ahead of it

// Block j's sums [rows][16] (+ bias) into y [rows, out], cut at `out`.
void store(const float* sums, int rows, const float* b, float* y, int64_t out, int64_t j) {
  const int64_t o = j * BLOCK, width = std::min(BLOCK, out - o);
  for (int m = 0; m < rows; ++m)
    for (int64_t c = 0; c < width; ++c) y[m * out + o + c] = b ? sums[m * BLOCK + c] + b[o + c] : sums[m * BLOCK + c];
}

// S blocks at once, S sequential streams from distant parts of the copy: one core reads memory
// faster from several streams than from one (SmolLM2's weights, one row: 25 ms with 4 streams,
// 36 with one, MKL 39). Streams are chosen so that the 2 * S * M sums fit in registers; a single
// stream (4+ rows) is prefetched, several are left to the hardware's prefetchers, which do better.
template <int M, int S>
void blocks(const float* x, const float* wb, const float* b, float* y, int64_t in, int64_t out, int64_t begin,
            int64_t end) {
  const int64_t step = (end - begin + S - 1) / S;
  for (int64_t t = 0; t < step; ++t) {
    const float* r[S];
    int64_t j[S];
    __m256 lo[S][M], hi[S][M];
    for (int s = 0; s < S; ++s) {
      j[s] = begin + t + s * step;
      r[s] = wb + std::min(j[s], end - 1) * in * BLOCK;  // past the range: read a valid block, drop it
      for (int m = 0; m < M; ++m) lo[s][m] = hi[s][m] = _mm256_setzero_ps();
    }
    for (int64_t i = 0; i < in; ++i) {
      // one stream (4+ rows, whose FMAs take long enough per input row): prefetch 2 KiB ahead
      if (S == 1) _mm_prefetch(reinterpret_cast<const char*>(r[0] + (i + AHEAD) * BLOCK), _MM_HINT_T0);
      __m256 w0[S], w1[S];
#pragma GCC unroll 8
      for (int s = 0; s < S; ++s) {
        w0[s] = _mm256_loadu_ps(r[s] + i * BLOCK);
        w1[s] = _mm256_loadu_ps(r[s] + i * BLOCK + 8);
      }
#pragma GCC unroll 8
      for (int m = 0; m < M; ++m) {
        const __m256 xm = _mm256_broadcast_ss(x + m * in + i);
#pragma GCC unroll 8
        for (int s = 0; s < S; ++s) {
          lo[s][m] = _mm256_fmadd_ps(xm, w0[s], lo[s][m]);
          hi[s][m] = _mm256_fmadd_ps(xm, w1[s], hi[s][m]);
        }
      }
    }
    // the sums leave their registers in loops the compiler unrolls: indexing them in store()'s
    // loop would keep them in memory throughout (1.8x slower for 8 rows)
    alignas(32) float sums[S][M][BLOCK];
#pragma GCC unroll 8
    for (int s = 0; s < S; ++s)
#pragma GCC unroll 8
      for (int m = 0; m < M; ++m) {
        _mm256_store_ps(sums[s][m], lo[s][m]);
        _mm256_store_ps(sums[s][m] + 8, hi[s][m]);
      }
    for (int s = 0; s < S; ++s)
      if (j[s] < end) store(sums[s][0], M, b, y, out, j[s]);
  }
}

template <int M>
void rows(const float* x, const float* wb, const float* b, float* y, int64_t in, int64_t out) {
  constexpr int S = M == 1 ? 4 : M == 2 ? 3 : M == 3 ? 2 : 1;
  at::parallel_for(0, (out + BLOCK - 1) / BLOCK, 64, [&](int64_t begin, int64_t end) {
    blocks<M, S>(x, wb, b, y, in, out, begin, end);
  });
}

using RowsFn = void (*)(const float*, const float*, const float*, float*, int64_t, int64_t);
constexpr RowsFn ROWS[MAX_ROWS] = {rows<1>, rows<2>, rows<3>, rows<4>, rows<5>, rows<6>, rows<7>, rows<8>};

}  // namespace

// x: [M, in] float32; wb: [ceil(out / 16), in, 16] float32 contiguous; bias: [out] or None.
// Returns [M, out].
torch::Tensor skinny_linear(torch::Tensor x, torch::Tensor wb, c10::optional<torch::Tensor> bias, int64_t out) {
  TORCH_CHECK(x.dim() == 2 && wb.dim() == 3 && wb.size(2) == BLOCK && x.size(1) == wb.size(1),
              "skinny_linear: x [M, in], blocked weight [ceil(out / 16), in, 16]");
  TORCH_CHECK(wb.size(0) == (out + BLOCK - 1) / BLOCK, "skinny_linear: the blocked weight does not have `out` columns");
  TORCH_CHECK(x.scalar_type() == at::kFloat && wb.scalar_type() == at::kFloat, "skinny_linear: float32 only");
  TORCH_CHECK(wb.is_contiguous(), "skinny_linear: the blocked weight must be contiguous (cpu_kernel.block_weight)");
  x = x.contiguous();
  torch::Tensor b;
  if (bias.has_value() && bias->defined()) {
    b = bias->contiguous();
    TORCH_CHECK(b.scalar_type() == at::kFloat && b.numel() == out, "skinny_linear: bias [out] float32");
  }
  const int64_t m_total = x.size(0), in = x.size(1);
  auto y = torch::empty({m_total, out}, x.options());
  const float* xp = x.data_ptr<float>();
  const float* wp = wb.data_ptr<float>();
  const float* bp = b.defined() ? b.data_ptr<float>() : nullptr;
  float* yp = y.data_ptr<float>();
  for (int64_t m0 = 0; m0 < m_total; m0 += MAX_ROWS) {
    const int64_t m = std::min(MAX_ROWS, m_total - m0);
    ROWS[m - 1](xp + m0 * in, wp, bp, yp + m0 * out, in, out);
  }
  return y;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("skinny_linear", &skinny_linear, "x W^T + b for a few rows, on a blocked copy of W");
}
