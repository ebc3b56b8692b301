//! Every metric the ingestor exports (`ingestor run --metrics-addr`); the table in
//! docs/metrics.md is printed from this list by `ingestor metrics`.

mergestream_telemetry::catalogue! {
    /// Messages consumed from the source (Kafka or NATS).
    Counter MESSAGES = "mergestream_ingestor_messages_total";
    /// Bytes of message payloads consumed.
    Counter BYTES = "mergestream_ingestor_bytes_total";
    /// Messages that could not be decoded, by kind of failure.
    Counter DECODE_ERRORS = "mergestream_ingestor_decode_errors_total" ["kind"];
    /// Messages written to the dead-letter topic.
    Counter DEAD_LETTERED = "mergestream_ingestor_dead_lettered_total";
    /// Insert blocks committed, by table.
    Counter BLOCKS = "mergestream_ingestor_blocks_total" ["table"];
    /// Rows committed, by table.
    Counter ROWS = "mergestream_ingestor_rows_total" ["table"];
    /// Time of one block's insert, from the request to its commit (and quorum, if asked).
    Histogram INSERT_DURATION = "mergestream_ingestor_insert_duration_seconds";
    /// When the last block of a table was committed, as seconds since the epoch.
    Gauge LAST_COMMIT_TIMESTAMP = "mergestream_ingestor_last_commit_timestamp_seconds" ["table"];
    /// Messages in a partition after the last committed offset, by topic and partition.
    Gauge CONSUMER_LAG = "mergestream_ingestor_consumer_lag_messages" ["topic", "partition"];
    /// Partitions this instance owns now.
    Gauge OWNED_PARTITIONS = "mergestream_ingestor_owned_partitions";
    /// Partitions stopped by a message they cannot get past (see the logs).
    Gauge STOPPED_PARTITIONS = "mergestream_ingestor_stopped_partitions";
    /// Times a partition was stopped.
    Counter PARTITIONS_STOPPED = "mergestream_ingestor_stopped_partitions_total";
    /// Inserts retried after a transient failure.
    Counter INSERT_RETRIES = "mergestream_ingestor_insert_retries_total";
    /// Switches to another storage node after one failed.
    Counter STORAGE_FAILOVERS = "mergestream_ingestor_storage_failovers_total";
    /// Inserts whose quorum had to be awaited separately after an unknown outcome.
    Counter QUORUM_WAITS = "mergestream_ingestor_quorum_waits_total";
}
