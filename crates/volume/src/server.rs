//! Serves the HTTP API with bounded resources, so no client can starve the
//! daemon: at most `max_connections` connections are open at once (each
//! costs a file descriptor, which NBD clients need too), a connection that
//! does not send a request's head within `header_timeout` is closed, and
//! when every slot is taken a new connection pushes out the oldest one
//! that has no request in progress (a half-open connection that sent part
//! of a head and nothing more is such a one). Only when every connection
//! is busy with a request does accepting wait, leaving new ones in the
//! kernel's backlog. The accept loop is `strata-http`'s, shared with the
//! mirror's repository server.
//!
//! Bodies are bounded by the router ([`crate::http`]).

use std::future::Future;
use std::time::Duration;

use axum::Router;
use hyper::body::Incoming;
use hyper::Request;
use hyper_util::service::TowerToHyperService;
use tracing::Instrument;

pub use strata_http::{Limits, Listener, DEFAULT_HEADER_TIMEOUT, DEFAULT_MAX_CONNECTIONS};

/// Serves `router` on `listener` until `shutdown` completes; then lets
/// requests in progress finish for up to `drain_timeout`.
pub async fn serve(
    listener: Listener,
    router: Router,
    limits: Limits,
    shutdown: impl Future<Output = ()> + Send,
    drain_timeout: Duration,
) {
    let service = TowerToHyperService::new(router);
    let handler = move |request: Request<Incoming>| {
        let answer = hyper::service::Service::call(&service, request);
        async move {
            match answer.await {
                Ok(response) => response,
                Err(never) => match never {},
            }
        }
    };
    strata_http::serve(listener, limits, handler, shutdown, drain_timeout)
        .instrument(tracing::info_span!("API"))
        .await;
}
