//! Every metric the replication records; gathered into the storage node's list
//! (server/src/metrics.rs).

mergestream_telemetry::catalogue! {
    /// Parts committed through the coordinator by this replica's inserts (duplicates not counted).
    Counter PARTS_COMMITTED = "mergestream_replication_parts_committed_total";
    /// Entries in a replicated table's queue (fetches and merges still to do), counted each
    /// time the queue runs.
    Gauge QUEUE_ENTRIES = "mergestream_replication_queue_entries" ["table"];
    /// Bytes of parts fetched from other replicas.
    Counter FETCHED_BYTES = "mergestream_replication_fetched_bytes_total";
    /// Merges this replica assigned in the replicated log.
    Counter MERGES_ASSIGNED = "mergestream_replication_merges_assigned_total";
    /// Old log entries removed by the cleanup.
    Counter LOG_ENTRIES_CLEANED = "mergestream_replication_log_entries_cleaned_total";
    /// Old deduplication blocks removed by the cleanup.
    Counter BLOCKS_CLEANED = "mergestream_replication_blocks_cleaned_total";
    /// Parts no replica has any more ("Part is lost forever").
    Counter PARTS_LOST = "mergestream_replication_parts_lost_total";
    /// Replicas cloned from another (new, or marked lost).
    Counter CLONES = "mergestream_replication_clones_total";
    /// Replicas marked lost because they fell behind the kept log.
    Counter REPLICAS_MARKED_LOST = "mergestream_replication_replicas_marked_lost_total";
    /// Replicas restored with SYSTEM RESTORE REPLICA.
    Counter REPLICAS_RESTORED = "mergestream_replication_replicas_restored_total";
    /// Local parts the coordinator does not know of, found at startup.
    Counter UNEXPECTED_PARTS = "mergestream_replication_unexpected_parts_total";
    /// Parts the coordinator lists that are missing here, found at startup.
    Counter MISSING_PARTS = "mergestream_replication_missing_parts_total";
}
