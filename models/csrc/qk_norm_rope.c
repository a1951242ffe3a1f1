/* QK-norm + RoPE of one attention input (q or k), forward and backward, fused into one pass each.

   The numbers are those of the eager layers (models/layers.py), operation for operation:
   forward  xn = (x * rstd) * w                                   (fp32; rstd computed by the caller)
            t  = bf16(xn)                                         (the tables' dtype, as the official module)
            out[i]   = bf16(bf16(t[i] * cos[i]) - bf16(t[i+h] * sin[i]))      i <  h = K/2
            out[i]   = bf16(bf16(t[i] * cos[i]) + bf16(t[i-h] * sin[i]))      i >= h
            (prefix tokens, which carry no position: out = bf16(xn))
   backward the adjoint of that rotation replayed in bf16 as autograd does (grad cast to bf16, rotated
            back, cast to fp32), then RMSNorm's closed-form backward
            dx = rstd * (g w) - x * rstd^3 * <g w, x> / K,   dw = sum_rows g * x * rstd.
   Every bf16 value is an fp32 rounded to nearest-even, as c10::BFloat16; products of two bf16 values
   are exact in fp32, so each rounding point matches PyTorch's bf16 arithmetic on CPU. Built with
   -ffp-contract=off: a fused multiply-add would skip a rounding and change the forward's bits.

   Layouts (element strides; the channel dimension K is contiguous everywhere):
   x     (B, J, N, K) at x[b*sxb + j*sxj + n*sxn + k]   J heads, N tokens, the last P carry RoPE
   rstd  (B, J, N)    at rstd[b*srb + j*srj + n*srn]
   sin, cos (P, K) per sample at tab[b*stb + p*K + k]   stb = 0 when every sample shares one table
   out, dx: contiguous (B, J, N, K);  g (B, J, N, K) at g[b*sgb + j*sgj + n*sgn + k]
   dw_partial (nthreads, K) doubles, summed by the caller. */

#include <math.h>
#include <stdint.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#define MAX_K 512

static inline float bf16_round(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    u = (f != f) ? 0x7FC00000u : ((u + 0x7FFFu + ((u >> 16) & 1u)) & 0xFFFF0000u);
    float r;
    memcpy(&r, &u, sizeof r);
    return r;
}

static inline float bf16_load(const uint16_t *p) {
    uint32_t u = (uint32_t)(*p) << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

int hv_qk_norm_rope_max_k(void) { return MAX_K; }

/* One row each. Inlined into loops specialised for K = 64 (every Sapiens2 size's head dim), where
   the compiler unrolls the channel loops fully; other K run the same code with K at run time. */
static inline __attribute__((always_inline)) void fwd_row(const float *restrict xr, float r, const float *restrict w, const uint16_t *restrict st,
                    const uint16_t *restrict ct, float *restrict o, int64_t K) {
    float t[MAX_K], c[MAX_K], s[MAX_K];
    const int64_t h = K / 2;
    for (int64_t k = 0; k < K; k++) t[k] = bf16_round((xr[k] * r) * w[k]);
    if (st == NULL) { /* a prefix token: no rotation */
        for (int64_t k = 0; k < K; k++) o[k] = t[k];
        return;
    }
    for (int64_t k = 0; k < K; k++) {
        c[k] = bf16_load(ct + k);
        s[k] = bf16_load(st + k);
    }
    for (int64_t k = 0; k < h; k++) o[k] = bf16_round(bf16_round(t[k] * c[k]) - bf16_round(t[k + h] * s[k]));
    for (int64_t k = h; k < K; k++) o[k] = bf16_round(bf16_round(t[k] * c[k]) + bf16_round(t[k - h] * s[k]));
}

static inline __attribute__((always_inline)) void bwd_row(const float *restrict gr, const float *restrict xr, float r, const float *restrict w,
                    const uint16_t *restrict st, const uint16_t *restrict ct, float *restrict o,
                    double *restrict dw, int64_t K) {
    float gb[MAX_K], d[MAX_K], c[MAX_K], s[MAX_K];
    const int64_t h = K / 2;
    for (int64_t k = 0; k < K; k++) gb[k] = bf16_round(gr[k]);
    if (st == NULL) {
        for (int64_t k = 0; k < K; k++) d[k] = gb[k];
    } else {
        for (int64_t k = 0; k < K; k++) {
            c[k] = bf16_load(ct + k);
            s[k] = bf16_load(st + k);
        }
        for (int64_t k = 0; k < h; k++) d[k] = bf16_round(bf16_round(gb[k] * c[k]) + bf16_round(gb[k + h] * s[k + h]));
        for (int64_t k = h; k < K; k++) d[k] = bf16_round(bf16_round(gb[k] * c[k]) - bf16_round(gb[k - h] * s[k - h]));
    }
    for (int64_t k = 0; k < K; k++) {
        dw[k] += (double)((d[k] * xr[k]) * r);
        d[k] *= w[k];
    }
    float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0}; /* K % 8 == 0: lanes the compiler can vectorise */
    for (int64_t k = 0; k < K; k += 8)
        for (int l = 0; l < 8; l++) acc[l] += d[k + l] * xr[k + l];
    const float dot = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
    const float coef = -dot * (r * r * r) / (float)K;
    for (int64_t k = 0; k < K; k++) o[k] = d[k] * r + xr[k] * coef;
}

void hv_qk_norm_rope_fwd(const float *x, int64_t B, int64_t J, int64_t N, int64_t K,
                         int64_t sxb, int64_t sxj, int64_t sxn,
                         const float *rstd, int64_t srb, int64_t srj, int64_t srn,
                         const float *w, const uint16_t *sin_t, const uint16_t *cos_t, int64_t P, int64_t stb,
                         float *out, int nthreads) {
    const int64_t prefix = N - P;
#pragma omp parallel for collapse(2) schedule(static) num_threads(nthreads) if (nthreads > 1)
    for (int64_t b = 0; b < B; b++)
        for (int64_t j = 0; j < J; j++)
            for (int64_t n = 0; n < N; n++) {
                const int64_t p = (n - prefix) * K + b * stb;
                const float *xr = x + b * sxb + j * sxj + n * sxn;
                const float r = rstd[b * srb + j * srj + n * srn];
                const uint16_t *st = n < prefix ? NULL : sin_t + p, *ct = n < prefix ? NULL : cos_t + p;
                float *o = out + ((b * J + j) * N + n) * K;
                if (K == 64)
                    fwd_row(xr, r, w, st, ct, o, 64);
                else
                    fwd_row(xr, r, w, st, ct, o, K);
            }
}

void hv_qk_norm_rope_bwd(const float *g, int64_t sgb, int64_t sgj, int64_t sgn,
                         const float *x, int64_t B, int64_t J, int64_t N, int64_t K,
                         int64_t sxb, int64_t sxj, int64_t sxn,
                         const float *rstd, int64_t srb, int64_t srj, int64_t srn,
                         const float *w, const uint16_t *sin_t, const uint16_t *cos_t, int64_t P, int64_t stb,
                         float *dx, double *dw_partial, int nthreads) {
    const int64_t prefix = N - P;
#pragma omp parallel num_threads(nthreads) if (nthreads > 1)
    {
        int tid = 0;
#ifdef _OPENMP
        tid = omp_get_thread_num();
#endif
        double *dw = dw_partial + (int64_t)tid * K;
#pragma omp for collapse(2) schedule(static)
        for (int64_t b = 0; b < B; b++)
            for (int64_t j = 0; j < J; j++)
                for (int64_t n = 0; n < N; n++) {
                    const int64_t p = (n - prefix) * K + b * stb;
                    const float *gr = g + b * sgb + j * sgj + n * sgn, *xr = x + b * sxb + j * sxj + n * sxn;
                    const float r = rstd[b * srb + j * srj + n * srn];
                    const uint16_t *st = n < prefix ? NULL : sin_t + p, *ct = n < prefix ? NULL : cos_t + p;
                    float *o = dx + ((b * J + j) * N + n) * K;
                    if (K == 64)
                        bwd_row(gr, xr, r, w, st, ct, o, dw, 64);
                    else
                        bwd_row(gr, xr, r, w, st, ct, o, dw, K);
                }
    }
}
