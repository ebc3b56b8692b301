//! How a failed statement is answered over gRPC, by Flight SQL and by the Ingest service's
//! Query and inserts alike: the code of the error's kind, so that a client tells a statement to fix
//! (INVALID_ARGUMENT, NOT_FOUND) from a moment to wait out (UNAVAILABLE, RESOURCE_EXHAUSTED).

use mergestream_query::error::ErrorKind;
use mergestream_query::{QueryError, StatementError};
use tonic::Status;

/// The gRPC status of a failed statement, with the code of its kind.
pub fn status_of(error: QueryError) -> Status {
    Status::new(code_of(error.kind()), error.to_string())
}

/// The same for a statement of a script: the message names which one, and where.
pub fn status_of_script(error: StatementError) -> Status {
    Status::new(code_of(error.error.kind()), error.to_string())
}

/// An engine failure outside a statement (an insert, a table created by the Ingest service).
pub fn status_of_engine(error: mergestream_engine::EngineError) -> Status {
    Status::new(code_of(ErrorKind::of_engine(&error)), error.to_string())
}

fn code_of(kind: ErrorKind) -> tonic::Code {
    match kind {
        ErrorKind::BadStatement => tonic::Code::InvalidArgument,
        ErrorKind::NotFound => tonic::Code::NotFound,
        ErrorKind::AlreadyExists => tonic::Code::AlreadyExists,
        ErrorKind::Unsupported => tonic::Code::Unimplemented,
        ErrorKind::TryLater => tonic::Code::ResourceExhausted,
        ErrorKind::Unavailable => tonic::Code::Unavailable,
        ErrorKind::NotNow => tonic::Code::FailedPrecondition,
        ErrorKind::Internal => tonic::Code::Internal,
        ErrorKind::TimedOut => tonic::Code::DeadlineExceeded,
    }
}
