//! The slot scans made during one optimizer rule's pass, kept so that each is built once.
//!
//! Why: the join rule prices several forms of one join (one for one, collect, swapped), and
//! each form asks for a slot scan of the same table column; the aggregate rule may ask twice
//! for the same input too. Building a slot scan walks its table's file list: it finds every
//! file's slot map, copies the file's listing, and checks the output of a file scan. Done again
//! for every form, that was most of what the MPHF rules added to planning TPC-H over Parquet.
//!
//! Invariants:
//! - Only inside a pass (a [`Pass`] guard alive on this thread): outside one, nothing is kept
//!   and every request builds its scan.
//! - An entry is keyed by the node the scan replaces (held by the entry, so that its address
//!   stays unique while the entry lives), the key column, the index and whether the operator
//!   reads the key of rows that have a slot. The same inputs build an equal scan, so handing
//!   out the first one changes no plan; a node rebuilt by a rule is a new key.
//! - When the last guard of a pass drops, every entry is dropped: no plan node is kept past the
//!   rule that made it.

use std::cell::RefCell;
use std::sync::Arc;

use ::datafusion::common::Result;
use ::datafusion::physical_plan::ExecutionPlan;

/// What identifies a slot scan within a pass (see the module docs).
struct Entry {
    node: Arc<dyn ExecutionPlan>,
    key: usize,
    index: u64,
    reads_key: bool,
    scan: Option<Arc<dyn ExecutionPlan>>,
}

/// The pass depth on this thread and its scans.
#[derive(Default)]
struct Memo {
    passes: usize,
    entries: Vec<Entry>,
}

thread_local! {
    static MEMO: RefCell<Memo> = RefCell::new(Memo::default());
}

/// A pass's hold on the memo: scans are kept while at least one guard lives on this thread.
#[must_use = "the memo keeps scans only while the guard lives"]
pub struct Pass(());

/// Starts a pass (or joins the one running on this thread).
pub fn pass() -> Pass {
    MEMO.with_borrow_mut(|m| m.passes += 1);
    Pass(())
}

impl Drop for Pass {
    fn drop(&mut self) {
        // Taken out first: dropping plan nodes must not run under the memo's borrow.
        let dropped = MEMO.with_borrow_mut(|m| {
            m.passes = m.passes.saturating_sub(1);
            match m.passes {
                0 => std::mem::take(&mut m.entries),
                _ => Vec::new(),
            }
        });
        drop(dropped);
    }
}

/// The slot scan replacing `node` for its column `key`, index `index` (`reads_key`: the
/// operator reads the key of rows that have a slot): the one made earlier in this pass, else
/// `make`'s, kept for the rest of the pass. `None` (no scan for these inputs) is kept too.
///
/// # Errors
/// `make`'s; a failure is not kept.
pub fn scan_for(
    node: &Arc<dyn ExecutionPlan>,
    key: usize,
    index: u64,
    reads_key: bool,
    make: impl FnOnce() -> Result<Option<Arc<dyn ExecutionPlan>>>,
) -> Result<Option<Arc<dyn ExecutionPlan>>> {
    let same = |e: &Entry| Arc::ptr_eq(&e.node, node) && e.key == key && e.index == index && e.reads_key == reads_key;
    let (active, found) =
        MEMO.with_borrow(|m| (m.passes > 0, m.entries.iter().find(|e| same(e)).map(|e| e.scan.clone())));
    if let Some(scan) = found {
        return Ok(scan);
    }
    let scan = make()?;
    if active {
        MEMO.with_borrow_mut(|m| {
            m.entries.push(Entry {
                node: Arc::clone(node),
                key,
                index,
                reads_key,
                scan: scan.clone(),
            })
        });
    }
    Ok(scan)
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;

    use ::datafusion::arrow::datatypes::Schema;
    use ::datafusion::physical_plan::empty::EmptyExec;

    use super::*;

    fn node() -> Arc<dyn ExecutionPlan> {
        Arc::new(EmptyExec::new(Arc::new(Schema::empty())))
    }

    #[test]
    fn a_pass_builds_each_scan_once_and_forgets_them_when_it_ends() {
        let (relabel, other) = (node(), node());
        let built = Cell::new(0);
        let make = || {
            built.set(built.get() + 1);
            Ok(Some(node()))
        };
        // Outside a pass every request builds.
        scan_for(&relabel, 0, 7, true, make).unwrap();
        scan_for(&relabel, 0, 7, true, make).unwrap();
        assert_eq!(built.get(), 2);
        let first = {
            let _pass = pass();
            let first = scan_for(&relabel, 0, 7, true, make).unwrap().unwrap();
            {
                // A nested pass shares the memo and does not end it.
                let _inner = pass();
                let again = scan_for(&relabel, 0, 7, true, make).unwrap().unwrap();
                assert!(Arc::ptr_eq(&first, &again));
            }
            let again = scan_for(&relabel, 0, 7, true, make).unwrap().unwrap();
            assert!(Arc::ptr_eq(&first, &again));
            assert_eq!(built.get(), 3);
            // Another node, key column, index or key use is another scan.
            scan_for(&other, 0, 7, true, make).unwrap();
            scan_for(&relabel, 1, 7, true, make).unwrap();
            scan_for(&relabel, 0, 8, true, make).unwrap();
            scan_for(&relabel, 0, 7, false, make).unwrap();
            assert_eq!(built.get(), 7);
            // A request that found no scan is kept as such.
            let none = || Ok(None);
            assert!(scan_for(&other, 3, 7, true, none).unwrap().is_none());
            assert!(scan_for(&other, 3, 7, true, make).unwrap().is_none());
            assert_eq!(built.get(), 7);
            first
        };
        // The pass ended: its scans are gone, the memo holds no node.
        assert_eq!(Arc::strong_count(&first), 1);
        let next = {
            let _pass = pass();
            scan_for(&relabel, 0, 7, true, make).unwrap().unwrap()
        };
        assert!(!Arc::ptr_eq(&first, &next));
        assert_eq!(built.get(), 8);
    }
}
