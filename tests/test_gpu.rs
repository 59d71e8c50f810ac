//! GPU backend tests: every kernel variant compiles with NVRTC (needs only libnvrtc, so CI runs
//! it), and, when a GPU is present, GPU-built MPHFs are byte-identical to CPU-built ones.
#![cfg(feature = "cuda")]

mod gpu_grid;

use datafusion_mphf::core::Params;
use datafusion_mphf::gpu::{auto_prefers_gpu, kernels, Device, GpuContext};
use datafusion_mphf::placement::solver_for;

#[test]
fn every_kernel_variant_compiles_to_ptx() {
    if !kernels::nvrtc_available() {
        println!("SKIPPED: libnvrtc cannot be loaded; run .ci/install-nvrtc.sh and add its output to LD_LIBRARY_PATH");
        return;
    }
    let variants = kernels::compile_all_kernels_to_ptx(kernels::DEFAULT_ARCH).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(variants.len(), 23 * 3);
    for (leaf, rotation, len) in variants {
        assert!(len > 1000, "PTX for ℓ={leaf} rotation={rotation} is only {len} bytes");
    }
}

#[test]
fn every_query_kernel_compiles_to_ptx() {
    if !kernels::nvrtc_available() {
        println!("SKIPPED: libnvrtc cannot be loaded; run .ci/install-nvrtc.sh and add its output to LD_LIBRARY_PATH");
        return;
    }
    let modules = kernels::compile_all_query_kernels_to_ptx(kernels::DEFAULT_ARCH).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(modules.len(), 23 * 2 + 1);
    for (name, len) in modules {
        assert!(len > 1000, "PTX of {name} is only {len} bytes");
    }
}

#[test]
fn device_parses() {
    assert_eq!("auto".parse::<Device>(), Ok(Device::Auto));
    assert_eq!("CPU".parse::<Device>(), Ok(Device::Cpu));
    assert_eq!("gpu".parse::<Device>(), Ok(Device::Gpu));
    assert_eq!(
        "tpu".parse::<Device>(),
        Err("unknown device 'tpu' (expected auto, cpu or gpu)".to_string())
    );
    assert_eq!(Device::Gpu.to_string(), "gpu");
}

#[test]
fn solver_choice_never_panics() {
    let p = Params::DEFAULT;
    let (s, notice) = solver_for(Device::Cpu, 1 << 30, &p);
    assert!(s.is_none() && notice.is_none());
    let (s, notice) = solver_for(Device::Auto, 10, &p);
    assert!(s.is_none() && notice.is_none(), "tiny inputs stay on the CPU");
    let (s, notice) = solver_for(Device::Gpu, 10, &p);
    match GpuContext::get() {
        Ok(_) => assert!(s.is_some() && notice.is_none()),
        Err(e) => {
            assert!(s.is_none());
            assert_eq!(notice, Some(format!("GPU not available ({e}); building on the CPU")));
        }
    }
}

#[test]
fn auto_rule() {
    let p = |l, b| Params::try_new(l, b, false).unwrap();
    assert!(!auto_prefers_gpu(1 << 30, &p(5, 5)));
    assert!(!auto_prefers_gpu(1000, &p(8, 100)));
    assert!(auto_prefers_gpu(1 << 20, &p(8, 100)));
    assert!(auto_prefers_gpu(1 << 14, &p(16, 2000)));
    assert!(!auto_prefers_gpu(100, &p(16, 2000)));
}

#[test]
fn gpu_equals_cpu_grid() {
    if let Err(e) = GpuContext::get() {
        println!("SKIPPED: no usable GPU ({e})");
        return;
    }
    let (checked, failures) = gpu_grid::run_grid(2e8, 100_000, false).unwrap();
    assert!(
        failures.is_empty(),
        "{} of {checked} grid points failed:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[test]
fn gpu_chunked_equals_cpu() {
    if let Err(e) = GpuContext::get() {
        println!("SKIPPED: no usable GPU ({e})");
        return;
    }
    for chunk in [1, 5000, 65_536] {
        let (checked, failures) = gpu_grid::run_chunked(chunk).unwrap();
        assert!(
            failures.is_empty(),
            "{} of {checked} failed:\n{}",
            failures.len(),
            failures.join("\n")
        );
    }
}

/// A [`BucketSolver`] that runs the CPU search bucket by bucket: exercises the builder's
/// solver path (descriptors → shared encoder) without a GPU.
struct CpuDescriptors;

impl datafusion_mphf::core::BucketSolver for CpuDescriptors {
    fn name(&self) -> &str {
        "cpu-descriptors"
    }
    fn solve(&self, params: &Params, keys: &mut [u64], offsets: &[u64]) -> Result<Vec<u64>, String> {
        use datafusion_mphf::core::build::{solve_bucket, DEFAULT_WATCHDOG};
        let mut out = Vec::new();
        let mut scratch = vec![0u64; 3000];
        for w in offsets.windows(2) {
            let bucket = &mut keys[w[0] as usize..w[1] as usize];
            solve_bucket(params, bucket, &mut scratch, DEFAULT_WATCHDOG, &mut out).map_err(|e| e.to_string())?;
        }
        Ok(out)
    }
}

#[test]
fn solver_path_encodes_like_the_cpu_path() {
    use datafusion_mphf::core::Builder;
    use std::sync::Arc;
    let solver: Arc<dyn datafusion_mphf::core::BucketSolver> = Arc::new(CpuDescriptors);
    for &(leaf, bucket, rotation, n) in &[
        (8, 100, false, 300_000),
        (5, 5, true, 100_000),
        (2, 2000, false, 20_000),
    ] {
        let p = Params::try_new(leaf, bucket, rotation).unwrap();
        let keys = gpu_grid::random_keys(n, 5);
        let cpu = Builder::new(p).build(&keys).unwrap();
        let (via, report) = Builder::new(p)
            .solver(Some(solver.clone()))
            .build_with_report(&keys)
            .unwrap();
        assert_eq!(report.solver, "cpu-descriptors");
        assert!(report.fallback_notice.is_none());
        assert_eq!(
            cpu.write_bytes(),
            via.write_bytes(),
            "ℓ={leaf} b={bucket} rot={rotation}"
        );
        gpu_grid::check_bijection(&via, &keys).unwrap();
    }
}
