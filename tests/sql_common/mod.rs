//! Shared by the SQL operator tests (`test_groupby`, `test_join`).

use datafusion::arrow::util::pretty::pretty_format_batches;
use std::sync::Arc;

use datafusion::physical_plan::{displayable, ExecutionPlan};
use datafusion_mphf::datafusion::MphfContext;

/// Runs `sql`: its result rows pretty-printed and sorted (order-insensitive comparison), and the
/// physical plan text.
pub async fn run(ctx: &MphfContext, sql: &str) -> (Vec<String>, String) {
    let df = ctx.sql(sql).await.unwrap();
    let plan = df.clone().create_physical_plan().await.unwrap();
    let plan_text = displayable(plan.as_ref()).indent(true).to_string();
    let batches = df.collect().await.unwrap();
    let text = pretty_format_batches(&batches).unwrap().to_string();
    let mut lines: Vec<String> = text.lines().map(str::to_string).collect();
    lines.sort();
    (lines, plan_text)
}

/// The first node named `name` in `plan`, depth first.
pub fn find_node(plan: &Arc<dyn ExecutionPlan>, name: &str) -> Option<Arc<dyn ExecutionPlan>> {
    if plan.name() == name {
        return Some(Arc::clone(plan));
    }
    plan.children().into_iter().find_map(|c| find_node(c, name))
}
