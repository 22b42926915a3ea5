//! The store's errors as S3 errors: the codes S3 clients act on, with the
//! store's own message kept as the S3 message.

use s3s::{S3Error, S3ErrorCode};
use strata_store_protocol::{Code, Error};

/// Whether the store answered that the name is not there (never stored,
/// or deleted).
pub fn is_missing(error: &Error) -> bool {
    matches!(
        error,
        Error::Remote {
            code: Code::NotFound | Code::Deleted,
            ..
        }
    )
}

/// An S3 error for a store error met while `doing` (what the gateway was
/// doing, for the message).
pub fn from_store(doing: &str, error: &Error) -> S3Error {
    let message = format!("{doing}: {}", error.report());
    let code = match error {
        Error::Remote { code, .. } => match code {
            Code::NotFound | Code::Deleted => S3ErrorCode::NoSuchKey,
            Code::Forbidden => S3ErrorCode::AccessDenied,
            Code::Unauthenticated => S3ErrorCode::InvalidAccessKeyId,
            Code::Unavailable | Code::Moving | Code::WrongAddress => {
                S3ErrorCode::ServiceUnavailable
            }
            Code::Conflict | Code::Exists => S3ErrorCode::OperationAborted,
            _ => S3ErrorCode::InternalError,
        },
        Error::Timeout(_) => S3ErrorCode::ServiceUnavailable,
        Error::Malformed { .. } => S3ErrorCode::InvalidArgument,
        _ => S3ErrorCode::InternalError,
    };
    if code == S3ErrorCode::InternalError {
        tracing::warn!("{message}");
    }
    S3Error::with_message(code, message)
}

/// An S3 error with `code` and `message`.
pub fn s3(code: S3ErrorCode, message: impl Into<String>) -> S3Error {
    S3Error::with_message(code, message.into())
}
