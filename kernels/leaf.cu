// Leaf kernels (spec §5, §10.6): the leaves of a chunk are searched in passes. A pass gives every
// pending leaf W cooperating warps (W = 1 in the first pass) and a budget of candidates; leaves
// whose search runs past it go to the next pass, which resumes where they stopped with more warps
// per leaf.
//
// Why passes: leaf work is geometric and uneven across leaves (a leaf of ℓ - 1 keys is not
// rotated and costs about 7 times a full leaf at ℓ = 18; examples/leaf_stats.rs measures the
// spread), so one warp per leaf in one launch is bounded by a handful of slow leaves, and which
// leaves are slow depends on the keys.
// Warps also fetch their work from a counter instead of owning a fixed leaf, so a block's warp
// slots do not idle until its slowest leaf ends.
//
// Candidates are numbered in rounds of 32 (lane t of round r tests candidate 32r + t; with
// rotation, base (32r + t)·ℓ). Warp w of a leaf's W warps takes rounds resume + kW + w,
// k = 0 .. budget - 1, so a pass covers rounds [resume, resume + W·budget) and the next pass
// resumes after them. A warp that finds a valid candidate publishes it with an atomic max of its
// complement in `found` (0 = none yet, so the largest complement is the smallest candidate) and
// stops; a warp also stops when the smallest candidate it has not yet tested is not below the
// best published one. Every candidate below the final answer was therefore tested and failed:
// the answer is the sequential one (spec §5.4), whatever the scheduling.
//
// The leaf's keys (plus S19) sit in shared memory; loops over them have run-time bounds so no
// issue slot is spent on predicated-off keys.
//
// Plain search: lane t tests candidate 32r + t; the warp votes; the lowest successful lane is
// the round's smallest candidate. Leaves with a long midstop head (m ≥ 12, p ≥ 10) are searched
// in two stages instead: every round hashes the first h1 = p/2 + 1 keys; candidates whose h1
// masks are injective (about a quarter) go to a per-warp queue, and whenever it holds 32 entries
// the lanes finish one entry each. Lanes stay busy, and a candidate costs about h1 + p/8
// hashes instead of p.
//
// Rotation (full leaves, spec §5.3): lane t hashes the even keys of base (32r + t)·ℓ. Bases
// whose even keys are injective are appended, in base order, to the warp's queue; whenever it
// holds 32 entries (and at the end of the pass budget), the lanes test one entry each (odd keys,
// then the smallest rotation r). This keeps the odd-key work dense instead of idling 31 lanes
// behind one survivor. D = base + r is the CPU's answer: bases are ℓ apart and r < ℓ, so the
// lowest successful entry holds the smallest D. (Splitting the even keys into two queued stages
// too was measured slower.) ROT_QUEUE = 0 selects the direct variant (odd keys hashed in every
// round where some lane survived its even keys), faster at small ℓ.
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
// Rounds between two looks of a cooperating warp at the best published candidate.
#define CHECK_EVERY 4
// Plain search of leaves of at least PLAIN_QUEUE_MIN keys with a midstop head of at least
// PLAIN_QUEUE_MIN_HEAD keys: queued, in two stages (h1 = p/2 + 1 head keys, then the rest).
#define PLAIN_QUEUE_MIN 12
#define PLAIN_QUEUE_MIN_HEAD 10

// A leaf pending after a pass: its index in the chunk's leaf list and the round to resume at.
struct Work {
    u32 leaf;
    u32 pad;
    u64 resume;
};

__device__ __forceinline__ u32 rotl_m(u32 v, u32 r, u32 full) {
    return r == 0 ? v : (((v << r) | (v >> (LEAF - r))) & full);
}

// Rounds one warp runs per pass for a leaf of m keys: `budget` times the expected number of
// candidates (m^m / m!, divided by ℓ for rotated bases, at most `cap` when cap > 0), in rounds
// of 32, at least one. The cap (the host passes a full leaf's expectation) keeps a pass from
// waiting on one warp that searches a costlier leaf (ℓ - 1 keys, unrotated: ~7 full leaves at
// ℓ = 18); such leaves go on in the next passes with more warps. The pass kernel and the collect
// kernel must agree on it (the next pass resumes after it).
__device__ __forceinline__ u64 budget_rounds(u32 m, bool rotated, float budget, float cap) {
    float expected = expf((float)m * logf((float)m) - lgammaf((float)m + 1.0f));
    if (rotated) expected /= LEAF;
    if (cap > 0.0f) expected = fminf(expected, cap);
    const float r = ceilf(budget * expected / 32.0f);
    return r < 1.0f ? 1ull : (u64)r;
}

// The best candidate published for a leaf, or NO_RESULT. Read by lane 0 and broadcast so the
// warp takes one branch.
__device__ __forceinline__ u64 published(const u64* found, u32 lane) {
    u64 enc = 0;
    if (lane == 0) enc = *(const volatile u64*)found;
    enc = __shfl_sync(ALL_LANES, enc, 0);
    return enc ? ~enc : NO_RESULT;
}

__device__ __forceinline__ void publish(u64* found, u64 d) { atomicMax(found, ~d); }

// Appends the candidates of the lanes with `take`, in lane order, to a warp's queue of length n
// (a candidate and its partial mask per entry; 64 entries, and every caller drains a queue below
// 32 before appending again, so it never overflows); returns the new length, the same in every
// lane. A queue holds its candidates in increasing order: rounds and lanes are taken in order.
__device__ __forceinline__ u32 enqueue(u64* qd, u32* qm, u32 n, bool take, u64 d, u32 mask, u32 below) {
    const u32 votes = __ballot_sync(ALL_LANES, take);
    if (take) {
        const u32 pos = n + __popc(votes & below);
        qd[pos] = d;
        qm[pos] = mask;
    }
    return n + __popc(votes);
}

// Drops the first min(n, 32) entries of a warp's queue of length n; returns the new length.
__device__ __forceinline__ u32 dequeue32(u64* qd, u32* qm, u32 n, u32 lane) {
    const u32 rest = n > 32 ? n - 32 : 0;
    u64 td = 0;
    u32 tm = 0;
    if (lane < rest) {
        td = qd[32 + lane];
        tm = qm[32 + lane];
    }
    __syncwarp();
    if (lane < rest) {
        qd[lane] = td;
        qm[lane] = tm;
    }
    __syncwarp();
    return rest;
}

extern "C" __global__ void __launch_bounds__(32 * LEAF_WARPS)
    leaf_pass(const u64* __restrict__ keys, const Node* __restrict__ nodes, const Work* __restrict__ work,
              u32 entries, u32 warps_per_leaf, float budget, float cap, u64* found, u32* fetch, u64 watchdog, u32* status) {
    __shared__ u64 sk[LEAF_WARPS][LEAF];
    // Rounds per warp by leaf size (index LEAF + 1: a rotated full leaf), computed once a block.
    __shared__ u64 budget_of[LEAF + 2];
    // A per-warp candidate queue (see enqueue) for the queued plain and rotated searches.
    __shared__ u64 qad[LEAF_WARPS][64];
    __shared__ u32 qam[LEAF_WARPS][64];
    for (u32 i = threadIdx.x; i < LEAF + 2; i += blockDim.x)
        budget_of[i] = i >= 2 ? budget_rounds(min(i, (u32)LEAF), i > LEAF, budget, cap) : 1;
    __syncthreads();  // the only block-wide barrier: every thread is still here
    const u32 warp = threadIdx.x >> 5;
    const u32 lane = threadIdx.x & 31;
    u64* s = sk[warp];
    const u32 below = (1u << lane) - 1;
    const u64 units = (u64)entries * warps_per_leaf;
    for (;;) {
        u32 g = 0;
        if (lane == 0) g = atomicAdd(fetch, 1u);
        g = __shfl_sync(ALL_LANES, g, 0);
        if (g >= units) return;
        const u32 entry = g / warps_per_leaf;
        const u64 w = g % warps_per_leaf;
        const u32 leaf = work ? work[entry].leaf : entry;
        const u64 resume = work ? work[entry].resume : 0;
        u64* best = found + entry;
        const Node nd = nodes[leaf];
        const u32 m = nd.m;
        const u32 full = (1u << m) - 1;
        __syncwarp();  // the previous unit's reads of s are done

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
        const u64 rounds = budget_of[rotated ? LEAF + 1 : m];
        const u64 stride = warps_per_leaf;
        // Only cooperating warps can be overtaken; they look every CHECK_EVERY rounds (stopping
        // late costs time, never correctness).
        const bool shared_leaf = stride > 1;

        if (!rotated) {
            if (m < PLAIN_QUEUE_MIN || p < PLAIN_QUEUE_MIN_HEAD) {
                for (u64 k = 0; k < rounds; k++) {
                    const u64 base = (resume + k * stride + w) * 32;
                    if (shared_leaf && k % CHECK_EVERY == 0 && published(best, lane) <= base) break;
                    if (base > watchdog) {
                        if (lane == 0) atomicOr(status, STATUS_WATCHDOG);
                        break;
                    }
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
                        if (lane == 0) publish(best, base + (u64)(__ffs(votes) - 1));
                        break;
                    }
                }
                continue;
            }
            // Queued plain search: the first h1 head keys in every round, the rest of the
            // leaf for the queued survivors, 32 at a time (and what is queued at the end).
            const u32 h1 = p / 2 + 1;
            u32 qa = 0;
            for (u64 k = 0;; k++) {
                const bool last = k + 1 >= rounds;
                const u64 base = (resume + k * stride + w) * 32;
                if (shared_leaf && k % CHECK_EVERY == 0) {
                    __syncwarp();
                    const u64 pending = qa ? qad[warp][0] : base;
                    if (published(best, lane) <= pending) break;
                }
                if (base > watchdog) {
                    if (lane == 0) atomicOr(status, STATUS_WATCHDOG);
                    break;
                }
                const u64 d = base + lane;
                u32 mask = 0;
#pragma unroll 4
                for (u32 i = 0; i < h1; i++) mask |= 1u << range_h32(s[i] + d, m);
                qa = enqueue(qad[warp], qam[warp], qa, __popc(mask) == h1, d, mask, below);
                bool done = false;
                while (qa >= 32 || (last && qa > 0)) {
                    __syncwarp();
                    const bool mine = lane < qa;
                    const u64 dq = mine ? qad[warp][lane] : 0;
                    u32 mq = mine ? qam[warp][lane] : 0;
                    bool ok = false;
                    if (mine) {
                        for (u32 i = h1; i < p; i++) mq |= 1u << range_h32(s[i] + dq, m);
                        if (__popc(mq) == p) {
                            for (u32 i = p; i < m; i++) mq |= 1u << range_h32(s[i] + dq, m);
                            ok = mq == full;
                        }
                    }
                    const u32 wins = __ballot_sync(ALL_LANES, ok);
                    if (wins) {
                        const u64 first = __shfl_sync(ALL_LANES, dq, __ffs(wins) - 1);
                        if (lane == 0) publish(best, first);
                        done = true;
                        break;
                    }
                    qa = dequeue32(qad[warp], qam[warp], qa, lane);
                }
                if (done || last) break;
            }
            continue;
        }
#if ROTATION && ROT_QUEUE
        const u32 ne = p;
        const u32 no = LEAF - ne;
        u32 qa = 0;  // queued bases whose even keys are injective
        for (u64 k = 0;; k++) {
            const bool last = k + 1 >= rounds;
            const u64 base = (resume + k * stride + w) * 32 * LEAF;
            if (shared_leaf && k % CHECK_EVERY == 0) {
                // The smallest untested base: the queue's head, else this round's first base.
                __syncwarp();
                const u64 pending = qa ? qad[warp][0] : base;
                if (published(best, lane) <= pending) break;
            }
            if (base > watchdog) {
                if (lane == 0) atomicOr(status, STATUS_WATCHDOG);
                break;
            }
            const u64 d = base + (u64)lane * LEAF;
            u32 ma = 0;
#pragma unroll 4
            for (u32 i = 0; i < ne; i++) ma |= 1u << range_h32(s[i] + d, LEAF);
            qa = enqueue(qad[warp], qam[warp], qa, __popc(ma) == ne, d, ma, below);
            // Full queues are tested; at the end of the budget, whatever is queued.
            bool done = false;
            while (qa >= 32 || (last && qa > 0)) {
                __syncwarp();
                const bool mine = lane < qa;
                const u64 dq = mine ? qad[warp][lane] : 0;
                const u32 maq = mine ? qam[warp][lane] : 0;
                u64 hit = NO_RESULT;
                if (mine) {
                    u32 mb = 0;
#pragma unroll 4
                    for (u32 i = ne; i < LEAF; i++) mb |= 1u << range_h32(s[i] + dq, LEAF);
                    if (__popc(mb) == no) {
                        const u32 need = full & ~maq;
                        for (u32 r = 0; r < LEAF; r++) {
                            if (rotl_m(mb, r, full) == need) {
                                hit = dq + r;
                                break;
                            }
                        }
                    }
                }
                const u32 wins = __ballot_sync(ALL_LANES, hit != NO_RESULT);
                if (wins) {
                    const u64 first = __shfl_sync(ALL_LANES, hit, __ffs(wins) - 1);
                    if (lane == 0) publish(best, first);
                    done = true;
                    break;
                }
                qa = dequeue32(qad[warp], qam[warp], qa, lane);
            }
            if (done || last) break;
        }
#elif ROTATION
        // Direct variant (ROT_QUEUE = 0): keys in registers, odd keys hashed whenever some lane's
        // even keys are injective.
        const u32 ne = p;
        const u32 no = LEAF - ne;
        u64 x[LEAF];
#pragma unroll
        for (int i = 0; i < LEAF; i++) x[i] = s[i];
        for (u64 k = 0; k < rounds; k++) {
            const u64 base = (resume + k * stride + w) * 32 * LEAF;
            if (shared_leaf && k % CHECK_EVERY == 0 && published(best, lane) <= base) break;
            if (base > watchdog) {
                if (lane == 0) atomicOr(status, STATUS_WATCHDOG);
                break;
            }
            const u64 d = base + (u64)lane * LEAF;
            u32 ma = 0;
#pragma unroll
            for (int i = 0; i < LEAF; i++)
                if (i < ne) ma |= 1u << range_h32(x[i] + d, LEAF);
            u64 hit = NO_RESULT;
            if (__popc(ma) == ne) {
                u32 mb = 0;
#pragma unroll
                for (int i = 0; i < LEAF; i++)
                    if (i >= ne) mb |= 1u << range_h32(x[i] + d, LEAF);
                if (__popc(mb) == no) {
                    const u32 need = full & ~ma;
                    for (u32 r = 0; r < LEAF; r++) {
                        if (rotl_m(mb, r, full) == need) {
                            hit = d + r;
                            break;
                        }
                    }
                }
            }
            const u32 votes = __ballot_sync(ALL_LANES, hit != NO_RESULT);
            if (votes) {
                const u64 first = __shfl_sync(ALL_LANES, hit, __ffs(votes) - 1);
                if (lane == 0) publish(best, first);
                break;
            }
        }
#endif
    }
}

// After a pass: a leaf with a published candidate gets its descriptor; the others are appended
// (in no particular order: each leaf's answer does not depend on it) to `next` with the round
// the next pass resumes at.
extern "C" __global__ void leaf_collect(const Node* __restrict__ nodes, const Work* __restrict__ work, u32 entries,
                                        u32 warps_per_leaf, float budget, float cap, const u64* __restrict__ found,
                                        u64* __restrict__ out, Work* __restrict__ next, u32* next_count) {
    const u32 i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= entries) return;
    const u32 leaf = work ? work[i].leaf : i;
    const u64 resume = work ? work[i].resume : 0;
    const Node nd = nodes[leaf];
    const u64 enc = found[i];
    if (enc) {
        out[nd.slot] = ~enc;
        return;
    }
    const bool rotated = ROTATION && nd.m == LEAF;
    const u32 j = atomicAdd(next_count, 1u);
    next[j].leaf = leaf;
    next[j].pad = 0;
    next[j].resume = resume + budget_rounds(nd.m, rotated, budget, cap) * warps_per_leaf;
}
