//! The ZooKeeper client protocol: jute encoding, the records, and the numbers.

pub mod codes;
#[cfg(test)]
mod fuzz;
pub mod jute;
pub mod records;

/// Largest frame a client may send: ZooKeeper's default `jute.maxbuffer` (0xfffff) plus the
/// 1 KiB of headroom ZooKeeper allows for request headers.
pub const MAX_FRAME_BYTES: usize = 0xfffff + 1024;

#[derive(Debug, thiserror::Error)]
pub enum ProtoError {
    #[error("frame ends inside a {what} at byte {offset}")]
    Truncated { what: &'static str, offset: usize },
    #[error("string at byte {offset} is not UTF-8")]
    InvalidUtf8 { offset: usize },
    #[error("invalid {what}: {value}")]
    BadField { what: &'static str, value: i64 },
}
