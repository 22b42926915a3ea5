//! The S3 operations s3s hands over, each turned into a call of the
//! gateway's own methods and its answer into s3s's output types. Every
//! other operation answers NotImplemented (s3s's default).

use crate::attributes::AttributesQuery;
use crate::bucket_class::{self, CLASS_HEADER};
use crate::buckets::from_ms;
use crate::checksums::{self, ChecksumRequest, KeptChecksum};
use crate::complete::ListedPart;
use crate::copies::{CopyRequest, Replacement};
use crate::errors::s3;
use crate::listing::{ListRequest, Page, Position, MAX_KEYS};
use crate::multipart::{CopySourceRef, PartTarget, MAX_LISTED};
use crate::names::ObjectMeta;
use crate::objects::{content_type, etag, last_modified, Conditions, PutRequest};
use crate::uploads::UploadsQuery;
use crate::Gateway;
use s3s::dto::*;
use s3s::{S3ErrorCode, S3Request, S3Response, S3Result, S3};
use std::sync::Arc;
use strata_store_client::client::Client;

impl Gateway {
    /// The store client of the request's tenant; anonymous requests are
    /// refused (s3s refuses them before this too).
    async fn tenant<T>(&self, request: &S3Request<T>) -> S3Result<Arc<Client>> {
        let Some(credentials) = &request.credentials else {
            return Err(s3(
                S3ErrorCode::AccessDenied,
                "anonymous requests are refused: sign requests with a tenant's access key",
            ));
        };
        self.client(&credentials.access_key).await
    }
}

/// The max-keys of a listing: S3's default and bound are 1,000.
fn max_keys(asked: Option<i32>) -> usize {
    asked.map_or(MAX_KEYS, |n| (n.max(0) as usize).min(MAX_KEYS))
}

/// The max-parts or max-uploads of a listing: S3's default and bound
/// are 1,000.
fn listed_max(asked: Option<i32>) -> usize {
    asked.map_or(MAX_LISTED, |n| (n.max(0) as usize).min(MAX_LISTED))
}

/// The bucket and key of a copy's source; versions and access points
/// are not supported.
fn copy_source(source: CopySource) -> S3Result<(String, String)> {
    match source {
        CopySource::Bucket {
            bucket,
            key,
            version_id: None,
        } => Ok((bucket.into(), key.into())),
        CopySource::Bucket { .. } => Err(s3(
            S3ErrorCode::NotImplemented,
            "objects have no versions here: name the copy source without ?versionId=",
        )),
        _ => Err(s3(
            S3ErrorCode::NotImplemented,
            "access points are not supported: name the copy source as BUCKET/KEY",
        )),
    }
}

/// An S3 listing entry.
fn object(key: String, meta: &ObjectMeta) -> Object {
    Object {
        key: Some(key),
        size: Some(meta.size as i64),
        e_tag: Some(etag(meta)),
        last_modified: Some(last_modified(meta)),
        storage_class: Some(ObjectStorageClass::from_static(
            ObjectStorageClass::STANDARD,
        )),
        ..Default::default()
    }
}

/// A page's objects and common prefixes, as s3s's lists.
fn contents(page: &Page, url: bool) -> (Vec<Object>, Vec<CommonPrefix>) {
    let objects = page
        .objects
        .iter()
        .map(|(key, meta)| object(encoded(key, url), meta))
        .collect();
    let prefixes = page
        .prefixes
        .iter()
        .map(|prefix| CommonPrefix {
            prefix: Some(encoded(prefix, url)),
        })
        .collect();
    (objects, prefixes)
}

/// Whether a listing asked for `encoding-type=url` (as the AWS SDKs and
/// aws-cli do by default): its keys, prefixes, delimiter and markers
/// are then percent-encoded in the answer, so that keys XML 1.0 cannot
/// carry (control characters) list, and the clients decode them.
fn url_encoding(encoding: &Option<EncodingType>) -> bool {
    encoding
        .as_ref()
        .is_some_and(|e| e.as_str() == EncodingType::URL)
}

/// `text` percent-encoded as S3 encodes listings (every byte but the
/// unreserved characters and `/`) when `url`, else as it is.
fn encoded(text: &str, url: bool) -> String {
    if !url {
        return text.to_string();
    }
    let mut out = String::with_capacity(text.len());
    for byte in text.bytes() {
        match byte {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' | b'/' => {
                out.push(byte as char)
            }
            _ => out.push_str(&format!("%{byte:02X}")),
        }
    }
    out
}

/// The `x-amz-checksum-*` values that an s3s input (PutObject,
/// UploadPart, CompleteMultipartUpload, a listed part) carries in its
/// five fields of the same names: s3s gives each input a type of its own.
macro_rules! claimed {
    ($input:expr) => {
        claimed_checksums([
            $input.checksum_crc32.clone(),
            $input.checksum_crc32c.clone(),
            $input.checksum_sha1.clone(),
            $input.checksum_sha256.clone(),
            $input.checksum_crc64nvme.clone(),
        ])
    };
}

/// The `x-amz-checksum-*` headers of a PutObject or UploadPart (CRC32,
/// CRC32C, SHA-1, SHA-256, CRC64NVME, in that order), to check against
/// its body.
fn claimed_checksums([crc32, crc32c, sha1, sha256, crc64nvme]: [Option<String>; 5]) -> Checksum {
    Checksum {
        checksum_crc32: crc32,
        checksum_crc32c: crc32c,
        checksum_sha1: sha1,
        checksum_sha256: sha256,
        checksum_crc64nvme: crc64nvme,
        ..Default::default()
    }
}

/// The checksum fields of a PutObject or UploadPart: its `headers`, the
/// algorithm its `x-amz-sdk-checksum-algorithm` names, and the
/// `x-amz-trailer` header with s3s's handle on the trailers of an
/// aws-chunked body.
fn checksum_request<T>(
    req: &S3Request<T>,
    headers: Checksum,
    named: Option<&ChecksumAlgorithm>,
) -> S3Result<ChecksumRequest> {
    let named = checksums::requested(named).map_err(|why| s3(S3ErrorCode::InvalidRequest, why))?;
    let trailer = req
        .headers
        .get("x-amz-trailer")
        .and_then(|value| value.to_str().ok())
        .map(str::to_string);
    Ok(ChecksumRequest {
        headers,
        named,
        trailer,
        trailing: req.trailing_headers.clone(),
    })
}

/// What a Put or UploadPart answers: the checksums claimed (checked)
/// and the one kept.
fn answered(claimed: Checksum, meta: &ObjectMeta) -> Checksum {
    let mut answer = claimed;
    if let Some(kept) = &meta.checksum {
        kept.algorithm.set(&mut answer, kept.value.clone());
    }
    answer
}

/// The checksum a Get or Head answers with `x-amz-checksum-mode:
/// ENABLED`: for the whole object, the one kept; for a `partNumber`, the
/// part's own (`part`), which describes the bytes sent; none for a
/// Range, whose bytes no kept checksum describes.
fn shown(
    mode: &Option<ChecksumMode>,
    meta: &ObjectMeta,
    ranged: bool,
    part: Option<&KeptChecksum>,
    part_asked: bool,
) -> Checksum {
    let enabled = mode
        .as_ref()
        .is_some_and(|mode| mode.as_str().eq_ignore_ascii_case(ChecksumMode::ENABLED));
    let kept = if part_asked {
        part
    } else {
        meta.checksum.as_ref()
    };
    match kept {
        Some(kept) if enabled && !ranged => kept.to_dto(),
        _ => Checksum::default(),
    }
}

#[async_trait::async_trait]
impl S3 for Gateway {
    async fn create_bucket(
        &self,
        req: S3Request<CreateBucketInput>,
    ) -> S3Result<S3Response<CreateBucketOutput>> {
        let client = self.tenant(&req).await?;
        let header = req.headers.get(CLASS_HEADER).map(|value| value.as_bytes());
        let class = bucket_class::requested(header, &client.table())?;
        self.create_bucket(&client, &req.input.bucket, class)
            .await?;
        Ok(S3Response::new(CreateBucketOutput {
            location: Some(format!("/{}", req.input.bucket)),
        }))
    }

    async fn head_bucket(
        &self,
        req: S3Request<HeadBucketInput>,
    ) -> S3Result<S3Response<HeadBucketOutput>> {
        let client = self.tenant(&req).await?;
        let class = self.bucket_class(&client, &req.input.bucket).await?;
        let mut response = S3Response::new(HeadBucketOutput::default());
        if let Some(value) = class.and_then(|class| class.to_string().parse().ok()) {
            response.headers.insert(CLASS_HEADER, value);
        }
        Ok(response)
    }

    async fn delete_bucket(
        &self,
        req: S3Request<DeleteBucketInput>,
    ) -> S3Result<S3Response<DeleteBucketOutput>> {
        let client = self.tenant(&req).await?;
        self.delete_bucket(&client, &req.input.bucket).await?;
        Ok(S3Response::new(DeleteBucketOutput::default()))
    }

    async fn list_buckets(
        &self,
        req: S3Request<ListBucketsInput>,
    ) -> S3Result<S3Response<ListBucketsOutput>> {
        let client = self.tenant(&req).await?;
        let buckets = self
            .list_buckets(&client)
            .await?
            .into_iter()
            .map(|bucket| Bucket {
                name: Some(bucket.name),
                creation_date: Some(Timestamp::from(bucket.created)),
                ..Default::default()
            })
            .collect();
        Ok(S3Response::new(ListBucketsOutput {
            buckets: Some(buckets),
            owner: Some(Owner {
                display_name: Some(client.credential().tenant().to_string()),
                id: Some(client.credential().tenant().to_string()),
            }),
            ..Default::default()
        }))
    }

    async fn put_object(
        &self,
        req: S3Request<PutObjectInput>,
    ) -> S3Result<S3Response<PutObjectOutput>> {
        let client = self.tenant(&req).await?;
        let input = &req.input;
        let headers = claimed!(input);
        let echo = headers.clone();
        let checksums = checksum_request(&req, headers, input.checksum_algorithm.as_ref())?;
        let input = req.input;
        let request = PutRequest {
            bucket: input.bucket,
            key: input.key,
            body: input.body,
            content_length: input.content_length,
            content_md5: input.content_md5,
            content_type: input.content_type,
            metadata: input.metadata.unwrap_or_default().into_iter().collect(),
            checksums: checksums.claims(None),
        };
        let meta = self.put_object(&client, request).await?;
        // The checksums given, checked against the body, are echoed as
        // S3 does, with the one kept.
        let echo = answered(echo, &meta);
        Ok(S3Response::new(PutObjectOutput {
            e_tag: Some(etag(&meta)),
            checksum_crc32: echo.checksum_crc32,
            checksum_crc32c: echo.checksum_crc32c,
            checksum_sha1: echo.checksum_sha1,
            checksum_sha256: echo.checksum_sha256,
            checksum_crc64nvme: echo.checksum_crc64nvme,
            checksum_type: meta
                .checksum
                .as_ref()
                .and_then(|kept| kept.to_dto().checksum_type),
            ..Default::default()
        }))
    }

    async fn copy_object(
        &self,
        req: S3Request<CopyObjectInput>,
    ) -> S3Result<S3Response<CopyObjectOutput>> {
        let client = self.tenant(&req).await?;
        let input = req.input;
        let (source_bucket, source_key) = copy_source(input.copy_source)?;
        let replace = input
            .metadata_directive
            .as_ref()
            .is_some_and(|directive| directive.as_str() == MetadataDirective::REPLACE);
        let request = CopyRequest {
            source_bucket,
            source_key,
            bucket: input.bucket,
            key: input.key,
            replacement: replace.then(|| Replacement {
                content_type: input.content_type,
                metadata: input.metadata.unwrap_or_default().into_iter().collect(),
            }),
            conditions: Conditions {
                if_match: input.copy_source_if_match,
                if_none_match: input.copy_source_if_none_match,
                if_modified_since: input.copy_source_if_modified_since,
                if_unmodified_since: input.copy_source_if_unmodified_since,
            },
        };
        let meta = self.copy_object(&client, &request).await?;
        Ok(S3Response::new(CopyObjectOutput {
            copy_object_result: Some(CopyObjectResult {
                e_tag: Some(etag(&meta)),
                last_modified: Some(last_modified(&meta)),
                ..Default::default()
            }),
            ..Default::default()
        }))
    }

    async fn get_object(
        &self,
        req: S3Request<GetObjectInput>,
    ) -> S3Result<S3Response<GetObjectOutput>> {
        let client = self.tenant(&req).await?;
        let input = req.input;
        let conditions = Conditions {
            if_match: input.if_match,
            if_none_match: input.if_none_match,
            if_modified_since: input.if_modified_since,
            if_unmodified_since: input.if_unmodified_since,
        };
        let read = self
            .get_object(
                &client,
                &input.bucket,
                &input.key,
                &conditions,
                input.range.as_ref(),
                input.part_number,
            )
            .await?;
        let meta = &read.meta;
        let checksum = shown(
            &input.checksum_mode,
            meta,
            input.range.is_some(),
            read.part_checksum.as_ref(),
            input.part_number.is_some(),
        );
        let mut response = S3Response::new(GetObjectOutput {
            checksum_crc32: checksum.checksum_crc32,
            checksum_crc32c: checksum.checksum_crc32c,
            checksum_sha1: checksum.checksum_sha1,
            checksum_sha256: checksum.checksum_sha256,
            checksum_crc64nvme: checksum.checksum_crc64nvme,
            checksum_type: checksum.checksum_type,
            content_length: Some(read.length as i64),
            content_range: read.content_range.clone(),
            parts_count: read.parts_count.map(|n| n as i32),
            accept_ranges: Some("bytes".into()),
            e_tag: Some(etag(meta)),
            last_modified: Some(last_modified(meta)),
            content_type: Some(content_type(meta)),
            metadata: (!meta.metadata.is_empty())
                .then(|| meta.metadata.clone().into_iter().collect()),
            body: Some(read.body),
            ..Default::default()
        });
        if let Some(region) = read.region {
            response.extensions.insert(crate::front::SendFile(region));
        }
        Ok(response)
    }

    async fn head_object(
        &self,
        req: S3Request<HeadObjectInput>,
    ) -> S3Result<S3Response<HeadObjectOutput>> {
        let client = self.tenant(&req).await?;
        let input = req.input;
        let conditions = Conditions {
            if_match: input.if_match,
            if_none_match: input.if_none_match,
            if_modified_since: input.if_modified_since,
            if_unmodified_since: input.if_unmodified_since,
        };
        let (meta, part) = self
            .head_object(
                &client,
                &input.bucket,
                &input.key,
                &conditions,
                input.part_number,
            )
            .await?;
        let length = part
            .as_ref()
            .map_or(meta.size, |p| p.span.end - p.span.start);
        let part_checksum = part.as_ref().and_then(|p| p.checksum.as_ref());
        let checksum = shown(
            &input.checksum_mode,
            &meta,
            false,
            part_checksum,
            part.is_some(),
        );
        Ok(S3Response::new(HeadObjectOutput {
            checksum_crc32: checksum.checksum_crc32,
            checksum_crc32c: checksum.checksum_crc32c,
            checksum_sha1: checksum.checksum_sha1,
            checksum_sha256: checksum.checksum_sha256,
            checksum_crc64nvme: checksum.checksum_crc64nvme,
            checksum_type: checksum.checksum_type,
            content_length: Some(length as i64),
            content_range: part.as_ref().and_then(|p| p.content_range(meta.size)),
            parts_count: part.as_ref().map(|p| p.parts as i32),
            accept_ranges: Some("bytes".into()),
            e_tag: Some(etag(&meta)),
            last_modified: Some(last_modified(&meta)),
            content_type: Some(content_type(&meta)),
            metadata: (!meta.metadata.is_empty()).then(|| meta.metadata.into_iter().collect()),
            ..Default::default()
        }))
    }

    async fn get_object_attributes(
        &self,
        req: S3Request<GetObjectAttributesInput>,
    ) -> S3Result<S3Response<GetObjectAttributesOutput>> {
        let client = self.tenant(&req).await?;
        let input = &req.input;
        if input.version_id.is_some() {
            return Err(s3(
                S3ErrorCode::NotImplemented,
                "objects have no versions here: ask without versionId",
            ));
        }
        let query = AttributesQuery {
            bucket: &input.bucket,
            key: &input.key,
            wanted: &input.object_attributes,
            part_marker: u32::try_from(input.part_number_marker.unwrap_or(0)).unwrap_or(0),
            max_parts: listed_max(input.max_parts),
        };
        let output = self.object_attributes(&client, &query).await?;
        Ok(S3Response::new(output))
    }

    async fn delete_object(
        &self,
        req: S3Request<DeleteObjectInput>,
    ) -> S3Result<S3Response<DeleteObjectOutput>> {
        let client = self.tenant(&req).await?;
        self.delete_object(&client, &req.input.bucket, &req.input.key)
            .await?;
        Ok(S3Response::new(DeleteObjectOutput::default()))
    }

    async fn delete_objects(
        &self,
        req: S3Request<DeleteObjectsInput>,
    ) -> S3Result<S3Response<DeleteObjectsOutput>> {
        let client = self.tenant(&req).await?;
        let input = req.input;
        self.bucket_exists(&client, &input.bucket).await?;
        let quiet = input.delete.quiet.unwrap_or(false);
        let (mut deleted, mut errors) = (Vec::new(), Vec::new());
        for object in input.delete.objects {
            match self
                .delete_object(&client, &input.bucket, &object.key)
                .await
            {
                Ok(()) if quiet => {}
                Ok(()) => deleted.push(DeletedObject {
                    key: Some(object.key),
                    ..Default::default()
                }),
                Err(e) => errors.push(Error {
                    code: Some(e.code().as_str().to_string()),
                    message: e.message().map(str::to_string),
                    key: Some(object.key),
                    ..Default::default()
                }),
            }
        }
        Ok(S3Response::new(DeleteObjectsOutput {
            deleted: Some(deleted),
            errors: (!errors.is_empty()).then_some(errors),
            ..Default::default()
        }))
    }

    async fn list_objects_v2(
        &self,
        req: S3Request<ListObjectsV2Input>,
    ) -> S3Result<S3Response<ListObjectsV2Output>> {
        let client = self.tenant(&req).await?;
        let input = req.input;
        let after = match (&input.continuation_token, &input.start_after) {
            (Some(token), _) => Some(Position::from_token(token)?),
            (None, Some(key)) => Some(Position::Key(key.clone())),
            (None, None) => None,
        };
        let request = ListRequest {
            bucket: input.bucket.clone(),
            prefix: input.prefix.clone().unwrap_or_default(),
            delimiter: input.delimiter.clone(),
            after,
            max_keys: max_keys(input.max_keys),
        };
        let page = self.list_objects(&client, request).await?;
        let url = url_encoding(&input.encoding_type);
        let (objects, prefixes) = contents(&page, url);
        let encode = |text: Option<String>| text.map(|t| encoded(&t, url));
        Ok(S3Response::new(ListObjectsV2Output {
            name: Some(input.bucket),
            // As S3 and RGW answer: the prefix always (empty when none
            // was given), the delimiter only when there is one.
            prefix: encode(Some(input.prefix.unwrap_or_default())),
            delimiter: encode(input.delimiter.filter(|d| !d.is_empty())),
            max_keys: Some(max_keys(input.max_keys) as i32),
            key_count: Some((objects.len() + prefixes.len()) as i32),
            continuation_token: input.continuation_token,
            start_after: encode(input.start_after),
            is_truncated: Some(page.truncated),
            next_continuation_token: page
                .last
                .as_ref()
                .filter(|_| page.truncated)
                .map(Position::token),
            contents: Some(objects),
            common_prefixes: Some(prefixes),
            encoding_type: input.encoding_type,
            ..Default::default()
        }))
    }

    async fn list_objects(
        &self,
        req: S3Request<ListObjectsInput>,
    ) -> S3Result<S3Response<ListObjectsOutput>> {
        let client = self.tenant(&req).await?;
        let input = req.input;
        let request = ListRequest {
            bucket: input.bucket.clone(),
            prefix: input.prefix.clone().unwrap_or_default(),
            delimiter: input.delimiter.clone(),
            after: input.marker.clone().map(Position::Key),
            max_keys: max_keys(input.max_keys),
        };
        let page = self.list_objects(&client, request).await?;
        let url = url_encoding(&input.encoding_type);
        let (objects, prefixes) = contents(&page, url);
        let encode = |text: Option<String>| text.map(|t| encoded(&t, url));
        Ok(S3Response::new(ListObjectsOutput {
            name: Some(input.bucket),
            // As S3 and RGW answer: the prefix always (empty when none
            // was given), the delimiter only when there is one.
            prefix: encode(Some(input.prefix.unwrap_or_default())),
            delimiter: encode(input.delimiter.filter(|d| !d.is_empty())),
            marker: encode(input.marker),
            max_keys: Some(max_keys(input.max_keys) as i32),
            is_truncated: Some(page.truncated),
            next_marker: page
                .last
                .as_ref()
                .filter(|_| page.truncated)
                .map(|last| encoded(last.text(), url)),
            contents: Some(objects),
            common_prefixes: Some(prefixes),
            encoding_type: input.encoding_type,
            ..Default::default()
        }))
    }

    async fn create_multipart_upload(
        &self,
        req: S3Request<CreateMultipartUploadInput>,
    ) -> S3Result<S3Response<CreateMultipartUploadOutput>> {
        let client = self.tenant(&req).await?;
        let input = req.input;
        let metadata = input.metadata.unwrap_or_default().into_iter().collect();
        let algorithm = checksums::requested(input.checksum_algorithm.as_ref())
            .map_err(|why| s3(S3ErrorCode::InvalidRequest, why))?;
        let full_object = checksums::full_object_requested(algorithm, input.checksum_type.as_ref())
            .map_err(|why| s3(S3ErrorCode::InvalidRequest, why))?;
        let at = (input.bucket.as_str(), input.key.as_str());
        let upload = self
            .create_upload(
                &client,
                at,
                input.content_type,
                metadata,
                algorithm,
                full_object,
            )
            .await?;
        Ok(S3Response::new(CreateMultipartUploadOutput {
            bucket: Some(input.bucket),
            key: Some(input.key),
            upload_id: Some(upload),
            checksum_algorithm: algorithm
                .map(|algorithm| ChecksumAlgorithm::from(algorithm.name().to_string())),
            checksum_type: algorithm.map(|_| {
                ChecksumType::from_static(if full_object {
                    ChecksumType::FULL_OBJECT
                } else {
                    ChecksumType::COMPOSITE
                })
            }),
            ..Default::default()
        }))
    }

    async fn upload_part(
        &self,
        req: S3Request<UploadPartInput>,
    ) -> S3Result<S3Response<UploadPartOutput>> {
        let client = self.tenant(&req).await?;
        let input = &req.input;
        let headers = claimed!(input);
        let echo = headers.clone();
        let checksums = checksum_request(&req, headers, input.checksum_algorithm.as_ref())?;
        let input = req.input;
        let target = PartTarget {
            bucket: input.bucket,
            key: input.key,
            upload: input.upload_id,
            number: input.part_number,
        };
        let declared = (input.content_length, input.content_md5.as_deref());
        let meta = self
            .upload_part(&client, &target, input.body, declared, checksums)
            .await?;
        let echo = answered(echo, &meta);
        Ok(S3Response::new(UploadPartOutput {
            e_tag: Some(etag(&meta)),
            checksum_crc32: echo.checksum_crc32,
            checksum_crc32c: echo.checksum_crc32c,
            checksum_sha1: echo.checksum_sha1,
            checksum_sha256: echo.checksum_sha256,
            checksum_crc64nvme: echo.checksum_crc64nvme,
            ..Default::default()
        }))
    }

    async fn upload_part_copy(
        &self,
        req: S3Request<UploadPartCopyInput>,
    ) -> S3Result<S3Response<UploadPartCopyOutput>> {
        let client = self.tenant(&req).await?;
        let input = req.input;
        let (source_bucket, source_key) = copy_source(input.copy_source)?;
        let conditions = Conditions {
            if_match: input.copy_source_if_match,
            if_none_match: input.copy_source_if_none_match,
            if_modified_since: input.copy_source_if_modified_since,
            if_unmodified_since: input.copy_source_if_unmodified_since,
        };
        let source = CopySourceRef {
            bucket: &source_bucket,
            key: &source_key,
            range: input.copy_source_range.as_deref(),
            conditions: &conditions,
        };
        let target = PartTarget {
            bucket: input.bucket,
            key: input.key,
            upload: input.upload_id,
            number: input.part_number,
        };
        let meta = self.upload_part_copy(&client, &target, &source).await?;
        let checksum = answered(Checksum::default(), &meta);
        Ok(S3Response::new(UploadPartCopyOutput {
            copy_part_result: Some(CopyPartResult {
                e_tag: Some(etag(&meta)),
                last_modified: Some(last_modified(&meta)),
                checksum_crc32: checksum.checksum_crc32,
                checksum_crc32c: checksum.checksum_crc32c,
                checksum_sha1: checksum.checksum_sha1,
                checksum_sha256: checksum.checksum_sha256,
                checksum_crc64nvme: checksum.checksum_crc64nvme,
            }),
            ..Default::default()
        }))
    }

    async fn complete_multipart_upload(
        &self,
        req: S3Request<CompleteMultipartUploadInput>,
    ) -> S3Result<S3Response<CompleteMultipartUploadOutput>> {
        let client = self.tenant(&req).await?;
        let input = req.input;
        let listed: Vec<ListedPart> = input
            .multipart_upload
            .and_then(|upload| upload.parts)
            .unwrap_or_default()
            .into_iter()
            .map(|part| ListedPart {
                number: part.part_number.unwrap_or(0),
                etag: part.e_tag.map(|tag| tag.value().to_string()),
                checksums: claimed!(part),
            })
            .collect();
        let claimed = claimed!(input);
        let at = (input.bucket.as_str(), input.key.as_str());
        let meta = self
            .complete_upload(&client, at, &input.upload_id, &listed, &claimed)
            .await?;
        let checksum = meta
            .checksum
            .as_ref()
            .map(|kept| kept.to_dto())
            .unwrap_or_default();
        Ok(S3Response::new(CompleteMultipartUploadOutput {
            location: Some(format!("/{}/{}", input.bucket, input.key)),
            bucket: Some(input.bucket),
            key: Some(input.key),
            e_tag: Some(etag(&meta)),
            checksum_crc32: checksum.checksum_crc32,
            checksum_crc32c: checksum.checksum_crc32c,
            checksum_sha1: checksum.checksum_sha1,
            checksum_sha256: checksum.checksum_sha256,
            checksum_crc64nvme: checksum.checksum_crc64nvme,
            checksum_type: checksum.checksum_type,
            ..Default::default()
        }))
    }

    async fn abort_multipart_upload(
        &self,
        req: S3Request<AbortMultipartUploadInput>,
    ) -> S3Result<S3Response<AbortMultipartUploadOutput>> {
        let client = self.tenant(&req).await?;
        let input = &req.input;
        self.abort_upload(&client, &input.bucket, &input.key, &input.upload_id)
            .await?;
        Ok(S3Response::new(AbortMultipartUploadOutput::default()))
    }

    async fn list_parts(
        &self,
        req: S3Request<ListPartsInput>,
    ) -> S3Result<S3Response<ListPartsOutput>> {
        let client = self.tenant(&req).await?;
        let input = req.input;
        let max = listed_max(input.max_parts);
        let after = u32::try_from(input.part_number_marker.unwrap_or(0).max(0)).unwrap_or(0);
        // One more than asked tells whether the listing is truncated.
        let at = (input.bucket.as_str(), input.key.as_str());
        let mut parts = self
            .list_parts(&client, at, &input.upload_id, after, max + 1)
            .await?;
        let truncated = parts.len() > max;
        parts.truncate(max);
        let next = parts
            .last()
            .filter(|_| truncated)
            .map(|part| part.number as i32);
        let parts = parts
            .into_iter()
            .map(|part| {
                let checksum = answered(Checksum::default(), &part.meta);
                Part {
                    part_number: Some(part.number as i32),
                    size: Some(part.size as i64),
                    e_tag: Some(etag(&part.meta)),
                    last_modified: Some(last_modified(&part.meta)),
                    checksum_crc32: checksum.checksum_crc32,
                    checksum_crc32c: checksum.checksum_crc32c,
                    checksum_sha1: checksum.checksum_sha1,
                    checksum_sha256: checksum.checksum_sha256,
                    checksum_crc64nvme: checksum.checksum_crc64nvme,
                }
            })
            .collect();
        Ok(S3Response::new(ListPartsOutput {
            bucket: Some(input.bucket),
            key: Some(input.key),
            upload_id: Some(input.upload_id),
            max_parts: Some(max as i32),
            part_number_marker: input.part_number_marker,
            next_part_number_marker: next,
            is_truncated: Some(truncated),
            parts: Some(parts),
            storage_class: Some(StorageClass::from_static(StorageClass::STANDARD)),
            ..Default::default()
        }))
    }

    async fn list_multipart_uploads(
        &self,
        req: S3Request<ListMultipartUploadsInput>,
    ) -> S3Result<S3Response<ListMultipartUploadsOutput>> {
        let client = self.tenant(&req).await?;
        let input = req.input;
        let max = listed_max(input.max_uploads);
        let query = UploadsQuery {
            prefix: input.prefix.as_deref().unwrap_or_default(),
            delimiter: input.delimiter.as_deref(),
            key_marker: input.key_marker.as_deref(),
            upload_marker: input.upload_id_marker.as_deref(),
            max,
        };
        let page = self.list_uploads(&client, &input.bucket, &query).await?;
        let (next_key, next_upload) = page.next_markers().unzip();
        let uploads = page
            .uploads()
            .map(|(key, upload, started)| MultipartUpload {
                key: Some(key.to_string()),
                upload_id: Some(upload.to_string()),
                initiated: Some(Timestamp::from(from_ms(started))),
                storage_class: Some(StorageClass::from_static(StorageClass::STANDARD)),
                ..Default::default()
            })
            .collect();
        let prefixes = page
            .prefixes()
            .map(|prefix| CommonPrefix {
                prefix: Some(prefix.to_string()),
            })
            .collect();
        Ok(S3Response::new(ListMultipartUploadsOutput {
            bucket: Some(input.bucket),
            prefix: input.prefix,
            delimiter: input.delimiter,
            key_marker: input.key_marker,
            upload_id_marker: input.upload_id_marker,
            max_uploads: Some(max as i32),
            is_truncated: Some(page.truncated),
            next_key_marker: next_key,
            next_upload_id_marker: next_upload.flatten(),
            uploads: Some(uploads),
            common_prefixes: Some(prefixes),
            ..Default::default()
        }))
    }
}
