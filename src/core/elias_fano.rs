//! Double Elias–Fano (spec §8): the cumulative key counts λ_i and the Rice bit offsets σ_i of
//! all buckets, compressed together so that one lookup returns `(λ_i, λ_{i+1}, σ_i)`.
//!
//! # Transformations (spec §8.2)
//!
//! - `β = ⌊2^20·σ_B/λ_B⌋` (evaluated in f64; 0 when λ_B = 0) is the average number of Rice bits
//!   per key in 20-bit fixed point, and `f(λ) = ⌊β·λ/2^20⌋` (a 128-bit product) predicts σ from λ.
//! - `ψ_i = σ_i − f(λ_i)` is the prediction error (possibly negative and non-monotone).
//! - `δ_λ` and `δ_ψ` are the smallest increments of λ and ψ (δ_ψ may be negative), and
//!   `φ_i = λ_i − i·δ_λ`, `χ_i = ψ_i − i·δ_ψ` are nondecreasing and start at 0.
//! - Universes `u = φ_B + 1` (resp. `χ_B + 1`) and low widths `l = ⌊log2⌊u/(B+1)⌋⌋` (0 when the
//!   quotient is 0), clamped so that `2·l_λ + l_ψ ≤ 56` (never binding for real MPHFs; a smaller
//!   width only makes the upper array longer).
//!
//! Decoding reverses everything modulo 2^64 (δ_ψ is stored as a wrapped `u64`), which is exact
//! because the true σ_i fits a `u64`.
//!
//! # Layout (spec §8.3)
//!
//! - `lower`: `(B+1)·(l_λ+l_ψ)` bits, interleaved per i as `[l_λ low bits of φ_i][l_ψ low bits of
//!   χ_i]`, plus one zero padding word. One unaligned 8-byte load at bit `i·(l_λ+l_ψ)` holds φ_i,
//!   χ_i and φ_{i+1} (at most 7 + 2·l_λ + l_ψ ≤ 63 bits), and the padding keeps it in bounds.
//! - `upper_λ`: `B+1+(u_λ >> l_λ)` bits with a one at `(φ_i >> l_λ) + i` for every i ≤ B; `upper_ψ`
//!   likewise from χ. Each holds exactly B+1 ones; the high part of x_i is `select(i) − i`.
//! - `jump`: one entry per `2^J` buckets (J = 14 normally): the absolute positions of the one of
//!   rank `e·2^J` in both upper arrays, then, for every 256th rank inside the entry, a pair of u16
//!   offsets (λ, ψ) relative to those positions. With J = 14 an entry is 2 + 32 = 34 words, about
//!   0.13 bits per bucket. If some offset would not fit 16 bits (only for very irregular σ), the
//!   builder lowers J until all fit; at J = 8 every offset is 0, so a layout always exists.
//!
//! # Query (spec §8.4)
//!
//! One lower-bits load; one jump lookup that serves both arrays; in each upper array a popcount
//! scan from the sampled one (at most 255 ones ahead, O(1) words on average since each array has
//! fewer than 3 bits per one) and one [`select_in_word`]; then the next one after pos_λ by
//! trailing-zero count for λ_{i+1}.
//!
//! # Invariants
//!
//! - Every array is a [`Words`], so a loaded structure points into the memory map.
//! - After [`DoubleEliasFano::new`] or a successful [`DoubleEliasFano::read`]: the lower array has
//!   exactly `⌈(B+1)(l_λ+l_ψ)/64⌉ + 1` words, the upper arrays `⌈bits/64⌉` words, the jump table
//!   `⌈B/2^J⌉` entries, and every sampled position lies inside its upper array. Together with the
//!   bounded scans in [`DoubleEliasFano::get_unchecked`] this means `get(i)` for `i < B` never
//!   reads out of bounds, even on a corrupt file that passed `read` (it then returns garbage).
//!
//! # References
//!
//! - P. Elias, *Efficient storage and retrieval by content and address of static files*, JACM 1974;
//!   R. M. Fano, *On the number of bits required to implement an associative memory*, 1971.
//! - E. Esposito, T. Mueller Graf, S. Vigna, *RecSplit: Minimal Perfect Hashing via Recursive
//!   Splitting*, ALENEX 2020, [arXiv 1910.06416](https://arxiv.org/abs/1910.06416) (the double EF).
//! - D. Bez, F. Kurpicz, H.-P. Kuhn, P. Sanders, *High Performance Construction of RecSplit Based
//!   Minimal Perfect Hash Functions*, ESA 2023, [arXiv 2212.09562](https://arxiv.org/abs/2212.09562).
//! - `docs/recsplit.md` §8 (transformations, layout, worked example) and §9 (use in the query).

use super::bits::{low_mask, prefetch, select_in_word};
use super::words::{WordReader, WordWriter, Words};
use crate::error::{MphfError, Result};

/// Bits of fixed point in β (spec §8.2).
const BETA_SHIFT: u32 = 20;
/// log2 of the number of ones between two sampled offsets (spec §8.3).
const LOG2_SAMPLE: u32 = 8;
/// log2 of the number of ones per jump entry when all u16 offsets fit (spec §8.3).
const LOG2_JUMP_MAX: u32 = 14;
/// The smallest entry span; there every offset is 0, so it always fits.
const LOG2_JUMP_MIN: u32 = LOG2_SAMPLE;
/// Largest `2·l_λ + l_ψ`: an 8-byte load shifted by ≤ 7 bits must hold φ_i, χ_i and φ_{i+1}.
const MAX_LOW_BITS: u32 = 56;
/// Largest bucket count accepted by [`DoubleEliasFano::read`] (keeps every size computation
/// far from overflow; an MPHF has B ≤ n ≤ 2^64 / 2^16 in practice).
const MAX_BUCKETS: u64 = 1 << 48;
/// Words written by [`DoubleEliasFano::write`] besides the four arrays' contents.
const HEADER_WORDS: u64 = 13;

/// λ_i (keys before bucket i) and σ_i (bit offset of bucket i in R) for i in 0..=B, in a double
/// Elias–Fano (see the module docs for layout and invariants).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DoubleEliasFano {
    /// Number of buckets B (the sequences have B+1 entries).
    num_buckets: u64,
    /// Low bits stored per φ_i.
    l_lambda: u32,
    /// Low bits stored per χ_i.
    l_psi: u32,
    /// δ_λ, the smallest increment of λ.
    delta_lambda: u64,
    /// δ_ψ, the smallest increment of ψ, as a wrapped two's complement value.
    delta_psi: u64,
    /// β, average Rice bits per key in 20-bit fixed point.
    beta: u64,
    /// u_λ = φ_B + 1.
    u_lambda: u64,
    /// u_ψ = χ_B + 1.
    u_psi: u64,
    /// J: log2 of the number of buckets per jump entry.
    log2_jump: u32,
    /// Interleaved low bits plus one padding word.
    lower: Words,
    /// Upper bits of φ (unary-coded gaps, B+1 ones).
    upper_lambda: Words,
    /// Upper bits of χ (unary-coded gaps, B+1 ones).
    upper_psi: Words,
    /// Jump entries: two absolute positions, then u16 offset pairs packed two per word.
    jump: Words,
}

/// The transformed sequences of spec §8.2 (build side; kept separate so tests can check them).
#[derive(Debug)]
struct Transform {
    beta: u64,
    delta_lambda: u64,
    /// δ_ψ exactly (it may be negative).
    delta_psi: i128,
    phi: Vec<u64>,
    chi: Vec<u64>,
}

/// `f(λ) = ⌊β·λ/2^20⌋` with a 128-bit product, truncated to 64 bits (build and query agree).
#[inline(always)]
fn predict(beta: u64, lambda: u64) -> u64 {
    ((beta as u128 * lambda as u128) >> BETA_SHIFT) as u64
}

impl Transform {
    /// Computes β, δ's, φ and χ.
    ///
    /// # Panics
    /// If χ_B + 1 does not fit a `u64` (only for absurd inputs, far beyond any MPHF).
    fn new(lambda: &[u64], sigma: &[u64]) -> Transform {
        let b = lambda.len() - 1;
        let (n, total) = (lambda[b], sigma[b]);
        // Spec §8.2: evaluated in f64, then floored (`as` saturates, never panics).
        let beta = if n == 0 {
            0
        } else {
            (total as f64 * (1u64 << BETA_SHIFT) as f64 / n as f64).floor() as u64
        };
        let delta_lambda = lambda.windows(2).map(|w| w[1] - w[0]).min().unwrap_or(0);
        let psi = |i: usize| sigma[i] as i128 - predict(beta, lambda[i]) as i128;
        let delta_psi = (1..=b).map(|i| psi(i) - psi(i - 1)).min().unwrap_or(0);
        let phi = (0..=b).map(|i| lambda[i] - i as u64 * delta_lambda).collect();
        let chi = (0..=b)
            .map(|i| {
                let c = psi(i) - i as i128 * delta_psi;
                assert!(
                    (0..u64::MAX as i128).contains(&c),
                    "Elias-Fano: χ_{i} = {c} does not fit (σ and λ are too irregular)"
                );
                c as u64
            })
            .collect();
        Transform {
            beta,
            delta_lambda,
            delta_psi,
            phi,
            chi,
        }
    }
}

/// `⌊log2⌊u/(B+1)⌋⌋`, or 0 when the quotient is 0 (spec §8.2).
fn raw_width(universe: u64, num_buckets: u64) -> u32 {
    let q = universe / (num_buckets + 1);
    if q == 0 {
        0
    } else {
        63 - q.leading_zeros()
    }
}

/// The low widths (l_λ, l_ψ) for the given universes, clamped to `2·l_λ + l_ψ ≤ 56`.
fn widths(u_lambda: u64, u_psi: u64, num_buckets: u64) -> (u32, u32) {
    let l_lambda = raw_width(u_lambda, num_buckets).min(MAX_LOW_BITS / 2);
    let l_psi = raw_width(u_psi, num_buckets).min(MAX_LOW_BITS - 2 * l_lambda);
    (l_lambda, l_psi)
}

/// Length in bits of an upper array, or `None` on overflow.
fn upper_bits(universe: u64, width: u32, num_buckets: u64) -> Option<u64> {
    (num_buckets + 1).checked_add(universe >> width)
}

/// Number of words of one jump entry with `2^log2_jump` buckets: two absolute positions, then
/// `2^(log2_jump−8)` u16 pairs packed two per word.
fn entry_words(log2_jump: u32) -> u64 {
    2 + (1u64 << (log2_jump - LOG2_SAMPLE)).div_ceil(2)
}

/// Number of jump entries for B buckets (one per `2^log2_jump` buckets that may be queried).
fn num_entries(num_buckets: u64, log2_jump: u32) -> u64 {
    num_buckets.div_ceil(1 << log2_jump)
}

/// Sets `width ≤ 56` bits of `value` (already masked) at bit `pos`; the bits must be zero.
fn put_bits(words: &mut [u64], pos: u64, value: u64, width: u32) {
    if width == 0 {
        return;
    }
    let (w, off) = ((pos / 64) as usize, (pos % 64) as u32);
    words[w] |= value << off;
    if off + width > 64 {
        words[w + 1] |= value >> (64 - off);
    }
}

/// Builds one upper array (a one at `(x_i >> width) + i`) and returns it with the positions of
/// the ones of rank 0, 256, 512, … below `num_buckets`.
fn build_upper(xs: &[u64], width: u32, bits: u64, num_buckets: u64) -> (Vec<u64>, Vec<u64>) {
    let mut words = vec![0u64; bits.div_ceil(64) as usize];
    let mut samples = Vec::with_capacity(num_buckets.div_ceil(1 << LOG2_SAMPLE) as usize);
    for (i, &x) in xs.iter().enumerate() {
        let p = (x >> width) + i as u64;
        words[(p / 64) as usize] |= 1u64 << (p % 64);
        if (i as u64) < num_buckets && i % (1 << LOG2_SAMPLE) == 0 {
            samples.push(p);
        }
    }
    (words, samples)
}

/// True when every sampled position fits 16 bits relative to its entry's first sample.
fn offsets_fit(samples: &[u64], log2_jump: u32) -> bool {
    let per_entry = 1usize << (log2_jump - LOG2_SAMPLE);
    samples.chunks(per_entry).all(|c| c.iter().all(|&p| p - c[0] < 1 << 16))
}

/// Position of the `k`-th one (from 0) at or after bit `start` of `words`: `(word index, the
/// word with the bits before `start` cleared, bit inside the word)`. Returns `(len, 0, 0)` when the
/// array ends first, which only a corrupt structure can cause.
///
/// # Safety
/// `start < 64·words.len()`.
#[inline(always)]
unsafe fn select_from(words: &[u64], start: u64, mut k: u64) -> (usize, u64, u32) {
    let mut idx = (start / 64) as usize;
    debug_assert!(
        idx < words.len(),
        "sampled position {start} outside {} words",
        words.len()
    );
    // SAFETY: idx < words.len() by the caller's precondition.
    let mut word = unsafe { *words.get_unchecked(idx) } & (u64::MAX << (start % 64));
    loop {
        let c = word.count_ones() as u64;
        if k < c {
            return (idx, word, select_in_word(word, k as u32));
        }
        k -= c;
        idx += 1;
        if idx >= words.len() {
            return (words.len(), 0, 0);
        }
        // SAFETY: idx < words.len(), checked just above.
        word = unsafe { *words.get_unchecked(idx) };
    }
}

/// Position of the first one strictly after the one at `(idx, bit)`, where `word` is the word at
/// `idx` (possibly with lower bits cleared). Returns `64·len` when there is none (corrupt data).
#[inline(always)]
fn next_one(words: &[u64], mut idx: usize, word: u64, bit: u32) -> u64 {
    // Two shifts so that bit = 63 clears the whole word instead of overflowing the shift.
    let mut rest = (word & (u64::MAX << bit)) & !(1u64 << bit);
    loop {
        if rest != 0 {
            return idx as u64 * 64 + rest.trailing_zeros() as u64;
        }
        idx += 1;
        if idx >= words.len() {
            return words.len() as u64 * 64;
        }
        // SAFETY: idx < words.len(), checked just above.
        rest = unsafe { *words.get_unchecked(idx) };
    }
}

/// Borrowed raw fields of a [`DoubleEliasFano`], for a device copy (the GPU query of spec §9
/// decodes them exactly as [`DoubleEliasFano::get_unchecked`] does).
#[derive(Clone, Copy, Debug)]
pub struct EliasFanoParts<'a> {
    /// Number of buckets B.
    pub num_buckets: u64,
    /// Low bits stored per φ_i.
    pub l_lambda: u32,
    /// Low bits stored per χ_i.
    pub l_psi: u32,
    /// δ_λ.
    pub delta_lambda: u64,
    /// δ_ψ as a wrapped two's complement value.
    pub delta_psi: u64,
    /// β in 20-bit fixed point.
    pub beta: u64,
    /// J: log2 of the buckets per jump entry.
    pub log2_jump: u32,
    /// Interleaved low bits plus one padding word.
    pub lower: &'a [u64],
    /// Upper bits of φ.
    pub upper_lambda: &'a [u64],
    /// Upper bits of χ.
    pub upper_psi: &'a [u64],
    /// Jump entries.
    pub jump: &'a [u64],
}

impl DoubleEliasFano {
    /// The raw fields (see [`EliasFanoParts`]).
    pub fn parts(&self) -> EliasFanoParts<'_> {
        EliasFanoParts {
            num_buckets: self.num_buckets,
            l_lambda: self.l_lambda,
            l_psi: self.l_psi,
            delta_lambda: self.delta_lambda,
            delta_psi: self.delta_psi,
            beta: self.beta,
            log2_jump: self.log2_jump,
            lower: &self.lower,
            upper_lambda: &self.upper_lambda,
            upper_psi: &self.upper_psi,
            jump: &self.jump,
        }
    }

    /// Builds from `cum_keys` (λ) and `bit_pos` (σ), both of length `B+1`, nondecreasing,
    /// starting at 0.
    ///
    /// # Panics
    /// If the slices are empty, differ in length, do not start at 0 or decrease somewhere, or
    /// (for absurdly irregular σ, never for an MPHF) if χ_B + 1 does not fit a `u64`.
    pub fn new(cum_keys: &[u64], bit_pos: &[u64]) -> Self {
        assert!(
            !cum_keys.is_empty() && cum_keys.len() == bit_pos.len(),
            "Elias-Fano: λ has {} entries and σ {}; both need B+1 ≥ 1",
            cum_keys.len(),
            bit_pos.len()
        );
        assert!(
            cum_keys[0] == 0 && bit_pos[0] == 0,
            "Elias-Fano: λ_0 = {} and σ_0 = {} must be 0",
            cum_keys[0],
            bit_pos[0]
        );
        for i in 1..cum_keys.len() {
            assert!(
                cum_keys[i] >= cum_keys[i - 1] && bit_pos[i] >= bit_pos[i - 1],
                "Elias-Fano: λ or σ decreases at index {i}"
            );
        }
        let num_buckets = cum_keys.len() as u64 - 1;
        let t = Transform::new(cum_keys, bit_pos);
        assert!(
            t.phi[num_buckets as usize] < u64::MAX,
            "Elias-Fano: λ_B = u64::MAX does not fit the universe"
        );
        let u_lambda = t.phi[num_buckets as usize] + 1;
        let u_psi = t.chi[num_buckets as usize] + 1;
        let (l_lambda, l_psi) = widths(u_lambda, u_psi, num_buckets);

        let width = (l_lambda + l_psi) as u64;
        let mut lower = vec![0u64; ((num_buckets + 1) * width).div_ceil(64) as usize + 1];
        for i in 0..=num_buckets as usize {
            let pos = i as u64 * width;
            put_bits(&mut lower, pos, t.phi[i] & low_mask(l_lambda), l_lambda);
            put_bits(&mut lower, pos + l_lambda as u64, t.chi[i] & low_mask(l_psi), l_psi);
        }

        let bits_lambda = upper_bits(u_lambda, l_lambda, num_buckets).expect("u_λ >> l_λ is below 2^64 − B");
        let bits_psi = upper_bits(u_psi, l_psi, num_buckets).expect("upper ψ length overflows u64");
        let (upper_lambda, samples_lambda) = build_upper(&t.phi, l_lambda, bits_lambda, num_buckets);
        let (upper_psi, samples_psi) = build_upper(&t.chi, l_psi, bits_psi, num_buckets);

        let log2_jump = (LOG2_JUMP_MIN..=LOG2_JUMP_MAX)
            .rev()
            .find(|&j| offsets_fit(&samples_lambda, j) && offsets_fit(&samples_psi, j))
            .expect("offsets are all 0 at the smallest jump span");
        let per_entry = 1usize << (log2_jump - LOG2_SAMPLE);
        let ew = entry_words(log2_jump) as usize;
        let mut jump = vec![0u64; num_entries(num_buckets, log2_jump) as usize * ew];
        for (e, (cl, cp)) in samples_lambda
            .chunks(per_entry)
            .zip(samples_psi.chunks(per_entry))
            .enumerate()
        {
            let entry = &mut jump[e * ew..(e + 1) * ew];
            entry[0] = cl[0];
            entry[1] = cp[0];
            for (j, (&pl, &pp)) in cl.iter().zip(cp).enumerate() {
                let pair = (pl - cl[0]) | (pp - cp[0]) << 16;
                entry[2 + j / 2] |= pair << (32 * (j % 2));
            }
        }

        DoubleEliasFano {
            num_buckets,
            l_lambda,
            l_psi,
            delta_lambda: t.delta_lambda,
            delta_psi: t.delta_psi as i64 as u64,
            beta: t.beta,
            u_lambda,
            u_psi,
            log2_jump,
            lower: Words::from(lower),
            upper_lambda: Words::from(upper_lambda),
            upper_psi: Words::from(upper_psi),
            jump: Words::from(jump),
        }
    }

    /// Number of buckets B.
    pub fn num_buckets(&self) -> u64 {
        self.num_buckets
    }

    /// `(λ_i, λ_{i+1}, σ_i)` for `i < B`.
    ///
    /// # Panics
    /// If `i ≥ B`.
    #[inline]
    pub fn get(&self, i: u64) -> (u64, u64, u64) {
        assert!(
            i < self.num_buckets,
            "Elias-Fano: bucket {i} out of range (B = {})",
            self.num_buckets
        );
        // SAFETY: i < B, checked just above.
        unsafe { self.get_unchecked(i) }
    }

    /// `(λ_i, λ_{i+1}, σ_i)` without the range check (spec §8.4).
    ///
    /// # Safety
    /// `i < B` ([`DoubleEliasFano::num_buckets`]). Then no read leaves the arrays, whatever their
    /// contents (see the module invariants).
    #[inline]
    pub unsafe fn get_unchecked(&self, i: u64) -> (u64, u64, u64) {
        debug_assert!(i < self.num_buckets);
        let (lower, upper_lambda, upper_psi, jump): (&[u64], &[u64], &[u64], &[u64]) =
            (&self.lower, &self.upper_lambda, &self.upper_psi, &self.jump);
        let (l_lambda, l_psi) = (self.l_lambda, self.l_psi);
        let width = (l_lambda + l_psi) as u64;

        // Step 1: one unaligned load with the low bits of φ_i, χ_i and φ_{i+1}.
        let bit = i * width;
        debug_assert!(bit / 8 + 8 <= lower.len() as u64 * 8);
        // SAFETY: i < B, so bit/8 ≤ B·width/8 and bit/8 + 8 ≤ 8·(⌈(B+1)·width/64⌉ + 1), the
        // lower array's length in bytes (checked by `new`/`read`); an unaligned read is allowed.
        let raw = unsafe {
            (lower.as_ptr() as *const u8)
                .add((bit / 8) as usize)
                .cast::<u64>()
                .read_unaligned()
        };
        let raw = u64::from_le(raw) >> (bit % 8);
        let low_phi = raw & low_mask(l_lambda);
        let low_chi = (raw >> l_lambda) & low_mask(l_psi);
        let low_phi_next = (raw >> width) & low_mask(l_lambda);

        // Step 2: the sampled ones of rank i & !255 in both arrays.
        let ew = entry_words(self.log2_jump) as usize;
        let base = (i >> self.log2_jump) as usize * ew;
        let pair_idx = ((i >> LOG2_SAMPLE) & ((1 << (self.log2_jump - LOG2_SAMPLE)) - 1)) as usize;
        debug_assert!(base + ew <= jump.len());
        // SAFETY: i < B gives i >> J < ⌈B/2^J⌉ entries, so base + ew ≤ jump.len() (checked by
        // `new`/`read`), and 2 + pair_idx/2 < ew.
        let (abs_lambda, abs_psi, pair) = unsafe {
            (
                *jump.get_unchecked(base),
                *jump.get_unchecked(base + 1),
                *jump.get_unchecked(base + 2 + pair_idx / 2) >> (32 * (pair_idx % 2)),
            )
        };
        let start_lambda = abs_lambda.wrapping_add(pair & 0xFFFF);
        let start_psi = abs_psi.wrapping_add((pair >> 16) & 0xFFFF);

        // Step 3: popcount scan and select in each array.
        let rank = i & ((1 << LOG2_SAMPLE) - 1);
        // SAFETY: every sampled position (absolute plus offset) lies inside its upper array
        // (checked by `new`/`read`).
        let (idx_l, word_l, bit_l) = unsafe { select_from(upper_lambda, start_lambda, rank) };
        // SAFETY: as above.
        let (idx_p, _, bit_p) = unsafe { select_from(upper_psi, start_psi, rank) };
        let pos_lambda = idx_l as u64 * 64 + bit_l as u64;
        let pos_psi = idx_p as u64 * 64 + bit_p as u64;

        // Steps 4–6 (wrapping: a corrupt file yields garbage, never an overflow panic).
        let lambda = (pos_lambda.wrapping_sub(i) << l_lambda | low_phi).wrapping_add(i.wrapping_mul(self.delta_lambda));
        let pos_next = next_one(upper_lambda, idx_l, word_l, bit_l);
        let j = i + 1;
        let lambda_next =
            (pos_next.wrapping_sub(j) << l_lambda | low_phi_next).wrapping_add(j.wrapping_mul(self.delta_lambda));
        let sigma = (pos_psi.wrapping_sub(i) << l_psi | low_chi)
            .wrapping_add(i.wrapping_mul(self.delta_psi))
            .wrapping_add(predict(self.beta, lambda));
        (lambda, lambda_next, sigma)
    }

    /// Prefetches the lower-bits word and the jump entry that `get(i)` reads first. A hint only:
    /// any `i` is allowed.
    #[inline]
    pub fn prefetch(&self, i: u64) {
        let bit = i.wrapping_mul((self.l_lambda + self.l_psi) as u64);
        prefetch((self.lower.as_ptr() as *const u8).wrapping_add((bit / 8) as usize));
        let base = (i >> self.log2_jump) as usize * entry_words(self.log2_jump) as usize;
        let pair_idx = ((i >> LOG2_SAMPLE) & ((1 << (self.log2_jump - LOG2_SAMPLE)) - 1)) as usize;
        prefetch(self.jump.as_ptr().wrapping_add(base));
        prefetch(self.jump.as_ptr().wrapping_add(base + 2 + pair_idx / 2));
    }

    /// Second prefetch stage for `get(i)`: reads the jump entry (prefetched by
    /// [`DoubleEliasFano::prefetch`] some time before) and prefetches the upper-array lines the
    /// two selects will scan: the sampled one's line and the line about `2·rank` bits after it
    /// (an upper array has about as many zeros as ones). A hint only: any `i` is allowed.
    #[inline]
    pub fn prefetch_upper(&self, i: u64) {
        let ew = entry_words(self.log2_jump) as usize;
        let base = (i >> self.log2_jump) as usize * ew;
        let pair_idx = ((i >> LOG2_SAMPLE) & ((1 << (self.log2_jump - LOG2_SAMPLE)) - 1)) as usize;
        let (Some(&abs_lambda), Some(&abs_psi), Some(&pair)) = (
            self.jump.get(base),
            self.jump.get(base + 1),
            self.jump.get(base + 2 + pair_idx / 2),
        ) else {
            return;
        };
        let pair = pair >> (32 * (pair_idx % 2));
        let rank = i & ((1 << LOG2_SAMPLE) - 1);
        let start_lambda = abs_lambda.wrapping_add(pair & 0xFFFF);
        let start_psi = abs_psi.wrapping_add((pair >> 16) & 0xFFFF);
        for (words, start) in [(&self.upper_lambda, start_lambda), (&self.upper_psi, start_psi)] {
            let first = (start / 64) as usize;
            prefetch(words.as_ptr().wrapping_add(first));
            prefetch(words.as_ptr().wrapping_add(((start + 2 * rank + 64) / 64) as usize));
        }
    }

    /// Size in bits as stored: the four arrays plus the header words written by
    /// [`DoubleEliasFano::write`].
    pub fn size_bits(&self) -> u64 {
        let words = self.lower.len() + self.upper_lambda.len() + self.upper_psi.len() + self.jump.len();
        (words as u64 + HEADER_WORDS) * 64
    }

    /// Serializes: B, l_λ, l_ψ, δ_λ, δ_ψ, β, u_λ, u_ψ, J, then each array (lower, upper_λ,
    /// upper_ψ, jump) as its length in words followed by its words.
    pub fn write(&self, w: &mut WordWriter) {
        for v in [
            self.num_buckets,
            self.l_lambda as u64,
            self.l_psi as u64,
            self.delta_lambda,
            self.delta_psi,
            self.beta,
            self.u_lambda,
            self.u_psi,
            self.log2_jump as u64,
        ] {
            w.u64(v);
        }
        for a in [&self.lower, &self.upper_lambda, &self.upper_psi, &self.jump] {
            w.u64(a.len() as u64);
            w.words(a);
        }
    }

    /// Deserializes without copying the arrays, validating every field and length (see the
    /// module invariants) and every sampled position.
    ///
    /// # Errors
    /// [`MphfError::Format`] when the data is truncated or inconsistent.
    pub fn read(r: &mut WordReader) -> Result<Self> {
        let err = |msg: String| MphfError::Format(format!("Elias-Fano: {msg}"));
        let num_buckets = r.bounded("Elias-Fano bucket count", MAX_BUCKETS)?;
        let l_lambda = r.bounded("Elias-Fano λ low width", MAX_LOW_BITS as u64 + 1)? as u32;
        let l_psi = r.bounded("Elias-Fano ψ low width", MAX_LOW_BITS as u64 + 1)? as u32;
        let delta_lambda = r.u64("Elias-Fano δ_λ")?;
        let delta_psi = r.u64("Elias-Fano δ_ψ")?;
        let beta = r.u64("Elias-Fano β")?;
        let u_lambda = r.u64("Elias-Fano u_λ")?;
        let u_psi = r.u64("Elias-Fano u_ψ")?;
        let log2_jump = r.u64("Elias-Fano jump span")?;
        if 2 * l_lambda + l_psi > MAX_LOW_BITS {
            return Err(err(format!(
                "low widths {l_lambda} and {l_psi} exceed {MAX_LOW_BITS} bits"
            )));
        }
        if u_lambda == 0 || u_psi == 0 {
            return Err(err(format!("empty universe (u_λ = {u_lambda}, u_ψ = {u_psi})")));
        }
        if (l_lambda, l_psi) != widths(u_lambda, u_psi, num_buckets) {
            return Err(err(format!(
                "low widths {l_lambda}, {l_psi} do not match the universes"
            )));
        }
        if !(LOG2_JUMP_MIN as u64..=LOG2_JUMP_MAX as u64).contains(&log2_jump) {
            return Err(err(format!("jump span 2^{log2_jump} out of range")));
        }
        let log2_jump = log2_jump as u32;
        let bits_lambda =
            upper_bits(u_lambda, l_lambda, num_buckets).ok_or_else(|| err("upper λ length overflows".into()))?;
        let bits_psi = upper_bits(u_psi, l_psi, num_buckets).ok_or_else(|| err("upper ψ length overflows".into()))?;
        // B < 2^48 and width ≤ 56, so these products cannot overflow.
        let expected = [
            (
                "lower bits",
                ((num_buckets + 1) * (l_lambda + l_psi) as u64).div_ceil(64) + 1,
            ),
            ("upper λ", bits_lambda.div_ceil(64)),
            ("upper ψ", bits_psi.div_ceil(64)),
            (
                "jump table",
                num_entries(num_buckets, log2_jump) * entry_words(log2_jump),
            ),
        ];
        let mut arrays = Vec::with_capacity(4);
        for (what, len) in expected {
            let stored = r.u64(what)?;
            if stored != len {
                return Err(err(format!("{what} has {stored} words, expected {len}")));
            }
            arrays.push(r.words(len, what)?);
        }
        let [lower, upper_lambda, upper_psi, jump] = <[Words; 4]>::try_from(arrays).expect("four arrays");

        // Every sampled position must lie inside its array (the scans start there).
        let per_entry = 1u64 << (log2_jump - LOG2_SAMPLE);
        let ew = entry_words(log2_jump) as usize;
        for (e, entry) in jump.chunks_exact(ew).enumerate() {
            let first_rank = (e as u64) << log2_jump;
            let pairs = per_entry.min((num_buckets - first_rank).div_ceil(1 << LOG2_SAMPLE));
            for j in 0..pairs as usize {
                let pair = entry[2 + j / 2] >> (32 * (j % 2));
                let pl = entry[0].checked_add(pair & 0xFFFF);
                let pp = entry[1].checked_add((pair >> 16) & 0xFFFF);
                if pl.is_none_or(|p| p >= bits_lambda) || pp.is_none_or(|p| p >= bits_psi) {
                    return Err(err(format!(
                        "jump entry {e}, sample {j} points outside the upper arrays"
                    )));
                }
            }
        }
        Ok(DoubleEliasFano {
            num_buckets,
            l_lambda,
            l_psi,
            delta_lambda,
            delta_psi,
            beta,
            u_lambda,
            u_psi,
            log2_jump,
            lower,
            upper_lambda,
            upper_psi,
            jump,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::hash::mix64;

    /// A seeded splitmix-style generator.
    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
            mix64(self.0)
        }
        fn below(&mut self, m: u64) -> u64 {
            ((self.next() as u128 * m as u128) >> 64) as u64
        }
    }

    /// Bucket sizes of `n` keys thrown uniformly into `b` buckets (multinomial, Poisson-like).
    fn bucket_sizes(rng: &mut Rng, b: usize, n: u64) -> Vec<u64> {
        let mut sizes = vec![0u64; b];
        for _ in 0..n {
            sizes[rng.below(b as u64) as usize] += 1;
        }
        sizes
    }

    /// Prefix sums with a leading 0.
    fn cumulative(incr: &[u64]) -> Vec<u64> {
        let mut out = Vec::with_capacity(incr.len() + 1);
        out.push(0u64);
        for &d in incr {
            out.push(out.last().unwrap() + d);
        }
        out
    }

    /// Positions of the one-bits of an upper array.
    fn ones(words: &[u64]) -> Vec<u64> {
        (0..words.len() as u64 * 64)
            .filter(|&p| words[(p / 64) as usize] >> (p % 64) & 1 == 1)
            .collect()
    }

    /// Checks `get(i)` for every bucket against the input sequences.
    fn check_all(ef: &DoubleEliasFano, lambda: &[u64], sigma: &[u64]) {
        assert_eq!(ef.num_buckets(), lambda.len() as u64 - 1);
        for i in 0..ef.num_buckets() {
            let got = ef.get(i);
            let want = (lambda[i as usize], lambda[i as usize + 1], sigma[i as usize]);
            assert_eq!(got, want, "bucket {i} of {}", ef.num_buckets());
        }
    }

    fn round_trip_bytes(ef: &DoubleEliasFano) -> DoubleEliasFano {
        let mut w = WordWriter::new();
        ef.write(&mut w);
        let len = w.out.len();
        let words = Words::from_bytes(&w.into_bytes()).unwrap();
        let mut r = WordReader::new(&words);
        let back = DoubleEliasFano::read(&mut r).unwrap();
        assert_eq!(r.position(), len, "read consumes exactly what write wrote");
        back
    }

    #[test]
    fn worked_example() {
        // Spec §8.5.
        let lambda = [0, 3, 8, 10, 14];
        let sigma = [0, 9, 22, 27, 40];
        let t = Transform::new(&lambda, &sigma);
        assert_eq!(t.beta, 2995931);
        let psi: Vec<i128> = (0..5)
            .map(|i| sigma[i] as i128 - predict(t.beta, lambda[i]) as i128)
            .collect();
        assert_eq!(psi, [0, 1, 0, -1, 1]);
        assert_eq!((t.delta_lambda, t.delta_psi), (2, -1));
        assert_eq!(t.phi, [0, 1, 4, 4, 6]);
        assert_eq!(t.chi, [0, 2, 2, 2, 5]);

        let ef = DoubleEliasFano::new(&lambda, &sigma);
        assert_eq!((ef.u_lambda, ef.u_psi), (7, 6));
        assert_eq!((ef.l_lambda, ef.l_psi), (0, 0));
        assert_eq!(ef.delta_psi as i64, -1);
        assert_eq!(ones(&ef.upper_lambda), [0, 2, 6, 7, 10]);
        assert_eq!(ones(&ef.upper_psi), [0, 3, 4, 5, 9]);
        assert_eq!(ef.get(2), (8, 10, 22));
        check_all(&ef, &lambda, &sigma);
        check_all(&round_trip_bytes(&ef), &lambda, &sigma);
    }

    #[test]
    fn single_bucket_and_zero_sigma() {
        // n = 0 and n = 1 (B = 1, σ all 0), a lone bucket with a large code, and B = 2.
        for (lambda, sigma) in [
            (vec![0, 0], vec![0, 0]),
            (vec![0, 1], vec![0, 0]),
            (vec![0, 2999], vec![0, 1 << 40]),
            (vec![0, 0], vec![0, 1 << 40]),
            (vec![0, 0, 0], vec![0, 0, 1 << 40]),
            (vec![0, 5, 5], vec![0, 0, 0]),
        ] {
            let ef = DoubleEliasFano::new(&lambda, &sigma);
            check_all(&ef, &lambda, &sigma);
            let back = round_trip_bytes(&ef);
            assert_eq!(back, ef);
            check_all(&back, &lambda, &sigma);
        }
        // B = 0 is representable (no bucket can be queried).
        let ef = DoubleEliasFano::new(&[0], &[0]);
        assert_eq!(ef.num_buckets(), 0);
        assert_eq!(round_trip_bytes(&ef), ef);
    }

    #[test]
    #[should_panic(expected = "bucket 3 out of range (B = 3)")]
    fn get_checks_range() {
        DoubleEliasFano::new(&[0, 1, 2, 3], &[0, 4, 8, 9]).get(3);
    }

    #[test]
    #[should_panic(expected = "decreases at index 2")]
    fn new_rejects_decreasing_input() {
        DoubleEliasFano::new(&[0, 2, 1], &[0, 1, 2]);
    }

    /// σ increments of the given kind for the bucket sizes `sizes`.
    fn sigma_increments(rng: &mut Rng, sizes: &[u64], kind: usize) -> Vec<u64> {
        sizes
            .iter()
            .map(|&m| match kind {
                // Realistic: ~1.8 bits per key plus noise; buckets of 0/1 keys store nothing.
                0 if m <= 1 => 0,
                0 => m * 18 / 10 + rng.below(m / 4 + 8),
                // Irregular: mostly 0, sometimes huge (σ reaches ~2^40).
                1 => match rng.below(100) {
                    0 => rng.below(1 << 34),
                    1..=9 => rng.below(1 << 12),
                    _ => 0,
                },
                // Independent of the bucket size.
                2 => rng.below(400),
                // All zero.
                _ => 0,
            })
            .collect()
    }

    #[test]
    fn round_trip_random() {
        let mut rng = Rng(42);
        let bs = [
            1usize, 2, 3, 7, 255, 256, 257, 511, 1000, 16383, 16384, 16385, 40000, 200000,
        ];
        let means = [0u64, 1, 7, 100, 2000];
        for (t, &b) in bs.iter().enumerate() {
            for (k, &mean) in means.iter().enumerate() {
                // Keep the total work moderate: big B only with small means.
                if b >= 40000 && mean > 100 || b == 200000 && mean > 7 {
                    continue;
                }
                let kind = (t + k) % 4;
                let sizes = bucket_sizes(&mut rng, b, b as u64 * mean);
                let sigma = cumulative(&sigma_increments(&mut rng, &sizes, kind));
                let lambda = cumulative(&sizes);
                let ef = DoubleEliasFano::new(&lambda, &sigma);
                check_all(&ef, &lambda, &sigma);
            }
        }
    }

    #[test]
    fn round_trip_sampling_boundaries() {
        // Long runs of empty buckets and of equal σ around the 256 and 2^14 sampling boundaries,
        // so that many ones share a word and scans cross several words.
        let mut rng = Rng(7);
        let b = 3 * (1 << 14) + 300;
        let sizes: Vec<u64> = (0..b)
            .map(|i| {
                let r = i % (1 << 14);
                if (200..300).contains(&(i % 256)) || (16000..16384).contains(&r) {
                    0
                } else {
                    rng.below(200)
                }
            })
            .collect();
        for kind in 0..4 {
            let sigma = cumulative(&sigma_increments(&mut rng, &sizes, kind));
            let lambda = cumulative(&sizes);
            let ef = DoubleEliasFano::new(&lambda, &sigma);
            check_all(&ef, &lambda, &sigma);
            check_all(&round_trip_bytes(&ef), &lambda, &sigma);
        }
    }

    #[test]
    fn jump_span_falls_back_when_offsets_overflow() {
        // One giant σ jump in the middle of 2^17 buckets: l_ψ becomes large, and the upper ψ
        // gap at the jump (≈ 2^18 bits) does not fit a u16 offset unless J = 8.
        let b = 1usize << 17;
        let mut rng = Rng(3);
        let sizes = bucket_sizes(&mut rng, b, b as u64 * 5);
        let mut incr: Vec<u64> = sizes.iter().map(|&m| 2 * m).collect();
        incr[100_000] = 1 << 40;
        let (lambda, sigma) = (cumulative(&sizes), cumulative(&incr));
        let ef = DoubleEliasFano::new(&lambda, &sigma);
        assert_eq!(ef.log2_jump, LOG2_JUMP_MIN);
        check_all(&ef, &lambda, &sigma);
        check_all(&round_trip_bytes(&ef), &lambda, &sigma);
        // Regular data keeps the full span.
        let regular = DoubleEliasFano::new(&lambda, &cumulative(&sizes.iter().map(|&m| 2 * m).collect::<Vec<_>>()));
        assert_eq!(regular.log2_jump, LOG2_JUMP_MAX);
    }

    #[test]
    fn write_read_round_trip() {
        let mut rng = Rng(11);
        let sizes = bucket_sizes(&mut rng, 50_000, 50_000 * 30);
        let sigma = cumulative(&sigma_increments(&mut rng, &sizes, 0));
        let lambda = cumulative(&sizes);
        let ef = DoubleEliasFano::new(&lambda, &sigma);
        let mut w = WordWriter::new();
        ef.write(&mut w);
        w.u64(0xDEAD); // trailing data must be left for the next reader
        let bytes = w.into_bytes();
        let words = Words::from_bytes(&bytes).unwrap();
        let mut r = WordReader::new(&words);
        let back = DoubleEliasFano::read(&mut r).unwrap();
        assert_eq!(r.u64("trailer").unwrap(), 0xDEAD);
        assert_eq!(back, ef);
        assert_eq!(back.size_bits(), ef.size_bits());
        assert_eq!(back.size_bits(), (bytes.len() as u64 - 8) * 8);
        let mut again = WordWriter::new();
        back.write(&mut again);
        again.u64(0xDEAD);
        assert_eq!(again.into_bytes(), bytes);
        check_all(&back, &lambda, &sigma);
        for i in (0..50_000).step_by(97) {
            back.prefetch(i);
        }
        back.prefetch(u64::MAX); // a hint: never faults
    }

    /// Serialized words of a small structure spanning two jump entries.
    fn sample_words() -> (Vec<u64>, Vec<u64>, Vec<u64>) {
        let mut rng = Rng(5);
        let sizes = bucket_sizes(&mut rng, 20_000, 20_000 * 10);
        let sigma = cumulative(&sigma_increments(&mut rng, &sizes, 0));
        let lambda = cumulative(&sizes);
        let mut w = WordWriter::new();
        DoubleEliasFano::new(&lambda, &sigma).write(&mut w);
        (w.out, lambda, sigma)
    }

    fn read_words(words: Vec<u64>) -> Result<DoubleEliasFano> {
        let words = Words::from(words);
        DoubleEliasFano::read(&mut WordReader::new(&words))
    }

    #[test]
    fn read_rejects_truncation() {
        let (words, ..) = sample_words();
        for len in (0..words.len()).step_by(61).chain(words.len() - 3..words.len()) {
            let e = read_words(words[..len].to_vec()).unwrap_err();
            assert!(matches!(e, MphfError::Format(_)), "{e}");
        }
    }

    #[test]
    fn read_rejects_corrupt_headers() {
        let (words, lambda, sigma) = sample_words();
        check_all(&read_words(words.clone()).unwrap(), &lambda, &sigma);
        let lower_len = words[9] as usize;
        let upper_len = words[10 + lower_len] as usize;
        let jump_at = 10 + lower_len + 1 + upper_len + 1 + words[11 + lower_len + upper_len] as usize + 1;
        let cases: Vec<(usize, u64, &str)> = vec![
            (0, MAX_BUCKETS, "bucket count"),
            (0, words[0] * 3, ""),
            (1, 57, "λ low width"),
            (2, 56, "exceed 56 bits"),
            (2, words[2] + 1, "do not match the universes"),
            (6, 0, "empty universe"),
            (7, u64::MAX, "do not match the universes"),
            (8, 7, "jump span"),
            (8, 15, "jump span"),
            (8, 13, "jump table has"),
            (9, words[9] - 1, "lower bits has"),
            (10 + lower_len, words[10 + lower_len] + 1, "upper λ has"),
            (jump_at, 1 << 40, "points outside"),
            (jump_at + 1, u64::MAX, "points outside"),
            (jump_at + 2, u64::MAX, "points outside"),
        ];
        for (at, value, msg) in cases {
            let mut bad = words.clone();
            bad[at] = value;
            let e = read_words(bad).unwrap_err();
            assert!(
                matches!(&e, MphfError::Format(m) if m.contains(msg)),
                "word {at} = {value}: {e}"
            );
        }
    }

    #[test]
    fn corrupt_contents_never_read_out_of_bounds() {
        // Random word corruption: `read` either fails or yields a structure on which every
        // `get(i < B)` returns (garbage, but) without a panic or an out-of-bounds access (the
        // debug assertions in the unchecked path check the indices).
        let (words, ..) = sample_words();
        let mut rng = Rng(9);
        for round in 0..300 {
            let mut bad = words.clone();
            for _ in 0..1 + round % 4 {
                let at = rng.below(bad.len() as u64) as usize;
                bad[at] = match rng.below(3) {
                    0 => rng.next(),
                    1 => 0,
                    _ => bad[at] ^ (1 << rng.below(64)),
                };
            }
            // Wipe whole upper words sometimes, so scans run off the end.
            if round % 5 == 0 {
                let from = 11 + words[9] as usize;
                let len = words[from - 1] as usize;
                bad[from..from + len].fill(0);
            }
            if let Ok(ef) = read_words(bad) {
                for i in 0..ef.num_buckets() {
                    std::hint::black_box(ef.get(i));
                }
            }
        }
    }

    #[test]
    fn space_poisson_100() {
        // B = 10^5 buckets of Poisson(100) keys, ≈ 180 Rice bits per bucket.
        let b = 100_000usize;
        let mut rng = Rng(1);
        let sizes = bucket_sizes(&mut rng, b, b as u64 * 100);
        let lambda = cumulative(&sizes);
        for (kind, incr) in [
            (
                "σ ≈ 1.8·m ± noise",
                sizes.iter().map(|&m| m * 18 / 10 + rng.below(16)).collect::<Vec<_>>(),
            ),
            (
                "σ ≈ 180 ± 20 independent",
                (0..b).map(|_| 160 + rng.below(41)).collect(),
            ),
        ] {
            let sigma = cumulative(&incr);
            let ef = DoubleEliasFano::new(&lambda, &sigma);
            check_all(&ef, &lambda, &sigma);
            let per_bucket = ef.size_bits() as f64 / b as f64;
            eprintln!(
                "EF space, B = {b}, Poisson(100), {kind}: {per_bucket:.2} bits/bucket (l_λ = {}, l_ψ = {}, J = {})",
                ef.l_lambda, ef.l_psi, ef.log2_jump
            );
            assert!(per_bucket < 2.0 * 100f64.log2() + 6.0, "{per_bucket} bits per bucket");
        }
    }
}
