//! The wire schemas of mergestream's gRPC services, and how their clients and servers set up
//! TLS ([`tls`]).

pub mod tls;

/// An error with its causes, as one line: a transport error's own text is only "transport
/// error", and why (a refused connection, a certificate the CA did not sign) is in its sources.
pub fn error_chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        // tonic's errors repeat their source's text in their own at times.
        if !text.ends_with(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    text
}

/// A status's message, with the transport's reasons when the call never reached the service.
pub fn status_text(status: &tonic::Status) -> String {
    match std::error::Error::source(status) {
        Some(source) => format!("{}: {}", status.message(), error_chain(source)),
        None => status.message().to_string(),
    }
}

/// The storage node's insert service (`ingest.proto`).
pub mod ingest {
    #![allow(clippy::all, clippy::pedantic, missing_docs)]
    tonic::include_proto!("mergestream.ingest.v1");
}

/// Part fetches between replicas (`interserver.proto`).
pub mod interserver {
    #![allow(clippy::all, clippy::pedantic, missing_docs)]
    tonic::include_proto!("mergestream.interserver.v1");
}

/// Why the insert service refused an insert that commits an offset, beyond its status code:
/// the reply carries one of these in the `mergestream-refusal` metadata entry, so that a
/// writer tells a fencing (give the partition up) from a damaged or missing offset node
/// (stop the partition) and from a storage node that cannot commit offsets at all (a
/// configuration error).
pub mod refusal {
    /// The metadata key of the reason.
    pub const METADATA_KEY: &str = "mergestream-refusal";

    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub enum Reason {
        /// The offset node is not at the expected version: another writer moved it (ABORTED).
        StaleVersion,
        /// The offset node does not exist (FAILED_PRECONDITION).
        OffsetNodeMissing,
        /// The offset node holds bytes that are not an offset record (DATA_LOSS).
        CorruptOffsetRecord,
        /// The storage node was started without a coordinator (FAILED_PRECONDITION).
        NoCoordinator,
    }

    impl Reason {
        pub fn as_str(self) -> &'static str {
            match self {
                Reason::StaleVersion => "stale-version",
                Reason::OffsetNodeMissing => "offset-node-missing",
                Reason::CorruptOffsetRecord => "corrupt-offset-record",
                Reason::NoCoordinator => "no-coordinator",
            }
        }

        pub fn parse(text: &str) -> Option<Reason> {
            [Reason::StaleVersion, Reason::OffsetNodeMissing, Reason::CorruptOffsetRecord, Reason::NoCoordinator]
                .into_iter()
                .find(|r| r.as_str() == text)
        }

        /// The status a refusal for this reason is answered with.
        pub fn status(self, message: String) -> tonic::Status {
            let code = match self {
                Reason::StaleVersion => tonic::Code::Aborted,
                Reason::OffsetNodeMissing | Reason::NoCoordinator => tonic::Code::FailedPrecondition,
                Reason::CorruptOffsetRecord => tonic::Code::DataLoss,
            };
            let mut status = tonic::Status::new(code, message);
            status.metadata_mut().insert(METADATA_KEY, tonic::metadata::MetadataValue::from_static(self.as_str()));
            status
        }

        /// The reason a status names, if it is a refusal.
        pub fn of(status: &tonic::Status) -> Option<Reason> {
            status.metadata().get(METADATA_KEY).and_then(|v| v.to_str().ok()).and_then(Reason::parse)
        }
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn a_reason_survives_its_status() {
            for r in
                [Reason::StaleVersion, Reason::OffsetNodeMissing, Reason::CorruptOffsetRecord, Reason::NoCoordinator]
            {
                assert_eq!(Reason::of(&r.status("m".into())), Some(r));
            }
            assert_eq!(Reason::of(&tonic::Status::aborted("plain")), None);
        }
    }
}
