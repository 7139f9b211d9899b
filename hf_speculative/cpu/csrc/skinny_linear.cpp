// y = x W^T + b for a few rows x (plain decoding: one; verifying a draft: 2-16), reading the weight
// once for all rows; and, on AVX-512, for more rows (prefill, larger trees) by a cache-blocked product on the same
// copy and the same arithmetic per output (gemm512, below).
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
// The copy holds fp32 values, or fewer bytes of them, widened to fp32 in registers before the same FMA chain:
// - bf16, for weights whose every value is a bf16 number (checkpoints saved in bf16 and loaded in fp32): widening
//   is exact, so the results are bitwise those of the fp32 copy, from half the bytes;
// - int8 with one fp32 scale per output column (W ~ q * scale, the scale applied once to the sum): an
//   approximation, for drafters only (the target verifies whatever they propose), from a quarter of the bytes.
//
// Two instruction sets, chosen at run time (the CPU's, once; AVX-512 for fp32 copies from 4 rows, for bf16 and int8
// copies from one: run()): AVX2 (a block is two 8-lane registers, up to 8 rows a pass, more in tiles: gemm2) and,
// where the CPU has it, AVX-512F (a block is one 16-lane register; 32 registers hold the sums of up to 16 rows a pass,
// or of more streams). Each lane computes the same FMA chain in both, so their results are bitwise equal: the choice
// changes speed, never a token. HFS_KERNEL_ISA=avx2 forces the AVX2 code.
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <immintrin.h>

#include "decoder_layer.h"

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

namespace {

constexpr int64_t BLOCK = 16;     // output columns per block: two AVX2 registers
constexpr int64_t MAX_ROWS = 8;   // rows per pass over the weight (2 x 8 accumulators: a few spill); more: gemm2
constexpr int64_t AHEAD_BYTES = 2048;  // one stream (4+ rows): prefetch 2 KiB ahead of it
// AVX-512, 8+ rows: compute-bound with the weight coming from memory, every stream is prefetched into L2 8 KiB ahead
// (2 KiB into L1 was too late for 13-16 rows: SmolLM2's weights for 13 rows 40.4 -> 36.7 ms, 16 rows 44.3 -> 43.7)
constexpr int64_t AHEAD_BYTES_512 = 8192;
constexpr int PREFETCH_ROWS_512 = 8;

// The three element types of the copy: W is what is stored, loads widen 16 of them to fp32 exactly.
using bf16_t = uint16_t;

inline void load2(const float* p, __m256& lo, __m256& hi) {
  lo = _mm256_loadu_ps(p);
  hi = _mm256_loadu_ps(p + 8);
}
inline void load2(const bf16_t* p, __m256& lo, __m256& hi) {  // bf16 -> fp32: the 16 bits on top, zeros below
  const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  lo = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm256_castsi256_si128(v)), 16));
  hi = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm256_extracti128_si256(v, 1)), 16));
}
inline void load2(const int8_t* p, __m256& lo, __m256& hi) {
  const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  lo = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v));
  hi = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(v, 8)));
}

__attribute__((target("avx512f,fma"))) inline __m512 load16(const float* p) { return _mm512_loadu_ps(p); }
__attribute__((target("avx512f,fma"))) inline __m512 load16(const bf16_t* p) {
  const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(v), 16));
}
__attribute__((target("avx512f,fma"))) inline __m512 load16(const int8_t* p) {
  return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
}

// Block j's sums [rows][16] (x the int8 copy's scales, + bias) into y [rows, out], cut at `out`.
void store(const float* sums, int rows, const float* scale, const float* b, float* y, int64_t out, int64_t j) {
  const int64_t o = j * BLOCK, width = std::min(BLOCK, out - o);
  for (int m = 0; m < rows; ++m)
    for (int64_t c = 0; c < width; ++c) {
      float v = sums[m * BLOCK + c];
      if (scale) v *= scale[o + c];
      y[m * out + o + c] = b ? v + b[o + c] : v;
    }
}

struct Args {
  const float* x;
  const void* wb;
  const float* scale;  // int8 copies: [ceil(out / 16) * 16]; else null
  const float* b;
  float* y;
  int64_t in, out;
};

// S blocks at once, S sequential streams from distant parts of the copy: one core reads memory
// faster from several streams than from one (SmolLM2's weights, one row: 25 ms with 4 streams,
// 36 with one, MKL 39). Streams are chosen so that the 2 * S * M sums fit in registers; a single
// stream (4+ rows) is prefetched, several are left to the hardware's prefetchers, which do better.
template <typename W, int M, int S>
void blocks(const Args& a, int64_t begin, int64_t end) {
  // the arguments as locals: read through `a`, they could alias the outputs for all the compiler knows
  const W* wb = static_cast<const W*>(a.wb);
  const float* x = a.x;
  const int64_t in = a.in, step = (end - begin + S - 1) / S, ahead = AHEAD_BYTES / sizeof(W);
  for (int64_t t = 0; t < step; ++t) {
    const W* r[S];
    int64_t j[S];
    __m256 lo[S][M], hi[S][M];
    for (int s = 0; s < S; ++s) {
      j[s] = begin + t + s * step;
      r[s] = wb + std::min(j[s], end - 1) * in * BLOCK;  // past the range: read a valid block, drop it
      for (int m = 0; m < M; ++m) lo[s][m] = hi[s][m] = _mm256_setzero_ps();
    }
    for (int64_t i = 0; i < in; ++i) {
      // one stream (4+ rows, whose FMAs take long enough per input row): prefetch 2 KiB ahead
      if (S == 1) _mm_prefetch(reinterpret_cast<const char*>(r[0] + i * BLOCK + ahead), _MM_HINT_T0);
      __m256 w0[S], w1[S];
#pragma GCC unroll 8
      for (int s = 0; s < S; ++s) load2(r[s] + i * BLOCK, w0[s], w1[s]);
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
      if (j[s] < end) store(sums[s][0], M, a.scale, a.b, a.y, a.out, j[s]);
  }
}

template <typename W, int M>
void rows(const Args& a) {
  constexpr int S = M == 1 ? 4 : M == 2 ? 3 : M == 3 ? 2 : 1;
  at::parallel_for(0, (a.out + BLOCK - 1) / BLOCK, 64, [&](int64_t begin, int64_t end) {
    blocks<W, M, S>(a, begin, end);
  });
}

using RowsFn = void (*)(const Args&);
template <typename W>
constexpr RowsFn ROWS[MAX_ROWS] = {rows<W, 1>, rows<W, 2>, rows<W, 3>, rows<W, 4>,
                                   rows<W, 5>, rows<W, 6>, rows<W, 7>, rows<W, 8>};

// The rows x [m_total, in] packed input-major in tiles of r rows (both cache-blocked products below):
// xp [tiles][in][r], xp[t][i][m] = x[t * r + m][i], zero past m_total: a tile's broadcasts read one sequential stream.
std::vector<float> pack_tiles(const float* x, int64_t m_total, int64_t in, int64_t r) {
  const int64_t tiles = (m_total + r - 1) / r;
  std::vector<float> packed(tiles * in * r);  // zeros
  for (int64_t row = 0; row < m_total; ++row) {
    float* dst = packed.data() + (row / r) * in * r + row % r;
    const float* src = x + row * in;
    for (int64_t i = 0; i < in; ++i) dst[i * r] = src[i];
  }
  return packed;
}

// ---- AVX2, more rows than a pass holds (9+: batches, trees of 9-63 nodes): a cache-blocked product ---------------
// Passes of 8 rows read the whole weight once per pass: 16 rows read it twice, the second time from L3 at best (a
// SmolLM2 MLP weight, 3.5 MB) and from memory for an output layer of 113 MB. Here the rows are packed input-major in
// tiles of up to 6 (xp [tiles][in][6]: a tile's broadcasts read one sequential stream) and the blocks are taken in
// panels of about PANEL2_BYTES that stay in L2 while every tile passes over them, the next panel prefetched into L2
// meanwhile: the weight comes from memory once. A tile's 6 rows x 2 registers of sums, the block's 2 and the broadcast
// fill 15 of the 16 registers (the 8-row passes spill). Every output is the few-row code's FMA chain (zero, then
// fmadd(x[m, i], w[i]) in input order, then the scale and bias in store()), so a row's result is bitwise what a pass
// of 8 rows, or plain decoding's one row, gives it.
constexpr int GEMM2_ROWS = 6;
constexpr int64_t PANEL2_BYTES = 192 * 1024;

template <typename W, int R>
void tile2(const float* xp, const W* r, int64_t in, float* sums, const char* next, int64_t next_lines) {
  __m256 lo[R], hi[R];
#pragma GCC unroll 8
  for (int m = 0; m < R; ++m) lo[m] = hi[m] = _mm256_setzero_ps();
  const int64_t per = (next_lines + in - 1) / in, ahead = AHEAD_BYTES / sizeof(W);  // next panel's lines per input
  for (int64_t i = 0; i < in; ++i) {
    for (int64_t l = i * per; l < std::min(next_lines, i * per + per); ++l) _mm_prefetch(next + l * 64, _MM_HINT_T1);
    _mm_prefetch(reinterpret_cast<const char*>(r + i * BLOCK + ahead), _MM_HINT_T0);  // from L2, 2 KiB ahead
    __m256 w0, w1;
    load2(r + i * BLOCK, w0, w1);
#pragma GCC unroll 8
    for (int m = 0; m < R; ++m) {
      const __m256 xm = _mm256_broadcast_ss(xp + i * GEMM2_ROWS + m);
      lo[m] = _mm256_fmadd_ps(xm, w0, lo[m]);
      hi[m] = _mm256_fmadd_ps(xm, w1, hi[m]);
    }
  }
#pragma GCC unroll 8
  for (int m = 0; m < R; ++m) {
    _mm256_store_ps(sums + m * BLOCK, lo[m]);
    _mm256_store_ps(sums + m * BLOCK + 8, hi[m]);
  }
}

template <typename W>
using TileFn = void (*)(const float*, const W*, int64_t, float*, const char*, int64_t);
template <typename W>
constexpr TileFn<W> TILES2[GEMM2_ROWS] = {tile2<W, 1>, tile2<W, 2>, tile2<W, 3>, tile2<W, 4>, tile2<W, 5>, tile2<W, 6>};

template <typename W>
void gemm2(const Args& a, int64_t m_total) {
  constexpr int R = GEMM2_ROWS;
  const W* wb = static_cast<const W*>(a.wb);
  const int64_t in = a.in, blocks = (a.out + BLOCK - 1) / BLOCK, tiles = (m_total + R - 1) / R;
  const std::vector<float> packed = pack_tiles(a.x, m_total, in, R);  // (the last tile's zero rows are not read)
  const float* xp = packed.data();
  const int64_t block_bytes = in * BLOCK * static_cast<int64_t>(sizeof(W));
  const int64_t panel = std::max<int64_t>(1, PANEL2_BYTES / block_bytes);  // blocks per panel
  at::parallel_for(0, (blocks + panel - 1) / panel, 1, [&](int64_t p0, int64_t p1) {
    alignas(32) float sums[R * BLOCK];
    for (int64_t p = p0; p < p1; ++p) {
      const int64_t jb = p * panel, je = std::min(blocks, jb + panel);
      // this thread's next panel, a share of its lines in each of this panel's tile passes
      const int64_t next_blocks = p + 1 < p1 ? std::min(blocks, je + panel) - je : 0;
      const char* next = reinterpret_cast<const char*>(wb + je * in * BLOCK);
      const int64_t lines = next_blocks * block_bytes / 64, passes = tiles * (je - jb);
      const int64_t share = (lines + passes - 1) / passes;
      int64_t pass = 0;
      for (int64_t t = 0; t < tiles; ++t) {
        const int rows = static_cast<int>(std::min<int64_t>(R, m_total - t * R));
        for (int64_t j = jb; j < je; ++j, ++pass) {
          const int64_t from = std::min(lines, pass * share);
          TILES2<W>[rows - 1](xp + t * in * R, wb + j * in * BLOCK, in, sums, next + from * 64,
                              std::min(lines, from + share) - from);
          store(sums, rows, a.scale, a.b, a.y + t * R * a.out, a.out, j);
        }
      }
    }
  });
}

// ---- AVX-512F: one register per block and row ---------------------------------------------------------------
constexpr int64_t MAX_ROWS_512 = 16;  // rows per pass: 16 sums + the weight in 32 registers

template <typename W, int M, int S>
__attribute__((target("avx512f,fma"))) void blocks512(const Args& a, int64_t begin, int64_t end) {
  const W* wb = static_cast<const W*>(a.wb);
  const float* x = a.x;
  const int64_t in = a.in, step = (end - begin + S - 1) / S, ahead = AHEAD_BYTES_512 / sizeof(W);
  for (int64_t t = 0; t < step; ++t) {
    const W* r[S];
    int64_t j[S];
    __m512 acc[S][M];
    for (int s = 0; s < S; ++s) {
      j[s] = begin + t + s * step;
      r[s] = wb + std::min(j[s], end - 1) * in * BLOCK;  // past the range: read a valid block, drop it
      for (int m = 0; m < M; ++m) acc[s][m] = _mm512_setzero_ps();
    }
    for (int64_t i = 0; i < in; ++i) {
      if (M >= PREFETCH_ROWS_512)
#pragma GCC unroll 8
        for (int s = 0; s < S; ++s) _mm_prefetch(reinterpret_cast<const char*>(r[s] + i * BLOCK + ahead), _MM_HINT_T1);
      __m512 w[S];
#pragma GCC unroll 8
      for (int s = 0; s < S; ++s) w[s] = load16(r[s] + i * BLOCK);
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
      if (j[s] < end) store(sums[s][0], M, a.scale, a.b, a.y, a.out, j[s]);
  }
}

template <typename W, int M>
void rows512(const Args& a) {
  // streams as the sums allow (S x M <= 24 of the 32 registers): several streams read memory faster on one core
  constexpr int S = M <= 4 ? 4 : M <= 6 ? 3 : M <= 12 ? 2 : 1;
  at::parallel_for(0, (a.out + BLOCK - 1) / BLOCK, 64, [&](int64_t begin, int64_t end) {
    blocks512<W, M, S>(a, begin, end);
  });
}

template <typename W>
constexpr RowsFn ROWS512[MAX_ROWS_512] = {
    rows512<W, 1>,  rows512<W, 2>,  rows512<W, 3>,  rows512<W, 4>,  rows512<W, 5>,  rows512<W, 6>,
    rows512<W, 7>,  rows512<W, 8>,  rows512<W, 9>,  rows512<W, 10>, rows512<W, 11>, rows512<W, 12>,
    rows512<W, 13>, rows512<W, 14>, rows512<W, 15>, rows512<W, 16>};


// ---- more rows (prefill, trees of 17+ nodes): a cache-blocked product on the same copy ------------------------------
// Rows in tiles of R, each tile packed input-major (xp [tiles][in][R], rows past M zero: a tile's broadcasts read one
// sequential stream); the blocks in panels of about PANEL_BYTES that stay in L2 while every tile passes over them,
// S blocks at a time (R x S sums in registers), the next panel prefetched into L2 meanwhile. Every output is still one
// FMA chain in input order plus the bias, so a row's result is bitwise what the few-row code gives it: a prefill row,
// or a verification row of a 40-node tree, is the row plain decoding computes. SmolLM2-135M's 210 decoder products
// (one thread, AMD EPYC Zen 4) against oneDNN's on the column-major weight: 17 rows 40.5 against 61.1 ms, 40 rows
// 87.5 against 101.2, 93 rows 192.5 against 202.0, 767 rows 1,537 against 1,512.
constexpr int GEMM_ROWS = 6, GEMM_STREAMS = 4;  // 24 sums; 4 x 6 did as well as 8 x 3 and 16 x 1 (and 4 x 6 at 767)
constexpr int64_t PANEL_BYTES = 256 * 1024;

template <typename W, int R, int S>
__attribute__((target("avx512f,fma"))) void tile512(const float* xp, const W* const* r, int64_t in, float* sums,
                                                    const char* next, int64_t next_lines) {
  __m512 acc[S][R];
#pragma GCC unroll 8
  for (int s = 0; s < S; ++s)
#pragma GCC unroll 16
    for (int m = 0; m < R; ++m) acc[s][m] = _mm512_setzero_ps();
  const int64_t per = (next_lines + in - 1) / in;  // lines of the next panel to prefetch per input
  for (int64_t i = 0; i < in; ++i) {
    for (int64_t l = i * per; l < std::min(next_lines, i * per + per); ++l) _mm_prefetch(next + l * 64, _MM_HINT_T1);
    __m512 w[S];
#pragma GCC unroll 8
    for (int s = 0; s < S; ++s) w[s] = load16(r[s] + i * BLOCK);
#pragma GCC unroll 16
    for (int m = 0; m < R; ++m) {
      const __m512 xm = _mm512_set1_ps(xp[i * R + m]);
#pragma GCC unroll 8
      for (int s = 0; s < S; ++s) acc[s][m] = _mm512_fmadd_ps(xm, w[s], acc[s][m]);
    }
  }
#pragma GCC unroll 8
  for (int s = 0; s < S; ++s)
#pragma GCC unroll 16
    for (int m = 0; m < R; ++m) _mm512_store_ps(sums + (s * R + m) * BLOCK, acc[s][m]);
}

template <typename W>
void gemm512(const Args& a, int64_t m_total) {
  constexpr int R = GEMM_ROWS, S = GEMM_STREAMS;
  const W* wb = static_cast<const W*>(a.wb);
  const int64_t in = a.in, blocks = (a.out + BLOCK - 1) / BLOCK, tiles = (m_total + R - 1) / R;
  const std::vector<float> packed = pack_tiles(a.x, m_total, in, R);
  const float* xp = packed.data();
  const int64_t block_bytes = in * BLOCK * static_cast<int64_t>(sizeof(W));
  const int64_t panel = std::max<int64_t>(1, PANEL_BYTES / block_bytes / S) * S;  // blocks per panel
  at::parallel_for(0, (blocks + panel - 1) / panel, 1, [&](int64_t p0, int64_t p1) {
    alignas(64) float sums[S * R * BLOCK];
    for (int64_t p = p0; p < p1; ++p) {
      const int64_t jb = p * panel, je = std::min(blocks, jb + panel);
      // this thread's next panel, a share of its lines in each of this panel's tile passes
      const int64_t next_blocks = p + 1 < p1 ? std::min(blocks, je + panel) - je : 0;
      const char* next = reinterpret_cast<const char*>(wb + je * in * BLOCK);
      const int64_t lines = next_blocks * block_bytes / 64, passes = tiles * ((je - jb + S - 1) / S);
      const int64_t share = (lines + passes - 1) / passes;
      int64_t pass = 0;
      for (int64_t t = 0; t < tiles; ++t) {
        const int rows = static_cast<int>(std::min<int64_t>(R, m_total - t * R));
        for (int64_t j = jb; j < je; j += S, ++pass) {
          const W* r[S];
          for (int s = 0; s < S; ++s) r[s] = wb + std::min(j + s, je - 1) * in * BLOCK;  // past the panel: dropped
          const int64_t from = std::min(lines, pass * share);
          tile512<W, R, S>(xp + t * in * R, r, in, sums, next + from * 64, std::min(lines, from + share) - from);
          for (int s = 0; s < S && j + s < je; ++s)
            store(sums + s * R * BLOCK, rows, a.scale, a.b, a.y + t * R * a.out, a.out, j + s);
        }
      }
    }
  });
}

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

// HFS_KERNEL_TILES=0: AVX2 products of 9+ rows in passes of 8 rows over the weight, as before gemm2 (to compare)
bool avx2_tiles() {
  static const bool yes = [] {
    const char* value = std::getenv("HFS_KERNEL_TILES");
    return !(value && std::strcmp(value, "0") == 0);
  }();
  return yes;
}

template <typename W>
void run(Args a, int64_t m_total) {
  // fp32 copies: AVX-512 from 4 rows, since fewer rows are bound by memory either way and read it faster with the
  // AVX2 code here (SmolLM2's weights, one row: 23.0 ms AVX2, 24.7 AVX-512; 8 rows: 42.5 and 31.7). bf16 and int8
  // copies: always, since widening them is work that 16 lanes halve (Qwen2.5-1.5B's shapes,
  // benchmarks/kernel_copies.py, two runs: bf16 one row 97-111 ms AVX-512, 106-116 AVX2, two rows 102-115 and
  // 133-152; int8 one row 62-67 and 98-100; fp32 186-207 either way)
  const bool wide = use_avx512() && (sizeof(W) < sizeof(float) || m_total >= 4);
  if (wide && m_total > MAX_ROWS_512) return gemm512<W>(a, m_total);
  if (!wide && m_total > MAX_ROWS && avx2_tiles()) return gemm2<W>(a, m_total);  // the weight read once, not per 8 rows
  const int64_t group = wide ? MAX_ROWS_512 : MAX_ROWS;
  const float* x = a.x;
  float* y = a.y;
  for (int64_t m0 = 0; m0 < m_total; m0 += group) {
    const int64_t m = std::min(group, m_total - m0);
    a.x = x + m0 * a.in;
    a.y = y + m0 * a.out;
    (wide ? ROWS512<W> : ROWS<W>)[m - 1](a);
  }
}

}  // namespace

// x: [M, in] float32; wb: [ceil(out / 16), in, 16] float32, bfloat16 or int8, contiguous; scale: for int8 only,
// [ceil(out / 16) * 16] float32; bias: [out] or None. Returns [M, out].
torch::Tensor skinny_linear(torch::Tensor x, torch::Tensor wb, c10::optional<torch::Tensor> bias, int64_t out,
                            c10::optional<torch::Tensor> scale) {
  TORCH_CHECK(x.dim() == 2 && wb.dim() == 3 && wb.size(2) == BLOCK && x.size(1) == wb.size(1),
              "skinny_linear: x [M, in], blocked weight [ceil(out / 16), in, 16]");
  TORCH_CHECK(wb.size(0) == (out + BLOCK - 1) / BLOCK, "skinny_linear: the blocked weight does not have `out` columns");
  const auto kind = wb.scalar_type();
  TORCH_CHECK(x.scalar_type() == at::kFloat && (kind == at::kFloat || kind == at::kBFloat16 || kind == at::kChar),
              "skinny_linear: x float32, the blocked weight float32, bfloat16 or int8");
  TORCH_CHECK(wb.is_contiguous(), "skinny_linear: the blocked weight must be contiguous (cpu_kernel.block_weight)");
  const bool scaled = scale.has_value() && scale->defined();
  TORCH_CHECK(scaled == (kind == at::kChar), "skinny_linear: an int8 blocked weight needs its scales, others none");
  torch::Tensor s;
  if (scaled) {
    s = scale->contiguous();
    TORCH_CHECK(s.scalar_type() == at::kFloat && s.numel() == wb.size(0) * BLOCK,
                "skinny_linear: scale [ceil(out / 16) * 16] float32");
  }
  x = x.contiguous();
  torch::Tensor b;
  if (bias.has_value() && bias->defined()) {
    b = bias->contiguous();
    TORCH_CHECK(b.scalar_type() == at::kFloat && b.numel() == out, "skinny_linear: bias [out] float32");
  }
  const int64_t m_total = x.size(0), in = x.size(1);
  auto y = torch::empty({m_total, out}, x.options());
  Args a{x.data_ptr<float>(), wb.data_ptr(), scaled ? s.data_ptr<float>() : nullptr,
         b.defined() ? b.data_ptr<float>() : nullptr, y.data_ptr<float>(), in, out};
  if (kind == at::kFloat)
    run<float>(a, m_total);
  else if (kind == at::kBFloat16)
    run<bf16_t>(a, m_total);
  else
    run<int8_t>(a, m_total);
  return y;
}

std::string isa() { return use_avx512() ? "avx512" : "avx2"; }

// bf16_linear.cpp: bf16 models' products on the CPU's bf16 dot products
bool has_bf16_dot();
torch::Tensor skinny_linear_bf16(torch::Tensor x, torch::Tensor wb, c10::optional<torch::Tensor> bias, int64_t out);

// "avx2", "avx512" (where the CPU has it) or "auto": which code the products run, for comparing the two
std::string set_isa(const std::string& name) {
  TORCH_CHECK(name == "avx2" || name == "avx512" || name == "auto",
              "set_isa: use \"avx2\", \"avx512\" or \"auto\"");
  TORCH_CHECK(name != "avx512" || cpu_has_avx512(), "set_isa(\"avx512\"): this CPU has no AVX-512F");
  chosen.store(name == "avx2" ? 0 : name == "avx512" ? 1 : (cpu_has_avx512() ? 1 : 0));
  return isa();
}

torch::Tensor few_query_attention(torch::Tensor query, torch::Tensor key, torch::Tensor value,
                                  c10::optional<torch::Tensor> mask, double scale);  // few_query_attention.cpp
at::Tensor huge_page_empty(int64_t nbytes);  // huge_pages.cpp
bool has_prefill_attention();  // prefill_attention.cpp
torch::Tensor prefill_attention(torch::Tensor query, torch::Tensor key, torch::Tensor value, double scale);

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("skinny_linear", &skinny_linear, "x W^T + b for a few rows, on a blocked copy of W", py::arg("x"),
        py::arg("wb"), py::arg("bias"), py::arg("out"), py::arg("scale") = py::none());
  m.def("skinny_linear_bf16", &skinny_linear_bf16, "x W^T + b in bf16 for a few rows, on a pair-blocked copy of W",
        py::arg("x"), py::arg("wb"), py::arg("bias"), py::arg("out"));
  m.def("few_query_attention", &few_query_attention,
        "attention of a few query rows [B, H, q, D] over keys / values [B, H_kv, kv, D] (fp32; mask None: causal, "
        "else bool [B, q, kv]), each row on its own arithmetic; returns [B, q, H, D]",
        py::arg("query"), py::arg("key"), py::arg("value"), py::arg("mask"), py::arg("scale"));
  m.def("prefill_attention", &prefill_attention,
        "causal attention of a prefill: query [B, H, L, D] over key / value [B, Hkv, L, D] (fp32, row i sees keys "
        "0..i; D a multiple of 32 up to 256); returns [B, L, H, D]",
        py::arg("query"), py::arg("key"), py::arg("value"), py::arg("scale"));
  m.def("huge_page_empty", &huge_page_empty,
        "an uninitialised uint8 tensor of nbytes (64-byte aligned) on 2 MiB pages where the OS gives them, for the "
        "weight copies", py::arg("nbytes"));
  m.def("has_prefill_attention", &has_prefill_attention, "whether this CPU runs prefill_attention (AVX-512F)");
  m.def("has_bf16_dot", &has_bf16_dot, "whether this CPU has AVX512-BF16 (skinny_linear_bf16 runs)");
  m.def("isa", &isa, "the instruction set the kernel runs: avx512 or avx2");
  m.def("set_isa", &set_isa, "run the products on avx2, avx512 or the CPU's best (auto); returns the one chosen");
  // decoder_layer.cpp's calls (bound here, in the one file that includes pybind11)
  py::class_<hfs_layer::LayerPlan>(m, "LayerPlan", "a decoder layer's blocked weights and shapes (decoder_layer.cpp)");
  m.def("layer_plan", &hfs_layer::make_plan, "a LayerPlan", py::arg("linears"), py::arg("norms"),
        py::arg("norm_offset"), py::arg("eps"), py::arg("attention_scale"), py::arg("heads"), py::arg("kv_heads"),
        py::arg("head_dim"), py::arg("hidden"), py::arg("activation"));
  m.def("attention_inputs", &hfs_layer::attention_inputs,
        "input norm, q/k/v products, q/k norms and rotary for hidden states [B, T, C]: q [B, H, T, D], k and v "
        "[B, Hkv, T, D]",
        py::arg("plan"), py::arg("x"), py::arg("cos"), py::arg("sin"),
        py::call_guard<py::gil_scoped_release>());  // tensors only inside: other threads' calls run meanwhile
  m.def("layer_output", &hfs_layer::layer_output,
        "attention over the cache's keys and values, o-projection, residual, norms, gated MLP, residual: [B, T, C]",
        py::arg("plan"), py::arg("x"), py::arg("q"), py::arg("keys"), py::arg("values"), py::arg("mask"),
        py::arg("attended") = py::none(), py::call_guard<py::gil_scoped_release>());
}
