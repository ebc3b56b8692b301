//! Every metric the storage node exports (`storage-node serve --metrics-addr`): its own
//! below, and the engine's and the replication's, which record theirs where they work. The
//! table in docs/metrics.md is printed from this list by `storage-node metrics`.

/// The engine's, the replication's and the server's metrics.
pub const CATALOGUES: &[&[mergestream_telemetry::Metric]] =
    &[ALL, mergestream_engine::metrics::ALL, mergestream_replication::metrics::ALL];

mergestream_telemetry::catalogue! {
    /// Insert requests of the Ingest service answered.
    Counter INSERTS = "mergestream_storage_inserts_total";
    /// Time of one insert request of the Ingest service (the part written and committed).
    Histogram INSERT_DURATION = "mergestream_storage_insert_duration_seconds";
    /// Rows inserted through the Ingest service.
    Counter ROWS_INSERTED = "mergestream_storage_rows_inserted_total";
    /// Prepared blocks (the ingestor's exactly-once inserts) committed with their offsets.
    Counter BLOCKS_COMMITTED = "mergestream_storage_blocks_committed_total";
    /// Prepared blocks refused: their offsets were no longer the expected ones.
    Counter BLOCKS_REFUSED = "mergestream_storage_blocks_refused_total";
    /// Prepared blocks found already committed (a retry), answered as the first time.
    Counter BLOCKS_DUPLICATE = "mergestream_storage_blocks_duplicate_total";
    /// Prepared inserts left unresolved at startup (waiting for their ingestor).
    Gauge UNRESOLVED_PREPARED_INSERTS = "mergestream_storage_unresolved_prepared_inserts";
    /// Offset records in the coordinator that could not be decoded.
    Counter CORRUPT_OFFSET_RECORDS = "mergestream_storage_corrupt_offset_records_total";
    /// Queries answered, by outcome (`ok`, `error`).
    Counter QUERIES = "mergestream_storage_queries_total" ["outcome"];
    /// Time of one query request, from its arrival to its reply.
    Histogram QUERY_DURATION = "mergestream_storage_query_duration_seconds";
    /// Flight SQL statements, by kind (`query`: rows streamed by DoGet; `update`: a statement
    /// run for its effect; `ingest`: bulk ingest) and outcome (`ok`, `error`, `cancelled`: the
    /// client went away mid-stream; `refused`: past `max_concurrent_queries`).
    Counter FLIGHT_STATEMENTS = "mergestream_storage_flight_statements_total" ["kind", "outcome"];
    /// Time of one Flight SQL statement: to its last batch for a query, to its reply otherwise.
    Histogram FLIGHT_STATEMENT_DURATION = "mergestream_storage_flight_statement_duration_seconds" ["kind"];
    /// Flight SQL statements running now.
    Gauge FLIGHT_STATEMENTS_IN_FLIGHT = "mergestream_storage_flight_statements_in_flight";
    /// Rows of query results Flight SQL streamed.
    Counter FLIGHT_ROWS_STREAMED = "mergestream_storage_flight_rows_streamed_total";
    /// Bytes of Arrow IPC (headers and bodies) Flight SQL streamed, metadata replies included.
    Counter FLIGHT_BYTES_STREAMED = "mergestream_storage_flight_bytes_streamed_total";
    /// Parts sent to other replicas.
    Counter PARTS_SENT = "mergestream_storage_parts_sent_total";
    /// Request handlers that panicked (answered INTERNAL; the node keeps serving).
    Counter HANDLER_PANICS = "mergestream_storage_handler_panics_total";
    /// Arrow IPC blocks whose decoding panicked (refused as bad input).
    Counter IPC_DECODER_PANICS = "mergestream_storage_ipc_decoder_panics_total";
}
