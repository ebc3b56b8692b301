//! Replicated tables: the `Replicated*` engines over the coordinator.
//!
//! A storage node is one replica. Its [`ReplicatedCommitters`] is the catalog's committer
//! factory: non-replicated tables get the engine's local committer, replicated ones a
//! [`ReplicatedCommitter`] whose block numbers, deduplication and commit live in the
//! coordinator under the table's path ([`layout`]). Joining and leaving a table is
//! [`register`]. Each replicated table's [`ReplicationQueue`] pulls the shared log and fetches
//! the parts this replica lacks ([`fetch`]) from the others.

pub mod activation;
pub mod cleanup;
pub mod clone;
pub mod committer;
pub mod control;
pub mod fetch;
pub mod layout;
pub mod macros;
pub mod merges;
pub mod metrics;
pub mod optimize;
pub mod part_check;
pub mod queue;
pub mod quorum;
pub mod register;
pub mod restore;
pub mod session;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, Mutex};

use mergestream_engine::commit::{BoxFuture, CommitterFactory, FoundBlocks, LocalCommitters, PartCommitter};
use mergestream_engine::replica::{CoordinatorNode, ReplicaControl};
use mergestream_engine::{EngineError, Result, Table, TableDef};
use tracing::warn;

pub use activation::Activation;
pub use committer::ReplicatedCommitter;
pub use layout::ReplicaPaths;
pub use queue::ReplicationQueue;
pub use session::CoordinatorSession;

/// This storage node as a replica: `--replica`, `--interserver-addr`, `--macro`.
#[derive(Debug, Clone, Default)]
pub struct ReplicaConfig {
    /// The replica's name; also the `{replica}` macro unless `macros` sets one.
    pub replica: Option<String>,
    /// Where other replicas reach this one, written to its `host` node.
    pub interserver_addr: Option<String>,
    pub macros: BTreeMap<String, String>,
    /// This server's identity, written to each of its replicas' `is_active`
    /// ([`activation::server_identity`]).
    pub identity: String,
}

impl ReplicaConfig {
    fn macros(&self) -> BTreeMap<String, String> {
        let mut macros = self.macros.clone();
        if let Some(replica) = &self.replica {
            macros.entry("replica".into()).or_insert_with(|| replica.clone());
        }
        macros
    }
}

/// The committer factory of a storage node with a coordinator.
pub struct ReplicatedCommitters {
    session: Arc<CoordinatorSession>,
    config: ReplicaConfig,
    runtime: tokio::runtime::Handle,
    local: LocalCommitters,
    /// The replication queue of each replicated table, by table name.
    queues: Mutex<BTreeMap<String, Arc<ReplicationQueue>>>,
    /// Each replicated table's claim on its replica, made with its committer and handed to
    /// its queue when the table opens (until then, here).
    activations: Mutex<BTreeMap<String, Arc<Activation>>>,
}

impl ReplicatedCommitters {
    pub fn new(
        session: Arc<CoordinatorSession>,
        config: ReplicaConfig,
        runtime: tokio::runtime::Handle,
    ) -> ReplicatedCommitters {
        let local = LocalCommitters { coordination: Some(session.clone()) };
        ReplicatedCommitters {
            session,
            config,
            runtime,
            local,
            queues: Mutex::new(BTreeMap::new()),
            activations: Mutex::new(BTreeMap::new()),
        }
    }

    /// The table's and this replica's paths, macros expanded.
    pub fn paths(&self, def: &TableDef) -> Result<Option<ReplicaPaths>> {
        let Some(args) = &def.replication else { return Ok(None) };
        let macros = self.config.macros();
        let table = macros::normalize_path(&macros::expand(&args.zookeeper_path, &macros, def)?)?;
        let replica = macros::expand(&args.replica_name, &macros, def)?;
        if replica.is_empty() || replica.contains('/') {
            return Err(EngineError::Replication {
                code: "BAD_ARGUMENTS",
                message: format!("Replica name must be non-empty and contain no '/', got '{replica}'"),
            });
        }
        Ok(Some(ReplicaPaths { table, replica }))
    }

    /// The replication queue of a replicated table.
    pub fn queue(&self, table: &str) -> Option<Arc<ReplicationQueue>> {
        self.queues.lock().unwrap_or_else(|p| p.into_inner()).get(table).cloned()
    }

    /// The `host` node's text for one of this node's replicas.
    fn host(&self, def: &TableDef) -> String {
        layout::host_text(self.config.interserver_addr.as_deref().unwrap_or(""), &def.name)
    }

    async fn keeper(&self) -> Result<coordinator_client::Keeper> {
        self.session.keeper().await.map_err(|e| EngineError::Coordinator(e.to_string()))
    }
}

impl CommitterFactory for ReplicatedCommitters {
    fn committer(&self, def: &TableDef, dir: &Path, found: FoundBlocks) -> Result<Arc<dyn PartCommitter>> {
        let Some(paths) = self.paths(def)? else { return self.local.committer(def, dir, found) };
        // The queue, started when the table opens, claims the replica at its first step; an
        // insert that comes first claims it itself.
        let activation = Arc::new(Activation::new(paths.clone(), self.config.identity.clone(), self.host(def)));
        self.activations.lock().unwrap_or_else(|p| p.into_inner()).insert(def.name.clone(), activation.clone());
        let window = def.deduplication_window();
        Ok(Arc::new(ReplicatedCommitter::new(self.session.clone(), paths, activation, window, self.runtime.clone())))
    }

    fn opened(&self, table: &Arc<Table>) {
        let paths = match self.paths(table.def()) {
            Ok(Some(paths)) => paths,
            Ok(None) => return,
            Err(e) => {
                warn!(table = table.name(), error = %e, "no replication for this table");
                return;
            }
        };
        // Handed over from the committer, so that both share one claim.
        let activation = self.activations.lock().unwrap_or_else(|p| p.into_inner()).remove(table.name());
        let activation = activation.unwrap_or_else(|| {
            Arc::new(Activation::new(paths.clone(), self.config.identity.clone(), self.host(table.def())))
        });
        let queue = ReplicationQueue::start(table, paths, activation, self.session.clone(), &self.runtime);
        self.queues.lock().unwrap_or_else(|p| p.into_inner()).insert(table.name().to_string(), queue);
    }

    fn register<'a>(&'a self, def: &'a TableDef) -> BoxFuture<'a, Result<()>> {
        Box::pin(async move {
            let Some(paths) = self.paths(def)? else { return Ok(()) };
            let k = self.keeper().await?;
            register::register_replica(&k, &paths, def, &self.host(def)).await
        })
    }

    fn unregister<'a>(&'a self, def: &'a TableDef) -> BoxFuture<'a, Result<()>> {
        Box::pin(async move {
            let Some(paths) = self.paths(def)? else { return Ok(()) };
            self.activations.lock().unwrap_or_else(|p| p.into_inner()).remove(&def.name);
            let k = self.keeper().await?;
            register::unregister_replica(&k, &paths).await
        })
    }

    fn replica(&self, table: &str) -> Option<Arc<dyn ReplicaControl>> {
        self.queue(table).map(|q| q as Arc<dyn ReplicaControl>)
    }

    fn coordinator_children<'a>(&'a self, path: &'a str) -> BoxFuture<'a, Result<Vec<CoordinatorNode>>> {
        Box::pin(async move {
            let k = self.session.keeper().await.map_err(|e| EngineError::Replication {
                code: "KEEPER_EXCEPTION",
                message: format!("no coordinator session: {e}"),
            })?;
            control::children_of(&k, path).await
        })
    }
}
