//! The client helpers against a real coordinator process (the binary `scripts/test` builds)
//! and, with the same scenarios, against Apache ZooKeeper 3.8, which must be able to stand in
//! for the coordinator.

use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use coordinator_client::{EphemeralLock, Keeper, KeeperError, NodeKind, SequentialLog, TxnResult};
use std::io::{Read, Write};

struct Server {
    child: Child,
    hosts: String,
    _dir: tempfile::TempDir,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn coordinator_bin() -> PathBuf {
    std::env::var_os("MERGESTREAM_COORDINATOR_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target/debug/coordinator"))
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map(|a| a.port()).expect("a free loopback port")
}

/// A four-letter word's answer, or "" when the server is not answering yet. A server that is
/// still starting can accept the connection and say nothing, so the read has a deadline.
fn four_letter(hosts: &str, word: &str) -> String {
    let Ok(addr) = hosts.parse() else { return String::new() };
    let Ok(mut s) = TcpStream::connect_timeout(&addr, Duration::from_secs(1)) else { return String::new() };
    let mut answer = String::new();
    let io_deadline = Some(Duration::from_secs(2));
    if s.set_read_timeout(io_deadline).is_err() || s.set_write_timeout(io_deadline).is_err() {
        return answer;
    }
    if s.write_all(word.as_bytes()).is_err() || s.read_to_string(&mut answer).is_err() {
        answer.clear();
    }
    answer
}

impl Server {
    fn coordinator() -> Server {
        let bin = coordinator_bin();
        assert!(bin.exists(), "{} is missing: build it with `cargo build --bin coordinator`", bin.display());
        let dir = tempfile::tempdir().expect("a temporary directory");
        let hosts = format!("127.0.0.1:{}", free_port());
        let child = Command::new(bin)
            .args(["serve", "--node-id", "1", "--client-addr", &hosts, "--tick-ms", "250"])
            .arg("--raft-addr")
            .arg(format!("127.0.0.1:{}", free_port()))
            .arg("--data-dir")
            .arg(dir.path())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("the coordinator starts");
        Server { child, hosts, _dir: dir }.ready("imok", "ruok")
    }

    /// A standalone ZooKeeper from Debian's package (`scripts/install-zookeeper`).
    fn zookeeper() -> Server {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let port = free_port();
        let cfg = dir.path().join("zoo.cfg");
        std::fs::write(
            &cfg,
            format!(
                "tickTime=250\ndataDir={}\nclientPort={port}\nclientPortAddress=127.0.0.1\n\
                 admin.enableServer=false\n4lw.commands.whitelist=*\n",
                dir.path().display()
            ),
        )
        .expect("zoo.cfg");
        let child = Command::new("java")
            .args(["-Xmx256m", "-cp", "/usr/share/java/*:/etc/zookeeper/conf"])
            .arg("org.apache.zookeeper.server.quorum.QuorumPeerMain")
            .arg(&cfg)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("java runs ZooKeeper (scripts/install-zookeeper installs it)");
        Server { child, hosts: format!("127.0.0.1:{port}"), _dir: dir }.ready("Mode:", "srvr")
    }

    fn ready(self, expect: &str, word: &str) -> Server {
        let deadline = Instant::now() + Duration::from_secs(60);
        while !four_letter(&self.hosts, word).contains(expect) {
            assert!(Instant::now() < deadline, "the server at {} did not come up", self.hosts);
            std::thread::sleep(Duration::from_millis(50));
        }
        self
    }
}

/// The client crate's own log (connects, reconnects, session state) in the output of a failing test.
fn log_to_test_output() {
    let _ = tracing_subscriber::fmt()
        .with_test_writer()
        .with_env_filter(tracing_subscriber::EnvFilter::new("zookeeper_client=debug,coordinator_client=debug"))
        .try_init();
}

/// Runs a scenario against the coordinator and against ZooKeeper, as two tests.
macro_rules! against_both {
    ($($scenario:ident),* $(,)?) => {$(
        mod $scenario {
            #[tokio::test]
            async fn coordinator() {
                super::log_to_test_output();
                super::$scenario(&super::Server::coordinator()).await
            }

            #[tokio::test]
            async fn zookeeper() {
                super::log_to_test_output();
                super::$scenario(&super::Server::zookeeper()).await
            }
        }
    )*};
}

against_both!(
    transactions_apply_all_or_nothing_and_name_the_failing_operation,
    an_ephemeral_lock_has_one_holder_and_passes_on_when_its_session_ends,
    a_sequential_log_orders_appends_and_wakes_readers,
    waiting_for_a_change_sees_the_write_of_another_session,
);

async fn keeper(server: &Server) -> Keeper {
    Keeper::connect(&server.hosts, Duration::from_secs(2)).await.expect("a session")
}

async fn transactions_apply_all_or_nothing_and_name_the_failing_operation(server: &Server) {
    let k = keeper(server).await;
    k.ensure_path("/t/offsets").await.expect("mkdir");
    k.create("/t/offsets/0", b"100", NodeKind::Persistent).await.expect("create");
    let offset = k.get("/t/offsets/0").await.expect("get").expect("present");
    assert_eq!((offset.data.as_slice(), offset.version), (&b"100"[..], 0));

    // The commit of a part with its offset, guarded by the offset node's version.
    let results = k
        .txn()
        .check("/t/offsets", 0)
        .create("/t/blocks", b"", NodeKind::Persistent)
        .create("/t/blocks/b-100-199", b"part", NodeKind::Persistent)
        .set("/t/offsets/0", b"200", Some(offset.version))
        .commit()
        .await
        .expect("the transaction commits");
    assert_eq!(
        results,
        vec![
            TxnResult::Checked,
            TxnResult::Created { path: "/t/blocks".into() },
            TxnResult::Created { path: "/t/blocks/b-100-199".into() },
            TxnResult::Set { version: 1 },
        ]
    );

    // A zombie still holding version 0 is refused, and its block id does not appear.
    let err = k
        .txn()
        .create("/t/blocks/b-100-150", b"zombie", NodeKind::Persistent)
        .set("/t/offsets/0", b"151", Some(0))
        .commit()
        .await
        .expect_err("the stale version is refused");
    assert!(err.is_bad_version(), "{err}");
    assert!(matches!(&err, KeeperError::Txn { index: 1, op: "set", path, .. } if path == "/t/offsets/0"), "{err}");
    assert_eq!(k.get("/t/blocks/b-100-150").await.expect("get"), None);
    assert_eq!(k.get("/t/offsets/0").await.expect("get").expect("present").data, b"200");

    let err = k.set("/t/offsets/0", b"x", Some(0)).await.expect_err("compare-and-set on a stale version");
    assert!(err.is_bad_version() && err.to_string().contains("/t/offsets/0"), "{err}");
}

async fn an_ephemeral_lock_has_one_holder_and_passes_on_when_its_session_ends(server: &Server) {
    let (a, b) = (keeper(server).await, keeper(server).await);
    let path = "/locks/topic/partition-3";
    let held = EphemeralLock::try_acquire(&a, path, b"ingestor-a").await.expect("lock").expect("free lock");
    assert_eq!(EphemeralLock::try_acquire(&b, path, b"ingestor-b").await.expect("lock"), None);
    // Taking it again in the same session is not a conflict.
    assert!(EphemeralLock::try_acquire(&a, path, b"ingestor-a").await.expect("lock").is_some());
    let holder = EphemeralLock::holder(&b, path).await.expect("holder").expect("held");
    assert_eq!((holder.session_id, holder.owner.as_slice()), (a.session_id(), &b"ingestor-a"[..]));

    held.release(&a).await.expect("release");
    let again = EphemeralLock::try_acquire(&b, path, b"ingestor-b").await.expect("lock").expect("released lock");
    assert_eq!(again.path(), path);

    // The holder's session ends without a release: the waiter gets the lock.
    let waiter = tokio::spawn({
        let a = a.clone();
        async move { EphemeralLock::wait_released(&a, path).await }
    });
    drop(b);
    drop(again);
    tokio::time::timeout(Duration::from_secs(10), waiter)
        .await
        .expect("released in time")
        .expect("join")
        .expect("watch");
    assert!(EphemeralLock::try_acquire(&a, path, b"ingestor-a").await.expect("lock").is_some());
}

async fn a_sequential_log_orders_appends_and_wakes_readers(server: &Server) {
    let (writer, reader) = (keeper(server).await, keeper(server).await);
    let log = SequentialLog::new("/table/log", "log-");
    log.ensure(&writer).await.expect("mkdir");
    writer.create("/table/log/not-an-entry", b"", NodeKind::Persistent).await.expect("create");

    // The stray child took sequence 0: sequence numbers count every child the parent got.
    assert_eq!(log.append(&writer, b"first").await.expect("append"), 1);
    assert_eq!(log.append(&writer, b"second").await.expect("append"), 2);
    let results = log
        .append_in(writer.txn().create("/table/block-abc", b"", NodeKind::Persistent), b"third")
        .commit()
        .await
        .expect("entry and block id together");
    let TxnResult::Created { path } = &results[1] else { panic!("{results:?}") };
    assert_eq!(log.sequence_of(path).expect("a sequence"), 3);

    let entries = log.read_from(&reader, 2).await.expect("read");
    assert_eq!(
        entries.iter().map(|e| (e.sequence, e.data.as_slice())).collect::<Vec<_>>(),
        [(2, &b"second"[..]), (3, &b"third"[..])]
    );

    let waiting = tokio::spawn({
        let (log, reader) = (log.clone(), reader.clone());
        async move { log.wait_from(&reader, 4).await }
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(log.append(&writer, b"fourth").await.expect("append"), 4);
    let woke =
        tokio::time::timeout(Duration::from_secs(10), waiting).await.expect("woken").expect("join").expect("read");
    assert_eq!(woke.iter().map(|e| e.sequence).collect::<Vec<_>>(), [4]);

    assert_eq!(log.trim_before(&writer, 3).await.expect("trim"), 2);
    let left = log.read_from(&reader, 0).await.expect("read");
    assert_eq!(left.iter().map(|e| e.sequence).collect::<Vec<_>>(), [3, 4]);
    assert!(writer.get("/table/log/not-an-entry").await.expect("get").is_some());
}

async fn waiting_for_a_change_sees_the_write_of_another_session(server: &Server) {
    let (watcher, writer) = (keeper(server).await, keeper(server).await);
    let waiting = tokio::spawn({
        let watcher = watcher.clone();
        async move { watcher.wait_for_change("/leader").await }
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    writer.create("/leader", b"node-2", NodeKind::Ephemeral).await.expect("create");
    let (before, event) =
        tokio::time::timeout(Duration::from_secs(10), waiting).await.expect("woken").expect("join").expect("watch");
    assert_eq!(before, None);
    assert_eq!((event.event_type, event.path.as_str()), (coordinator_client::zk::EventType::NodeCreated, "/leader"));
    writer.sync("/").await.expect("sync");
    let err = writer.create("/leader/child", b"", NodeKind::Persistent).await.expect_err("ephemerals have no children");
    assert!(matches!(err.code(), Some(coordinator_client::zk::Error::NoChildrenForEphemerals)), "{err}");
}
