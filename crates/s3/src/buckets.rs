//! Buckets: a bucket `B` is the names under `B/`, present while its
//! marker `B/` is ([`crate::names`]). A tenant's scope (`ID/`) admits
//! one bucket, `ID`; the admin tenant `*` may make any.

use crate::bucket_class::{from_marker, marker_attributes};
use crate::errors::{from_store, is_missing, s3};
use crate::names::{bucket_prefix, reserved_prefix};
use crate::Gateway;
use s3s::{S3ErrorCode, S3Result};
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use strata_store_client::client::Client;
use strata_store_protocol::class::StorageClass;
use strata_store_protocol::tenant::{in_scope, ADMIN};
use strata_store_protocol::wire::ListEntry;

/// A bucket as ListBuckets shows it.
pub(crate) struct BucketInfo {
    /// Its name.
    pub name: String,
    /// When it was made.
    pub created: SystemTime,
}

/// Milliseconds since the epoch, now.
pub(crate) fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// The time `ms` milliseconds after the epoch.
pub(crate) fn from_ms(ms: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_millis(ms)
}

/// Refuses a bucket outside the tenant's scope with AccessDenied, before
/// the store is asked.
pub(crate) fn check_scope(client: &Client, bucket: &str) -> S3Result<()> {
    let tenant = client.credential().tenant();
    if in_scope(tenant, &bucket_prefix(bucket)) {
        return Ok(());
    }
    Err(s3(
        S3ErrorCode::AccessDenied,
        format!(
            "bucket '{bucket}' belongs to another tenant: the access key of tenant \
             '{tenant}' may only use the bucket '{tenant}'"
        ),
    ))
}

impl Gateway {
    /// Fails with NoSuchBucket unless the bucket's marker is there.
    pub(crate) async fn bucket_exists(&self, client: &Client, bucket: &str) -> S3Result<()> {
        self.bucket_class(client, bucket).await.map(|_| ())
    }

    /// The storage class the bucket was made with, if any
    /// ([`crate::bucket_class`]); NoSuchBucket unless its marker is there.
    pub(crate) async fn bucket_class(
        &self,
        client: &Client,
        bucket: &str,
    ) -> S3Result<Option<StorageClass>> {
        check_scope(client, bucket)?;
        match client.stat(&bucket_prefix(bucket)).await {
            Ok(record) => Ok(from_marker(&record.attributes)),
            Err(e) if is_missing(&e) => Err(no_such_bucket(bucket)),
            Err(e) => Err(from_store(&format!("looking up bucket '{bucket}'"), &e)),
        }
    }

    /// CreateBucket: stores the marker with the creation time, and the
    /// bucket's storage class, if given, in its attributes.
    pub(crate) async fn create_bucket(
        &self,
        client: &Client,
        bucket: &str,
        class: Option<StorageClass>,
    ) -> S3Result<()> {
        check_scope(client, bucket)?;
        let marker = bucket_prefix(bucket);
        match client.stat(&marker).await {
            Ok(_) => {
                return Err(s3(
                    S3ErrorCode::BucketAlreadyOwnedByYou,
                    format!("bucket '{bucket}' exists already"),
                ))
            }
            Err(e) if is_missing(&e) => {}
            Err(e) => return Err(from_store(&format!("creating bucket '{bucket}'"), &e)),
        }
        let created = now_ms().to_string();
        let mut body = created.as_bytes();
        let attributes = marker_attributes(class);
        client
            .put_with_attributes(&marker, body.len() as u64, &mut body, &|_| {}, || {
                Ok(attributes)
            })
            .await
            .map_err(|e| from_store(&format!("creating bucket '{bucket}'"), &e))?;
        Ok(())
    }

    /// DeleteBucket: only an empty bucket (no name under `B/` but the
    /// marker and the gateway's own, written through the gateway or
    /// not). Pending multipart uploads go with it, as in S3.
    pub(crate) async fn delete_bucket(&self, client: &Client, bucket: &str) -> S3Result<()> {
        self.bucket_exists(client, bucket).await?;
        let marker = bucket_prefix(bucket);
        let reserved = reserved_prefix(bucket);
        let holds_keys = |names: &[ListEntry]| {
            names
                .iter()
                .any(|entry| entry.name != marker && !entry.name.starts_with(&reserved))
        };
        // The first name after the marker, then the first past the
        // gateway's own names (which sort among the keys).
        for after in [String::new(), format!("{reserved}\u{10FFFF}")] {
            let (names, _) = client
                .list(&marker, &after, 2)
                .await
                .map_err(|e| from_store(&format!("listing bucket '{bucket}'"), &e))?;
            if holds_keys(&names) {
                return Err(s3(
                    S3ErrorCode::BucketNotEmpty,
                    format!("bucket '{bucket}' still holds objects; delete them first"),
                ));
            }
        }
        self.drop_reserved(client, bucket).await?;
        match client.delete(&marker).await {
            Ok(_) => Ok(()),
            Err(e) if is_missing(&e) => Err(no_such_bucket(bucket)),
            Err(e) => Err(from_store(&format!("deleting bucket '{bucket}'"), &e)),
        }
    }

    /// ListBuckets: the tenant's one bucket if made; for the admin
    /// tenant, every marker in the store, found by skipping from one
    /// bucket's names to the next (one List per bucket).
    pub(crate) async fn list_buckets(&self, client: &Client) -> S3Result<Vec<BucketInfo>> {
        let tenant = client.credential().tenant();
        if tenant != ADMIN {
            return Ok(self
                .bucket_info(client, tenant)
                .await?
                .into_iter()
                .collect());
        }
        let mut buckets = Vec::new();
        let mut after = String::new();
        loop {
            let (names, _) = client
                .list("", &after, 1)
                .await
                .map_err(|e| from_store("listing buckets", &e))?;
            let Some(entry) = names.into_iter().next() else {
                return Ok(buckets);
            };
            let bucket = entry.name.split('/').next().unwrap_or_default().to_string();
            if entry.name == bucket_prefix(&bucket) {
                if let Some(info) = self.bucket_info(client, &bucket).await? {
                    buckets.push(info);
                }
            }
            // Past every name under `bucket/` ('0' follows '/'); a name
            // with no '/' is passed over alone.
            after = if entry.name.contains('/') {
                format!("{bucket}0")
            } else {
                entry.name
            };
        }
    }

    /// A bucket's name and creation time, if its marker is there.
    async fn bucket_info(&self, client: &Client, bucket: &str) -> S3Result<Option<BucketInfo>> {
        match client.get_bytes(&bucket_prefix(bucket)).await {
            Ok((_, bytes)) => {
                let ms = std::str::from_utf8(&bytes)
                    .ok()
                    .and_then(|text| text.parse().ok())
                    .unwrap_or(0);
                Ok(Some(BucketInfo {
                    name: bucket.to_string(),
                    created: from_ms(ms),
                }))
            }
            Err(e) if is_missing(&e) => Ok(None),
            Err(e) => Err(from_store(&format!("reading bucket '{bucket}'"), &e)),
        }
    }
}

/// NoSuchBucket for `bucket`.
pub(crate) fn no_such_bucket(bucket: &str) -> s3s::S3Error {
    s3(
        S3ErrorCode::NoSuchBucket,
        format!("bucket '{bucket}' does not exist; make it with CreateBucket (aws s3 mb)"),
    )
}
