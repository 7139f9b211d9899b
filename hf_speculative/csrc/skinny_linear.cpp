// y = x W^T + b for a few rows x (plain decoding: one; verifying a draft: 2-16), reading the weight
// once for all rows.
//
// The weight is a blocked copy of an nn.Linear weight W [out, in]: wb [ceil(out / 16), in, 16],
// wb[j, i, c] = W[16 j + c, i] (zero past `out`). A block's 16 output columns are accumulated in
// registers for up to 8 rows while its in x 16 values are read as one sequential stream, so the
// product runs at the machine's memory bandwidth whatever the row count (the column-major panels
// of the first version kept the sums in L1 and read 16-row strides of the weight: 1.3x slower for
// 4 rows). Every output is one FMA chain in input order plus the bias, whatever the number of rows,
// threads or blocks: a row's result is bitwise the same computed alone (plain decoding) or with
// the rows of a draft (verification).
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <immintrin.h>

#include <algorithm>
#include <cstring>

namespace {

constexpr int64_t BLOCK = 16;     // output columns per block: two AVX2 registers
constexpr int64_t MAX_ROWS = 8;   // rows per pass over the weight (2 x 8 accumulators: a few spill)
constexpr int64_t AHEAD = 32;     // input rows of the stream to prefetch ahead (2 KiB)

template <int M>
void block(const float* x, const float* wb, float* out16, int64_t in, int64_t ld) {
  __m256 lo[M], hi[M];
  for (int m = 0; m < M; ++m) lo[m] = hi[m] = _mm256_setzero_ps();
  for (int64_t i = 0; i < in; ++i) {
    _mm_prefetch(reinterpret_cast<const char*>(wb + (i + AHEAD) * BLOCK), _MM_HINT_T0);
    const __m256 w0 = _mm256_loadu_ps(wb + i * BLOCK), w1 = _mm256_loadu_ps(wb + i * BLOCK + 8);
    for (int m = 0; m < M; ++m) {
      const __m256 xm = _mm256_broadcast_ss(x + m * in + i);
      lo[m] = _mm256_fmadd_ps(xm, w0, lo[m]);
      hi[m] = _mm256_fmadd_ps(xm, w1, hi[m]);
    }
  }
  for (int m = 0; m < M; ++m) {
    _mm256_storeu_ps(out16 + m * ld, lo[m]);
    _mm256_storeu_ps(out16 + m * ld + 8, hi[m]);
  }
}

template <int M>
void rows(const float* x, const float* wb, const float* b, float* y, int64_t in, int64_t out) {
  const int64_t blocks = (out + BLOCK - 1) / BLOCK;
  at::parallel_for(0, blocks, 16, [&](int64_t begin, int64_t end) {
    for (int64_t j = begin; j < end; ++j) {
      const int64_t o = j * BLOCK, width = std::min(BLOCK, out - o);
      float tail[M * BLOCK];
      const bool full = width == BLOCK;
      block<M>(x, wb + j * in * BLOCK, full ? y + o : tail, in, full ? out : BLOCK);
      for (int m = 0; m < M; ++m) {
        float* ym = y + m * out + o;
        if (!full) std::memcpy(ym, tail + m * BLOCK, width * sizeof(float));
        if (b)
          for (int64_t c = 0; c < width; ++c) ym[c] += b[o + c];
      }
    }
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
