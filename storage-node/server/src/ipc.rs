//! Arrow IPC streams from writers, decoded without trusting them.
//!
//! The stream is decoded in place from the request's bytes, which the gRPC message limit
//! already bounds: a size a message claims (a body of 2^46 bytes, say) is only ever compared
//! with the bytes that are there, never allocated up front as arrow's `StreamReader` does.

use arrow::buffer::Buffer;
use arrow::ipc::reader::StreamDecoder;
use arrow::record_batch::RecordBatch;

/// The batches of a stream, or why it is not one. arrow-ipc 59 panics on some malformed
/// streams instead of answering an error (an unknown Date unit in a schema, buffers shorter
/// than their arrays, offsets past a buffer's end: all found by the fuzz test below); decoding
/// touches nothing but its input, so such a panic is caught here and answered as the error it
/// should have been.
pub fn decode_stream(bytes: Vec<u8>) -> Result<Vec<RecordBatch>, String> {
    match std::panic::catch_unwind(move || decode(bytes)) {
        Ok(decoded) => decoded,
        Err(panic) => {
            metrics::counter!(crate::metrics::IPC_DECODER_PANICS).increment(1);
            let message = crate::panic_message(panic.as_ref());
            Err(format!("it is malformed ({message})"))
        }
    }
}

fn decode(bytes: Vec<u8>) -> Result<Vec<RecordBatch>, String> {
    let mut buffer = Buffer::from_vec(bytes);
    let mut decoder = StreamDecoder::new();
    let mut batches = Vec::new();
    while !buffer.is_empty() {
        if let Some(batch) = decoder.decode(&mut buffer).map_err(|e| e.to_string())? {
            batches.push(batch);
        }
    }
    decoder.finish().map_err(|e| e.to_string())?;
    if decoder.schema().is_none() {
        return Err("it holds no schema".into());
    }
    Ok(batches)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow::array::{ArrayRef, Int64Array, ListArray, StringArray};
    use arrow::datatypes::Int64Type;
    use arrow::ipc::writer::StreamWriter;

    use super::*;

    fn stream() -> Vec<u8> {
        let ids: ArrayRef = Arc::new(Int64Array::from_iter_values(0..64));
        let names: ArrayRef = Arc::new(StringArray::from_iter_values((0..64).map(|i| format!("name-{i}"))));
        let lists: ArrayRef = Arc::new(ListArray::from_iter_primitive::<Int64Type, _, _>(
            (0..64).map(|i| Some((0..i % 5).map(Some).collect::<Vec<_>>())),
        ));
        let batch = RecordBatch::try_from_iter([("id", ids), ("name", names), ("list", lists)]).expect("batch");
        let mut bytes = Vec::new();
        let mut writer = StreamWriter::try_new(&mut bytes, &batch.schema()).expect("writer");
        writer.write(&batch).expect("write");
        writer.finish().expect("finish");
        drop(writer);
        bytes
    }

    /// xorshift64*: the fuzz cases are the same on every run, so a failure reproduces.
    struct Rng(u64);

    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
        }
        fn below(&mut self, n: usize) -> usize {
            (self.next() % n as u64) as usize
        }
    }

    fn iterations() -> usize {
        std::env::var("MERGESTREAM_FUZZ_ITERATIONS").ok().and_then(|v| v.parse().ok()).unwrap_or(3000)
    }

    /// Inputs on which arrow-ipc panicked, kept as they were found.
    #[test]
    fn streams_arrow_panics_on_are_answered_as_errors() {
        let valid = stream();
        let mut rng = Rng(0x15_1515);
        let mut found = 0;
        for _ in 0..200 {
            let mut bytes = valid.clone();
            let at = rng.below(bytes.len());
            bytes[at] = rng.next() as u8;
            let caught = std::panic::catch_unwind(|| decode(bytes.clone())).is_err();
            if caught {
                found += 1;
                assert!(decode_stream(bytes).expect_err("an error").contains("malformed"));
            }
        }
        assert!(found > 0, "arrow-ipc no longer panics on these: the catch may be removable");
    }

    #[test]
    fn a_valid_stream_decodes() {
        let batches = decode_stream(stream()).expect("decodes");
        assert_eq!(batches.iter().map(RecordBatch::num_rows).sum::<usize>(), 64);
    }

    #[test]
    fn a_claimed_size_is_not_allocated() {
        let mut bytes = stream();
        // Every 8-byte field of the record batch message set to 2^46: the bodyLength among them.
        let schema_len = u32::from_le_bytes(bytes[4..8].try_into().expect("len")) as usize + 8;
        let meta_len = u32::from_le_bytes(bytes[schema_len + 4..schema_len + 8].try_into().expect("len")) as usize;
        for at in (schema_len + 8..schema_len + 8 + meta_len).step_by(8) {
            bytes[at..at + 8].copy_from_slice(&(1u64 << 46).to_le_bytes());
            assert!(std::panic::catch_unwind(|| decode_stream(bytes.clone())).is_ok());
        }
    }

    /// Random mutations of a valid stream, bounded in CI; `MERGESTREAM_FUZZ_ITERATIONS` runs
    /// more. Every input is answered, as batches or an error: no panic leaves the decoder.
    #[test]
    fn mutated_streams_never_panic() {
        let valid = stream();
        let mut rng = Rng(0x15_1515);
        let mut panics = Vec::new();
        for case in 0..iterations() {
            let mut bytes = valid.clone();
            for _ in 0..1 + rng.below(6) {
                let at = rng.below(bytes.len());
                bytes[at] = match rng.below(4) {
                    0 => 0xff,
                    1 => 0,
                    _ => rng.next() as u8,
                };
            }
            if rng.below(10) == 0 {
                bytes.truncate(rng.below(bytes.len()));
            }
            if std::panic::catch_unwind(|| decode_stream(bytes.clone()).map(drop)).is_err() {
                panics.push(case);
            }
        }
        assert!(panics.is_empty(), "cases {panics:?} panicked");
    }
}
