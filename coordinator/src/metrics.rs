//! Every metric the coordinator exports (`coordinator serve --metrics-addr`); the table in
//! docs/metrics.md is printed from this list by `coordinator metrics`.

mergestream_telemetry::catalogue! {
    /// Client connections open now.
    Gauge CONNECTIONS = "mergestream_coordinator_connections";
    /// Connections closed because the client stopped reading its replies.
    Counter CONNECTIONS_CLOSED_UNREAD = "mergestream_coordinator_connections_closed_unread_total";
    /// Connections closed because they sent no handshake in time.
    Counter HANDSHAKE_TIMEOUTS = "mergestream_coordinator_handshake_timeouts_total";
    /// Client requests, by ZooKeeper operation.
    Counter REQUESTS = "mergestream_coordinator_requests_total" ["op"];
    /// Time from a request's arrival to its reply, by ZooKeeper operation.
    Histogram REQUEST_DURATION = "mergestream_coordinator_request_duration_seconds" ["op"];
    /// Requests answered with an error, by ZooKeeper error code.
    Counter ERRORS = "mergestream_coordinator_errors_total" ["code"];
    /// Sessions created.
    Counter SESSIONS_CREATED = "mergestream_coordinator_sessions_created_total";
    /// Sessions expired by their timeout.
    Counter SESSIONS_EXPIRED = "mergestream_coordinator_sessions_expired_total";
    /// Sessions alive now.
    Gauge SESSIONS = "mergestream_coordinator_sessions";
    /// Nodes in the tree.
    Gauge ZNODES = "mergestream_coordinator_znodes";
    /// Ephemeral nodes in the tree.
    Gauge EPHEMERALS = "mergestream_coordinator_ephemerals";
    /// Watches set.
    Gauge WATCHES = "mergestream_coordinator_watches";
    /// Time to commit one log entry through a quorum (the group commit of every write waiting
    /// at this node), from proposal to applied.
    Histogram COMMIT_DURATION = "mergestream_coordinator_commit_duration_seconds";
    /// Client commands carried by one log entry (the group commit's batch).
    Histogram COMMANDS_PER_ENTRY = "mergestream_coordinator_raft_commands_per_entry";
    /// Log entries made durable by one fsync.
    Histogram APPENDS_PER_SYNC = "mergestream_coordinator_raft_appends_per_sync";
    /// The Raft term this node is in.
    Gauge RAFT_TERM = "mergestream_coordinator_raft_term";
    /// 1 on the leader, 0 elsewhere.
    Gauge RAFT_IS_LEADER = "mergestream_coordinator_raft_is_leader";
    /// The index of the last entry in this node's log.
    Gauge RAFT_LAST_LOG_INDEX = "mergestream_coordinator_raft_last_log_index";
    /// The index of the last entry committed by a quorum.
    Gauge RAFT_COMMITTED_INDEX = "mergestream_coordinator_raft_committed_index";
    /// The index of the last entry applied to this node's tree.
    Gauge RAFT_APPLIED_INDEX = "mergestream_coordinator_raft_applied_index";
    /// The index the latest snapshot covers.
    Gauge RAFT_SNAPSHOT_INDEX = "mergestream_coordinator_raft_snapshot_index";
    /// Peer connections refused (bad authentication or an unknown peer).
    Counter PEER_CONNECTIONS_REFUSED = "mergestream_coordinator_peer_connections_refused_total";
    /// Messages to peers dropped (the peer was unreachable or too slow).
    Counter PEER_MESSAGES_DROPPED = "mergestream_coordinator_peer_messages_dropped_total";
}
