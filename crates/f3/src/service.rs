//! `strata f3 serve`: the metadata and locality service, plain JSON over
//! HTTP on axum, every request body bounded and checked, every answer
//! either the result or `{"error": "..."}` with a status that says whose
//! fault it is (400 malformed, 404 unknown, 409 conflict, 500 local).
//!
//! | route | body | answer |
//! |---|---|---|
//! | `POST /v1/heartbeat` | [`Heartbeat`] | [`Lease`] |
//! | `GET /v1/nodes` | | [`NodeInfo`] list |
//! | `POST /v1/stat` | [`PathRequest`] | [`Entry`] |
//! | `POST /v1/list` | [`PathRequest`] | [`Listing`] |
//! | `POST /v1/create` | [`CreateRequest`] | [`Entry`] |
//! | `POST /v1/remove` | [`PathRequest`] | the removed [`Entry`] |
//! | `POST /v1/writers` | [`WriterRequest`] | [`Entry`] |
//! | `POST /v1/update` | [`UpdateRequest`] | [`Entry`] |
//! | `POST /v1/report` | [`ReportRequest`] | `{"missing": [...]}` |
//! | `POST /v1/locality` | [`LocalityQuery`] | [`LocalityAnswer`] |
//! | `GET /v1/events?after=SEQ&limit=N` | | [`EventPage`] |
//! | `GET /metrics` | | nodes, files and bytes by tier, events (Prometheus text) |
//! | `POST /scheduler/filter` | `ExtenderArgs` | `ExtenderFilterResult` |
//! | `POST /scheduler/prioritize` | `ExtenderArgs` | `HostPriorityList` |

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;

use axum::extract::rejection::JsonRejection;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Serialize;

use crate::catalog::Catalog;
use crate::error::ErrorKind;
use crate::locality::{self, ExtenderArgs};
use crate::path::NamespacePath;
use crate::protocol::*;
use crate::{F3Error, Result};

/// Serves the catalog on `listener` until `shutdown` completes.
pub async fn serve(
    catalog: Arc<Catalog>,
    listener: tokio::net::TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<()> {
    let sweeper = tokio::spawn(sweep_leases(catalog.clone()));
    let served = axum::serve(listener, router(catalog))
        .with_graceful_shutdown(shutdown)
        .await
        .map_err(|e| F3Error::io("serving the F3 metadata service", e));
    sweeper.abort();
    served
}

/// Looks for lapsed leases every quarter of a lease, announcing the
/// loss of their nodes' ephemeral files ([`Catalog::sweep`]).
async fn sweep_leases(catalog: Arc<Catalog>) {
    let mut ticks = tokio::time::interval(catalog.lease() / 4);
    loop {
        ticks.tick().await;
        let sweeping = catalog.clone();
        match tokio::task::spawn_blocking(move || sweeping.sweep()).await {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => tracing::warn!("F3: looking for lapsed leases: {e}"),
            Err(e) => tracing::warn!("F3: looking for lapsed leases: {e}"),
        }
    }
}

/// The service's routes over `catalog`.
pub fn router(catalog: Arc<Catalog>) -> Router {
    Router::new()
        .route("/v1/heartbeat", post(heartbeat))
        .route("/v1/nodes", get(nodes))
        .route("/v1/stat", post(stat))
        .route("/v1/list", post(list))
        .route("/v1/create", post(create))
        .route("/v1/remove", post(remove))
        .route("/v1/writers", post(writers))
        .route("/v1/update", post(update))
        .route("/v1/report", post(report))
        .route("/v1/locality", post(locality_query))
        .route("/v1/events", get(events))
        .route("/metrics", get(metrics))
        .route("/scheduler/filter", post(extender_filter))
        .route("/scheduler/prioritize", post(extender_prioritize))
        .layer(DefaultBodyLimit::max(MAX_REQUEST_BYTES))
        .with_state(catalog)
}

type Shared = State<Arc<Catalog>>;
type Body<T> = std::result::Result<Json<T>, JsonRejection>;

/// The JSON of `result`, or its error with the status its kind maps to.
pub fn answer<T: Serialize>(result: Result<T>) -> Response {
    match result {
        Ok(value) => Json(value).into_response(),
        Err(error) => error_response(&error),
    }
}

/// `{"error": ...}` with the status `error`'s kind maps to.
pub fn error_response(error: &F3Error) -> Response {
    let status = match error.kind {
        ErrorKind::Invalid => StatusCode::BAD_REQUEST,
        ErrorKind::NotFound => StatusCode::NOT_FOUND,
        ErrorKind::Conflict => StatusCode::CONFLICT,
        ErrorKind::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
        ErrorKind::Io => StatusCode::INTERNAL_SERVER_ERROR,
    };
    let body = ErrorAnswer {
        error: error.message.clone(),
    };
    (status, Json(body)).into_response()
}

/// A request body that is not the JSON expected, as an [`F3Error`].
pub fn body<T>(request: Body<T>) -> Result<T> {
    request.map(|Json(value)| value).map_err(|rejection| {
        F3Error::invalid(format!(
            "malformed request: {}; see docs/f3.md for the JSON each route takes",
            rejection.body_text()
        ))
    })
}

async fn heartbeat(State(catalog): Shared, request: Body<Heartbeat>) -> Response {
    answer(body(request).and_then(|beat| {
        catalog.heartbeat(&beat.node, &beat.address)?;
        Ok(Lease {
            lease_ms: catalog.lease().as_millis() as u64,
        })
    }))
}

async fn nodes(State(catalog): Shared) -> Response {
    answer(catalog.nodes())
}

async fn metrics(State(catalog): Shared) -> Response {
    let text = tokio::task::spawn_blocking(move || catalog.exposition()).await;
    match text {
        Ok(Ok(text)) => ([("content-type", "text/plain; version=0.0.4")], text).into_response(),
        Ok(Err(e)) => error_response(&e),
        Err(e) => error_response(&F3Error::unavailable(format!("metrics: {e}"))),
    }
}

/// `GET /v1/events?after=SEQ&limit=N`.
#[derive(Debug, serde::Deserialize)]
struct EventsQuery {
    #[serde(default)]
    after: u64,
    #[serde(default = "default_event_page")]
    limit: usize,
}

fn default_event_page() -> usize {
    crate::events::MAX_EVENT_PAGE
}

async fn events(
    State(catalog): Shared,
    query: std::result::Result<
        axum::extract::Query<EventsQuery>,
        axum::extract::rejection::QueryRejection,
    >,
) -> Response {
    match query {
        Ok(axum::extract::Query(q)) => answer(catalog.events(q.after, q.limit)),
        Err(e) => answer::<()>(Err(F3Error::invalid(format!(
            "events: {e}: give ?after=SEQ&limit=N with whole numbers"
        )))),
    }
}

async fn stat(State(catalog): Shared, request: Body<PathRequest>) -> Response {
    answer(body(request).and_then(|r| catalog.stat(&NamespacePath::parse(&r.path)?)))
}

async fn list(State(catalog): Shared, request: Body<PathRequest>) -> Response {
    answer(body(request).and_then(|r| {
        Ok(Listing {
            entries: catalog.list(&NamespacePath::parse(&r.path)?)?,
        })
    }))
}

async fn create(State(catalog): Shared, request: Body<CreateRequest>) -> Response {
    answer(body(request).and_then(|r| catalog.create(&r)))
}

async fn remove(State(catalog): Shared, request: Body<PathRequest>) -> Response {
    answer(body(request).and_then(|r| catalog.remove(&NamespacePath::parse(&r.path)?)))
}

async fn writers(State(catalog): Shared, request: Body<WriterRequest>) -> Response {
    answer(body(request).and_then(|r| catalog.writer(&r)))
}

async fn update(State(catalog): Shared, request: Body<UpdateRequest>) -> Response {
    answer(body(request).and_then(|r| catalog.update(&r)))
}

async fn report(State(catalog): Shared, request: Body<ReportRequest>) -> Response {
    answer(body(request).and_then(|r| {
        let files = r.check()?;
        let missing = catalog.report(&r.node, &files)?;
        Ok(serde_json::json!({ "missing": missing }))
    }))
}

async fn locality_query(State(catalog): Shared, request: Body<LocalityQuery>) -> Response {
    answer(body(request).and_then(|q| {
        let files = query_paths(&q.files)?;
        let (nodes, missing) = catalog.locality(&files)?;
        Ok(LocalityAnswer { nodes, missing })
    }))
}

/// The paths of a locality query, checked and bounded.
fn query_paths(files: &[String]) -> Result<Vec<NamespacePath>> {
    if files.is_empty() || files.len() > MAX_FILES_PER_REQUEST {
        return Err(F3Error::invalid(format!(
            "a locality query names 1 to {MAX_FILES_PER_REQUEST} files; this one names {}",
            files.len()
        )));
    }
    files.iter().map(|p| NamespacePath::parse(p)).collect()
}

async fn extender_filter(State(catalog): Shared, request: Body<ExtenderArgs>) -> Response {
    answer(body(request).and_then(|args| {
        let alive: HashMap<String, bool> = catalog
            .nodes()?
            .into_iter()
            .map(|n| (n.name, n.alive))
            .collect();
        locality::filter(&args, &alive)
    }))
}

async fn extender_prioritize(State(catalog): Shared, request: Body<ExtenderArgs>) -> Response {
    answer(body(request).and_then(|args| {
        let inputs = args.inputs()?;
        let held = if inputs.is_empty() {
            Vec::new()
        } else {
            catalog.locality(&inputs)?.0
        };
        locality::prioritize(&args, &held)
    }))
}
