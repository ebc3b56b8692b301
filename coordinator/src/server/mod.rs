//! The ZooKeeper client port: accepts connections and runs one `Connection` per client.

mod connection;
mod four_letter;
pub mod outbox;
mod reply;

use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;

use crate::node::Coordinator;

pub async fn serve_clients(node: Arc<Coordinator>, listener: TcpListener) {
    loop {
        match listener.accept().await {
            Ok((stream, peer)) => {
                let _ = stream.set_nodelay(true);
                let node = node.clone();
                tokio::spawn(async move { connection::run(node, stream, peer).await });
            }
            Err(e) => {
                tracing::warn!(error = %e, "accepting a client connection failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}
