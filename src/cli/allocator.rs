//! How long the `mphf` binary's allocator (mimalloc) keeps memory that was freed before it
//! returns the pages to the OS (its *purge delay*).
//!
//! Why: at mimalloc's default of 10 ms, the pages one query freed are returned before the next
//! query runs, and the kernel faults them in and zeroes them again when it allocates. On the
//! 16-core hosts that zeroing was a large part of the system CPU of a query, for the extension
//! and for vanilla DataFusion alike; a delay of 1 s removes most of it (benches/RESULTS.md,
//! sessions 34 and 35). The price is memory: freed pages stay mapped for up to that long. On
//! the 24 GiB development machine TPC-H SF 10 in memory ran out of memory even at 10 ms, so:
//! - the longer delay applies only where the memory the process may use (the smaller of the
//!   machine's and its cgroup's limit) is at least [`KEEP_MIN_MEMORY_BYTES`];
//! - commands over large inputs return freed memory at once, on any machine
//!   ([`purge_freed_memory_at_once`]);
//! - `MIMALLOC_PURGE_DELAY` in the environment always wins: nothing here overrides it.

use std::ffi::c_long;

/// Least memory (bytes) for which freed memory is kept [`KEEP_MS`].
const KEEP_MIN_MEMORY_BYTES: u64 = 64 << 30;
/// The purge delay (ms) where memory allows.
const KEEP_MS: c_long = 1000;
/// The environment variable through which mimalloc reads its purge delay.
const PURGE_DELAY_ENV: &str = "MIMALLOC_PURGE_DELAY";

/// Sets mimalloc's purge delay to `ms`, unless the environment sets it.
fn set_purge_delay(ms: c_long) {
    if std::env::var_os(PURGE_DELAY_ENV).is_some() {
        return;
    }
    // mimalloc's `mi_option_purge_delay` (15) is the option just before `mi_option_use_numa_nodes`
    // in mimalloc.h's `mi_option_e`, in its v2 and v3 headers; the -sys crate does not name it.
    let purge_delay = libmimalloc_sys::mi_option_use_numa_nodes - 1;
    // SAFETY: `mi_option_set` stores an integer option; allocations do not depend on its old
    // value, and it is harmless when mimalloc is not the global allocator.
    unsafe { libmimalloc_sys::mi_option_set(purge_delay, ms) };
}

/// Keeps freed memory [`KEEP_MS`] where the process may use at least
/// [`KEEP_MIN_MEMORY_BYTES`]; leaves mimalloc's default otherwise.
pub(super) fn keep_freed_memory_where_it_fits() {
    if usable_memory_bytes().is_some_and(|bytes| bytes >= KEEP_MIN_MEMORY_BYTES) {
        set_purge_delay(KEEP_MS);
    }
}

/// Returns freed memory to the OS at once: for inputs that fill much of the machine's memory.
pub(super) fn purge_freed_memory_at_once() {
    set_purge_delay(0);
}

/// The memory this process may use: the machine's (`/proc/meminfo`), or its cgroup's limit
/// where that is smaller; `None` where neither can be read.
fn usable_memory_bytes() -> Option<u64> {
    let machine = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|text| mem_total_bytes(&text));
    let cgroup = std::fs::read_to_string("/sys/fs/cgroup/memory.max")
        .ok()
        .and_then(|text| text.trim().parse::<u64>().ok());
    match (machine, cgroup) {
        (Some(m), Some(c)) => Some(m.min(c)),
        (m, c) => m.or(c),
    }
}

/// `MemTotal` of a `/proc/meminfo` text, in bytes.
fn mem_total_bytes(meminfo: &str) -> Option<u64> {
    let line = meminfo.lines().find(|l| l.starts_with("MemTotal:"))?;
    let mut fields = line.split_whitespace().skip(1);
    let value: u64 = fields.next()?.parse().ok()?;
    match fields.next() {
        Some("kB") => value.checked_mul(1024),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_mem_total_in_bytes() {
        let meminfo = "MemTotal:       24577236 kB\nMemFree:        1000 kB\n";
        assert_eq!(mem_total_bytes(meminfo), Some(24_577_236 * 1024));
        assert_eq!(mem_total_bytes("MemFree: 10 kB\n"), None);
        assert_eq!(mem_total_bytes("MemTotal: 10 MB\n"), None);
        assert_eq!(mem_total_bytes("MemTotal: many kB\n"), None);
    }
}
