//! The HTTP JSON control API (documented in `docs/openapi/volume.yaml`).
//!
//! Every error is a JSON object `{"error": "..."}` with a 4xx status for a
//! bad request and 5xx for a failure of the service; answers axum or hyper
//! would give with a plain-text or empty body (405, a rejected path) are
//! rewritten into that form too. Failures of the service are logged with
//! their file paths and sent without them.
//!
//! Every route but `GET /metrics` and `GET /health` needs
//! `Authorization: Bearer TOKEN` unless the daemon runs with
//! `--insecure-local` ([`ApiConfig::token`]).
//! Request bodies are read whole, at most [`MAX_BODY_BYTES`], within
//! [`ApiConfig::body_timeout`], before a handler runs. Service calls block
//! (file syncs, catalog commits), so they run on tokio's blocking pool.

use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body as HttpBody, Bytes};
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, Request, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::middleware::{from_fn, from_fn_with_state, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::auth::ApiToken;
use crate::error::VolumeError;
use crate::service::Service;

/// Largest request body accepted, in bytes.
pub const MAX_BODY_BYTES: usize = 64 * 1024;

/// `POST /v1/volumes`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateVolume {
    /// Volume name.
    pub name: String,
    /// Size in bytes.
    pub size: u64,
    /// Cluster size of its layers in bytes (default: the daemon's
    /// `--cluster-size`).
    #[serde(default)]
    pub cluster_size: Option<u64>,
    /// Extended L2 entries in its layers (default: the daemon's
    /// `--extended-l2`, where the cluster size allows them).
    #[serde(default)]
    pub extended_l2: Option<bool>,
}

/// `POST /v1/volumes/{name}/resize`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ResizeVolume {
    /// New size in bytes (not smaller than the current one).
    pub size: u64,
}

/// `POST /v1/volumes/{name}/snapshots` and the clone route.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Named {
    /// Name of the snapshot or of the new volume.
    pub name: String,
}

/// `POST /v1/volumes/{name}/snapshots`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SnapshotRequest {
    /// Name of the snapshot.
    pub name: String,
    /// Return only once the snapshot's layer is durable (default: it
    /// becomes durable with the volume's next flush, or within the
    /// daemon's `--durable-within`).
    #[serde(default)]
    pub sync: bool,
}

/// What the API needs besides the service: who may call it, how long a
/// request body may take.
#[derive(Debug, Clone)]
pub struct ApiConfig {
    /// The bearer token every request but `GET /metrics` must carry;
    /// `None` (`--insecure-local`) lets every request in.
    pub token: Option<ApiToken>,
    /// Longest time a client may take to send a request's body.
    pub body_timeout: Duration,
}

/// Default of [`ApiConfig::body_timeout`].
pub const DEFAULT_BODY_TIMEOUT: Duration = Duration::from_secs(10);

/// How a client gets the token, said in every 401.
const TOKEN_HINT: &str = "send `Authorization: Bearer TOKEN`, where TOKEN is the content of \
     the file api.token in the daemon's pool directory (readable by the daemon's user only); \
     `strata volume` and `strata snapshot` read it by themselves (--pool, --token-file, \
     STRATA_TOKEN or STRATA_TOKEN_FILE)";

/// An API error: status and message, rendered as `{"error": message}`.
#[derive(Debug)]
pub struct ApiError(StatusCode, String);

impl ApiError {
    /// An error of the service, as a client sees it: logged whole here,
    /// sent without the pool's paths.
    fn from_service(service: &Service, error: VolumeError) -> ApiError {
        let status =
            StatusCode::from_u16(error.status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        if status.is_server_error() {
            tracing::error!(status = status.as_u16(), "API request failed: {error}");
        } else {
            tracing::debug!(status = status.as_u16(), "API request refused: {error}");
        }
        ApiError(status, error.public_message(&service.config.pool))
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        error_response(self.0, self.1)
    }
}

/// `{"error": message}` with `status`.
fn error_response(status: StatusCode, message: String) -> Response {
    #[derive(Serialize)]
    struct ErrorBody {
        error: String,
    }
    (status, Json(ErrorBody { error: message })).into_response()
}

type ApiResult<T> = Result<(StatusCode, Json<T>), ApiError>;

/// The API routes over `service`, guarded as `config` says.
pub fn router(service: Arc<Service>, config: ApiConfig) -> Router {
    let config = Arc::new(config);
    Router::new()
        .route("/v1/pool", get(pool))
        .route("/v1/volumes", get(list_volumes).post(create_volume))
        .route("/v1/volumes/{name}", get(volume_info).delete(delete_volume))
        .route("/v1/volumes/{name}/resize", post(resize_volume))
        .route(
            "/v1/volumes/{name}/compact",
            get(compaction_status).post(start_compaction),
        )
        .route(
            "/v1/volumes/{name}/snapshots",
            get(list_snapshots).post(create_snapshot),
        )
        .route(
            "/v1/volumes/{name}/snapshots/{snapshot}",
            axum::routing::delete(delete_snapshot),
        )
        .route(
            "/v1/volumes/{name}/snapshots/{snapshot}/clone",
            post(clone_snapshot),
        )
        .route("/metrics", get(metrics))
        .route("/health", get(health))
        .fallback(|| async {
            ApiError(
                StatusCode::NOT_FOUND,
                "no such API route; see docs/openapi/volume.yaml".into(),
            )
        })
        .with_state(service)
        // Outermost last: errors become JSON, then the token is checked,
        // then the body is read.
        .layer(from_fn_with_state(config.clone(), read_body))
        .layer(from_fn_with_state(config, authenticate))
        .layer(from_fn(json_errors))
}

/// Refuses a request without the right bearer token (401), except the
/// read-only `/metrics`, which Prometheus scrapers fetch without one, and
/// `/health`, which load balancers and `systemd` checks probe without one.
async fn authenticate(
    State(config): State<Arc<ApiConfig>>,
    request: Request,
    next: Next,
) -> Response {
    let Some(token) = &config.token else {
        return next.run(request).await;
    };
    if matches!(request.uri().path(), "/metrics" | "/health") {
        return next.run(request).await;
    }
    let presented = request
        .headers()
        .get(header::AUTHORIZATION)
        .map(|value| value.as_bytes())
        .and_then(bearer);
    let message = match presented {
        Some(p) if token.matches(p) => return next.run(request).await,
        Some(_) => format!("the API token is wrong: {TOKEN_HINT}"),
        None => format!("this API needs a token: {TOKEN_HINT}"),
    };
    let mut response = error_response(StatusCode::UNAUTHORIZED, message);
    response.headers_mut().insert(
        header::WWW_AUTHENTICATE,
        HeaderValue::from_static("Bearer realm=\"strata\""),
    );
    response
}

/// The credentials of an `Authorization: Bearer ...` header value.
fn bearer(value: &[u8]) -> Option<&[u8]> {
    let scheme = value.get(..7)?;
    scheme
        .eq_ignore_ascii_case(b"bearer ")
        .then(|| value[7..].trim_ascii())
}

/// Reads the request body whole before the handler runs: at most
/// [`MAX_BODY_BYTES`] (413), within the body timeout (408), so a client
/// that stops sending holds nothing for long.
async fn read_body(State(config): State<Arc<ApiConfig>>, request: Request, next: Next) -> Response {
    let (parts, body) = request.into_parts();
    let declared = parts
        .headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > MAX_BODY_BYTES as u64) {
        return error_response(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("cannot read the request body: it is larger than the limit of {MAX_BODY_BYTES} bytes"),
        );
    }
    let read = tokio::time::timeout(
        config.body_timeout,
        axum::body::to_bytes(body, MAX_BODY_BYTES),
    )
    .await;
    let bytes = match read {
        Ok(Ok(bytes)) => bytes,
        Ok(Err(e)) => {
            return error_response(
                StatusCode::BAD_REQUEST,
                format!("cannot read the request body (at most {MAX_BODY_BYTES} bytes): {e}"),
            )
        }
        Err(_) => {
            return error_response(
                StatusCode::REQUEST_TIMEOUT,
                format!(
                    "the request body did not arrive within {} s; send it whole at once",
                    config.body_timeout.as_secs_f64()
                ),
            )
        }
    };
    next.run(Request::from_parts(parts, HttpBody::from(bytes)))
        .await
}

/// Largest error body of axum's own that is kept as the message.
const MAX_PLAIN_ERROR: usize = 4096;

/// Rewrites every error answer that is not JSON (axum's 405 has no body,
/// its rejections are plain text) into `{"error": "..."}`.
async fn json_errors(request: Request, next: Next) -> Response {
    let method = request.method().clone();
    let path = request.uri().path().to_string();
    let response = next.run(request).await;
    let status = response.status();
    let is_json = response
        .headers()
        .get(header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/json"));
    if !(status.is_client_error() || status.is_server_error()) || is_json {
        return response;
    }
    let (parts, body) = response.into_parts();
    let text = axum::body::to_bytes(body, MAX_PLAIN_ERROR)
        .await
        .map(|b| String::from_utf8_lossy(&b).trim().to_string())
        .unwrap_or_default();
    let message = match status {
        StatusCode::METHOD_NOT_ALLOWED => format!(
            "method {method} is not allowed on {}; see docs/openapi/volume.yaml for the \
             methods of each route",
            path.escape_default()
        ),
        _ if !text.is_empty() => text,
        _ => status
            .canonical_reason()
            .unwrap_or("request failed")
            .to_string(),
    };
    let mut rewritten = error_response(status, message);
    // Keep what the original said besides its body (Allow, say).
    for (name, value) in &parts.headers {
        if name != header::CONTENT_TYPE && name != header::CONTENT_LENGTH {
            rewritten.headers_mut().append(name, value.clone());
        }
    }
    rewritten
}

/// A request body, or why it could not be read.
type Body = Result<Bytes, BytesRejection>;

/// Parses a JSON body, with a 4xx and a clear message when it does not fit.
fn parse<T: DeserializeOwned>(body: &Body) -> Result<T, ApiError> {
    let body = body.as_ref().map_err(|e| {
        ApiError(
            e.status(),
            format!("cannot read the request body (at most {MAX_BODY_BYTES} bytes): {e}"),
        )
    })?;
    serde_json::from_slice(body).map_err(|e| {
        ApiError(
            StatusCode::BAD_REQUEST,
            format!("malformed JSON request body: {e}"),
        )
    })
}

/// Runs a blocking service call off the async threads.
async fn blocking<T: Send + 'static>(
    service: Arc<Service>,
    call: impl FnOnce(&Service) -> Result<T, VolumeError> + Send + 'static,
) -> Result<T, ApiError> {
    let worker = service.clone();
    match tokio::task::spawn_blocking(move || call(&worker)).await {
        Ok(result) => result.map_err(|e| ApiError::from_service(&service, e)),
        Err(e) => {
            tracing::error!("API request's worker failed: {e}");
            Err(ApiError(
                StatusCode::INTERNAL_SERVER_ERROR,
                "the request's worker failed; the daemon's log has the details".into(),
            ))
        }
    }
}

/// A non-blocking service call's result, its error as a client sees it.
fn direct<T>(service: &Service, result: Result<T, VolumeError>) -> Result<T, ApiError> {
    result.map_err(|e| ApiError::from_service(service, e))
}

async fn pool(State(s): State<Arc<Service>>) -> ApiResult<crate::service::PoolInfo> {
    Ok((StatusCode::OK, Json(s.pool_info())))
}

async fn list_volumes(State(s): State<Arc<Service>>) -> ApiResult<Vec<crate::service::VolumeInfo>> {
    Ok((StatusCode::OK, Json(s.list_volumes())))
}

async fn create_volume(
    State(s): State<Arc<Service>>,
    body: Body,
) -> ApiResult<crate::service::VolumeInfo> {
    let req: CreateVolume = parse(&body)?;
    let format = crate::service::VolumeFormat {
        cluster_size: req.cluster_size,
        extended_l2: req.extended_l2,
    };
    let info = blocking(s, move |s| s.create_volume_as(&req.name, req.size, &format)).await?;
    Ok((StatusCode::CREATED, Json(info)))
}

async fn volume_info(
    State(s): State<Arc<Service>>,
    Path(name): Path<String>,
) -> ApiResult<crate::service::VolumeInfo> {
    Ok((StatusCode::OK, Json(direct(&s, s.volume_info(&name))?)))
}

async fn delete_volume(
    State(s): State<Arc<Service>>,
    Path(name): Path<String>,
) -> ApiResult<crate::service::DeleteReport> {
    let report = blocking(s, move |s| s.delete_volume(&name)).await?;
    Ok((StatusCode::OK, Json(report)))
}

async fn resize_volume(
    State(s): State<Arc<Service>>,
    Path(name): Path<String>,
    body: Body,
) -> ApiResult<crate::service::ResizeReport> {
    let req: ResizeVolume = parse(&body)?;
    let report = blocking(s, move |s| s.resize_volume(&name, req.size)).await?;
    Ok((StatusCode::OK, Json(report)))
}

/// Fastest compaction pace accepted: rates are signed 64-bit numbers to
/// many clients (JSON in JavaScript, Prometheus), so larger ones are
/// refused rather than wrapped.
pub const MAX_COMPACTION_RATE: u64 = i64::MAX as u64;

async fn start_compaction(
    State(s): State<Arc<Service>>,
    Path(name): Path<String>,
    body: Body,
) -> ApiResult<crate::service::compact::CompactionStatus> {
    // An empty body takes the defaults.
    let opts: crate::service::compact::CompactOptions = match &body {
        Ok(bytes) if bytes.iter().all(u8::is_ascii_whitespace) => Default::default(),
        _ => parse(&body)?,
    };
    if let Some(rate) = opts.rate.filter(|r| *r > MAX_COMPACTION_RATE) {
        return Err(ApiError(
            StatusCode::BAD_REQUEST,
            format!(
                "compaction rate {rate} bytes/s is above the maximum of {MAX_COMPACTION_RATE}; \
                 give a rate from {} (1 MiB/s) up",
                crate::service::compact::MIN_RATE
            ),
        ));
    }
    let status = direct(&s, s.start_compaction(&name, opts))?;
    Ok((StatusCode::ACCEPTED, Json(without_paths(&s, status))))
}

async fn compaction_status(
    State(s): State<Arc<Service>>,
    Path(name): Path<String>,
) -> ApiResult<crate::service::compact::CompactionStatus> {
    let status = direct(&s, s.compaction_status(&name))?;
    Ok((StatusCode::OK, Json(without_paths(&s, status))))
}

/// A compaction's status with the pool's path taken out of its error (a
/// failed merge names the file it was writing; the log keeps it).
fn without_paths(
    service: &Service,
    mut status: crate::service::compact::CompactionStatus,
) -> crate::service::compact::CompactionStatus {
    status.error = status
        .error
        .map(|e| crate::error::redact_paths(&e, &service.config.pool));
    status
}

async fn list_snapshots(
    State(s): State<Arc<Service>>,
    Path(name): Path<String>,
) -> ApiResult<Vec<crate::service::SnapshotInfo>> {
    Ok((StatusCode::OK, Json(direct(&s, s.list_snapshots(&name))?)))
}

async fn create_snapshot(
    State(s): State<Arc<Service>>,
    Path(name): Path<String>,
    body: Body,
) -> ApiResult<crate::service::SnapshotReport> {
    let req: SnapshotRequest = parse(&body)?;
    let report = blocking(s, move |s| s.create_snapshot(&name, &req.name, req.sync)).await?;
    Ok((StatusCode::CREATED, Json(report)))
}

async fn delete_snapshot(
    State(s): State<Arc<Service>>,
    Path((name, snapshot)): Path<(String, String)>,
) -> ApiResult<crate::service::DeleteReport> {
    let report = blocking(s, move |s| s.delete_snapshot(&name, &snapshot)).await?;
    Ok((StatusCode::OK, Json(report)))
}

async fn clone_snapshot(
    State(s): State<Arc<Service>>,
    Path((name, snapshot)): Path<(String, String)>,
    body: Body,
) -> ApiResult<crate::service::VolumeInfo> {
    let req: Named = parse(&body)?;
    let info = blocking(s, move |s| s.clone_snapshot(&name, &snapshot, &req.name)).await?;
    Ok((StatusCode::CREATED, Json(info)))
}

/// `GET /health`: 200 `{"status":"ok"}` while the API answers. It says
/// nothing about the pool, so it needs no token.
async fn health() -> impl IntoResponse {
    Json(serde_json::json!({"status": "ok"}))
}

async fn metrics(State(s): State<Arc<Service>>) -> impl IntoResponse {
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        s.metrics(),
    )
}
