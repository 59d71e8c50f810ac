//! Shared by the SQL operator tests (`test_groupby`, `test_join`).

use datafusion::arrow::util::pretty::pretty_format_batches;
use datafusion::physical_plan::displayable;
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
