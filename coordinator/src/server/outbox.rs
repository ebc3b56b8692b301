//! A connection's outgoing frames: replies and watch events wait here for the socket.
//!
//! The queue is bounded in bytes. A client that pipelines requests and never reads their
//! replies (400 getData of a megabyte each grew the node by 380 MiB) fills its queue, and
//! then its connection is closed, as ZooKeeper closes a connection it cannot write to. The
//! session survives the connection and the client may reconnect; the frames are not kept.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use tokio::io::{AsyncWrite, AsyncWriteExt, BufWriter};
use tokio::sync::{mpsc, Notify};

/// Bytes of frames one connection may have waiting for its socket.
pub const MAX_QUEUED_BYTES: usize = 32 << 20;

/// The sending side, shared by the connection and the node's apply loop (watch events).
#[derive(Clone)]
pub struct FrameSender {
    tx: mpsc::UnboundedSender<Vec<u8>>,
    shared: Arc<Shared>,
}

struct Shared {
    queued: AtomicUsize,
    overflowed: AtomicBool,
    limit: usize,
    /// Told when the queue overflows: the connection ends.
    closed: Arc<Notify>,
}

/// The receiving side, for the writer task.
pub struct FrameReceiver {
    rx: mpsc::UnboundedReceiver<Vec<u8>>,
    shared: Arc<Shared>,
}

/// A queue of at most `limit` bytes; `closed` is notified when a frame would pass it.
pub fn frame_queue(limit: usize, closed: Arc<Notify>) -> (FrameSender, FrameReceiver) {
    let (tx, rx) = mpsc::unbounded_channel();
    let shared = Arc::new(Shared { queued: AtomicUsize::new(0), overflowed: AtomicBool::new(false), limit, closed });
    (FrameSender { tx, shared: shared.clone() }, FrameReceiver { rx, shared })
}

impl FrameSender {
    /// Queues a frame; false when the connection is closing (the client went away, or its
    /// queue overflowed with this frame).
    pub fn send(&self, frame: Vec<u8>) -> bool {
        if self.shared.overflowed.load(Ordering::Acquire) {
            return false;
        }
        let len = frame.len();
        let queued = self.shared.queued.fetch_add(len, Ordering::AcqRel) + len;
        if queued > self.shared.limit {
            self.shared.overflowed.store(true, Ordering::Release);
            self.shared.closed.notify_one();
            metrics::counter!(crate::metrics::CONNECTIONS_CLOSED_UNREAD).increment(1);
            return false;
        }
        self.tx.send(frame).is_ok()
    }

    /// The client did not read its replies: the connection is being closed.
    pub fn overflowed(&self) -> bool {
        self.shared.overflowed.load(Ordering::Acquire)
    }
}

/// Writes frames until every sender is gone (the socket is then shut down) or the queue
/// overflowed (the socket is dropped: what waits for a client that does not read is not sent).
pub async fn write_frames(writer: impl AsyncWrite + Unpin, mut frames: FrameReceiver) {
    let mut out = BufWriter::new(writer);
    let shared = frames.shared.clone();
    while let Some(frame) = frames.rx.recv().await {
        if !write_one(&mut out, frame, &shared).await {
            return;
        }
        while let Ok(more) = frames.rx.try_recv() {
            if !write_one(&mut out, more, &shared).await {
                return;
            }
        }
        if out.flush().await.is_err() {
            return;
        }
    }
    let _ = out.shutdown().await;
}

/// False once the socket failed or the queue overflowed.
async fn write_one(out: &mut BufWriter<impl AsyncWrite + Unpin>, frame: Vec<u8>, shared: &Shared) -> bool {
    let written = out.write_all(&frame).await;
    shared.queued.fetch_sub(frame.len(), Ordering::AcqRel);
    written.is_ok() && !shared.overflowed.load(Ordering::Acquire)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_queue_past_its_limit_closes_its_connection() {
        let closed = Arc::new(Notify::new());
        let (sender, _receiver) = frame_queue(100, closed.clone());
        assert!(sender.send(vec![0; 60]));
        assert!(!sender.overflowed());
        assert!(!sender.send(vec![0; 60]), "over the limit");
        assert!(sender.overflowed());
        assert!(!sender.send(vec![0; 1]), "nothing more once closing");
        tokio::time::timeout(std::time::Duration::from_secs(1), closed.notified()).await.expect("told to close");
    }
}
