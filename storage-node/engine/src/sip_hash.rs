//! ClickHouse's SipHash-2-4 with its 128-bit output (`SipHash::get128`), which names the
//! partitions of keys that are not all integers.

/// Incremental SipHash with ClickHouse's 128-bit finalization; the key is zero.
pub struct SipHash128 {
    v: [u64; 4],
    buffer: Vec<u8>,
    length: u64,
}

impl Default for SipHash128 {
    fn default() -> Self {
        SipHash128 {
            v: [0x736f6d6570736575, 0x646f72616e646f6d, 0x6c7967656e657261, 0x7465646279746573],
            buffer: Vec::with_capacity(8),
            length: 0,
        }
    }
}

impl SipHash128 {
    fn round(&mut self) {
        let v = &mut self.v;
        v[0] = v[0].wrapping_add(v[1]);
        v[1] = v[1].rotate_left(13) ^ v[0];
        v[0] = v[0].rotate_left(32);
        v[2] = v[2].wrapping_add(v[3]);
        v[3] = v[3].rotate_left(16) ^ v[2];
        v[0] = v[0].wrapping_add(v[3]);
        v[3] = v[3].rotate_left(21) ^ v[0];
        v[2] = v[2].wrapping_add(v[1]);
        v[1] = v[1].rotate_left(17) ^ v[2];
        v[2] = v[2].rotate_left(32);
    }

    fn compress(&mut self, word: u64) {
        self.v[3] ^= word;
        self.round();
        self.round();
        self.v[0] ^= word;
    }

    pub fn update(&mut self, bytes: &[u8]) {
        self.length += bytes.len() as u64;
        for &b in bytes {
            self.buffer.push(b);
            if self.buffer.len() == 8 {
                let mut word = [0u8; 8];
                word.copy_from_slice(&self.buffer);
                self.buffer.clear();
                self.compress(u64::from_le_bytes(word));
            }
        }
    }

    /// The 16 bytes of `get128`: `v0 ^ v1` then `v2 ^ v3`, little-endian.
    pub fn finish128(mut self) -> [u8; 16] {
        let mut last = [0u8; 8];
        last[..self.buffer.len()].copy_from_slice(&self.buffer);
        last[7] = self.length as u8;
        self.compress(u64::from_le_bytes(last));
        self.v[2] ^= 0xff;
        for _ in 0..4 {
            self.round();
        }
        let mut out = [0u8; 16];
        out[..8].copy_from_slice(&(self.v[0] ^ self.v[1]).to_le_bytes());
        out[8..].copy_from_slice(&(self.v[2] ^ self.v[3]).to_le_bytes());
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_clickhouse_partition_ids() {
        // ClickHouse 26.9 names the partition of the String key 'a' so.
        let mut hash = SipHash128::default();
        hash.update(&[16]);
        hash.update(&1u64.to_le_bytes());
        hash.update(b"a");
        let hex: String = hash.finish128().iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(hex, "51fbadfb0deeea70ceafbd3c7c8aef25");
    }
}
