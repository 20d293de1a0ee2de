// The decode program's CUDA kernels (sim/program/cuda_exec.py compiles them with NVRTC).
//
// One module per (model shape, cache types, weight type): the shape is compile-time constants, so
// every per-lane loop unrolls. Every kernel reads its dynamic inputs (the current tokens, the cells
// each sequence attends, the step counter) from device memory, so a split's kernels are captured
// once as a CUDA graph and replayed every token. The NumPy executor (numpy_exec.py) computes the
// same thing on the same bytes; a gpu test keeps the two in agreement.
//
// Constants (-D): DK DV G NKV (head dims, query heads per KV head, KV heads), KTYPE VTYPE WTYPE
// (type codes of codecs.TYPE_CODES), KROW VROW (cache row bytes), MAXSEQ (sequences per launch),
// PARAM_INTS (ints per sequence in the graph-input block, plan.py).

#include <cuda_fp16.h>

#define TYPE_F32 0
#define TYPE_F16 1
#define TYPE_BF16 2
#define TYPE_Q8_0 3
#define TYPE_Q4_0 4
#define NH (NKV * G)
#define NWARP 4
#define KV_INF __int_as_float(0x7f800000)  // NVRTC has no math.h INFINITY

__device__ __forceinline__ float h2f(const unsigned char* p) {
    return __half2float(*reinterpret_cast<const __half*>(p));
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// E consecutive elements from element e0 of an encoded row (E divides 32 and e0 % E == 0 for block types).
template <int T, int E>
__device__ __forceinline__ void load_run(const unsigned char* row, int e0, float* out) {
    if constexpr (T == TYPE_F32) {
        const float* p = reinterpret_cast<const float*>(row) + e0;
#pragma unroll
        for (int i = 0; i < E; i++) out[i] = p[i];
    } else if constexpr (T == TYPE_F16) {
        const __half* p = reinterpret_cast<const __half*>(row) + e0;
#pragma unroll
        for (int i = 0; i < E; i++) out[i] = __half2float(p[i]);
    } else if constexpr (T == TYPE_BF16) {
        const unsigned short* p = reinterpret_cast<const unsigned short*>(row) + e0;
#pragma unroll
        for (int i = 0; i < E; i++) out[i] = __uint_as_float(((unsigned)p[i]) << 16);
    } else if constexpr (T == TYPE_Q8_0) {
        const unsigned char* b = row + (e0 / 32) * 34;
        const float d = h2f(b);
        const signed char* q = reinterpret_cast<const signed char*>(b + 2) + (e0 % 32);
#pragma unroll
        for (int i = 0; i < E; i++) out[i] = d * (float)q[i];
    } else {
        const unsigned char* b = row + (e0 / 32) * 18;
        const float d = h2f(b);
        const int o = e0 % 32;
        const unsigned char* qs = b + 2;
        if (o < 16) {
#pragma unroll
            for (int i = 0; i < E; i++) out[i] = d * (float)((int)(qs[o + i] & 15) - 8);
        } else {
#pragma unroll
            for (int i = 0; i < E; i++) out[i] = d * (float)((int)(qs[o - 16 + i] >> 4) - 8);
        }
    }
}

template <int T>
__device__ __forceinline__ int block_bytes() {
    return T == TYPE_F32 ? 128 : (T == TYPE_Q8_0 ? 34 : (T == TYPE_Q4_0 ? 18 : 64));
}

// ------------------------------------------------------------------ attention
// Flash-decoding over the delivered window: block (h, c, s) runs KV head h of sequence s over chunk c
// of the sequence's cells, its NWARP warps taking rows in turn, each lane a run of DK/32 (DV/32)
// elements; the warps' partial softmax states are merged in shared memory and written as one partial
// (m, l, acc[DV]) per query head. The cells of sequence s: params[s*PARAM_INTS + 0..4] =
// start0, len0, start1, len1, step1 (its prompt block, then its interleaved rows).

extern "C" __global__ void __launch_bounds__(NWARP * 32)
attn_partial(const unsigned long long* kptr, const unsigned long long* vptr, const int* params,
             const float* q, float* part, int nchunk) {
    constexpr int EK = DK / 32, EV = DV / 32;
    extern __shared__ float sm[];  // NWARP x G x (DV + 2)
    const int h = blockIdx.x, c = blockIdx.y, s = blockIdx.z;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int* p = params + s * PARAM_INTS;
    const int start0 = p[0], len0 = p[1], start1 = p[2], len1 = p[3], step1 = p[4];
    const int n = len0 + len1;
    const int per = (n + nchunk - 1) / nchunk;
    const int r0 = c * per, r1 = min(n, r0 + per);
    const unsigned char* kb = reinterpret_cast<const unsigned char*>(kptr[s]);
    const unsigned char* vb = reinterpret_cast<const unsigned char*>(vptr[s]);
    const float scale = rsqrtf((float)DK);
    float qr[G][EK], m[G], l[G], acc[G][EV];
#pragma unroll
    for (int g = 0; g < G; g++) {
#pragma unroll
        for (int i = 0; i < EK; i++) qr[g][i] = q[((size_t)s * NH + h * G + g) * DK + lane * EK + i] * scale;
        m[g] = -KV_INF;
        l[g] = 0.f;
#pragma unroll
        for (int i = 0; i < EV; i++) acc[g][i] = 0.f;
    }
    for (int r = r0 + warp; r < r1; r += 2 * NWARP) {
        const bool two = r + NWARP < r1;
        float kf[2][EK], vf[2][EV];
#pragma unroll
        for (int u = 0; u < 2; u++) {
            const int rr = u == 0 ? r : (two ? r + NWARP : r);
            const int cell = rr < len0 ? start0 + rr : start1 + (rr - len0) * step1;
            load_run<KTYPE, EK>(kb + (size_t)cell * KROW, h * DK + lane * EK, kf[u]);
            load_run<VTYPE, EV>(vb + (size_t)cell * VROW, h * DV + lane * EV, vf[u]);
        }
#pragma unroll
        for (int u = 0; u < 2; u++) {
            if (u == 1 && !two) break;
#pragma unroll
            for (int g = 0; g < G; g++) {
                float dot = 0.f;
#pragma unroll
                for (int i = 0; i < EK; i++) dot += qr[g][i] * kf[u][i];
                dot = warp_sum(dot);
                const float mn = fmaxf(m[g], dot);
                const float corr = expf(m[g] - mn);
                const float pe = expf(dot - mn);
                l[g] = l[g] * corr + pe;
#pragma unroll
                for (int i = 0; i < EV; i++) acc[g][i] = acc[g][i] * corr + pe * vf[u][i];
                m[g] = mn;
            }
        }
    }
    constexpr int W = DV + 2;
#pragma unroll
    for (int g = 0; g < G; g++) {
        float* mine = sm + (warp * G + g) * W;
        if (lane == 0) { mine[0] = m[g]; mine[1] = l[g]; }
#pragma unroll
        for (int i = 0; i < EV; i++) mine[2 + lane * EV + i] = acc[g][i];
    }
    __syncthreads();
    float* out = part + (((size_t)s * NKV + h) * nchunk + c) * G * W;
    for (int t = threadIdx.x; t < G * DV; t += NWARP * 32) {
        const int g = t / DV, d = t % DV;
        float M = -KV_INF;
        for (int w = 0; w < NWARP; w++) M = fmaxf(M, sm[(w * G + g) * W]);
        float L = 0.f, A = 0.f;
        if (M != -KV_INF) {
            for (int w = 0; w < NWARP; w++) {
                const float* o = sm + (w * G + g) * W;
                const float e = o[0] == -KV_INF ? 0.f : expf(o[0] - M);
                L += o[1] * e;
                A += o[2 + d] * e;
            }
        }
        out[g * W + 2 + d] = A;
        if (d == 0) { out[g * W] = M; out[g * W + 1] = L; }
    }
}

// Merge the chunks' partials: block (h*G + g, s), threads over DV.
extern "C" __global__ void attn_reduce(const float* part, float* out, int nchunk) {
    constexpr int W = DV + 2;
    const int hg = blockIdx.x, s = blockIdx.y, h = hg / G, g = hg % G;
    const float* base = part + ((size_t)s * NKV + h) * nchunk * G * W + g * W;
    float M = -KV_INF;
    for (int c = 0; c < nchunk; c++) M = fmaxf(M, base[(size_t)c * G * W]);
    float L = 0.f;
    for (int c = 0; c < nchunk; c++) {
        const float mc = base[(size_t)c * G * W];
        if (mc != -KV_INF) L += base[(size_t)c * G * W + 1] * expf(mc - M);
    }
    for (int d = threadIdx.x; d < DV; d += blockDim.x) {
        float A = 0.f;
        for (int c = 0; c < nchunk; c++) {
            const float mc = base[(size_t)c * G * W];
            if (mc != -KV_INF) A += base[(size_t)c * G * W + 2 + d] * expf(mc - M);
        }
        out[((size_t)s * NH + hg) * DV + d] = A / L;
    }
}

// ------------------------------------------------------------ matrix-vector
// y = W x for nseq sequences, W stored as GGUF does (N rows of K elements, each row whole blocks).
// One warp per output row, lanes over the row's blocks. NORM scales by the RMS norm of x (computed in
// the same pass: llama.cpp's fused rms_norm + mul_mat). MODE 0: y = v; 1: y = r + v (residual, in
// place allowed); 2: GLU, rows n and N + n: y = silu(v_n) * v_{N+n}.

template <int MODE, bool NORM>
__device__ __forceinline__ void matvec(const unsigned char* W, const float* x, float* y, const float* r, int K, int N,
                                       int nseq) {
    const int lane = threadIdx.x % 32;
    const int n = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    if (n >= N) return;
    constexpr int ROWS = MODE == 2 ? 2 : 1;
    float acc[ROWS][MAXSEQ], ss[MAXSEQ];
#pragma unroll
    for (int s = 0; s < MAXSEQ; s++) {
        ss[s] = 0.f;
#pragma unroll
        for (int j = 0; j < ROWS; j++) acc[j][s] = 0.f;
    }
    if constexpr (WTYPE == TYPE_Q8_0) {
        const int nb = K / 32;
        const size_t rb = (size_t)nb * 34;
        for (int b = lane; b < nb; b += 32) {
            float wv[ROWS][32], dd[ROWS];
#pragma unroll
            for (int j = 0; j < ROWS; j++) {
                const unsigned char* blk = W + (size_t)(n + j * N) * rb + (size_t)b * 34;
                dd[j] = h2f(blk);
                const short* q2 = reinterpret_cast<const short*>(blk + 2);
#pragma unroll
                for (int i = 0; i < 16; i++) {
                    const short v = q2[i];
                    wv[j][2 * i] = (float)(signed char)(v & 0xff);
                    wv[j][2 * i + 1] = (float)(signed char)((v >> 8) & 0xff);
                }
            }
#pragma unroll
            for (int s = 0; s < MAXSEQ; s++) {
                if (s < nseq) {
                    const float4* xv = reinterpret_cast<const float4*>(x + (size_t)s * K + b * 32);
                    float dot[ROWS];
#pragma unroll
                    for (int j = 0; j < ROWS; j++) dot[j] = 0.f;
#pragma unroll
                    for (int i = 0; i < 8; i++) {
                        const float4 xx = xv[i];
#pragma unroll
                        for (int j = 0; j < ROWS; j++)
                            dot[j] += wv[j][4 * i] * xx.x + wv[j][4 * i + 1] * xx.y + wv[j][4 * i + 2] * xx.z + wv[j][4 * i + 3] * xx.w;
                        if (NORM) ss[s] += xx.x * xx.x + xx.y * xx.y + xx.z * xx.z + xx.w * xx.w;
                    }
#pragma unroll
                    for (int j = 0; j < ROWS; j++) acc[j][s] += dd[j] * dot[j];
                }
            }
        }
    } else {  // f16 weights, 8 elements (16 bytes) per lane and step
        const size_t rb = (size_t)K * 2;
        for (int k0 = lane * 8; k0 < K; k0 += 256) {
            float wv[ROWS][8];
#pragma unroll
            for (int j = 0; j < ROWS; j++) {
                const uint4 raw = *reinterpret_cast<const uint4*>(W + (size_t)(n + j * N) * rb + (size_t)k0 * 2);
                const __half* hv = reinterpret_cast<const __half*>(&raw);
#pragma unroll
                for (int i = 0; i < 8; i++) wv[j][i] = __half2float(hv[i]);
            }
#pragma unroll
            for (int s = 0; s < MAXSEQ; s++) {
                if (s < nseq) {
                    const float4* xv = reinterpret_cast<const float4*>(x + (size_t)s * K + k0);
                    const float4 a = xv[0], bq = xv[1];
                    const float xs[8] = {a.x, a.y, a.z, a.w, bq.x, bq.y, bq.z, bq.w};
#pragma unroll
                    for (int i = 0; i < 8; i++) {
#pragma unroll
                        for (int j = 0; j < ROWS; j++) acc[j][s] += wv[j][i] * xs[i];
                        if (NORM) ss[s] += xs[i] * xs[i];
                    }
                }
            }
        }
    }
#pragma unroll
    for (int s = 0; s < MAXSEQ; s++) {
        if (s < nseq) {
            float v[ROWS];
#pragma unroll
            for (int j = 0; j < ROWS; j++) v[j] = warp_sum(acc[j][s]);
            float scale = 1.f;
            if (NORM) scale = rsqrtf(warp_sum(ss[s]) / (float)K + 1e-6f);
            if (lane == 0) {
                if constexpr (MODE == 0) y[(size_t)s * N + n] = v[0] * scale;
                else if constexpr (MODE == 1) y[(size_t)s * N + n] = r[(size_t)s * N + n] + v[0] * scale;
                else {
                    const float gt = v[0] * scale, up = v[ROWS - 1] * scale;
                    y[(size_t)s * N + n] = gt / (1.f + expf(-gt)) * up;
                }
            }
        }
    }
}

extern "C" __global__ void mv_norm(const unsigned char* W, const float* x, float* y, int K, int N, int nseq) {
    matvec<0, true>(W, x, y, nullptr, K, N, nseq);
}
extern "C" __global__ void mv_resid(const unsigned char* W, const float* x, float* y, int K, int N, int nseq) {
    matvec<1, false>(W, x, y, y, K, N, nseq);
}
extern "C" __global__ void mv_glu_norm(const unsigned char* W, const float* x, float* y, int K, int N, int nseq) {
    matvec<2, true>(W, x, y, nullptr, K, N, nseq);
}

// ------------------------------------------------------------------ small ops

// x[s] = row tok[s] of the embedding table (WTYPE rows of `hidden` elements).
extern "C" __global__ void embed(const unsigned char* E, const int* tok, float* x, int hidden) {
    const int s = blockIdx.x;
    const size_t rb = WTYPE == TYPE_Q8_0 ? (size_t)hidden / 32 * 34 : (size_t)hidden * 2;
    const unsigned char* row = E + (size_t)tok[s] * rb;
    for (int i = threadIdx.x; i < hidden; i += blockDim.x) {
        float v;
        if constexpr (WTYPE == TYPE_Q8_0) load_run<TYPE_Q8_0, 1>(row, i, &v);
        else load_run<TYPE_F16, 1>(row, i, &v);
        x[(size_t)s * hidden + i] = v;
    }
}

// Encode 32 floats into one block of type T at dst (codecs.encode_rows, element for element).
template <int T>
__device__ __forceinline__ void encode_block(const float* v, unsigned char* dst) {
    if constexpr (T == TYPE_F32) {
        for (int i = 0; i < 32; i++) reinterpret_cast<float*>(dst)[i] = v[i];
    } else if constexpr (T == TYPE_F16) {
        for (int i = 0; i < 32; i++) reinterpret_cast<__half*>(dst)[i] = __float2half_rn(v[i]);
    } else if constexpr (T == TYPE_BF16) {
        for (int i = 0; i < 32; i++) reinterpret_cast<unsigned short*>(dst)[i] = (unsigned short)(__float_as_uint(v[i]) >> 16);
    } else if constexpr (T == TYPE_Q8_0) {
        float amax = 0.f;
        for (int i = 0; i < 32; i++) amax = fmaxf(amax, fabsf(v[i]));
        const float d = amax / 127.f;
        const float id = d > 0.f ? 1.f / d : 0.f;
        *reinterpret_cast<__half*>(dst) = __float2half_rn(d);
        for (int i = 0; i < 32; i++) reinterpret_cast<signed char*>(dst + 2)[i] = (signed char)rintf(v[i] * id);
    } else {
        float amax = 0.f, mx = 0.f;
        for (int i = 0; i < 32; i++) {
            if (fabsf(v[i]) > amax) { amax = fabsf(v[i]); mx = v[i]; }
        }
        const float d = mx / -8.f;
        const float id = d != 0.f ? 1.f / d : 0.f;
        *reinterpret_cast<__half*>(dst) = __float2half_rn(d);
        for (int i = 0; i < 16; i++) {
            const int a = min(15, (int)floorf(v[i] * id + 8.5f));
            const int b = min(15, (int)floorf(v[i + 16] * id + 8.5f));
            dst[2 + i] = (unsigned char)(a | (b << 4));
        }
    }
}

// kv (nseq x (KE + VE) floats) -> io: the K rows of every sequence from byte 0, then their V rows; with a resident
// cache (kres != 0: the next layer's K and V blocks) also into the row each sequence attends last (plan.new_cell).
extern "C" __global__ void encode_kv(const float* kv, unsigned char* io, int nseq, unsigned char* kres, unsigned char* vres,
                                     const int* params, int cps) {
    constexpr int KE = NKV * DK, VE = NKV * DV, KB = KE / 32, VB = VE / 32;
    const int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= nseq * (KB + VB)) return;
    const int s = t / (KB + VB), b = t % (KB + VB);
    float v[32];
    const float* src = kv + (size_t)s * (KE + VE) + (size_t)b * 32;
    for (int i = 0; i < 32; i++) v[i] = src[i];
    if (b < KB) encode_block<KTYPE>(v, io + (size_t)s * KROW + (size_t)b * block_bytes<KTYPE>());
    else encode_block<VTYPE>(v, io + (size_t)nseq * KROW + (size_t)s * VROW + (size_t)(b - KB) * block_bytes<VTYPE>());
    if (kres != nullptr) {
        const int* p = params + s * PARAM_INTS;
        const int cell = p[3] > 0 ? p[2] + (p[3] - 1) * p[4] : p[0] + p[1] - 1;
        const size_t row = (size_t)p[5] * cps + cell;
        if (b < KB) encode_block<KTYPE>(v, kres + row * KROW + (size_t)b * block_bytes<KTYPE>());
        else encode_block<VTYPE>(v, vres + row * VROW + (size_t)(b - KB) * block_bytes<VTYPE>());
    }
}

// Greedy token of each sequence (the first index of the largest logit, as numpy.argmax), and the
// step's logits appended to the history while it has room. Block s, 1024 threads.
extern "C" __global__ void argmax_record(const float* logits, int* tok, float* hist, const int* step, int vocab, int cap,
                                         int nseq) {
    const int s = blockIdx.x;
    const float* lg = logits + (size_t)s * vocab;
    __shared__ float bv[1024];
    __shared__ int bi[1024];
    float best = -KV_INF;
    int idx = 0x7fffffff;
    const int st = *step;
    for (int i = threadIdx.x; i < vocab; i += blockDim.x) {
        const float v = lg[i];
        if (v > best) { best = v; idx = i; }
        if (st < cap) hist[((size_t)st * nseq + s) * vocab + i] = v;
    }
    bv[threadIdx.x] = best;
    bi[threadIdx.x] = idx;
    __syncthreads();
    for (int w = blockDim.x / 2; w > 0; w >>= 1) {
        if (threadIdx.x < w) {
            const float ov = bv[threadIdx.x + w];
            const int oi = bi[threadIdx.x + w];
            if (ov > bv[threadIdx.x] || (ov == bv[threadIdx.x] && oi < bi[threadIdx.x])) {
                bv[threadIdx.x] = ov;
                bi[threadIdx.x] = oi;
            }
        }
        __syncthreads();
    }
    if (threadIdx.x == 0) tok[s] = bi[0] == 0x7fffffff ? 0 : bi[0];
}

extern "C" __global__ void bump(int* step) { *step += 1; }
