//! [`GpuSolver`]: all buckets' splitting trees solved level by level on the GPU (spec §10.6,
//! "later refinement": each level launched once for many buckets).
//!
//! The tree shape depends only on bucket sizes (spec §3), and after a split child j occupies a
//! known sub-range of its parent's keys (spec §3.5, §6.2). So the host plans every node up front
//! as an `(offset, size, slot)` record, where `slot` is the node's preorder position in the
//! output (exactly the CPU's descriptor order), and groups the records into stages: high-level
//! nodes by depth (seed `START_SEEDS[depth]`), then Agg2, Agg1 and leaves. One kernel launch per
//! non-empty split stage, in that order on one stream, so each level sees its keys already
//! redistributed by the level above; the leaf stage runs in passes that give the slow leaves
//! more warps (`GpuSolver::solve_leaves`, kernels/leaf.cu). Descriptors are u64 on both sides.
//!
//! Chunks of consecutive buckets are solved one after another when the device memory would not
//! hold all keys at once (≈ 32 B per key on the device at worst).

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;
use std::time::Instant;

use cudarc::driver::{CudaSlice, DeviceRepr, LaunchArgs, LaunchConfig, PushKernelArg};
use rayon::prelude::*;

use super::{GpuContext, GpuError};
use crate::core::build::{BucketSolver, DEFAULT_WATCHDOG};
use crate::core::hash::{SEED_AGG1, SEED_AGG2, START_SEEDS};
use crate::core::memo::Memo;
use crate::core::params::Params;
use crate::core::tree::{lower_aggr, split_left, upper_aggr};

/// One planned node; the layout matches `struct Node` in `kernels/common.cuh`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GpuNode {
    /// Index of the node's first key in the chunk's key array.
    pub off: u64,
    /// Number of keys (≥ 2).
    pub m: u32,
    /// Preorder position of the node's descriptor in the chunk's output.
    pub slot: u32,
}

// SAFETY: plain old data (two integers and a u64, repr(C), no padding), valid for any bits.
unsafe impl DeviceRepr for GpuNode {}

/// High-level stages: one per depth (there are 20 start seeds; the CPU indexes them the same way).
const HIGH_STAGES: usize = START_SEEDS.len();
const STAGE_AGG2: usize = HIGH_STAGES;
const STAGE_AGG1: usize = HIGH_STAGES + 1;
const STAGE_LEAF: usize = HIGH_STAGES + 2;
const NUM_STAGES: usize = HIGH_STAGES + 3;

/// Threads per block of the split kernels.
const SPLIT_THREADS: u32 = 256;
/// Leaves per block of the leaf kernel (one warp each; `LEAF_WARPS` in leaf.cu).
const LEAF_WARPS: u32 = 8;
/// Device bytes per key budgeted for a chunk (keys, descriptors, node records).
const DEVICE_BYTES_PER_KEY: usize = 32;

/// All nodes of a chunk, grouped by stage.
#[derive(Debug, Default)]
pub struct Plan {
    /// Nodes per stage (high depths 0..20, Agg2, Agg1, leaves).
    pub stages: Vec<Vec<GpuNode>>,
    /// Largest node per stage (sizes the shared memory of split launches).
    pub max_m: Vec<u32>,
    /// Number of descriptors.
    pub descriptors: usize,
}

struct Shape {
    leaf: usize,
    a1: usize,
    a2: usize,
}

fn walk(s: &Shape, m: usize, off: u64, depth: usize, slot: &mut u32, st: &mut [Vec<GpuNode>]) {
    if m <= 1 {
        return;
    }
    let node = GpuNode {
        off,
        m: m as u32,
        slot: *slot,
    };
    *slot += 1;
    if m <= s.leaf {
        st[STAGE_LEAF].push(node);
    } else if m <= s.a1 || m <= s.a2 {
        let (stage, unit) = if m <= s.a1 {
            (STAGE_AGG1, s.leaf)
        } else {
            (STAGE_AGG2, s.a1)
        };
        st[stage].push(node);
        for j in (0..m).step_by(unit) {
            walk(s, unit.min(m - j), off + j as u64, depth, slot, st);
        }
    } else {
        st[depth].push(node);
        let left = split_left(m, s.a2);
        walk(s, left, off, depth + 1, slot, st);
        walk(s, m - left, off + left as u64, depth + 1, slot, st);
    }
}

/// Plans the nodes of buckets with key offsets `offsets` (relative to the chunk, starting at 0).
pub fn plan(params: &Params, offsets: &[u64]) -> Plan {
    let memo = Memo::get(params.leaf);
    let shape = Shape {
        leaf: params.leaf,
        a1: lower_aggr(params.leaf),
        a2: upper_aggr(params.leaf),
    };
    let nb = offsets.len() - 1;
    // Descriptor start of every bucket (the preorder slot of its root).
    let dstart = crate::core::build::descriptor_starts(memo, offsets);
    let total = dstart[nb];
    assert!(total <= u32::MAX as usize, "a chunk has more than 2^32 descriptors");
    let ranges = (rayon::current_num_threads() * 8).max(1);
    let per = nb.div_ceil(ranges).max(1);
    let parts: Vec<Vec<Vec<GpuNode>>> = (0..nb.div_ceil(per))
        .into_par_iter()
        .map(|r| {
            let mut st = vec![Vec::new(); NUM_STAGES];
            for b in r * per..((r + 1) * per).min(nb) {
                let mut slot = dstart[b] as u32;
                walk(
                    &shape,
                    (offsets[b + 1] - offsets[b]) as usize,
                    offsets[b],
                    0,
                    &mut slot,
                    &mut st,
                );
                debug_assert_eq!(slot as usize, dstart[b + 1]);
            }
            st
        })
        .collect();
    let mut stages: Vec<Vec<GpuNode>> = (0..NUM_STAGES)
        .into_par_iter()
        .map(|s| {
            let mut v = Vec::with_capacity(parts.iter().map(|p| p[s].len()).sum());
            for p in &parts {
                v.extend_from_slice(&p[s]);
            }
            v
        })
        .collect();
    stages.shrink_to_fit();
    let max_m = stages
        .iter()
        .map(|v| v.iter().map(|n| n.m).max().unwrap_or(0))
        .collect();
    Plan {
        stages,
        max_m,
        descriptors: total,
    }
}

/// Solves buckets on the GPU; see the module docs.
pub struct GpuSolver {
    ctx: Arc<GpuContext>,
    profile: bool,
    chunk_keys: Option<u64>,
}

impl GpuSolver {
    /// A solver on the shared context. Set `MPHF_GPU_PROFILE=1` to print per-stage times.
    pub fn new(ctx: Arc<GpuContext>) -> Self {
        GpuSolver {
            ctx,
            profile: std::env::var_os("MPHF_GPU_PROFILE").is_some(),
            chunk_keys: None,
        }
    }

    /// Caps the keys solved per device round trip (default: what half the free device memory
    /// holds, at most 2^28). Small caps exercise the chunked path in tests.
    pub fn with_chunk_keys(mut self, keys: u64) -> Self {
        self.chunk_keys = Some(keys.max(1));
        self
    }

    fn solve_inner(&self, params: &Params, keys: &[u64], offsets: &[u64]) -> Result<Vec<u64>, GpuError> {
        let kernels = self.ctx.kernels(params.leaf, params.rotation)?;
        let memo = Memo::get(params.leaf);
        let nb = offsets.len() - 1;
        let total: usize = offsets
            .windows(2)
            .map(|w| memo.nodes[(w[1] - w[0]) as usize] as usize)
            .sum();
        let mut out = vec![0u64; total];
        let chunk_keys = match self.chunk_keys {
            Some(c) => c,
            None => {
                let (free, _) = self.ctx.memory()?;
                ((free / 2) / DEVICE_BYTES_PER_KEY).clamp(1 << 16, 1 << 28) as u64
            }
        };
        if self.profile {
            eprintln!(
                "gpu: {} keys in {nb} buckets, chunks of at most {chunk_keys} keys ({} MiB of device memory at {DEVICE_BYTES_PER_KEY} B/key)",
                keys.len(),
                (chunk_keys.min(keys.len() as u64) * DEVICE_BYTES_PER_KEY as u64) >> 20
            );
        }
        let mut b = 0usize;
        let mut done = 0usize;
        while b < nb {
            let mut e = b + 1;
            while e < nb && offsets[e + 1] - offsets[b] <= chunk_keys {
                e += 1;
            }
            let rel: Vec<u64> = offsets[b..=e].iter().map(|&o| o - offsets[b]).collect();
            let chunk = &keys[offsets[b] as usize..offsets[e] as usize];
            let t0 = Instant::now();
            // The keys' copy to the device (a pageable copy: one thread, bounded by the driver's
            // bounce buffers) overlaps the plan (all cores). The copy runs on its own thread so
            // that the plan keeps the caller's rayon pool; the stream binds the context there.
            let (plan, d_keys) = std::thread::scope(|scope| {
                let upload = scope.spawn(|| {
                    self.ctx
                        .stream
                        .clone_htod(chunk)
                        .map_err(GpuError::alloc::<u64>("copying keys to the device", chunk.len()))
                });
                let plan = plan(params, &rel);
                let d_keys = upload.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic));
                (plan, d_keys)
            });
            let d_keys = d_keys?;
            if self.profile {
                eprintln!(
                    "gpu: plan {} buckets and upload {} keys in {:.1} ms",
                    e - b,
                    chunk.len(),
                    t0.elapsed().as_secs_f64() * 1e3
                );
            }
            let n = plan.descriptors;
            self.solve_chunk(params, &kernels, d_keys, &plan, &mut out[done..done + n])?;
            done += n;
            b = e;
        }
        debug_assert_eq!(done, total);
        Ok(out)
    }

    fn solve_chunk(
        &self,
        params: &Params,
        k: &super::Kernels,
        mut d_keys: CudaSlice<u64>,
        plan: &Plan,
        out: &mut [u64],
    ) -> Result<(), GpuError> {
        let err = GpuError::driver;
        let stream = &self.ctx.stream;
        let t0 = Instant::now();
        let mut d_out = stream
            .alloc_zeros::<u64>(out.len().max(1))
            .map_err(GpuError::alloc::<u64>("allocating descriptors", out.len().max(1)))?;
        let mut d_status = stream
            .alloc_zeros::<u32>(1)
            .map_err(GpuError::alloc::<u32>("allocating status", 1))?;
        let watchdog = DEFAULT_WATCHDOG;
        let a1 = lower_aggr(params.leaf) as u32;
        let a2 = upper_aggr(params.leaf) as u32;
        let stamp = |what: &str, count: usize, t: &mut Instant| -> Result<(), GpuError> {
            if self.profile {
                stream.synchronize().map_err(err("synchronizing"))?;
                eprintln!(
                    "gpu: {what:>10} {count:>10} nodes {:>9.2} ms",
                    t.elapsed().as_secs_f64() * 1e3
                );
                *t = Instant::now();
            }
            Ok(())
        };
        let mut t = t0;
        for (stage, nodes) in plan.stages.iter().enumerate() {
            if nodes.is_empty() {
                continue;
            }
            let count = nodes.len() as u32;
            let d_nodes = stream
                .clone_htod(nodes)
                .map_err(GpuError::alloc::<GpuNode>("copying nodes to the device", nodes.len()))?;
            let shared = plan.max_m[stage] * 8;
            // All launches below: argument lists match the kernel signatures in kernels/split.cu
            // and kernels/leaf.cu; every node's key range lies inside d_keys and every slot
            // inside d_out (the plan is built from the same offsets), and the dynamic shared
            // memory holds the stage's largest node.
            if stage < HIGH_STAGES {
                let seed = START_SEEDS[stage];
                let cfg = LaunchConfig {
                    grid_dim: (count, 1, 1),
                    block_dim: (SPLIT_THREADS, 1, 1),
                    shared_mem_bytes: shared,
                };
                let mut l = stream.launch_builder(&k.split_high);
                l.arg(&mut d_keys)
                    .arg(&d_nodes)
                    .arg(&a2)
                    .arg(&seed)
                    .arg(&mut d_out)
                    .arg(&watchdog)
                    .arg(&mut d_status);
                // SAFETY: see the launch invariants above (signature, ranges, shared memory).
                unsafe { l.launch(cfg) }.map_err(err("launching split_high"))?;
                stamp(&format!("high{stage}"), nodes.len(), &mut t)?;
            } else if stage == STAGE_AGG2 || stage == STAGE_AGG1 {
                let (unit, seed) = if stage == STAGE_AGG2 {
                    (a1, SEED_AGG2)
                } else {
                    (params.leaf as u32, SEED_AGG1)
                };
                let magic = (1u64 << 32).div_ceil(unit as u64) as u32;
                // Keys plus the increment table (allocated whichever variant the module is).
                let shared = 2 * shared + 8;
                let cfg = LaunchConfig {
                    grid_dim: (count, 1, 1),
                    block_dim: (SPLIT_THREADS, 1, 1),
                    shared_mem_bytes: shared,
                };
                let mut l = stream.launch_builder(&k.split_agg);
                l.arg(&mut d_keys)
                    .arg(&d_nodes)
                    .arg(&unit)
                    .arg(&magic)
                    .arg(&seed)
                    .arg(&mut d_out)
                    .arg(&watchdog)
                    .arg(&mut d_status);
                // SAFETY: see the launch invariants above (signature, ranges, shared memory).
                unsafe { l.launch(cfg) }.map_err(err("launching split_agg"))?;
                stamp(if stage == STAGE_AGG2 { "agg2" } else { "agg1" }, nodes.len(), &mut t)?;
            } else {
                debug_assert_eq!(stage, STAGE_LEAF);
                self.solve_leaves(params, k, &d_keys, &d_nodes, count, &mut d_out, &mut d_status, &mut t)?;
            }
        }
        let status = stream.clone_dtoh(&d_status).map_err(err("reading the status"))?;
        if status[0] != 0 {
            return Err(GpuError::Watchdog {
                search: "node",
                status: status[0],
            });
        }
        if !out.is_empty() {
            stream
                .memcpy_dtoh(&d_out, out)
                .map_err(err("copying descriptors back"))?;
        }
        stream.synchronize().map_err(err("synchronizing"))?;
        stamp("download", out.len(), &mut t)?;
        drop(d_keys);
        Ok(())
    }
}

impl GpuSolver {
    /// The leaf stage: passes of `leaf_pass` + `leaf_collect` (kernels/leaf.cu) until every
    /// leaf has its descriptor. The first pass gives each leaf one warp and a budget of
    /// [`LEAF_BUDGET`] times its expected work (at most that of a full leaf, see [`leaf_cap`]);
    /// each later pass spreads the leaves still pending over the device's resident warps (at
    /// most [`MAX_WARPS_PER_LEAF`] per leaf) and resumes where the previous pass stopped, so a
    /// few slow leaves no longer set the stage's time.
    #[allow(clippy::too_many_arguments)]
    fn solve_leaves(
        &self,
        params: &Params,
        k: &super::Kernels,
        d_keys: &CudaSlice<u64>,
        d_nodes: &CudaSlice<GpuNode>,
        count: u32,
        d_out: &mut CudaSlice<u64>,
        d_status: &mut CudaSlice<u32>,
        t: &mut Instant,
    ) -> Result<(), GpuError> {
        let err = GpuError::driver;
        let stream = &self.ctx.stream;
        let resident = self.ctx.resident_warps()?.max(LEAF_WARPS);
        let (first_budget, later_budget) = leaf_budgets();
        let expected_cap = leaf_cap(params.leaf, params.rotation);
        let watchdog = DEFAULT_WATCHDOG;
        let list_len = count as usize;
        // Work lists (16 bytes per entry: leaf, pad, resume) and the published answers.
        let lists_err = || GpuError::alloc::<u64>("allocating leaf work lists", 2 * list_len);
        let mut lists = [
            stream.alloc_zeros::<u64>(2 * list_len).map_err(lists_err())?,
            stream.alloc_zeros::<u64>(2 * list_len).map_err(lists_err())?,
        ];
        let mut found = stream
            .alloc_zeros::<u64>(list_len)
            .map_err(GpuError::alloc::<u64>("allocating leaf answers", list_len))?;
        let mut counters = stream
            .alloc_zeros::<u32>(2)
            .map_err(GpuError::alloc::<u32>("allocating leaf counters", 2))?;
        let mut entries = count;
        let mut pass = 0usize;
        while entries > 0 {
            if pass == MAX_LEAF_PASSES {
                return Err(GpuError::LeafPasses {
                    passes: MAX_LEAF_PASSES,
                });
            }
            let warps_per_leaf = if pass == 0 {
                1
            } else {
                (resident / entries).clamp(1, MAX_WARPS_PER_LEAF)
            };
            let budget = if pass == 0 { first_budget } else { later_budget };
            let units = entries as u64 * warps_per_leaf as u64;
            stream
                .memset_zeros(&mut found.slice_mut(..entries as usize))
                .map_err(err("clearing leaf answers"))?;
            stream
                .memset_zeros(&mut counters)
                .map_err(err("clearing leaf counters"))?;
            let (cur, next) = lists.split_at_mut(1);
            let (cur, next) = (&cur[0], &mut next[0]);
            // The first pass reads no list (entry i is leaf i, from round 0): a null pointer.
            let null = 0u64;
            let list = (pass > 0).then_some(cur);
            let blocks = units.div_ceil(LEAF_WARPS as u64).min((resident / LEAF_WARPS) as u64) as u32;
            let mut fetch = counters.slice_mut(0..1);
            let cfg = LaunchConfig {
                grid_dim: (blocks, 1, 1),
                block_dim: (32 * LEAF_WARPS, 1, 1),
                shared_mem_bytes: 0,
            };
            let mut l = stream.launch_builder(&k.leaf_pass);
            l.arg(d_keys).arg(d_nodes);
            push_list(&mut l, list, &null);
            l.arg(&entries)
                .arg(&warps_per_leaf)
                .arg(&budget)
                .arg(&expected_cap)
                .arg(&mut found)
                .arg(&mut fetch)
                .arg(&watchdog)
                .arg(&mut *d_status);
            // SAFETY: the arguments match `leaf_pass` in kernels/leaf.cu; the list (or null in
            // the first pass, where entry i is leaf i < count) holds `entries` leaves of d_nodes,
            // whose key ranges lie in d_keys; `found` has `entries` slots.
            unsafe { l.launch(cfg) }.map_err(err("launching leaf_pass"))?;
            let mut next_count = counters.slice_mut(1..2);
            let cfg = LaunchConfig {
                grid_dim: (entries.div_ceil(256), 1, 1),
                block_dim: (256, 1, 1),
                shared_mem_bytes: 0,
            };
            let mut l = stream.launch_builder(&k.leaf_collect);
            l.arg(d_nodes);
            push_list(&mut l, list, &null);
            l.arg(&entries)
                .arg(&warps_per_leaf)
                .arg(&budget)
                .arg(&expected_cap)
                .arg(&found)
                .arg(&mut *d_out)
                .arg(&mut *next)
                .arg(&mut next_count);
            // SAFETY: the arguments match `leaf_collect`; every slot of d_nodes lies in d_out,
            // and `next` holds `count` ≥ `entries` entries.
            unsafe { l.launch(cfg) }.map_err(err("launching leaf_collect"))?;
            let status = stream.clone_dtoh(&*d_status).map_err(err("reading the status"))?;
            if status[0] != 0 {
                return Err(GpuError::Watchdog {
                    search: "leaf",
                    status: status[0],
                });
            }
            let pending = stream.clone_dtoh(&counters).map_err(err("reading the leaf counters"))?[1];
            if self.profile {
                eprintln!(
                    "gpu: leaf pass {pass}: {entries} leaves × {warps_per_leaf} warps, {pending} pending, {:.2} ms",
                    t.elapsed().as_secs_f64() * 1e3
                );
                *t = Instant::now();
            }
            entries = pending;
            lists.swap(0, 1);
            pass += 1;
        }
        Ok(())
    }
}

/// Pushes a leaf kernel's work-list argument: the list, or a null pointer (`null` holds 0).
fn push_list<'a>(l: &mut LaunchArgs<'a>, list: Option<&'a CudaSlice<u64>>, null: &'a u64) {
    match list {
        Some(list) => l.arg(list),
        None => l.arg(null),
    };
}

/// Budget of a leaf per warp in the first pass, in multiples of its expected work. About e^-4
/// ≈ 2% of the leaves run past it.
pub const LEAF_BUDGET: f32 = 4.0;
/// Budget per warp in the later passes: smaller, so that a later pass with one warp per leaf
/// (many pending leaves) ends soon and the next one spreads what is left over more warps.
pub const LEAF_BUDGET_LATER: f32 = 1.0;
/// Default of [`leaf_cap`]'s factor (0: every leaf gets its full budget; see RESULTS-gpu.md).
pub const LEAF_CAP: f64 = 1.0;
/// Most warps given to one leaf in a pass.
pub const MAX_WARPS_PER_LEAF: u32 = 1024;
/// Passes after which the leaf stage gives up (the watchdog normally ends a hopeless search
/// first: each pass moves every pending leaf at least one round per warp).
const MAX_LEAF_PASSES: usize = 1 << 16;

/// Expected candidates of the costliest leaf a pass budgets in full, in multiples of a full
/// leaf's (`MPHF_GPU_LEAF_CAP`, 0 = no cap). Costlier leaves (ℓ − 1 keys cost about 7 full
/// rotated leaves at ℓ = 18) get the capped budget, so no warp of a pass runs much longer
/// than the others; what they leave goes to the next pass, with more warps.
fn leaf_cap(leaf: usize, rotation: bool) -> f32 {
    let factor = std::env::var("MPHF_GPU_LEAF_CAP")
        .ok()
        .and_then(|v| v.trim().parse::<f64>().ok())
        .filter(|c| *c >= 0.0 && c.is_finite())
        .unwrap_or(LEAF_CAP);
    let l = leaf as f64;
    let log_fact: f64 = (2..=leaf).map(|i| (i as f64).ln()).sum();
    let full = (l * l.ln() - log_fact).exp() / if rotation { l } else { 1.0 };
    (factor * full) as f32
}

/// The leaf budgets of the first and later passes (`MPHF_GPU_LEAF_BUDGET=FIRST[,LATER]`
/// overrides them for experiments).
fn leaf_budgets() -> (f32, f32) {
    let parsed: Vec<f32> = std::env::var("MPHF_GPU_LEAF_BUDGET")
        .unwrap_or_default()
        .split(',')
        .filter_map(|v| v.trim().parse::<f32>().ok())
        .filter(|b| *b > 0.0 && b.is_finite())
        .collect();
    match parsed[..] {
        [first] => (first, LEAF_BUDGET_LATER),
        [first, later, ..] => (first, later),
        _ => (LEAF_BUDGET, LEAF_BUDGET_LATER),
    }
}

impl BucketSolver for GpuSolver {
    fn name(&self) -> &str {
        "gpu"
    }

    /// The core's solver interface is solver-agnostic and reports a failure as its message
    /// (the builder prints it in its CPU-fallback notice), so the [`GpuError`] ends here.
    fn solve(&self, params: &Params, keys: &mut [u64], offsets: &[u64]) -> Result<Vec<u64>, String> {
        catch_unwind(AssertUnwindSafe(|| self.solve_inner(params, keys, offsets)))
            .unwrap_or_else(|_| Err(GpuError::panicked("the GPU build")))
            .map_err(|e| e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::tree::{kind, NodeKind};

    #[test]
    fn plan_slots_are_preorder_positions() {
        // Buckets of sizes 0, 1, 2, 8, 10, 202, 2999 with ℓ = 8 (A1 = 32, A2 = 96).
        let sizes = [0u64, 1, 2, 8, 10, 202, 2999];
        let mut offsets = vec![0u64];
        for s in sizes {
            offsets.push(offsets.last().unwrap() + s);
        }
        let params = Params::try_new(8, 100, false).unwrap();
        let plan = plan(&params, &offsets);
        let memo = Memo::get(8);
        let total: usize = sizes.iter().map(|&s| memo.nodes[s as usize] as usize).sum();
        assert_eq!(plan.descriptors, total);
        let mut seen = vec![false; total];
        for (stage, nodes) in plan.stages.iter().enumerate() {
            for n in nodes {
                assert!(!seen[n.slot as usize], "slot {} twice", n.slot);
                seen[n.slot as usize] = true;
                let k = kind(n.m as usize, 8);
                match stage {
                    STAGE_LEAF => assert_eq!(k, NodeKind::Leaf),
                    STAGE_AGG1 => assert!(matches!(k, NodeKind::Agg1 { .. })),
                    STAGE_AGG2 => assert!(matches!(k, NodeKind::Agg2 { .. })),
                    _ => assert!(matches!(k, NodeKind::High { .. })),
                }
            }
        }
        assert!(seen.iter().all(|&s| s));
        // Bucket 4 (10 keys at offset 11): Agg1 at slot 2, leaves of 8 and 2 at slots 3 and 4.
        let agg1: Vec<_> = plan.stages[STAGE_AGG1]
            .iter()
            .filter(|n| n.off == 11 && n.m == 10)
            .collect();
        assert_eq!(agg1.len(), 1);
        assert_eq!(agg1[0].slot, 2);
        let leaves: Vec<_> = plan.stages[STAGE_LEAF]
            .iter()
            .filter(|n| (11..21).contains(&n.off))
            .map(|n| (n.off, n.m, n.slot))
            .collect();
        assert_eq!(leaves, vec![(11, 8, 3), (19, 2, 4)]);
        // The 202-key bucket starts with a depth-0 high split (192 | 10).
        assert!(plan.stages[0].iter().any(|n| n.off == 21 && n.m == 202 && n.slot == 5));
        assert!(plan.stages[1].iter().any(|n| n.off == 21 && n.m == 192));
    }

    #[test]
    fn leaf_cap_is_a_full_leafs_expected_candidates() {
        if std::env::var_os("MPHF_GPU_LEAF_CAP").is_some() {
            return; // an experiment overrides the default
        }
        // 18^18 / 18! ≈ 6.146·10^6 candidates; rotation tests 18 per base.
        let rotated = leaf_cap(18, true) as f64;
        assert!((rotated - 6.1456e6 / 18.0).abs() < 0.001 * rotated, "{rotated}");
        let plain = leaf_cap(18, false) as f64;
        assert!((plain - 6.1456e6).abs() < 0.001 * plain, "{plain}");
    }
}
