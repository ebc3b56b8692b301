//! The database: tables by name under one data directory, and the background merge pool.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};

use tracing::{error, info, warn};

use crate::commit::{CommitterFactory, LocalCommitters};
use crate::error::{EngineError, Result};
use crate::merge_pool::{MergePool, MERGE_ASSIGN_DELAY, MERGE_RESCAN};
use crate::names::escape_for_file_name;
use crate::schema::TableDef;
use crate::table::{Table, TABLE_DEF_FILE};

pub const DATABASE: &str = "default";

/// A dropped table's directory is renamed to this prefix before it is deleted. Escaped table
/// names never start with `.`, so no table's directory looks like one.
const DROPPED_PREFIX: &str = ".dropped_";

/// A table directory that was found at open but could not be loaded.
#[derive(Debug, Clone)]
pub struct UnopenedTable {
    pub dir: PathBuf,
    pub error: String,
}

/// The tables by name, shared with the merge pool's periodic rescan.
pub(crate) type Tables = Arc<RwLock<BTreeMap<String, Arc<Table>>>>;

pub struct Catalog {
    root: PathBuf,
    /// Makes each table's part committer, by its engine.
    committers: Arc<dyn CommitterFactory>,
    tables: Tables,
    unopened: Vec<UnopenedTable>,
    merges: MergePool,
    /// One lock per table name under DDL (see [`ddl_guard`](Self::ddl_guard)).
    ddl: Mutex<BTreeMap<String, Arc<tokio::sync::Mutex<()>>>>,
}

impl Catalog {
    /// Opens (or creates) the database under `path`, loading every table. A table that cannot
    /// be opened (a corrupt `table.json`, say) is logged, listed by
    /// [`unopened`](Self::unopened) and left on disk untouched; the others open.
    pub fn open(path: &Path, merge_threads: usize) -> Result<Catalog> {
        let catalog = Catalog::open_with(path, merge_threads, Arc::new(LocalCommitters::default()))?;
        catalog.start_replication();
        Ok(catalog)
    }

    /// [`open`](Self::open), with the tables' committers made by `committers`, and the
    /// replication of the tables found on disk not started: the caller first resolves the
    /// prepared inserts a crash left (some of them are parts the coordinator lists already,
    /// which a replication started first would take for lost), then calls
    /// [`start_replication`](Self::start_replication).
    pub fn open_with(path: &Path, merge_threads: usize, committers: Arc<dyn CommitterFactory>) -> Result<Catalog> {
        let root = path.join("data").join(DATABASE);
        std::fs::create_dir_all(&root).map_err(EngineError::io(&root))?;
        let mut tables = BTreeMap::new();
        let mut unopened = Vec::new();
        for entry in std::fs::read_dir(&root).map_err(EngineError::io(&root))? {
            let entry = entry.map_err(EngineError::io(&root))?;
            let dir = entry.path();
            if dir.join(TABLE_DEF_FILE).exists() {
                match Table::open(&dir, committers.as_ref()) {
                    Ok(table) => {
                        tables.insert(table.name().to_string(), Arc::new(table));
                    }
                    Err(e) => {
                        error!(dir = %dir.display(), error = %e, "cannot open this table: it is skipped, its files are kept");
                        unopened.push(UnopenedTable { dir, error: e.to_string() });
                    }
                }
            } else if entry.file_name().to_string_lossy().starts_with(DROPPED_PREFIX) {
                // A DROP TABLE that crashed after the rename.
                std::fs::remove_dir_all(&dir).map_err(EngineError::io(&dir))?;
            }
        }
        metrics::gauge!(crate::metrics::UNOPENED_TABLES).set(unopened.len() as f64);
        let tables: Tables = Arc::new(RwLock::new(tables));
        let merges = MergePool::start(merge_threads, MERGE_ASSIGN_DELAY, MERGE_RESCAN, tables.clone());
        let catalog = Catalog { root, committers, tables, unopened, merges, ddl: Mutex::default() };
        for table in catalog.tables() {
            catalog.schedule_merges(&table);
        }
        Ok(catalog)
    }

    /// Starts the replication of the tables opened from disk (tables created later start
    /// theirs at once).
    pub fn start_replication(&self) {
        for table in self.tables() {
            self.committers.opened(&table);
        }
    }

    /// Serializes CREATE and DROP of one table name (ClickHouse's DDLGuard): two concurrent
    /// `CREATE TABLE IF NOT EXISTS` of a replicated table would otherwise both register the
    /// replica, and the second fail with REPLICA_ALREADY_EXISTS instead of finding the table.
    fn ddl_guard(&self, name: &str) -> Arc<tokio::sync::Mutex<()>> {
        let mut guards = self.ddl.lock().unwrap_or_else(|p| p.into_inner());
        guards.retain(|_, guard| Arc::strong_count(guard) > 1);
        guards.entry(name.to_string()).or_default().clone()
    }

    /// The tables found on disk that could not be opened, and why.
    pub fn unopened(&self) -> &[UnopenedTable] {
        &self.unopened
    }

    /// Sets every table's part gauges (`Table::publish_part_gauges`); a server calls it
    /// every few seconds, as ClickHouse computes its asynchronous metrics.
    pub fn publish_part_gauges(&self) {
        for table in self.tables() {
            table.publish_part_gauges();
        }
    }

    pub fn tables(&self) -> Vec<Arc<Table>> {
        self.tables.read().unwrap_or_else(|p| p.into_inner()).values().cloned().collect()
    }

    /// The replication of a replicated table; `None` for a local one.
    pub fn replica(&self, table: &str) -> Option<Arc<dyn crate::replica::ReplicaControl>> {
        self.committers.replica(table)
    }

    /// The children of a coordinator node (`system.zookeeper`).
    pub async fn coordinator_children(&self, path: &str) -> Result<Vec<crate::replica::CoordinatorNode>> {
        self.committers.coordinator_children(path).await
    }

    pub fn table(&self, name: &str) -> Result<Arc<Table>> {
        self.tables
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(name)
            .cloned()
            .ok_or_else(|| EngineError::UnknownTable(format!("{DATABASE}.{name}")))
    }

    pub fn create_table(&self, def: TableDef, if_not_exists: bool) -> Result<()> {
        let mut tables = self.tables.write().unwrap_or_else(|p| p.into_inner());
        if tables.contains_key(&def.name) {
            return if if_not_exists {
                Ok(())
            } else {
                Err(EngineError::TableExists(format!("{DATABASE}.{}", def.name)))
            };
        }
        crate::names::validate_table_name(&def.name)?;
        def.validate()?;
        // Creating a table never deletes: a directory already there belongs to something the
        // catalog does not know (a table that failed to open, or another program's files).
        let dir = self.root.join(escape_for_file_name(&def.name));
        if dir.exists() {
            return Err(EngineError::DirectoryInTheWay { table: format!("{DATABASE}.{}", def.name), dir });
        }
        let name = def.name.clone();
        let table = Table::create(&dir, def, self.committers.as_ref())?;
        info!(table = %name, "created table");
        let table = Arc::new(table);
        tables.insert(name, table.clone());
        drop(tables);
        self.committers.opened(&table);
        Ok(())
    }

    /// CREATE TABLE from async code: the table is registered where its committer needs it
    /// (a replicated table with its replicas) before its files are made.
    pub async fn create_table_async(self: &Arc<Self>, def: TableDef, if_not_exists: bool) -> Result<()> {
        let guard = self.ddl_guard(&def.name);
        let _held = guard.lock().await;
        if self.tables.read().unwrap_or_else(|p| p.into_inner()).contains_key(&def.name) {
            return self.create_table(def, if_not_exists);
        }
        crate::names::validate_table_name(&def.name)?;
        def.validate()?;
        self.committers.register(&def).await?;
        let catalog = self.clone();
        let created_def = def.clone();
        let created = tokio::task::spawn_blocking(move || catalog.create_table(created_def, if_not_exists))
            .await
            .map_err(|e| EngineError::TaskFailed(e.to_string()))
            .and_then(|r| r);
        if let Err(e) = &created {
            if let Err(undo) = self.committers.unregister(&def).await {
                warn!(table = %def.name, error = %undo, "cannot undo the registration of a table that failed: {e}");
            }
        }
        created
    }

    /// DROP TABLE from async code: the files go, then the table's registration.
    pub async fn drop_table_async(self: &Arc<Self>, name: &str, if_exists: bool) -> Result<()> {
        let guard = self.ddl_guard(name);
        let _held = guard.lock().await;
        let def = match self.table(name) {
            Ok(table) => table.def().clone(),
            Err(_) if if_exists => return Ok(()),
            Err(e) => return Err(e),
        };
        let catalog = self.clone();
        let dropped = name.to_string();
        tokio::task::spawn_blocking(move || catalog.drop_table(&dropped, if_exists))
            .await
            .map_err(|e| EngineError::TaskFailed(e.to_string()))??;
        self.committers.unregister(&def).await
    }

    pub fn drop_table(&self, name: &str, if_exists: bool) -> Result<()> {
        let table = {
            let mut tables = self.tables.write().unwrap_or_else(|p| p.into_inner());
            match tables.remove(name) {
                Some(t) => t,
                None if if_exists => return Ok(()),
                None => return Err(EngineError::UnknownTable(format!("{DATABASE}.{name}"))),
            }
        };
        table.stop_merges_and_wait();
        // Renamed first, so a crash midway leaves no half table behind.
        let trash = self.root.join(format!("{DROPPED_PREFIX}{}", escape_for_file_name(name)));
        std::fs::rename(table.dir(), &trash).map_err(EngineError::io(&trash))?;
        std::fs::remove_dir_all(&trash).map_err(EngineError::io(&trash))?;
        info!(table = name, "dropped table");
        Ok(())
    }

    /// Asks the pool to merge the table's parts if its selector finds a merge.
    pub fn schedule_merges(&self, table: &Arc<Table>) {
        self.merges.schedule(table.clone());
    }
}
