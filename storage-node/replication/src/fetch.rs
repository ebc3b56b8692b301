//! Fetching a part from another replica over the interserver service.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use mergestream_engine::part::meta::{ChecksummedFile, FileChecksum};
use mergestream_engine::part::name::PartName;
use mergestream_engine::{EngineError, Result, Table};
use mergestream_proto::interserver::interserver_client::InterserverClient;
use mergestream_proto::interserver::{FetchPartRequest, PartChunk};

/// Where a replica serves its parts, from its `host` node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplicaAddress {
    pub host: String,
    pub port: String,
    pub table: String,
}

impl ReplicaAddress {
    pub fn parse(text: &str) -> Option<ReplicaAddress> {
        let field = |name: &str| {
            text.lines().find_map(|l| l.strip_prefix(name).and_then(|v| v.strip_prefix(": "))).map(str::to_string)
        };
        let address = ReplicaAddress { host: field("host")?, port: field("port")?, table: field("table")? };
        (!address.host.is_empty() && !address.port.is_empty()).then_some(address)
    }
}

/// What a part's node holds: its rows and its files' sizes and CRCs.
#[derive(Debug, Clone, serde::Deserialize)]
pub struct PartHeader {
    pub rows: u64,
    pub files: BTreeMap<String, FileChecksum>,
}

fn fetch_error(message: String) -> EngineError {
    EngineError::Replication { code: "FETCH_ERROR", message }
}

/// A file name a replica may send: one plain name, nothing that leaves the part directory.
fn safe_file_name(name: &str) -> bool {
    !name.is_empty() && name != "." && name != ".." && !name.contains(['/', '\\', '\0'])
}

/// Fetches `name` from the replica at `address` and makes it active in `table`, once its
/// files match `expected`. A damaged or truncated fetch is refused and leaves nothing behind.
/// A fetch whose source sends nothing for this long is given up (and retried, from another
/// replica when there is one), rather than holding the queue that waits on it.
const FETCH_IDLE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(15);

pub async fn fetch_part(
    table: &Arc<Table>,
    address: &ReplicaAddress,
    name: &PartName,
    expected: &PartHeader,
) -> Result<u64> {
    let url = format!("http://{}:{}", address.host, address.port);
    let stalled = |what: &str| fetch_error(format!("{what} of {name} from {url}: nothing for {FETCH_IDLE_TIMEOUT:?}"));
    let channel = match channels::get(&url) {
        Some(channel) => channel,
        None => {
            let endpoint = tonic::transport::Endpoint::from_shared(url.clone())
                .map_err(|e| fetch_error(format!("the replica's address {url} is not a URL: {e}")))?;
            let channel = tokio::time::timeout(FETCH_IDLE_TIMEOUT, endpoint.connect())
                .await
                .map_err(|_| stalled("the connection"))?
                .map_err(|e| fetch_error(format!("cannot connect to the replica at {url}: {e}")))?;
            channels::put(&url, channel.clone());
            channel
        }
    };
    let fetched = fetch_over(table, channel, address, name, expected, &url).await;
    if fetched.is_err() {
        // The next fetch from there connects again rather than reuse a broken connection.
        channels::forget(&url);
    }
    fetched
}

async fn fetch_over(
    table: &Arc<Table>,
    channel: tonic::transport::Channel,
    address: &ReplicaAddress,
    name: &PartName,
    expected: &PartHeader,
    url: &str,
) -> Result<u64> {
    let stalled = |what: &str| fetch_error(format!("{what} of {name} from {url}: nothing for {FETCH_IDLE_TIMEOUT:?}"));
    let mut client = InterserverClient::new(channel).max_decoding_message_size(64 << 20);
    let request = FetchPartRequest { table: address.table.clone(), part_name: name.to_string() };
    let mut stream = tokio::time::timeout(FETCH_IDLE_TIMEOUT, client.fetch_part(request))
        .await
        .map_err(|_| stalled("the request"))?
        .map_err(|s| fetch_error(format!("the replica at {url} refused the fetch of {name}: {}", s.message())))?
        .into_inner();
    let t = table.clone();
    let part = name.clone();
    let dir = blocking(move || t.fetch_dir(&part)).await?;
    // The files are written (and checksummed) on a blocking thread, fed chunk by chunk: the
    // writes and fsyncs stay off the runtime that runs the queue and the coordinator session.
    let (chunks, mut to_write) = tokio::sync::mpsc::channel::<PartChunk>(8);
    let target = dir.clone();
    let writer = tokio::task::spawn_blocking(move || write_files(&target, &mut to_write));
    let streamed = async {
        while let Some(chunk) = tokio::time::timeout(FETCH_IDLE_TIMEOUT, stream.message())
            .await
            .map_err(|_| stalled("the stream"))?
            .map_err(|s| fetch_error(format!("the fetch of {name} broke off: {}", s.message())))?
        {
            if chunks.send(chunk).await.is_err() {
                break; // The writer stopped: its error says why.
            }
        }
        Ok(())
    }
    .await;
    drop(chunks);
    let written = writer.await.map_err(|e| EngineError::TaskFailed(e.to_string())).and_then(|w| w);
    let (bytes, received) = match (streamed, written) {
        (Ok(()), Ok(written)) => written,
        (Err(e), _) | (Ok(()), Err(e)) => {
            remove(&dir);
            return Err(e);
        }
    };
    let t = table.clone();
    let part = name.clone();
    let files = expected.files.clone();
    let fetched = dir.clone();
    blocking(move || t.add_fetched(&fetched, &part, &files, &received)).await?;
    metrics::counter!(crate::metrics::FETCHED_BYTES).increment(bytes);
    Ok(bytes)
}

/// Writes the chunks of a fetch into `dir`, a file after another; the bytes written and each
/// file's size and CRC.
fn write_files(
    dir: &Path,
    chunks: &mut tokio::sync::mpsc::Receiver<PartChunk>,
) -> Result<(u64, BTreeMap<String, FileChecksum>)> {
    let mut received = BTreeMap::new();
    let mut current: Option<(String, ChecksummedFile)> = None;
    let mut bytes = 0u64;
    while let Some(chunk) = chunks.blocking_recv() {
        if current.as_ref().is_none_or(|(file, _)| *file != chunk.file) {
            if !safe_file_name(&chunk.file) {
                return Err(fetch_error(format!("the replica sent a file named {:?}", chunk.file)));
            }
            if let Some((file, written)) = current.take() {
                received.insert(file, written.finish()?);
            }
            current = Some((chunk.file.clone(), ChecksummedFile::create(&dir.join(&chunk.file))?));
        }
        if let Some((_, file)) = current.as_mut() {
            file.write(&chunk.data)?;
        }
        bytes += chunk.data.len() as u64;
    }
    if let Some((file, written)) = current.take() {
        received.insert(file, written.finish()?);
    }
    Ok((bytes, received))
}

/// One HTTP/2 connection per replica kept across fetches: a connection and its handshake
/// for every part was much of the time of fetching a small one.
mod channels {
    use std::collections::HashMap;
    use std::sync::{Mutex, OnceLock};

    use tonic::transport::Channel;

    fn all() -> std::sync::MutexGuard<'static, HashMap<String, Channel>> {
        static CHANNELS: OnceLock<Mutex<HashMap<String, Channel>>> = OnceLock::new();
        CHANNELS.get_or_init(Mutex::default).lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn get(url: &str) -> Option<Channel> {
        all().get(url).cloned()
    }

    pub fn put(url: &str, channel: Channel) {
        all().insert(url.to_string(), channel);
    }

    pub fn forget(url: &str) {
        all().remove(url);
    }
}

fn remove(dir: &Path) {
    let _ = std::fs::remove_dir_all(dir);
}

async fn blocking<T: Send + 'static>(f: impl FnOnce() -> Result<T> + Send + 'static) -> Result<T> {
    tokio::task::spawn_blocking(f).await.map_err(|e| EngineError::TaskFailed(e.to_string()))?
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_host_node_reads_back_as_an_address() {
        let text = crate::layout::host_text("127.0.0.1:9009", "events");
        let address = ReplicaAddress::parse(&text).expect("address");
        assert_eq!(address, ReplicaAddress { host: "127.0.0.1".into(), port: "9009".into(), table: "events".into() });
        assert_eq!(ReplicaAddress::parse("host: \nport: 1\ntable: t\n"), None);
    }

    #[test]
    fn file_names_cannot_leave_the_part() {
        assert!(safe_file_name("data.parquet"));
        for bad in ["", ".", "..", "../x", "a/b", "a\\b"] {
            assert!(!safe_file_name(bad), "{bad:?}");
        }
    }
}
