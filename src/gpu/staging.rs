//! Pinned (page-locked) host staging for bulk host → device and device → host copies.
//!
//! Why: copies from ordinary (pageable) memory run at about 6 GB/s on the H200 host, because the
//! driver bounces them through its own small pinned buffers; from pinned memory the DMA engine
//! reads the host directly (tens of GB/s). Pinning costs milliseconds per allocation, so each
//! context keeps one upload and one download buffer, grown on demand and reused. Filling the
//! upload buffer on all cores also replaces the concatenation of a column's batches.
//!
//! Invariants: a staging buffer is used under its mutex only, and every copy through it is
//! complete (stream synchronized) before the mutex is released, so the next user never
//! overwrites memory a copy still reads, nor reads memory a copy still writes.
//!
//! No caller ever waits for a staging mutex: one that finds it taken copies through ordinary
//! memory instead ([`free_buffer`]). Why: the fills and reads under the mutex run rayon loops,
//! and callers run on rayon workers (the slot maps of a table's files are made in parallel). A
//! worker waiting for its own loop runs other queued jobs meanwhile, on the same thread; one
//! of them may be another file's upload, which would wait for a mutex its own thread holds,
//! forever (a `CREATE INDEX` on the GPU host hung so: benches/RESULTS.md, session 44).

use std::sync::{Mutex, MutexGuard, TryLockError};

use arrow::array::{Array, BooleanBufferBuilder};
use cudarc::driver::sys::CU_MEMHOSTALLOC_WRITECOMBINED;
use cudarc::driver::{CudaSlice, CudaView, PinnedHostSlice};
use rayon::prelude::*;

use super::{GpuContext, GpuError};

/// The staging buffers of one context.
#[derive(Default)]
pub(crate) struct Staging {
    /// Write-combined (fast for the host to write, slow to read): uploads only.
    upload: Mutex<Option<PinnedHostSlice<u64>>>,
    /// Cached pinned memory: downloads.
    download: Mutex<Option<PinnedHostSlice<u64>>>,
}

/// Ensures `slot` holds a pinned buffer of at least `words` u64 (grown to a power of two).
fn ensure(ctx: &GpuContext, slot: &mut Option<PinnedHostSlice<u64>>, words: usize, flags: u32) -> Result<(), GpuError> {
    if slot.as_ref().is_some_and(|b| b.len() >= words) {
        return Ok(());
    }
    *slot = None;
    let len = words.max(1 << 16).next_power_of_two();
    // SAFETY: the memory is uninitialized; every user writes the words it copies (uploads) or
    // has them written by the device (downloads) before reading them.
    let buffer = unsafe { ctx.ctx.alloc_pinned_with_flags::<u64>(len, flags) }.map_err(GpuError::driver(format!(
        "allocating {} MiB of pinned host memory",
        (len * 8) >> 20
    )))?;
    *slot = Some(buffer);
    Ok(())
}

/// The staging buffer behind `lock` when no one holds it, `None` when it is taken (the caller
/// copies through ordinary memory; see the module docs for why it never waits).
fn free_buffer(
    lock: &Mutex<Option<PinnedHostSlice<u64>>>,
) -> Result<Option<MutexGuard<'_, Option<PinnedHostSlice<u64>>>>, GpuError> {
    match lock.try_lock() {
        Ok(guard) => Ok(Some(guard)),
        Err(TryLockError::WouldBlock) => Ok(None),
        Err(TryLockError::Poisoned(_)) => Err(GpuError::Poisoned { what: "staging buffer" }),
    }
}

/// `words` zeroed u64 in ordinary memory (the copy path of a taken staging buffer); an
/// allocation failure is an error, not an abort.
fn host_words(words: usize) -> Result<Vec<u64>, GpuError> {
    let mut host = crate::error::try_with_capacity(words, || format!("{words} words of host staging"))
        .map_err(|e| GpuError::HostMemory(e.to_string()))?;
    host.resize(words, 0);
    Ok(host)
}

/// The error of a staging slot left empty after [`ensure`] filled it (cannot happen).
fn no_buffer() -> GpuError {
    GpuError::Internal("no staging buffer".into())
}

/// `out` cut into consecutive pieces of `lens` elements, and what is left after them (for the
/// parallel fills of a staging buffer, one piece per part).
pub(crate) fn split_by_lens<T>(out: &mut [T], lens: impl IntoIterator<Item = usize>) -> (Vec<&mut [T]>, &mut [T]) {
    let mut pieces = Vec::new();
    let mut rest = out;
    for len in lens {
        let (head, tail) = rest.split_at_mut(len);
        pieces.push(head);
        rest = tail;
    }
    (pieces, rest)
}

impl GpuContext {
    /// The validity of `parts` concatenated into one device bitmap from bit 0 (with its bit
    /// offset, 0), or `None` when no row is NULL.
    ///
    /// # Errors
    /// Device allocation or copy failures.
    pub(crate) fn upload_validity(&self, parts: &[&dyn Array]) -> Result<Option<(CudaSlice<u8>, u64)>, GpuError> {
        if parts.iter().all(|p| p.logical_null_count() == 0) {
            return Ok(None);
        }
        let rows = parts.iter().map(|p| p.len()).sum();
        let mut bits = BooleanBufferBuilder::new(rows);
        for p in parts {
            match p.logical_nulls() {
                Some(n) => bits.append_buffer(n.inner()),
                None => bits.append_n(p.len(), true),
            }
        }
        let bits = bits.finish();
        let device = self
            .stream
            .clone_htod(bits.values())
            .map_err(GpuError::alloc::<u8>("uploading the validity", bits.values().len()))?;
        Ok(Some((device, 0)))
    }

    /// A new device buffer of `words` u64 written by `fill` through the pinned upload buffer, or
    /// through ordinary memory while another caller holds it (`fill` gets exactly `words` words
    /// and must write all of them; it may use all cores).
    ///
    /// # Errors
    /// Pinned, host or device allocation, copy or synchronization failures.
    pub(crate) fn upload_staged(
        &self,
        words: usize,
        fill: impl FnOnce(&mut [u64]) -> Result<(), GpuError>,
    ) -> Result<CudaSlice<u64>, GpuError> {
        let Some(mut guard) = free_buffer(&self.staging.upload)? else {
            // At least one word, as below: a device buffer is never empty.
            let mut host = host_words(words.max(1))?;
            fill(&mut host[..words])?;
            let device = self
                .stream
                .clone_htod(&host)
                .map_err(GpuError::alloc::<u64>("uploading", host.len()))?;
            // `host` is dropped below: the copy must have read it.
            self.stream
                .synchronize()
                .map_err(GpuError::driver("synchronizing the upload"))?;
            return Ok(device);
        };
        ensure(self, &mut guard, words, CU_MEMHOSTALLOC_WRITECOMBINED)?;
        let buffer = guard.as_mut().ok_or_else(no_buffer)?;
        let host = &mut buffer
            .as_mut_slice()
            .map_err(GpuError::driver("waiting for the staging buffer"))?[..words];
        fill(host)?;
        // SAFETY: every element is written by the copy below before any kernel reads it.
        let mut device = unsafe { self.stream.alloc::<u64>(words.max(1)) }
            .map_err(GpuError::alloc::<u64>("allocating", words.max(1)))?;
        if words > 0 {
            // The slice lies in pinned memory, so the driver copies it by DMA asynchronously;
            // the synchronization keeps the buffer untouched until the copy is done.
            self.stream
                .memcpy_htod(&*host, &mut device)
                .map_err(GpuError::driver("copying to the device"))?;
            self.stream
                .synchronize()
                .map_err(GpuError::driver("synchronizing the upload"))?;
        }
        Ok(device)
    }

    /// The first `words` u64 of `device` copied back through the pinned download buffer.
    ///
    /// # Errors
    /// Pinned allocation, copy or synchronization failures.
    pub(crate) fn download_staged(&self, device: &CudaSlice<u64>, words: usize) -> Result<Vec<u64>, GpuError> {
        let words = words.min(device.len());
        self.download_words(&device.slice(..words), |host| host.par_iter().copied().collect())
    }

    /// Copies the first `out.len()` u32 of `device` into `out` through the pinned download
    /// buffer (the copy runs at DMA speed; the host copy out of the buffer runs on all cores).
    ///
    /// # Errors
    /// A device slice too short to hold `out.len()` values rounded up to an even count; pinned
    /// allocation, copy or synchronization failures.
    pub(crate) fn download_staged_u32(&self, device: &CudaSlice<u32>, out: &mut [u32]) -> Result<(), GpuError> {
        if out.is_empty() {
            return Ok(());
        }
        let words = out.len().div_ceil(2);
        // SAFETY: a view of the first `words` u64 of the u32 buffer's memory; `transmute` checks
        // that `device` holds at least `2 · words` u32 and returns None otherwise. Every bit
        // pattern is a valid u64.
        let view = unsafe { device.transmute::<u64>(words) }.ok_or_else(|| {
            GpuError::LengthMismatch(format!("a slot buffer of {} for {} rows", device.len(), out.len()))
        })?;
        self.download_words(&view, |host| {
            // SAFETY: a u32 view of the words just written (u32's alignment divides u64's, and
            // the view covers exactly the words' bytes); it lives no longer than `host`.
            let values = unsafe { std::slice::from_raw_parts(host.as_ptr().cast::<u32>(), host.len() * 2) };
            let len = out.len();
            out.par_chunks_mut(1 << 16)
                .zip(values[..len].par_chunks(1 << 16))
                .for_each(|(o, v)| o.copy_from_slice(v));
        })
    }

    /// Copies `device` into the pinned download buffer (under its mutex, synchronized), or into
    /// ordinary memory while another caller holds it, and hands the copied words to `read`.
    fn download_words<R>(&self, device: &CudaView<'_, u64>, read: impl FnOnce(&[u64]) -> R) -> Result<R, GpuError> {
        let words = device.len();
        let Some(mut guard) = free_buffer(&self.staging.download)? else {
            let mut host = host_words(words)?;
            self.stream
                .memcpy_dtoh(device, &mut host)
                .map_err(GpuError::driver("copying from the device"))?;
            self.stream
                .synchronize()
                .map_err(GpuError::driver("synchronizing the download"))?;
            return Ok(read(&host));
        };
        ensure(self, &mut guard, words, 0)?;
        let buffer = guard.as_mut().ok_or_else(no_buffer)?;
        let host = &mut buffer
            .as_mut_slice()
            .map_err(GpuError::driver("waiting for the staging buffer"))?[..words];
        self.stream
            .memcpy_dtoh(device, &mut *host)
            .map_err(GpuError::driver("copying from the device"))?;
        self.stream
            .synchronize()
            .map_err(GpuError::driver("synchronizing the download"))?;
        Ok(read(host))
    }
}
