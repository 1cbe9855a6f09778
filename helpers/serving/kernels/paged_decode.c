/* Paged decode attention: each request's query reads its keys and values from the blocks its table names,
 * where they lie in the pool, one block at a time, with chapter 08's online softmax (a running max m, a
 * running sum l, an output accumulator rescaled once per block). No dense copy of anybody's context is made.
 *
 * Layouts (float32, contiguous):
 *   q      (N, H, D)                     one query row per decoding request
 *   k, v   (num_blocks * BLOCK, Hkv, D)  one layer's pool: slot = block * BLOCK + offset
 *   tables (N, W) int64                  each request's blocks in position order (entries past its length unread)
 *   lens   (N,) int64                    keys each request attends to: positions 0 .. lens[n]-1, lens[n] >= 1
 *   out    (N, H, D)
 * HEAD_DIM (D), KV_HEADS (Hkv), GROUP (query heads per kv head, H / Hkv) and BLOCK (block size) are compile-time
 * constants
 * (paged_attention.py passes them with -D and builds one library per combination): fixed trip counts let
 * the compiler unroll and vectorize. A block is read once, whole (all kv heads, contiguous), and each key
 * and value row serves the GROUP query heads that share it (grouped-query attention).
 * Left out: other dtypes, threads (the course runs one), splitting one long context across cores. */
#include <math.h>
#include <stdint.h>

void paged_decode(const float *q, const float *k, const float *v, const int64_t *tables, const int64_t *lens,
                  int64_t N, int64_t W, float scale, float *out) {
    const int H = KV_HEADS * GROUP;
    for (int64_t n = 0; n < N; n++) {
        const int64_t len = lens[n];
        const float *qn = q + n * H * HEAD_DIM;  /* (H, D); head h reads kv head h / GROUP */
        float acc[H][HEAD_DIM];  /* sum of exp(score - m) * v so far, per query head */
        float s[GROUP][BLOCK];  /* one kv head's scores in this block, then their exp */
        float m[H], l[H];  /* running max and sum (no inf: the kernel is built with -ffast-math) */
        for (int h = 0; h < H; h++) {
            m[h] = -3.0e38f;
            l[h] = 0.0f;
            for (int d = 0; d < HEAD_DIM; d++) acc[h][d] = 0.0f;
        }
        for (int64_t j = 0; j * BLOCK < len; j++) {
            const int used = len - j * BLOCK < BLOCK ? (int)(len - j * BLOCK) : BLOCK;  /* the last may be part full */
            const float *kb = k + tables[n * W + j] * BLOCK * KV_HEADS * HEAD_DIM;  /* the block, in place */
            const float *vb = v + tables[n * W + j] * BLOCK * KV_HEADS * HEAD_DIM;
            if ((j + 1) * BLOCK < len) {  /* the next block sits anywhere in the pool: ask for it now */
                const float *kn = k + tables[n * W + j + 1] * BLOCK * KV_HEADS * HEAD_DIM;
                const float *vn = v + tables[n * W + j + 1] * BLOCK * KV_HEADS * HEAD_DIM;
                for (int c = 0; c < BLOCK * KV_HEADS * HEAD_DIM; c += 16) {  /* one 64-byte line at a time */
                    __builtin_prefetch(kn + c);
                    __builtin_prefetch(vn + c);
                }
            }
            for (int hk = 0; hk < KV_HEADS; hk++) {
                const float *qg = qn + hk * GROUP * HEAD_DIM;  /* (GROUP, D): the heads that share kv head hk */
                for (int o = 0; o < used; o++) {  /* slots past the length are never read */
                    const float *kr = kb + (o * KV_HEADS + hk) * HEAD_DIM;
                    for (int g = 0; g < GROUP; g++) {
                        float dot = 0.0f;
                        for (int d = 0; d < HEAD_DIM; d++) dot += qg[g * HEAD_DIM + d] * kr[d];
                        s[g][o] = dot * scale;
                    }
                }
                for (int g = 0; g < GROUP; g++) {
                    const int h = hk * GROUP + g;
                    float m_new = m[h];
                    for (int o = 0; o < used; o++) m_new = s[g][o] > m_new ? s[g][o] : m_new;
                    const float corr = expf(m[h] - m_new);  /* rescale what the earlier blocks summed */
                    float sum = 0.0f;
                    for (int o = 0; o < used; o++) {
                        s[g][o] = expf(s[g][o] - m_new);
                        sum += s[g][o];
                    }
                    l[h] = l[h] * corr + sum;
                    m[h] = m_new;
                    for (int d = 0; d < HEAD_DIM; d++) acc[h][d] *= corr;
                }
                for (int o = 0; o < used; o++) {
                    const float *vr = vb + (o * KV_HEADS + hk) * HEAD_DIM;
                    for (int g = 0; g < GROUP; g++)
                        for (int d = 0; d < HEAD_DIM; d++) acc[hk * GROUP + g][d] += s[g][o] * vr[d];
                }
            }
        }
        for (int h = 0; h < H; h++)
            for (int d = 0; d < HEAD_DIM; d++) out[(n * H + h) * HEAD_DIM + d] = acc[h][d] / l[h];
    }
}
