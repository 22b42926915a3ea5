//! Presigned URLs (SigV4 in the query string): s3s checks their
//! signature and refuses them once `X-Amz-Date` + `X-Amz-Expires` has
//! passed, but takes any `X-Amz-Expires`. S3 bounds it to 7 days, so a
//! URL leaked or logged stops working within a week; [`Access`] holds
//! the gateway to the same bound.

use crate::errors::s3;
use s3s::access::{S3Access, S3AccessContext};
use s3s::{S3ErrorCode, S3Result};

/// The longest life of a presigned URL, as S3 allows: 7 days.
pub const MAX_EXPIRES_SECONDS: u64 = 7 * 24 * 60 * 60;

/// The gateway's access check, run by s3s after the signature was
/// verified: a signature is required (s3s's default), and a presigned
/// URL may live at most [`MAX_EXPIRES_SECONDS`].
pub(crate) struct Access;

#[async_trait::async_trait]
impl S3Access for Access {
    async fn check(&self, cx: &mut S3AccessContext<'_>) -> S3Result<()> {
        // The operation s3s routed to, for /metrics (before any refusal:
        // refused requests are counted too).
        let name = cx.s3_op().name().to_string();
        if let Some(operation) = cx.extensions_mut().get::<crate::metrics::Operation>() {
            operation.set(&name);
        }
        if cx.credentials().is_none() {
            return Err(s3(
                S3ErrorCode::AccessDenied,
                "anonymous requests are refused: sign requests with a tenant's access key",
            ));
        }
        check_expires(cx.uri().query())
    }
}

/// Refuses a query whose `X-Amz-Expires` is past the 7 days S3 allows
/// (or not a number: s3s refused such a URL before, but a query without
/// a signature may still carry one).
fn check_expires(query: Option<&str>) -> S3Result<()> {
    let Some(query) = query else {
        return Ok(());
    };
    for pair in query.split('&') {
        let Some(value) = pair.strip_prefix("X-Amz-Expires=") else {
            continue;
        };
        match value.parse::<u64>() {
            Ok(seconds) if seconds <= MAX_EXPIRES_SECONDS => {}
            _ => {
                return Err(s3(
                    S3ErrorCode::AuthorizationQueryParametersError,
                    format!(
                        "X-Amz-Expires is {value:?}: a presigned URL lives at most \
                         {MAX_EXPIRES_SECONDS} seconds (7 days); sign it again with a \
                         shorter expiry"
                    ),
                ))
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_expiry_of_at_most_seven_days_is_taken() {
        for query in [
            None,
            Some(""),
            Some("list-type=2"),
            Some("X-Amz-Expires=604800"),
        ] {
            assert!(check_expires(query).is_ok(), "{query:?}");
        }
    }

    #[test]
    fn an_expiry_past_seven_days_is_refused_as_s3_refuses_it() {
        for query in [
            "X-Amz-Expires=604801",
            "a=b&X-Amz-Expires=99999999999",
            "X-Amz-Expires=-1",
        ] {
            let refused = check_expires(Some(query)).unwrap_err();
            assert_eq!(
                refused.code(),
                &S3ErrorCode::AuthorizationQueryParametersError,
                "{query}"
            );
        }
    }
}
