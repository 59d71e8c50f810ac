//! What the aggregate rule knows about its input's columns and rows: the functional dependence
//! of group expressions on an indexed key (when `GROUP BY k, c1, …, cn` may run on the slots of
//! `k` alone, issue 4 item 4). The row estimate (module [`estimate`](super::estimate)) reads
//! the same facts to see through key–foreign-key joins.
//!
//! TPC-H groups by a key and columns that follow from it: Q3 `l_orderkey, o_orderdate,
//! o_shippriority` (orders joined on `o_orderkey = l_orderkey`), Q10 the customer's columns
//! with its `c_custkey`, Q18 `o_orderkey` with its order's and customer's columns. If every
//! `ci` is a function of `k` in the aggregate's input, the groups of `(k, c1, …)` are the groups
//! of `k`.
//!
//! # The proof
//! Columns of the aggregate's input are traced to their **origin**, a column of a leaf (a table
//! scan, or the [`MphfRelabelExec`] above it that names the indexes), through projections
//! (plain column references), filters, exchanges, sorts, limits and joins (each side's columns
//! of a join row come from one row of that side). Inner equi-joins add **equalities** between
//! the origins of their key pairs. The set `D` of origins determined by the key's origin grows
//! until it is stable:
//! - an origin in `D` whose leaf column carries an index built without duplicates (a unique key
//!   of its table) determines its leaf's row, so every column of that leaf is in `D`;
//! - an equality `a = b` with `a` in `D` puts `b` in `D`.
//!
//! A group expression depends on the key when every column it reads has its origin in `D`.
//!
//! # Why a wrong proof is harmless
//! The operator compares each row's dependent values with its group's (see
//! [`grouping`](super::grouping)) and gives a differing row a group of its own, so results never
//! depend on the proof (a stale index, a self-join that reuses one scan node). The proof only
//! keeps the operator off groupings where most rows would differ and take the slower path.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use ::datafusion::common::JoinType;
use ::datafusion::physical_expr::expressions::Column;
use ::datafusion::physical_expr::utils::collect_columns;
use ::datafusion::physical_expr::PhysicalExpr;
use ::datafusion::physical_plan::filter::FilterExec;
use ::datafusion::physical_plan::joins::utils::{build_join_schema, JoinOnRef};
use ::datafusion::physical_plan::joins::{HashJoinExec, SortMergeJoinExec};
use ::datafusion::physical_plan::projection::ProjectionExec;
use ::datafusion::physical_plan::ExecutionPlan;

use crate::datafusion::join::rule::passes_rows;
use crate::datafusion::join::MphfJoinExec;
use crate::datafusion::registry::index_of_field;
use crate::datafusion::table::MphfRelabelExec;

/// A column of a leaf node (identified by its address while the plan is being optimized).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(super) struct Origin {
    leaf: usize,
    column: usize,
}

/// What is known about the output columns of a plan.
#[derive(Default)]
pub(super) struct Lineage {
    /// Origin of each output column (`None`: computed, or through a node not understood).
    columns: Vec<Option<Origin>>,
    /// Pairs of origins equal in every output row (inner equi-joins below).
    equalities: Vec<(Origin, Origin)>,
    /// Origins that are unique keys of their leaf (an index built without duplicates), with
    /// their index's slot count.
    pub(super) unique: HashMap<Origin, u64>,
}

impl Lineage {
    /// A leaf's columns, its unique indexed columns marked.
    fn leaf(plan: &Arc<dyn ExecutionPlan>) -> Self {
        let leaf = Arc::as_ptr(plan) as *const () as usize;
        let schema = plan.schema();
        let columns: Vec<Option<Origin>> = (0..schema.fields().len())
            .map(|column| Some(Origin { leaf, column }))
            .collect();
        let unique = schema
            .fields()
            .iter()
            .enumerate()
            .filter_map(|(column, f)| {
                let handle = index_of_field(f)?;
                let index = handle.index();
                (!index.stats().had_duplicates() && index.keys().data_type() == f.data_type())
                    .then(|| (Origin { leaf, column }, index.len()))
            })
            .collect();
        Self {
            columns,
            equalities: Vec::new(),
            unique,
        }
    }

    /// The same facts, output columns picked by `projection`.
    fn project(mut self, projection: Option<&[usize]>) -> Self {
        if let Some(p) = projection {
            self.columns = p.iter().map(|&i| self.columns.get(i).copied().flatten()).collect();
        }
        self
    }

    /// The origin of `expr` when it is a plain column.
    pub(super) fn origin_of(&self, expr: &Arc<dyn PhysicalExpr>) -> Option<Origin> {
        let col = expr.downcast_ref::<Column>()?;
        self.columns.get(col.index()).copied().flatten()
    }
}

/// The lineage of a join's output: `left`/`right` lineages laid out as the join lays out its
/// columns, then `projection`; inner joins add their key equalities.
fn join_lineage(
    left: &Arc<dyn ExecutionPlan>,
    right: &Arc<dyn ExecutionPlan>,
    join_type: JoinType,
    on: JoinOnRef,
    projection: Option<&[usize]>,
) -> Lineage {
    let l = lineage(left);
    let r = lineage(right);
    let (_, indices) = build_join_schema(&left.schema(), &right.schema(), &join_type);
    let columns = indices
        .iter()
        .map(|c| match c.side {
            ::datafusion::common::JoinSide::Left => l.columns.get(c.index).copied().flatten(),
            ::datafusion::common::JoinSide::Right => r.columns.get(c.index).copied().flatten(),
            ::datafusion::common::JoinSide::None => None,
        })
        .collect();
    let mut equalities = Vec::new();
    if join_type == JoinType::Inner {
        equalities.extend(on.iter().filter_map(|(a, b)| Some((l.origin_of(a)?, r.origin_of(b)?))));
    }
    equalities.extend(l.equalities);
    equalities.extend(r.equalities);
    let mut unique = l.unique;
    unique.extend(r.unique);
    Lineage {
        columns,
        equalities,
        unique,
    }
    .project(projection)
}

/// What is known about `plan`'s output columns (see the module docs).
pub(super) fn lineage(plan: &Arc<dyn ExecutionPlan>) -> Lineage {
    if plan.downcast_ref::<MphfRelabelExec>().is_some() || plan.children().is_empty() {
        return Lineage::leaf(plan);
    }
    if let Some(f) = plan.downcast_ref::<FilterExec>() {
        return lineage(f.input()).project(f.projection().as_deref());
    }
    if let Some(p) = plan.downcast_ref::<ProjectionExec>() {
        let mut input = lineage(p.input());
        input.columns = p.expr().iter().map(|e| input.origin_of(&e.expr)).collect();
        return input;
    }
    if let Some(j) = plan.downcast_ref::<MphfJoinExec>() {
        let j = j.join();
        return join_lineage(j.left(), j.right(), *j.join_type(), j.on(), j.projection.as_deref());
    }
    if let Some(j) = plan.downcast_ref::<HashJoinExec>() {
        return join_lineage(j.left(), j.right(), *j.join_type(), j.on(), j.projection.as_deref());
    }
    if let Some(j) = plan.downcast_ref::<SortMergeJoinExec>() {
        return join_lineage(j.left(), j.right(), j.join_type(), j.on(), None);
    }
    match plan.children().as_slice() {
        [child] if passes_rows(plan) => lineage(child),
        _ => Lineage {
            columns: vec![None; plan.schema().fields().len()],
            ..Lineage::default()
        },
    }
}

/// True when every column read by each of `dependents` is a function of input column `key` of
/// `input` (see the module docs).
pub(super) fn depends_on_key(
    input: &Arc<dyn ExecutionPlan>,
    key: usize,
    dependents: &[&Arc<dyn PhysicalExpr>],
) -> bool {
    let lin = lineage(input);
    let Some(key_origin) = lin.columns.get(key).copied().flatten() else {
        return false;
    };
    let mut determined: HashSet<Origin> = HashSet::from([key_origin]);
    let mut rows: HashSet<usize> = HashSet::new();
    loop {
        let mut changed = false;
        for o in &determined {
            if lin.unique.contains_key(o) {
                changed |= rows.insert(o.leaf);
            }
        }
        let known = |o: &Origin, d: &HashSet<Origin>| d.contains(o) || rows.contains(&o.leaf);
        let mut new = Vec::new();
        for (a, b) in &lin.equalities {
            match (known(a, &determined), known(b, &determined)) {
                (true, false) => new.push(*b),
                (false, true) => new.push(*a),
                _ => {}
            }
        }
        for o in new {
            changed |= determined.insert(o);
        }
        if !changed {
            break;
        }
    }
    dependents.iter().all(|expr| {
        collect_columns(expr).iter().all(|c| {
            lin.columns
                .get(c.index())
                .copied()
                .flatten()
                .is_some_and(|o| determined.contains(&o) || rows.contains(&o.leaf))
        })
    })
}
