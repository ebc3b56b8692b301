//! DataFusion over the engine: table providers, the catalog, table functions.

pub mod catalog;
pub mod provider;
