//! Sample order events for the quickstart and for trying a pipeline: orders whose ids repeat,
//! so that later versions update earlier ones, some of them deletes, from a seeded generator
//! whose expected final state (what `SELECT … FINAL` must show) is kept as it goes.
//!
//! The events match `pipelines/quickstart.yaml`: a ReplacingMergeTree(version, is_deleted)
//! keyed by `order_id`, so the table's FINAL state is each order's highest version, without
//! the orders whose highest version is a delete.

use std::collections::BTreeMap;
use std::collections::HashMap;

use serde::Serialize;

const CUSTOMERS: [&str; 8] = ["ann", "bob", "chen", "dana", "emeka", "fatima", "goran", "hana"];
const STATUSES: [&str; 4] = ["new", "paid", "shipped", "delivered"];

/// One event: an order as it is now. `deleted` marks the order's removal; a later event for
/// the same id creates it again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OrderEvent {
    pub order_id: u64,
    pub customer: &'static str,
    /// In cents, so that sums are exact on both sides; the message carries it as a decimal.
    pub amount_cents: u64,
    pub status: &'static str,
    pub version: u64,
    pub deleted: bool,
}

impl OrderEvent {
    /// The Kafka key: one order's events go to one partition, in order.
    pub fn key(&self) -> String {
        self.order_id.to_string()
    }

    pub fn to_json(&self) -> String {
        format!(
            r#"{{"order_id":{},"customer":{{"name":"{}"}},"amount":{}.{:02},"status":"{}","version":{},"deleted":{}}}"#,
            self.order_id,
            self.customer,
            self.amount_cents / 100,
            self.amount_cents % 100,
            self.status,
            self.version,
            u8::from(self.deleted)
        )
    }
}

/// What the events produced so far leave in the table after FINAL.
#[derive(Debug, Default, Clone, PartialEq, Eq, Serialize)]
pub struct ExpectedState {
    pub messages: u64,
    /// Distinct order ids seen.
    pub orders: u64,
    /// Orders whose latest event is not a delete: the rows of `SELECT … FINAL`.
    pub live: u64,
    pub deleted: u64,
    /// `sum(amount)` over the live orders, as ClickHouse prints the Decimal.
    pub amount: String,
    /// Per status of the live orders: (count, sum(amount) as decimal text).
    pub by_status: BTreeMap<&'static str, (u64, String)>,
}

/// The generator: seeded, so a run is reproducible.
pub struct SampleOrders {
    rng: SplitMix64,
    keys: u64,
    delete_percent: u64,
    latest: HashMap<u64, OrderEvent>,
    messages: u64,
}

impl SampleOrders {
    /// `keys` distinct order ids (at least one); about `delete_percent` of the events for an
    /// existing order delete it.
    pub fn new(seed: u64, keys: u64, delete_percent: u8) -> SampleOrders {
        SampleOrders {
            rng: SplitMix64(seed),
            keys: keys.max(1),
            delete_percent: u64::from(delete_percent.min(100)),
            latest: HashMap::new(),
            messages: 0,
        }
    }

    pub fn next_event(&mut self) -> OrderEvent {
        let order_id = 1 + self.rng.below(self.keys);
        let roll = self.rng.below(100);
        let event = match self.latest.get(&order_id) {
            Some(previous) if !previous.deleted && roll < self.delete_percent => {
                OrderEvent { version: previous.version + 1, deleted: true, ..previous.clone() }
            }
            Some(previous) if !previous.deleted => {
                let step = STATUSES.iter().position(|s| *s == previous.status).unwrap_or(0);
                OrderEvent {
                    status: STATUSES[(step + 1).min(STATUSES.len() - 1)],
                    // A correction of the amount now and then, as order systems send them.
                    amount_cents: if roll.is_multiple_of(4) {
                        100 + self.rng.below(50_000)
                    } else {
                        previous.amount_cents
                    },
                    version: previous.version + 1,
                    ..previous.clone()
                }
            }
            previous => OrderEvent {
                order_id,
                customer: CUSTOMERS[self.rng.below(CUSTOMERS.len() as u64) as usize],
                amount_cents: 100 + self.rng.below(50_000),
                status: STATUSES[0],
                version: previous.map_or(1, |p| p.version + 1),
                deleted: false,
            },
        };
        self.latest.insert(order_id, event.clone());
        self.messages += 1;
        event
    }

    pub fn expected(&self) -> ExpectedState {
        let mut state =
            ExpectedState { messages: self.messages, orders: self.latest.len() as u64, ..Default::default() };
        let mut cents = 0;
        let mut by_status: BTreeMap<&'static str, (u64, u64)> = BTreeMap::new();
        for order in self.latest.values() {
            if order.deleted {
                state.deleted += 1;
                continue;
            }
            state.live += 1;
            cents += order.amount_cents;
            let entry = by_status.entry(order.status).or_default();
            entry.0 += 1;
            entry.1 += order.amount_cents;
        }
        state.amount = decimal(cents);
        state.by_status = by_status.into_iter().map(|(s, (n, c))| (s, (n, decimal(c)))).collect();
        state
    }
}

/// As ClickHouse prints a Decimal (`output_format_decimal_trailing_zeros = 0`): 12.5, 12.
fn decimal(cents: u64) -> String {
    let text = format!("{}.{:02}", cents / 100, cents % 100);
    text.trim_end_matches('0').trim_end_matches('.').to_string()
}

/// Sebastiano Vigna's SplitMix64: a sample stream needs reproducibility, not a crate.
struct SplitMix64(u64);

impl SplitMix64 {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, bound: u64) -> u64 {
        self.next() % bound
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_seed_gives_the_same_events() {
        let mut a = SampleOrders::new(7, 50, 10);
        let mut b = SampleOrders::new(7, 50, 10);
        for _ in 0..500 {
            assert_eq!(a.next_event(), b.next_event());
        }
        assert_eq!(a.expected(), b.expected());
    }

    #[test]
    fn the_expected_state_is_the_latest_version_of_each_order_without_deletes() {
        let mut orders = SampleOrders::new(3, 20, 20);
        let events: Vec<OrderEvent> = (0..2_000).map(|_| orders.next_event()).collect();
        let mut latest: BTreeMap<u64, &OrderEvent> = BTreeMap::new();
        for e in &events {
            let kept = latest.entry(e.order_id).or_insert(e);
            assert!(e.version >= kept.version, "versions of one order only grow");
            *kept = e;
        }
        let live: Vec<&&OrderEvent> = latest.values().filter(|e| !e.deleted).collect();
        let expected = orders.expected();
        assert_eq!(expected.messages, 2_000);
        assert_eq!(expected.orders, latest.len() as u64);
        assert_eq!(expected.live, live.len() as u64);
        assert_eq!(expected.deleted, expected.orders - expected.live);
        assert!(expected.deleted > 0 && expected.live > 0, "{expected:?}");
        assert_eq!(expected.amount, decimal(live.iter().map(|e| e.amount_cents).sum()));
        assert_eq!(expected.by_status.values().map(|(n, _)| n).sum::<u64>(), expected.live);
    }

    #[test]
    fn sums_are_printed_as_clickhouse_prints_decimals() {
        assert_eq!(
            [decimal(1205), decimal(1250), decimal(1200), decimal(0), decimal(7)],
            ["12.05", "12.5", "12", "0", "0.07"]
        );
    }

    #[test]
    fn an_event_is_one_json_object_with_a_decimal_amount() {
        let event = OrderEvent {
            order_id: 12,
            customer: "ann",
            amount_cents: 1205,
            status: "paid",
            version: 3,
            deleted: false,
        };
        assert_eq!(
            event.to_json(),
            r#"{"order_id":12,"customer":{"name":"ann"},"amount":12.05,"status":"paid","version":3,"deleted":0}"#
        );
        assert_eq!(event.key(), "12");
    }
}
