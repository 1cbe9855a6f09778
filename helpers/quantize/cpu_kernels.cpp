// The course's hand-written CPU kernels for quantized decode (helpers/quantize/native.py builds and loads them as
// torch.ops.course_quant). Both compute ROWS_AT_ONCE output rows per pass over codes interleaved by blocks of that
// many rows (see code_offset), and take at most a few input rows (a decode step, a verify pass); QuantizedLinear
// multiplies longer inputs otherwise.
//
// 1. int4 weights times activations rounded to int8 per group (QuantizedLinear "dynamic" for int4):
//
//   y[m, n] = sum_g ( s[n,g] * d[m,g] * sum_k (q[n,k] - 8) * a[m,k]  +  z[n,g] * sum_k x[m,k] )
//
// where a weight is w = (q - 8) * s + z (q in 0..15, one scale s and zero z per group of g inputs, stored bf16)
// and an activation is rounded per group as x ~ d * a (a in -127..127, d = max|x| / 127), the same split as
// llama.cpp's q4_0 x q8_0 dot product. The integer sums run four bytes at a time with AVX512-VNNI's vpdpbusd
// (unsigned 4-bit codes times signed 8-bit activations into int32); a scalar loop computes
// the same sums on any other CPU (and under the course's restricted-CPU run). helpers/quantize/int4_dynamic.py
// holds the Python reference both are tested against.
//
// 2. int8 weights, one scale per row, times float32 activations (QuantizedLinear "cpu_rows" for int8): weight-only,
// y[m, n] = s[n] * sum_k q[n,k] * x[m,k] in float32, the codes widened 16 at a time (AVX-512; a scalar loop
// elsewhere). 3. The same for fp16 or bf16 weights (no scale): "cpu_rows" for the 16-bit formats.
//
// int4 codes are in the "halves" layout (arithmetic.pack_int4_halves): (N, G, g/2) bytes, byte j of a group holding
// code j in its low nibble and code j + g/2 in its high one. Both kinds of codes are then interleaved by blocks
// of ROWS_AT_ONCE rows (native.interleave_rows): within a block, the first 64 bytes of each of its rows, then the
// next 64 of each, and so on (a last half unit of 32 bytes likewise), so the loop that computes the block's rows
// side by side reads one sequential stream. Rows after the last whole block stay as they are. Four rows in one
// stream: 1.3x one row per pass from memory and 1.5-1.9x in cache; four rows 64 bytes apart of separate rows (the
// plain layout) ran at 0.6x from memory (the 149M config's int4 matrices, AMD Zen 5 VM, one thread). The stream
// is sequential, so the CPU's own prefetcher follows it: a software prefetch 4 KB ahead, which had helped one
// row at a time, left fp16 weights at 17.6 GB/s where none reached 22.6 (a plain sum over them: 22.8).
// Left out: AVX-VNNI (the 256-bit form on CPUs without AVX-512), AVX2 loops, ARM's sdot, int4 group sizes that
// are not 64 or a multiple of 128.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#if defined(__x86_64__)
#include <immintrin.h>
#define COURSE_X86 1
#else
#define COURSE_X86 0
#endif

namespace {

constexpr int ROWS_BLOCK = 8;    // output rows per block when several input rows share the weights (a verify pass)
constexpr int ROWS_AT_ONCE = 4;  // output rows one pass of the vector loop computes side by side

inline float bf16_to_float(uint16_t v) {
  uint32_t bits = static_cast<uint32_t>(v) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

// Where the activation of each code goes ("unit order"). The codes of a row are read 64 bytes at a time (a
// "unit": 128 codes, its low nibbles then its high ones); activation byte p of the row (the one multiplying
// byte p's low nibble) is stored at 128u + i for p = 64u + i, the one for its high nibble 64 bytes later, so
// one unit is two 64-byte loads of activations, in the order the nibbles come out. A row whose last unit is
// only 32 bytes (group size 64, an odd number of groups) keeps that unit's high-nibble activations 32 bytes on.
inline void unit_slots(int64_t p, int64_t row_bytes, int64_t* lo, int64_t* hi) {
  const int64_t u = p / 64, i = p % 64;
  *lo = 128 * u + i;
  *hi = *lo + (64 * u + 64 <= row_bytes ? 64 : 32);
}

// Byte p of row n in the interleaved layout (see the header); row_bytes = G * g / 2.
inline int64_t code_offset(int64_t n, int64_t p, int64_t N, int64_t row_bytes) {
  if (n >= N - N % ROWS_AT_ONCE) return n * row_bytes + p;  // after the last whole block: as packed
  const int64_t u = p / 64, width = 64 * u + 64 <= row_bytes ? 64 : 32;
  return (n - n % ROWS_AT_ONCE) * row_bytes + u * 64 * ROWS_AT_ONCE + (n % ROWS_AT_ONCE) * width + p % 64;
}

// One input row rounded to int8 per group, in unit order, with what each group contributes besides the codes.
struct RoundedRow {
  const int8_t* a;      // (K,) unit order
  const float* d;       // (G,) x ~ d * a
  const float* offset;  // (G,) -8 * d * sum(a): the codes' offset of 8, applied once per group
  const float* sum_x;   // (G,) sum(x) in float: what the zero multiplies
};

// Rounding is x * (127 / max|x|) to the nearest integer, ties to even, in both versions below (the vector
// conversion uses the default rounding mode, as nearbyintf does), so their codes are equal. Group j of a row
// of K inputs; `a` is the row's (K,) buffer.
void round_group_scalar(const float* x, int64_t j, int64_t g, int64_t K, int8_t* a, float* d, float* offset,
                        float* sum_x) {
  float amax = 0.f, sx = 0.f;
  for (int64_t k = 0; k < g; ++k) {
    amax = std::max(amax, std::fabs(x[k]));
    sx += x[k];
  }
  const float inv = amax > 0.f ? 127.f / amax : 0.f;
  const int64_t h = g / 2;
  int sa = 0;
  for (int64_t b = 0; b < h; ++b) {
    int64_t lo, hi;
    unit_slots(j * h + b, K / 2, &lo, &hi);
    const int qlo = static_cast<int>(std::nearbyintf(x[b] * inv)), qhi = static_cast<int>(std::nearbyintf(x[h + b] * inv));
    a[lo] = static_cast<int8_t>(qlo);
    a[hi] = static_cast<int8_t>(qhi);
    sa += qlo + qhi;
  }
  *d = amax / 127.f;
  *offset = -8.f * *d * static_cast<float>(sa);
  *sum_x = sx;
}

float row_dot_scalar(const uint8_t* codes, int64_t n, int64_t N, const uint16_t* scales, const uint16_t* zeros,
                     const RoundedRow& r, int64_t G, int64_t g) {
  const int64_t h = g / 2, row_bytes = G * h;
  std::vector<int32_t> dots(static_cast<size_t>(G), 0);
  for (int64_t u0 = 0; u0 < row_bytes; u0 += 64) {  // a unit at a time: its bytes are consecutive
    const uint8_t* c = codes + code_offset(n, u0, N, row_bytes);
    for (int64_t p = u0; p < std::min(u0 + 64, row_bytes); ++p) {
      int64_t lo, hi;
      unit_slots(p, row_bytes, &lo, &hi);
      dots[p / h] += static_cast<int32_t>(c[p - u0] & 0x0F) * r.a[lo] + static_cast<int32_t>(c[p - u0] >> 4) * r.a[hi];
    }
  }
  float acc = 0.f;
  for (int64_t j = 0; j < G; ++j) {
    const float s = bf16_to_float(scales[n * G + j]);
    acc += s * (r.d[j] * static_cast<float>(dots[j]) + r.offset[j]) + bf16_to_float(zeros[n * G + j]) * r.sum_x[j];
  }
  return acc;
}

#if COURSE_X86
#define COURSE_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni")))

COURSE_AVX512 void round_group_avx512(const float* x, int64_t j, int64_t g, int64_t K, int8_t* a, float* d,
                                      float* offset, float* sum_x) {
  __m512 vmax = _mm512_setzero_ps(), vsum = _mm512_setzero_ps();
  for (int64_t k = 0; k < g; k += 16) {
    const __m512 v = _mm512_loadu_ps(x + k);
    vmax = _mm512_max_ps(vmax, _mm512_abs_ps(v));
    vsum = _mm512_add_ps(vsum, v);
  }
  const float amax = _mm512_reduce_max_ps(vmax);
  const __m512 inv = _mm512_set1_ps(amax > 0.f ? 127.f / amax : 0.f);
  const int64_t h = g / 2;
  __m512i vsa = _mm512_setzero_si512();
  for (int64_t b = 0; b < h; b += 16) {  // 16 bytes of codes share a unit: their slots are consecutive
    int64_t lo, hi;
    unit_slots(j * h + b, K / 2, &lo, &hi);
    const __m512i qlo = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(x + b), inv));
    const __m512i qhi = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(x + h + b), inv));
    vsa = _mm512_add_epi32(vsa, _mm512_add_epi32(qlo, qhi));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(a + lo), _mm512_cvtsepi32_epi8(qlo));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(a + hi), _mm512_cvtsepi32_epi8(qhi));
  }
  *d = amax / 127.f;
  *offset = -8.f * *d * static_cast<float>(_mm512_reduce_add_epi32(vsa));
  *sum_x = _mm512_reduce_add_ps(vsum);
}

COURSE_AVX512 inline __m512 bf16x16_to_float(__m256i v) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(v), 16));
}

// R consecutive rows at once (they share each load of activations, and their R chains of additions overlap),
// sixteen groups at a time: the groups' scales, zeros and rounding terms are one vector each, so the only work
// per unit besides its codes is converting its 16 int32 sums and adding them scaled. With group size 64 a unit
// holds two groups: lanes 0-7 belong to the first, 8-15 to the second, and the scale vector is built to match.
// `codes` is the first row's start: R = ROWS_AT_ONCE reads a whole interleaved block, R = 1 a row as packed. A
// row's arithmetic is the same whatever R is (R only changes which rows run side by side).
template <int R>
COURSE_AVX512 void rows_dot_vnni(const uint8_t* codes, const uint16_t* scales, const uint16_t* zeros,
                                 const RoundedRow& r, int64_t G, int64_t g, float* out) {
  const __m512i pair = _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
  const __m512i low4 = _mm512_set1_epi8(0x0F);
  __m512 acc[R];
  for (int i = 0; i < R; ++i) acc[i] = _mm512_setzero_ps();
  const int8_t* a = r.a;
  int64_t at = 0;  // byte offset in each row
  for (int64_t j0 = 0; j0 < G; j0 += 16) {
    const int64_t n = std::min<int64_t>(16, G - j0);
    const __mmask16 mask = static_cast<__mmask16>((1u << n) - 1);
    const __m512 d = _mm512_maskz_loadu_ps(mask, r.d + j0), offset = _mm512_maskz_loadu_ps(mask, r.offset + j0);
    const __m512 sum_x = _mm512_maskz_loadu_ps(mask, r.sum_x + j0);
    __m512 sd[R];  // (16,) per row: scale times the activations' scale, one per group
    for (int i = 0; i < R; ++i) {
      const __m512 s = bf16x16_to_float(_mm256_maskz_loadu_epi16(mask, scales + i * G + j0));
      const __m512 z = bf16x16_to_float(_mm256_maskz_loadu_epi16(mask, zeros + i * G + j0));
      acc[i] = _mm512_fmadd_ps(z, sum_x, _mm512_fmadd_ps(s, offset, acc[i]));
      sd[i] = _mm512_mul_ps(s, d);
    }
    if (g == 64) {
      int64_t j = 0;
      for (; j + 1 < n; j += 2) {  // a unit: groups j and j + 1
        const __m512i idx = _mm512_add_epi32(pair, _mm512_set1_epi32(static_cast<int>(j)));
        const __m512i a_lo = _mm512_loadu_si512(a), a_hi = _mm512_loadu_si512(a + 64);
        for (int i = 0; i < R; ++i) {
          const uint8_t* c = codes + at * R + i * 64;
          const __m512i b = _mm512_loadu_si512(c);
          const __m512i dot = _mm512_dpbusd_epi32(
              _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_and_si512(b, low4), a_lo),
              _mm512_and_si512(_mm512_srli_epi16(b, 4), low4), a_hi);  // 16 int32, each a sum of 8 products
          acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), _mm512_permutexvar_ps(idx, sd[i]), acc[i]);
        }
        at += 64;
        a += 128;
      }
      if (j < n) {  // an odd number of groups: the row's last unit is this one group, 32 bytes
        const __m512i idx = _mm512_set1_epi32(static_cast<int>(j));
        const __m512i act = _mm512_inserti64x4(
            _mm512_castsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(a))),
            _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a + 32)), 1);
        for (int i = 0; i < R; ++i) {
          const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(codes + at * R + i * 32));
          const __m512i q = _mm512_inserti64x4(
              _mm512_castsi256_si512(_mm256_and_si256(b, _mm512_castsi512_si256(low4))),
              _mm256_and_si256(_mm256_srli_epi16(b, 4), _mm512_castsi512_si256(low4)), 1);
          acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_dpbusd_epi32(_mm512_setzero_si512(), q, act)),
                                   _mm512_permutexvar_ps(idx, sd[i]), acc[i]);
        }
      }
      continue;
    }
    for (int64_t j = 0; j < n; ++j) {  // group size 128 or more: whole units per group
      const __m512i idx = _mm512_set1_epi32(static_cast<int>(j));
      __m512i dot[R];
      for (int i = 0; i < R; ++i) dot[i] = _mm512_setzero_si512();
      for (int64_t c = 0; c < g / 128; ++c) {
        const __m512i a_lo = _mm512_loadu_si512(a), a_hi = _mm512_loadu_si512(a + 64);
        for (int i = 0; i < R; ++i) {
          const uint8_t* cp = codes + at * R + i * 64;
          const __m512i b = _mm512_loadu_si512(cp);
          dot[i] = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(dot[i], _mm512_and_si512(b, low4), a_lo),
                                       _mm512_and_si512(_mm512_srli_epi16(b, 4), low4), a_hi);
        }
        at += 64;
        a += 128;
      }
      for (int i = 0; i < R; ++i)
        acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot[i]), _mm512_permutexvar_ps(idx, sd[i]), acc[i]);
    }
  }
  for (int i = 0; i < R; ++i) out[i] = _mm512_reduce_add_ps(acc[i]);
}
#endif

bool cpu_has_avx512() {
#if COURSE_X86
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl");
#else
  return false;
#endif
}

bool cpu_has_vnni() {
#if COURSE_X86
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni");
#else
  return false;
#endif
}

void check_args(const at::Tensor& codes, const at::Tensor& scales, const at::Tensor& zeros, int64_t g) {
  TORCH_CHECK(g == 64 || (g > 0 && g % 128 == 0), "group_size must be 64 or a multiple of 128; got ", g);
  TORCH_CHECK(codes.scalar_type() == at::kByte && codes.dim() == 3 && codes.size(2) == g / 2 && codes.is_contiguous(),
              "codes must be a contiguous (N, G, group_size/2) uint8 tensor");
  TORCH_CHECK(scales.scalar_type() == at::kBFloat16 && zeros.scalar_type() == at::kBFloat16 &&
                  scales.is_contiguous() && zeros.is_contiguous() && scales.dim() == 2 && zeros.dim() == 2 &&
                  scales.size(0) == codes.size(0) && scales.size(1) == codes.size(1) &&
                  zeros.sizes() == scales.sizes(),
              "scales and zeros must be contiguous (N, G) bfloat16 tensors");
}

// The loop every kernel shares: output rows in blocks of ROWS_BLOCK (in parallel; each block's weights are read
// from memory once and from cache for the other input rows), block(m, n) for each whole interleaved block of
// ROWS_AT_ONCE rows when `vector`, row(m, n) for every other row (which picks its own loop).
template <typename Block, typename Row>
void over_rows(int64_t M, int64_t N, bool vector, const Block& block, const Row& row) {
  const int64_t whole = N - N % ROWS_AT_ONCE;  // blocks start at multiples of ROWS_AT_ONCE (ROWS_BLOCK is one)
  at::parallel_for(0, (N + ROWS_BLOCK - 1) / ROWS_BLOCK, 1, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      const int64_t n0 = b * ROWS_BLOCK, n1 = std::min(N, n0 + ROWS_BLOCK);
      for (int64_t m = 0; m < M; ++m) {
        int64_t n = n0;
        if (vector)
          for (; n + ROWS_AT_ONCE <= std::min(n1, whole); n += ROWS_AT_ONCE) block(m, n);
        for (; n < n1; ++n) row(m, n);
      }
    }
  });
}

// x (M, K) float32 -> (M, N) float32. vnni=false takes the scalar loop (on any CPU); vnni=true asks for
// AVX512-VNNI and fails where the CPU lacks it.
at::Tensor dynamic_mm(const at::Tensor& x_in, const at::Tensor& codes, const at::Tensor& scales,
                      const at::Tensor& zeros, int64_t group_size, bool vnni) {
  check_args(codes, scales, zeros, group_size);
  TORCH_CHECK(x_in.scalar_type() == at::kFloat && x_in.dim() == 2, "x must be a 2-D float32 tensor");
  TORCH_CHECK(!vnni || cpu_has_vnni(), "vnni=True on a CPU without AVX512-VNNI");
  const at::Tensor x = x_in.contiguous();
  const int64_t M = x.size(0), N = codes.size(0), G = codes.size(1), g = group_size, K = G * g;
  TORCH_CHECK(x.size(1) == K, "x has ", x.size(1), " columns; the codes hold ", K);
  at::Tensor y = at::empty({M, N}, x.options());

  thread_local std::vector<int8_t> a;  // reused between calls: no allocation per token
  thread_local std::vector<float> side;
  a.resize(static_cast<size_t>(M * K));
  side.resize(static_cast<size_t>(3 * M * G));
  float* d = side.data();
  float* offset = d + M * G;
  float* sum_x = offset + M * G;
  const float* xp = x.data_ptr<float>();
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t j = 0; j < G; ++j) {
      const int64_t i = m * G + j;
#if COURSE_X86
      if (vnni) {
        round_group_avx512(xp + m * K + j * g, j, g, K, a.data() + m * K, d + i, offset + i, sum_x + i);
        continue;
      }
#endif
      round_group_scalar(xp + m * K + j * g, j, g, K, a.data() + m * K, d + i, offset + i, sum_x + i);
    }
  }
  const uint8_t* cp = codes.data_ptr<uint8_t>();
  const uint16_t* sp = reinterpret_cast<const uint16_t*>(scales.data_ptr<at::BFloat16>());
  const uint16_t* zp = reinterpret_cast<const uint16_t*>(zeros.data_ptr<at::BFloat16>());
  float* yp = y.data_ptr<float>();
  const int8_t* ap = a.data();
  const auto rounded = [&](int64_t m) { return RoundedRow{ap + m * K, d + m * G, offset + m * G, sum_x + m * G}; };
  over_rows(
      M, N, vnni,
      [&](int64_t m, int64_t n) {
#if COURSE_X86
        rows_dot_vnni<ROWS_AT_ONCE>(cp + n * (K / 2), sp + n * G, zp + n * G, rounded(m), G, g, yp + m * N + n);
#endif
      },
      [&](int64_t m, int64_t n) {
#if COURSE_X86
        if (vnni) return rows_dot_vnni<1>(cp + n * (K / 2), sp + n * G, zp + n * G, rounded(m), G, g, yp + m * N + n);
#endif
        yp[m * N + n] = row_dot_scalar(cp, n, N, sp, zp, rounded(m), G, g);
      });
  return y;
}

// The layer's weight as a float32 or bfloat16 (N, K) matrix, written into `out` (a reused workspace): what
// a prefill multiplies by in one GEMM.
void dequantize(const at::Tensor& codes, const at::Tensor& scales, const at::Tensor& zeros, int64_t group_size,
                at::Tensor out) {
  check_args(codes, scales, zeros, group_size);
  const int64_t N = codes.size(0), G = codes.size(1), g = group_size, h = g / 2, K = G * g;
  TORCH_CHECK(out.is_contiguous() && out.dim() == 2 && out.size(0) == N && out.size(1) == K &&
                  (out.scalar_type() == at::kFloat || out.scalar_type() == at::kBFloat16),
              "out must be a contiguous (N, K) float32 or bfloat16 tensor");
  const bool bf16 = out.scalar_type() == at::kBFloat16;
  const uint8_t* cp = codes.data_ptr<uint8_t>();
  const uint16_t* sp = reinterpret_cast<const uint16_t*>(scales.data_ptr<at::BFloat16>());
  const uint16_t* zp = reinterpret_cast<const uint16_t*>(zeros.data_ptr<at::BFloat16>());
  void* op = out.data_ptr();
  at::parallel_for(0, N, 16, [&](int64_t n0, int64_t n1) {
    std::vector<float> row(static_cast<size_t>(K));
    for (int64_t n = n0; n < n1; ++n) {
      const int64_t row_bytes = G * h;
      for (int64_t u0 = 0; u0 < row_bytes; u0 += 64) {  // a unit at a time (see code_offset)
        const uint8_t* c = cp + code_offset(n, u0, N, row_bytes);
        for (int64_t p = u0; p < std::min(u0 + 64, row_bytes); ++p) {
          const int64_t j = p / h, b = p % h;
          const float s = bf16_to_float(sp[n * G + j]), z = bf16_to_float(zp[n * G + j]);
          row[j * g + b] = static_cast<float>((c[p - u0] & 0x0F) - 8) * s + z;
          row[j * g + h + b] = static_cast<float>((c[p - u0] >> 4) - 8) * s + z;
        }
      }
      if (!bf16) {
        std::memcpy(static_cast<float*>(op) + n * K, row.data(), sizeof(float) * K);
        continue;
      }
      uint16_t* o = static_cast<uint16_t*>(op) + n * K;
      for (int64_t k = 0; k < K; ++k) {  // round to nearest, ties to even (no NaN or inf can occur here)
        uint32_t bits;
        std::memcpy(&bits, &row[k], sizeof bits);
        o[k] = static_cast<uint16_t>((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16);
      }
    }
  });
}

// ---- int8 weight-only ----

#if COURSE_X86
#define COURSE_AVX512F __attribute__((target("avx512f,avx512bw,avx512vl")))

// R rows of one interleaved block (R = 1: one row as packed), K a multiple of 64: two accumulators per row
template <int R>
COURSE_AVX512F void int8_rows_avx512(const int8_t* codes, int64_t K, const float* x, const uint16_t* scales,
                                     float* out) {
  __m512 acc[R][2];
  for (int i = 0; i < R; ++i) acc[i][0] = acc[i][1] = _mm512_setzero_ps();
  for (int64_t k0 = 0; k0 < K; k0 += 64) {
    const __m512 x0 = _mm512_loadu_ps(x + k0), x1 = _mm512_loadu_ps(x + k0 + 16);
    const __m512 x2 = _mm512_loadu_ps(x + k0 + 32), x3 = _mm512_loadu_ps(x + k0 + 48);
    for (int i = 0; i < R; ++i) {
      const int8_t* c = codes + k0 * R + i * 64;
      // 16 codes at a time, widened to float32
      const __m512 w0 = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(c))));
      const __m512 w1 = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(c + 16))));
      const __m512 w2 = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(c + 32))));
      const __m512 w3 = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(c + 48))));
      acc[i][0] = _mm512_fmadd_ps(w0, x0, acc[i][0]);
      acc[i][1] = _mm512_fmadd_ps(w1, x1, acc[i][1]);
      acc[i][0] = _mm512_fmadd_ps(w2, x2, acc[i][0]);
      acc[i][1] = _mm512_fmadd_ps(w3, x3, acc[i][1]);
    }
  }
  for (int i = 0; i < R; ++i) out[i] = _mm512_reduce_add_ps(_mm512_add_ps(acc[i][0], acc[i][1])) * bf16_to_float(scales[i]);
}
#endif

// What the weight-only kernels share: x checked and made contiguous, the (M, N) output, and over_rows calling
// block(x, y, n) / row(x, y, n) with x pointing at input row m (K floats) and y at output m's element n.
template <typename Block, typename Row>
at::Tensor weight_only_mm(const at::Tensor& x_in, int64_t N, int64_t K, bool vector, const Block& block,
                          const Row& row) {
  TORCH_CHECK(x_in.scalar_type() == at::kFloat && x_in.dim() == 2 && x_in.size(1) == K,
              "x must be a 2-D float32 tensor with K columns");
  TORCH_CHECK(!vector || cpu_has_avx512(), "vector=True on a CPU without AVX-512");
  const at::Tensor x = x_in.contiguous();
  at::Tensor y = at::empty({x.size(0), N}, x.options());
  const float* xp = x.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  over_rows(
      x.size(0), N, vector, [&](int64_t m, int64_t n) { block(xp + m * K, yp + m * N + n, n); },
      [&](int64_t m, int64_t n) { row(xp + m * K, yp + m * N + n, n); });
  return y;
}

// x (M, K) float32 times int8 codes (N, K) interleaved by rows, scales (N,) bf16 -> (M, N) float32. vector=false
// takes the scalar loop; true asks for AVX-512 and fails where the CPU lacks it.
at::Tensor int8_rows_mm(const at::Tensor& x_in, const at::Tensor& codes, const at::Tensor& scales, bool vector) {
  TORCH_CHECK(codes.scalar_type() == at::kChar && codes.dim() == 2 && codes.is_contiguous() && codes.size(1) % 64 == 0,
              "codes must be a contiguous (N, K) int8 tensor with K a multiple of 64");
  TORCH_CHECK(scales.scalar_type() == at::kBFloat16 && scales.dim() == 1 && scales.size(0) == codes.size(0) &&
                  scales.is_contiguous(),
              "scales must be a contiguous (N,) bfloat16 tensor");
  const int64_t N = codes.size(0), K = codes.size(1);
  const int8_t* cp = codes.data_ptr<int8_t>();
  const uint16_t* sp = reinterpret_cast<const uint16_t*>(scales.data_ptr<at::BFloat16>());
  return weight_only_mm(
      x_in, N, K, vector,
      [&](const float* x, float* y, int64_t n) {
#if COURSE_X86
        int8_rows_avx512<ROWS_AT_ONCE>(cp + n * K, K, x, sp + n, y);
#endif
      },
      [&](const float* x, float* y, int64_t n) {
#if COURSE_X86
        if (vector) return int8_rows_avx512<1>(cp + n * K, K, x, sp + n, y);
#endif
        float acc = 0.f;  // the same sums in order, byte by byte through code_offset
        for (int64_t k = 0; k < K; ++k) acc += static_cast<float>(cp[code_offset(n, k, N, K)]) * x[k];
        *y = acc * bf16_to_float(sp[n]);
      });
}

// ---- 16-bit float weights (fp16 or bf16) ----

#if COURSE_X86
__attribute__((target("avx512f,avx512bw,avx512vl,f16c"))) inline __m512 widen16(const uint16_t* w, bool bf16) {
  const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w));
  return bf16 ? _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(v), 16)) : _mm512_cvtph_ps(v);
}

// R rows of one interleaved block (R = 1: one row as packed), K a multiple of 32 (a 64-byte unit: 32 weights)
template <int R>
__attribute__((target("avx512f,avx512bw,avx512vl,f16c"))) void float16_rows_avx512(const uint16_t* w, int64_t K,
                                                                                    const float* x, bool bf16,
                                                                                    float* out) {
  __m512 acc[R][2];
  for (int i = 0; i < R; ++i) acc[i][0] = acc[i][1] = _mm512_setzero_ps();
  for (int64_t k0 = 0; k0 < K; k0 += 32) {
    const __m512 x0 = _mm512_loadu_ps(x + k0), x1 = _mm512_loadu_ps(x + k0 + 16);
    for (int i = 0; i < R; ++i) {
      const uint16_t* c = w + k0 * R + i * 32;
      acc[i][0] = _mm512_fmadd_ps(widen16(c, bf16), x0, acc[i][0]);
      acc[i][1] = _mm512_fmadd_ps(widen16(c + 16, bf16), x1, acc[i][1]);
    }
  }
  for (int i = 0; i < R; ++i) out[i] = _mm512_reduce_add_ps(_mm512_add_ps(acc[i][0], acc[i][1]));
}
#endif

// x (M, K) float32 times fp16 or bf16 weights (N, K) interleaved by rows (as bytes) -> (M, N) float32
at::Tensor float16_rows_mm(const at::Tensor& x_in, const at::Tensor& weight, bool vector) {
  const bool bf16 = weight.scalar_type() == at::kBFloat16;
  TORCH_CHECK((bf16 || weight.scalar_type() == at::kHalf) && weight.dim() == 2 && weight.is_contiguous() &&
                  weight.size(1) % 32 == 0,
              "weight must be a contiguous (N, K) float16 or bfloat16 tensor with K a multiple of 32");
  const int64_t N = weight.size(0), K = weight.size(1);
  const uint16_t* wp = reinterpret_cast<const uint16_t*>(weight.data_ptr());
  return weight_only_mm(
      x_in, N, K, vector,
      [&](const float* x, float* y, int64_t n) {
#if COURSE_X86
        float16_rows_avx512<ROWS_AT_ONCE>(wp + n * K, K, x, bf16, y);
#endif
      },
      [&](const float* x, float* y, int64_t n) {
#if COURSE_X86
        if (vector) return float16_rows_avx512<1>(wp + n * K, K, x, bf16, y);
#endif
        float acc = 0.f;  // byte offsets through code_offset: element k is bytes 2k and 2k + 1
        for (int64_t k = 0; k < K; ++k) {
          const uint16_t v = wp[code_offset(n, 2 * k, N, 2 * K) / 2];
          acc += (bf16 ? bf16_to_float(v) : static_cast<float>(c10::detail::fp16_ieee_to_fp32_value(v))) * x[k];
        }
        *y = acc;
      });
}

bool has_vnni() { return cpu_has_vnni(); }
bool has_avx512() { return cpu_has_avx512(); }
int64_t rows_at_once() { return ROWS_AT_ONCE; }

}  // namespace

TORCH_LIBRARY(course_quant, m) {
  m.def("int4_dynamic_mm(Tensor x, Tensor codes, Tensor scales, Tensor zeros, int group_size, bool vnni) -> Tensor");
  m.def("int4_dequantize(Tensor codes, Tensor scales, Tensor zeros, int group_size, Tensor(a!) out) -> ()");
  m.def("int8_rows_mm(Tensor x, Tensor codes, Tensor scales, bool vector) -> Tensor");
  m.def("float16_rows_mm(Tensor x, Tensor weight, bool vector) -> Tensor");
  m.def("has_vnni() -> bool", &has_vnni);
  m.def("has_avx512() -> bool", &has_avx512);
  m.def("rows_at_once() -> int", &rows_at_once);
}

TORCH_LIBRARY_IMPL(course_quant, CPU, m) {
  m.impl("int4_dynamic_mm", &dynamic_mm);
  m.impl("int8_rows_mm", &int8_rows_mm);
  m.impl("float16_rows_mm", &float16_rows_mm);
  m.impl("int4_dequantize", &dequantize);
}
