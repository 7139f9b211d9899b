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
//
// Two instruction sets, chosen at run time (the CPU's, once; AVX-512 for calls of 4+ rows): AVX2 (a block is two 8-lane registers, up to 8 rows a pass)
// and, where the CPU has it, AVX-512F (a block is one 16-lane register; 32 registers hold the sums of up to 16
// rows a pass, or of more streams). Each lane computes the same FMA chain in both, so their results are bitwise
// equal: the choice changes speed, never a token. HFS_KERNEL_ISA=avx2 forces the AVX2 code.
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>

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

// ---- AVX-512F: one register per block and row ---------------------------------------------------------------
constexpr int64_t MAX_ROWS_512 = 16;  // rows per pass: 16 sums + the weight in 32 registers

template <int M, int S>
__attribute__((target("avx512f,fma"))) void blocks512(const float* x, const float* wb, const float* b, float* y,
                                                      int64_t in, int64_t out, int64_t begin, int64_t end) {
  const int64_t step = (end - begin + S - 1) / S;
  for (int64_t t = 0; t < step; ++t) {
    const float* r[S];
    int64_t j[S];
    __m512 acc[S][M];
    for (int s = 0; s < S; ++s) {
      j[s] = begin + t + s * step;
      r[s] = wb + std::min(j[s], end - 1) * in * BLOCK;  // past the range: read a valid block, drop it
      for (int m = 0; m < M; ++m) acc[s][m] = _mm512_setzero_ps();
    }
    for (int64_t i = 0; i < in; ++i) {
      if (S == 1) _mm_prefetch(reinterpret_cast<const char*>(r[0] + (i + AHEAD) * BLOCK), _MM_HINT_T0);
      __m512 w[S];
#pragma GCC unroll 8
      for (int s = 0; s < S; ++s) w[s] = _mm512_loadu_ps(r[s] + i * BLOCK);
#pragma GCC unroll 16
      for (int m = 0; m < M; ++m) {
        const __m512 xm = _mm512_set1_ps(x[m * in + i]);
#pragma GCC unroll 8
        for (int s = 0; s < S; ++s) acc[s][m] = _mm512_fmadd_ps(xm, w[s], acc[s][m]);
      }
    }
    alignas(64) float sums[S][M][BLOCK];
#pragma GCC unroll 8
    for (int s = 0; s < S; ++s)
#pragma GCC unroll 16
      for (int m = 0; m < M; ++m) _mm512_store_ps(sums[s][m], acc[s][m]);
    for (int s = 0; s < S; ++s)
      if (j[s] < end) store(sums[s][0], M, b, y, out, j[s]);
  }
}

template <int M>
void rows512(const float* x, const float* wb, const float* b, float* y, int64_t in, int64_t out) {
  // streams as the sums allow (S x M <= 24 of the 32 registers): several streams read memory faster on one core
  constexpr int S = M <= 4 ? 4 : M <= 6 ? 3 : M <= 12 ? 2 : 1;
  at::parallel_for(0, (out + BLOCK - 1) / BLOCK, 64, [&](int64_t begin, int64_t end) {
    blocks512<M, S>(x, wb, b, y, in, out, begin, end);
  });
}

constexpr RowsFn ROWS512[MAX_ROWS_512] = {rows512<1>,  rows512<2>,  rows512<3>,  rows512<4>,  rows512<5>,  rows512<6>,
                                          rows512<7>,  rows512<8>,  rows512<9>,  rows512<10>, rows512<11>, rows512<12>,
                                          rows512<13>, rows512<14>, rows512<15>, rows512<16>};

bool cpu_has_avx512() {
  static const bool yes = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") != 0;
  }();
  return yes;
}

// -1: not chosen yet (HFS_KERNEL_ISA, else the CPU decides); 0: AVX2; 1: AVX-512 (set_isa, for measuring both)
std::atomic<int> chosen{-1};

bool use_avx512() {
  int isa = chosen.load(std::memory_order_relaxed);
  if (isa < 0) {
    const char* forced = std::getenv("HFS_KERNEL_ISA");
    isa = (forced && std::strcmp(forced, "avx2") == 0) ? 0 : cpu_has_avx512() ? 1 : 0;
    chosen.store(isa, std::memory_order_relaxed);
  }
  return isa == 1;
}

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
  // AVX-512 from 4 rows: fewer rows are bound by memory either way, and read it faster with the AVX2 code here
  // (SmolLM2's weights, one row: 23.0 ms AVX2, 24.7 AVX-512; 8 rows: 42.5 and 31.7)
  const bool wide = use_avx512() && m_total >= 4;
  const int64_t group = wide ? MAX_ROWS_512 : MAX_ROWS;
  for (int64_t m0 = 0; m0 < m_total; m0 += group) {
    const int64_t m = std::min(group, m_total - m0);
    (wide ? ROWS512 : ROWS)[m - 1](xp + m0 * in, wp, bp, yp + m0 * out, in, out);
  }
  return y;
}

std::string isa() { return use_avx512() ? "avx512" : "avx2"; }

// "avx2", "avx512" (where the CPU has it) or "auto": which code the products run, for comparing the two
std::string set_isa(const std::string& name) {
  TORCH_CHECK(name == "avx2" || name == "avx512" || name == "auto",
              "set_isa: use \"avx2\", \"avx512\" or \"auto\"");
  TORCH_CHECK(name != "avx512" || cpu_has_avx512(), "set_isa(\"avx512\"): this CPU has no AVX-512F");
  chosen.store(name == "avx2" ? 0 : name == "avx512" ? 1 : (cpu_has_avx512() ? 1 : 0));
  return isa();
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("skinny_linear", &skinny_linear, "x W^T + b for a few rows, on a blocked copy of W");
  m.def("isa", &isa, "the instruction set the kernel runs: avx512 or avx2");
  m.def("set_isa", &set_isa, "run the products on avx2, avx512 or the CPU's best (auto); returns the one chosen");
}
