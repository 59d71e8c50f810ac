//! Step 4 of the build: each bucket's descriptors Golomb–Rice coded in preorder (spec §7.4),
//! per range of buckets in parallel, the ranges joined in bucket order. Every solver's
//! descriptors go through here, so the bytes do not depend on who solved (spec §10.7).

use rayon::prelude::*;

use super::solve::solve_chunk_keys;
use crate::core::memo::Memo;
use crate::core::params::Params;
use crate::core::rice::RiceBuilder;
use crate::core::tree;
use crate::error::SolveError;

/// Concatenates per-chunk Rice vectors in bucket order; σ of empty trailing buckets continue
/// the running total.
pub(in crate::core) fn concat_chunks(
    num_buckets: usize,
    outs: Vec<(usize, usize, RiceBuilder, Vec<u64>)>,
) -> (RiceBuilder, Vec<u64>) {
    let mut rice = RiceBuilder::new();
    let mut sigma = vec![0u64; num_buckets + 1];
    let mut next = 0usize;
    for (b0, b1, chunk, local) in outs {
        for s in sigma.iter_mut().take(b0).skip(next) {
            *s = rice.len();
        }
        let base = rice.len();
        for (k, s) in local.iter().enumerate() {
            sigma[b0 + k] = base + s;
        }
        debug_assert_eq!(b0 + local.len(), b1);
        rice.append(&chunk);
        next = b1;
    }
    for s in sigma.iter_mut().skip(next) {
        *s = rice.len();
    }
    (rice, sigma)
}

/// Index of each bucket's first descriptor in the flat preorder list (length B+1; the last
/// entry is the total). The shape of a bucket depends only on its size, so this is known
/// before any search.
pub fn descriptor_starts(memo: &Memo, offsets: &[u64]) -> Vec<usize> {
    let mut starts = Vec::with_capacity(offsets.len());
    let mut total = 0usize;
    for w in offsets.windows(2) {
        starts.push(total);
        total += memo.nodes[(w[1] - w[0]) as usize] as usize;
    }
    starts.push(total);
    starts
}

/// Encodes descriptors produced by a [`BucketSolver`] (bucket after bucket, preorder), in
/// parallel over ranges of buckets joined like the CPU path's ([`concat_chunks`]).
pub(super) fn encode_from_descriptors(
    params: &Params,
    offsets: &[u64],
    descriptors: &[u64],
) -> std::result::Result<(RiceBuilder, Vec<u64>), SolveError> {
    let memo = Memo::get(params.leaf);
    let num_buckets = offsets.len() - 1;
    let dstart = descriptor_starts(memo, offsets);
    let used = dstart[num_buckets];
    assert_eq!(
        used,
        descriptors.len(),
        "solver returned {} descriptors, the shapes need {used}",
        descriptors.len()
    );
    let target = solve_chunk_keys(*offsets.last().unwrap_or(&0));
    let mut ranges = Vec::new();
    let mut b = 0usize;
    while b < num_buckets {
        let mut e = b + 1;
        while e < num_buckets && offsets[e] - offsets[b] < target {
            e += 1;
        }
        ranges.push((b, e));
        b = e;
    }
    let outs = ranges
        .into_par_iter()
        .map(|(b0, b1)| {
            let mut rice = RiceBuilder::new();
            let mut sigma = Vec::with_capacity(b1 - b0);
            for b in b0..b1 {
                sigma.push(rice.len());
                let m = (offsets[b + 1] - offsets[b]) as usize;
                encode_bucket(memo, m, &descriptors[dstart[b]..dstart[b + 1]], &mut rice);
            }
            (b0, b1, rice, sigma)
        })
        .collect();
    Ok(concat_chunks(num_buckets, outs))
}

/// Appends one bucket's code: fixed parts in preorder, then unary parts in preorder (spec §7.4).
pub fn encode_bucket(memo: &Memo, m: usize, desc: &[u64], rice: &mut RiceBuilder) {
    let mut taus = Vec::with_capacity(desc.len());
    preorder_taus(memo, m, &mut taus);
    debug_assert_eq!(taus.len(), desc.len());
    for (&d, &t) in desc.iter().zip(&taus) {
        rice.push_bits(d, t as u32);
    }
    for (&d, &t) in desc.iter().zip(&taus) {
        rice.push_unary(d >> t);
    }
}

/// The Rice parameters of a subtree's nodes in preorder.
pub fn preorder_taus(memo: &Memo, m: usize, out: &mut Vec<u8>) {
    if m <= 1 {
        return;
    }
    out.push(memo.tau[m]);
    if m > memo.leaf {
        let mut parts = [0usize; 9];
        let f = tree::children(m, memo.leaf, &mut parts);
        for &k in &parts[..f] {
            preorder_taus(memo, k, out);
        }
    }
}
