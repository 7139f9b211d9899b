// exp(x) for x <= 0 (a row's scores minus their max), as the attention kernels compute it (few_query_attention.cpp,
// prefill_attention.cpp): one algorithm and one set of constants at two widths.
#pragma once
#include <immintrin.h>

namespace hfs_exp {
constexpr float LOWEST = -87.0f;                              // below: 0
constexpr float LOG2E = 1.44269504088896341f;                 // n = round(x log2 e)
constexpr float LN2_HI = 0.693359375f, LN2_LO = -2.12194440e-4f;  // r = x - n ln2, in two parts
constexpr float P[6] = {1.9875691500e-4f, 1.3981999507e-3f, 8.3334519073e-3f,
                        4.1665795894e-2f, 1.6666665459e-1f, 5.0000001201e-1f};  // Cephes' expf, highest degree first
}  // namespace hfs_exp

// exp(x) for 8 lanes, x <= 0 (a row's scores minus their max): Cody-Waite reduction x = n ln2 + r, |r| <= ln2 / 2,
// exp(r) by a degree-6 polynomial (Cephes' expf coefficients), times 2^n through the exponent bits; below -87 the
// result is 0 (exp(-87) ~ 1.6e-38: a weight that vanishes beside the max's 1).
__attribute__((target("avx2,fma"))) inline __m256 exp8(__m256 x) {
  const __m256 lo = _mm256_set1_ps(hfs_exp::LOWEST);
  const __m256 small = _mm256_cmp_ps(x, lo, _CMP_LT_OQ);
  x = _mm256_max_ps(x, lo);
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(hfs_exp::LOG2E)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(hfs_exp::LN2_HI), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(hfs_exp::LN2_LO), r);
  __m256 p = _mm256_set1_ps(hfs_exp::P[0]);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(hfs_exp::P[1]));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(hfs_exp::P[2]));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(hfs_exp::P[3]));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(hfs_exp::P[4]));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(hfs_exp::P[5]));
  p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
  const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_andnot_ps(small, _mm256_mul_ps(p, _mm256_castsi256_ps(e)));
}

// The same for 16 lanes (AVX-512F).
__attribute__((target("avx512f,fma"))) inline __m512 exp16(__m512 x) {
  const __m512 lo = _mm512_set1_ps(hfs_exp::LOWEST);
  const __mmask16 small = _mm512_cmp_ps_mask(x, lo, _CMP_LT_OQ);
  x = _mm512_max_ps(x, lo);
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(hfs_exp::LOG2E)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(hfs_exp::LN2_HI), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(hfs_exp::LN2_LO), r);
  __m512 p = _mm512_set1_ps(hfs_exp::P[0]);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(hfs_exp::P[1]));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(hfs_exp::P[2]));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(hfs_exp::P[3]));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(hfs_exp::P[4]));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(hfs_exp::P[5]));
  p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
  const __m512i e = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
  return _mm512_maskz_mul_ps(static_cast<__mmask16>(~small), p, _mm512_castsi512_ps(e));
}
