//! The agent's transfer service, over HTTP on axum:
//!
//! - `GET /v1/data?path=PATH&wait_ms=N` with `Range: bytes=START-END`:
//!   bytes of an ephemeral file this node holds (206, with
//!   `Content-Range`), plus its size now and whether a writer has it open
//!   ([`SIZE_HEADER`], [`WRITING_HEADER`]), and the generation of the
//!   content they come from ([`GENERATION_HEADER`]); at the end of a file being
//!   written it waits up to `wait_ms` for more bytes (a long poll);
//! - `POST /v1/persist {"path"}`: promotes an ephemeral file held here to
//!   the durable tier (its object uploaded, its record changed, its local
//!   content kept as the durable file's local copy);
//! - `POST /v1/evict {"path"}`: drops this node's copy of a file held
//!   elsewhere (or of a durable file);
//! - `POST /v1/forget {"path"}`: drops whatever this node keeps of a file
//!   the namespace no longer has (a node that removed a file asks the
//!   others; a file still in the namespace is refused);
//! - `GET /metrics`: the local tier's bytes by kind, its quota, and the
//!   evictions, spills and ENOSPC refusals ([`super::budget`]);
//! - `POST /v1/invoke` and `GET /v1/sandboxes`: functions run on this
//!   node ([`super::sandbox`]).

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::{Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use serde::Deserialize;

use super::Shared;
use crate::error::ErrorKind;
use crate::path::NamespacePath;
use crate::protocol::*;
use crate::service::{answer, body, error_response};
use crate::{F3Error, Result};

/// Most bytes one transfer answer carries.
pub const MAX_TRANSFER_BYTES: u64 = 16 * 1024 * 1024;

/// Longest long poll a fetch may ask for.
pub const MAX_WAIT: Duration = Duration::from_secs(10);

/// How often a long poll looks for new bytes.
const POLL_PERIOD: Duration = Duration::from_millis(5);

/// The service's routes.
pub fn router(shared: Arc<Shared>) -> Router {
    Router::new()
        .route("/v1/data", get(data))
        .route("/v1/persist", post(persist))
        .route("/v1/evict", post(evict))
        .route("/v1/forget", post(forget))
        .route("/metrics", get(metrics))
        .merge(super::sandbox::routes())
        .layer(axum::extract::DefaultBodyLimit::max(MAX_REQUEST_BYTES))
        .with_state(shared)
}

async fn metrics(State(shared): State<Arc<Shared>>) -> Response {
    let text = tokio::task::spawn_blocking(move || super::budget::exposition(&shared))
        .await
        .unwrap_or_default();
    ([("content-type", "text/plain; version=0.0.4")], text).into_response()
}

#[derive(Debug, Deserialize)]
struct DataQuery {
    path: String,
    #[serde(default)]
    wait_ms: u64,
}

/// `bytes=START-END` or `bytes=START-`: the first byte and how many.
fn parse_range(headers: &HeaderMap) -> Result<(u64, u64)> {
    let Some(value) = headers.get("range") else {
        return Ok((0, MAX_TRANSFER_BYTES));
    };
    let bad = || {
        F3Error::invalid(format!(
            "Range header {value:?}: give bytes=START-END or bytes=START- (one range)"
        ))
    };
    let text = value.to_str().map_err(|_| bad())?;
    let spec = text.strip_prefix("bytes=").ok_or_else(bad)?;
    let (start, end) = spec.split_once('-').ok_or_else(bad)?;
    let start: u64 = start.trim().parse().map_err(|_| bad())?;
    let length = if end.trim().is_empty() {
        MAX_TRANSFER_BYTES
    } else {
        let end: u64 = end.trim().parse().map_err(|_| bad())?;
        if end < start {
            return Err(bad());
        }
        (end - start).saturating_add(1).min(MAX_TRANSFER_BYTES)
    };
    Ok((start, length))
}

async fn data(
    State(shared): State<Arc<Shared>>,
    query: std::result::Result<Query<DataQuery>, axum::extract::rejection::QueryRejection>,
    headers: HeaderMap,
) -> Response {
    match serve_data(&shared, query, &headers).await {
        Ok(response) => response,
        Err(error) => error_response(&error),
    }
}

async fn serve_data(
    shared: &Arc<Shared>,
    query: std::result::Result<Query<DataQuery>, axum::extract::rejection::QueryRejection>,
    headers: &HeaderMap,
) -> Result<Response> {
    let Query(query) = query.map_err(|e| {
        F3Error::invalid(format!(
            "malformed transfer request: {}; give ?path=PATH[&wait_ms=N]",
            e.body_text()
        ))
    })?;
    let path = NamespacePath::parse(&query.path)?;
    let (offset, length) = parse_range(headers)?;
    let wait = Duration::from_millis(query.wait_ms).min(MAX_WAIT);
    let file = shared.local.open(path.as_str(), false).map_err(|e| {
        if e.kind == ErrorKind::NotFound {
            F3Error::not_found(format!(
                "node {} holds no ephemeral file {path}: ask the F3 service which node holds \
                 it (`strata f3 where {path}`)",
                shared.name
            ))
        } else {
            e
        }
    })?;
    let deadline = Instant::now() + wait;
    loop {
        let generation = file.generation();
        let (size, writing) = file.snapshot();
        if offset > size && !writing {
            return Err(F3Error::new(
                ErrorKind::Invalid,
                format!("{path}: offset {offset} is past its end ({size} bytes)"),
            ));
        }
        if offset < size || !writing || Instant::now() >= deadline {
            let reader = file.clone();
            let bytes = tokio::task::spawn_blocking(move || {
                reader.try_read(offset, length.min(u64::from(u32::MAX)) as u32)
            })
            .await
            .map_err(|e| F3Error::unavailable(format!("reading {path}: {e}")))?
            .map_err(|e| F3Error::io(format!("reading {path}"), e))?
            .unwrap_or_default();
            if file.generation() != generation {
                // A writer opened it (or it was truncated) during the
                // read: these bytes may mix two contents.
                return Err(F3Error::unavailable(format!(
                    "{path} changed while it was read: ask again"
                )));
            }
            shared
                .budget
                .counters
                .served_bytes
                .fetch_add(bytes.len() as u64, std::sync::atomic::Ordering::Relaxed);
            return Ok(piece(offset, bytes, size.max(offset), writing, generation));
        }
        tokio::time::sleep(POLL_PERIOD).await;
    }
}

/// A 206 answer carrying `bytes` from `offset`.
fn piece(offset: u64, bytes: Vec<u8>, size: u64, writing: bool, generation: u64) -> Response {
    let mut headers = HeaderMap::new();
    let number =
        |n: u64| HeaderValue::from_str(&n.to_string()).unwrap_or(HeaderValue::from_static("0"));
    headers.insert(SIZE_HEADER, number(size));
    headers.insert(WRITING_HEADER, number(u64::from(writing)));
    headers.insert(GENERATION_HEADER, number(generation));
    if !bytes.is_empty() {
        let end = offset + bytes.len() as u64 - 1;
        let total = if writing {
            "*".to_string()
        } else {
            size.to_string()
        };
        if let Ok(value) = HeaderValue::from_str(&format!("bytes {offset}-{end}/{total}")) {
            headers.insert("content-range", value);
        }
    }
    (StatusCode::PARTIAL_CONTENT, headers, bytes).into_response()
}

async fn persist(State(shared): State<Arc<Shared>>, request: Body<PathRequest>) -> Response {
    let request = match body(request) {
        Ok(r) => r,
        Err(e) => return error_response(&e),
    };
    let result =
        tokio::task::spawn_blocking(move || super::persist::persist_file(&shared, &request.path))
            .await
            .unwrap_or_else(|e| Err(F3Error::unavailable(format!("persist: {e}"))));
    answer(result)
}

type Body<T> = std::result::Result<axum::Json<T>, axum::extract::rejection::JsonRejection>;

async fn evict(State(shared): State<Arc<Shared>>, request: Body<PathRequest>) -> Response {
    let request = match body(request) {
        Ok(r) => r,
        Err(e) => return error_response(&e),
    };
    let result = tokio::task::spawn_blocking(move || evict_file(&shared, &request.path))
        .await
        .unwrap_or_else(|e| Err(F3Error::unavailable(format!("evict: {e}"))));
    answer(result)
}

/// Drops this node's copy of `path` (never the holder's only copy).
pub fn evict_file(shared: &Shared, path: &str) -> Result<serde_json::Value> {
    let path = NamespacePath::parse(path)?;
    let entry = shared.service.stat(path.as_str())?;
    if entry.ephemeral && entry.holder.as_deref() == Some(shared.name.as_str()) {
        return Err(F3Error::conflict(format!(
            "node {} holds the only copy of ephemeral file {path}: persist it first \
             (`strata f3 persist {path}`) or remove it",
            shared.name
        )));
    }
    let had_copy = shared.copies.evict(path.as_str());
    let had_cache = shared.drop_cached(path.as_str()).is_some();
    let _ = shared.service.report(
        &shared.name,
        vec![HeldFile {
            path: path.to_string(),
            bytes: 0,
        }],
    );
    Ok(serde_json::json!({
        "node": shared.name,
        "path": path.as_str(),
        "evicted": had_copy || had_cache,
    }))
}

async fn forget(State(shared): State<Arc<Shared>>, request: Body<PathRequest>) -> Response {
    let request = match body(request) {
        Ok(r) => r,
        Err(e) => return error_response(&e),
    };
    let result = tokio::task::spawn_blocking(move || forget_file(&shared, &request.path))
        .await
        .unwrap_or_else(|e| Err(F3Error::unavailable(format!("forget: {e}"))));
    answer(result)
}

/// Drops this node's content, copy and local copy of `path`, once the
/// namespace has no such file (checked with the service first).
pub fn forget_file(shared: &Shared, path: &str) -> Result<serde_json::Value> {
    let path = NamespacePath::parse(path)?;
    match shared.service.stat(path.as_str()) {
        Ok(_) => {
            return Err(F3Error::conflict(format!(
                "{path} is still in the namespace: remove it first"
            )))
        }
        Err(e) if e.kind == ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    shared.local.remove(path.as_str())?;
    shared.copies.evict(path.as_str());
    shared.drop_cached(path.as_str());
    Ok(serde_json::json!({ "node": shared.name, "path": path.as_str(), "forgotten": true }))
}
