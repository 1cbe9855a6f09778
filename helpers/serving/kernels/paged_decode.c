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
 * constants (paged_attention.py passes them with -D and builds one library per combination): fixed trip counts
 * let the compiler unroll and vectorize. A block is read once, whole (all kv heads, contiguous), and each key
 * and value row serves the GROUP query heads that share it (grouped-query attention).
 *
 * Two things make it fast, both measured (paged_attention.py's docstring):
 * - memory: blocks sit anywhere in the pool, so the hardware cannot guess the next one; the kernel walks the
 *   stream of blocks (every request's, request after request) and asks for the block AHEAD places on while
 *   it computes, a few cache lines per key. Asking for a whole block at once stalls the core: it holds only
 *   so many outstanding misses;
 * - the scores of a 16-slot block (BLOCK 16, D a multiple of 16, a compiler with __builtin_shufflevector):
 *   16 vector products, then summed across lanes 16 keys at a time by halving (scores16) instead of one
 *   horizontal sum per key. The sums come out in the order the compiler's vectorized plain loop adds them
 *   (measured with -O3 -march=native -ffast-math at D = 32: the same bits).
 * Left out: other dtypes, threads (the course runs one), splitting one long context across cores. */
#include <math.h>
#include <stdint.h>

#define BLOCK_FLOATS (BLOCK * KV_HEADS * HEAD_DIM)  /* one block of one layer's keys (or values) */
#define AHEAD 2  /* blocks between the one computed and the one being fetched */
#define LINES_PER_KEY ((HEAD_DIM + 15) / 16)  /* 64-byte lines fetched per key row computed */

#if defined(__has_builtin)
#if __has_builtin(__builtin_shufflevector)
#define HAVE_SHUFFLEVECTOR 1  /* GCC 12 and later, clang: older compilers take the plain loop below */
#endif
#endif
#if BLOCK == 16 && HEAD_DIM % 16 == 0 && defined(HAVE_SHUFFLEVECTOR)
#define SCORES16 1
typedef float v16 __attribute__((vector_size(64)));  /* 16 floats: one AVX-512 register, two AVX2 ones */
/* keep, from the keys of x then those of y, the two halves of each key's lanes, for adding: after four
 * halvings 16 vectors of 16 partial sums become one vector holding 16 whole sums, key o in lane o */
#define LO16 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23
#define HI16 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31
#define LO8 0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27
#define HI8 4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31
#define LO4 0, 1, 4, 5, 8, 9, 12, 13, 16, 17, 20, 21, 24, 25, 28, 29
#define HI4 2, 3, 6, 7, 10, 11, 14, 15, 18, 19, 22, 23, 26, 27, 30, 31
#define LO2 0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30
#define HI2 1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31
#define HALVE(x, y, LO, HI) (__builtin_shufflevector(x, y, LO) + __builtin_shufflevector(x, y, HI))

static inline v16 load16(const float *p) {
    v16 r;
    __builtin_memcpy(&r, p, sizeof r);
    return r;
}

/* s[o] = q . k_o for the 16 keys of kv head hk in block kb */
static inline v16 scores16(const float *q, const float *kb, int hk) {
    v16 p[16];  /* p[o]: the products of q and key o, summed over D in 16 lanes */
    for (int o = 0; o < 16; o++) {
        const float *kr = kb + (o * KV_HEADS + hk) * HEAD_DIM;
        v16 a = load16(q) * load16(kr);
        for (int c = 16; c < HEAD_DIM; c += 16) a += load16(q + c) * load16(kr + c);
        p[o] = a;
    }
    v16 t[8], u[4], w[2];
    for (int i = 0; i < 8; i++) t[i] = HALVE(p[2 * i], p[2 * i + 1], LO16, HI16);
    for (int i = 0; i < 4; i++) u[i] = HALVE(t[2 * i], t[2 * i + 1], LO8, HI8);
    for (int i = 0; i < 2; i++) w[i] = HALVE(u[2 * i], u[2 * i + 1], LO4, HI4);
    return HALVE(w[0], w[1], LO2, HI2);
}
#endif

typedef struct {
    int64_t n, j;  /* request n's block j: the next block of the stream to fetch */
} cursor;

/* The block the cursor names (its keys in *pk, values in *pv; none past the last request), then step it on. */
static inline void next_block(cursor *c, const float *k, const float *v, const int64_t *tables, const int64_t *lens,
                              int64_t N, int64_t W, const float **pk, const float **pv) {
    *pk = *pv = 0;
    if (c->n >= N) return;
    const int64_t b = tables[c->n * W + c->j];
    *pk = k + b * BLOCK_FLOATS;
    *pv = v + b * BLOCK_FLOATS;
    if (++c->j * BLOCK >= lens[c->n]) {
        c->n++;
        c->j = 0;
    }
}

void paged_decode(const float *q, const float *k, const float *v, const int64_t *tables, const int64_t *lens,
                  int64_t N, int64_t W, float scale, float *out) {
    const int H = KV_HEADS * GROUP;
    cursor ahead = {0, 0};
    for (int a = 0; a < AHEAD; a++) {  /* the first blocks: asked for whole, before any work */
        const float *pk, *pv;
        next_block(&ahead, k, v, tables, lens, N, W, &pk, &pv);
        for (int c = 0; pk && c < BLOCK_FLOATS; c += 16) {
            __builtin_prefetch(pk + c);
            __builtin_prefetch(pv + c);
        }
    }
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
            const float *kb = k + tables[n * W + j] * BLOCK_FLOATS;  /* the block, in place */
            const float *vb = v + tables[n * W + j] * BLOCK_FLOATS;
            const float *pk, *pv;  /* the block AHEAD on in the stream: fetched a few lines per key, below */
            next_block(&ahead, k, v, tables, lens, N, W, &pk, &pv);
            int line = 0;
            for (int hk = 0; hk < KV_HEADS; hk++) {
                const float *qg = qn + hk * GROUP * HEAD_DIM;  /* (GROUP, D): the heads that share kv head hk */
#ifdef SCORES16
                /* a part-full block's unused slots get scores too, never used below */
                for (int g = 0; g < GROUP; g++) {
                    v16 sc = scores16(qg + g * HEAD_DIM, kb, hk) * scale;
                    __builtin_memcpy(s[g], &sc, sizeof sc);
                }
#else
                for (int o = 0; o < used; o++) {  /* slots past the length are never read */
                    const float *kr = kb + (o * KV_HEADS + hk) * HEAD_DIM;
                    for (int g = 0; g < GROUP; g++) {
                        float dot = 0.0f;
                        for (int d = 0; d < HEAD_DIM; d++) dot += qg[g * HEAD_DIM + d] * kr[d];
                        s[g][o] = dot * scale;
                    }
                }
#endif
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
                    for (int r = 0; pk && r < LINES_PER_KEY && line < BLOCK_FLOATS; r++, line += 16) {
                        __builtin_prefetch(pk + line);
                        __builtin_prefetch(pv + line);
                    }
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
