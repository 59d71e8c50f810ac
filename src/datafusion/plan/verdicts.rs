//! The declines of one physical optimizer pass, handed from the rule that decided them to the
//! explain rule, so that a reason `EXPLAIN` shows costs no second decision.
//!
//! DataFusion runs the physical optimizer rules one after another, in one synchronous call on
//! one thread, and passes nothing from one to the next but the plan. So the aggregate and join
//! rules record here, per thread, each candidate they declined: the node decided on (held by
//! the record, so that its address stays unique), and for a join the aggregate above it that
//! it was priced with. The explain rule, the last of them, looks its candidates up first and
//! decides only those it finds no record for.
//!
//! Invariants:
//! - A record is used only for the very node it was made for (`Arc::ptr_eq`, the aggregate
//!   above too) and holds exactly what the explain rule's own decision would give: the same
//!   question asked of the same immutable subtree under the same settings. A node that a later
//!   rule rebuilt is decided again.
//! - Each rule clears its own kind of records when it starts, and the explain rule clears all
//!   of them when it ends, so no record outlives the pass after the one it was made in.

use std::cell::RefCell;
use std::sync::Arc;

use ::datafusion::physical_plan::ExecutionPlan;

use super::Declined;

/// What was decided about a node.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Question {
    /// The aggregate rule's decision for an aggregate, as the explain rule asks it (merged
    /// unless the plan runs distributed).
    Aggregate,
    /// The join rule's forms of a join.
    Join,
    /// The join rule's forms of a join swapped (only its probe key indexed).
    SwappedJoin,
}

/// Every question (the explain rule ends the pass with all of them forgotten).
pub const ALL: [Question; 3] = [Question::Aggregate, Question::Join, Question::SwappedJoin];

/// One declined candidate.
struct Record {
    question: Question,
    node: Arc<dyn ExecutionPlan>,
    above: Option<Arc<dyn ExecutionPlan>>,
    declined: Declined,
}

thread_local! {
    static RECORDS: RefCell<Vec<Record>> = const { RefCell::new(Vec::new()) };
}

/// Whether `a` and `b` are both absent or the same node.
fn same(a: Option<&Arc<dyn ExecutionPlan>>, b: Option<&Arc<dyn ExecutionPlan>>) -> bool {
    match (a, b) {
        (None, None) => true,
        (Some(a), Some(b)) => Arc::ptr_eq(a, b),
        _ => false,
    }
}

/// Forgets the records of the `questions` (a rule starting its pass).
pub fn clear(questions: &[Question]) {
    RECORDS.with_borrow_mut(|records| records.retain(|r| !questions.contains(&r.question)));
}

/// Records that `question`, asked of `node` (priced with the aggregate `above`), was declined.
pub fn record(
    question: Question,
    node: &Arc<dyn ExecutionPlan>,
    above: Option<&Arc<dyn ExecutionPlan>>,
    declined: &Declined,
) {
    RECORDS.with_borrow_mut(|records| {
        let known = records
            .iter()
            .any(|r| r.question == question && Arc::ptr_eq(&r.node, node) && same(r.above.as_ref(), above));
        if !known {
            records.push(Record {
                question,
                node: Arc::clone(node),
                above: above.cloned(),
                declined: declined.clone(),
            });
        }
    });
}

/// The decline recorded for `question` about `node` (priced with `above`), if any.
pub fn recorded(
    question: Question,
    node: &Arc<dyn ExecutionPlan>,
    above: Option<&Arc<dyn ExecutionPlan>>,
) -> Option<Declined> {
    RECORDS.with_borrow(|records| {
        records
            .iter()
            .find(|r| r.question == question && Arc::ptr_eq(&r.node, node) && same(r.above.as_ref(), above))
            .map(|r| r.declined.clone())
    })
}

#[cfg(test)]
mod tests {
    use ::datafusion::arrow::datatypes::Schema;
    use ::datafusion::physical_plan::empty::EmptyExec;

    use super::*;

    fn node() -> Arc<dyn ExecutionPlan> {
        Arc::new(EmptyExec::new(Arc::new(Schema::empty())))
    }

    #[test]
    fn a_record_answers_only_its_own_node_question_and_aggregate_above() {
        let (join, other, agg) = (node(), node(), node());
        let declined = Declined::new("too few slots".into(), None);
        clear(&ALL);
        record(Question::Join, &join, Some(&agg), &declined);
        assert_eq!(recorded(Question::Join, &join, Some(&agg)), Some(declined.clone()));
        assert_eq!(recorded(Question::Join, &join, None), None);
        assert_eq!(recorded(Question::SwappedJoin, &join, Some(&agg)), None);
        assert_eq!(recorded(Question::Join, &other, Some(&agg)), None);
        // A rule starting its pass forgets only its own kind.
        record(Question::Aggregate, &agg, None, &declined);
        clear(&[Question::Join, Question::SwappedJoin]);
        assert_eq!(recorded(Question::Join, &join, Some(&agg)), None);
        assert_eq!(recorded(Question::Aggregate, &agg, None), Some(declined));
        clear(&[Question::Aggregate]);
        assert_eq!(recorded(Question::Aggregate, &agg, None), None);
    }
}
