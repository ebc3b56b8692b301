//! Where a replicated table lives in the coordinator, and what its nodes hold, after
//! ClickHouse's layout:
//!
//! ```text
//! <zookeeper_path>/
//!   metadata  columns            the table's definition, checked by every replica that joins
//!   log/log-NNNNNNNNNN           GET_PART (and later MERGE_PARTS) entries, one per new part
//!   blocks/<dedup id>            the part name each recent insert block became
//!   block_numbers/<partition>/block-NNNNNNNNNN   ephemeral: a block number in use by an insert
//!   quorum/  mutations/  leader_election/  nonincrement_block_numbers/  temp/
//!   replicas/<name>/
//!     host  is_active (ephemeral)  log_pointer  queue/  parts/<part name>  is_lost
//!     metadata  columns  metadata_version  mutation_pointer  flags
//! ```

use std::fmt::Write;

use mergestream_engine::commit::PartCommit;
use mergestream_engine::schema::EngineKind;
use mergestream_engine::TableDef;

/// The children every replicated table has, created with the table's root.
pub const TABLE_CHILDREN: &[&str] = &[
    "log",
    "blocks",
    "block_numbers",
    "nonincrement_block_numbers",
    "leader_election",
    "temp",
    "quorum",
    "quorum/last_part",
    "quorum/failed_parts",
    "quorum/parallel",
    "mutations",
    "replicas",
];

/// The paths of one replica of one table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplicaPaths {
    /// The table's root, macros expanded, no trailing `/`.
    pub table: String,
    pub replica: String,
}

impl ReplicaPaths {
    pub fn of_table(&self, child: &str) -> String {
        format!("{}/{child}", self.table)
    }

    pub fn replicas(&self) -> String {
        self.of_table("replicas")
    }

    pub fn replica_root(&self) -> String {
        format!("{}/replicas/{}", self.table, self.replica)
    }

    pub fn of_replica(&self, child: &str) -> String {
        format!("{}/{child}", self.replica_root())
    }

    pub fn block(&self, dedup_id: &str) -> String {
        format!("{}/blocks/{dedup_id}", self.table)
    }

    pub fn block_numbers(&self, partition_id: &str) -> String {
        format!("{}/block_numbers/{partition_id}", self.table)
    }

    /// The ephemeral node holding block number `block` of a partition, as its sequential
    /// create named it.
    pub fn block_number_lock(&self, partition_id: &str, block: u64) -> String {
        format!("{}/block-{block:010}", self.block_numbers(partition_id))
    }

    pub fn log_entry_prefix(&self) -> String {
        self.of_table("log/log-")
    }

    pub fn part(&self, name: &str) -> String {
        self.of_replica(&format!("parts/{name}"))
    }
}

/// ClickHouse's merging mode numbers (`MergeTreeData::MergingParams::Mode`), as the
/// `metadata` node writes them.
fn mode(engine: &EngineKind) -> u8 {
    match engine {
        EngineKind::MergeTree => 0,
        EngineKind::CollapsingMergeTree { .. } => 1,
        EngineKind::SummingMergeTree { .. } => 2,
        EngineKind::AggregatingMergeTree => 3,
        EngineKind::ReplacingMergeTree { .. } => 5,
        EngineKind::VersionedCollapsingMergeTree { .. } => 7,
        EngineKind::CoalescingMergeTree => 8,
    }
}

/// A sorting-key element as written: the column, or the expression behind a hidden column.
fn key_element(def: &TableDef, name: &str) -> String {
    match def.sort_expressions.iter().find(|e| e.column.name == name) {
        Some(expression) => expression.expr.to_string(),
        None => name.to_string(),
    }
}

/// The fields of the `metadata` node, in ClickHouse's order: `(field, value)`. Two replicas
/// of a table must agree on every one.
pub fn metadata_fields(def: &TableDef) -> Vec<(&'static str, String)> {
    let key = |names: &[String]| names.iter().map(|n| key_element(def, n)).collect::<Vec<_>>().join(", ");
    let sorting_key = key(&def.order_by);
    let primary_key = if def.primary_key.is_empty() { sorting_key.clone() } else { key(&def.primary_key) };
    let (sign, version, is_deleted, columns_to_sum) = match &def.engine {
        EngineKind::CollapsingMergeTree { sign } => (sign.clone(), String::new(), String::new(), String::new()),
        EngineKind::VersionedCollapsingMergeTree { sign, version } => {
            (sign.clone(), version.clone(), String::new(), String::new())
        }
        EngineKind::ReplacingMergeTree { version, is_deleted } => {
            (String::new(), version.clone().unwrap_or_default(), is_deleted.clone().unwrap_or_default(), String::new())
        }
        EngineKind::SummingMergeTree { columns } => {
            (String::new(), String::new(), String::new(), columns.clone().unwrap_or_default().join(", "))
        }
        _ => Default::default(),
    };
    let mut fields = vec![
        ("metadata format version", "1".to_string()),
        ("date column", String::new()),
        ("sampling expression", String::new()),
        ("index granularity", def.settings.index_granularity.to_string()),
        ("mode", mode(&def.engine).to_string()),
        ("sign column", sign),
        ("primary key", primary_key),
        ("data format version", "1".to_string()),
        ("partition key", def.partition_by.as_ref().map(|p| p.to_string()).unwrap_or_default()),
    ];
    if sorting_key != fields[6].1 {
        fields.push(("sorting key", sorting_key));
    }
    fields.push(("granularity bytes", "10485760".to_string()));
    if !version.is_empty() || !is_deleted.is_empty() {
        fields.push(("merge parameters format version", "2".to_string()));
        fields.push(("version column", version));
        if !is_deleted.is_empty() {
            fields.push(("is_deleted column", is_deleted));
        }
    }
    if !columns_to_sum.is_empty() {
        fields.push(("columns to sum", columns_to_sum));
    }
    fields
}

pub fn metadata_text(def: &TableDef) -> String {
    metadata_fields(def).into_iter().fold(String::new(), |mut text, (field, value)| {
        let _ = writeln!(text, "{field}: {value}");
        text
    })
}

/// The fields of a `metadata` node's text, for comparing with this replica's.
pub fn parse_metadata(text: &str) -> Vec<(String, String)> {
    text.lines()
        .filter_map(|line| line.split_once(": ").or_else(|| line.strip_suffix(':').map(|f| (f, ""))))
        .map(|(field, value)| (field.to_string(), value.to_string()))
        .collect()
}

/// The first field where the stored metadata and this replica's differ:
/// `(field, stored, local)`.
pub fn metadata_difference(stored: &str, def: &TableDef) -> Option<(String, String, String)> {
    let stored = parse_metadata(stored);
    let local: Vec<(String, String)> = metadata_fields(def).into_iter().map(|(f, v)| (f.to_string(), v)).collect();
    let value = |fields: &[(String, String)], name: &str| {
        fields.iter().find(|(f, _)| f == name).map(|(_, v)| v.clone()).unwrap_or_default()
    };
    let mut names: Vec<&String> = local.iter().map(|(f, _)| f).collect();
    names.extend(stored.iter().map(|(f, _)| f).filter(|f| !local.iter().any(|(l, _)| l == *f)));
    names
        .into_iter()
        .map(|name| (name.clone(), value(&stored, name), value(&local, name)))
        .find(|(_, stored, local)| stored != local)
}

/// The `columns` node: ClickHouse's `ColumnsDescription` text.
pub fn columns_text(def: &TableDef) -> String {
    let mut text = format!("columns format version: 1\n{} columns:\n", def.columns.len());
    for column in &def.columns {
        let _ = write!(text, "`{}` {}", column.name.replace('`', "\\`"), column.ty);
        if let Some(default) = def.defaults.get(&column.name) {
            let _ = write!(text, "\tDEFAULT {default}");
        }
        text.push('\n');
    }
    text
}

/// A replica's `host` node: where other replicas fetch its parts.
pub fn host_text(interserver_addr: &str, table: &str) -> String {
    let (host, port) = interserver_addr.rsplit_once(':').unwrap_or((interserver_addr, ""));
    format!("host: {host}\nport: {port}\ntcp_port: 0\ndatabase: default\ntable: {table}\nscheme: grpc\n")
}

/// A `GET_PART` log entry, in ClickHouse's text format; `quorum` (when above 1) is the
/// insert's quorum, which each replica getting the part adds itself to.
pub fn get_part_entry(source_replica: &str, part: &PartCommit, quorum: u64) -> String {
    let mut entry = get_part_entry_named(
        source_replica,
        &part.name.to_string(),
        part.reservation.dedup_id.as_deref().unwrap_or(""),
    );
    if quorum > 1 {
        entry.push_str(&format!("quorum: {quorum}\n"));
    }
    entry
}

/// A `GET_PART` entry of a part known by name (a clone's queue: the source's parts).
pub fn get_part_entry_named(source_replica: &str, part: &str, block_id: &str) -> String {
    let created = chrono::Utc::now().format("%Y-%m-%d %H:%M:%S");
    format!(
        "format version: 4\ncreate_time: {created}\nsource replica: {source_replica}\nblock_id: {}\nget\n{part}\n",
        escape(block_id)
    )
}

/// A part's node under the replica: its rows and the size and CRC of each file, which a
/// fetch checks the files it receives against.
pub fn part_node(part: &PartCommit) -> Vec<u8> {
    let header = serde_json::json!({ "rows": part.rows, "files": part.files });
    header.to_string().into_bytes()
}

/// ClickHouse's `escape` of a string in a text format: backslash, tab and newline.
fn escape(text: &str) -> String {
    text.replace('\\', "\\\\").replace('\t', "\\t").replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use super::*;
    use mergestream_engine::schema::ColumnDef;
    use mergestream_engine::settings::TableSettings;
    use mergestream_engine::ChType;

    fn def(engine: EngineKind, order_by: &[&str]) -> TableDef {
        TableDef {
            name: "t".into(),
            columns: vec![
                ColumnDef { name: "k".into(), ty: ChType::UInt64 },
                ColumnDef { name: "v".into(), ty: ChType::UInt64 },
            ],
            engine,
            partition_by: None,
            order_by: order_by.iter().map(|s| s.to_string()).collect(),
            primary_key: vec![],
            sort_expressions: vec![],
            defaults: Default::default(),
            settings: TableSettings::default(),
            replication: None,
            uuid: None,
        }
    }

    #[test]
    fn metadata_names_the_first_field_that_differs() {
        let stored = metadata_text(&def(EngineKind::MergeTree, &["k"]));
        assert_eq!(metadata_difference(&stored, &def(EngineKind::MergeTree, &["k"])), None);
        assert_eq!(
            metadata_difference(&stored, &def(EngineKind::MergeTree, &["v"])),
            Some(("primary key".into(), "k".into(), "v".into()))
        );
        let replacing = def(EngineKind::ReplacingMergeTree { version: Some("v".into()), is_deleted: None }, &["k"]);
        assert_eq!(metadata_difference(&stored, &replacing), Some(("mode".into(), "0".into(), "5".into())));
    }

    #[test]
    fn metadata_text_reads_back_field_by_field() {
        let collapsing = def(EngineKind::CollapsingMergeTree { sign: "v".into() }, &["k"]);
        let fields = parse_metadata(&metadata_text(&collapsing));
        assert!(fields.contains(&("sign column".into(), "v".into())));
        assert!(fields.contains(&("date column".into(), String::new())));
        assert_eq!(fields.len(), metadata_fields(&collapsing).len());
    }

    #[test]
    fn block_number_locks_are_named_as_sequential_nodes_are() {
        let paths = ReplicaPaths { table: "/clickhouse/tables/01/t".into(), replica: "r1".into() };
        assert_eq!(paths.block_number_lock("all", 7), "/clickhouse/tables/01/t/block_numbers/all/block-0000000007");
        assert_eq!(paths.part("all_1_1_0"), "/clickhouse/tables/01/t/replicas/r1/parts/all_1_1_0");
    }
}
