//! The check of a replica's local parts against what the coordinator says it has, when its
//! replication starts (ClickHouse's `checkParts` at attach):
//!
//! - an active part that `replicas/<name>/parts` does not list, that no entry of the queue
//!   will list, and that no listed part covers is unexpected: it goes to
//!   `detached/unexpected_<name>`, where it stays for a person to look at;
//! - a listed part that is not here (nor a part covering it, nor one an insert is making
//!   active) is missing: its node goes and a `GET_PART` of it is queued, in one multi, so
//!   that it is fetched from a replica that has it.
//!
//! A crash between an insert's commit and its activation leaves a listed part in a prepared
//! insert: the server resolves those before replication starts, so they are here by now.

use coordinator_client::{Keeper, KeeperError, NodeKind};
use mergestream_engine::part::name::PartName;
use mergestream_engine::{EngineError, Result, Table};
use tracing::warn;

use crate::layout::{get_part_entry_named, ReplicaPaths};
use crate::queue::LogEntry;

/// What the check found and did.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Checked {
    pub unexpected: Vec<String>,
    pub missing: Vec<String>,
}

pub async fn check_parts(k: &Keeper, paths: &ReplicaPaths, table: &Table) -> Result<Checked> {
    let keeper_error = |e: KeeperError| EngineError::Coordinator(e.to_string());
    // The order matters: the parts here first, then the queue, then the listing. A part
    // fetched or merged meanwhile is listed in the same multi that removes its entry, so it
    // is seen in one or the other.
    let here = table.snapshot();
    let queue_dir = paths.of_replica("queue");
    let mut will_list: Vec<PartName> = Vec::new();
    for entry in k.children(&queue_dir).await.map_err(keeper_error)? {
        let Some(node) = k.get(&format!("{queue_dir}/{entry}")).await.map_err(keeper_error)? else { continue };
        if let Some(name) =
            LogEntry::parse(&String::from_utf8_lossy(&node.data)).and_then(|e| PartName::parse(&e.new_part_name))
        {
            will_list.push(name);
        }
    }
    let listed_names = k.children(&paths.of_replica("parts")).await.map_err(keeper_error)?;
    let listed: Vec<PartName> = listed_names.iter().filter_map(|p| PartName::parse(p)).collect();
    let expected = |name: &PartName| listed.iter().chain(&will_list).any(|known| known == name || known.covers(name));
    let mut checked = Checked::default();
    for part in &here {
        if !expected(&part.name) && table.detach_part(&part.name, "unexpected")? {
            warn!(table = paths.table, part = %part.name, "a local part the coordinator does not know: detached");
            checked.unexpected.push(part.name.to_string());
        }
    }
    let mut txn = k.txn();
    for name in &listed {
        if table.has_part_or_covering(name)
            || table.is_being_inserted(name)
            || will_list.iter().any(|w| w == name || w.covers(name))
        {
            continue;
        }
        let part = name.to_string();
        warn!(table = paths.table, part, "a part the coordinator lists is not here: fetching it");
        let entry = get_part_entry_named("", &part, "");
        txn = txn.delete(&paths.part(&part), None).create(
            &paths.of_replica("queue/queue-"),
            entry.as_bytes(),
            NodeKind::PersistentSequential,
        );
        checked.missing.push(part);
    }
    if !txn.is_empty() {
        txn.commit().await.map_err(keeper_error)?;
    }
    if !checked.unexpected.is_empty() || !checked.missing.is_empty() {
        metrics::counter!(crate::metrics::UNEXPECTED_PARTS).increment(checked.unexpected.len() as u64);
        metrics::counter!(crate::metrics::MISSING_PARTS).increment(checked.missing.len() as u64);
    }
    Ok(checked)
}
