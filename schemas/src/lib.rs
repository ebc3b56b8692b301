//! The wire schemas of mergestream's gRPC services.

/// The storage node's insert service (`ingest.proto`).
pub mod ingest {
    #![allow(clippy::all, clippy::pedantic, missing_docs)]
    tonic::include_proto!("mergestream.ingest.v1");
}
