//! The [`Mphf`] value: header fields, the Rice bit vector and the double Elias–Fano, with
//! size accounting and (de)serialization as one run of little-endian words (zero-copy loads).

use super::elias_fano::DoubleEliasFano;
use super::hash::KeyHashKind;
use super::memo::Memo;
use super::params::{Params, MAX_BUCKET, MAX_BUCKET_KEYS, MAX_LEAF, MIN_LEAF};
use super::rice::RiceBits;
use super::words::{WordReader, WordWriter, Words};
use crate::error::{MphfError, Result};

/// Variant flags recorded in the header (spec §0). Only one combination exists today; the
/// field makes a future variant an explicit format change rather than a silent misread.
pub const FLAGS_H32_FIXED3_ROUNDUP: u64 = 0x1;
const FLAG_ROTATION: u64 = 0x100;

/// A RecSplit minimal perfect hash function over `n` keys: each key maps to a distinct value
/// in `0..n`. Keys outside the build set map to an arbitrary value in `0..n` (or 0 when n = 0).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mphf {
    /// ℓ, b and rotation.
    pub(crate) params: Params,
    /// Number of keys.
    pub(crate) n: u64,
    /// Number of buckets B.
    pub(crate) num_buckets: u64,
    /// Seed of the key hash (the last one tried when the build had to re-seed).
    pub(crate) seed: u64,
    /// How keys are hashed.
    pub(crate) hash_kind: KeyHashKind,
    /// The Golomb–Rice codes of all buckets.
    pub(crate) rice: RiceBits,
    /// λ and σ per bucket.
    pub(crate) ef: DoubleEliasFano,
    /// Memo tables for ℓ (process-wide, not serialized).
    pub(crate) memo: &'static Memo,
}

impl Mphf {
    /// Assembles an MPHF from its parts (used by the builders).
    pub(crate) fn from_parts(
        params: Params,
        n: u64,
        seed: u64,
        hash_kind: KeyHashKind,
        rice: RiceBits,
        ef: DoubleEliasFano,
    ) -> Mphf {
        Mphf {
            params,
            n,
            num_buckets: ef.num_buckets(),
            seed,
            hash_kind,
            rice,
            ef,
            memo: Memo::get(params.leaf),
        }
    }

    /// Number of keys (and of output values).
    pub fn len(&self) -> u64 {
        self.n
    }
    /// True for an MPHF over no keys.
    pub fn is_empty(&self) -> bool {
        self.n == 0
    }
    /// The build parameters.
    pub fn params(&self) -> Params {
        self.params
    }
    /// The key-hash seed stored in the header.
    pub fn seed(&self) -> u64 {
        self.seed
    }
    /// How keys are hashed.
    pub fn hash_kind(&self) -> KeyHashKind {
        self.hash_kind
    }
    /// Number of buckets B.
    pub fn num_buckets(&self) -> u64 {
        self.num_buckets
    }
    /// Bits of the Rice vector (without padding).
    pub fn rice_bits(&self) -> u64 {
        self.rice.len
    }
    /// Size in bits of the structure as stored (header, R with padding, D).
    pub fn size_bits(&self) -> u64 {
        self.header_words() * 64 + self.rice.size_bits() + self.ef.size_bits()
    }
    /// Bits per key of the MPHF (0 for n = 0): R's code bits plus D, as in spec §11.
    pub fn bits_per_key(&self) -> f64 {
        if self.n == 0 {
            0.0
        } else {
            (self.rice.len + self.ef.size_bits()) as f64 / self.n as f64
        }
    }
    fn header_words(&self) -> u64 {
        8
    }

    /// Serializes into `w` (little-endian words, see [`Mphf::read`]).
    pub fn write(&self, w: &mut WordWriter) {
        let mut flags = FLAGS_H32_FIXED3_ROUNDUP;
        if self.params.rotation {
            flags |= FLAG_ROTATION;
        }
        w.u64(self.n);
        w.u64(self.num_buckets);
        w.u64(self.params.leaf as u64);
        w.u64(self.params.bucket as u64);
        w.u64(flags);
        w.u64(self.seed);
        w.u64(self.hash_kind as u64);
        w.u64(self.rice.len);
        w.u64(self.rice.words.len() as u64);
        w.words(&self.rice.words);
        self.ef.write(w);
    }

    /// The serialized form as bytes.
    pub fn write_bytes(&self) -> Vec<u8> {
        let mut w = WordWriter::new();
        self.write(&mut w);
        w.into_bytes()
    }

    /// Reads an MPHF written by [`Mphf::write`], borrowing its arrays from the reader's words.
    ///
    /// # Errors
    /// [`MphfError::Format`] for truncated data, unknown flags or inconsistent fields.
    pub fn read(r: &mut WordReader) -> Result<Mphf> {
        let n = r.u64("key count")?;
        let num_buckets = r.u64("bucket count")?;
        let leaf = r.u64("leaf size")?;
        let bucket = r.u64("bucket size")?;
        let flags = r.u64("flags")?;
        let seed = r.u64("seed")?;
        let kind = r.u64("hash kind")?;
        let rice_len = r.u64("rice length")?;
        let rice_words = r.u64("rice word count")?;
        if !(MIN_LEAF as u64..=MAX_LEAF as u64).contains(&leaf) || !(1..=MAX_BUCKET as u64).contains(&bucket) {
            return Err(MphfError::Format(format!(
                "parameters out of range: leaf {leaf}, bucket {bucket}"
            )));
        }
        if flags & !FLAG_ROTATION != FLAGS_H32_FIXED3_ROUNDUP {
            return Err(MphfError::Format(format!("unknown variant flags {flags:#x}")));
        }
        let hash_kind = u32::try_from(kind)
            .ok()
            .and_then(KeyHashKind::from_tag)
            .ok_or_else(|| MphfError::Format(format!("unknown key hash kind {kind}")))?;
        let params = Params {
            leaf: leaf as usize,
            bucket: bucket as usize,
            rotation: flags & FLAG_ROTATION != 0,
        };
        if num_buckets != params.num_buckets(n) {
            return Err(MphfError::Format(format!(
                "bucket count {num_buckets} does not match {n} keys at b = {bucket}"
            )));
        }
        if rice_words != rice_len / 64 + 2 && rice_words != rice_len.div_ceil(64) + 1 {
            return Err(MphfError::Format(format!(
                "rice vector of {rice_words} words cannot hold {rice_len} bits"
            )));
        }
        let words = r.words(rice_words, "rice vector")?;
        let rice = RiceBits { words, len: rice_len };
        let ef = DoubleEliasFano::read(r)?;
        if ef.num_buckets() != num_buckets {
            return Err(MphfError::Format(
                "Elias-Fano bucket count does not match the header".into(),
            ));
        }
        if num_buckets > 0 {
            let (_, total, _) = ef.get(num_buckets - 1);
            let (_, _, last_sigma) = ef.get(num_buckets - 1);
            if total != n || last_sigma > rice_len {
                return Err(MphfError::Format("Elias-Fano totals do not match the header".into()));
            }
        }
        let mphf = Mphf::from_parts(params, n, seed, hash_kind, rice, ef);
        mphf.check_buckets()?;
        Ok(mphf)
    }

    /// Checks every bucket's sizes and codes against each other, so that a query of any key
    /// stays inside the data (the query's reads are unchecked in the hot path):
    /// - bucket b's keys start where bucket b − 1's end (λ never decreases, from 0 to n), and
    ///   a bucket holds fewer than [`MAX_BUCKET_KEYS`] keys (the memo tables' size);
    /// - its codes start where the previous bucket's end (σ_0 = 0), its fixed parts take
    ///   `Memo::skip[m]` bits, then exactly `Memo::nodes[m]` unary codes follow, and the last
    ///   bucket's codes end at the vector's length.
    ///
    /// A query of a bucket reads at most its fixed bits and its unary codes (spec §7.5), so after
    /// this check every read of R lies inside R. It decodes each bucket's λ and σ once and
    /// counts the ones of R: linear in the buckets and in R's words, a small part of a load.
    ///
    /// # Errors
    /// [`MphfError::Format`] naming the first inconsistent bucket.
    fn check_buckets(&self) -> Result<()> {
        let err = |b: u64, what: String| MphfError::Format(format!("bucket {b}: {what}"));
        let (mut keys_end, mut codes_end) = (0u64, 0u64);
        for b in 0..self.num_buckets {
            let (first, next, sigma) = self.ef.get(b);
            if first != keys_end {
                return Err(err(
                    b,
                    format!("starts at key {first}, the previous bucket ends at {keys_end}"),
                ));
            }
            let size = next.checked_sub(first).filter(|&m| m < MAX_BUCKET_KEYS as u64);
            let Some(m) = size else {
                return Err(err(b, format!("impossible key range {first}..{next}")));
            };
            if sigma != codes_end {
                return Err(err(
                    b,
                    format!("codes start at bit {sigma}, the previous bucket's end at {codes_end}"),
                ));
            }
            let fixed_end = sigma + self.memo.skip[m as usize] as u64;
            let nodes = self.memo.nodes[m as usize] as u64;
            codes_end = self.rice.after_ones(fixed_end, nodes).ok_or_else(|| {
                err(
                    b,
                    format!("{m} keys need {nodes} unary codes after bit {fixed_end}, the vector has fewer"),
                )
            })?;
            keys_end = next;
        }
        if keys_end != self.n || codes_end != self.rice.len {
            return Err(MphfError::Format(format!(
                "the buckets hold {keys_end} keys and {codes_end} code bits, the header says {} and {}",
                self.n, self.rice.len
            )));
        }
        Ok(())
    }

    /// Reads an MPHF from bytes (copied into an aligned buffer).
    ///
    /// # Errors
    /// As [`Mphf::read`].
    pub fn read_bytes(bytes: &[u8]) -> Result<Mphf> {
        let words = Words::from_bytes(bytes)?;
        let mut r = WordReader::new(&words);
        Mphf::read(&mut r)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::build::Builder;
    use crate::core::hash::{Hash128, Key};

    /// Slots past 2^32 (issue 21): a synthetic MPHF of 2 147 484 buckets of 2000 keys
    /// (4 294 968 000 slots), every bucket sharing the descriptors of one real bucket (σ = 0
    /// for all; λ counts 2000 keys a bucket). The last bucket's slots run from 4 294 966 000 to
    /// 4 294 967 999, across 2^32. Querying it with the real bucket's in-bucket hashes must give
    /// exactly that range, one slot each: no step of the query (Elias–Fano, the tree walk, the
    /// offset add) may truncate to 32 bits. (The synthetic MPHF is for queries only: its shared
    /// codes are not a valid file, and `read_bytes` refuses them.)
    #[test]
    fn slots_cross_two_to_the_32() {
        const PER_BUCKET: u64 = 2000;
        const BUCKETS: u64 = 2_147_484;
        let params = Params::try_new(8, PER_BUCKET as usize, false).unwrap();
        let keys: Vec<u64> = (0..PER_BUCKET).map(|i| i * 7919 + 13).collect();
        let one = Builder::new(params).build(&keys[..]).unwrap();
        assert_eq!(one.num_buckets(), 1);

        let cum: Vec<u64> = (0..=BUCKETS).map(|i| i * PER_BUCKET).collect();
        let sigma = vec![0u64; cum.len()];
        let n = BUCKETS * PER_BUCKET;
        let big = Mphf::from_parts(
            params,
            n,
            one.seed,
            one.hash_kind,
            one.rice.clone(),
            DoubleEliasFano::new(&cum, &sigma),
        );
        assert!(n > 1 << 32);
        let base = (BUCKETS - 1) * PER_BUCKET;
        let last_bucket = |k: &u64| Hash128 {
            hi: u64::MAX,
            lo: k.hash128(one.seed).lo,
        };
        assert_eq!(big.len(), n);
        let mut slots: Vec<u64> = keys.iter().map(|k| big.index_hash(last_bucket(k))).collect();
        for (k, &s) in keys.iter().zip(&slots) {
            assert_eq!(s, base + one.index(k), "key {k}");
        }
        slots.sort_unstable();
        assert_eq!(slots, (base..base + PER_BUCKET).collect::<Vec<u64>>());
        assert!(slots[0] < 1 << 32 && *slots.last().unwrap() >= 1 << 32);
        assert!(Mphf::read_bytes(&big.write_bytes()).is_err());
    }
}
