//! The HTTP JSON control API (documented in `docs/openapi/volume.yaml`).
//!
//! Every error is a JSON object `{"error": "..."}` with a 4xx status for a
//! bad request and 5xx for a failure of the service. Service calls block
//! (file syncs, catalog commits), so they run on tokio's blocking pool.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

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

/// An API error: status and message, rendered as `{"error": message}`.
#[derive(Debug)]
pub struct ApiError(StatusCode, String);

impl From<VolumeError> for ApiError {
    fn from(e: VolumeError) -> Self {
        let status = StatusCode::from_u16(e.status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        ApiError(status, e.to_string())
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        #[derive(Serialize)]
        struct Body {
            error: String,
        }
        (self.0, Json(Body { error: self.1 })).into_response()
    }
}

type ApiResult<T> = Result<(StatusCode, Json<T>), ApiError>;

/// The API routes over `service`.
pub fn router(service: Arc<Service>) -> Router {
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
        .fallback(|| async {
            ApiError(
                StatusCode::NOT_FOUND,
                "no such API route; see docs/openapi/volume.yaml".into(),
            )
        })
        .layer(axum::extract::DefaultBodyLimit::max(MAX_BODY_BYTES))
        .with_state(service)
}

/// A request body, or why it could not be read (too large, cut short).
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
    tokio::task::spawn_blocking(move || call(&service))
        .await
        .map_err(|e| {
            ApiError(
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("request failed: {e}"),
            )
        })?
        .map_err(ApiError::from)
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
    Ok((StatusCode::OK, Json(s.volume_info(&name)?)))
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

async fn start_compaction(
    State(s): State<Arc<Service>>,
    Path(name): Path<String>,
    body: Body,
) -> ApiResult<crate::compact::CompactionStatus> {
    // An empty body takes the defaults.
    let opts = match &body {
        Ok(bytes) if bytes.iter().all(u8::is_ascii_whitespace) => Default::default(),
        _ => parse(&body)?,
    };
    let status = s.start_compaction(&name, opts)?;
    Ok((StatusCode::ACCEPTED, Json(status)))
}

async fn compaction_status(
    State(s): State<Arc<Service>>,
    Path(name): Path<String>,
) -> ApiResult<crate::compact::CompactionStatus> {
    Ok((StatusCode::OK, Json(s.compaction_status(&name)?)))
}

async fn list_snapshots(
    State(s): State<Arc<Service>>,
    Path(name): Path<String>,
) -> ApiResult<Vec<crate::service::SnapshotInfo>> {
    Ok((StatusCode::OK, Json(s.list_snapshots(&name)?)))
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

async fn metrics(State(s): State<Arc<Service>>) -> impl IntoResponse {
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        s.metrics(),
    )
}
