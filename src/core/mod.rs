//! The RecSplit MPHF core: build on all cores with rayon, query one key or a batch.
//!
//! No DataFusion and no CUDA types live here (layers import downward: core ← gpu ← datafusion
//! ← cli). Everything follows `docs/recsplit.md` (cited as "spec §N"):
//!
//! - keys → 128-bit hashes `(hi, lo)` ([`hash`], spec §2);
//! - `hi` → one of `B = ⌈n/b⌉` buckets; each bucket gets a splitting tree ([`tree`], spec §3)
//!   whose nodes store the first hash index that splits / bijects their keys ([`build`], §5–6);
//! - indices are Golomb–Rice coded ([`memo`], [`rice`], §7), bucket offsets go into a double
//!   Elias–Fano ([`elias_fano`], §8);
//! - a query recomputes the tree shape from the bucket size and walks it, skipping subtrees
//!   ([`query`], §9).
//!
//! Invariants: the bytes of an MPHF depend only on the key set and the parameters — not on
//! thread count, input order, or CPU vs GPU (spec §10.7); every parallel search returns the
//! smallest valid index (§5.4).
//!
//! References: Esposito, Müller Graf, Vigna, *RecSplit* (ALENEX 2020, arXiv 1910.06416);
//! Bez, Kurpicz, Sanders, *High Performance Construction of RecSplit Based Minimal Perfect Hash
//! Functions* (ESA 2023, arXiv 2212.09562).

pub mod bits;
pub mod build;
pub mod column;
pub mod elias_fano;
pub mod flat;
pub mod hash;
pub mod memo;
pub mod mphf;
pub mod params;
pub mod partitioned;
pub mod query;
pub mod rice;
pub mod tree;
pub mod words;

pub use build::{BucketSolver, Builder, KeySet};
pub use hash::{Hash128, Key, KeyHashKind};
pub use mphf::Mphf;
pub use params::Params;
