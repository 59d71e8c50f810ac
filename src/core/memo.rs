//! Golomb–Rice memo tables (spec §7.2–7.3): for every subtree size `m < 3000`, the Rice
//! parameter τ of its root, the number of stored descriptors, and the total fixed-part bits.
//!
//! - Leaves use the exact success probability `m!/m^m` (the `bij_tau` table).
//! - Splits use Stirling's approximation `√m / ((2π)^{(s−1)/2} · ∏√k_i)`, as Sux and GpuRecSplit
//!   do, so that the tables (and thus the bytes of every MPHF) match theirs.
//! - `skip[m]` lets a query jump over a whole subtree's fixed bits; `nodes[m]` is how many
//!   unary terminators (one-bits) the subtree owns (spec §7.5).
//!
//! Tables are three plain arrays (u8, u16, u16): Sux's packed u32 overflows for ℓ = 2.
//! They are computed once per ℓ and cached for the process.

use std::sync::OnceLock;

use super::params::{MAX_BUCKET_KEYS, MAX_LEAF};
use super::tree;

/// Golomb–Rice parameter of a leaf of `m` keys, `m = 0..=24` (spec §7.2).
pub const BIJ_TAU: [u8; MAX_LEAF + 1] = [
    0, 0, 0, 1, 3, 4, 5, 7, 8, 10, 11, 12, 14, 15, 16, 18, 19, 21, 22, 23, 25, 26, 28, 29, 30,
];

/// Optimal Golomb–Rice parameter for a geometric distribution of success probability `p`:
/// `max(0, ⌈log2(−ln φ / ln(1 − p))⌉)`.
pub fn golomb_param(p: f64) -> u8 {
    let phi = (5f64.sqrt() + 1.0) / 2.0;
    let v = (-(phi.ln()) / (-p).ln_1p()).log2().ceil();
    if v.is_nan() || v <= 0.0 {
        0
    } else {
        v as u8
    }
}

/// The memo tables for one leaf size.
#[derive(Debug, PartialEq, Eq)]
pub struct Memo {
    /// Leaf size ℓ these tables are for.
    pub leaf: usize,
    /// Rice parameter of a subtree root of `m` keys.
    pub tau: Vec<u8>,
    /// Descriptors stored in a subtree of `m` keys (= unary one-bits it owns).
    pub nodes: Vec<u16>,
    /// Fixed-part bits of a subtree of `m` keys.
    pub skip: Vec<u16>,
}

impl Memo {
    fn compute(leaf: usize) -> Memo {
        let mut tau = vec![0u8; MAX_BUCKET_KEYS];
        let mut nodes = vec![0u16; MAX_BUCKET_KEYS];
        let mut skip = vec![0u16; MAX_BUCKET_KEYS];
        let mut parts = [0usize; 9];
        for m in 0..MAX_BUCKET_KEYS {
            if m <= leaf {
                tau[m] = BIJ_TAU[m];
                nodes[m] = (m >= 2) as u16;
                skip[m] = BIJ_TAU[m] as u16;
                continue;
            }
            let fanout = tree::children(m, leaf, &mut parts);
            let sqrt_prod: f64 = parts[..fanout].iter().map(|&k| (k as f64).sqrt()).product();
            let p = (m as f64).sqrt() / ((2.0 * std::f64::consts::PI).powf((fanout as f64 - 1.0) / 2.0) * sqrt_prod);
            tau[m] = golomb_param(p);
            let mut s = tau[m] as u32;
            let mut c = 1u32;
            for &k in &parts[..fanout] {
                s += skip[k] as u32;
                c += nodes[k] as u32;
            }
            skip[m] = u16::try_from(s).expect("skip fits u16 (max 4278, spec §7.3)");
            nodes[m] = u16::try_from(c).expect("nodes fits u16 (max 2998, spec §7.3)");
        }
        Memo { leaf, tau, nodes, skip }
    }

    /// The process-wide tables for leaf size `leaf` (computed on first use).
    ///
    /// # Panics
    /// If `leaf` is outside `2..=24`.
    pub fn get(leaf: usize) -> &'static Memo {
        static MEMOS: [OnceLock<Memo>; MAX_LEAF + 1] = [const { OnceLock::new() }; MAX_LEAF + 1];
        assert!(tree::leaf_supported(leaf), "leaf size {leaf} is outside 2..=24");
        MEMOS[leaf].get_or_init(|| Memo::compute(leaf))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bij_tau_matches_formula() {
        for m in 2..=24u32 {
            let p: f64 = (1..=m).map(|i| i as f64 / m as f64).product();
            assert_eq!(golomb_param(p), BIJ_TAU[m as usize], "m={m}");
        }
    }

    #[test]
    fn checked_values() {
        let rows: [(usize, usize, u8, u16, u16); 13] = [
            (8, 9, 0, 2, 8),
            (8, 16, 2, 3, 18),
            (8, 32, 7, 5, 39),
            (8, 90, 6, 16, 114),
            (8, 96, 6, 16, 123),
            (8, 97, 0, 17, 123),
            (8, 202, 2, 37, 261),
            (8, 2000, 5, 354, 2644),
            (16, 16, 19, 1, 19),
            (16, 17, 0, 2, 19),
            (16, 112, 18, 8, 151),
            (16, 560, 17, 41, 772),
            (16, 2000, 5, 150, 2770),
        ];
        for (leaf, m, tau, nodes, skip) in rows {
            let t = Memo::get(leaf);
            assert_eq!((t.tau[m], t.nodes[m], t.skip[m]), (tau, nodes, skip), "ℓ={leaf} m={m}");
        }
    }

    #[test]
    fn checksums() {
        let sums: [(u64, u64, u64); 23] = [
            (14151, 4495501, 1833764),
            (14148, 2997001, 3518195),
            (14151, 2247751, 5201131),
            (14135, 1498901, 5570301),
            (14142, 1249169, 5396398),
            (14188, 999912, 6017987),
            (14218, 797222, 5942125),
            (14222, 708786, 6280837),
            (14236, 638026, 6138177),
            (14725, 532874, 6104804),
            (14787, 488605, 6344368),
            (15082, 433970, 6219581),
            (15117, 403075, 6096386),
            (16189, 371523, 6348085),
            (17121, 339122, 6224538),
            (17326, 319231, 6386494),
            (17555, 301697, 6321683),
            (18817, 280012, 6216276),
            (21818, 264315, 6355677),
            (22292, 251844, 6292887),
            (24473, 236919, 6408043),
            (25065, 226720, 6345687),
            (25655, 217315, 6269150),
        ];
        for (i, &(st, sn, ss)) in sums.iter().enumerate() {
            let t = Memo::get(i + 2);
            let got = (
                t.tau.iter().map(|&v| v as u64).sum::<u64>(),
                t.nodes.iter().map(|&v| v as u64).sum::<u64>(),
                t.skip.iter().map(|&v| v as u64).sum::<u64>(),
            );
            assert_eq!(got, (st, sn, ss), "ℓ={}", i + 2);
            assert!(t.skip.iter().all(|&s| s <= 4278));
            assert!(t.nodes.iter().all(|&s| s <= 2998));
        }
    }

    #[test]
    fn approx_probabilities() {
        // (192, 10) → 1/p ≈ 7.73; (8,8,8,8) → 178.2 (spec §7.2).
        let p = |m: f64, ks: &[f64]| {
            m.sqrt()
                / ((2.0 * std::f64::consts::PI).powf((ks.len() as f64 - 1.0) / 2.0)
                    * ks.iter().map(|k| k.sqrt()).product::<f64>())
        };
        assert!((1.0 / p(202.0, &[192.0, 10.0]) - 7.73).abs() < 0.01);
        assert!((1.0 / p(32.0, &[8.0; 4]) - 178.2).abs() < 0.1);
    }
}
