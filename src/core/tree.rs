//! Splitting-tree shape (spec §3): which kind of node a subtree of `m` keys is, and its children.
//!
//! The shape depends only on `m` and ℓ, so it is never stored: builds, queries and the GPU all
//! recompute it. Units nest, ℓ | A1 | A2 | every high-level left child (spec §3.5), which is what
//! lets the GPU treat each level as consecutive fixed-size chunks.

use super::params::{MAX_LEAF, MIN_LEAF};

/// Fanout of first-level aggregation `s1` per ℓ (index = ℓ; spec §3.1 table).
const S1: [usize; MAX_LEAF + 1] = [
    0, 0, 2, 2, 2, 3, 3, 3, 4, 4, 4, 5, 5, 6, 6, 6, 7, 7, 7, 8, 8, 8, 9, 9, 9,
];
/// Fanout of second-level aggregation `s2` per ℓ (spec §3.1 table).
const S2: [usize; MAX_LEAF + 1] = [
    0, 0, 2, 2, 2, 2, 2, 3, 3, 3, 3, 4, 4, 4, 4, 5, 5, 5, 5, 5, 6, 6, 6, 6, 6,
];

/// First-aggregation unit `A1 = ℓ·s1` ("lower_aggr" in Sux).
#[inline(always)]
pub const fn lower_aggr(leaf: usize) -> usize {
    leaf * S1[leaf]
}

/// Second-aggregation unit `A2 = A1·s2` ("upper_aggr" in Sux).
#[inline(always)]
pub const fn upper_aggr(leaf: usize) -> usize {
    lower_aggr(leaf) * S2[leaf]
}

/// Size of the left child of a high-level node of `m > A2` keys (`RoundUp` rule, spec §3.2):
/// `A2 · ⌈⌊m/2⌋ / A2⌉`.
#[inline(always)]
pub const fn split_left(m: usize, a2: usize) -> usize {
    a2 * (m / 2).div_ceil(a2)
}

/// The kind of a subtree of `m` keys (spec §3.2).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NodeKind {
    /// `m ≤ 1`: nothing stored.
    Empty,
    /// `2 ≤ m ≤ ℓ`: one bijection descriptor.
    Leaf,
    /// `ℓ < m ≤ A1`: children of ℓ keys (the last may be smaller).
    Agg1 {
        /// Number of children `⌈m/ℓ⌉`.
        fanout: usize,
    },
    /// `A1 < m ≤ A2`: children of A1 keys (the last may be smaller).
    Agg2 {
        /// Number of children `⌈m/A1⌉`.
        fanout: usize,
    },
    /// `m > A2`: two children, the left of `left` keys.
    High {
        /// Keys of the left child, a positive multiple of A2.
        left: usize,
    },
}

/// Kind of a subtree of `m` keys with leaf size `leaf`.
#[inline]
pub const fn kind(m: usize, leaf: usize) -> NodeKind {
    let a1 = lower_aggr(leaf);
    let a2 = upper_aggr(leaf);
    if m <= 1 {
        NodeKind::Empty
    } else if m <= leaf {
        NodeKind::Leaf
    } else if m <= a1 {
        NodeKind::Agg1 {
            fanout: m.div_ceil(leaf),
        }
    } else if m <= a2 {
        NodeKind::Agg2 { fanout: m.div_ceil(a1) }
    } else {
        NodeKind::High {
            left: split_left(m, a2),
        }
    }
}

/// Child sizes of a node of `m > ℓ` keys, written into `out`; returns the fanout.
pub fn children(m: usize, leaf: usize, out: &mut [usize; 9]) -> usize {
    let (unit, fanout) = match kind(m, leaf) {
        NodeKind::Agg1 { fanout } => (leaf, fanout),
        NodeKind::Agg2 { fanout } => (lower_aggr(leaf), fanout),
        NodeKind::High { left } => {
            out[0] = left;
            out[1] = m - left;
            return 2;
        }
        NodeKind::Empty | NodeKind::Leaf => return 0,
    };
    for c in out.iter_mut().take(fanout - 1) {
        *c = unit;
    }
    out[fanout - 1] = m - (fanout - 1) * unit;
    fanout
}

/// Checks `leaf` is a supported leaf size (used by `debug_assert!`s).
pub const fn leaf_supported(leaf: usize) -> bool {
    leaf >= MIN_LEAF && leaf <= MAX_LEAF
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formulas_match_table() {
        const A1: [usize; 23] = [
            4, 6, 8, 15, 18, 21, 32, 36, 40, 55, 60, 78, 84, 90, 112, 119, 126, 152, 160, 168, 198, 207, 216,
        ];
        const A2: [usize; 23] = [
            8, 12, 16, 30, 36, 63, 96, 108, 120, 220, 240, 312, 336, 450, 560, 595, 630, 760, 960, 1008, 1188, 1242,
            1296,
        ];
        for leaf in 2..=24usize {
            let s1 = 2f64.max((0.35 * leaf as f64 + 0.5).ceil()) as usize;
            let s2 = if leaf < 7 {
                2
            } else {
                (0.21 * leaf as f64 + 0.9).ceil() as usize
            };
            assert_eq!(lower_aggr(leaf), leaf * s1, "ℓ={leaf}");
            assert_eq!(upper_aggr(leaf), leaf * s1 * s2, "ℓ={leaf}");
            assert_eq!(lower_aggr(leaf), A1[leaf - 2]);
            assert_eq!(upper_aggr(leaf), A2[leaf - 2]);
        }
    }

    #[test]
    fn worked_example_202() {
        // ℓ = 8: H202 → 192|10, H192 → 96|96, Agg2(96) → 32×3, Agg1(32) → 8×4, Agg1(10) → 8, 2.
        assert_eq!(kind(202, 8), NodeKind::High { left: 192 });
        assert_eq!(kind(192, 8), NodeKind::High { left: 96 });
        assert_eq!(kind(96, 8), NodeKind::Agg2 { fanout: 3 });
        assert_eq!(kind(32, 8), NodeKind::Agg1 { fanout: 4 });
        assert_eq!(kind(10, 8), NodeKind::Agg1 { fanout: 2 });
        let mut c = [0; 9];
        assert_eq!(children(10, 8, &mut c), 2);
        assert_eq!(&c[..2], &[8, 2]);
        assert_eq!(kind(1, 8), NodeKind::Empty);
        assert_eq!(kind(2, 8), NodeKind::Leaf);
    }

    #[test]
    fn split_rule_properties() {
        for leaf in 2..=24 {
            let a2 = upper_aggr(leaf);
            for m in a2 + 1..3000 {
                let l = split_left(m, a2);
                assert!(l > 0 && l.is_multiple_of(a2) && l < m, "ℓ={leaf} m={m}");
            }
        }
    }
}
