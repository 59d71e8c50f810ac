//! Hashing: 128-bit key hashes, bucket assignment, and the range functions `R_m` (spec §2, §4).
//!
//! - A key becomes `(hi, lo)`. `hi` picks the bucket (`bucket = ⌊hi·B / 2^64⌋`, monotone in
//!   `hi`), `lo` is the only thing the splitting tree ever sees.
//! - Integer keys (≤ 64 bits) use [`mix64`], a bijection, so two distinct integer keys never share
//!   `lo` and a `lo` collision always means a true duplicate (spec §2.5).
//! - Byte keys use seeded xxh3-128 (spec §2.1); a `lo` collision inside a bucket triggers a
//!   re-seed (spec §2.4).
//! - Candidate `d` of a node with level seed `S` maps `y` to `R_m(y + S + d)` with the `H32`
//!   range function: fold to 32 bits, MurmurHash3's `fmix32`, then a 16-bit fixed-point multiply
//!   (spec §4.2). The fold must be `hi ^ lo`: with `lo` alone, `d` and `d + 2^32` would be the
//!   same function.

/// The 20 start seeds of spec §4.3. High-level nodes at depth `k` use `START_SEEDS[k]`;
/// Agg2 nodes use `S17`, Agg1 nodes `S18`, leaves `S19` (`Fixed3`).
pub const START_SEEDS: [u64; 20] = [
    0x106393c187cae21a,
    0x6453cec3f7376937,
    0x643e521ddbd2be98,
    0x3740c6412f6572cb,
    0x717d47562f1ce470,
    0x4cd6eb4c63befb7c,
    0x9bfd8c5e18c8da73,
    0x082f20e10092a9a3,
    0x2ada2ce68d21defc,
    0xe33cb4f3e7c6466b,
    0x3980be458c509c59,
    0xc466fd9584828e8c,
    0x45f0aabe1a61ede6,
    0xf6e7b8b33ad9b98d,
    0x4ef95e25f4b4983d,
    0x81175195173b92d3,
    0x4e50927d8dd15978,
    0x1ea2099d1fafae7f,
    0x425c8a06fbaaa815,
    0xcd4216006c74052a,
];
/// Seed of every Agg2 node (`Fixed3`).
pub const SEED_AGG2: u64 = START_SEEDS[17];
/// Seed of every Agg1 node (`Fixed3`).
pub const SEED_AGG1: u64 = START_SEEDS[18];
/// Seed of every leaf (`Fixed3`).
pub const SEED_LEAF: u64 = START_SEEDS[19];

/// Stafford's Mix13 variant of the MurmurHash3 64-bit finalizer; a bijection on `u64`.
#[inline(always)]
pub const fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58476d1ce4e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d049bb133111eb);
    z ^ (z >> 31)
}

/// MurmurHash3's 32-bit finalizer.
#[inline(always)]
pub const fn fmix32(mut h: u32) -> u32 {
    h ^= h >> 16;
    h = h.wrapping_mul(0x85ebca6b);
    h ^= h >> 13;
    h = h.wrapping_mul(0xc2b2ae35);
    h ^ (h >> 16)
}

/// The `H32` range function `R_m(x)` in `[0, m)` for `m < 2^16` (spec §4.2).
#[inline(always)]
pub const fn range_h32(x: u64, m: u32) -> u32 {
    let f = ((x >> 32) as u32) ^ (x as u32);
    // Cannot overflow (m < 2^16); `wrapping_mul` keeps overflow checks out of the vector loops.
    (fmix32(f) & 0xFFFF).wrapping_mul(m) >> 16
}

/// A key's 128-bit hash: `hi` selects the bucket, `lo` is the in-bucket key.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(C)]
pub struct Hash128 {
    /// Bucket selector.
    pub hi: u64,
    /// In-bucket key.
    pub lo: u64,
}

/// Bucket of a `hi` value among `num_buckets`: `⌊hi · B / 2^64⌋` (spec §2.2).
#[inline(always)]
pub const fn bucket_of(hi: u64, num_buckets: u64) -> u64 {
    ((hi as u128 * num_buckets as u128) >> 64) as u64
}

// Seed derivation constants: arbitrary odd 64-bit values (digits of π and e) that decorrelate
// the `hi` and `lo` mixers of integer keys from each other and from the user seed.
const INT_SEED_LO: u64 = 0x243f_6a88_85a3_08d3;
const INT_SEED_HI: u64 = 0x1319_8a2e_0370_7344;
/// Salt between the two `hi` mixers of an integer key (also sent to the GPU query kernels).
pub const INT_HI_SALT: u64 = 0xb7e1_5162_8aed_2a6b;

/// The per-seed constants `(s_lo, s_hi)` of [`hash_u64`]: `lo = mix64(key ^ s_lo)`,
/// `hi = mix64(mix64(key ^ s_hi) ^ INT_HI_SALT)`. The GPU query computes them once on the host.
#[inline(always)]
pub const fn int_hash_seeds(seed: u64) -> (u64, u64) {
    (mix64(seed ^ INT_SEED_LO), mix64(seed ^ INT_SEED_HI))
}

/// Hash of an integer key (any integer ≤ 64 bits, widened to its `u64` bit pattern).
///
/// `lo = mix64(key ^ s_lo)` is a bijection of the key, so distinct keys never collide on `lo`
/// (spec §2.5); `hi` uses an unrelated mixer chain.
#[inline(always)]
pub const fn hash_u64(key: u64, seed: u64) -> Hash128 {
    let (s_lo, s_hi) = int_hash_seeds(seed);
    Hash128 {
        hi: mix64(mix64(key ^ s_hi) ^ INT_HI_SALT),
        lo: mix64(key ^ s_lo),
    }
}

/// Hash of a byte string: seeded xxh3-128 (spec §2.1).
#[inline]
pub fn hash_bytes(key: &[u8], seed: u64) -> Hash128 {
    let h = xxhash_rust::xxh3::xxh3_128_with_seed(key, seed);
    Hash128 {
        hi: (h >> 64) as u64,
        lo: h as u64,
    }
}

/// How keys are turned into [`Hash128`]s; recorded in the serialized header.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum KeyHashKind {
    /// [`hash_u64`]: integer keys, collision-free on `lo`.
    Integer = 1,
    /// [`hash_bytes`]: byte strings.
    Bytes = 2,
}

impl KeyHashKind {
    /// Decodes the serialized tag.
    pub fn from_tag(tag: u32) -> Option<Self> {
        match tag {
            1 => Some(KeyHashKind::Integer),
            2 => Some(KeyHashKind::Bytes),
            _ => None,
        }
    }
}

/// A single key that can be hashed for an MPHF.
pub trait Key {
    /// The hashing scheme this key type uses.
    const KIND: KeyHashKind;
    /// The key's 128-bit hash under `seed`.
    fn hash128(&self, seed: u64) -> Hash128;
}

macro_rules! int_key {
    ($($t:ty => $w:ty),*) => {$(
        impl Key for $t {
            const KIND: KeyHashKind = KeyHashKind::Integer;
            #[inline(always)]
            fn hash128(&self, seed: u64) -> Hash128 {
                // Signed types are sign-extended, unsigned zero-extended: the value, not the
                // width, decides the hash.
                hash_u64(*self as $w as u64, seed)
            }
        }
    )*};
}
int_key!(u8 => u64, u16 => u64, u32 => u64, u64 => u64, i8 => i64, i16 => i64, i32 => i64, i64 => i64);

impl Key for [u8] {
    const KIND: KeyHashKind = KeyHashKind::Bytes;
    #[inline]
    fn hash128(&self, seed: u64) -> Hash128 {
        hash_bytes(self, seed)
    }
}
impl Key for str {
    const KIND: KeyHashKind = KeyHashKind::Bytes;
    #[inline]
    fn hash128(&self, seed: u64) -> Hash128 {
        hash_bytes(self.as_bytes(), seed)
    }
}
impl Key for String {
    const KIND: KeyHashKind = KeyHashKind::Bytes;
    #[inline]
    fn hash128(&self, seed: u64) -> Hash128 {
        hash_bytes(self.as_bytes(), seed)
    }
}
impl Key for Vec<u8> {
    const KIND: KeyHashKind = KeyHashKind::Bytes;
    #[inline]
    fn hash128(&self, seed: u64) -> Hash128 {
        hash_bytes(self, seed)
    }
}
impl<K: Key + ?Sized> Key for &K {
    const KIND: KeyHashKind = K::KIND;
    #[inline]
    fn hash128(&self, seed: u64) -> Hash128 {
        (**self).hash128(seed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spec_vectors() {
        assert_eq!(mix64(0), 0);
        assert_eq!(mix64(1), 0x5692161d100b05e5);
        assert_eq!(mix64(0x0123456789abcdef), 0xb2c058e4ebb5112c);
        assert_eq!(fmix32(1), 0x514e28b7);
        assert_eq!(fmix32(0x89abcdef), 0x4da77f7e);
    }

    #[test]
    fn worked_range_example() {
        let y = 0x0123456789abcdefu64;
        let x = y.wrapping_add(SEED_LEAF);
        assert_eq!(x, 0xce655b67f61fd319);
        assert_eq!(((x >> 32) as u32) ^ (x as u32), 0x387a887e);
        assert_eq!(range_h32(x, 8), 7);
        assert_eq!(range_h32(x, 3000), 2742);
        let next: Vec<u32> = (1..=3).map(|d| range_h32(x.wrapping_add(d), 8)).collect();
        assert_eq!(next, [3, 5, 7]);
    }

    #[test]
    fn bucket_example() {
        assert_eq!(bucket_of(0xC000_0000_0000_0000, 10_000), 7500);
        assert_eq!(bucket_of(u64::MAX, 7), 6);
        assert_eq!(bucket_of(0, 7), 0);
    }

    #[test]
    fn integer_widths_agree_on_values() {
        assert_eq!((-5i32).hash128(3), (-5i64).hash128(3));
        assert_eq!(200u8.hash128(3), 200u64.hash128(3));
        assert_ne!(1u64.hash128(3), 1u64.hash128(4));
        assert_eq!("abc".hash128(9), b"abc"[..].hash128(9));
    }
}
