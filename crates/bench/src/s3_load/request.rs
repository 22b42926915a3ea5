//! The requests of a run: the endpoint, the shared PUT body and its
//! SHA-256, and each request signed with AWS Signature V4 (`aws-sigv4`).

use std::time::SystemTime;

use aws_sigv4::http_request::{
    sign, PayloadChecksumKind, PercentEncodingMode, SignableBody, SignableRequest, SigningSettings,
    UriPathNormalizationMode,
};
use aws_sigv4::sign::v4;
use bytes::Bytes;
use http_body_util::Full;
use sha2::{Digest, Sha256};

use super::{object_byte, object_key, LoadOptions, Operation};
use crate::error::{Error, Result};

/// An S3 key pair and the region it signs for.
#[derive(Clone, Debug)]
pub struct Credentials {
    /// The access key id.
    pub access_key: String,
    /// The secret key.
    pub secret_key: String,
    /// The region in the signature's scope (`us-east-1` when a server
    /// has no regions).
    pub region: String,
}

/// Where requests go: `http://HOST:PORT`.
#[derive(Clone, Debug)]
pub struct Endpoint {
    /// The host as given (a name or an IP address).
    pub host: String,
    /// The TCP port.
    pub port: u16,
}

impl Endpoint {
    /// Parses `http://HOST:PORT` (a trailing `/` allowed); refuses TLS,
    /// paths and a missing port, each with what to give instead.
    pub fn parse(text: &str) -> Result<Endpoint> {
        let refuse = |why: &str| {
            Err(Error::Argument(format!(
                "--endpoint {text:?}: {why}; give http://HOST:PORT, such as http://127.0.0.1:9000"
            )))
        };
        let Some(rest) = text.strip_prefix("http://") else {
            return refuse("only http:// is supported (no TLS)");
        };
        let authority = rest.strip_suffix('/').unwrap_or(rest);
        if authority.contains('/') || authority.contains('?') {
            return refuse("a path or query is not allowed (the bucket is --bucket)");
        }
        let Ok(uri) = authority.parse::<http::uri::Authority>() else {
            return refuse("the host and port do not parse");
        };
        let Some(port) = uri.port_u16() else {
            return refuse("the port is missing");
        };
        if uri.host().is_empty() {
            return refuse("the host is missing");
        }
        Ok(Endpoint {
            host: uri.host().to_string(),
            port,
        })
    }

    /// The `Host` header's value.
    pub fn authority(&self) -> String {
        format!("{}:{}", self.host, self.port)
    }
}

/// What every request of a run shares: built once, then each request is a
/// key and a fresh signature.
pub struct Plan {
    authority: String,
    pub(super) operation: Operation,
    pub(super) size_bytes: u64,
    pub(super) objects: usize,
    bucket: String,
    key_prefix: String,
    credentials: Option<aws_credential_types::Credentials>,
    region: String,
    /// The PUT body (the same bytes for every object).
    body: Bytes,
    /// Its SHA-256 in hex, as `x-amz-content-sha256` carries it.
    body_sha256: String,
    /// The SHA-256 of an empty payload, for GETs.
    empty_sha256: String,
}

impl Plan {
    /// The shared parts of `options`' requests (options already checked).
    pub fn new(options: &LoadOptions, endpoint: Endpoint) -> Plan {
        let body: Bytes = if options.operation == Operation::Put || options.prepare {
            (0..options.size_bytes)
                .map(object_byte)
                .collect::<Vec<u8>>()
                .into()
        } else {
            Bytes::new()
        };
        Plan {
            authority: endpoint.authority(),
            operation: options.operation,
            size_bytes: options.size_bytes,
            objects: options.objects,
            bucket: options.bucket.clone(),
            key_prefix: options.key_prefix.clone(),
            credentials: options.credentials.as_ref().map(|c| {
                aws_credential_types::Credentials::new(
                    &c.access_key,
                    &c.secret_key,
                    None,
                    None,
                    "strata-bench",
                )
            }),
            region: options
                .credentials
                .as_ref()
                .map_or_else(String::new, |c| c.region.clone()),
            body_sha256: hex(&Sha256::digest(&body)),
            empty_sha256: hex(&Sha256::digest([])),
            body,
        }
    }

    /// The request for object `index`, doing `operation`, signed when
    /// the run has credentials.
    pub fn request(
        &self,
        operation: Operation,
        index: usize,
    ) -> std::result::Result<http::Request<Full<Bytes>>, String> {
        let path = format!("/{}/{}", self.bucket, object_key(&self.key_prefix, index));
        let (body, payload_sha256) = match operation {
            Operation::Get => (Bytes::new(), &self.empty_sha256),
            Operation::Put => (self.body.clone(), &self.body_sha256),
        };
        let mut request = http::Request::builder()
            .method(operation.method())
            .uri(&path)
            .header(http::header::HOST, &self.authority)
            .body(Full::new(body))
            .map_err(|error| format!("cannot build the request for {path}: {error}"))?;
        if operation == Operation::Put {
            request.headers_mut().insert(
                http::header::CONTENT_LENGTH,
                http::HeaderValue::from(self.size_bytes),
            );
        }
        if let Some(credentials) = &self.credentials {
            self.sign(&mut request, credentials, &path, payload_sha256)?;
        }
        Ok(request)
    }

    /// Signs as aws-cli does over plain HTTP: the payload's SHA-256 in
    /// `x-amz-content-sha256`, `host`, `x-amz-content-sha256` and
    /// `x-amz-date` signed, the path encoded once and not normalized.
    fn sign(
        &self,
        request: &mut http::Request<Full<Bytes>>,
        credentials: &aws_credential_types::Credentials,
        path: &str,
        payload_sha256: &str,
    ) -> std::result::Result<(), String> {
        let mut settings = SigningSettings::default();
        settings.payload_checksum_kind = PayloadChecksumKind::XAmzSha256;
        settings.percent_encoding_mode = PercentEncodingMode::Single;
        settings.uri_path_normalization_mode = UriPathNormalizationMode::Disabled;
        let identity = credentials.clone().into();
        let params = v4::SigningParams::builder()
            .identity(&identity)
            .region(&self.region)
            .name("s3")
            .time(SystemTime::now())
            .settings(settings)
            .build()
            .map_err(|error| format!("cannot set up the signature: {error}"))?
            .into();
        let url = format!("http://{}{path}", self.authority);
        let signable = SignableRequest::new(
            request.method().as_str(),
            url.as_str(),
            [("host", self.authority.as_str())].into_iter(),
            SignableBody::Precomputed(payload_sha256.to_string()),
        )
        .map_err(|error| format!("cannot sign {path}: {error}"))?;
        let (instructions, _signature) = sign(signable, &params)
            .map_err(|error| format!("cannot sign {path}: {error}"))?
            .into_parts();
        instructions.apply_to_request_http1x(request);
        Ok(())
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
