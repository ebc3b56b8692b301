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
