//! A replica joining a table (CREATE TABLE) and leaving it (DROP TABLE) in the coordinator.

use coordinator_client::{Keeper, KeeperError, NodeKind};
use mergestream_engine::{EngineError, Result, TableDef};
use tracing::info;

use crate::layout::{self, ReplicaPaths, TABLE_CHILDREN};

fn coordinator_error(e: KeeperError) -> EngineError {
    EngineError::Coordinator(e.to_string())
}

/// Creates the table's nodes if this is its first replica, checks the definition against
/// them otherwise, then creates this replica's nodes.
pub async fn register_replica(k: &Keeper, paths: &ReplicaPaths, def: &TableDef, host: &str) -> Result<()> {
    let metadata = layout::metadata_text(def);
    let columns = layout::columns_text(def);
    if let Some(parent) = paths.table.rsplit_once('/').map(|(p, _)| p).filter(|p| !p.is_empty()) {
        match k.ensure_path(parent).await {
            Ok(()) => {}
            Err(e) if e.is_node_exists() => {}
            Err(e) => return Err(coordinator_error(e)),
        }
    }
    let mut txn = k
        .txn()
        .create(&paths.table, b"", NodeKind::Persistent)
        .create(&paths.of_table("metadata"), metadata.as_bytes(), NodeKind::Persistent)
        .create(&paths.of_table("columns"), columns.as_bytes(), NodeKind::Persistent);
    for child in TABLE_CHILDREN {
        txn = txn.create(&paths.of_table(child), b"", NodeKind::Persistent);
    }
    match txn.commit().await {
        Ok(_) => info!(table = paths.table, "created the replicated table's nodes"),
        // Another replica made the table: this one must agree with it.
        Err(e) if e.is_node_exists() => check_definition(k, paths, def, &metadata, &columns).await?,
        Err(e) => return Err(coordinator_error(e)),
    }
    let replica = paths.replica_root();
    let mut txn = k.txn().create(&replica, b"", NodeKind::Persistent);
    for (child, data) in [
        ("host", host.as_bytes()),
        ("log_pointer", b"".as_slice()),
        ("queue", b""),
        ("parts", b""),
        ("flags", b""),
        ("is_lost", b"0"),
        ("metadata", metadata.as_bytes()),
        ("columns", columns.as_bytes()),
        ("metadata_version", b"0"),
        ("mutation_pointer", b""),
        ("min_unprocessed_insert_time", b"0"),
        ("max_processed_insert_time", b"0"),
    ] {
        txn = txn.create(&paths.of_replica(child), data, NodeKind::Persistent);
    }
    match txn.commit().await {
        Ok(_) => {
            info!(table = paths.table, replica = paths.replica, "registered the replica");
            Ok(())
        }
        Err(e) if e.is_node_exists() => Err(EngineError::Replication {
            code: "REPLICA_ALREADY_EXISTS",
            message: format!("Replica {replica} already exists"),
        }),
        Err(e) => Err(coordinator_error(e)),
    }
}

async fn check_definition(
    k: &Keeper,
    paths: &ReplicaPaths,
    def: &TableDef,
    metadata: &str,
    columns: &str,
) -> Result<()> {
    let read = |path: String| async move {
        match k.get(&path).await {
            Ok(Some(v)) => Ok(String::from_utf8_lossy(&v.data).into_owned()),
            Ok(None) => Err(EngineError::Replication {
                code: "METADATA_MISMATCH",
                message: format!("{path} is missing: the table's nodes in the coordinator are incomplete"),
            }),
            Err(e) => Err(coordinator_error(e)),
        }
    };
    let stored_metadata = read(paths.of_table("metadata")).await?;
    if stored_metadata != metadata {
        if let Some((field, stored, local)) = layout::metadata_difference(&stored_metadata, def) {
            return Err(EngineError::Replication {
                code: "METADATA_MISMATCH",
                message: format!(
                    "Existing table metadata in ZooKeeper differs in {field}. Stored in ZooKeeper: {stored}, local: {local}"
                ),
            });
        }
    }
    if read(paths.of_table("columns")).await? != columns {
        return Err(EngineError::Replication {
            code: "INCOMPATIBLE_COLUMNS",
            message: "Table columns structure in ZooKeeper is different from local table structure".into(),
        });
    }
    Ok(())
}

/// Removes this replica's nodes, and the table's when no replica is left.
pub async fn unregister_replica(k: &Keeper, paths: &ReplicaPaths) -> Result<()> {
    remove_recursive(k, &paths.replica_root()).await?;
    let remaining = match k.children(&paths.replicas()).await {
        Ok(children) => children,
        Err(e) if e.is_no_node() => Vec::new(),
        Err(e) => return Err(coordinator_error(e)),
    };
    if remaining.is_empty() {
        remove_recursive(k, &paths.table).await?;
        info!(table = paths.table, "removed the table's nodes: its last replica is gone");
    }
    Ok(())
}

/// Deletes a subtree, children first. Nodes already gone are fine.
async fn remove_recursive(k: &Keeper, root: &str) -> Result<()> {
    let mut stack = vec![(root.to_string(), false)];
    while let Some((path, expanded)) = stack.pop() {
        if expanded {
            match k.delete(&path, None).await {
                Ok(()) => {}
                Err(e) if e.is_no_node() => {}
                Err(e) => return Err(coordinator_error(e)),
            }
            continue;
        }
        let children = match k.children(&path).await {
            Ok(children) => children,
            Err(e) if e.is_no_node() => continue,
            Err(e) => return Err(coordinator_error(e)),
        };
        stack.push((path.clone(), true));
        stack.extend(children.into_iter().map(|c| (format!("{path}/{c}"), false)));
    }
    Ok(())
}
