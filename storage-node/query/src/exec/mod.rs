//! DataFusion over the engine: table providers, the catalog, table functions.

pub mod aggregate_states;
pub mod byte_extremes;
pub mod catalog;
pub mod empty_aggregates;
pub mod limits;
pub mod operators;
pub mod provider;
pub mod system;
