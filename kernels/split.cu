// Split kernels (spec §6, §10.6): one thread block per node of a tree level, batched over all
// buckets of a chunk (one launch per level).
//
// Each block copies its node's keys to shared memory, tests candidates d = base + t
// (t = threadIdx.x; Agg also base + T + t) in rounds of T = blockDim.x (Agg: 2T), and stops
// after the first round in which some thread succeeded; the atomicMin over that round's
// successes is the smallest valid d, i.e. the sequential answer (spec §5.4): every smaller
// candidate was tested in this or an earlier round. Then the keys are redistributed to the
// children's ranges in global memory with shared atomic cursors (spec §6.2). Key order inside
// a child is irrelevant: every predicate depends only on the key set.
//
// Dynamic shared memory: m_max * 8 bytes (split_agg with AGG_TABLE: (2 m_max + 1) * 8).
#include "common.cuh"

// First d splitting m keys into chunks of `unit` (Agg1: unit = ℓ, seed S18; Agg2: unit = A1,
// seed S17). Child j = R_m / unit, computed as umulhi(R_m, magic) with magic = ceil(2^32/unit),
// exact for R_m < 2^16 (the error term R·e < 2^32). 8-bit packed counters (spec §6.3): byte j
// counts child j, child 8 (fanout 9) adds nothing, the word is compared with the target.
// AGG_TABLE = 1 looks the counter increment up in a shared table indexed by R_m (built once per
// node) instead of computing child, shift and select per key: those are integer-pipe
// instructions, the pipe that bounds this kernel, while the lookup runs on the load/store pipe.
// Where the first fanout - 1 counters fit in 32 bits at `bits` = bit length of `unit` each (the
// last child's count follows from m), the counters are one u32 and each key costs one 32-bit
// add instead of a 64-bit one. A counter may then wrap into its neighbour, but only after it
// passed `unit`, so a true split never wraps: u32 equality is necessary, and the exact 64-bit
// count confirms it (a rare per-lane recount).
#ifndef AGG_TABLE
#define AGG_TABLE 1
#endif
extern "C" __global__ void split_agg(u64* __restrict__ keys, const Node* __restrict__ nodes, u32 unit, u32 magic,
                                     u64 seed, u64* __restrict__ out, u64 watchdog, u32* status) {
    extern __shared__ u64 sh[];
    __shared__ u64 best;
    __shared__ u32 cursor[9];
    const Node nd = nodes[blockIdx.x];
    const u32 m = nd.m;
#if AGG_TABLE
    // inc[r] (at the start of shared memory, so its address is r · 8): the counter increment of
    // R_m = r. The keys follow it, 16-byte aligned for paired loads.
    const u32 fanout = (m + unit - 1) / unit;
    const u32 bits = 32 - __clz(unit);
    const bool narrow = (fanout - 1) * bits <= 32;  // the same in the whole block
    u64* inc = sh;
    u32* inc32 = (u32*)sh;
    u64* sk = sh + ((m + 1) & ~1u);
    u32 target32 = 0;
    if (narrow)
        for (u32 j = 0; j + 1 < fanout; j++) target32 |= unit << (bits * j);
    for (u32 r = threadIdx.x; r < m; r += blockDim.x) {
        const u32 ch = __umulhi(r, magic);
        if (narrow)
            inc32[r] = ch + 1 < fanout ? 1u << (bits * ch) : 0u;
        else
            inc[r] = ch < 8 ? (1ull << (8 * ch)) : 0ull;
    }
#else
    const u32 fanout = (m + unit - 1) / unit;
    u64* sk = sh;
#endif
    for (u32 i = threadIdx.x; i < m; i += blockDim.x) sk[i] = keys[nd.off + i];
    u64 target = 0;
    for (u32 j = 0; j < fanout && j < 8; j++) {
        u64 count = (j + 1 < fanout) ? unit : m - (fanout - 1) * unit;
        target |= count << (8 * j);
    }
    // The exact 8-bit packed count of candidate seed + d (sd).
    auto exact = [&](u64 sd) {
        u64 c = 0;
        for (u32 i = 0; i < m; i++) {
            const u32 ch = __umulhi(range_h32(sk[i] + sd, m), magic);
            c += ch < 8 ? (1ull << (8 * ch)) : 0ull;
        }
        return c;
    };
    if (threadIdx.x == 0) best = NO_RESULT;
    __syncthreads();
    // Two candidates per thread and round (d and d + T): one shared load feeds two hashes.
    for (u64 base = 0;; base += 2 * blockDim.x) {
        const u64 d0 = base + threadIdx.x;
        const u64 d1 = d0 + blockDim.x;
        const u64 sd0 = seed + d0;
        const u64 sd1 = seed + d1;
        bool ok0, ok1;
#if AGG_TABLE
        if (narrow) {
            u32 c0 = 0, c1 = 0;
#pragma unroll 4
            for (u32 i = 0; i < m; i++) {
                const u64 k = sk[i];
                c0 += inc32[range_h32(k + sd0, m)];
                c1 += inc32[range_h32(k + sd1, m)];
            }
            ok0 = c0 == target32 && exact(sd0) == target;
            ok1 = c1 == target32 && exact(sd1) == target;
        } else {
            u64 c0 = 0, c1 = 0;
#pragma unroll 4
            for (u32 i = 0; i < m; i++) {
                const u64 k = sk[i];
                c0 += inc[range_h32(k + sd0, m)];
                c1 += inc[range_h32(k + sd1, m)];
            }
            ok0 = c0 == target;
            ok1 = c1 == target;
        }
#else
        u64 c0 = 0, c1 = 0;
#pragma unroll 4
        for (u32 i = 0; i < m; i++) {
            const u64 k = sk[i];
            const u32 ch0 = __umulhi(range_h32(k + sd0, m), magic);
            const u32 ch1 = __umulhi(range_h32(k + sd1, m), magic);
            c0 += ch0 < 8 ? (1ull << (8 * ch0)) : 0ull;
            c1 += ch1 < 8 ? (1ull << (8 * ch1)) : 0ull;
        }
        ok0 = c0 == target;
        ok1 = c1 == target;
        (void)exact;
#endif
        if (ok0) atomicMin(&best, d0);
        else if (ok1) atomicMin(&best, d1);
        if (__syncthreads_or(ok0 || ok1)) break;
        if (base > watchdog) {
            if (threadIdx.x == 0) atomicOr(status, STATUS_WATCHDOG);
            return;
        }
    }
    const u64 d = best;
    if (threadIdx.x == 0) out[nd.slot] = d;
    if (threadIdx.x < 9) cursor[threadIdx.x] = threadIdx.x * unit;
    __syncthreads();
    const u64 sd = seed + d;
    for (u32 i = threadIdx.x; i < m; i += blockDim.x) {
        const u64 y = sk[i];
        u32 child = __umulhi(range_h32(y + sd, m), magic);
        u32 p = atomicAdd(&cursor[child], 1u);
        keys[nd.off + p] = y;
    }
}

// First d sending exactly `left` keys below `left` (high levels, spec §6.1), where
// left = A2 * ceil(floor(m/2) / A2) (RoundUp, spec §3.2); seed = START_SEEDS[depth].
extern "C" __global__ void split_high(u64* __restrict__ keys, const Node* __restrict__ nodes, u32 a2, u64 seed,
                                      u64* __restrict__ out, u64 watchdog, u32* status) {
    extern __shared__ u64 sk[];
    __shared__ u64 best;
    __shared__ u32 cursor[2];
    const Node nd = nodes[blockIdx.x];
    const u32 m = nd.m;
    const u32 left = a2 * ((m / 2 + a2 - 1) / a2);
    for (u32 i = threadIdx.x; i < m; i += blockDim.x) sk[i] = keys[nd.off + i];
    if (threadIdx.x == 0) best = NO_RESULT;
    __syncthreads();
    for (u64 base = 0;; base += blockDim.x) {
        const u64 d = base + threadIdx.x;
        const u64 sd = seed + d;
        u32 c = 0;
        for (u32 i = 0; i < m; i++) c += range_h32(sk[i] + sd, m) < left;
        const bool ok = c == left;
        if (ok) atomicMin(&best, d);
        if (__syncthreads_or(ok)) break;
        if (base > watchdog) {
            if (threadIdx.x == 0) atomicOr(status, STATUS_WATCHDOG);
            return;
        }
    }
    const u64 d = best;
    if (threadIdx.x == 0) {
        out[nd.slot] = d;
        cursor[0] = 0;
        cursor[1] = left;
    }
    __syncthreads();
    const u64 sd = seed + d;
    for (u32 i = threadIdx.x; i < m; i += blockDim.x) {
        const u64 y = sk[i];
        u32 child = range_h32(y + sd, m) >= left;
        u32 p = atomicAdd(&cursor[child], 1u);
        keys[nd.off + p] = y;
    }
}
