//! The CUDA kernel sources (`kernels/*.cu`) and how NVRTC compiles them (spec §10.6).
//!
//! One module per (ℓ, rotation): the leaf size is a compile-time constant (`-D LEAF`) so the
//! leaf kernel keeps a leaf's keys in registers with fully unrolled loops; the leaf seed S19 is
//! passed as `-D LEAF_SEED` from [`SEED_LEAF`] so host and device cannot disagree. The split
//! seeds are kernel arguments. NVRTC needs no GPU, only `libnvrtc`, so CI can compile every
//! variant ([`compile_all_kernels_to_ptx`]).

use std::panic::{catch_unwind, AssertUnwindSafe};

use cudarc::nvrtc::{compile_ptx_with_opts, CompileOptions, Ptx};

use crate::core::hash::SEED_LEAF;
use crate::core::params::{MAX_LEAF, MIN_LEAF};

/// Device twins of the hashing and the node record.
pub const COMMON_CUH: &str = include_str!("../../kernels/common.cuh");
/// Agg1/Agg2 and high-level split kernels with redistribution.
pub const SPLIT_CU: &str = include_str!("../../kernels/split.cu");
/// Leaf bijection kernel (with rotation).
pub const LEAF_CU: &str = include_str!("../../kernels/leaf.cu");

/// Names of the kernels in every module.
pub const KERNEL_NAMES: [&str; 3] = ["split_high", "split_agg", "leaf_search"];

/// Architecture used when no device says otherwise (the H200's).
pub const DEFAULT_ARCH: &str = "compute_90";

/// The whole module's source: `common.cuh` once, then the `.cu` files without their
/// `#include "common.cuh"` lines (NVRTC is given no include path).
pub fn module_source() -> String {
    let strip = |s: &str| {
        s.lines()
            .filter(|l| l.trim() != "#include \"common.cuh\"")
            .collect::<Vec<_>>()
            .join("\n")
    };
    format!("{COMMON_CUH}\n{}\n{}\n", strip(SPLIT_CU), strip(LEAF_CU))
}

/// NVRTC options for leaf size `leaf`, `rotation` (with the queued variant when `queue`),
/// virtual architecture `arch` (e.g. `compute_90`).
pub fn compile_options(leaf: usize, rotation: bool, queue: bool, arch: &str) -> Vec<String> {
    vec![
        format!("--gpu-architecture={arch}"),
        format!("-DLEAF={leaf}"),
        format!("-DROTATION={}", rotation as u8),
        format!("-DLEAF_SEED={SEED_LEAF:#x}ULL"),
        format!("-DROT_QUEUE={}", queue as u8),
        "-std=c++17".to_string(),
    ]
}

/// Whether full leaves of size `leaf` use the queued rotation search (see kernels/leaf.cu);
/// `MPHF_GPU_ROT_QUEUE=0|1` overrides the default for experiments.
pub fn rotation_queue(leaf: usize) -> bool {
    match std::env::var("MPHF_GPU_ROT_QUEUE").ok().as_deref() {
        Some("0") => false,
        Some("1") => true,
        _ => leaf >= ROT_QUEUE_MIN_LEAF,
    }
}

/// Smallest ℓ whose full leaves use the queued rotation search by default.
pub const ROT_QUEUE_MIN_LEAF: usize = 17;

/// True when `libnvrtc` can be loaded (cudarc would panic on first use otherwise).
pub fn nvrtc_available() -> bool {
    // SAFETY: only tries to dlopen the library by its usual names; no symbol is called.
    catch_unwind(|| unsafe { cudarc::nvrtc::sys::is_culib_present() }).unwrap_or(false)
}

/// Compiles the module for (`leaf`, `rotation`) to PTX for `arch`, with the default rotation
/// variant ([`rotation_queue`]).
///
/// # Errors
/// A message when libnvrtc is missing or the source does not compile (with NVRTC's log).
pub fn compile(leaf: usize, rotation: bool, arch: &str) -> Result<Ptx, String> {
    compile_variant(leaf, rotation, rotation_queue(leaf), arch)
}

/// Compiles one variant to PTX; see [`compile`].
///
/// # Errors
/// As [`compile`].
pub fn compile_variant(leaf: usize, rotation: bool, queue: bool, arch: &str) -> Result<Ptx, String> {
    if !nvrtc_available() {
        return Err(
            "libnvrtc cannot be loaded (install nvidia-cuda-nvrtc and put its lib dir on LD_LIBRARY_PATH)".into(),
        );
    }
    let opts = CompileOptions {
        options: compile_options(leaf, rotation, queue, arch),
        ..Default::default()
    };
    let src = module_source();
    match catch_unwind(AssertUnwindSafe(|| compile_ptx_with_opts(&src, opts))) {
        Ok(Ok(ptx)) => Ok(ptx),
        Ok(Err(cudarc::nvrtc::CompileError::CompileError { log, options, .. })) => Err(format!(
            "NVRTC failed for leaf {leaf}, rotation {rotation} ({}): {}",
            options.join(" "),
            log.to_string_lossy()
        )),
        Ok(Err(e)) => Err(format!("NVRTC failed for leaf {leaf}, rotation {rotation}: {e}")),
        Err(_) => Err("NVRTC panicked while compiling the kernels".into()),
    }
}

/// Compiles every kernel variant (ℓ in 2..=24; rotation off, on with either rotation search)
/// for `arch`; returns `(ℓ, rotation, PTX length)` per variant. Used by CI, which has libnvrtc
/// but no GPU.
///
/// # Errors
/// The first variant that fails, with NVRTC's log.
pub fn compile_all_kernels_to_ptx(arch: &str) -> Result<Vec<(usize, bool, usize)>, String> {
    let mut out = Vec::new();
    for leaf in MIN_LEAF..=MAX_LEAF {
        for (rotation, queue) in [(false, false), (true, false), (true, true)] {
            let ptx = compile_variant(leaf, rotation, queue, arch)?;
            let text = ptx.to_src();
            for name in KERNEL_NAMES {
                if !text.contains(name) {
                    return Err(format!("PTX for leaf {leaf}, rotation {rotation} lacks kernel {name}"));
                }
            }
            out.push((leaf, rotation, text.len()));
        }
    }
    Ok(out)
}
