//! Jute, ZooKeeper's record serialization: big-endian integers, length-prefixed buffers and
//! strings (length -1 for null), and vectors as a count followed by the elements.

use super::ProtoError;

/// Reads jute primitives from one frame's payload.
pub struct JuteReader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> JuteReader<'a> {
    pub fn new(buf: &'a [u8]) -> Self {
        Self { buf, pos: 0 }
    }

    pub fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    fn take(&mut self, n: usize, what: &'static str) -> Result<&'a [u8], ProtoError> {
        if self.remaining() < n {
            return Err(ProtoError::Truncated { what, offset: self.pos });
        }
        let bytes = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(bytes)
    }

    pub fn bool(&mut self) -> Result<bool, ProtoError> {
        Ok(self.take(1, "bool")?[0] != 0)
    }

    pub fn i32(&mut self) -> Result<i32, ProtoError> {
        let b = self.take(4, "int")?;
        Ok(i32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }

    pub fn i64(&mut self) -> Result<i64, ProtoError> {
        let b = self.take(8, "long")?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Ok(i64::from_be_bytes(a))
    }

    /// A buffer; jute writes null as length -1, which this reads as empty, as ZooKeeper reads
    /// a string or a password.
    pub fn buffer(&mut self) -> Result<Vec<u8>, ProtoError> {
        Ok(self.optional_buffer()?.unwrap_or_default())
    }

    /// A buffer that may be null (length -1): a node's data, which ZooKeeper keeps null when a
    /// client sent null, apart from empty.
    pub fn optional_buffer(&mut self) -> Result<Option<Vec<u8>>, ProtoError> {
        let len = self.i32()?;
        if len < 0 {
            return Ok(None);
        }
        Ok(Some(self.take(len as usize, "buffer")?.to_vec()))
    }

    pub fn string(&mut self) -> Result<String, ProtoError> {
        let bytes = self.buffer()?;
        String::from_utf8(bytes).map_err(|_| ProtoError::InvalidUtf8 { offset: self.pos })
    }

    pub fn vec<T>(&mut self, mut item: impl FnMut(&mut Self) -> Result<T, ProtoError>) -> Result<Vec<T>, ProtoError> {
        let len = self.i32()?;
        if len < 0 {
            return Ok(Vec::new());
        }
        // Each element takes at least one byte: a count above that is a malformed frame, and must
        // not become a huge allocation.
        if len as usize > self.remaining() {
            return Err(ProtoError::Truncated { what: "vector", offset: self.pos });
        }
        (0..len).map(|_| item(self)).collect()
    }

    pub fn strings(&mut self) -> Result<Vec<String>, ProtoError> {
        self.vec(|r| r.string())
    }
}

/// Builds one frame: the 4-byte length is reserved up front and filled in by `finish`.
pub struct JuteWriter {
    buf: Vec<u8>,
}

impl Default for JuteWriter {
    fn default() -> Self {
        Self::new()
    }
}

impl JuteWriter {
    pub fn new() -> Self {
        Self { buf: vec![0; 4] }
    }

    pub fn bool(&mut self, v: bool) -> &mut Self {
        self.buf.push(v as u8);
        self
    }

    pub fn i32(&mut self, v: i32) -> &mut Self {
        self.buf.extend_from_slice(&v.to_be_bytes());
        self
    }

    pub fn i64(&mut self, v: i64) -> &mut Self {
        self.buf.extend_from_slice(&v.to_be_bytes());
        self
    }

    pub fn buffer(&mut self, v: &[u8]) -> &mut Self {
        self.i32(v.len() as i32);
        self.buf.extend_from_slice(v);
        self
    }

    /// A buffer or null (length -1).
    pub fn optional_buffer(&mut self, v: Option<&[u8]>) -> &mut Self {
        match v {
            Some(v) => self.buffer(v),
            None => self.i32(-1),
        }
    }

    pub fn string(&mut self, v: &str) -> &mut Self {
        self.buffer(v.as_bytes())
    }

    pub fn strings<S: AsRef<str>>(&mut self, v: &[S]) -> &mut Self {
        self.i32(v.len() as i32);
        for s in v {
            self.string(s.as_ref());
        }
        self
    }

    /// The frame, length prefix included.
    pub fn finish(mut self) -> Vec<u8> {
        let len = (self.buf.len() - 4) as i32;
        self.buf[..4].copy_from_slice(&len.to_be_bytes());
        self.buf
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_primitives() {
        let mut w = JuteWriter::new();
        w.i32(-7).i64(1 << 40).bool(true).string("/a").buffer(b"").strings(&["x", "yz"]);
        let frame = w.finish();
        assert_eq!(i32::from_be_bytes([frame[0], frame[1], frame[2], frame[3]]) as usize, frame.len() - 4);
        let mut r = JuteReader::new(&frame[4..]);
        assert_eq!(r.i32().ok(), Some(-7));
        assert_eq!(r.i64().ok(), Some(1 << 40));
        assert_eq!(r.bool().ok(), Some(true));
        assert_eq!(r.string().ok().as_deref(), Some("/a"));
        assert_eq!(r.buffer().ok(), Some(vec![]));
        assert_eq!(r.strings().ok(), Some(vec!["x".to_string(), "yz".to_string()]));
        assert_eq!(r.remaining(), 0);
    }

    #[test]
    fn a_vector_count_beyond_the_frame_is_an_error_not_an_allocation() {
        let mut w = JuteWriter::new();
        w.i32(i32::MAX);
        let frame = w.finish();
        assert!(JuteReader::new(&frame[4..]).strings().is_err());
    }
}
