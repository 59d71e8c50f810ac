// Batch MPHF lookup with membership verification: the query of spec §9 on the GPU.
//
// How it differs from the CPU (src/core/query.rs, src/core/elias_fano.rs, src/core/rice.rs):
// - The same arithmetic, step by step: integer keys are hashed on the device with the bijective
//   mixer of spec §2.5 (mix64, per-seed constants s_lo/s_hi computed on the host); byte keys are
//   hashed on the host (seeded xxh3-128, src/core/hash.rs) and arrive as (hi, lo) pairs.
// - Unaligned little-endian loads become two aligned word loads and a funnel shift.
// - `select` in a word is a popcount bisection (no PDEP on the GPU).
// - No software prefetching: thousands of independent lookups per SM hide the latency.
// - Every scan is bounded by its array's length, so a corrupt index yields garbage slots that the
//   membership check turns into ABSENT, never an out-of-bounds read.
// The answer for every row is identical to ColumnIndex::lookup_slots: the slot s when the key is
// a member (keys[s] == key), else ABSENT (NULL rows, non-members).
//
// Work mapping:
// - lookup_int_*, lookup_bytes_*: one thread per row, 256 threads per block.
// - lookup_int_runs_*: Eirene-style combining for clustered input. A block takes a tile of
//   RUN_TILE rows, marks the first row of every run of equal keys (a "head"), compacts the heads
//   with a block-wide prefix sum, looks each head up once (threads take consecutive heads, so
//   warps stay full), and scatters the head's slot to its run. Runs that cross a tile boundary
//   are simply looked up once per tile.
//
// Compile-time parameters (NVRTC -D options from src/gpu/kernels.rs, Rust is their only source):
//   LEAF, ROTATION, LEAF_SEED (from common.cuh's users), LOWER_AGGR, UPPER_AGGR (A1, A2 of spec
//   §3.1), SEED_AGG2, SEED_AGG1, START_SEEDS_INIT (the 20 start seeds of spec §4.3),
//   INT_HI_SALT (src/core/hash.rs).
#include "common.cuh"

typedef unsigned short u16;
typedef unsigned char u8;

__constant__ u64 START_SEEDS[20] = {START_SEEDS_INIT};

#define ABSENT64 0xffffffffffffffffULL
#define ABSENT32 0xffffffffu

// Scalar fields of the index; layout matches `QueryParams` in src/gpu/query.rs.
struct QueryParams {
    u64 num_buckets;   // B
    u64 delta_lambda;  // δ_λ
    u64 delta_psi;     // δ_ψ (wrapped)
    u64 beta;          // β, 20-bit fixed point
    u64 len;           // number of stored keys (= n)
    u64 s_lo;          // integer hashing: lo = mix64(key ^ s_lo)
    u64 s_hi;          // integer hashing: hi = mix64(mix64(key ^ s_hi) ^ INT_HI_SALT)
    u64 lower_words;   // lengths of the arrays (bounds of every scan)
    u64 upper_lambda_words;
    u64 upper_psi_words;
    u64 rice_words;
    u32 l_lambda;
    u32 l_psi;
    u32 log2_jump;
    u32 key_kind;      // integer probes: bytes per key (1, 2, 4, 8) | 16 when signed
};

// Device arrays of the index.
struct Arrays {
    const u64* __restrict__ rice;
    const u64* __restrict__ lower;
    const u64* __restrict__ upper_lambda;
    const u64* __restrict__ upper_psi;
    const u64* __restrict__ jump;
    const u32* __restrict__ memo;  // tau | nodes << 5 | skip << 17, per subtree size m < 3000
};

__device__ __forceinline__ u64 low_mask(u32 w) { return w >= 64 ? ~0ULL : ((1ULL << w) - 1); }

// `width` ≤ 64 bits starting at bit `pos` (LSB first); reads the next word only when the field
// crosses into it, so no read goes past the word holding the field's last bit.
__device__ __forceinline__ u64 read_bits(const u64* __restrict__ w, u64 pos, u32 width) {
    u64 i = pos >> 6;
    u32 off = (u32)(pos & 63);
    u64 v = __ldg(w + i) >> off;
    if (off + width > 64) v |= __ldg(w + i + 1) << (64 - off);
    return v & low_mask(width);
}

// Position of the k-th one (from 0) of a 64-bit word with more than k ones.
__device__ __forceinline__ u32 select64(u64 w, u32 k) {
    const u32 lo = (u32)w;
    const u32 c = __popc(lo);
    return k < c ? select32(lo, k) : 32 + select32((u32)(w >> 32), k - c);
}

// The k-th one at or after bit `start` (elias_fano.rs select_from): returns its position and
// leaves the word index and the (masked) word for next_one. Past the end: position 64·len.
__device__ __forceinline__ u64 select_from(const u64* __restrict__ words, u64 len, u64 start, u64 k,
                                           u64& idx_out, u64& word_out) {
    u64 idx = start >> 6;
    if (idx >= len) { idx_out = len; word_out = 0; return len * 64; }
    u64 word = __ldg(words + idx) & (~0ULL << (start & 63));
    while (true) {
        u64 c = __popcll(word);
        if (k < c) {
            idx_out = idx;
            word_out = word;
            return idx * 64 + select64(word, (u32)k);
        }
        k -= c;
        idx++;
        if (idx >= len) { idx_out = len; word_out = 0; return len * 64; }
        word = __ldg(words + idx);
    }
}

// The first one strictly after position `pos` inside word `idx` (elias_fano.rs next_one).
__device__ __forceinline__ u64 next_one(const u64* __restrict__ words, u64 len, u64 idx, u64 word, u64 pos) {
    if (idx >= len) return len * 64;
    u32 bit = (u32)(pos & 63);
    u64 rest = bit == 63 ? 0 : (word & (~0ULL << (bit + 1)));
    while (rest == 0) {
        idx++;
        if (idx >= len) return len * 64;
        rest = __ldg(words + idx);
    }
    return idx * 64 + (u64)(__ffsll((long long)rest) - 1);
}

// (λ_i, λ_{i+1}, σ_i) of bucket i < B (spec §8.4; elias_fano.rs get_unchecked).
__device__ __forceinline__ void ef_get(const QueryParams& p, const Arrays& a, u64 i, u64& lambda, u64& lambda_next,
                                       u64& sigma) {
    const u32 ll = p.l_lambda, lp = p.l_psi, width = ll + lp;
    // Step 1: low bits of φ_i, χ_i and φ_{i+1} (width + l_λ ≤ 56 bits).
    const u64 raw = read_bits(a.lower, i * width, width + ll);
    const u64 low_phi = raw & low_mask(ll);
    const u64 low_chi = (raw >> ll) & low_mask(lp);
    const u64 low_phi_next = (raw >> width) & low_mask(ll);
    // Step 2: the sampled ones of rank i & ~255 in both upper arrays.
    const u32 J = p.log2_jump;
    const u64 ew = 2 + (((1ULL << (J - 8)) + 1) >> 1);
    const u64 base = (i >> J) * ew;
    const u64 pair_idx = (i >> 8) & ((1ULL << (J - 8)) - 1);
    const u64 abs_l = __ldg(a.jump + base);
    const u64 abs_p = __ldg(a.jump + base + 1);
    const u64 pair = __ldg(a.jump + base + 2 + (pair_idx >> 1)) >> (32 * (pair_idx & 1));
    const u64 start_l = abs_l + (pair & 0xffff);
    const u64 start_p = abs_p + ((pair >> 16) & 0xffff);
    // Step 3: popcount scan and select.
    const u64 rank = i & 255;
    u64 idx_l, word_l, idx_p, word_p;
    const u64 pos_l = select_from(a.upper_lambda, p.upper_lambda_words, start_l, rank, idx_l, word_l);
    const u64 pos_p = select_from(a.upper_psi, p.upper_psi_words, start_p, rank, idx_p, word_p);
    // Steps 4-6, wrapping like the CPU.
    lambda = (((pos_l - i) << ll) | low_phi) + i * p.delta_lambda;
    const u64 pos_next = next_one(a.upper_lambda, p.upper_lambda_words, idx_l, word_l, pos_l);
    const u64 j = i + 1;
    lambda_next = (((pos_next - j) << ll) | low_phi_next) + j * p.delta_lambda;
    // ⌊β·λ / 2^20⌋ of the 128-bit product, truncated to 64 bits (elias_fano.rs predict).
    const u64 pred = ((p.beta * lambda) >> 20) | (__umul64hi(p.beta, lambda) << 44);
    sigma = (((pos_p - i) << lp) | low_chi) + i * p.delta_psi + pred;
}

__device__ __forceinline__ u32 memo_tau(u32 e) { return e & 31u; }
__device__ __forceinline__ u32 memo_nodes(u32 e) { return (e >> 5) & 0xfffu; }
__device__ __forceinline__ u32 memo_skip(u32 e) { return e >> 17; }

// Rice cursor (rice.rs RiceCursor): fixed-part and unary-part positions.
struct Cursor {
    u64 fixed;
    u64 unary;
};

__device__ __forceinline__ u64 rice_read(const QueryParams& p, const Arrays& a, Cursor& c, u32 tau) {
    const u64 low = read_bits(a.rice, c.fixed, tau);
    c.fixed += tau;
    const u64 start = c.unary;
    u64 idx = start >> 6;
    if (idx >= p.rice_words) return low;
    u64 w = __ldg(a.rice + idx) >> (start & 63);
    u64 q;
    if (w != 0) {
        q = (u64)(__ffsll((long long)w) - 1);
        c.unary = start + q + 1;
    } else {
        while (true) {
            idx++;
            if (idx >= p.rice_words) { c.unary = p.rice_words * 64; return low; }
            w = __ldg(a.rice + idx);
            if (w != 0) break;
        }
        const u64 pos = idx * 64 + (u64)(__ffsll((long long)w) - 1);
        c.unary = pos + 1;
        q = pos - start;
    }
    return (q << tau) | low;
}

// Advances the unary cursor past `ones` one-bits and the fixed cursor by `fixed_bits`.
__device__ __forceinline__ void rice_skip(const QueryParams& p, const Arrays& a, Cursor& c, u64 ones, u64 fixed_bits) {
    c.fixed += fixed_bits;
    if (ones == 0) return;
    u64 k = ones;
    u64 idx = c.unary >> 6;
    if (idx >= p.rice_words) return;
    u64 w = __ldg(a.rice + idx) & (~0ULL << (c.unary & 63));
    while (true) {
        const u64 cnt = __popcll(w);
        if (k <= cnt) {
            c.unary = idx * 64 + select64(w, (u32)(k - 1)) + 1;
            return;
        }
        k -= cnt;
        idx++;
        if (idx >= p.rice_words) { c.unary = p.rice_words * 64; return; }
        w = __ldg(a.rice + idx);
    }
}

__device__ __forceinline__ u32 split_left(u32 m) {
    return UPPER_AGGR * (((m / 2) + UPPER_AGGR - 1) / UPPER_AGGR);
}

// The tree walk of spec §9 (query.rs walk_tree) for a bucket of m keys at Rice offset pos.
__device__ u64 walk(const QueryParams& p, const Arrays& a, u64 lo, u64 cum, u32 m, u64 pos) {
    if (m <= 1) return cum;
    if (m >= 3000) return ABSENT64;  // corrupt index: no such bucket size
    Cursor c;
    c.fixed = pos;
    c.unary = pos + memo_skip(__ldg(a.memo + m));
    u32 depth = 0;
    while (m > UPPER_AGGR) {
        const u64 d = rice_read(p, a, c, memo_tau(__ldg(a.memo + m)));
        const u32 left = split_left(m);
        const u64 seed = START_SEEDS[depth < 20 ? depth : 19];
        if (range_h32(lo + seed + d, m) < left) {
            m = left;
        } else {
            const u32 e = __ldg(a.memo + left);
            rice_skip(p, a, c, memo_nodes(e), memo_skip(e));
            cum += left;
            m -= left;
        }
        depth++;
    }
    if (m > LOWER_AGGR) {
        const u64 d = rice_read(p, a, c, memo_tau(__ldg(a.memo + m)));
        const u32 j = range_h32(lo + SEED_AGG2 + d, m) / LOWER_AGGR;
        if (j > 0) {
            const u32 e = __ldg(a.memo + LOWER_AGGR);
            rice_skip(p, a, c, (u64)j * memo_nodes(e), (u64)j * memo_skip(e));
            cum += (u64)j * LOWER_AGGR;
        }
        m = min((u32)LOWER_AGGR, m - j * LOWER_AGGR);
    }
    if (m > LEAF) {
        const u64 d = rice_read(p, a, c, memo_tau(__ldg(a.memo + m)));
        const u32 j = range_h32(lo + SEED_AGG1 + d, m) / LEAF;
        if (j > 0) {
            rice_skip(p, a, c, (u64)j, (u64)j * memo_skip(__ldg(a.memo + LEAF)));
            cum += (u64)j * LEAF;
        }
        m = min((u32)LEAF, m - j * LEAF);
    }
    if (m <= 1) return cum;
    const u64 d = rice_read(p, a, c, memo_tau(__ldg(a.memo + m)));
#if ROTATION
    if (m == LEAF) {
        const u64 r = d % LEAF;
        u64 v = range_h32(lo + LEAF_SEED + d - r, LEAF);
        if (lo & 1) v = (v + r) % LEAF;
        return cum + v;
    }
#endif
    return cum + range_h32(lo + LEAF_SEED + d, m);
}

// The MPHF value of a key with hash (hi, lo) (query.rs index_hash); n > 0.
__device__ __forceinline__ u64 mphf_index(const QueryParams& p, const Arrays& a, u64 hi, u64 lo) {
    const u64 bucket = __umul64hi(hi, p.num_buckets);
    u64 cum, next, pos;
    ef_get(p, a, bucket, cum, next, pos);
    const u64 m = next - cum;
    if (m >= 3000) return ABSENT64;
    return walk(p, a, lo, cum, (u32)m, pos);
}

// Integer probe row i widened to its u64 hashing pattern (keys.rs IntKey::widen).
__device__ __forceinline__ u64 load_key(const u8* __restrict__ keys, u32 kind, u64 i) {
    switch (kind) {
        case 1: return (u64)keys[i];
        case 2: return (u64)((const u16*)keys)[i];
        case 4: return (u64)((const u32*)keys)[i];
        case 8: return ((const u64*)keys)[i];
        case 17: return (u64)(long long)((const signed char*)keys)[i];
        case 18: return (u64)(long long)((const short*)keys)[i];
        case 20: return (u64)(long long)((const int*)keys)[i];
        default: return ((const u64*)keys)[i];
    }
}

__device__ __forceinline__ bool is_valid(const u8* __restrict__ valid, u64 valid_off, u64 i) {
    if (valid == nullptr) return true;
    const u64 b = i + valid_off;
    return (valid[b >> 3] >> (b & 7)) & 1;
}

// Verified slot of an integer key: the MPHF value s if stored[s] == key, else ABSENT64.
__device__ __forceinline__ u64 lookup_int_key(const QueryParams& p, const Arrays& a, const u64* __restrict__ stored,
                                              u64 key) {
    const u64 hi = mix64(mix64(key ^ p.s_hi) ^ INT_HI_SALT);
    const u64 lo = mix64(key ^ p.s_lo);
    const u64 s = mphf_index(p, a, hi, lo);
    return (s < p.len && __ldg(stored + s) == key) ? s : ABSENT64;
}

template <typename S>
__device__ __forceinline__ S to_slot(u64 s) {
    return s == ABSENT64 ? (S)~(S)0 : (S)s;
}

template <typename S>
__device__ __forceinline__ void lookup_int_impl(QueryParams p, Arrays a, const u64* __restrict__ stored,
                                                const u8* __restrict__ keys, const u8* __restrict__ valid,
                                                u64 valid_off, u64 rows, S* __restrict__ out) {
    const u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= rows) return;
    u64 s = ABSENT64;
    if (p.len > 0 && is_valid(valid, valid_off, i)) s = lookup_int_key(p, a, stored, load_key(keys, p.key_kind, i));
    out[i] = to_slot<S>(s);
}

#define RUN_THREADS 256
#define RUN_ITEMS 4
#define RUN_TILE (RUN_THREADS * RUN_ITEMS)

template <typename S>
__device__ __forceinline__ void lookup_int_runs_impl(QueryParams p, Arrays a, const u64* __restrict__ stored,
                                                     const u8* __restrict__ keys, const u8* __restrict__ valid,
                                                     u64 valid_off, u64 rows, S* __restrict__ out) {
    __shared__ u64 skey[RUN_TILE];
    __shared__ u64 hslot[RUN_TILE];
    __shared__ u16 head_of[RUN_TILE];
    __shared__ u16 heads[RUN_TILE];
    __shared__ u8 sval[RUN_TILE];  // 1 valid, 0 NULL, 2 past the end
    __shared__ u32 warp_total[RUN_THREADS / 32];
    const u32 t = threadIdx.x, lane = t & 31, warp = t >> 5;
    for (u64 base = (u64)blockIdx.x * RUN_TILE; base < rows; base += (u64)gridDim.x * RUN_TILE) {
        for (u32 k = 0; k < RUN_ITEMS; k++) {
            const u32 e = t + k * RUN_THREADS;
            const u64 i = base + e;
            if (i < rows) {
                const bool v = is_valid(valid, valid_off, i);
                sval[e] = v ? 1 : 0;
                skey[e] = v ? load_key(keys, p.key_kind, i) : 0;
            } else {
                sval[e] = 2;
            }
        }
        __syncthreads();
        // Heads among this thread's RUN_ITEMS consecutive elements.
        u32 flags = 0, cnt = 0;
        for (u32 k = 0; k < RUN_ITEMS; k++) {
            const u32 e = t * RUN_ITEMS + k;
            const u8 v = sval[e];
            if (v == 2) continue;
            const bool head = e == 0 || v != 1 || sval[e - 1] != 1 || skey[e] != skey[e - 1];
            if (head) { flags |= 1u << k; cnt++; }
        }
        // Block-wide exclusive prefix sum of cnt.
        u32 incl = cnt;
        for (u32 o = 1; o < 32; o <<= 1) {
            const u32 y = __shfl_up_sync(0xffffffffu, incl, o);
            if (lane >= o) incl += y;
        }
        if (lane == 31) warp_total[warp] = incl;
        __syncthreads();
        u32 before = 0, total = 0;
        for (u32 w = 0; w < RUN_THREADS / 32; w++) {
            const u32 x = warp_total[w];
            if (w < warp) before += x;
            total += x;
        }
        u32 j = before + incl - cnt;
        for (u32 k = 0; k < RUN_ITEMS; k++) {
            const u32 e = t * RUN_ITEMS + k;
            if (flags & (1u << k)) {
                heads[j] = (u16)e;
                head_of[e] = (u16)j;
                j++;
            } else {
                head_of[e] = (u16)(j - 1);  // j ≥ 1: element 0 of the tile is always a head
            }
        }
        __syncthreads();
        // One lookup per head; consecutive threads take consecutive heads.
        for (u32 h = t; h < total; h += RUN_THREADS) {
            const u32 e = heads[h];
            u64 s = ABSENT64;
            if (p.len > 0 && sval[e] == 1) s = lookup_int_key(p, a, stored, skey[e]);
            hslot[h] = s;
        }
        __syncthreads();
        for (u32 k = 0; k < RUN_ITEMS; k++) {
            const u32 e = t + k * RUN_THREADS;
            const u64 i = base + e;
            if (i < rows) out[i] = to_slot<S>(hslot[head_of[e]]);
        }
        __syncthreads();
    }
}

// Byte keys: hashes computed on the host (pairs hi, lo per row), keys compared byte by byte
// against the stored key of the slot. Offsets are u64 (Arrow offsets widened on the host).
template <typename S>
__device__ __forceinline__ void lookup_bytes_impl(QueryParams p, Arrays a, const u64* __restrict__ key_offsets,
                                                  const u8* __restrict__ key_data, const u64* __restrict__ hashes,
                                                  const u64* __restrict__ probe_offsets,
                                                  const u8* __restrict__ probe_data, const u8* __restrict__ valid,
                                                  u64 valid_off, u64 rows, S* __restrict__ out) {
    const u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= rows) return;
    u64 s = ABSENT64;
    if (p.len > 0 && is_valid(valid, valid_off, i)) {
        s = mphf_index(p, a, hashes[2 * i], hashes[2 * i + 1]);
        if (s < p.len) {
            const u64 kb = key_offsets[s], ke = key_offsets[s + 1];
            const u64 pb = probe_offsets[i], pe = probe_offsets[i + 1];
            if (ke - kb != pe - pb) {
                s = ABSENT64;
            } else {
                for (u64 k = 0; k < ke - kb; k++) {
                    if (key_data[kb + k] != probe_data[pb + k]) { s = ABSENT64; break; }
                }
            }
        } else {
            s = ABSENT64;
        }
    }
    out[i] = to_slot<S>(s);
}

#define LOOKUP_ARGS                                                                                         \
    QueryParams p, const u64 *rice, const u64 *lower, const u64 *upper_lambda, const u64 *upper_psi,      \
        const u64 *jump, const u32 *memo
#define MAKE_ARRAYS                                                                                         \
    Arrays a;                                                                                               \
    a.rice = rice;                                                                                          \
    a.lower = lower;                                                                                        \
    a.upper_lambda = upper_lambda;                                                                          \
    a.upper_psi = upper_psi;                                                                                \
    a.jump = jump;                                                                                          \
    a.memo = memo;

extern "C" __global__ void lookup_int_u32(LOOKUP_ARGS, const u64* stored, const u8* keys, const u8* valid,
                                          u64 valid_off, u64 rows, u32* out) {
    MAKE_ARRAYS
    lookup_int_impl<u32>(p, a, stored, keys, valid, valid_off, rows, out);
}
extern "C" __global__ void lookup_int_u64(LOOKUP_ARGS, const u64* stored, const u8* keys, const u8* valid,
                                          u64 valid_off, u64 rows, u64* out) {
    MAKE_ARRAYS
    lookup_int_impl<u64>(p, a, stored, keys, valid, valid_off, rows, out);
}
extern "C" __global__ void __launch_bounds__(RUN_THREADS)
    lookup_int_runs_u32(LOOKUP_ARGS, const u64* stored, const u8* keys, const u8* valid, u64 valid_off, u64 rows,
                        u32* out) {
    MAKE_ARRAYS
    lookup_int_runs_impl<u32>(p, a, stored, keys, valid, valid_off, rows, out);
}
extern "C" __global__ void __launch_bounds__(RUN_THREADS)
    lookup_int_runs_u64(LOOKUP_ARGS, const u64* stored, const u8* keys, const u8* valid, u64 valid_off, u64 rows,
                        u64* out) {
    MAKE_ARRAYS
    lookup_int_runs_impl<u64>(p, a, stored, keys, valid, valid_off, rows, out);
}
extern "C" __global__ void lookup_bytes_u32(LOOKUP_ARGS, const u64* key_offsets, const u8* key_data,
                                            const u64* hashes, const u64* probe_offsets, const u8* probe_data,
                                            const u8* valid, u64 valid_off, u64 rows, u32* out) {
    MAKE_ARRAYS
    lookup_bytes_impl<u32>(p, a, key_offsets, key_data, hashes, probe_offsets, probe_data, valid, valid_off, rows,
                           out);
}
extern "C" __global__ void lookup_bytes_u64(LOOKUP_ARGS, const u64* key_offsets, const u8* key_data,
                                            const u64* hashes, const u64* probe_offsets, const u8* probe_data,
                                            const u8* valid, u64 valid_off, u64 rows, u64* out) {
    MAKE_ARRAYS
    lookup_bytes_impl<u64>(p, a, key_offsets, key_data, hashes, probe_offsets, probe_data, valid, valid_off, rows,
                           out);
}
