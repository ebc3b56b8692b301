//! Validation of a parsed pipeline document into a [`Pipeline`], collecting every problem.

use std::collections::BTreeMap;
use std::path::Path;

use mergestream_engine::ChType;

use super::yaml::{self, Location, Node, Value};
use super::*;
use crate::decode::avro::AvroSchema;

pub(super) fn check(text: &str, base: &Path, env: &dyn Fn(&str) -> Option<String>) -> Result<Pipeline, Vec<Problem>> {
    let mut root = match yaml::parse(text) {
        Ok(Some(root)) => root,
        Ok(None) => {
            return Err(vec![Problem {
                at: Location { line: 1, column: 1 },
                message: "the file is empty: expected a pipeline mapping (name, source, format, tables)".into(),
            }])
        }
        Err(e) => return Err(vec![Problem { at: e.at, message: format!("not valid YAML: {}", e.message) }]),
    };
    let mut checker = Checker { text, base, problems: Vec::new() };
    for (at, message) in super::variables::expand(&mut root, env) {
        checker.problems.push(Problem { at, message });
    }
    let pipeline = checker.pipeline(&root);
    let mut problems = checker.problems;
    problems.sort_by_key(|p| p.at);
    match pipeline {
        Some(p) if problems.is_empty() => Ok(p),
        _ => Err(problems),
    }
}

struct Checker<'a> {
    text: &'a str,
    base: &'a Path,
    problems: Vec<Problem>,
}

/// The keys of one mapping, checked against what the mapping allows.
struct Fields<'n> {
    at: Location,
    entries: BTreeMap<&'n str, (&'n Node, &'n Node)>,
}

impl<'n> Fields<'n> {
    fn get(&self, key: &str) -> Option<&'n Node> {
        self.entries.get(key).map(|(_, v)| *v).filter(|v| !v.is_null())
    }
}

impl<'a> Checker<'a> {
    fn problem(&mut self, at: Location, message: impl Into<String>) {
        self.problems.push(Problem { at, message: message.into() });
    }

    /// The entries of a mapping; unknown and repeated keys are problems. `what` names the
    /// mapping in messages ("source.kafka").
    fn fields<'n>(&mut self, node: &'n Node, what: &str, allowed: &[&str], required: &[&str]) -> Option<Fields<'n>> {
        let Value::Mapping(entries) = &node.value else {
            self.problem(
                node.at,
                format!("{what}: expected a mapping with keys {}, found {}", allowed.join(", "), node.kind()),
            );
            return None;
        };
        let mut fields = Fields { at: node.at, entries: BTreeMap::new() };
        for (key, value) in entries {
            let Some(name) = key.as_scalar() else {
                self.problem(key.at, format!("{what}: a key must be a plain name, found {}", key.kind()));
                continue;
            };
            if !allowed.contains(&name) {
                self.problem(key.at, format!("{what}: unknown key `{name}`; expected one of: {}", allowed.join(", ")));
                continue;
            }
            if fields.entries.insert(name, (key, value)).is_some() {
                self.problem(key.at, format!("{what}: `{name}` is given twice"));
            }
        }
        for name in required {
            if fields.get(name).is_none() {
                self.problem(node.at, format!("{what}: missing required key `{name}`"));
            }
        }
        Some(fields)
    }

    fn string(&mut self, node: &Node, what: &str) -> Option<String> {
        match &node.value {
            Value::Scalar { text, .. } | Value::Block(text) if !node.is_null() && !text.is_empty() => {
                Some(text.clone())
            }
            _ => {
                self.problem(node.at, format!("{what}: expected a non-empty string, found {}", node.kind()));
                None
            }
        }
    }

    fn strings(&mut self, node: &Node, what: &str) -> Option<Vec<String>> {
        match &node.value {
            Value::Sequence(items) if !items.is_empty() => {
                let out: Vec<Option<String>> = items.iter().map(|i| self.string(i, what)).collect();
                out.into_iter().collect()
            }
            Value::Scalar { .. } => self.string(node, what).map(|s| vec![s]),
            _ => {
                self.problem(
                    node.at,
                    format!("{what}: expected a string or a non-empty list of strings, found {}", node.kind()),
                );
                None
            }
        }
    }

    fn positive(&mut self, node: &Node, what: &str) -> Option<u64> {
        let parsed = node.as_scalar().and_then(parse_size);
        match parsed {
            Some(n) if n > 0 => Some(n),
            _ => {
                self.problem(
                    node.at,
                    format!(
                        "{what}: expected a positive whole number (sizes may end in KiB, MiB or GiB), found `{}`",
                        node.as_scalar().unwrap_or(node.kind())
                    ),
                );
                None
            }
        }
    }

    fn pipeline(&mut self, root: &Node) -> Option<Pipeline> {
        let f = self.fields(
            root,
            "pipeline",
            &["name", "source", "format", "tables", "batch", "errors", "max_in_flight_bytes", "insert"],
            &["name", "source", "format", "tables"],
        )?;
        let name = f.get("name").and_then(|n| {
            let name = self.string(n, "name")?;
            if name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-') {
                Some(name)
            } else {
                self.problem(
                    n.at,
                    format!("name: `{name}` may hold only letters, digits, `_` and `-` (it names coordinator nodes)"),
                );
                None
            }
        });
        let source = f.get("source").and_then(|n| self.source(n, name.as_deref().unwrap_or("pipeline")));
        let format = f.get("format").and_then(|n| self.format(n));
        let tables = f.get("tables").and_then(|n| self.tables(n));
        let batch = match f.get("batch") {
            Some(n) => self.batch(n),
            None => Some(BatchLimits::default()),
        };
        let errors = match f.get("errors") {
            Some(n) => self.errors(n),
            None => Some(ErrorPolicy::default()),
        };
        if let (Some(Format::Avro { schema }), Some(tables)) = (&format, &tables) {
            self.check_fields_in_schema(schema, tables);
        }
        let max_in_flight_bytes = match f.get("max_in_flight_bytes") {
            Some(n) => self.positive(n, "max_in_flight_bytes"),
            None => Some(256 << 20),
        };
        let insert = match f.get("insert") {
            Some(n) => self.insert(n),
            None => Some(InsertPolicy::default()),
        };
        Some(Pipeline {
            insert: insert?,
            name: name?,
            source: source?,
            format: format?,
            tables: tables?,
            batch: batch?,
            errors: errors?,
            max_in_flight_bytes: max_in_flight_bytes?,
        })
    }

    fn source(&mut self, node: &Node, pipeline: &str) -> Option<Source> {
        let f = self.fields(node, "source", &["kafka", "nats"], &[])?;
        match (f.get("kafka"), f.get("nats")) {
            (Some(k), None) => self.kafka(k, pipeline).map(Source::Kafka),
            (None, Some(n)) => self.nats(n).map(Source::Nats),
            (Some(_), Some(n)) => {
                self.problem(n.at, "source: give either `kafka` or `nats`, not both");
                None
            }
            (None, None) => {
                self.problem(f.at, "source: expected `kafka` or `nats`");
                None
            }
        }
    }

    fn kafka(&mut self, node: &Node, pipeline: &str) -> Option<KafkaSource> {
        let f = self.fields(
            node,
            "source.kafka",
            &["brokers", "topics", "group_id", "properties"],
            &["brokers", "topics"],
        )?;
        let brokers = f.get("brokers").and_then(|n| self.strings(n, "source.kafka.brokers")).map(|b| b.join(","));
        let topics = f.get("topics").and_then(|n| self.strings(n, "source.kafka.topics"));
        let group_id = match f.get("group_id") {
            Some(n) => self.string(n, "source.kafka.group_id"),
            None => Some(format!("mergestream-{pipeline}")),
        };
        let mut properties = BTreeMap::new();
        if let Some(n) = f.get("properties") {
            match &n.value {
                Value::Mapping(entries) => {
                    for (k, v) in entries {
                        let (Some(key), Some(value)) = (k.as_scalar(), v.as_scalar()) else {
                            self.problem(
                                k.at,
                                "source.kafka.properties: expected `name: value` pairs of librdkafka settings",
                            );
                            continue;
                        };
                        // These belong to the ingestor: the position comes from the coordinator.
                        if matches!(
                            key,
                            "bootstrap.servers" | "group.id" | "enable.auto.commit" | "enable.auto.offset.store"
                        ) {
                            self.problem(
                                k.at,
                                format!(
                                    "source.kafka.properties: `{key}` is set by the ingestor (use brokers / group_id)"
                                ),
                            );
                            continue;
                        }
                        if key == "sasl.mechanism" && value.eq_ignore_ascii_case("GSSAPI") {
                            self.problem(
                                v.at,
                                "source.kafka.properties: sasl.mechanism GSSAPI (Kerberos) is not built into this \
                                 ingestor's librdkafka; PLAIN, SCRAM-SHA-256, SCRAM-SHA-512 and OAUTHBEARER are",
                            );
                            continue;
                        }
                        properties.insert(key.to_string(), value.to_string());
                    }
                }
                _ => self.problem(
                    n.at,
                    format!("source.kafka.properties: expected a mapping of librdkafka settings, found {}", n.kind()),
                ),
            }
        }
        Some(KafkaSource { brokers: brokers?, topics: topics?, group_id: group_id?, properties })
    }

    fn nats(&mut self, node: &Node) -> Option<NatsSource> {
        let f = self.fields(
            node,
            "source.nats",
            &["url", "stream", "consumer", "subjects"],
            &["url", "stream", "consumer"],
        )?;
        let url = f.get("url").and_then(|n| self.string(n, "source.nats.url"));
        let stream = f.get("stream").and_then(|n| self.string(n, "source.nats.stream"));
        let consumer = f.get("consumer").and_then(|n| self.string(n, "source.nats.consumer"));
        let subjects = match f.get("subjects") {
            Some(n) => self.strings(n, "source.nats.subjects"),
            None => Some(Vec::new()),
        };
        Some(NatsSource { url: url?, stream: stream?, consumer: consumer?, subjects: subjects? })
    }

    fn format(&mut self, node: &Node) -> Option<Format> {
        if let Some(word) = node.as_scalar() {
            return match word {
                "json" => Some(Format::Json),
                _ => {
                    self.problem(
                        node.at,
                        format!("format: unknown format `{word}`; expected json, avro or avro-confluent"),
                    );
                    None
                }
            };
        }
        let f = self.fields(node, "format", &["json", "avro", "avro-confluent"], &[])?;
        let given: Vec<&str> =
            ["json", "avro", "avro-confluent"].into_iter().filter(|k| f.entries.contains_key(k)).collect();
        if given.len() != 1 {
            self.problem(f.at, "format: expected exactly one of json, avro, avro-confluent");
            return None;
        }
        match given[0] {
            "json" => {
                if let Some(n) = f.get("json") {
                    self.fields(n, "format.json", &[], &[]);
                }
                Some(Format::Json)
            }
            "avro" => {
                let n = f.entries["avro"].1;
                let a = self.fields(n, "format.avro", &["schema"], &["schema"])?;
                let schema = a.get("schema").and_then(|s| self.schema_file(s, "format.avro.schema"))?;
                Some(Format::Avro { schema })
            }
            _ => {
                let n = f.entries["avro-confluent"].1;
                let a = self.fields(
                    n,
                    "format.avro-confluent",
                    &["registry_url", "registry_ca_file", "registry_basic_auth", "schemas"],
                    &[],
                )?;
                let registry = a.get("registry_url").and_then(|url_node| {
                    let url = self.string(url_node, "format.avro-confluent.registry_url")?;
                    let ca_file = a
                        .get("registry_ca_file")
                        .and_then(|f| self.string(f, "format.avro-confluent.registry_ca_file"))
                        .map(|f| self.base.join(f));
                    let basic_auth = a
                        .get("registry_basic_auth")
                        .and_then(|c| self.string(c, "format.avro-confluent.registry_basic_auth"));
                    let config = RegistryConfig { url, ca_file, basic_auth };
                    match crate::decode::registry::Registry::check(&config) {
                        Ok(_) => Some(config),
                        Err(e) => {
                            self.problem(url_node.at, format!("format.avro-confluent.registry_url: {e}"));
                            None
                        }
                    }
                });
                let mut schemas = BTreeMap::new();
                if let Some(map) = a.get("schemas") {
                    match &map.value {
                        Value::Mapping(entries) => {
                            for (id, file) in entries {
                                let Some(id_value) = id.as_scalar().and_then(|s| s.parse::<u32>().ok()) else {
                                    self.problem(id.at, "format.avro-confluent.schemas: expected a schema id (a whole number) as the key");
                                    continue;
                                };
                                if let Some(schema) = self.schema_file(file, "format.avro-confluent.schemas") {
                                    schemas.insert(id_value, schema);
                                }
                            }
                        }
                        _ => self.problem(
                            map.at,
                            "format.avro-confluent.schemas: expected a mapping of schema id to .avsc file",
                        ),
                    }
                }
                if a.get("registry_url").is_none() && schemas.is_empty() {
                    self.problem(
                        n.at,
                        "format.avro-confluent: give `registry_url` or `schemas` (id: file.avsc) to resolve schema ids",
                    );
                    return None;
                }
                if a.get("registry_url").is_some() && registry.is_none() {
                    return None; // reported above
                }
                Some(Format::AvroConfluent { registry, schemas })
            }
        }
    }

    /// The Avro schema in the file a node names, parsed.
    fn schema_file(&mut self, node: &Node, what: &str) -> Option<Arc<AvroSchema>> {
        let name = self.string(node, what)?;
        let path = self.base.join(&name);
        let parsed =
            std::fs::read_to_string(&path).map_err(|e| format!("cannot read {}: {e}", path.display())).and_then(
                |text| AvroSchema::parse(&text).map_err(|e| format!("{} is not an Avro schema: {e}", path.display())),
            );
        match parsed {
            Ok(schema) => Some(Arc::new(schema)),
            Err(message) => {
                self.problem(node.at, format!("{what}: {message}"));
                None
            }
        }
    }

    /// With one writer schema, every mapped field must be in it.
    fn check_fields_in_schema(&mut self, schema: &AvroSchema, tables: &[TableTarget]) {
        for mapping in tables.iter().flat_map(|t| &t.columns) {
            if let ValueSource::Field(path) = &mapping.source {
                if let Err(message) = schema.check_path(path) {
                    self.problem(mapping.at, format!("tables[].columns.{}: {message}", mapping.column));
                }
            }
        }
    }

    fn tables(&mut self, node: &Node) -> Option<Vec<TableTarget>> {
        let Value::Sequence(items) = &node.value else {
            self.problem(node.at, format!("tables: expected a list of tables, found {}", node.kind()));
            return None;
        };
        if items.is_empty() {
            self.problem(node.at, "tables: expected at least one table");
            return None;
        }
        let tables: Vec<Option<TableTarget>> = items.iter().map(|t| self.table(t)).collect();
        let tables: Vec<TableTarget> = tables.into_iter().collect::<Option<_>>()?;
        for (i, t) in tables.iter().enumerate() {
            if tables[..i].iter().any(|o| o.name == t.name) {
                self.problem(items[i].at, format!("tables: table `{}` is listed twice", t.name));
            }
        }
        Some(tables)
    }

    fn table(&mut self, node: &Node) -> Option<TableTarget> {
        let f = self.fields(node, "tables[]", &["ddl", "columns"], &["ddl", "columns"])?;
        let ddl_node = f.get("ddl")?;
        let ddl = self.string(ddl_node, "tables[].ddl")?;
        let def = match mergestream_query::sql::parse_create_table_statement(&ddl) {
            Ok((def, _)) => def,
            Err(e) => {
                let (at, message) = match &e {
                    mergestream_query::QueryError::Syntax { line, column, message } => {
                        (self.place_in_scalar(ddl_node, *line, *column), message.clone())
                    }
                    other => (ddl_node.at, other.to_string()),
                };
                self.problem(at, format!("tables[].ddl: {message}"));
                return None;
            }
        };
        let columns_node = f.get("columns")?;
        let columns = self.columns(columns_node, &def)?;
        Some(TableTarget { name: def.name.clone(), ddl, def, columns })
    }

    /// The file position of (line, column) inside a scalar's text: exact for literal (`|`)
    /// blocks and one-line scalars, approximate for folded ones.
    fn place_in_scalar(&self, node: &Node, line: usize, column: usize) -> Location {
        match &node.value {
            Value::Block(_) => Location { line: node.at.line + line - 1, column: node.at.column + column - 1 },
            _ => {
                let here = self.text.lines().nth(node.at.line - 1).unwrap_or("");
                let rest: String = here.chars().skip(node.at.column - 1).collect();
                let quote = usize::from(rest.starts_with('"') || rest.starts_with('\''));
                if line == 1 {
                    Location { line: node.at.line, column: node.at.column + quote + column - 1 }
                } else {
                    Location { line: node.at.line + line - 1, column }
                }
            }
        }
    }

    fn columns(&mut self, node: &Node, def: &TableDef) -> Option<Vec<ColumnMapping>> {
        let Value::Mapping(entries) = &node.value else {
            self.problem(
                node.at,
                format!("tables[].columns: expected a mapping of column name to its source, found {}", node.kind()),
            );
            return None;
        };
        let mut out = Vec::new();
        let mut ok = true;
        for (key, value) in entries {
            let Some(column) = key.as_scalar() else {
                self.problem(key.at, "tables[].columns: expected a column name as the key");
                ok = false;
                continue;
            };
            let Some(col) = def.columns.iter().find(|c| c.name == column) else {
                let names: Vec<&str> = def.columns.iter().map(|c| c.name.as_str()).collect();
                self.problem(
                    key.at,
                    format!(
                        "tables[].columns: `{column}` is not a column of {}; its columns are {}",
                        def.name,
                        names.join(", ")
                    ),
                );
                ok = false;
                continue;
            };
            if out.iter().any(|m: &ColumnMapping| m.column == column) {
                self.problem(key.at, format!("tables[].columns: `{column}` is mapped twice"));
                ok = false;
                continue;
            }
            match self.mapping(value, column, &col.ty) {
                Some(m) => out.push(m),
                None => ok = false,
            }
        }
        if out.is_empty() && ok {
            self.problem(node.at, "tables[].columns: map at least one column");
            return None;
        }
        ok.then_some(out)
    }

    fn mapping(&mut self, node: &Node, column: &str, ty: &ChType) -> Option<ColumnMapping> {
        const SOURCES: &[&str] = &["field", "key", "topic", "partition", "offset", "timestamp", "header", "sequence"];
        let what = format!("tables[].columns.{column}");
        // `column: field.path` is short for `column: { field: field.path }`.
        if let Some(path) = node.as_scalar().filter(|_| !node.is_null()) {
            return Some(ColumnMapping {
                column: column.to_string(),
                source: ValueSource::Field(path.split('.').map(str::to_string).collect()),
                default: None,
                convert: None,
                at: node.at,
            });
        }
        let mut allowed = SOURCES.to_vec();
        allowed.extend(["default", "convert"]);
        let f = self.fields(node, &what, &allowed, &[])?;
        let given: Vec<&str> = SOURCES.iter().copied().filter(|k| f.entries.contains_key(k)).collect();
        if given.len() != 1 {
            self.problem(f.at, format!("{what}: expected exactly one source: {}", SOURCES.join(", ")));
            return None;
        }
        let source_node = f.entries[given[0]].1;
        let source = match given[0] {
            "field" => ValueSource::Field(self.string(source_node, &what)?.split('.').map(str::to_string).collect()),
            "header" => ValueSource::Header(self.string(source_node, &what)?),
            word => {
                if !matches!(source_node.as_scalar(), Some("true")) {
                    self.problem(source_node.at, format!("{what}: write `{word}: true`"));
                    return None;
                }
                match word {
                    "key" => ValueSource::Key,
                    "topic" => ValueSource::Topic,
                    "partition" => ValueSource::Partition,
                    // A JetStream stream sequence takes the place of the offset.
                    "offset" | "sequence" => ValueSource::Offset,
                    _ => ValueSource::Timestamp,
                }
            }
        };
        let default = match f.get("default") {
            Some(d) => Some(self.default_value(d, &what, ty)?),
            None => None,
        };
        let convert = match f.get("convert") {
            Some(c) => {
                let name = self.string(c, &what)?;
                match Conversion::parse(&name) {
                    Some(conv) => Some(conv),
                    None => {
                        self.problem(
                            c.at,
                            format!(
                                "{what}: unknown conversion `{name}`; expected one of: {}",
                                Conversion::NAMES.join(", ")
                            ),
                        );
                        return None;
                    }
                }
            }
            None => None,
        };
        Some(ColumnMapping { column: column.to_string(), source, default, convert, at: node.at })
    }

    fn default_value(&mut self, node: &Node, what: &str, ty: &ChType) -> Option<serde_json::Value> {
        let (text, quoted) = match &node.value {
            Value::Scalar { text, quoted } => (text, *quoted),
            Value::Block(text) => (text, true),
            _ => {
                self.problem(node.at, format!("{what}.default: expected a scalar value"));
                return None;
            }
        };
        let value = if quoted {
            serde_json::Value::String(text.clone())
        } else {
            serde_json::from_str(text).unwrap_or_else(|_| serde_json::Value::String(text.clone()))
        };
        if let Err(message) = crate::decode::check_default(&value, ty) {
            self.problem(node.at, format!("{what}.default: {message}"));
            return None;
        }
        Some(value)
    }

    fn batch(&mut self, node: &Node) -> Option<BatchLimits> {
        let f = self.fields(node, "batch", &["max_rows", "max_bytes", "max_ms", "idle_ms"], &[])?;
        let defaults = BatchLimits::default();
        let max_rows = f.get("max_rows").map_or(Some(defaults.max_rows as u64), |n| self.positive(n, "batch.max_rows"));
        let max_bytes =
            f.get("max_bytes").map_or(Some(defaults.max_bytes as u64), |n| self.positive(n, "batch.max_bytes"));
        let max_ms = f.get("max_ms").map_or(Some(defaults.max_ms), |n| self.positive(n, "batch.max_ms"));
        let idle_ms = match f.get("idle_ms") {
            Some(n) => Some(Some(self.positive(n, "batch.idle_ms")?)),
            None => Some(None),
        };
        Some(BatchLimits {
            max_rows: max_rows? as usize,
            max_bytes: max_bytes? as usize,
            max_ms: max_ms?,
            idle_ms: idle_ms?,
        })
    }

    fn insert(&mut self, node: &Node) -> Option<InsertPolicy> {
        let f = self.fields(node, "insert", &["quorum", "quorum_timeout_ms"], &[])?;
        let quorum = match f.get("quorum") {
            None => Some(None),
            Some(n) => match n.as_scalar() {
                Some("auto") => Some(Some(QuorumSetting::Majority)),
                Some(text) => match text.parse::<u64>() {
                    // As in ClickHouse, a quorum of 0 or 1 is no quorum.
                    Ok(0 | 1) => Some(None),
                    Ok(replicas) => Some(Some(QuorumSetting::Replicas(replicas))),
                    Err(_) => {
                        self.problem(
                            n.at,
                            format!("insert.quorum: expected a number of replicas or `auto`, found `{text}`"),
                        );
                        None
                    }
                },
                None => {
                    self.problem(
                        n.at,
                        format!("insert.quorum: expected a number of replicas or `auto`, found {}", n.kind()),
                    );
                    None
                }
            },
        };
        let defaults = InsertPolicy::default();
        let quorum_timeout_ms = f
            .get("quorum_timeout_ms")
            .map_or(Some(defaults.quorum_timeout_ms), |n| self.positive(n, "insert.quorum_timeout_ms"));
        Some(InsertPolicy { quorum: quorum?, quorum_timeout_ms: quorum_timeout_ms? })
    }

    fn errors(&mut self, node: &Node) -> Option<ErrorPolicy> {
        let f = self.fields(node, "errors", &["mode", "dead_letter_topic", "max_error_rate"], &["mode"])?;
        let mode_node = f.get("mode")?;
        let mode = match mode_node.as_scalar() {
            Some("skip") => Some(ErrorMode::Skip),
            Some("fail") => Some(ErrorMode::Fail),
            Some("dead_letter") => match f.get("dead_letter_topic") {
                Some(t) => self.string(t, "errors.dead_letter_topic").map(|topic| ErrorMode::DeadLetter { topic }),
                None => {
                    self.problem(mode_node.at, "errors: mode dead_letter needs `dead_letter_topic`");
                    None
                }
            },
            other => {
                self.problem(
                    mode_node.at,
                    format!("errors.mode: unknown mode `{}`; expected dead_letter, skip or fail", other.unwrap_or("")),
                );
                None
            }
        };
        if let (Some(t), Some(m)) = (f.entries.get("dead_letter_topic"), &mode) {
            if !matches!(m, ErrorMode::DeadLetter { .. }) {
                self.problem(t.0.at, "errors: `dead_letter_topic` is used only with mode dead_letter");
            }
        }
        let max_error_rate = match f.get("max_error_rate") {
            Some(n) => match n.as_scalar().and_then(|s| s.parse::<f64>().ok()) {
                Some(r) if (0.0..=1.0).contains(&r) => Some(r),
                _ => {
                    self.problem(n.at, "errors.max_error_rate: expected a number between 0 and 1");
                    None
                }
            },
            None => Some(1.0),
        };
        Some(ErrorPolicy { mode: mode?, max_error_rate: max_error_rate? })
    }
}

/// `1000`, `64KiB`, `16MiB`, `1GiB`.
fn parse_size(text: &str) -> Option<u64> {
    let text = text.trim();
    let (digits, unit) = match text.find(|c: char| !c.is_ascii_digit()) {
        Some(i) => text.split_at(i),
        None => (text, ""),
    };
    let n: u64 = digits.parse().ok()?;
    let scale = match unit.trim() {
        "" => 1,
        "KiB" => 1 << 10,
        "MiB" => 1 << 20,
        "GiB" => 1 << 30,
        _ => return None,
    };
    n.checked_mul(scale)
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = r#"name: orders
source:
  kafka:
    brokers: 127.0.0.1:9092
    topics: [orders]
    properties:
      security.protocol: plaintext
format: json
tables:
  - ddl: |
      CREATE TABLE orders (id UInt64, amount Float64, who String, p UInt32, o UInt64)
      ENGINE = ReplacingMergeTree ORDER BY id
    columns:
      id: id
      amount: { field: order.amount, default: 0 }
      who: { key: true }
      p: { partition: true }
      o: { offset: true }
batch: { max_rows: 5000, max_bytes: 4MiB, max_ms: 200 }
errors: { mode: dead_letter, dead_letter_topic: orders-bad, max_error_rate: 0.5 }
"#;

    fn problems(text: &str) -> Vec<String> {
        match Pipeline::parse(text, Path::new(".")) {
            Ok(_) => Vec::new(),
            Err(problems) => problems.iter().map(|p| p.to_string()).collect(),
        }
    }

    #[test]
    fn secrets_come_from_merge_stream_variables() {
        let text = GOOD.replace(
            "      security.protocol: plaintext\n",
            "      security.protocol: sasl_plaintext\n      sasl.password: ${MERGESTREAM_KAFKA_PASSWORD}\n",
        );
        let env = |name: &str| (name == "MERGESTREAM_KAFKA_PASSWORD").then(|| "hunter2".to_string());
        let p = Pipeline::parse_with_env(&text, Path::new("."), &env).expect("valid");
        let Source::Kafka(k) = &p.source else { panic!("kafka") };
        assert_eq!(k.properties["sasl.password"], "hunter2");
        let unset = Pipeline::parse_with_env(&text, Path::new("."), &|_| None).expect_err("unset");
        assert_eq!(
            unset.iter().map(|p| p.to_string()).collect::<Vec<_>>(),
            ["8:22: `${MERGESTREAM_KAFKA_PASSWORD}`: the environment variable MERGESTREAM_KAFKA_PASSWORD is not set"]
        );
    }

    #[test]
    fn a_good_pipeline_loads() {
        let p = Pipeline::parse(GOOD, Path::new(".")).expect("valid");
        assert_eq!(p.name, "orders");
        let Source::Kafka(k) = &p.source else { panic!("kafka") };
        assert_eq!(
            (k.group_id.as_str(), k.properties["security.protocol"].as_str()),
            ("mergestream-orders", "plaintext")
        );
        assert_eq!(p.tables[0].columns[1].source, ValueSource::Field(vec!["order".into(), "amount".into()]));
        assert_eq!(p.batch.max_bytes, 4 << 20);
        assert_eq!(p.batch.idle_ms, None, "off unless set");
        let idle = Pipeline::parse(&GOOD.replace("max_ms: 200 }", "max_ms: 200, idle_ms: 50 }"), Path::new("."));
        assert_eq!(idle.expect("valid").batch.idle_ms, Some(50));
        assert_eq!(p.errors.mode, ErrorMode::DeadLetter { topic: "orders-bad".into() });
        assert_eq!(p.message_parts(), MessageParts { headers: false, timestamp: false }, "only what is mapped");
        let parts = |from: &str| {
            let text = GOOD.replace("who: { key: true }", &format!("who: {{ {from} }}"));
            Pipeline::parse(&text, Path::new(".")).expect("valid").message_parts()
        };
        assert_eq!(parts("header: trace"), MessageParts { headers: true, timestamp: false });
        assert_eq!(parts("timestamp: true"), MessageParts { headers: false, timestamp: true });
    }

    #[test]
    fn a_registry_address_is_checked_where_it_is_written() {
        let with = |format: &str| GOOD.replace("format: json", format);
        let https = with("format:\n  avro-confluent: { registry_url: 'https://sr:8443/', registry_basic_auth: 'u:p' }");
        let p = Pipeline::parse(&https, Path::new(".")).expect("valid");
        let Format::AvroConfluent { registry: Some(registry), .. } = &p.format else { panic!("{:?}", p.format) };
        assert_eq!((registry.url.as_str(), registry.basic_auth.as_deref()), ("https://sr:8443/", Some("u:p")));
        let found = problems(&with("format:\n  avro-confluent: { registry_url: 'ftp://sr' }"));
        assert_eq!(found.len(), 1, "{found:#?}");
        assert!(
            found[0].starts_with("9:35: format.avro-confluent.registry_url: ftp://sr: expected an http"),
            "{}",
            found[0]
        );
        let missing_ca = problems(&with(
            "format:\n  avro-confluent: { registry_url: 'https://sr', registry_ca_file: no-such-ca.pem }",
        ));
        assert!(missing_ca.len() == 1 && missing_ca[0].contains("no-such-ca.pem"), "{missing_ca:#?}");
    }

    #[test]
    fn every_problem_is_reported_with_its_place() {
        let bad = GOOD
            .replace("    topics: [orders]\n", "    topics: [orders]\n    topcs: x\n")
            .replace("who: { key: true }", "whom: { key: true }")
            .replace("max_ms: 200", "max_ms: soon")
            .replace("mode: dead_letter, dead_letter_topic: orders-bad", "mode: retry");
        let found = problems(&bad);
        assert_eq!(found.len(), 4, "{found:#?}");
        assert!(found[0].starts_with("6:5: source.kafka: unknown key `topcs`"), "{}", found[0]);
        assert!(found[1].starts_with("17:7: tables[].columns: `whom` is not a column of orders"), "{}", found[1]);
        assert!(found[2].starts_with("20:51: batch.max_ms: expected a positive whole number"), "{}", found[2]);
        assert!(found[3].starts_with("21:17: errors.mode: unknown mode `retry`"), "{}", found[3]);
    }

    #[test]
    fn an_insert_quorum_is_a_number_of_replicas_or_auto() {
        assert_eq!(Pipeline::parse(GOOD, Path::new(".")).expect("valid").insert, InsertPolicy::default());
        let with = |insert: &str| format!("{GOOD}insert: {insert}\n");
        let quorum = |insert: &str| Pipeline::parse(&with(insert), Path::new(".")).expect("valid").insert;
        assert_eq!(
            quorum("{ quorum: 2, quorum_timeout_ms: 5000 }"),
            InsertPolicy { quorum: Some(QuorumSetting::Replicas(2)), quorum_timeout_ms: 5000 }
        );
        assert_eq!(quorum("{ quorum: auto }").quorum, Some(QuorumSetting::Majority));
        assert_eq!(quorum("{ quorum: 1 }").quorum, None, "a quorum of one is none");
        let found = problems(&with("{ quorum: most, quorum_timeout_ms: 0 }"));
        assert_eq!(found.len(), 2, "{found:#?}");
        assert!(
            found[0].contains(": insert.quorum: expected a number of replicas or `auto`, found `most`"),
            "{}",
            found[0]
        );
        assert!(found[1].contains(": insert.quorum_timeout_ms: expected a positive whole number"), "{}", found[1]);
    }

    #[test]
    fn a_ddl_error_points_into_the_block() {
        let bad = GOOD.replace("ENGINE = ReplacingMergeTree ORDER BY id", "ENGINE = ReplacingMergeTree ORDR BY id");
        let found = problems(&bad);
        assert_eq!(found.len(), 1, "{found:#?}");
        assert!(
            found[0].starts_with(
                "12:35: tables[].ddl: expected ENGINE, PARTITION BY, ORDER BY, PRIMARY KEY or SETTINGS, found 'ORDR'"
            ),
            "{}",
            found[0]
        );
    }

    #[test]
    fn missing_keys_and_bad_yaml() {
        let found = problems("name: x\nsource: {}\n");
        assert_eq!(found.len(), 3, "{found:#?}");
        assert!(found.iter().any(|p| p.starts_with("1:1: pipeline: missing required key `format`")));
        assert!(found.iter().any(|p| p.starts_with("2:9: source: expected `kafka` or `nats`")));
        let found = problems("name: [x\n");
        assert!(found[0].contains("not valid YAML"), "{found:?}");
    }
}
