//! Decoding a merge's sources on a thread of their own. A merge spends about a quarter of its
//! time decoding its parts (Parquet pages, LZ4) and the rest comparing keys and applying the
//! engine; with the decoding moved off the merge thread the two overlap, and the Parquet
//! encoding of the output already runs on a third thread (`PartWriter::write_all_pipelined`).
//!
//! One thread serves all the sources of a merge, on demand: each source asks for its next
//! batch as it hands one to the merge, so every source is at most [`AHEAD`] batches ahead and
//! the memory held is bounded by the number of sources, not by their sizes. A merge of many
//! parts therefore costs one thread, not one per part.

use std::sync::mpsc::{channel, sync_channel, Receiver, Sender, SyncSender};

use arrow::array::RecordBatch;

use super::SortedStream;
use crate::error::Result;

/// Batches decoded ahead of the merge, per source.
const AHEAD: usize = 2;

/// The same streams, decoded on one thread of their own. If the thread cannot be started the
/// streams are returned as they are and are decoded by their reader.
pub fn decode_ahead(sources: Vec<SortedStream>) -> Vec<SortedStream> {
    if sources.len() < 2 {
        return sources;
    }
    let (demand_sender, demand) = channel::<usize>();
    let mut outputs = Vec::with_capacity(sources.len());
    let mut receivers = Vec::with_capacity(sources.len());
    for _ in &sources {
        let (sender, receiver) = sync_channel::<Result<RecordBatch>>(AHEAD);
        outputs.push(Some(sender));
        receivers.push(receiver);
    }
    // The decode thread gets the streams only once it runs: if it cannot start they are still
    // here to give back.
    let (hand_over, sources_in) = channel::<Vec<SortedStream>>();
    let spawned = std::thread::Builder::new().name("merge-decode".into()).spawn(move || {
        if let Ok(sources) = sources_in.recv() {
            serve(sources, outputs, &demand);
        }
    });
    if spawned.is_err() {
        tracing::warn!("cannot start a decode thread for a merge; its sources are decoded inline");
        return sources;
    }
    if let Err(returned) = hand_over.send(sources) {
        return returned.0;
    }
    receivers
        .into_iter()
        .enumerate()
        .map(|(index, batches)| {
            for _ in 0..AHEAD {
                // A closed demand channel ends the stream at the receive below.
                let _ = demand_sender.send(index);
            }
            Box::new(Prefetched { index, batches, demand: demand_sender.clone() }) as SortedStream
        })
        .collect()
}

/// Decodes the batch each demand names, until every source's consumer is gone.
/// A source's sender is dropped when the source ends, which ends its `Prefetched`.
fn serve(
    mut sources: Vec<SortedStream>,
    mut outputs: Vec<Option<SyncSender<Result<RecordBatch>>>>,
    demand: &Receiver<usize>,
) {
    // The receive fails once every `Prefetched` (each holding a demand sender) is dropped.
    while let Ok(index) = demand.recv() {
        let Some(output) = &outputs[index] else { continue };
        let next = sources[index].next();
        let done = matches!(next, None | Some(Err(_)));
        // A batch is never refused for want of room: a source has at most AHEAD demands and
        // batches between them. A closed channel means the merge stopped reading the source.
        let delivered = next.is_some_and(|batch| output.send(batch).is_ok());
        if done || !delivered {
            outputs[index] = None;
            // Dropping the stream now closes the part's reader early.
            sources[index] = Box::new(std::iter::empty());
        }
    }
}

/// One source as the merge sees it.
struct Prefetched {
    index: usize,
    batches: Receiver<Result<RecordBatch>>,
    demand: Sender<usize>,
}

impl Iterator for Prefetched {
    type Item = Result<RecordBatch>;

    fn next(&mut self) -> Option<Self::Item> {
        // The end of the source (and a failed decode thread) closes the channel.
        let batch = self.batches.recv().ok()?;
        let _ = self.demand.send(self.index);
        Some(batch)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow::array::{AsArray, UInt64Array};
    use arrow::datatypes::UInt64Type;

    use super::*;
    use crate::error::EngineError;

    fn batch(values: std::ops::Range<u64>) -> Result<RecordBatch> {
        let column = Arc::new(UInt64Array::from_iter_values(values));
        Ok(RecordBatch::try_from_iter([("k", column as arrow::array::ArrayRef)])?)
    }

    fn values(stream: SortedStream) -> Vec<std::result::Result<Vec<u64>, String>> {
        stream
            .map(|b| b.map(|b| b.column(0).as_primitive::<UInt64Type>().values().to_vec()).map_err(|e| e.to_string()))
            .collect()
    }

    #[test]
    fn every_source_yields_its_own_batches_in_order() {
        let sources: Vec<SortedStream> = (0..3u64)
            .map(|s| Box::new((0..5).map(move |i| batch(s * 100 + i * 10..s * 100 + i * 10 + 3))) as SortedStream)
            .collect();
        let mut streams = decode_ahead(sources);
        // Read the last source first: the others wait, two batches ahead, for their reader.
        let last = values(streams.pop().expect("three"));
        assert_eq!(last.len(), 5);
        assert_eq!(last[4], Ok(vec![240, 241, 242]));
        for (s, stream) in streams.into_iter().enumerate() {
            let expected: Vec<_> =
                (0..5u64).map(|i| Ok((0..3).map(|j| s as u64 * 100 + i * 10 + j).collect())).collect();
            assert_eq!(values(stream), expected);
        }
    }

    #[test]
    fn an_error_ends_its_source_only() {
        let failing: SortedStream = Box::new(
            vec![batch(0..2), Err(EngineError::BadTableDefinition("broken page".into())), batch(5..6)].into_iter(),
        );
        let fine: SortedStream = Box::new(vec![batch(10..12), batch(12..13)].into_iter());
        let mut streams = decode_ahead(vec![failing, fine]).into_iter();
        let failing = values(streams.next().expect("first"));
        assert_eq!(failing, vec![Ok(vec![0, 1]), Err("broken page".to_string())]);
        assert_eq!(values(streams.next().expect("second")), vec![Ok(vec![10, 11]), Ok(vec![12])]);
    }

    #[test]
    fn a_merge_that_stops_early_releases_its_sources() {
        // Each source holds a sender; once both are dropped the receiver sees the channel closed.
        let (alive, released) = std::sync::mpsc::channel::<()>();
        let endless = |alive: Sender<()>| {
            Box::new((0..).map(move |i| {
                let _ = &alive;
                batch(i..i + 1)
            })) as SortedStream
        };
        let mut streams = decode_ahead(vec![endless(alive.clone()), endless(alive)]);
        let first: Vec<_> = streams[0].as_mut().take(3).collect();
        assert_eq!(first.len(), 3);
        drop(streams);
        // The decode thread drops the sources once no stream is left to ask for batches.
        let closed = released.recv_timeout(std::time::Duration::from_secs(30));
        assert_eq!(closed, Err(std::sync::mpsc::RecvTimeoutError::Disconnected));
    }
}
