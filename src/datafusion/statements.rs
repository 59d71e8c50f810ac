//! Parsing of the extension's SQL statements with DataFusion's own parser ([`DFParser`]).
//!
//! - `CREATE INDEX [IF NOT EXISTS] name ON table USING mphf (col) [WITH (leaf = 8, bucket = 100,
//!   rotation = true, seed = 0)]` (sqlparser's `Statement::CreateIndex`, generic dialect);
//! - `DROP INDEX [IF EXISTS] name` (`Statement::Drop` with `ObjectType::Index`);
//! - `SHOW MPHF INDEXES` (not SQL grammar: matched on its three keywords).
//!
//! Identifiers are normalized like DataFusion does by default: unquoted ones are lowercased.

use ::datafusion::common::{plan_err, DataFusionError, Result, TableReference};
use ::datafusion::sql::parser::{DFParser, Statement as DFStatement};
use ::datafusion::sql::sqlparser::ast::{
    CreateIndex, Expr as SqlExpr, Ident, IndexType, ObjectName, ObjectNamePart, ObjectType, Statement,
};
use ::datafusion::sql::sqlparser::dialect::GenericDialect;

use crate::core::Params;
use crate::device::Device;

/// A table name: its normalized text and the reference DataFusion resolves.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TableName {
    /// Normalized, dot-joined.
    pub text: String,
    /// The reference.
    pub reference: TableReference,
}

/// One of our statements, or DataFusion's with a follow-up action.
#[derive(Clone, Debug, PartialEq)]
pub enum MphfStatement {
    /// `CREATE INDEX ... USING mphf`.
    CreateIndex {
        /// Index name.
        name: String,
        /// Table.
        table: TableName,
        /// Column.
        column: String,
        /// `IF NOT EXISTS`.
        if_not_exists: bool,
        /// MPHF parameters from `WITH (...)`.
        params: Params,
        /// Hash seed from `WITH (seed = ...)`.
        seed: u64,
        /// Build device from `WITH (device = 'auto' | 'cpu' | 'gpu')`.
        device: Device,
    },
    /// `DROP INDEX`.
    DropIndex {
        /// Index names.
        names: Vec<String>,
        /// `IF EXISTS`.
        if_exists: bool,
    },
    /// `SHOW MPHF INDEXES`.
    ShowIndexes,
    /// `CREATE EXTERNAL TABLE`: DataFusion runs it, then saved indexes are loaded.
    CreateExternalTable(TableName),
    /// `DROP TABLE`: DataFusion runs it, then the table's indexes are dropped.
    DropTable(Vec<TableName>),
    /// `CREATE TABLE … AS SELECT`: DataFusion runs it, then index labels the new table inherited
    /// from its source are removed.
    CreateTableAs(TableName),
}

/// Normalizes an identifier (unquoted → lowercase).
pub fn norm_ident(i: &Ident) -> String {
    if i.quote_style.is_some() {
        i.value.clone()
    } else {
        i.value.to_lowercase()
    }
}

fn table_name(n: &ObjectName) -> Result<TableName> {
    let mut parts = Vec::new();
    for p in &n.0 {
        match p {
            ObjectNamePart::Identifier(i) => parts.push(norm_ident(i)),
            other => return plan_err!("unsupported table name part {other}"),
        }
    }
    let reference = match parts.as_slice() {
        [t] => TableReference::bare(t.as_str()),
        [s, t] => TableReference::partial(s.as_str(), t.as_str()),
        [c, s, t] => TableReference::full(c.as_str(), s.as_str(), t.as_str()),
        _ => return plan_err!("invalid table name {n}"),
    };
    Ok(TableName {
        text: parts.join("."),
        reference,
    })
}

fn single_name(n: &ObjectName) -> Result<String> {
    match n.0.as_slice() {
        [ObjectNamePart::Identifier(i)] if !i.value.trim().is_empty() => Ok(norm_ident(i)),
        [ObjectNamePart::Identifier(_)] => plan_err!("an MPHF index name must not be empty"),
        _ => plan_err!("an MPHF index name is one identifier, got {n}"),
    }
}

/// True for `SHOW MPHF INDEXES` (any case and spacing, optional `;`).
fn is_show_indexes(sql: &str) -> bool {
    let words: Vec<String> = sql
        .trim()
        .trim_end_matches(';')
        .split_whitespace()
        .map(|w| w.to_ascii_uppercase())
        .collect();
    words == ["SHOW", "MPHF", "INDEXES"]
}

/// The first word of `sql` after blanks and comments (`-- …` lines, `/* … */` blocks),
/// upper-cased: every statement the extension handles starts with CREATE, DROP or SHOW, so
/// others skip a second parse (~0.1 ms for TPC-H Q3).
fn first_word(sql: &str) -> String {
    let mut rest = sql.trim_start();
    loop {
        if let Some(after) = rest.strip_prefix("--") {
            rest = after.split_once('\n').map_or("", |(_, r)| r).trim_start();
        } else if let Some(after) = rest.strip_prefix("/*") {
            rest = after.split_once("*/").map_or("", |(_, r)| r).trim_start();
        } else {
            break;
        }
    }
    rest.chars()
        .take_while(char::is_ascii_alphabetic)
        .map(|c| c.to_ascii_uppercase())
        .collect()
}

fn parse_with(with: &[SqlExpr]) -> Result<(Params, u64, Device)> {
    let mut params = Params::DEFAULT;
    let mut seed = 0u64;
    let mut device = Device::Auto;
    for e in with {
        let text = e.to_string();
        let Some((k, v)) = text.split_once('=') else {
            return plan_err!("CREATE INDEX ... WITH: expected key = value, got {text}");
        };
        let (k, v) = (
            k.trim().to_ascii_lowercase(),
            v.trim().trim_matches('\'').to_ascii_lowercase(),
        );
        let bad = || DataFusionError::Plan(format!("CREATE INDEX ... WITH: invalid value '{v}' for '{k}'"));
        match k.as_str() {
            "leaf" => params.leaf = v.parse().map_err(|_| bad())?,
            "bucket" => params.bucket = v.parse().map_err(|_| bad())?,
            "rotation" => params.rotation = v.parse().map_err(|_| bad())?,
            "seed" => seed = v.parse().map_err(|_| bad())?,
            "device" => {
                device = v
                    .parse()
                    .map_err(|e: String| DataFusionError::Plan(format!("CREATE INDEX ... WITH: {e}")))?
            }
            _ => {
                return plan_err!(
                    "CREATE INDEX ... WITH: unknown option '{k}' (known: leaf, bucket, rotation, seed, device)"
                )
            }
        }
    }
    let params = Params::try_new(params.leaf, params.bucket, params.rotation)
        .map_err(|e| DataFusionError::Plan(format!("CREATE INDEX ... WITH: {e}")))?;
    Ok((params, seed, device))
}

fn create_index(ci: &CreateIndex) -> Result<MphfStatement> {
    match &ci.using {
        Some(IndexType::Custom(i)) if i.value.eq_ignore_ascii_case("mphf") => {}
        Some(other) => return plan_err!("CREATE INDEX: only USING mphf is supported, got USING {other}"),
        None => return plan_err!("CREATE INDEX: only MPHF indexes are supported: add USING mphf"),
    }
    let Some(name) = &ci.name else {
        return plan_err!("CREATE INDEX ... USING mphf needs an index name");
    };
    if ci.unique || ci.predicate.is_some() || !ci.include.is_empty() || ci.concurrently {
        return plan_err!("CREATE INDEX ... USING mphf supports no UNIQUE, CONCURRENTLY, INCLUDE or WHERE");
    }
    let column = match ci.columns.as_slice() {
        [c] => match &c.column.expr {
            SqlExpr::Identifier(i) => norm_ident(i),
            other => return plan_err!("an MPHF index covers one plain column, got the expression {other}"),
        },
        cols => return plan_err!("an MPHF index covers exactly one column, got {}", cols.len()),
    };
    let (params, seed, device) = parse_with(&ci.with)?;
    Ok(MphfStatement::CreateIndex {
        name: single_name(name)?,
        table: table_name(&ci.table_name)?,
        column,
        device,
        if_not_exists: ci.if_not_exists,
        params,
        seed,
    })
}

/// Classifies `sql`: `Ok(Some(..))` for statements the extension handles (fully or after
/// DataFusion), `Ok(None)` for everything else (including SQL that does not parse: DataFusion
/// then reports the error).
pub fn classify(sql: &str) -> Result<Option<MphfStatement>> {
    if is_show_indexes(sql) {
        return Ok(Some(MphfStatement::ShowIndexes));
    }
    if !matches!(first_word(sql).as_str(), "CREATE" | "DROP") {
        return Ok(None);
    }
    let Ok(mut stmts) = DFParser::parse_sql_with_dialect(sql, &GenericDialect {}) else {
        return Ok(None);
    };
    if stmts.len() != 1 {
        return Ok(None);
    }
    match stmts.pop_front().expect("one statement") {
        DFStatement::Statement(s) => match *s {
            Statement::CreateIndex(ci) => create_index(&ci).map(Some),
            Statement::Drop {
                object_type: ObjectType::Index,
                if_exists,
                names,
                ..
            } => {
                let names = names.iter().map(single_name).collect::<Result<Vec<_>>>()?;
                Ok(Some(MphfStatement::DropIndex { names, if_exists }))
            }
            Statement::Drop {
                object_type: ObjectType::Table,
                names,
                ..
            } => {
                let names = names.iter().map(table_name).collect::<Result<Vec<_>>>()?;
                Ok(Some(MphfStatement::DropTable(names)))
            }
            Statement::CreateTable(ct) if ct.query.is_some() => {
                Ok(Some(MphfStatement::CreateTableAs(table_name(&ct.name)?)))
            }
            _ => Ok(None),
        },
        DFStatement::CreateExternalTable(c) => Ok(Some(MphfStatement::CreateExternalTable(table_name(&c.name)?))),
        _ => Ok(None),
    }
}

/// Splits a script into statements at `;` outside quotes and `--` comments (for `-f FILE`).
pub fn split_statements(script: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut chars = script.chars().peekable();
    let mut quote: Option<char> = None;
    while let Some(c) = chars.next() {
        match quote {
            Some(q) => {
                cur.push(c);
                if c == q {
                    quote = None;
                }
            }
            None => match c {
                '\'' | '"' => {
                    quote = Some(c);
                    cur.push(c);
                }
                '-' if chars.peek() == Some(&'-') => {
                    for c in chars.by_ref() {
                        if c == '\n' {
                            cur.push('\n');
                            break;
                        }
                    }
                }
                ';' => {
                    if !cur.trim().is_empty() {
                        out.push(cur.trim().to_string());
                    }
                    cur.clear();
                }
                _ => cur.push(c),
            },
        }
    }
    if !cur.trim().is_empty() {
        out.push(cur.trim().to_string());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_create_index() {
        let s = classify("CREATE INDEX IF NOT EXISTS Li_Ok ON LineItem USING mphf (L_OrderKey) WITH (leaf = 6, bucket = 50, rotation = true, seed = 3)")
            .unwrap()
            .unwrap();
        let MphfStatement::CreateIndex {
            name,
            table,
            column,
            if_not_exists,
            params,
            seed,
            device,
        } = s
        else {
            panic!("{s:?}")
        };
        assert_eq!(
            (name.as_str(), table.text.as_str(), column.as_str()),
            ("li_ok", "lineitem", "l_orderkey")
        );
        assert!(if_not_exists);
        assert_eq!(device, Device::Auto);
        assert_eq!((params.leaf, params.bucket, params.rotation, seed), (6, 50, true, 3));
    }

    #[test]
    fn parses_others() {
        assert_eq!(
            classify("show  mphf indexes;").unwrap(),
            Some(MphfStatement::ShowIndexes)
        );
        assert_eq!(
            classify("DROP INDEX IF EXISTS x").unwrap(),
            Some(MphfStatement::DropIndex {
                names: vec!["x".into()],
                if_exists: true
            })
        );
        assert_eq!(
            classify(" -- a comment\n/* another */ drop index x").unwrap(),
            Some(MphfStatement::DropIndex {
                names: vec!["x".into()],
                if_exists: false
            })
        );
        assert_eq!(classify("SELECT 1").unwrap(), None);
        assert_eq!(classify("SELEC garbage").unwrap(), None);
        assert!(classify("CREATE INDEX i ON t (c)").is_err());
        assert!(classify("CREATE INDEX i ON t USING btree (c)").is_err());
        assert!(classify("CREATE INDEX i ON t USING mphf (a, b)").is_err());
        assert!(classify("CREATE INDEX i ON t USING mphf (c) WITH (leaf = 99)").is_err());
    }

    #[test]
    fn splits_scripts() {
        let v = split_statements("select 'a;b'; -- c;d\nselect 2;\n\n");
        assert_eq!(v, vec!["select 'a;b'".to_string(), "select 2".to_string()]);
    }
}
