//! The storage node's offset guard, against real coordinator and storage node processes (the
//! binaries `scripts/test` builds): a block commits with its offset only from the writer that
//! holds the offset node's current version; a zombie is refused and a retry adds nothing.

use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use arrow::array::{ArrayRef, RecordBatch, StringArray, UInt64Array};
use mergestream_ingestor::ownership::{Ownership, BEGINNING};
use mergestream_ingestor::sink::{Committed, StorageNode};
use mergestream_proto::ingest::ingest_client::IngestClient;
use mergestream_proto::ingest::{OffsetCommit, QueryRequest};

/// A child process and the directory it works in (removed when the test ends).
struct Process(Child, #[allow(dead_code)] tempfile::TempDir);

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn binary(var: &str, name: &str) -> PathBuf {
    std::env::var_os(var)
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/debug").join(name))
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map(|a| a.port()).expect("a free port")
}

fn wait_listening(port: u16) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "nothing listens on {port}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn start(bin: PathBuf, args: impl FnOnce(&std::path::Path) -> Vec<String>, port: u16) -> Process {
    assert!(bin.exists(), "{} is missing: run `cargo build --bin storage-node --bin coordinator`", bin.display());
    let dir = tempfile::tempdir().expect("a temporary directory");
    let child = Command::new(bin)
        .args(args(dir.path()))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("the process starts");
    wait_listening(port);
    Process(child, dir)
}

fn block(ids: std::ops::Range<u64>) -> RecordBatch {
    let id: ArrayRef = Arc::new(UInt64Array::from_iter_values(ids.clone()));
    let who: ArrayRef = Arc::new(StringArray::from_iter_values(ids.map(|i| format!("w{i}"))));
    RecordBatch::try_from_iter([("id", id), ("who", who)]).expect("block")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_holder_of_the_offset_version_commits() {
    let zk_port = free_port();
    let _coordinator = start(
        binary("MERGESTREAM_COORDINATOR_BIN", "coordinator"),
        |dir| {
            vec![
                "serve".into(),
                "--node-id".into(),
                "1".into(),
                "--client-addr".into(),
                format!("127.0.0.1:{zk_port}"),
                "--raft-addr".into(),
                format!("127.0.0.1:{}", free_port()),
                "--data-dir".into(),
                dir.display().to_string(),
                "--tick-ms".into(),
                "250".into(),
            ]
        },
        zk_port,
    );
    let hosts = format!("127.0.0.1:{zk_port}");
    let grpc_port = free_port();
    let _storage = start(
        binary("MERGESTREAM_BIN", "storage-node"),
        |dir| {
            vec![
                "serve".into(),
                "--path".into(),
                dir.display().to_string(),
                "--grpc-addr".into(),
                format!("127.0.0.1:{grpc_port}"),
                "--coordinator".into(),
                hosts.clone(),
            ]
        },
        grpc_port,
    );
    let addr = format!("127.0.0.1:{grpc_port}");
    let storage = StorageNode::connect(std::slice::from_ref(&addr), &Default::default(), Duration::from_secs(30))
        .await
        .expect("storage node");
    storage
        .create_table("t", "CREATE TABLE t (id UInt64, who String) ENGINE = MergeTree ORDER BY id")
        .await
        .expect("table");
    let owner = Ownership::connect(&hosts, Duration::from_secs(4), &Default::default(), "guard", "test")
        .await
        .expect("coordinator");
    let position = owner.position("t", "topic", 0).await.expect("offset node");
    assert_eq!((position.next, position.version), (BEGINNING, 0));
    let path = owner.offset_path("t", "topic", 0);
    let commit = |version, next| OffsetCommit { path: path.clone(), expected_version: version, next_position: next };

    // The owner commits offsets 0..=99.
    let outcome = storage.insert_committing("t", &block(0..100), "guard:t:topic:0:0-99", commit(0, 100)).await;
    assert!(matches!(outcome, Ok(Committed::Done { version: 1 })), "the owner commits");
    let moved = owner.position("t", "topic", 0).await.expect("offset node");
    assert_eq!((moved.next, moved.version), (100, 1));

    // A zombie that read version 0 and consumed a different range is refused.
    let zombie = storage.insert_committing("t", &block(0..50), "guard:t:topic:0:0-49", commit(0, 50)).await;
    assert!(
        matches!(&zombie, Ok(Committed::Refused(why)) if why.contains("not at version 0")),
        "the zombie is refused"
    );

    // The owner's retry of its committed block (its reply was lost) adds nothing.
    let retry = storage.insert_committing("t", &block(0..100), "guard:t:topic:0:0-99", commit(0, 100)).await;
    assert!(matches!(retry, Ok(Committed::Done { version: 1 })), "a retry finds its block committed");

    let mut client = IngestClient::connect(format!("http://{addr}")).await.expect("client");
    let query = QueryRequest { sql: "SELECT count(), sum(id) FROM t".into(), format: "TSV".into() };
    let output = client.query(query).await.expect("query").into_inner().output;
    assert_eq!(output, "100\t4950\n");
    assert_eq!(owner.position("t", "topic", 0).await.expect("offset node").version, 1);
}
