//! The CUDA kernel sources (`kernels/*.cu`) and how NVRTC compiles them (spec §10.6).
//!
//! One module per (ℓ, rotation): the leaf size is a compile-time constant (`-D LEAF`) so the
//! leaf kernel keeps a leaf's keys in registers with fully unrolled loops; the leaf seed S19 is
//! passed as `-D LEAF_SEED` from [`SEED_LEAF`] so host and device cannot disagree. The split
//! seeds are kernel arguments. NVRTC needs no GPU, only `libnvrtc`, so CI can compile every
//! variant ([`compile_all_kernels_to_ptx`]).
//!
//! The query side has two more modules: `query.cu` (batch lookup, spec §9) once per
//! (ℓ, rotation), with the tree constants and seeds as `-D` options, and `groupby.cu` (GROUP BY
//! on slots) once; [`compile_all_query_kernels_to_ptx`] compiles them all for CI.

use std::panic::{catch_unwind, AssertUnwindSafe};

use cudarc::nvrtc::{compile_ptx_with_opts, CompileOptions, Ptx};

use super::GpuError;

use crate::core::hash::{INT_HI_SALT, SEED_AGG1, SEED_AGG2, SEED_LEAF, START_SEEDS};
use crate::core::params::{MAX_LEAF, MIN_LEAF};
use crate::core::tree::{lower_aggr, upper_aggr};

/// Device twins of the hashing and the node record.
pub const COMMON_CUH: &str = include_str!("../../kernels/common.cuh");
/// Agg1/Agg2 and high-level split kernels with redistribution.
pub const SPLIT_CU: &str = include_str!("../../kernels/split.cu");
/// Leaf bijection kernel (with rotation).
pub const LEAF_CU: &str = include_str!("../../kernels/leaf.cu");

/// Batch lookup (spec §9 on the device) with membership verification.
pub const QUERY_CU: &str = include_str!("../../kernels/query.cu");
/// GROUP BY on slots: count, sum, min, max with shared-memory privatization and warp combining.
pub const GROUPBY_CU: &str = include_str!("../../kernels/groupby.cu");

/// Kernels of every query module (one module per (ℓ, rotation)).
pub const QUERY_KERNEL_NAMES: [&str; 6] = [
    "lookup_int_u32",
    "lookup_int_u64",
    "lookup_int_runs_u32",
    "lookup_int_runs_u64",
    "lookup_bytes_u32",
    "lookup_bytes_u64",
];

/// Kernels of the GROUP BY module: `groupby_<value>_<shared|global>_<plain|match>` plus helpers.
pub const GROUPBY_KERNEL_NAMES: [&str; 14] = [
    "groupby_none_shared_plain",
    "groupby_none_shared_match",
    "groupby_none_global_plain",
    "groupby_none_global_match",
    "groupby_i64_shared_plain",
    "groupby_i64_shared_match",
    "groupby_i64_global_plain",
    "groupby_i64_global_match",
    "groupby_f64_shared_plain",
    "groupby_f64_shared_match",
    "groupby_f64_global_plain",
    "groupby_f64_global_match",
    "groupby_sample",
    "fill_u64",
];

/// Names of the kernels in every module.
pub const KERNEL_NAMES: [&str; 4] = ["split_high", "split_agg", "leaf_pass", "leaf_collect"];

/// Architecture used when no device says otherwise (the H200's).
pub const DEFAULT_ARCH: &str = "compute_90";

/// The source of kernel file `name`: the built-in text, or, when `MPHF_GPU_KERNELS` names a
/// directory, that directory's file of the same name. The override exists for device
/// experiments (A/B runs of kernel variants without a new binary); a file that cannot be read
/// there falls back to the built-in text with a one-line notice, so a typo cannot change
/// results silently.
fn kernel_text(name: &str, builtin: &'static str) -> std::borrow::Cow<'static, str> {
    let Some(dir) = std::env::var_os("MPHF_GPU_KERNELS") else {
        return builtin.into();
    };
    let path = std::path::Path::new(&dir).join(name);
    match std::fs::read_to_string(&path) {
        Ok(text) => text.into(),
        Err(e) => {
            eprintln!(
                "MPHF_GPU_KERNELS: cannot read {} ({e}); using the built-in {name}",
                path.display()
            );
            builtin.into()
        }
    }
}

/// `common.cuh` as compiled (see [`kernel_text`]).
fn common_cuh() -> std::borrow::Cow<'static, str> {
    kernel_text("common.cuh", COMMON_CUH)
}

/// A `.cu` file without its `#include "common.cuh"` line (NVRTC is given no include path).
fn strip_include(s: &str) -> String {
    s.lines()
        .filter(|l| l.trim() != "#include \"common.cuh\"")
        .collect::<Vec<_>>()
        .join("\n")
}

/// The whole build module's source: `common.cuh` once, then the `.cu` files without their
/// `#include "common.cuh"` lines.
pub fn module_source() -> String {
    format!(
        "{}\n{}\n{}\n",
        common_cuh(),
        strip_include(&kernel_text("split.cu", SPLIT_CU)),
        strip_include(&kernel_text("leaf.cu", LEAF_CU))
    )
}

/// The query module's source (`common.cuh` + `query.cu`).
pub fn query_source() -> String {
    format!(
        "{}\n{}\n",
        common_cuh(),
        strip_include(&kernel_text("query.cu", QUERY_CU))
    )
}

/// The GROUP BY module's source (`common.cuh` + `groupby.cu`).
pub fn groupby_source() -> String {
    format!(
        "{}\n{}\n",
        common_cuh(),
        strip_include(&kernel_text("groupby.cu", GROUPBY_CU))
    )
}

/// NVRTC options of the query module for (`leaf`, `rotation`): the tree constants A1, A2, the
/// seeds of spec §4.3 and the integer-hash salt, all from the Rust constants.
pub fn query_compile_options(leaf: usize, rotation: bool, arch: &str) -> Vec<String> {
    let seeds = START_SEEDS
        .iter()
        .map(|s| format!("{s:#x}ULL"))
        .collect::<Vec<_>>()
        .join(",");
    vec![
        format!("--gpu-architecture={arch}"),
        format!("-DLEAF={leaf}"),
        format!("-DROTATION={}", rotation as u8),
        format!("-DLOWER_AGGR={}u", lower_aggr(leaf)),
        format!("-DUPPER_AGGR={}u", upper_aggr(leaf)),
        format!("-DLEAF_SEED={SEED_LEAF:#x}ULL"),
        format!("-DSEED_AGG1={SEED_AGG1:#x}ULL"),
        format!("-DSEED_AGG2={SEED_AGG2:#x}ULL"),
        format!("-DINT_HI_SALT={INT_HI_SALT:#x}ULL"),
        format!("-DSTART_SEEDS_INIT={seeds}"),
        "-std=c++17".to_string(),
    ]
}

/// Runs NVRTC on `src` with `options`; `what` names the module in errors, `panic_what` in the
/// error of a panic inside NVRTC.
fn nvrtc(src: &str, options: Vec<String>, what: &str, panic_what: &str) -> Result<Ptx, GpuError> {
    if !nvrtc_available() {
        return Err(GpuError::NvrtcMissing);
    }
    let opts = CompileOptions {
        options,
        ..Default::default()
    };
    match catch_unwind(AssertUnwindSafe(|| compile_ptx_with_opts(src, opts))) {
        Ok(Ok(ptx)) => Ok(ptx),
        Ok(Err(cudarc::nvrtc::CompileError::CompileError { log, options, .. })) => Err(GpuError::Compile {
            module: what.to_string(),
            options: options.join(" "),
            log: log.to_string_lossy().into_owned(),
        }),
        Ok(Err(source)) => Err(GpuError::Nvrtc {
            module: what.to_string(),
            source,
        }),
        Err(_) => Err(GpuError::NvrtcPanicked {
            module: panic_what.to_string(),
        }),
    }
}

/// Compiles the query module for (`leaf`, `rotation`) to PTX for `arch`.
///
/// # Errors
/// [`GpuError::NvrtcMissing`] when libnvrtc is missing, [`GpuError::Compile`] (with NVRTC's
/// log) when the source does not compile.
pub fn compile_query(leaf: usize, rotation: bool, arch: &str) -> Result<Ptx, GpuError> {
    let what = format!("the query module (leaf {leaf}, rotation {rotation})");
    nvrtc(
        &query_source(),
        query_compile_options(leaf, rotation, arch),
        &what,
        &what,
    )
}

/// Compiles the GROUP BY module to PTX for `arch`.
///
/// # Errors
/// As [`compile_query`].
pub fn compile_groupby(arch: &str) -> Result<Ptx, GpuError> {
    nvrtc(
        &groupby_source(),
        vec![format!("--gpu-architecture={arch}"), "-std=c++17".to_string()],
        "the GROUP BY module",
        "the GROUP BY module",
    )
}

/// Compiles every query-side module for `arch` (the query module for ℓ in 2..=24 with rotation
/// off and on, and the GROUP BY module) and checks that each PTX holds its kernels; returns
/// `(module name, PTX length)` per module. Used by CI like [`compile_all_kernels_to_ptx`].
///
/// # Errors
/// The first module that fails, with NVRTC's log.
pub fn compile_all_query_kernels_to_ptx(arch: &str) -> Result<Vec<(String, usize)>, GpuError> {
    let mut out = Vec::new();
    let check = |name: String, text: String, kernels: &[&str]| -> Result<(String, usize), GpuError> {
        if let Some(k) = kernels.iter().find(|k| !text.contains(*k)) {
            return Err(GpuError::MissingPtxKernel {
                module: name,
                kernel: k.to_string(),
            });
        }
        Ok((name, text.len()))
    };
    for leaf in MIN_LEAF..=MAX_LEAF {
        for rotation in [false, true] {
            let ptx = compile_query(leaf, rotation, arch)?;
            out.push(check(
                format!("query(leaf {leaf}, rotation {rotation})"),
                ptx.to_src(),
                &QUERY_KERNEL_NAMES,
            )?);
        }
    }
    let ptx = compile_groupby(arch)?;
    out.push(check("groupby".into(), ptx.to_src(), &GROUPBY_KERNEL_NAMES)?);
    Ok(out)
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
        format!("-DAGG_TABLE={}", agg_table() as u8),
        "-std=c++17".to_string(),
    ]
}

/// Whether `split_agg` looks its counter increments up in a shared table (see kernels/split.cu);
/// `MPHF_GPU_AGG_TABLE=0|1` overrides the default for experiments.
pub fn agg_table() -> bool {
    !matches!(std::env::var("MPHF_GPU_AGG_TABLE").ok().as_deref(), Some("0"))
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
/// [`GpuError::NvrtcMissing`] when libnvrtc is missing, [`GpuError::Compile`] (with NVRTC's
/// log) when the source does not compile.
pub fn compile(leaf: usize, rotation: bool, arch: &str) -> Result<Ptx, GpuError> {
    compile_variant(leaf, rotation, rotation_queue(leaf), arch)
}

/// Compiles one variant to PTX; see [`compile`].
///
/// # Errors
/// As [`compile`].
pub fn compile_variant(leaf: usize, rotation: bool, queue: bool, arch: &str) -> Result<Ptx, GpuError> {
    nvrtc(
        &module_source(),
        compile_options(leaf, rotation, queue, arch),
        &format!("leaf {leaf}, rotation {rotation}"),
        "the kernels",
    )
}

/// Compiles every kernel variant (ℓ in 2..=24; rotation off, on with either rotation search)
/// for `arch`; returns `(ℓ, rotation, PTX length)` per variant. Used by CI, which has libnvrtc
/// but no GPU.
///
/// # Errors
/// The first variant that fails, with NVRTC's log.
pub fn compile_all_kernels_to_ptx(arch: &str) -> Result<Vec<(usize, bool, usize)>, GpuError> {
    let mut out = Vec::new();
    for leaf in MIN_LEAF..=MAX_LEAF {
        for (rotation, queue) in [(false, false), (true, false), (true, true)] {
            let ptx = compile_variant(leaf, rotation, queue, arch)?;
            let text = ptx.to_src();
            if let Some(name) = KERNEL_NAMES.iter().find(|name| !text.contains(*name)) {
                return Err(GpuError::MissingPtxKernel {
                    module: format!("leaf {leaf}, rotation {rotation}"),
                    kernel: name.to_string(),
                });
            }
            out.push((leaf, rotation, text.len()));
        }
    }
    Ok(out)
}
