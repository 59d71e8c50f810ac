//! [`GpuError`]: why a GPU operation failed.
//!
//! Why a type of its own: every GPU failure ends the same way for the user (the work runs on the
//! CPU, with a one-line notice), but the code around it needs to tell the cases apart: no GPU on
//! this machine (a quiet fallback), an input the kernels do not take (decided before any device
//! work), a failed driver call or compile (worth reporting), a panic caught at the cudarc
//! boundary. A `String` could only be printed. The messages are the ones the backend printed
//! before it had this type; tests compare some of them.
//!
//! This module is compiled without the `cuda` feature too (as `crate::gpu::error`, see
//! `lib.rs`), so that `placement::gpu_usable` and the SQL layer name one error type in both
//! builds. The variants that carry a cudarc error exist only with the feature, hence
//! `#[non_exhaustive]`: code outside the crate matches with a wildcard arm either way.
//!
//! Errors are `Clone` because the shared context and an index's device copy cache their
//! outcome, failure included, for the life of the process or the index.

use std::sync::Arc;

use arrow::datatypes::DataType;
use arrow::error::ArrowError;
use thiserror::Error;

#[cfg(feature = "cuda")]
use cudarc::driver::DriverError;

/// Why a GPU operation failed (see the module docs).
#[derive(Debug, Clone, Error)]
#[non_exhaustive]
pub enum GpuError {
    /// The crate was built without the `cuda` feature: there is no GPU backend to try, so the
    /// `gpu` device choices fall back to the CPU.
    #[error("built without the `cuda` feature")]
    NotBuilt,
    /// No CUDA driver library could be loaded (no NVIDIA driver, or not on the loader's path).
    /// Checked before the first driver call because cudarc panics on a missing library.
    #[error("no CUDA driver library (libcuda.so) found")]
    NoDriver,
    /// The driver loaded but reports no device (e.g. a container without a GPU passed in).
    #[error("no CUDA device found")]
    NoDevice,
    /// `libnvrtc` cannot be loaded, so no kernel can be compiled: the kernels are compiled at
    /// run time for the device's architecture, and NVRTC ships separately from the driver.
    #[error("libnvrtc cannot be loaded (install nvidia-cuda-nvrtc and put its lib dir on LD_LIBRARY_PATH)")]
    NvrtcMissing,
    /// NVRTC rejected a kernel source; its log says why (a kernel/host mismatch, or an
    /// architecture this NVRTC does not know). Kept with the options, which set the constants
    /// (ℓ, seeds) the source was compiled for.
    #[error("NVRTC failed for {module} ({options}): {log}")]
    Compile {
        /// The module that failed (e.g. "the GROUP BY module", "leaf 8, rotation false").
        module: String,
        /// The NVRTC options, space separated.
        options: String,
        /// NVRTC's compile log.
        log: String,
    },
    /// NVRTC failed outside the compilation itself (creating the program, reading the PTX):
    /// a broken or mismatched NVRTC installation rather than a bad source.
    #[cfg(feature = "cuda")]
    #[error("NVRTC failed for {module}: {source}")]
    Nvrtc {
        /// The module that failed.
        module: String,
        /// cudarc's error.
        #[source]
        source: cudarc::nvrtc::CompileError,
    },
    /// NVRTC panicked inside cudarc (typically a symbol missing from an old `libnvrtc`); caught
    /// so that a compile can fail without taking the process down.
    #[error("NVRTC panicked while compiling {module}")]
    NvrtcPanicked {
        /// The module being compiled.
        module: String,
    },
    /// Compiled PTX lacks a kernel the host launches by name: the sources and the host's list
    /// of kernel names disagree (checked in CI, which has NVRTC but no GPU).
    #[error("PTX of {module} lacks kernel {kernel}")]
    MissingPtxKernel {
        /// The module whose PTX was checked.
        module: String,
        /// The kernel not found in it.
        kernel: String,
    },
    /// A loaded module has no function of a kernel's name (the same disagreement, found when
    /// the module is loaded on a device).
    #[cfg(feature = "cuda")]
    #[error("kernel {name} missing: {source}")]
    MissingKernel {
        /// The kernel's name.
        name: String,
        /// The driver's error.
        #[source]
        source: DriverError,
    },
    /// A CUDA driver call failed (context, stream, copy, launch, synchronization, attribute).
    /// `op` says which step, since the driver's code alone does not.
    #[cfg(feature = "cuda")]
    #[error("{op}: {source}")]
    Driver {
        /// The step that failed (e.g. "launching split_high").
        op: String,
        /// The driver's error.
        #[source]
        source: DriverError,
    },
    /// A device allocation failed for lack of device memory: unlike other driver failures this
    /// one depends on the input's size (and on what else holds the device), so it names the
    /// request.
    #[cfg(feature = "cuda")]
    #[error("{op}: out of device memory ({bytes} bytes requested)")]
    OutOfMemory {
        /// The step that allocated (e.g. "allocating descriptors").
        op: String,
        /// Bytes requested.
        bytes: u64,
        /// The driver's error (`CUDA_ERROR_OUT_OF_MEMORY`).
        #[source]
        source: DriverError,
    },
    /// A panic inside cudarc or around a launch, caught by `catch_unwind` at a public entry
    /// point: cudarc panics on a CUDA library that lacks a symbol, and a failed GPU call must
    /// become a CPU fallback, not an abort.
    #[error("{what} panicked")]
    Panicked {
        /// What was running (e.g. "the GPU build", "uploading the index").
        what: String,
    },
    /// A lock of the shared context (kernel cache, staging buffer) was poisoned by a panic
    /// while held: its content may be half-updated, so it is not used again.
    #[error("{what} poisoned")]
    Poisoned {
        /// The lock (e.g. "kernel cache").
        what: &'static str,
    },
    /// A node search on the device passed the watchdog limit of candidates, as the CPU search
    /// would (spec §2.4): the caller builds on the CPU, which reports it with its own error.
    #[error("a {search} search passed the watchdog (status {status:#x})")]
    Watchdog {
        /// "node" (split stages) or "leaf".
        search: &'static str,
        /// The kernel's status word.
        status: u32,
    },
    /// The leaf stage ran out of passes before every leaf had its descriptor (the watchdog
    /// normally ends a hopeless search first; this bounds the host loop).
    #[error("the leaf search did not end after {passes} passes")]
    LeafPasses {
        /// Passes run.
        passes: usize,
    },
    /// A value column whose type the GPU GROUP BY does not aggregate: decided before any
    /// device work, so the caller aggregates on the CPU.
    #[error("GPU GROUP BY does not aggregate {0} columns")]
    UnsupportedValueType(DataType),
    /// Decimal values whose absolute sum reaches 2^63: the kernels add in i64, so a sum could
    /// wrap where the CPU's 128-bit decimal sum would not. Refused instead of wrong.
    #[error("decimal values too large for exact 64-bit sums on the GPU")]
    DecimalOverflow,
    /// A probe column whose type cannot hold keys of the index's type (the CPU lookup refuses
    /// the same probe).
    #[error("probe type {probe} cannot be looked up in an index of type {index}")]
    ProbeType {
        /// The probe's type.
        probe: DataType,
        /// The index's key type.
        index: DataType,
    },
    /// Another input the GPU path does not take (a size beyond its 32-bit device forms, mixed
    /// column types, an aggregate without a GPU form); the reason is for the notice or the plan.
    #[error("{0}")]
    Unsupported(String),
    /// Host memory for a copy or a result could not be allocated: the allocator's refusal,
    /// reported instead of aborting the process.
    #[error("{0}")]
    HostMemory(String),
    /// Arrays passed together disagree in length (slots, value columns, an output buffer):
    /// a caller's bug, reported instead of reading past an array on the device.
    #[error("{0}")]
    LengthMismatch(String),
    /// An Arrow array without the buffers its type promises; the kernels read raw buffers, so
    /// it is refused before upload.
    #[error("{0}")]
    MalformedArray(&'static str),
    /// An Arrow operation on the host side of a GPU call failed (casting or concatenating the
    /// probe). Shared, because Arrow's error is not `Clone`.
    #[error("{op}: {source}")]
    Arrow {
        /// The step that failed.
        op: &'static str,
        /// Arrow's error.
        #[source]
        source: Arc<ArrowError>,
    },
    /// The device's results lack something the host asked for (row counts, an aggregate):
    /// found when the results are turned into states, before anything is returned.
    #[error("{0}")]
    MissingResult(&'static str),
    /// An invariant of the backend does not hold (e.g. a memo table that does not pack into
    /// the device's 32-bit form); a bug, reported as an error so the CPU still answers.
    #[error("{0}")]
    Internal(String),
}

/// Constructors for the backend's `map_err` calls (only the backend makes these errors).
#[cfg(feature = "cuda")]
impl GpuError {
    /// A [`GpuError::Panicked`] for `what`.
    pub(crate) fn panicked(what: impl Into<String>) -> Self {
        GpuError::Panicked { what: what.into() }
    }

    /// A [`GpuError::Arrow`] maker for the step `op`, for `map_err`.
    pub(crate) fn arrow(op: &'static str) -> impl FnOnce(ArrowError) -> Self {
        move |e| GpuError::Arrow {
            op,
            source: Arc::new(e),
        }
    }

    /// A [`GpuError::Driver`] maker for the step `op`, for `map_err` on a driver call.
    pub(crate) fn driver(op: impl Into<String>) -> impl FnOnce(DriverError) -> Self {
        move |source| GpuError::Driver { op: op.into(), source }
    }

    /// As [`GpuError::driver`] for a call that allocates `elements` values of `T` on the
    /// device: `CUDA_ERROR_OUT_OF_MEMORY` becomes [`GpuError::OutOfMemory`] with the bytes.
    pub(crate) fn alloc<T>(op: impl Into<String>, elements: usize) -> impl FnOnce(DriverError) -> Self {
        move |source| {
            if source.0 == cudarc::driver::sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY {
                GpuError::OutOfMemory {
                    op: op.into(),
                    bytes: (elements as u64).saturating_mul(std::mem::size_of::<T>() as u64),
                    source,
                }
            } else {
                GpuError::Driver { op: op.into(), source }
            }
        }
    }

    /// A [`GpuError::MissingKernel`] maker for the kernel `name`, for `map_err`.
    pub(crate) fn missing_kernel(name: &str) -> impl FnOnce(DriverError) -> Self + '_ {
        move |source| GpuError::MissingKernel {
            name: name.to_string(),
            source,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_keep_their_wording() {
        assert_eq!(GpuError::NotBuilt.to_string(), "built without the `cuda` feature");
        assert_eq!(
            GpuError::DecimalOverflow.to_string(),
            "decimal values too large for exact 64-bit sums on the GPU"
        );
        assert_eq!(
            GpuError::Panicked {
                what: "the GPU build".into()
            }
            .to_string(),
            "the GPU build panicked"
        );
        assert_eq!(
            GpuError::Watchdog {
                search: "leaf",
                status: 1
            }
            .to_string(),
            "a leaf search passed the watchdog (status 0x1)"
        );
        assert_eq!(
            GpuError::UnsupportedValueType(DataType::Utf8).to_string(),
            format!("GPU GROUP BY does not aggregate {} columns", DataType::Utf8)
        );
    }

    #[test]
    fn is_an_error_that_crosses_threads() {
        fn check<E: std::error::Error + Send + Sync + Clone + 'static>() {}
        check::<GpuError>();
    }
}
