// GROUP BY on MPHF slots: count(*), and per value column count, sum, min, max (avg = sum/count on
// the host) into dense per-slot arrays. No hashing and no probing: the slot is the group index.
//
// How it differs from the CPU aggregation (src/gpu/groupby/cpu.rs, aggregate_cpu):
// - Rows are combined with atomics, so the order of floating-point additions differs from the
//   CPU's (and between runs): f64 sums agree to rounding, not bit for bit (see the docs of
//   src/gpu/groupby/mod.rs).
//   Integer sums wrap modulo 2^64 on both sides (DataFusion's Int64 sum), min/max are exact.
// - f64 min/max use the order-preserving map of a double's bits to u64 (negative: all bits
//   flipped; positive: sign bit set), so unsigned integer atomics give f64::total_cmp order
//   (-NaN < -inf < … < -0 < +0 < … < +inf < +NaN), the CPU's order.
// - Slots ≥ groups (ABSENT, i.e. a NULL or non-member key) go to one extra group `groups`: SQL's
//   NULL group. Rows whose value is NULL count in count(*) but not in the column's aggregates.
//
// Work mapping (chosen on the host, src/gpu/groupby/device.rs):
// - SHARED (DogQC's privatization): when all groups' accumulators fit in shared memory, each
//   block (one or two per SM, 1024 threads) aggregates a grid-stride share of the rows into its
//   own shared table with shared-memory atomics, then flushes its non-empty entries to the
//   global table with one global atomic each. No barrier inside the row loop.
// - GLOBAL: otherwise, global atomics straight into the output arrays (they are the right size
//   by construction: one entry per slot, no probing).
// - MATCH (heavy keys, clustered slots): __match_any_sync groups the lanes of a warp with equal
//   slots; each group is reduced in registers (rank-based shuffle tree) and its leader issues one
//   atomic. A hot key thus costs one atomic per warp instead of 32 serialized ones, and a sorted
//   column (runs of equal slots) one per run. Chosen from a sample (groupby_sample) of the number
//   of distinct slots per 32 consecutive rows.
// - HOT (heavy keys under global atomics): the host finds up to HOT_MAX slots that take at least
//   1/512 of a sample of the rows; they are passed in `hot` and kept in registers. Rows of a hot
//   slot go to a small per-block shared table (shared atomics), flushed once per block, so one
//   global address no longer receives a large share of all the atomics (same-address global
//   atomics serialize in L2: a key with 7 % of 6·10^6 rows cost 0.4 ms). The launch then uses a
//   few blocks per SM with a grid-stride loop, so the flushes stay few.
#include "common.cuh"

typedef unsigned char u8;

#define OP_ROWS 1u
#define OP_NN 2u
#define OP_SUM 4u
#define OP_MIN 8u
#define OP_MAX 16u

#define VT_NONE 0
#define VT_I64 1
#define VT_F64 2

#define HOT_MAX 16
#define NO_HOT 0xfffffffeu  // never a slot: slots are clamped to groups < 0xfffffffe

#define RED_SUM 0
#define RED_MIN 1
#define RED_MAX 2

__device__ __forceinline__ bool gb_valid(const u8* __restrict__ valid, u64 off, u64 i) {
    if (valid == nullptr) return true;
    const u64 b = i + off;
    return (valid[b >> 3] >> (b & 7)) & 1;
}

// Order-preserving map of a double's bits to u64 (total order, see the header).
__device__ __forceinline__ u64 f64_key(u64 bits) {
    return (bits >> 63) ? ~bits : (bits | 0x8000000000000000ULL);
}

template <int VT>
__device__ __forceinline__ u64 min_ident() {
    return VT == VT_I64 ? 0x7fffffffffffffffULL : ~0ULL;
}
template <int VT>
__device__ __forceinline__ u64 max_ident() {
    return VT == VT_I64 ? 0x8000000000000000ULL : 0ULL;
}

template <int VT, int RED>
__device__ __forceinline__ u64 combine(u64 a, u64 b) {
    if (RED == RED_SUM) {
        if (VT == VT_F64) return (u64)__double_as_longlong(__longlong_as_double((long long)a) + __longlong_as_double((long long)b));
        return a + b;
    }
    if (VT == VT_I64) {
        const long long x = (long long)a, y = (long long)b;
        return (u64)(RED == RED_MIN ? (x < y ? x : y) : (x > y ? x : y));
    }
    return RED == RED_MIN ? (a < b ? a : b) : (a > b ? a : b);
}


// Reduction of x over the lanes in `peers` (a __match_any_sync group); the lowest lane of the
// group gets the total. Tree over the group's ranks: at step s, rank r adds rank r + s, so after
// steps 1, 2, 4, … rank r holds ranks [r, r + 2s). Every lane of a group runs the same steps
// with the same mask, as __shfl_sync requires.
template <int VT, int RED>
__device__ __forceinline__ u64 group_reduce(unsigned peers, u64 x) {
    const u32 lane = threadIdx.x & 31;
    const u32 rank = __popc(peers & ((1u << lane) - 1));
    const u32 size = __popc(peers);
    for (u32 s = 1; s < size; s <<= 1) {
        const u32 src_rank = rank + s;
        const u32 src = src_rank < size ? select32(peers, src_rank) : lane;
        const u64 y = __shfl_sync(peers, x, src);
        if (src_rank < size) x = combine<VT, RED>(x, y);
    }
    return x;
}

// Adds one (possibly warp-combined) contribution to group g. Counts are u32 in shared memory
// (a block sees fewer than 2^32 rows), u64 in global memory.
template <int VT, bool SHARED>
__device__ __forceinline__ void accumulate(u32 ops, u32 g, u32 nrows, u32 nn, u64 vs, u64 vmin, u64 vmax, u32* s_rows,
                                           u32* s_nn, u64* rows_arr, u64* nn_arr, u64* sum_arr, u64* min_arr,
                                           u64* max_arr) {
    if (ops & OP_ROWS) {
        if (SHARED) atomicAdd(s_rows + g, nrows);
        else atomicAdd((unsigned long long*)(rows_arr + g), (unsigned long long)nrows);
    }
    if (VT == VT_NONE || nn == 0) return;
    if (ops & OP_NN) {
        if (SHARED) atomicAdd(s_nn + g, nn);
        else atomicAdd((unsigned long long*)(nn_arr + g), (unsigned long long)nn);
    }
    if (ops & OP_SUM) {
        if (VT == VT_F64) atomicAdd((double*)(sum_arr + g), __longlong_as_double((long long)vs));
        else atomicAdd((unsigned long long*)(sum_arr + g), (unsigned long long)vs);
    }
    if (ops & OP_MIN) {
        if (VT == VT_I64) atomicMin((long long*)(min_arr + g), (long long)vmin);
        else atomicMin((unsigned long long*)(min_arr + g), (unsigned long long)vmin);
    }
    if (ops & OP_MAX) {
        if (VT == VT_I64) atomicMax((long long*)(max_arr + g), (long long)vmax);
        else atomicMax((unsigned long long*)(max_arr + g), (unsigned long long)vmax);
    }
}

// Adds a contribution to hot entry h of the block's hot table (shared atomics).
template <int VT>
__device__ __forceinline__ void accumulate_hot(u32 ops, u32 h, u32 nrows, u32 nn, u64 vs, u64 vmin, u64 vmax,
                                               u32* h_rows, u32* h_nn, u64* h_sum, u64* h_min, u64* h_max) {
    if (ops & OP_ROWS) atomicAdd(h_rows + h, nrows);
    if (VT == VT_NONE || nn == 0) return;
    atomicAdd(h_nn + h, nn);
    if (ops & OP_SUM) {
        if (VT == VT_F64) atomicAdd((double*)(h_sum + h), __longlong_as_double((long long)vs));
        else atomicAdd((unsigned long long*)(h_sum + h), (unsigned long long)vs);
    }
    if (ops & OP_MIN) {
        if (VT == VT_I64) atomicMin((long long*)(h_min + h), (long long)vmin);
        else atomicMin((unsigned long long*)(h_min + h), (unsigned long long)vmin);
    }
    if (ops & OP_MAX) {
        if (VT == VT_I64) atomicMax((long long*)(h_max + h), (long long)vmax);
        else atomicMax((unsigned long long*)(h_max + h), (unsigned long long)vmax);
    }
}

template <int VT, bool SHARED, bool MATCH>
__device__ __forceinline__ void groupby_impl(const u32* __restrict__ slots, u64 rows, u32 groups,
                                             const u64* __restrict__ values, const u8* __restrict__ vvalid,
                                             u64 vvalid_off, u32 ops, u64* g_rows, u64* g_nn, u64* g_sum,
                                             u64* g_min, u64* g_max, const u32* __restrict__ hot, u32 n_hot) {
    extern __shared__ u64 smem[];
    // The hot table (global mode only; n_hot is 0 in shared mode).
    __shared__ u64 h_sum[HOT_MAX], h_min[HOT_MAX], h_max[HOT_MAX];
    __shared__ u32 h_rows[HOT_MAX], h_nn[HOT_MAX];
    u32 hk[HOT_MAX];
#pragma unroll
    for (u32 k = 0; k < HOT_MAX; k++) hk[k] = k < n_hot ? hot[k] : NO_HOT;
    if (n_hot > 0) {  // uniform over the grid: a kernel argument
        if (threadIdx.x < HOT_MAX) {
            h_sum[threadIdx.x] = 0;
            h_min[threadIdx.x] = min_ident<VT>();
            h_max[threadIdx.x] = max_ident<VT>();
            h_rows[threadIdx.x] = 0;
            h_nn[threadIdx.x] = 0;
        }
        __syncthreads();
    }
    const u32 G1 = groups + 1;
    u64 *s_sum = nullptr, *s_min = nullptr, *s_max = nullptr;
    u32 *s_rows = nullptr, *s_nn = nullptr;
    if (SHARED) {
        u64* q = smem;
        if (VT != VT_NONE && (ops & OP_SUM)) { s_sum = q; q += G1; }
        if (VT != VT_NONE && (ops & OP_MIN)) { s_min = q; q += G1; }
        if (VT != VT_NONE && (ops & OP_MAX)) { s_max = q; q += G1; }
        u32* r = (u32*)q;
        if (ops & OP_ROWS) { s_rows = r; r += G1; }
        if (VT != VT_NONE && (ops & OP_NN)) { s_nn = r; r += G1; }
        for (u32 g = threadIdx.x; g < G1; g += blockDim.x) {
            if (s_sum) s_sum[g] = 0;
            if (s_min) s_min[g] = min_ident<VT>();
            if (s_max) s_max[g] = max_ident<VT>();
            if (s_rows) s_rows[g] = 0;
            if (s_nn) s_nn[g] = 0;
        }
        __syncthreads();
    }
    u64* sum_arr = SHARED ? s_sum : g_sum;
    u64* min_arr = SHARED ? s_min : g_min;
    u64* max_arr = SHARED ? s_max : g_max;
    const u64 stride = (u64)gridDim.x * blockDim.x;
    // `base` is warp-uniform (blockDim is a multiple of 32), so every lane of a warp runs the
    // same iterations, as the warp-synchronous MATCH path requires.
    for (u64 base = (u64)blockIdx.x * blockDim.x; base < rows; base += stride) {
        const u64 i = base + threadIdx.x;
        const bool in = i < rows;
        u32 g = in ? slots[i] : 0;
        if (g > groups) g = groups;
        const bool vv = in && VT != VT_NONE && gb_valid(vvalid, vvalid_off, i);
        u64 v = (VT != VT_NONE && vv) ? values[i] : 0;
        u64 vmin = min_ident<VT>(), vmax = max_ident<VT>();
        if (VT != VT_NONE && vv) {
            const u64 ord = VT == VT_F64 ? f64_key(v) : v;
            vmin = ord;
            vmax = ord;
        }
        int h = -1;
        if (n_hot > 0) {
#pragma unroll
            for (u32 k = 0; k < HOT_MAX; k++)
                if (g == hk[k]) h = (int)k;
        }
        if (MATCH) {
            const unsigned peers = __match_any_sync(0xffffffffu, in ? g : 0xffffffffu);
            const unsigned vmask = __ballot_sync(0xffffffffu, vv);
            const u32 lane = threadIdx.x & 31;
            const u32 nrows = __popc(peers);
            const u32 nn = __popc(peers & vmask);
            if (VT != VT_NONE && nrows > 1) {
                if (ops & OP_SUM) v = group_reduce<VT, RED_SUM>(peers, v);
                if (ops & OP_MIN) vmin = group_reduce<VT, RED_MIN>(peers, vmin);
                if (ops & OP_MAX) vmax = group_reduce<VT, RED_MAX>(peers, vmax);
            }
            if (in && (u32)(__ffs(peers) - 1) == lane) {
                if (h >= 0)
                    accumulate_hot<VT>(ops, (u32)h, nrows, nn, v, vmin, vmax, h_rows, h_nn, h_sum, h_min, h_max);
                else
                    accumulate<VT, SHARED>(ops, g, nrows, nn, v, vmin, vmax, s_rows, s_nn, g_rows, g_nn, sum_arr,
                                           min_arr, max_arr);
            }
        } else if (in) {
            if (h >= 0)
                accumulate_hot<VT>(ops, (u32)h, 1, vv ? 1 : 0, v, vmin, vmax, h_rows, h_nn, h_sum, h_min, h_max);
            else
                accumulate<VT, SHARED>(ops, g, 1, vv ? 1 : 0, v, vmin, vmax, s_rows, s_nn, g_rows, g_nn, sum_arr,
                                       min_arr, max_arr);
        }
    }
    if (n_hot > 0) {
        __syncthreads();
        if (threadIdx.x < n_hot) {
            const u32 k = threadIdx.x, g = hot[k];  // the hot slot of entry k
            if ((ops & OP_ROWS) && h_rows[k])
                atomicAdd((unsigned long long*)(g_rows + g), (unsigned long long)h_rows[k]);
            if (VT != VT_NONE && h_nn[k] > 0) {
                atomicAdd((unsigned long long*)(g_nn + g), (unsigned long long)h_nn[k]);
                if (ops & OP_SUM) {
                    if (VT == VT_F64) atomicAdd((double*)(g_sum + g), __longlong_as_double((long long)h_sum[k]));
                    else atomicAdd((unsigned long long*)(g_sum + g), (unsigned long long)h_sum[k]);
                }
                if (ops & OP_MIN) {
                    if (VT == VT_I64) atomicMin((long long*)(g_min + g), (long long)h_min[k]);
                    else atomicMin((unsigned long long*)(g_min + g), (unsigned long long)h_min[k]);
                }
                if (ops & OP_MAX) {
                    if (VT == VT_I64) atomicMax((long long*)(g_max + g), (long long)h_max[k]);
                    else atomicMax((unsigned long long*)(g_max + g), (unsigned long long)h_max[k]);
                }
            }
        }
    }
    if (SHARED) {
        __syncthreads();
        for (u32 g = threadIdx.x; g < G1; g += blockDim.x) {
            if (s_rows) {
                const u32 r = s_rows[g];
                if (r) atomicAdd((unsigned long long*)(g_rows + g), (unsigned long long)r);
            }
            if (VT == VT_NONE) continue;
            const u32 nn = s_nn ? s_nn[g] : 1;
            if (nn == 0) continue;
            if (s_nn) atomicAdd((unsigned long long*)(g_nn + g), (unsigned long long)nn);
            if (s_sum) {
                if (VT == VT_F64) atomicAdd((double*)(g_sum + g), __longlong_as_double((long long)s_sum[g]));
                else atomicAdd((unsigned long long*)(g_sum + g), (unsigned long long)s_sum[g]);
            }
            if (s_min) {
                if (VT == VT_I64) atomicMin((long long*)(g_min + g), (long long)s_min[g]);
                else atomicMin((unsigned long long*)(g_min + g), (unsigned long long)s_min[g]);
            }
            if (s_max) {
                if (VT == VT_I64) atomicMax((long long*)(g_max + g), (long long)s_max[g]);
                else atomicMax((unsigned long long*)(g_max + g), (unsigned long long)s_max[g]);
            }
        }
    }
}

#define GB_ARGS                                                                                          \
    const u32 *slots, u64 rows, u32 groups, const u64 *values, const u8 *vvalid, u64 vvalid_off, u32 ops, \
        u64 *g_rows, u64 *g_nn, u64 *g_sum, u64 *g_min, u64 *g_max, const u32 *hot, u32 n_hot
#define GB_PASS slots, rows, groups, values, vvalid, vvalid_off, ops, g_rows, g_nn, g_sum, g_min, g_max, hot, n_hot

// One entry point per (value type, privatization, warp combining): groupby_<vt>_<shared|global>_<plain|match>.
// __launch_bounds__(1024): the shared-memory launches use 1024 threads per block, so the compiler
// must keep each thread within 64 registers.
#define GB_KERNEL(NAME, VT, SHARED, MATCH)                                    \
    extern "C" __global__ void __launch_bounds__(1024) NAME(GB_ARGS) {        \
        groupby_impl<VT, SHARED, MATCH>(GB_PASS);                             \
    }

GB_KERNEL(groupby_none_shared_plain, VT_NONE, true, false)
GB_KERNEL(groupby_none_shared_match, VT_NONE, true, true)
GB_KERNEL(groupby_none_global_plain, VT_NONE, false, false)
GB_KERNEL(groupby_none_global_match, VT_NONE, false, true)
GB_KERNEL(groupby_i64_shared_plain, VT_I64, true, false)
GB_KERNEL(groupby_i64_shared_match, VT_I64, true, true)
GB_KERNEL(groupby_i64_global_plain, VT_I64, false, false)
GB_KERNEL(groupby_i64_global_match, VT_I64, false, true)
GB_KERNEL(groupby_f64_shared_plain, VT_F64, true, false)
GB_KERNEL(groupby_f64_shared_match, VT_F64, true, true)
GB_KERNEL(groupby_f64_global_plain, VT_F64, false, false)
GB_KERNEL(groupby_f64_global_match, VT_F64, false, true)

// Sample for the MATCH and HOT decisions: warp w looks at the 32 slots from row w·step, adds the
// number of distinct slots (match groups) to out[0] and the number of rows looked at to out[1],
// and copies the slots to sampled[32·w + lane] (0xffffffff past the end) for the host's histogram.
extern "C" __global__ void groupby_sample(const u32* slots, u64 rows, u64 step, u32 windows, unsigned long long* out,
                                          u32* sampled) {
    const u32 w = (blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    if (w >= windows) return;  // whole warps leave together (blockDim is a multiple of 32)
    const u32 lane = threadIdx.x & 31;
    const u64 i = (u64)w * step + lane;
    const bool in = i < rows;
    const u32 slot = in ? slots[i] : 0xffffffffu;
    // In-range ABSENT rows are kept (as 0xfffffffe, which the host clamps to the NULL group).
    sampled[(u64)w * 32 + lane] = in ? (slot == 0xffffffffu ? 0xfffffffeu : slot) : 0xffffffffu;
    const unsigned peers = __match_any_sync(0xffffffffu, slot);
    const unsigned leaders = __ballot_sync(0xffffffffu, in && (u32)(__ffs(peers) - 1) == lane);
    const unsigned inside = __ballot_sync(0xffffffffu, in);
    if (lane == 0) {
        atomicAdd(out, (unsigned long long)__popc(leaders));
        atomicAdd(out + 1, (unsigned long long)__popc(inside));
    }
}

// Fills n words with v (accumulator initialisation).
extern "C" __global__ void fill_u64(u64* p, u64 n, u64 v) {
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * blockDim.x) p[i] = v;
}
