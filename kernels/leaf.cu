// Leaf kernel (spec §5, §10.6): one warp per leaf, LEAF_WARPS leaves per block, batched over
// all leaves of a chunk (one launch).
//
// The leaf's keys (plus S19) sit in shared memory; loops over them have run-time bounds so no
// issue slot is spent on predicated-off keys.
//
// Plain search: lane t tests candidate base + t; after each round the warp votes, and the first
// round with a success gives the answer from its lowest successful lane. Every smaller
// candidate was tested in this or an earlier round, so the result is the sequential one
// (spec §5.4).
//
// Rotation (full leaves, spec §5.3): lane t hashes the even keys of base (round + t)·ℓ. Bases
// whose even keys are injective are appended, in base order, to a per-warp queue; whenever it
// holds 32 entries, the lanes test one entry each (odd keys, then the smallest rotation r).
// This keeps the odd-key work dense instead of idling 31 lanes behind one survivor. The lowest
// successful entry is the smallest base with a valid rotation: every smaller base either failed
// its even keys or was an earlier (failed) queue entry. D = base + r is the CPU's answer.
// ROT_QUEUE = 0 selects the direct variant (odd keys hashed in every round where some lane
// survived its even keys), which can be faster at small ℓ.
//
// Midstop (spec §5.2, speed only): the first p keys must be injective before the rest are
// hashed; α = 3 on the GPU for ℓ ≥ 14, else 2, from m ≥ 9 on. With rotation the even keys play
// the role of the head (their masks must be injective before the odd keys are hashed).
#include "common.cuh"

#ifndef LEAF
#error "LEAF must be defined"
#endif
#ifndef ROTATION
#define ROTATION 0
#endif
#ifndef ROT_QUEUE
#define ROT_QUEUE 1
#endif
#define LEAF_WARPS 8
#define ALL_LANES 0xffffffffu

__device__ __forceinline__ u32 rotl_m(u32 v, u32 r, u32 full) {
    return r == 0 ? v : (((v << r) | (v >> (LEAF - r))) & full);
}

extern "C" __global__ void __launch_bounds__(32 * LEAF_WARPS)
    leaf_search(const u64* __restrict__ keys, const Node* __restrict__ nodes, u32 count, u64* __restrict__ out,
                u64 watchdog, u32* status) {
    __shared__ u64 sk[LEAF_WARPS][LEAF];
#if ROTATION && ROT_QUEUE
    __shared__ u64 qd[LEAF_WARPS][64];
    __shared__ u32 qma[LEAF_WARPS][64];
#endif
    const u32 warp = threadIdx.x >> 5;
    const u32 lane = threadIdx.x & 31;
    const u32 leaf = blockIdx.x * LEAF_WARPS + warp;
    if (leaf >= count) return;  // whole warps leave together; no block-wide barrier below
    const Node nd = nodes[leaf];
    const u32 m = nd.m;
    const u32 full = (1u << m) - 1;
    u64* s = sk[warp];
#if ROTATION
    const u32 below = (1u << lane) - 1;
#endif

    // Lane j < m loads key j. With rotation on a full leaf the even keys go first (positions
    // [0, ne)), the odd keys after them. Shared keys hold y + S19.
    const u64 y = lane < m ? keys[nd.off + lane] : 0;
    u32 p;
    bool rotated = false;
#if ROTATION
    if (m == LEAF) {
        rotated = true;
        const u32 odd = __ballot_sync(ALL_LANES, lane < m && (y & 1));
        const u32 even = __ballot_sync(ALL_LANES, lane < m && !(y & 1));
        const u32 ne = __popc(even);
        if (lane < m) {
            const u32 pos = (y & 1) ? ne + __popc(odd & below) : __popc(even & below);
            s[pos] = y + LEAF_SEED;
        }
        p = ne;
    } else
#endif
    {
        if (lane < m) s[lane] = y + LEAF_SEED;
        const float alpha = LEAF >= 14 ? 3.0f : 2.0f;
        p = m >= 9 ? min(m, (u32)ceilf(alpha * sqrtf((float)m))) : m;
    }
    __syncwarp();

    if (!rotated) {
        for (u64 base = 0;; base += 32) {
            const u64 d = base + lane;
            u32 mask = 0;
#pragma unroll 4
            for (u32 i = 0; i < p; i++) mask |= 1u << range_h32(s[i] + d, m);
            bool ok = false;
            if (__popc(mask) == p) {
                for (u32 i = p; i < m; i++) mask |= 1u << range_h32(s[i] + d, m);
                ok = mask == full;
            }
            const u32 votes = __ballot_sync(ALL_LANES, ok);
            if (votes) {
                if (lane == 0) out[nd.slot] = base + (u64)(__ffs(votes) - 1);
                return;
            }
            if (base > watchdog) {
                if (lane == 0) atomicOr(status, STATUS_WATCHDOG);
                return;
            }
        }
    }
#if ROTATION && ROT_QUEUE
    const u32 ne = p;
    const u32 no = LEAF - ne;
    u32 qn = 0;  // queue length, the same in every lane
    for (u64 round = 0;; round += 32) {
        const u64 d = (round + lane) * LEAF;
        u32 ma = 0;
#pragma unroll 4
        for (u32 i = 0; i < ne; i++) ma |= 1u << range_h32(s[i] + d, LEAF);
        const bool pass = __popc(ma) == ne;
        const u32 votes = __ballot_sync(ALL_LANES, pass);
        if (pass) {
            const u32 pos = qn + __popc(votes & below);
            qd[warp][pos] = d;
            qma[warp][pos] = ma;
        }
        qn += __popc(votes);
        if (qn >= 32) {
            __syncwarp();
            const u64 dq = qd[warp][lane];
            const u32 maq = qma[warp][lane];
            u32 mb = 0;
#pragma unroll 4
            for (u32 i = ne; i < LEAF; i++) mb |= 1u << range_h32(s[i] + dq, LEAF);
            u64 found = NO_RESULT;
            if (__popc(mb) == no) {
                const u32 need = full & ~maq;
                for (u32 r = 0; r < LEAF; r++) {
                    if (rotl_m(mb, r, full) == need) {
                        found = dq + r;
                        break;
                    }
                }
            }
            const u32 wins = __ballot_sync(ALL_LANES, found != NO_RESULT);
            if (wins) {
                const u64 best = __shfl_sync(ALL_LANES, found, __ffs(wins) - 1);
                if (lane == 0) out[nd.slot] = best;
                return;
            }
            const u32 rest = qn - 32;
            u64 td = 0;
            u32 tm = 0;
            if (lane < rest) {
                td = qd[warp][32 + lane];
                tm = qma[warp][32 + lane];
            }
            __syncwarp();
            if (lane < rest) {
                qd[warp][lane] = td;
                qma[warp][lane] = tm;
            }
            __syncwarp();
            qn = rest;
        }
        if (round * LEAF > watchdog) {
            if (lane == 0) atomicOr(status, STATUS_WATCHDOG);
            return;
        }
    }
#elif ROTATION
    // Direct variant (ROT_QUEUE = 0): keys in registers, odd keys hashed whenever some lane's
    // even keys are injective.
    const u32 ne = p;
    const u32 no = LEAF - ne;
    u64 x[LEAF];
#pragma unroll
    for (int i = 0; i < LEAF; i++) x[i] = s[i];
    for (u64 round = 0;; round += 32) {
        const u64 d = (round + lane) * LEAF;
        u32 ma = 0;
#pragma unroll
        for (int i = 0; i < LEAF; i++)
            if (i < ne) ma |= 1u << range_h32(x[i] + d, LEAF);
        u64 found = NO_RESULT;
        if (__popc(ma) == ne) {
            u32 mb = 0;
#pragma unroll
            for (int i = 0; i < LEAF; i++)
                if (i >= ne) mb |= 1u << range_h32(x[i] + d, LEAF);
            if (__popc(mb) == no) {
                const u32 need = full & ~ma;
                for (u32 r = 0; r < LEAF; r++) {
                    if (rotl_m(mb, r, full) == need) {
                        found = d + r;
                        break;
                    }
                }
            }
        }
        const u32 votes = __ballot_sync(ALL_LANES, found != NO_RESULT);
        if (votes) {
            const u64 best = __shfl_sync(ALL_LANES, found, __ffs(votes) - 1);
            if (lane == 0) out[nd.slot] = best;
            return;
        }
        if (round * LEAF > watchdog) {
            if (lane == 0) atomicOr(status, STATUS_WATCHDOG);
            return;
        }
    }
#endif
}
