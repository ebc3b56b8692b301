//! Every metric the engine records. The storage node's own list (server/src/metrics.rs)
//! gathers this one with the replication's and its own.

mergestream_telemetry::catalogue! {
    /// Tables whose directory could not be opened at startup (skipped, their files kept).
    Gauge UNOPENED_TABLES = "mergestream_engine_unopened_tables";
    /// Parts committed by inserts.
    Counter PARTS_INSERTED = "mergestream_engine_parts_inserted_total";
    /// Prepared inserts found on disk at startup that could not be read back.
    Counter UNREADABLE_PREPARED_INSERTS = "mergestream_engine_unreadable_prepared_inserts_total";
    /// Inserts slowed down because a partition had more than `parts_to_delay_insert` parts.
    Counter DELAYED_INSERTS = "mergestream_engine_delayed_inserts_total";
    /// Parts added from another replica.
    Counter PARTS_FETCHED = "mergestream_engine_parts_fetched_total";
    /// Merges finished.
    Counter MERGES = "mergestream_engine_merges_total";
    /// Rows read by finished merges (their source parts' rows).
    Counter MERGED_ROWS = "mergestream_engine_merged_rows_total";
    /// Bytes read by finished merges (their source parts' size on disk).
    Counter MERGED_BYTES = "mergestream_engine_merged_bytes_total";
    /// Time of one merge, from reading its sources to the new part being active.
    Histogram MERGE_DURATION = "mergestream_engine_merge_duration_seconds";
    /// Active parts of a table (published every few seconds).
    Gauge ACTIVE_PARTS = "mergestream_engine_active_parts" ["table"];
    /// Active parts of a table's fullest partition: inserts slow down at
    /// `parts_to_delay_insert` and fail at `parts_to_throw_insert`.
    Gauge MAX_PARTS_IN_PARTITION = "mergestream_engine_max_parts_in_partition" ["table"];
    /// Rows in a table's active parts.
    Gauge ACTIVE_ROWS = "mergestream_engine_active_rows" ["table"];
    /// Bytes on disk of a table's active parts.
    Gauge ACTIVE_BYTES = "mergestream_engine_active_bytes" ["table"];
}
