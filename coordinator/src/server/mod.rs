//! The ZooKeeper client ports: accepts connections and runs one `Connection` per client, on
//! the plain port and, with TLS, on the secure one.

mod connection;
mod four_letter;
pub mod outbox;
mod reply;
pub mod tls;

use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::TlsAcceptor;

use crate::node::Coordinator;

/// A client's byte stream, split into the halves a connection's reader and writer task own.
pub trait ClientStream: Send + 'static {
    type Reader: AsyncRead + Unpin + Send + 'static;
    type Writer: AsyncWrite + Unpin + Send + 'static;
    fn split(self) -> (Self::Reader, Self::Writer);
}

impl ClientStream for TcpStream {
    type Reader = tokio::net::tcp::OwnedReadHalf;
    type Writer = tokio::net::tcp::OwnedWriteHalf;
    fn split(self) -> (Self::Reader, Self::Writer) {
        self.into_split()
    }
}

impl ClientStream for tokio_rustls::server::TlsStream<TcpStream> {
    type Reader = tokio::io::ReadHalf<Self>;
    type Writer = tokio::io::WriteHalf<Self>;
    fn split(self) -> (Self::Reader, Self::Writer) {
        tokio::io::split(self)
    }
}

/// Serves clients on `listener`, through TLS when `tls` is given.
pub async fn serve_clients(node: Arc<Coordinator>, listener: TcpListener, tls: Option<TlsAcceptor>) {
    loop {
        match listener.accept().await {
            Ok((stream, peer)) => {
                let _ = stream.set_nodelay(true);
                let node = node.clone();
                match tls.clone() {
                    None => {
                        tokio::spawn(async move { connection::run(node, stream, peer).await });
                    }
                    Some(acceptor) => {
                        tokio::spawn(async move {
                            // The TLS handshake counts against the handshake timeout too: a
                            // client that opens a connection and says nothing is let go.
                            let timeout = node.config.handshake_timeout;
                            match tokio::time::timeout(timeout, acceptor.accept(stream)).await {
                                Ok(Ok(stream)) => connection::run(node, stream, peer).await,
                                Ok(Err(e)) => tracing::warn!(%peer, error = %e, "TLS handshake failed"),
                                Err(_) => tracing::warn!(%peer, ?timeout, "no TLS handshake in time"),
                            }
                        });
                    }
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, "accepting a client connection failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}
