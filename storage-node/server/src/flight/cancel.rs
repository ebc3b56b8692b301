//! CancelFlightInfo: a query's ticket carries a random id, and a client cancels the query by
//! sending back the FlightInfo that holds the ticket. A query streaming its rows stops and its
//! client reads CANCELLED; a ticket cancelled before its DoGet is refused when it comes; one
//! whose rows were all sent is not cancellable any more.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex};

use arrow_flight::CancelStatus;
use tokio::sync::watch;
use tonic::Status;

/// Query ids remembered as cancelled before they ran, or as ended: enough for any client's
/// retry, and bounded so that tickets never used cannot grow the server.
const REMEMBERED: usize = 10_000;

/// What a client whose query was cancelled reads, in ClickHouse's words.
pub(super) fn cancelled() -> Status {
    Status::cancelled("Query was cancelled (QUERY_WAS_CANCELLED)")
}

#[derive(Default)]
pub(super) struct Cancellations {
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    /// A query streaming now → its signal, shared by every DoGet of the same ticket.
    running: HashMap<u64, watch::Sender<bool>>,
    cancelled_early: Remembered,
    ended: Remembered,
}

impl Cancellations {
    /// A DoGet of query `id` begins: its signal, or CANCELLED if its ticket was cancelled.
    pub(super) fn start(self: &Arc<Self>, id: u64) -> Result<Running, Status> {
        let mut state = self.state.lock().map_err(|_| Status::internal("the cancellations' lock"))?;
        if state.cancelled_early.contains(id) {
            return Err(cancelled());
        }
        let signal = state.running.entry(id).or_insert_with(|| watch::channel(false).0).subscribe();
        Ok(Running { id, signal, owner: self.clone() })
    }

    pub(super) fn cancel(&self, id: u64) -> Result<CancelStatus, Status> {
        let mut state = self.state.lock().map_err(|_| Status::internal("the cancellations' lock"))?;
        if let Some(signal) = state.running.get(&id) {
            signal.send_replace(true);
            return Ok(CancelStatus::Cancelled);
        }
        if state.ended.contains(id) {
            return Ok(CancelStatus::NotCancellable);
        }
        state.cancelled_early.insert(id);
        Ok(CancelStatus::Cancelled)
    }
}

/// One DoGet's view of its query's cancellation; the query counts as ended when the last
/// DoGet of it drops this.
pub(super) struct Running {
    id: u64,
    signal: watch::Receiver<bool>,
    owner: Arc<Cancellations>,
}

impl Running {
    /// Resolves once the query is cancelled.
    pub(super) async fn cancelled(&mut self) {
        if self.signal.wait_for(|cancelled| *cancelled).await.is_err() {
            // The sender lives while this does: this cannot happen, and must not end the query.
            std::future::pending::<()>().await;
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let Ok(mut state) = self.owner.state.lock() else { return };
        let last = state.running.get(&self.id).is_some_and(|signal| signal.receiver_count() <= 1);
        if last {
            state.running.remove(&self.id);
            state.ended.insert(self.id);
        }
    }
}

/// A set of the latest `REMEMBERED` ids.
#[derive(Default)]
struct Remembered {
    ids: HashSet<u64>,
    order: VecDeque<u64>,
}

impl Remembered {
    fn contains(&self, id: u64) -> bool {
        self.ids.contains(&id)
    }

    fn insert(&mut self, id: u64) {
        if !self.ids.insert(id) {
            return;
        }
        self.order.push_back(id);
        if self.order.len() > REMEMBERED {
            if let Some(oldest) = self.order.pop_front() {
                self.ids.remove(&oldest);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_running_query_hears_its_cancel_and_an_ended_one_is_not_cancellable() {
        let cancellations = Arc::new(Cancellations::default());
        let mut running = cancellations.start(7).expect("start");
        assert_eq!(cancellations.cancel(7).expect("cancel"), CancelStatus::Cancelled);
        tokio::time::timeout(std::time::Duration::from_secs(5), running.cancelled()).await.expect("cancelled");
        drop(running);
        assert_eq!(cancellations.cancel(7).expect("cancel"), CancelStatus::NotCancellable);
    }

    #[test]
    fn a_ticket_cancelled_before_its_doget_is_refused_and_the_memory_is_bounded() {
        let cancellations = Arc::new(Cancellations::default());
        assert_eq!(cancellations.cancel(1).expect("cancel"), CancelStatus::Cancelled);
        let refused = cancellations.start(1).err().expect("refused");
        assert_eq!(refused.code(), tonic::Code::Cancelled);
        for id in 2..(REMEMBERED as u64 + 10) {
            cancellations.cancel(id).expect("cancel");
        }
        let state = cancellations.state.lock().expect("lock");
        assert_eq!(state.cancelled_early.ids.len(), REMEMBERED);
        assert!(!state.cancelled_early.contains(1));
    }

    #[test]
    fn two_doget_of_one_ticket_end_it_when_both_end() {
        let cancellations = Arc::new(Cancellations::default());
        let first = cancellations.start(3).expect("first");
        let second = cancellations.start(3).expect("second");
        drop(first);
        assert!(cancellations.state.lock().expect("lock").running.contains_key(&3));
        drop(second);
        let state = cancellations.state.lock().expect("lock");
        assert!(!state.running.contains_key(&3) && state.ended.contains(3));
    }
}
