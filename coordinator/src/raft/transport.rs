//! Connections between coordinator nodes, authenticated with the cluster's shared secret.
//!
//! The Raft port changes the tree: a message on it can create nodes or close any client's
//! session. So a connection carries nothing until both ends have shown they hold the secret,
//! and every frame after that carries a MAC, so that nothing can be forged or replayed into an
//! established connection either:
//!
//! 1. the caller sends `MAGIC` and a random nonce `nc`;
//! 2. the callee answers its own nonce `ns` and `HMAC(K, "callee" ‖ nc ‖ ns)`;
//! 3. the caller checks it and answers `HMAC(K, "caller" ‖ nc ‖ ns)`, which the callee checks.
//!
//! Each direction then has its own key, `HMAC(K, "caller->callee" ‖ nc ‖ ns)` and the
//! reverse, and a frame is `length ‖ payload ‖ HMAC(key, sequence ‖ payload)`: a frame out of
//! order, from another connection or altered is refused. The MAC is checked before the payload
//! is decoded, and the decoding itself is bounded (see `tree::command`'s wire types). What is
//! not provided is secrecy: the frames travel in the clear, as ZooKeeper's quorum traffic does
//! without TLS.

use std::io;
use std::time::Duration;

use ring::hmac;
use ring::rand::{SecureRandom, SystemRandom};
use serde::de::DeserializeOwned;
use serde::Serialize;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const MAGIC: &[u8; 8] = b"MSRAFT1\0";
const NONCE: usize = 32;
const TAG: usize = 32;
/// The shortest secret accepted: 128 bits.
pub const MIN_SECRET_BYTES: usize = 16;
/// How long a peer has to complete the handshake.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);
/// Snapshots travel in one frame; this bounds what a peer may make us allocate.
pub const MAX_PEER_FRAME: usize = 1 << 30;

/// The cluster's shared secret, as an HMAC-SHA256 key.
pub struct ClusterKey(hmac::Key);

impl std::fmt::Debug for ClusterKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ClusterKey(..)")
    }
}

impl ClusterKey {
    pub fn new(secret: &[u8]) -> Result<ClusterKey, String> {
        if secret.len() < MIN_SECRET_BYTES {
            return Err(format!("the cluster secret has {} bytes; it needs {MIN_SECRET_BYTES} at least", secret.len()));
        }
        Ok(ClusterKey(hmac::Key::new(hmac::HMAC_SHA256, secret)))
    }

    fn tag(&self, label: &[u8], caller: &[u8], callee: &[u8]) -> hmac::Tag {
        let mut ctx = hmac::Context::with_key(&self.0);
        ctx.update(label);
        ctx.update(caller);
        ctx.update(callee);
        ctx.sign()
    }

    fn direction_key(&self, label: &[u8], caller: &[u8], callee: &[u8]) -> hmac::Key {
        hmac::Key::new(hmac::HMAC_SHA256, self.tag(label, caller, callee).as_ref())
    }
}

fn refused(message: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::PermissionDenied, message.into())
}

fn nonce() -> io::Result<[u8; NONCE]> {
    let mut n = [0u8; NONCE];
    SystemRandom::new().fill(&mut n).map_err(|_| io::Error::other("no randomness for a nonce"))?;
    Ok(n)
}

/// An authenticated connection to or from another node.
pub struct PeerStream {
    stream: TcpStream,
    send_key: hmac::Key,
    recv_key: hmac::Key,
    sent: u64,
    received: u64,
}

impl PeerStream {
    /// Connects to `addr` and proves the secret to it (and it to us).
    pub async fn connect(addr: &str, key: &ClusterKey) -> io::Result<PeerStream> {
        let mut stream = TcpStream::connect(addr).await?;
        stream.set_nodelay(true)?;
        let caller = nonce()?;
        let mut hello = Vec::with_capacity(MAGIC.len() + NONCE);
        hello.extend_from_slice(MAGIC);
        hello.extend_from_slice(&caller);
        stream.write_all(&hello).await?;
        let mut answer = [0u8; NONCE + TAG];
        stream.read_exact(&mut answer).await?;
        let (callee, proof) = answer.split_at(NONCE);
        let expected = key.tag(b"callee", &caller, callee);
        if !constant_time_eq(expected.as_ref(), proof) {
            return Err(refused(format!("peer {addr} does not hold this cluster's secret")));
        }
        stream.write_all(key.tag(b"caller", &caller, callee).as_ref()).await?;
        Ok(PeerStream {
            stream,
            send_key: key.direction_key(b"caller->callee", &caller, callee),
            recv_key: key.direction_key(b"callee->caller", &caller, callee),
            sent: 0,
            received: 0,
        })
    }

    /// Takes a connection a peer opened, once it has proven the secret.
    pub async fn accept(mut stream: TcpStream, key: &ClusterKey) -> io::Result<PeerStream> {
        let handshake = async {
            let mut hello = [0u8; 8 + NONCE];
            stream.read_exact(&mut hello).await?;
            let (magic, caller) = hello.split_at(MAGIC.len());
            if magic != MAGIC {
                return Err(refused("not a coordinator peer (no handshake)"));
            }
            let callee = nonce()?;
            let mut answer = Vec::with_capacity(NONCE + TAG);
            answer.extend_from_slice(&callee);
            answer.extend_from_slice(key.tag(b"callee", caller, &callee).as_ref());
            stream.write_all(&answer).await?;
            let mut proof = [0u8; TAG];
            stream.read_exact(&mut proof).await?;
            if !constant_time_eq(key.tag(b"caller", caller, &callee).as_ref(), &proof) {
                return Err(refused("the peer does not hold this cluster's secret"));
            }
            Ok((caller.to_vec(), callee))
        };
        let (caller, callee) = tokio::time::timeout(HANDSHAKE_TIMEOUT, handshake)
            .await
            .map_err(|_| refused("the peer did not complete the handshake in time"))??;
        Ok(PeerStream {
            stream,
            send_key: key.direction_key(b"callee->caller", &caller, &callee),
            recv_key: key.direction_key(b"caller->callee", &caller, &callee),
            sent: 0,
            received: 0,
        })
    }

    pub async fn send<T: Serialize>(&mut self, value: &T) -> io::Result<()> {
        let payload = bincode::serialize(value).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
        if payload.len() > MAX_PEER_FRAME {
            return Err(io::Error::new(io::ErrorKind::InvalidData, format!("a peer frame of {} bytes", payload.len())));
        }
        let tag = frame_tag(&self.send_key, self.sent, &payload);
        self.sent += 1;
        let mut frame = Vec::with_capacity(4 + payload.len() + TAG);
        frame.extend_from_slice(&(payload.len() as u32).to_be_bytes());
        frame.extend_from_slice(&payload);
        frame.extend_from_slice(tag.as_ref());
        self.stream.write_all(&frame).await
    }

    /// The next frame, decoded once its MAC is checked.
    pub async fn recv<T: DeserializeOwned>(&mut self) -> io::Result<T> {
        let len = self.stream.read_u32().await? as usize;
        if len > MAX_PEER_FRAME {
            return Err(io::Error::new(io::ErrorKind::InvalidData, format!("a peer frame of {len} bytes")));
        }
        let mut buf = vec![0; len + TAG];
        self.stream.read_exact(&mut buf).await?;
        let (payload, tag) = buf.split_at(len);
        let expected = frame_tag(&self.recv_key, self.received, payload);
        if !constant_time_eq(expected.as_ref(), tag) {
            return Err(refused("a peer frame failed its MAC: altered, replayed or forged"));
        }
        self.received += 1;
        bincode::deserialize(payload).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
    }
}

fn frame_tag(key: &hmac::Key, sequence: u64, payload: &[u8]) -> hmac::Tag {
    let mut ctx = hmac::Context::with_key(key);
    ctx.update(&sequence.to_be_bytes());
    ctx.update(payload);
    ctx.sign()
}

/// Compares MACs in time independent of where they differ.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn pair(caller_secret: &[u8], callee_secret: &[u8]) -> (io::Result<PeerStream>, io::Result<PeerStream>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr").to_string();
        let callee_key = ClusterKey::new(callee_secret).expect("key");
        let accepting = tokio::spawn(async move {
            let (stream, _) = listener.accept().await.expect("accept");
            PeerStream::accept(stream, &callee_key).await
        });
        let caller_key = ClusterKey::new(caller_secret).expect("key");
        let caller = PeerStream::connect(&addr, &caller_key).await;
        (caller, accepting.await.expect("join"))
    }

    #[tokio::test]
    async fn frames_flow_between_holders_of_the_secret() {
        let (caller, callee) = pair(b"0123456789abcdef", b"0123456789abcdef").await;
        let (mut caller, mut callee) = (caller.expect("caller"), callee.expect("callee"));
        for i in 0..3u64 {
            caller.send(&("ping", i)).await.expect("send");
            assert_eq!(callee.recv::<(String, u64)>().await.expect("recv"), ("ping".to_string(), i));
            callee.send(&i).await.expect("send");
            assert_eq!(caller.recv::<u64>().await.expect("recv"), i);
        }
    }

    #[tokio::test]
    async fn a_wrong_secret_is_refused_on_both_sides() {
        let (caller, callee) = pair(b"0123456789abcdef", b"fedcba9876543210").await;
        assert_eq!(caller.err().map(|e| e.kind()), Some(io::ErrorKind::PermissionDenied));
        assert!(callee.is_err());
    }

    #[tokio::test]
    async fn a_frame_without_the_handshake_is_refused() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let key = ClusterKey::new(b"0123456789abcdef").expect("key");
        let accepting = tokio::spawn(async move {
            let (stream, _) = listener.accept().await.expect("accept");
            PeerStream::accept(stream, &key).await.map(|_| ())
        });
        let mut raw = TcpStream::connect(addr).await.expect("connect");
        // A bare bincode frame, as the port took before: a forged Write.
        raw.write_all(&[0, 0, 0, 16, 3, 0, 0, 0, 1, 0, 0, 0, 7, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0])
            .await
            .expect("write");
        let error = accepting.await.expect("join").expect_err("refused");
        assert_eq!(error.kind(), io::ErrorKind::PermissionDenied);
    }

    #[test]
    fn short_secrets_are_refused() {
        assert!(ClusterKey::new(b"short").is_err());
    }
}
