//! GetObjectAttributes: an object's ETag, checksum, size, storage class
//! and, for a multipart object, its parts (with their sizes and
//! checksums, from its manifest), each only when asked.

use crate::checksums::Algorithm;
use crate::errors::{from_store, s3};
use crate::multipart::MAX_LISTED;
use crate::objects::{etag, last_modified, meta_of};
use crate::parts::{read_manifest, PartRef};
use crate::Gateway;
use s3s::dto::{
    Checksum, GetObjectAttributesOutput, GetObjectAttributesParts, ObjectAttributes, ObjectPart,
    StorageClass,
};
use s3s::{S3ErrorCode, S3Result};
use strata_store_client::client::Client;

/// What a GetObjectAttributes asks.
pub(crate) struct AttributesQuery<'a> {
    /// The object's bucket.
    pub bucket: &'a str,
    /// The object's key.
    pub key: &'a str,
    /// The attributes wanted (`ETag`, `Checksum`, `ObjectParts`,
    /// `StorageClass`, `ObjectSize`).
    pub wanted: &'a [ObjectAttributes],
    /// The parts listed start after this part number.
    pub part_marker: u32,
    /// Most parts listed (at most 1,000).
    pub max_parts: usize,
}

impl Gateway {
    /// GetObjectAttributes: the attributes `query` asks of the object.
    pub(crate) async fn object_attributes(
        &self,
        client: &Client,
        query: &AttributesQuery<'_>,
    ) -> S3Result<GetObjectAttributesOutput> {
        // One header may list several, comma-separated (as botocore
        // sends them), or several headers one each.
        let wants = |name: &str| {
            query
                .wanted
                .iter()
                .flat_map(|asked| asked.as_str().split(','))
                .any(|asked| asked.trim() == name)
        };
        if query.wanted.is_empty() {
            return Err(s3(
                S3ErrorCode::InvalidArgument,
                "GetObjectAttributes names no attribute: ask for ETag, Checksum, ObjectParts, \
                 StorageClass or ObjectSize",
            ));
        }
        let opened = self.find(client, query.bucket, query.key).await?;
        let meta = meta_of(&opened);
        let mut output = GetObjectAttributesOutput {
            last_modified: Some(last_modified(&meta)),
            ..Default::default()
        };
        if wants(ObjectAttributes::ETAG) {
            output.e_tag = Some(etag(&meta));
        }
        if wants(ObjectAttributes::CHECKSUM) {
            output.checksum = meta.checksum.as_ref().map(|kept| kept.to_dto());
        }
        if wants(ObjectAttributes::OBJECT_SIZE) {
            output.object_size = Some(meta.size as i64);
        }
        if wants(ObjectAttributes::STORAGE_CLASS) {
            output.storage_class = Some(StorageClass::from_static(StorageClass::STANDARD));
        }
        if wants(ObjectAttributes::OBJECT_PARTS) && meta.multipart.is_some() {
            let manifest = read_manifest(client, &opened).await.map_err(|e| {
                let what = format!("reading the parts of '{}/{}'", query.bucket, query.key);
                from_store(&what, &e)
            })?;
            let algorithm = meta.checksum.as_ref().map(|kept| kept.algorithm);
            output.object_parts = Some(parts_page(&manifest.parts, query, algorithm));
        }
        Ok(output)
    }
}

/// The page of a manifest's `parts` the query asks (after its marker, at
/// most its maximum), each with its checksum of `algorithm`.
fn parts_page(
    parts: &[PartRef],
    query: &AttributesQuery<'_>,
    algorithm: Option<Algorithm>,
) -> GetObjectAttributesParts {
    let max = query.max_parts.min(MAX_LISTED);
    let after: Vec<&PartRef> = parts
        .iter()
        .filter(|part| part.number > query.part_marker)
        .collect();
    let truncated = after.len() > max;
    let page: Vec<ObjectPart> = after
        .iter()
        .take(max)
        .map(|part| {
            let mut checksum = Checksum::default();
            if let (Some(algorithm), Some(value)) = (algorithm, &part.checksum) {
                algorithm.set(&mut checksum, value.clone());
            }
            ObjectPart {
                part_number: Some(part.number as i32),
                size: Some(part.size as i64),
                checksum_crc32: checksum.checksum_crc32,
                checksum_crc32c: checksum.checksum_crc32c,
                checksum_sha1: checksum.checksum_sha1,
                checksum_sha256: checksum.checksum_sha256,
                checksum_crc64nvme: checksum.checksum_crc64nvme,
            }
        })
        .collect();
    let next = page
        .last()
        .filter(|_| truncated)
        .and_then(|part| part.part_number);
    GetObjectAttributesParts {
        total_parts_count: Some(parts.len() as i32),
        part_number_marker: Some(query.part_marker as i32),
        next_part_number_marker: next,
        max_parts: Some(max as i32),
        is_truncated: Some(truncated),
        parts: Some(page),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn part(number: u32, checksum: Option<&str>) -> PartRef {
        PartRef {
            number,
            size: u64::from(number) * 10,
            version: 1,
            etag: "0".repeat(32),
            attempt: None,
            checksum: checksum.map(str::to_string),
        }
    }

    #[test]
    fn parts_come_a_page_at_a_time_with_their_checksums() {
        let parts = [
            part(1, Some("AAAAAA==")),
            part(2, None),
            part(3, Some("AQIDBA==")),
        ];
        let query = |part_marker, max_parts| AttributesQuery {
            bucket: "b",
            key: "k",
            wanted: &[],
            part_marker,
            max_parts,
        };
        let page = parts_page(&parts, &query(0, 2), Some(Algorithm::Crc32c));
        let listed = page.parts.unwrap();
        assert_eq!(listed.len(), 2);
        assert_eq!(listed[0].checksum_crc32c.as_deref(), Some("AAAAAA=="));
        assert_eq!(listed[1].checksum_crc32c, None);
        assert_eq!(page.is_truncated, Some(true));
        assert_eq!(page.next_part_number_marker, Some(2));
        assert_eq!(page.total_parts_count, Some(3));
        let rest = parts_page(&parts, &query(2, 2), Some(Algorithm::Crc32c));
        let listed = rest.parts.unwrap();
        assert_eq!(listed.len(), 1);
        assert_eq!((listed[0].part_number, listed[0].size), (Some(3), Some(30)));
        assert_eq!(
            (rest.is_truncated, rest.next_part_number_marker),
            (Some(false), None)
        );
        // Without an algorithm the object keeps no checksum: none shown.
        let plain = parts_page(&parts, &query(0, 5), None);
        assert!(plain
            .parts
            .unwrap()
            .iter()
            .all(|p| p.checksum_crc32c.is_none()));
    }
}
