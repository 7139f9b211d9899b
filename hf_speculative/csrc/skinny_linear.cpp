// y = x W^T + b for a few rows x (verifying a draft), reading the weight once for all rows.
//
// The weight is an nn.Linear weight [out, in] stored column-major: wt = W^T, [in, out] contiguous,
// the layout optimize_for_cpu gives it. Outputs are cut into panels of PANEL columns; a panel's
// rows of wt are streamed once while the M output rows of the panel stay in L1. Every output is
// one FMA chain in input order, whatever M, the thread count or the panel it falls in: a row's
// result is bitwise the same whether it is computed alone (plain decoding) or with the rows of a
// draft (verification).
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <immintrin.h>

#include <algorithm>
#include <cmath>

namespace {

constexpr int64_t PANEL = 1024;    // output columns per panel (4 KiB of each wt row)
constexpr int IB = 8;              // wt rows per pass over a panel's outputs
constexpr int64_t PREFETCH = 16;   // rows ahead to prefetch
constexpr int64_t MAX_ROWS = 8;    // rows per pass over the weight

template <int M>
void panel(const float* x, const float* wt, float* y, const float* b, int64_t in, int64_t out, int64_t o0,
           int64_t o1) {
  for (int m = 0; m < M; ++m)
    for (int64_t o = o0; o < o1; ++o) y[m * out + o] = b ? b[o] : 0.f;
  int64_t i = 0;
  for (; i + IB <= in; i += IB) {
    if (i + PREFETCH < in)
      for (int k = 0; k < IB && i + PREFETCH + k < in; ++k)
        for (int64_t o = o0; o < o1; o += 16) _mm_prefetch((const char*)(wt + (i + PREFETCH + k) * out + o), _MM_HINT_T0);
    const float* r[IB];
    for (int k = 0; k < IB; ++k) r[k] = wt + (i + k) * out;
    __m256 xs[M][IB];
    for (int m = 0; m < M; ++m)
      for (int k = 0; k < IB; ++k) xs[m][k] = _mm256_broadcast_ss(x + m * in + i + k);
    int64_t o = o0;
    for (; o + 8 <= o1; o += 8) {
      __m256 w[IB];
      for (int k = 0; k < IB; ++k) w[k] = _mm256_loadu_ps(r[k] + o);
      for (int m = 0; m < M; ++m) {
        float* yp = y + m * out + o;
        __m256 a = _mm256_loadu_ps(yp);
        for (int k = 0; k < IB; ++k) a = _mm256_fmadd_ps(xs[m][k], w[k], a);
        _mm256_storeu_ps(yp, a);
      }
    }
    for (; o < o1; ++o)
      for (int m = 0; m < M; ++m) {
        float a = y[m * out + o];
        for (int k = 0; k < IB; ++k) a = std::fma(x[m * in + i + k], r[k][o], a);
        y[m * out + o] = a;
      }
  }
  for (; i < in; ++i)
    for (int m = 0; m < M; ++m)
      for (int64_t o = o0; o < o1; ++o) y[m * out + o] = std::fma(x[m * in + i], wt[i * out + o], y[m * out + o]);
}

template <int M>
void rows(const float* x, const float* wt, float* y, const float* b, int64_t in, int64_t out) {
  const int64_t panels = (out + PANEL - 1) / PANEL;
  at::parallel_for(0, panels, 1, [&](int64_t begin, int64_t end) {
    for (int64_t p = begin; p < end; ++p) panel<M>(x, wt, y, b, in, out, p * PANEL, std::min(out, (p + 1) * PANEL));
  });
}

using RowsFn = void (*)(const float*, const float*, float*, const float*, int64_t, int64_t);
constexpr RowsFn ROWS[MAX_ROWS] = {rows<1>, rows<2>, rows<3>, rows<4>, rows<5>, rows<6>, rows<7>, rows<8>};

}  // namespace

// x: [M, in] float32; w: [out, in] float32 with w.t() contiguous; bias: [out] or None. Returns [M, out].
torch::Tensor skinny_linear(torch::Tensor x, torch::Tensor w, c10::optional<torch::Tensor> bias) {
  TORCH_CHECK(x.dim() == 2 && w.dim() == 2 && x.size(1) == w.size(1), "skinny_linear: x [M, in], w [out, in]");
  TORCH_CHECK(x.scalar_type() == at::kFloat && w.scalar_type() == at::kFloat, "skinny_linear: float32 only");
  TORCH_CHECK(w.t().is_contiguous(), "skinny_linear: the weight must be column-major (optimize_for_cpu)");
  x = x.contiguous();
  torch::Tensor b;
  if (bias.has_value() && bias->defined()) b = bias->contiguous();
  const int64_t m_total = x.size(0), in = x.size(1), out = w.size(0);
  auto y = torch::empty({m_total, out}, x.options());
  const float* xp = x.data_ptr<float>();
  const float* wp = w.data_ptr<float>();
  const float* bp = b.defined() ? b.data_ptr<float>() : nullptr;
  float* yp = y.data_ptr<float>();
  for (int64_t m0 = 0; m0 < m_total; m0 += MAX_ROWS) {
    const int64_t m = std::min(MAX_ROWS, m_total - m0);
    ROWS[m - 1](xp + m0 * in, wp, yp + m0 * out, bp, in, out);
  }
  return y;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("skinny_linear", &skinny_linear, "x W^T + b for a few rows"); }
