//! Table definitions: columns, the engine and its arguments, keys and settings, with the
//! creation-time checks ClickHouse makes.

use std::collections::BTreeMap;
use std::sync::Arc;

use arrow::datatypes::{Schema, SchemaRef};
use serde::{Deserialize, Serialize};

use crate::error::{EngineError, Result};
use crate::key_expr::KeyExpr;
use crate::settings::TableSettings;
use crate::types::ChType;

#[derive(Debug, Clone, PartialEq)]
pub struct ColumnDef {
    pub name: String,
    pub ty: ChType,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", deny_unknown_fields)]
pub enum EngineKind {
    MergeTree,
    ReplacingMergeTree { version: Option<String>, is_deleted: Option<String> },
    SummingMergeTree { columns: Option<Vec<String>> },
    AggregatingMergeTree,
    CollapsingMergeTree { sign: String },
    VersionedCollapsingMergeTree { sign: String, version: String },
    CoalescingMergeTree,
}

impl EngineKind {
    pub fn name(&self) -> &'static str {
        match self {
            EngineKind::MergeTree => "MergeTree",
            EngineKind::ReplacingMergeTree { .. } => "ReplacingMergeTree",
            EngineKind::SummingMergeTree { .. } => "SummingMergeTree",
            EngineKind::AggregatingMergeTree => "AggregatingMergeTree",
            EngineKind::CollapsingMergeTree { .. } => "CollapsingMergeTree",
            EngineKind::VersionedCollapsingMergeTree { .. } => "VersionedCollapsingMergeTree",
            EngineKind::CoalescingMergeTree => "CoalescingMergeTree",
        }
    }

    /// Engines that merge rows of equal key; parts they write on insert start at level 1.
    pub fn merges_rows(&self) -> bool {
        !matches!(self, EngineKind::MergeTree)
    }
}

/// The two arguments of a `Replicated*` engine, as written: macros (`{shard}`, `{replica}`,
/// `{database}`, `{table}`, `{uuid}`) are expanded by the storage node that opens the table.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplicationArgs {
    pub zookeeper_path: String,
    pub replica_name: String,
}

impl ReplicationArgs {
    /// ClickHouse's `default_replica_path` and `default_replica_name`.
    pub const DEFAULT_PATH: &'static str = "/clickhouse/tables/{uuid}/{shard}";
    pub const DEFAULT_NAME: &'static str = "{replica}";
}

/// A sorting-key element that is an expression, not a column (`ORDER BY toDate(ts)`). Parts
/// store its value as a hidden column after the table's columns, so that sorting, merging,
/// FINAL and the sparse index treat it like any key column; queries never see it.
#[derive(Debug, Clone, PartialEq)]
pub struct SortExpression {
    pub column: ColumnDef,
    pub expr: KeyExpr,
}

/// Name of the hidden column of the `i`-th sorting-key expression.
pub fn sort_expression_name(i: usize) -> String {
    format!("__sort_key_{i}")
}

#[derive(Debug, Clone, PartialEq)]
pub struct TableDef {
    pub name: String,
    /// The columns users see, in order.
    pub columns: Vec<ColumnDef>,
    pub engine: EngineKind,
    pub partition_by: Option<KeyExpr>,
    /// Sorting key: column names, and the hidden names of `sort_expressions`. For
    /// VersionedCollapsingMergeTree the version column is appended when the table is built,
    /// as ClickHouse does.
    pub order_by: Vec<String>,
    pub primary_key: Vec<String>,
    pub sort_expressions: Vec<SortExpression>,
    /// `DEFAULT` values by column: the literal as written, for inserts that leave it out.
    pub defaults: BTreeMap<String, String>,
    pub settings: TableSettings,
    /// Set for the `Replicated*` engines.
    pub replication: Option<ReplicationArgs>,
    /// `CREATE TABLE t UUID '…'`: the `{uuid}` of the replication path.
    pub uuid: Option<String>,
}

impl TableDef {
    /// A table of the given columns ordered by `k`, everything else default: the unit tests'
    /// table.
    #[cfg(test)]
    pub(crate) fn for_tests(name: &str, engine: EngineKind, columns: &[(&str, ChType)]) -> TableDef {
        TableDef {
            name: name.into(),
            columns: columns.iter().map(|(n, t)| ColumnDef { name: n.to_string(), ty: t.clone() }).collect(),
            engine,
            partition_by: None,
            order_by: vec!["k".into()],
            primary_key: vec![],
            sort_expressions: vec![],
            defaults: Default::default(),
            settings: TableSettings::default(),
            replication: None,
            uuid: None,
        }
    }

    /// How many recent insert block ids count for deduplication: the replicated or the
    /// non-replicated window, by engine; 0 turns deduplication off.
    pub fn deduplication_window(&self) -> u64 {
        match self.replication {
            Some(_) => self.settings.replicated_deduplication_window,
            None => self.settings.non_replicated_deduplication_window,
        }
    }

    /// The engine as ClickHouse names it: `ReplicatedReplacingMergeTree`, say.
    pub fn engine_name(&self) -> String {
        match self.replication {
            Some(_) => format!("Replicated{}", self.engine.name()),
            None => self.engine.name().to_string(),
        }
    }

    /// A column by name: the table's own, or a sorting-key expression's hidden one.
    pub fn column(&self, name: &str) -> Option<&ColumnDef> {
        self.columns.iter().chain(self.sort_expressions.iter().map(|e| &e.column)).find(|c| c.name == name)
    }

    /// Index in the stored schema (the table's columns, then the hidden key columns).
    pub fn column_index(&self, name: &str) -> Option<usize> {
        self.columns.iter().chain(self.sort_expressions.iter().map(|e| &e.column)).position(|c| c.name == name)
    }

    /// The schema of the parts: the table's columns, then the hidden key columns.
    pub fn arrow_schema(&self) -> SchemaRef {
        Arc::new(Schema::new(
            self.columns
                .iter()
                .chain(self.sort_expressions.iter().map(|e| &e.column))
                .map(|c| c.ty.arrow_field(&c.name))
                .collect::<Vec<_>>(),
        ))
    }

    /// The schema of the table as users see it.
    pub fn user_arrow_schema(&self) -> SchemaRef {
        Arc::new(Schema::new(self.columns.iter().map(|c| c.ty.arrow_field(&c.name)).collect::<Vec<_>>()))
    }

    /// Whether a column takes part in the sorting key, directly or through an expression.
    pub fn in_sorting_key(&self, column: &str) -> bool {
        self.sorting_key().iter().any(|k| k == column)
            || self.sort_expressions.iter().any(|e| e.expr.columns().contains(&column))
    }

    /// The columns the parts are sorted by, in order.
    pub fn sorting_key(&self) -> Vec<String> {
        let mut key = self.order_by.clone();
        if let EngineKind::VersionedCollapsingMergeTree { version, .. } = &self.engine {
            if !key.contains(version) {
                key.push(version.clone());
            }
        }
        key
    }

    /// The checks ClickHouse makes at CREATE TABLE, with its wording.
    pub fn validate(&self) -> Result<()> {
        let bad = |m: String| Err(EngineError::BadTableDefinition(m));
        if self.columns.is_empty() {
            return bad("a table must have at least one column".into());
        }
        for (i, c) in self.columns.iter().enumerate() {
            if self.columns[..i].iter().any(|p| p.name == c.name) {
                return bad(format!("column {} already exists", c.name));
            }
        }
        for key in self.order_by.iter().chain(&self.primary_key) {
            let Some(col) = self.column(key) else {
                return bad(format!("Missing columns: '{key}' while processing the sorting key"));
            };
            if col.ty.is_nullable() && !self.settings.allow_nullable_key {
                return bad(
                    "Sorting key contains nullable columns, but merge tree setting `allow_nullable_key` is disabled"
                        .into(),
                );
            }
            if matches!(col.ty.value_type(), ChType::Map(..)) {
                return bad(format!("Column {key} with type {} is not allowed in key expression", col.ty));
            }
        }
        if self.primary_key.len() > self.order_by.len() {
            return bad(format!(
                "Primary key length ({}) is greater than the sorting key length ({})",
                self.primary_key.len(),
                self.order_by.len()
            ));
        }
        for (i, (p, o)) in self.primary_key.iter().zip(&self.order_by).enumerate() {
            if p != o {
                return bad(format!(
                    "Primary key must be a prefix of the sorting key, but the column in the position {i} is {o}, not {p}"
                ));
            }
        }
        if let Some(partition) = &self.partition_by {
            for name in partition.columns() {
                if self.column(name).is_none() {
                    return bad(format!("Missing columns: '{name}' while processing the partition key"));
                }
            }
        }
        self.validate_engine()
    }

    fn require_column(&self, name: &str, role: &str) -> Result<&ColumnDef> {
        self.column(name).ok_or_else(|| {
            EngineError::BadTableDefinition(format!("{role} column {name} does not exist in table declaration."))
        })
    }

    fn check_version_column(&self, version: &str, engine: &str) -> Result<()> {
        let col = self.require_column(version, "Version")?;
        if !col.ty.can_be_version() || col.ty.is_nullable() {
            return Err(EngineError::BadTableDefinition(format!(
                "The column {version} cannot be used as a version column for storage {engine} because it is of type {} (must be of an integer type or of type Date/DateTime/DateTime64).",
                col.ty
            )));
        }
        Ok(())
    }

    fn check_sign_column(&self, sign: &str, engine: &str) -> Result<()> {
        let col = self.require_column(sign, "Sign")?;
        if col.ty != ChType::Int8 {
            return Err(EngineError::BadTableDefinition(format!(
                "Sign column ({sign}) for storage {engine} must have type Int8. Provided column of type {}.",
                col.ty
            )));
        }
        Ok(())
    }

    fn validate_engine(&self) -> Result<()> {
        let bad = |m: String| Err(EngineError::BadTableDefinition(m));
        match &self.engine {
            EngineKind::MergeTree | EngineKind::CoalescingMergeTree => Ok(()),
            EngineKind::ReplacingMergeTree { version, is_deleted } => {
                if let (Some(v), Some(d)) = (version, is_deleted) {
                    if v == d {
                        return bad(format!("The version and is_deleted column cannot be the same column ({v})."));
                    }
                }
                if let Some(d) = is_deleted {
                    if version.is_none() {
                        return bad(format!(
                            "Version column for storage ReplacingMergeTree is empty while is_deleted ({d}) is not."
                        ));
                    }
                    let col = self.require_column(d, "is_deleted")?;
                    if col.ty != ChType::UInt8 {
                        return bad(format!(
                            "is_deleted column ({d}) for storage ReplacingMergeTree must have type UInt8. Provided column of type {}.",
                            col.ty
                        ));
                    }
                }
                if let Some(v) = version {
                    self.check_version_column(v, "ReplacingMergeTree")?;
                }
                Ok(())
            }
            EngineKind::SummingMergeTree { columns } => {
                for name in columns.iter().flatten() {
                    if self.column(name).is_none() {
                        return bad(format!(
                            "Column {name} listed in columns to sum does not exist in table declaration."
                        ));
                    }
                    if self.in_sorting_key(name) {
                        return bad(format!("Column {name} listed in columns to sum is a part of the sorting key"));
                    }
                }
                Ok(())
            }
            EngineKind::AggregatingMergeTree => {
                let is_measure =
                    |ty: &ChType| matches!(ty, ChType::SimpleAggregateFunction { .. } | ChType::AggregateFunction(_));
                let has_measures = self.columns.iter().any(|c| is_measure(&c.ty));
                if self.settings.allow_dimensions_outside_sorting_key || !has_measures {
                    return Ok(());
                }
                let outside: Vec<&str> = self
                    .columns
                    .iter()
                    .filter(|c| !self.in_sorting_key(&c.name) && !is_measure(&c.ty))
                    .map(|c| c.name.as_str())
                    .collect();
                if outside.is_empty() {
                    Ok(())
                } else {
                    bad(format!(
                        "Column(s) {} of the AggregatingMergeTree table are neither part of the sorting key nor aggregate measures (AggregateFunction or SimpleAggregateFunction). During background merges, rows with the same value of the sorting key are collapsed into one, so these columns keep an arbitrary value, which silently produces wrong results for queries that GROUP BY or filter on them. Add them to the sorting key (ORDER BY), or set 'allow_dimensions_outside_sorting_key = 1' if this is intentional (for example, when the columns are functionally dependent on the sorting key).",
                        outside.join(", ")
                    ))
                }
            }
            EngineKind::CollapsingMergeTree { sign } => self.check_sign_column(sign, "CollapsingMergeTree"),
            EngineKind::VersionedCollapsingMergeTree { sign, version } => {
                self.check_sign_column(sign, "VersionedCollapsingMergeTree")?;
                if sign == version {
                    return bad(format!("The version and sign column cannot be the same column ({sign})."));
                }
                self.check_version_column(version, "VersionedCollapsingMergeTree")
            }
        }
    }
}

/// On-disk form of a table definition (`table.json`); types are kept as ClickHouse names.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StoredTableDef {
    pub name: String,
    pub columns: Vec<(String, String)>,
    pub engine: EngineKind,
    pub partition_by: Option<KeyExpr>,
    pub order_by: Vec<String>,
    pub primary_key: Vec<String>,
    /// (hidden column name, its type, the expression).
    #[serde(default)]
    pub sort_expressions: Vec<(String, String, KeyExpr)>,
    #[serde(default)]
    pub defaults: BTreeMap<String, String>,
    pub settings: TableSettings,
    #[serde(default)]
    pub replication: Option<ReplicationArgs>,
    #[serde(default)]
    pub uuid: Option<String>,
}

impl From<&TableDef> for StoredTableDef {
    fn from(def: &TableDef) -> Self {
        StoredTableDef {
            name: def.name.clone(),
            columns: def.columns.iter().map(|c| (c.name.clone(), c.ty.to_string())).collect(),
            engine: def.engine.clone(),
            partition_by: def.partition_by.clone(),
            order_by: def.order_by.clone(),
            primary_key: def.primary_key.clone(),
            sort_expressions: def
                .sort_expressions
                .iter()
                .map(|e| (e.column.name.clone(), e.column.ty.to_string(), e.expr.clone()))
                .collect(),
            defaults: def.defaults.clone(),
            settings: def.settings.clone(),
            replication: def.replication.clone(),
            uuid: def.uuid.clone(),
        }
    }
}

impl StoredTableDef {
    pub fn into_def(self) -> Result<TableDef> {
        let columns = self
            .columns
            .into_iter()
            .map(|(name, ty)| Ok(ColumnDef { name, ty: ChType::parse(&ty)? }))
            .collect::<Result<Vec<_>>>()?;
        let sort_expressions = self
            .sort_expressions
            .into_iter()
            .map(|(name, ty, expr)| Ok(SortExpression { column: ColumnDef { name, ty: ChType::parse(&ty)? }, expr }))
            .collect::<Result<Vec<_>>>()?;
        Ok(TableDef {
            name: self.name,
            columns,
            engine: self.engine,
            partition_by: self.partition_by,
            order_by: self.order_by,
            primary_key: self.primary_key,
            sort_expressions,
            defaults: self.defaults,
            settings: self.settings,
            replication: self.replication,
            uuid: self.uuid,
        })
    }
}
