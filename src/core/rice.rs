//! The Rice bit vector R (spec §7.1, §7.4): per bucket, the fixed parts of all descriptors in
//! preorder, then their unary parts in preorder.
//!
//! Code of `d` with parameter τ: the τ low bits of `d` (LSB first), then `d >> τ` zeros and a
//! one. A query reads fixed parts with one unaligned 8-byte load (τ ≤ 30 < 56) and skips whole
//! subtrees by advancing the unary cursor past a counted number of one-bits.
//!
//! Invariants: after [`RiceBuilder::finish`] the vector ends with a sentinel one-bit and at
//! least one whole zero word of padding, so an 8-byte load at any fixed-part offset stays in
//! bounds and every unary scan that starts inside the data meets a one before the end.

use super::bits::{read_bits, select_in_word};
use super::words::Words;

/// Appends Golomb–Rice codes and raw bits.
#[derive(Debug, Default, Clone)]
pub struct RiceBuilder {
    /// Bits, LSB-first in little-endian words; never a stale one past `len`.
    words: Vec<u64>,
    /// Length in bits.
    len: u64,
}

impl RiceBuilder {
    /// An empty builder.
    pub fn new() -> Self {
        RiceBuilder::default()
    }

    /// Length in bits.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// True when no bit was appended.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The bits as little-endian words, LSB first (exactly ⌈len / 64⌉ of them).
    pub fn words(&self) -> &[u64] {
        &self.words
    }

    /// The builder that holds the `len` bits of `words` (as [`RiceBuilder::words`] gives them),
    /// or `None` unless `words` has exactly ⌈len / 64⌉ entries and no one-bit past `len`.
    pub fn from_words(words: Vec<u64>, len: u64) -> Option<Self> {
        if words.len() as u64 != len.div_ceil(64) {
            return None;
        }
        let rest = len % 64;
        if rest > 0 && words.last().is_some_and(|&w| w >> rest != 0) {
            return None;
        }
        Some(RiceBuilder { words, len })
    }

    /// Appends the `width ≤ 64` low bits of `value`.
    #[inline]
    pub fn push_bits(&mut self, value: u64, width: u32) {
        if width == 0 {
            return;
        }
        let value = if width < 64 {
            value & ((1u64 << width) - 1)
        } else {
            value
        };
        let off = (self.len % 64) as u32;
        if off == 0 {
            self.words.push(value);
        } else {
            *self.words.last_mut().expect("non-empty when off > 0") |= value << off;
            if off + width > 64 {
                self.words.push(value >> (64 - off));
            }
        }
        self.len += width as u64;
    }

    /// Appends `q` zeros and a one (the unary part of a code).
    #[inline]
    pub fn push_unary(&mut self, q: u64) {
        let new_len = self.len + q + 1;
        let need = new_len.div_ceil(64) as usize;
        self.words.resize(need, 0);
        let one = new_len - 1;
        self.words[(one / 64) as usize] |= 1u64 << (one % 64);
        self.len = new_len;
    }

    /// Appends all bits of another builder (used to concatenate per-thread chunks in order).
    pub fn append(&mut self, other: &RiceBuilder) {
        let full = (other.len / 64) as usize;
        for &w in &other.words[..full] {
            self.push_bits(w, 64);
        }
        let rest = (other.len % 64) as u32;
        if rest > 0 {
            self.push_bits(other.words[full], rest);
        }
    }

    /// Appends the sentinel one-bit and the zero padding word; returns the finished vector.
    pub fn finish(mut self) -> RiceBits {
        let len = self.len;
        self.push_bits(1, 1);
        self.words.push(0);
        RiceBits {
            words: Words::from(self.words),
            len,
        }
    }
}

/// A finished Rice bit vector.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RiceBits {
    /// The bits with the sentinel and padding (see the module invariants).
    pub words: Words,
    /// Length in bits without the sentinel (= σ_B).
    pub len: u64,
}

impl RiceBits {
    /// Size in bits of the stored words.
    pub fn size_bits(&self) -> u64 {
        self.words.len() as u64 * 64
    }

    /// The position just past the `ones`-th one-bit at or after `start` (`start` itself for
    /// `ones = 0`), or `None` when fewer than `ones` one-bits lie in `start..len`: the end of a
    /// run of `ones` unary codes, checked against the data (used to validate loaded files).
    pub fn after_ones(&self, start: u64, ones: u64) -> Option<u64> {
        if ones == 0 {
            return (start <= self.len).then_some(start);
        }
        if start >= self.len {
            return None;
        }
        let mut left = ones;
        let mut idx = (start / 64) as usize;
        let mut w = *self.words.get(idx)? & (u64::MAX << (start % 64));
        loop {
            let c = w.count_ones() as u64;
            if left <= c {
                let end = idx as u64 * 64 + select_in_word(w, (left - 1) as u32) as u64 + 1;
                return (end <= self.len).then_some(end);
            }
            left -= c;
            idx += 1;
            if idx as u64 * 64 >= self.len {
                return None;
            }
            w = *self.words.get(idx)?;
        }
    }
}

/// A cursor pair over R for one query: `fixed` reads τ-bit parts, `unary` reads quotients.
pub struct RiceCursor<'a> {
    words: &'a [u64],
    /// Next fixed bit.
    pub fixed: u64,
    /// Next unary bit.
    pub unary: u64,
}

impl<'a> RiceCursor<'a> {
    /// A cursor with the fixed part at `fixed` and the unary part at `unary`.
    #[inline(always)]
    pub fn new(words: &'a [u64], fixed: u64, unary: u64) -> Self {
        RiceCursor { words, fixed, unary }
    }

    /// Reads the next descriptor with parameter `tau`.
    #[inline(always)]
    pub fn read(&mut self, tau: u32) -> u64 {
        let low = read_bits(self.words, self.fixed, tau);
        self.fixed += tau as u64;
        let q = self.read_unary();
        (q << tau) | low
    }

    #[inline(always)]
    fn read_unary(&mut self) -> u64 {
        let start = self.unary;
        let mut idx = (start / 64) as usize;
        let mut w = self.words[idx] >> (start % 64);
        if w != 0 {
            let z = w.trailing_zeros() as u64;
            self.unary = start + z + 1;
            return z;
        }
        loop {
            idx += 1;
            w = self.words[idx];
            if w != 0 {
                let pos = idx as u64 * 64 + w.trailing_zeros() as u64;
                self.unary = pos + 1;
                return pos - start;
            }
        }
    }

    /// Skips `ones` unary codes and `fixed_bits` fixed bits (a run of whole subtrees, spec §7.5).
    #[inline(always)]
    pub fn skip(&mut self, ones: u64, fixed_bits: u64) {
        self.fixed += fixed_bits;
        if ones == 0 {
            return;
        }
        let mut k = ones;
        let mut idx = (self.unary / 64) as usize;
        let mut w = self.words[idx] & (u64::MAX << (self.unary % 64));
        loop {
            let c = w.count_ones() as u64;
            if k <= c {
                let p = select_in_word(w, (k - 1) as u32) as u64;
                self.unary = idx as u64 * 64 + p + 1;
                return;
            }
            k -= c;
            idx += 1;
            w = self.words[idx];
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn golomb_rice_round_trip() {
        // Random d for τ in 0..=31, including d ≥ 2^32 and quotients spanning several words.
        let mut x = 12345u64;
        let mut codes = Vec::new();
        let mut b = RiceBuilder::new();
        for i in 0..3000u64 {
            x = crate::core::hash::mix64(x.wrapping_add(i));
            let mut tau = (x % 32) as u32;
            let d = match i % 7 {
                0 => {
                    // d ≥ 2^32 with a quotient of at most a few words (realistic τ for huge d).
                    tau = tau.max(28);
                    ((x >> 8) % (1u64 << 33)) | (1 << 32)
                }
                1 => ((x >> 8) % 300) << tau,
                _ => (x >> 9) % (1u64 << (tau + 2)),
            };
            codes.push((tau, d));
        }
        // Layout: all fixed parts, then all unary parts (one "bucket").
        for &(tau, d) in &codes {
            b.push_bits(d, tau);
        }
        let fixed_len = b.len();
        for &(tau, d) in &codes {
            b.push_unary(d >> tau);
        }
        let r = b.finish();
        let mut c = RiceCursor::new(&r.words, 0, fixed_len);
        for &(tau, d) in &codes {
            assert_eq!(c.read(tau), d);
        }
        // Skipping k codes lands on code k.
        for k in [0usize, 1, 5, 100, 2999] {
            let fixed: u64 = codes[..k].iter().map(|c| c.0 as u64).sum();
            let mut c = RiceCursor::new(&r.words, 0, fixed_len);
            c.skip(k as u64, fixed);
            assert_eq!(c.read(codes[k].0), codes[k].1);
        }
    }

    #[test]
    fn after_ones_stays_inside_the_data() {
        let mut b = RiceBuilder::new();
        b.push_bits(0, 3);
        b.push_unary(70);
        b.push_unary(0);
        let r = b.finish(); // ones at 73 and 74, sentinel at 75
        assert_eq!(r.after_ones(3, 0), Some(3));
        assert_eq!(r.after_ones(3, 1), Some(74));
        assert_eq!(r.after_ones(3, 2), Some(75));
        assert_eq!(r.after_ones(74, 1), Some(75));
        // The sentinel and the padding are not data.
        assert_eq!(r.after_ones(3, 3), None);
        assert_eq!(r.after_ones(75, 1), None);
        assert_eq!(r.after_ones(76, 0), None);
    }

    #[test]
    fn append_concatenates_bits() {
        let mut a = RiceBuilder::new();
        a.push_bits(0b101, 3);
        let mut b = RiceBuilder::new();
        b.push_unary(70);
        b.push_bits(u64::MAX, 64);
        let mut all = a.clone();
        all.append(&b);
        assert_eq!(all.len(), 3 + 71 + 64);
        let r = all.finish();
        let mut c = RiceCursor::new(&r.words, 0, 3);
        assert_eq!(read_bits(&r.words, 0, 3), 0b101);
        assert_eq!(c.read(0), 70);
        assert_eq!(read_bits(&r.words, 74, 56), u64::MAX >> 8);
    }
}
