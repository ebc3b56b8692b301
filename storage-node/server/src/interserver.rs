//! The interserver service (`schemas/interserver.proto`): other replicas fetch this node's
//! active parts here, file by file in chunks.

use std::io::Read;
use std::pin::Pin;
use std::sync::Arc;

use futures::Stream;
use mergestream_engine::{Catalog, Table};
use mergestream_proto::interserver::interserver_server::Interserver;
use mergestream_proto::interserver::{FetchPartRequest, PartChunk};
use tonic::{Request, Response, Status};

const CHUNK_BYTES: usize = 1 << 20;

pub struct InterserverService {
    catalog: Arc<Catalog>,
}

impl InterserverService {
    pub fn new(catalog: Arc<Catalog>) -> InterserverService {
        InterserverService { catalog }
    }
}

type ChunkStream = Pin<Box<dyn Stream<Item = Result<PartChunk, Status>> + Send>>;

#[tonic::async_trait]
impl Interserver for InterserverService {
    type FetchPartStream = ChunkStream;

    async fn fetch_part(&self, request: Request<FetchPartRequest>) -> Result<Response<ChunkStream>, Status> {
        let request = request.into_inner();
        let table = self.catalog.table(&request.table).map_err(|e| Status::not_found(e.to_string()))?;
        let part = table
            .active_part(&request.part_name)
            .ok_or_else(|| Status::not_found(format!("no active part {} in {}", request.part_name, request.table)))?;
        let (sender, receiver) = tokio::sync::mpsc::channel::<Result<PartChunk, Status>>(4);
        // Files are read on a blocking thread; the part's Arc keeps a merge from deleting them.
        tokio::task::spawn_blocking(move || {
            for (name, path) in Table::part_files(&part) {
                let sent = std::fs::File::open(&path).and_then(|mut file| {
                    let mut buffer = vec![0u8; CHUNK_BYTES];
                    let mut first = true;
                    loop {
                        let read = file.read(&mut buffer)?;
                        if read == 0 && !first {
                            return Ok(true);
                        }
                        let chunk = PartChunk { file: name.clone(), data: buffer[..read].to_vec() };
                        if sender.blocking_send(Ok(chunk)).is_err() {
                            return Ok(false);
                        }
                        if read == 0 {
                            return Ok(true);
                        }
                        first = false;
                    }
                });
                match sent {
                    Ok(true) => {}
                    Ok(false) => return,
                    Err(e) => {
                        let _ =
                            sender.blocking_send(Err(Status::internal(format!("cannot read {}: {e}", path.display()))));
                        return;
                    }
                }
            }
            metrics::counter!(crate::metrics::PARTS_SENT).increment(1);
        });
        Ok(Response::new(Box::pin(tokio_stream::wrappers::ReceiverStream::new(receiver))))
    }
}
