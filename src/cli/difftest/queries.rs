//! The seeded query generator of the differential test, over the tables of
//! [`tables`](super::tables).
//!
//! Each query is one of the shapes the extension rewrites or labels: GROUP BY an indexed key
//! (plain, several columns, an expression of the key, HAVING, DISTINCT, `count(DISTINCT …)`),
//! UNION ALL of separately indexed tables, joins of every type with a GROUP BY above, semi and
//! anti joins, CTEs, ORDER BY with LIMIT and OFFSET, and `mphf_index` in the forms whose result
//! does not depend on which slot a key got.
//!
//! The SQL is the common subset of DataFusion and DuckDB (explicit `NULLS FIRST`, positional
//! GROUP BY only where both accept it, no arithmetic that overflows); queries that call
//! `mphf_index` are marked as not for DuckDB. An ORDER BY is always total over the output
//! (it lists the group columns, which are unique per row, or every output column), so a
//! LIMIT cuts the same rows in every engine.

use super::tables::Rng;

/// One generated query.
#[derive(Clone, Debug)]
pub struct Query {
    /// The SQL text.
    pub sql: String,
    /// True when the ORDER BY fixes the row order (compare in order).
    pub ordered: bool,
    /// False when the query uses the extension's `mphf_index` (DuckDB has no such function).
    pub duckdb: bool,
}

/// A key column of the fact tables and the expressions of it that a GROUP BY may use.
struct Key {
    name: &'static str,
    exprs: &'static [&'static str],
}

/// The indexed key columns of `f` and `g` (`{}` in an expression stands for the column).
const KEYS: [Key; 6] = [
    Key {
        name: "id",
        exprs: &["{} % 7", "{} % 1000"],
    },
    Key {
        name: "s",
        exprs: &["substr({}, 1, 3)", "{} || '!'"],
    },
    Key {
        name: "d",
        exprs: &["date_part('year', {})"],
    },
    Key {
        name: "ts",
        exprs: &["date_part('hour', {})"],
    },
    Key {
        name: "i",
        exprs: &["{} % 5", "{} + 1"],
    },
    Key { name: "u", exprs: &[] },
];

/// Filters over a fact table (`{}` is the column prefix, e.g. `f.`).
const FACT_FILTERS: [&str; 10] = [
    "{}q < 25",
    "{}v IS NULL",
    "{}id IS NOT NULL",
    "{}b",
    "{}d >= DATE '2022-01-01'",
    "{}s LIKE 'pre%'",
    "{}i BETWEEN 0 AND 300",
    "{}m > 40000.00",
    "{}q IS NULL OR {}q > 40",
    "{}id IS NULL",
];

/// Aggregates over a fact table's columns (`{}` is the column prefix).
const FACT_AGGS: [&str; 22] = [
    "count(*)",
    "count({}v)",
    "sum({}q)",
    "sum({}v)",
    "sum({}m)",
    "avg({}v)",
    "avg({}q)",
    "avg({}m)",
    "min({}v)",
    "max({}v)",
    "min({}q)",
    "max({}m)",
    "min({}s)",
    "max({}s)",
    "min({}d)",
    "max({}ts)",
    "min({}i)",
    "max({}u)",
    "bool_or({}b)",
    "bool_and({}b)",
    "count(DISTINCT {}q)",
    "count({}q)",
];

/// Aggregates over the columns a UNION ALL of the fact tables keeps (`q`, `v`).
const UNION_AGGS: [&str; 8] = [
    "count(*)",
    "sum({}q)",
    "avg({}v)",
    "min({}v)",
    "max({}q)",
    "count({}v)",
    "sum({}v)",
    "count(DISTINCT {}q)",
];

/// Fills every `{}` of `template` with `with`.
fn fill(template: &str, with: &str) -> String {
    template.replace("{}", with)
}

/// The generator: a seeded stream of queries.
pub struct Generator {
    rng: Rng,
}

impl Generator {
    /// Queries of `seed` (the same seed gives the same queries).
    pub fn new(seed: u64) -> Self {
        Self {
            rng: Rng::new(seed.wrapping_mul(0x2545_F491_4F6C_DD1D) ^ 0x00D1_FFE7),
        }
    }

    /// One of `templates`.
    fn one_of(&mut self, templates: &[&'static str]) -> &'static str {
        let template: &&'static str = self.rng.pick(templates);
        template
    }

    /// `n` aggregates over prefix `p`, named `a0, a1, …`.
    fn aggs(&mut self, p: &str, n: usize) -> Vec<String> {
        (0..n)
            .map(|i| format!("{} AS a{i}", fill(self.one_of(&FACT_AGGS), p)))
            .collect()
    }

    /// A WHERE clause over prefix `p` (empty half of the time).
    fn filter(&mut self, p: &str) -> String {
        if self.rng.chance(0.5) {
            String::new()
        } else {
            format!(" WHERE {}", fill(self.one_of(&FACT_FILTERS), p))
        }
    }

    /// A WHERE clause over the fact side `x.` of a join of type `jt`. Above a RIGHT or FULL
    /// join no `IS NULL` test of that side: DataFusion 55 pushes such a filter of the joined
    /// output into the other side's Parquet scan (row-group pruning by null counts), and vanilla
    /// DataFusion, the reference, returns too few rows (the extension's join does not take the
    /// pushdown and agrees with DuckDB).
    fn join_filter(&mut self, jt: &str) -> String {
        loop {
            let f = self.filter("x.");
            if !(jt.starts_with("RIGHT") || jt.starts_with("FULL")) || !f.contains("IS NULL") {
                return f;
            }
        }
    }

    /// A fact table name.
    fn fact(&mut self) -> &'static str {
        match self.rng.below(10) {
            0..=4 => "f",
            5..=6 => "g",
            _ => "h",
        }
    }

    /// An indexed key column of the fact tables.
    fn key(&mut self) -> &'static Key {
        self.rng.pick(&KEYS)
    }

    /// `ORDER BY` positions `1..=n` with NULLS FIRST, and a LIMIT (and sometimes an OFFSET).
    fn order_limit(&mut self, n: usize) -> String {
        let cols: Vec<String> = (1..=n).map(|i| format!("{i} NULLS FIRST")).collect();
        let mut s = format!(" ORDER BY {} LIMIT {}", cols.join(", "), 1 + self.rng.below(40));
        if self.rng.chance(0.3) {
            s.push_str(&format!(" OFFSET {}", self.rng.below(20)));
        }
        s
    }

    /// Wraps a GROUP BY query whose first `groups` output columns are its group columns: half
    /// the time unordered, else ordered by them with a LIMIT.
    fn finish(&mut self, sql: String, groups: usize, duckdb: bool) -> Query {
        if groups > 0 && self.rng.chance(0.35) {
            let tail = self.order_limit(groups);
            Query {
                sql: sql + &tail,
                ordered: true,
                duckdb,
            }
        } else {
            Query {
                sql,
                ordered: false,
                duckdb,
            }
        }
    }

    /// The next query.
    pub fn next_query(&mut self) -> Query {
        match self.rng.below(100) {
            0..=19 => self.group_by_key(),
            20..=29 => self.group_by_two(),
            30..=36 => self.group_by_expression(),
            37..=46 => self.union_all(),
            47..=61 => self.join_group_by(),
            62..=69 => self.semi_anti(),
            70..=74 => self.cte(),
            75..=79 => self.join_rows(),
            80..=86 => self.distinct(),
            _ => self.slot_query(),
        }
    }

    /// `SELECT k, aggs FROM t [WHERE] GROUP BY k [HAVING]`.
    fn group_by_key(&mut self) -> Query {
        let (t, k) = (self.fact(), self.key().name);
        let n = 1 + self.rng.below(4);
        let aggs = self.aggs("", n).join(", ");
        let filter = self.filter("");
        let having = match self.rng.below(4) {
            0 => " HAVING count(*) > 1".to_string(),
            1 => format!(" HAVING sum(q) > {}", self.rng.below(200)),
            _ => String::new(),
        };
        self.finish(
            format!("SELECT {k}, {aggs} FROM {t}{filter} GROUP BY {k}{having}"),
            1,
            true,
        )
    }

    /// Two group columns: two keys, or a key and a value column.
    fn group_by_two(&mut self) -> Query {
        let t = self.fact();
        let k = self.key().name;
        let other = *self.rng.pick(&["s", "id", "b", "i", "d", "q", "u"]);
        let other = if other == k { "b" } else { other };
        let n = 1 + self.rng.below(3);
        let aggs = self.aggs("", n).join(", ");
        let filter = self.filter("");
        self.finish(
            format!("SELECT {k}, {other}, {aggs} FROM {t}{filter} GROUP BY {k}, {other}"),
            2,
            true,
        )
    }

    /// GROUP BY an expression of a key, alone or beside the key.
    fn group_by_expression(&mut self) -> Query {
        let t = self.fact();
        let key = loop {
            let k = self.key();
            if !k.exprs.is_empty() {
                break k;
            }
        };
        let e = fill(self.one_of(key.exprs), key.name);
        let n = 1 + self.rng.below(3);
        let aggs = self.aggs("", n).join(", ");
        if self.rng.chance(0.5) {
            self.finish(format!("SELECT {e} AS e, {aggs} FROM {t} GROUP BY {e}"), 1, true)
        } else {
            let k = key.name;
            self.finish(
                format!("SELECT {k}, {e} AS e, {aggs} FROM {t} GROUP BY {k}, {e}"),
                2,
                true,
            )
        }
    }

    /// UNION ALL of `f` and `g` (indexed separately), with a column dropped, a GROUP BY or a
    /// join above.
    fn union_all(&mut self) -> Query {
        let k = *self.rng.pick(&["id", "s", "i", "d"]);
        let (fa, fb) = (self.filter(""), self.filter(""));
        let union = format!("(SELECT {k}, q, v FROM f{fa} UNION ALL SELECT {k}, q, v FROM g{fb}) u");
        match self.rng.below(4) {
            0 => Query {
                sql: format!("SELECT min({k}) AS lo, max({k}) AS hi, count(*) AS n, count({k}) AS nk FROM {union}"),
                ordered: false,
                duckdb: true,
            },
            1 if k == "id" || k == "s" => {
                let (dim, dk, col) = if k == "id" {
                    ("dm", "id", "cat")
                } else {
                    ("ds", "s", "grp")
                };
                let jt = *self.rng.pick(&["JOIN", "LEFT JOIN", "RIGHT JOIN", "FULL JOIN"]);
                self.finish(
                    format!(
                        "SELECT x.{col}, count(*) AS n, sum(u.q) AS sq, count(u.{k}) AS nk FROM {union} {jt} {dim} x ON u.{k} = x.{dk} GROUP BY x.{col}"
                    ),
                    1,
                    true,
                )
            }
            _ => {
                let aggs: Vec<String> = (0..1 + self.rng.below(3))
                    .map(|i| format!("{} AS a{i}", fill(self.one_of(&UNION_AGGS), "u.")))
                    .collect();
                self.finish(
                    format!("SELECT u.{k}, {} FROM {union} GROUP BY u.{k}", aggs.join(", ")),
                    1,
                    true,
                )
            }
        }
    }

    /// A join of a fact table with a dimension (or the other fact table), GROUP BY above.
    fn join_group_by(&mut self) -> Query {
        let t = self.fact();
        let jt = *self.rng.pick(&["JOIN", "LEFT JOIN", "RIGHT JOIN", "FULL JOIN"]);
        let filter = self.join_filter(jt);
        match self.rng.below(3) {
            0 => {
                let g = *self.rng.pick(&["y.cat", "x.id", "y.id", "y.flag", "x.s"]);
                let n = 1 + self.rng.below(2);
                let mut aggs = self.aggs("x.", n);
                aggs.push(format!(
                    "{} AS w0",
                    self.rng.pick(&["sum(y.w)", "avg(y.w)", "count(y.id)", "max(y.cat)"])
                ));
                self.finish(
                    format!(
                        "SELECT {g}, {} FROM {t} x {jt} dm y ON x.id = y.id{filter} GROUP BY {g}",
                        aggs.join(", ")
                    ),
                    1,
                    true,
                )
            }
            1 => {
                let g = *self.rng.pick(&["y.grp", "x.s", "y.s"]);
                let n = 1 + self.rng.below(2);
                let aggs = self.aggs("x.", n);
                self.finish(
                    format!(
                        "SELECT {g}, {}, count(y.s) AS ns FROM {t} x {jt} ds y ON x.s = y.s{filter} GROUP BY {g}",
                        aggs.join(", ")
                    ),
                    1,
                    true,
                )
            }
            _ => {
                let k = *self.rng.pick(&["id", "i", "s"]);
                self.finish(
                    format!(
                        "SELECT x.{k}, count(*) AS n, sum(y.q) AS sq, min(y.v) AS mv FROM f x {jt} g y ON x.{k} = y.{k}{filter} GROUP BY x.{k}"
                    ),
                    1,
                    true,
                )
            }
        }
    }

    /// Semi and anti joins: IN, NOT IN (NULL-free subquery), EXISTS, NOT EXISTS.
    fn semi_anti(&mut self) -> Query {
        let t = self.fact();
        let k = self.key().name;
        let sub_filter = *self.rng.pick(&["y.flag", "y.cat = 'red'", "y.w > 300", "TRUE"]);
        let cond = match self.rng.below(5) {
            0 => format!("x.id IN (SELECT y.id FROM dm y WHERE {sub_filter})"),
            1 => format!("x.id NOT IN (SELECT y.id FROM dm y WHERE {sub_filter} AND y.id IS NOT NULL)"),
            2 => format!("EXISTS (SELECT 1 FROM dm y WHERE y.id = x.id AND {sub_filter})"),
            3 => format!("NOT EXISTS (SELECT 1 FROM dm y WHERE y.id = x.id AND {sub_filter})"),
            _ => format!(
                "x.s {} (SELECT y.s FROM ds y WHERE y.s IS NOT NULL)",
                if self.rng.chance(0.5) { "IN" } else { "NOT IN" }
            ),
        };
        let n = 1 + self.rng.below(2);
        let aggs = self.aggs("x.", n).join(", ");
        self.finish(
            format!("SELECT x.{k}, {aggs} FROM {t} x WHERE {cond} GROUP BY x.{k}"),
            1,
            true,
        )
    }

    /// A CTE aggregated by key, joined, aggregated again.
    fn cte(&mut self) -> Query {
        let t = self.fact();
        let jt = *self.rng.pick(&["JOIN", "LEFT JOIN", "FULL JOIN"]);
        let filter = self.filter("");
        self.finish(
            format!(
                "WITH c AS (SELECT id, sum(q) AS sq, count(*) AS n, avg(v) AS av FROM {t}{filter} GROUP BY id) \
                 SELECT y.cat, sum(c.sq) AS s1, sum(c.n) AS s2, count(c.av) AS s3, count(*) AS s4 FROM c {jt} dm y ON c.id = y.id GROUP BY y.cat"
            ),
            1,
            true,
        )
    }

    /// Join rows, ORDER BY every output column, LIMIT.
    fn join_rows(&mut self) -> Query {
        let t = self.fact();
        let jt = *self.rng.pick(&["JOIN", "LEFT JOIN", "RIGHT JOIN", "FULL JOIN"]);
        let filter = self.join_filter(jt);
        let tail = self.order_limit(4);
        Query {
            sql: format!("SELECT x.id, x.q, y.cat, y.flag FROM {t} x {jt} dm y ON x.id = y.id{filter}{tail}"),
            ordered: true,
            duckdb: true,
        }
    }

    /// DISTINCT keys, `count(DISTINCT key)`, or `count(DISTINCT x)` per key.
    fn distinct(&mut self) -> Query {
        let (t, k) = (self.fact(), self.key().name);
        let filter = self.filter("");
        match self.rng.below(3) {
            0 => self.finish(format!("SELECT DISTINCT {k} FROM {t}{filter}"), 1, true),
            1 => Query {
                sql: format!("SELECT count(DISTINCT {k}) AS nd, count({k}) AS nk, count(*) AS n FROM {t}{filter}"),
                ordered: false,
                duckdb: true,
            },
            _ => {
                let x = *self.rng.pick(&["q", "s", "b", "d"]);
                self.finish(
                    format!("SELECT {k}, count(DISTINCT {x}) AS nd, count(*) AS n FROM {t}{filter} GROUP BY {k}"),
                    1,
                    true,
                )
            }
        }
    }

    /// `mphf_index` in forms whose result does not depend on which slot a key got.
    fn slot_query(&mut self) -> Query {
        let (t, k) = (self.fact(), self.key().name);
        let filter = self.filter("");
        let sql = match self.rng.below(5) {
            0 => format!(
                "SELECT count(DISTINCT mphf_index({k})) AS nd, count(mphf_index({k})) AS ns, count(*) AS n FROM {t}{filter}"
            ),
            1 => format!(
                "SELECT c, count(*) AS n FROM (SELECT mphf_index({k}) AS sl, count(*) AS c FROM {t}{filter} GROUP BY mphf_index({k})) x GROUP BY c"
            ),
            2 => format!("SELECT count(*) AS n FROM {t} WHERE mphf_index('dm_id', {t}.id) IS NOT NULL"),
            3 => format!(
                "SELECT {k}, count(*) AS n, sum(q) AS sq FROM {t} WHERE mphf_index({k}) IS NOT NULL GROUP BY {k}"
            ),
            _ => format!("SELECT count(*) AS n, count(mphf_index('ds_s', {t}.s)) AS m FROM {t}{filter}"),
        };
        Query {
            sql,
            ordered: false,
            duckdb: false,
        }
    }
}
