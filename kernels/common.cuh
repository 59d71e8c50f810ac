// Shared device code for the RecSplit GPU build (spec §4, §10.6).
//
// Device twins of the host hashing in src/core/hash.rs: `fmix32` and the H32 range function
// `R_m`. They must stay bit-identical to the host versions: the GPU build is checked byte for
// byte against the CPU build (spec §10.7).
//
// Compile-time parameters (NVRTC -D options, set in src/gpu/kernels.rs):
//   LEAF       leaf size ℓ (2..=24)
//   ROTATION   1 when full leaves use bijection rotation (spec §5.3)
//   LEAF_SEED  the leaf seed S19 (spec §4.3), a u64 literal
// Split seeds (S17, S18, START_SEEDS[depth]) are kernel arguments.

typedef unsigned long long u64;
typedef unsigned int u32;

#define NO_RESULT 0xffffffffffffffffULL
// Bit set in *status when a search passed the watchdog (the host then falls back to the CPU,
// which reports the error).
#define STATUS_WATCHDOG 1u

// One node of a splitting tree, as planned on the host: its keys are keys[off .. off + m), its
// descriptor goes to out[slot] (the node's preorder position in the chunk's descriptor list).
struct Node {
    u64 off;
    u32 m;
    u32 slot;
};

// MurmurHash3's 32-bit finalizer (src/core/hash.rs fmix32).
__device__ __forceinline__ u32 fmix32(u32 h) {
    h ^= h >> 16;
    h *= 0x85ebca6bu;
    h ^= h >> 13;
    h *= 0xc2b2ae35u;
    return h ^ (h >> 16);
}

// The high word of a · b, as written (ptxas keeps mul.hi where C's shift would become SHF).
__device__ __forceinline__ u32 mulhi_u32(u32 a, u32 b) {
    u32 r;
    asm("mul.hi.u32 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b));
    return r;
}

// R_m(x) in [0, m) for m < 2^16: fold hi ^ lo, fmix32, 16-bit fixed-point multiply (spec §4.2),
// the value of ((fmix32(f) & 0xFFFF) * m) >> 16. The search loops run this for every key of
// every candidate and are bound by the integer ALU pipe (shifts, logic, adds), while multiplies
// go to the FMA pipe. So the same value is computed with part of the work moved to multiplies:
// - f ^= f >> 16 as f ^ mulhi(f, 2^16) (mul.hi by 2^k is a right shift by 32 − k);
// - with g the word before fmix32's last step, (fmix32 & 0xFFFF) << 16 equals
//   (g << 16) ^ (g & 0xFFFF0000), and mulhi((v & 0xFFFF) << 16, m) equals ((v & 0xFFFF) * m) >> 16.
// The second xor-shift stays a shift so that the two pipes carry about equal work.
__device__ __forceinline__ u32 range_h32(u64 x, u32 m) {
    u32 f = (u32)(x >> 32) ^ (u32)x;
    f ^= mulhi_u32(f, 1u << 16);
    f *= 0x85ebca6bu;
    f ^= f >> 13;
    f *= 0xc2b2ae35u;
    return __umulhi((f << 16) ^ (f & 0xFFFF0000u), m);
}

// Stafford's Mix13 64-bit finalizer, a bijection on u64 (src/core/hash.rs mix64, spec §4.2).
// Used by the query kernels to hash integer keys exactly as hash_u64 does (spec §2.5).
__device__ __forceinline__ u64 mix64(u64 z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

// Position (lane) of the k-th set bit (from 0) of a 32-bit word with more than k bits: popcount bisection.
__device__ __forceinline__ u32 select32(u32 x, u32 k) {
    u32 base = 0, c;
    c = __popc(x & 0xffffu);
    if (k >= c) { k -= c; x >>= 16; base += 16; }
    c = __popc(x & 0xffu);
    if (k >= c) { k -= c; x >>= 8; base += 8; }
    c = __popc(x & 0xfu);
    if (k >= c) { k -= c; x >>= 4; base += 4; }
    c = __popc(x & 0x3u);
    if (k >= c) { k -= c; x >>= 2; base += 2; }
    c = x & 1u;
    if (k >= c) base += 1;
    return base;
}
