//! `{name}` substitutions in a replicated table's path and replica name, as ClickHouse's
//! `<macros>`: `{shard}` and `{replica}` (and any other) from the node's configuration,
//! `{database}`, `{table}` and `{uuid}` from the table.

use std::collections::BTreeMap;

use mergestream_engine::{EngineError, Result, TableDef};

/// Replaces every `{name}` in `text`.
pub fn expand(text: &str, macros: &BTreeMap<String, String>, def: &TableDef) -> Result<String> {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(open) = rest.find('{') {
        out.push_str(&rest[..open]);
        let after = &rest[open + 1..];
        let close =
            after.find('}').ok_or_else(|| bad(format!("Unbalanced {{ and }} in string with macros: '{text}'")))?;
        let name = &after[..close];
        let value = match name {
            "database" => Some(mergestream_engine::catalog::DATABASE.to_string()),
            "table" => Some(def.name.clone()),
            "uuid" => def.uuid.clone(),
            _ => macros.get(name).cloned(),
        };
        let value = value.ok_or_else(|| {
            bad(format!(
                "No macro '{name}' in config while processing substitutions in '{text}' at '{}' or macro is not supported here",
                open
            ))
        })?;
        out.push_str(&value);
        rest = &after[close + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

fn bad(message: String) -> EngineError {
    EngineError::Replication { code: "SYNTAX_ERROR", message }
}

/// A Keeper path as ClickHouse takes it: absolute, without a trailing `/`.
pub fn normalize_path(path: &str) -> Result<String> {
    let trimmed = path.trim_end_matches('/');
    if !trimmed.starts_with('/') || trimmed.contains("//") {
        return Err(EngineError::Replication {
            code: "BAD_ARGUMENTS",
            message: format!("ZooKeeper path must start with '/' and have no empty components, got '{path}'"),
        });
    }
    Ok(trimmed.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use mergestream_engine::schema::ColumnDef;
    use mergestream_engine::settings::TableSettings;
    use mergestream_engine::{ChType, EngineKind};

    fn def(uuid: Option<&str>) -> TableDef {
        TableDef {
            name: "events".into(),
            columns: vec![ColumnDef { name: "k".into(), ty: ChType::UInt64 }],
            engine: EngineKind::MergeTree,
            partition_by: None,
            order_by: vec!["k".into()],
            primary_key: vec![],
            sort_expressions: vec![],
            defaults: Default::default(),
            settings: TableSettings::default(),
            replication: None,
            uuid: uuid.map(str::to_string),
        }
    }

    #[test]
    fn macros_come_from_the_node_and_the_table() {
        let macros: BTreeMap<String, String> = [("shard".to_string(), "01".to_string())].into();
        let path = expand("/clickhouse/tables/{shard}/{database}/{table}", &macros, &def(None)).expect("expand");
        assert_eq!(path, "/clickhouse/tables/01/default/events");
        let with_uuid = expand("/t/{uuid}", &macros, &def(Some("0-1"))).expect("uuid");
        assert_eq!(with_uuid, "/t/0-1");
    }

    #[test]
    fn an_unknown_macro_is_named() {
        let error = expand("/t/{replica}", &BTreeMap::new(), &def(None)).expect_err("no replica macro");
        assert!(error.to_string().contains("No macro 'replica'"), "{error}");
        assert!(expand("/t/{shard", &BTreeMap::new(), &def(None)).is_err());
    }

    #[test]
    fn paths_are_absolute_without_a_trailing_slash() {
        assert_eq!(normalize_path("/a/b/").expect("ok"), "/a/b");
        assert!(normalize_path("a/b").is_err());
        assert!(normalize_path("/a//b").is_err());
    }
}
