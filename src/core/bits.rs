//! Word-level bit tricks shared by the Rice reader, the Elias–Fano select and the bitmaps of
//! slots.

/// Whether bit `pos` (bit `pos % 64` of word `pos / 64`) of `words` is set; false past the end.
#[inline]
pub fn bit_is_set(words: &[u64], pos: u64) -> bool {
    usize::try_from(pos / 64)
        .ok()
        .and_then(|w| words.get(w))
        .is_some_and(|w| w >> (pos % 64) & 1 == 1)
}

/// Position of the `k`-th one-bit (from 0) of `w`; `k` must be `< popcnt(w)`.
///
/// One PDEP + TZCNT with BMI2 (Intel since Haswell; the crate builds for x86-64-v3), else a
/// byte-wise broadword loop (≤ 8 popcounts).
#[inline(always)]
pub fn select_in_word(w: u64, k: u32) -> u32 {
    debug_assert!(k < w.count_ones(), "select {k} in a word with {} ones", w.count_ones());
    #[cfg(all(target_arch = "x86_64", target_feature = "bmi2"))]
    {
        // SAFETY: the `bmi2` target feature is enabled at compile time (cfg above).
        unsafe { std::arch::x86_64::_pdep_u64(1u64 << k, w).trailing_zeros() }
    }
    #[cfg(not(all(target_arch = "x86_64", target_feature = "bmi2")))]
    {
        let mut k = k;
        let mut w = w;
        let mut base = 0u32;
        loop {
            let c = (w & 0xFF).count_ones();
            if k < c {
                let mut b = w & 0xFF;
                for _ in 0..k {
                    b &= b - 1;
                }
                return base + b.trailing_zeros();
            }
            k -= c;
            w >>= 8;
            base += 8;
        }
    }
}

/// Reads `width ≤ 56` bits at bit position `pos` of `words` (LSB-first), with one unaligned
/// 8-byte load. The caller guarantees `pos/8 + 8 ≤ 8·words.len()` (padding word).
#[inline(always)]
pub fn read_bits(words: &[u64], pos: u64, width: u32) -> u64 {
    debug_assert!(width <= 56);
    let byte = (pos / 8) as usize;
    let bytes = bytes_of(words);
    let raw = u64::from_le_bytes(bytes[byte..byte + 8].try_into().expect("8 bytes"));
    (raw >> (pos % 8)) & low_mask(width)
}

/// The low `width` bits set (`width ≤ 64`).
#[inline(always)]
pub const fn low_mask(width: u32) -> u64 {
    if width >= 64 {
        u64::MAX
    } else {
        (1u64 << width) - 1
    }
}

/// The words as bytes (little-endian targets only, see `words.rs`).
#[inline(always)]
pub fn bytes_of(words: &[u64]) -> &[u8] {
    // SAFETY: same allocation viewed as bytes; u8 has no alignment requirement.
    unsafe { std::slice::from_raw_parts(words.as_ptr() as *const u8, words.len() * 8) }
}

/// Prefetches the cache line holding `ptr` into all cache levels (no-op off x86-64).
#[inline(always)]
pub fn prefetch<T>(ptr: *const T) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: prefetch is a hint; it never faults, whatever the address.
    unsafe {
        std::arch::x86_64::_mm_prefetch(ptr as *const i8, std::arch::x86_64::_MM_HINT_T0)
    };
    #[cfg(not(target_arch = "x86_64"))]
    let _ = ptr;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn select_matches_naive() {
        let mut x = 0x9E3779B97F4A7C15u64;
        for _ in 0..2000 {
            x = crate::core::hash::mix64(x.wrapping_add(1));
            let ones: Vec<u32> = (0..64).filter(|i| x >> i & 1 == 1).collect();
            for (k, &p) in ones.iter().enumerate() {
                assert_eq!(select_in_word(x, k as u32), p);
            }
        }
        assert_eq!(select_in_word(1 << 63, 0), 63);
    }

    #[test]
    fn read_bits_unaligned() {
        let w = [0xFEDC_BA98_7654_3210u64, 0x0123_4567_89AB_CDEF, 0];
        assert_eq!(read_bits(&w, 0, 8), 0x10);
        assert_eq!(read_bits(&w, 60, 8), 0xFF);
        assert_eq!(read_bits(&w, 4, 12), 0x321);
        assert_eq!(
            read_bits(&w, 64, 56),
            0x67_89AB_CDEF & low_mask(56) | (0x2345u64 << 40) & low_mask(56)
        );
    }
}
