//! The slot scans made during one optimizer rule's pass, kept so that each is built once.
//!
//! Why: the join rule prices several forms of one join (one for one, collect, swapped), and
//! each form asks for a slot scan of the same table column; the aggregate rule may ask twice
//! for the same input too. Building a slot scan walks its table's file list: it finds every
//! file's slot map, copies the file's listing, and checks the output of a file scan. Done again
//! for every form, that was most of what the MPHF rules added to planning TPC-H over Parquet.
//!
//! The MPHF rules run one after another on one thread for each plan (aggregate, join, explain),
//! and each asks for the scans of the same table columns: the explain rule prices the
//! candidates the other two declined. So the memo can also span one plan's optimization: the
//! aggregate rule, the first, starts it ([`plan_starts`], which forgets whatever an earlier
//! plan left) and the explain rule, the last, ends it ([`plan_ends`]).
//!
//! A rule that only needs to know whether a scan exists (a candidate's price, which may well
//! be a decline) asks [`scan_exists`], which answers without building the scan; the answer is
//! kept like a scan, and a scan known not to exist is never built.
//!
//! Invariants:
//! - Only inside a pass (a [`Pass`] guard alive on this thread) or a plan's optimization:
//!   outside both, nothing is kept and every request builds its scan.
//! - An entry is keyed by the node the scan replaces (held by the entry, so that its address
//!   stays unique while the entry lives), the key column, the index and whether the operator
//!   reads the key of rows that have a slot. The same inputs build an equal scan, so handing
//!   out the first one changes no plan; a node rebuilt by a rule is a new key.
//! - When the last guard of a pass drops outside a plan's optimization, or the plan's
//!   optimization ends, every entry is dropped. A plan whose optimization stopped early (a rule
//!   failed) leaves its entries until the next plan starts; they are never handed to it.

use std::cell::RefCell;
use std::sync::Arc;

use ::datafusion::common::Result;
use ::datafusion::physical_plan::ExecutionPlan;

/// What identifies a slot scan within a pass (see the module docs), and what is known of it.
struct Entry {
    node: Arc<dyn ExecutionPlan>,
    key: usize,
    index: u64,
    reads_key: bool,
    known: Known,
}

impl Entry {
    /// Whether this entry is for these inputs.
    fn is_for(&self, node: &Arc<dyn ExecutionPlan>, key: usize, index: u64, reads_key: bool) -> bool {
        Arc::ptr_eq(&self.node, node) && self.key == key && self.index == index && self.reads_key == reads_key
    }
}

/// What a pass knows of the slot scan of one entry's inputs.
#[derive(Clone)]
enum Known {
    /// The scan was made (`None`: there is none for these inputs).
    Made(Option<Arc<dyn ExecutionPlan>>),
    /// Only whether there is one was asked.
    Exists(bool),
}

/// The pass depth on this thread, whether a plan's optimization is running, and the scans.
#[derive(Default)]
struct Memo {
    passes: usize,
    plan: bool,
    entries: Vec<Entry>,
}

impl Memo {
    fn active(&self) -> bool {
        self.passes > 0 || self.plan
    }
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
            match m.active() {
                false => std::mem::take(&mut m.entries),
                true => Vec::new(),
            }
        });
        drop(dropped);
    }
}

/// Starts one plan's optimization on this thread (the first MPHF rule): the scans of an
/// earlier plan are forgotten, and those made from now on are kept until [`plan_ends`].
pub fn plan_starts() {
    let dropped = MEMO.with_borrow_mut(|m| {
        m.plan = true;
        std::mem::take(&mut m.entries)
    });
    drop(dropped);
}

/// Ends the plan's optimization on this thread (the last MPHF rule): its scans are dropped,
/// unless a pass still runs, whose guard drops them.
pub fn plan_ends() {
    let dropped = MEMO.with_borrow_mut(|m| {
        m.plan = false;
        match m.active() {
            false => std::mem::take(&mut m.entries),
            true => Vec::new(),
        }
    });
    drop(dropped);
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
    let (active, known) = known(node, key, index, reads_key);
    match known {
        Some(Known::Made(scan)) => return Ok(scan),
        Some(Known::Exists(false)) => return Ok(None),
        Some(Known::Exists(true)) | None => {}
    }
    let scan = make()?;
    if active {
        remember(node, key, index, reads_key, Known::Made(scan.clone()));
    }
    Ok(scan)
}

/// Whether there is a slot scan replacing `node` (the inputs of [`scan_for`]): known from a
/// scan made or an answer given earlier in this pass, else `check`'s answer, kept for the rest
/// of the pass. `check` must answer exactly whether `make` would give a scan; it need not build
/// one (a candidate that is declined never needs its scan).
///
/// # Errors
/// `check`'s; a failure is not kept.
pub fn scan_exists(
    node: &Arc<dyn ExecutionPlan>,
    key: usize,
    index: u64,
    reads_key: bool,
    check: impl FnOnce() -> Result<bool>,
) -> Result<bool> {
    let (active, known) = known(node, key, index, reads_key);
    match known {
        Some(Known::Made(scan)) => return Ok(scan.is_some()),
        Some(Known::Exists(exists)) => return Ok(exists),
        None => {}
    }
    let exists = check()?;
    if active {
        remember(node, key, index, reads_key, Known::Exists(exists));
    }
    Ok(exists)
}

/// Whether the memo is active, and what it knows of these inputs' scan.
fn known(node: &Arc<dyn ExecutionPlan>, key: usize, index: u64, reads_key: bool) -> (bool, Option<Known>) {
    MEMO.with_borrow(|m| {
        let known = m
            .entries
            .iter()
            .find(|e| e.is_for(node, key, index, reads_key))
            .map(|e| e.known.clone());
        (m.active(), known)
    })
}

/// Keeps `known` for these inputs, in place of what was known before.
fn remember(node: &Arc<dyn ExecutionPlan>, key: usize, index: u64, reads_key: bool, known: Known) {
    // Taken out first: dropping plan nodes must not run under the memo's borrow.
    let replaced = MEMO.with_borrow_mut(|m| {
        let at = m.entries.iter().position(|e| e.is_for(node, key, index, reads_key));
        let entry = Entry {
            node: Arc::clone(node),
            key,
            index,
            reads_key,
            known,
        };
        match at {
            Some(at) => Some(std::mem::replace(&mut m.entries[at], entry)),
            None => {
                m.entries.push(entry);
                None
            }
        }
    });
    drop(replaced);
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

    #[test]
    fn an_answer_to_whether_a_scan_exists_is_kept_and_builds_nothing() {
        let (mapped, unmapped) = (node(), node());
        let (built, checked) = (Cell::new(0), Cell::new(0));
        let make = || {
            built.set(built.get() + 1);
            Ok(Some(node()))
        };
        let check = |answer: bool| {
            let checked = &checked;
            move || {
                checked.set(checked.get() + 1);
                Ok(answer)
            }
        };
        let _pass = pass();
        // Asked twice, checked once, and nothing built.
        assert!(scan_exists(&mapped, 0, 7, true, check(true)).unwrap());
        assert!(scan_exists(&mapped, 0, 7, true, check(true)).unwrap());
        assert_eq!((checked.get(), built.get()), (1, 0));
        // A scan known to exist is built when it is wanted, once.
        let scan = scan_for(&mapped, 0, 7, true, make).unwrap().unwrap();
        let again = scan_for(&mapped, 0, 7, true, make).unwrap().unwrap();
        assert!(Arc::ptr_eq(&scan, &again));
        assert_eq!(built.get(), 1);
        // A scan known not to exist is not built; a scan made answers without a check.
        assert!(!scan_exists(&unmapped, 0, 7, true, check(false)).unwrap());
        assert!(scan_for(&unmapped, 0, 7, true, make).unwrap().is_none());
        assert!(scan_exists(&mapped, 0, 7, true, check(false)).unwrap());
        assert_eq!((checked.get(), built.get()), (2, 1));
        // Another key column is another question.
        assert!(!scan_exists(&mapped, 1, 7, true, check(false)).unwrap());
        assert_eq!(checked.get(), 3);
    }

    #[test]
    fn a_plans_rules_share_its_scans_and_the_next_plan_starts_afresh() {
        let relabel = node();
        let built = Cell::new(0);
        let make = || {
            built.set(built.get() + 1);
            Ok(Some(node()))
        };
        plan_starts();
        let first = {
            let _aggregate = pass();
            scan_for(&relabel, 0, 7, true, make).unwrap().unwrap()
        };
        // The aggregate rule's pass ended, the plan did not: the join rule gets the same scan.
        {
            let _join = pass();
            let again = scan_for(&relabel, 0, 7, true, make).unwrap().unwrap();
            assert!(Arc::ptr_eq(&first, &again));
        }
        assert_eq!(built.get(), 1);
        {
            // The explain rule ends the plan inside its pass: the scans go with the pass.
            let _explain = pass();
            plan_ends();
            scan_for(&relabel, 0, 7, true, make).unwrap();
            assert_eq!(built.get(), 1);
        }
        assert_eq!(Arc::strong_count(&first), 1);
        // A plan that stopped early leaves its scans to the next plan's start, which drops them.
        plan_starts();
        let left = scan_for(&relabel, 0, 7, true, make).unwrap().unwrap();
        assert_eq!(built.get(), 2);
        plan_starts();
        assert_eq!(Arc::strong_count(&left), 1);
        plan_ends();
    }
}
