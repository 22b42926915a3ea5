//! An answer's body that keeps its connection marked busy until it has
//! all been sent, so that a long download is never pushed out as idle.

use std::pin::Pin;
use std::task::{Context, Poll};

use hyper::body::{Body, Frame, SizeHint};

use crate::connections::Busy;

/// `B`, holding its connection busy until dropped (hyper drops a body
/// once its last frame is written, or when the connection dies).
pub(crate) struct HeldBody<B> {
    body: B,
    _busy: Busy,
}

impl<B> HeldBody<B> {
    pub(crate) fn new(body: B, busy: Busy) -> Self {
        HeldBody { body, _busy: busy }
    }
}

impl<B: Body + Unpin> Body for HeldBody<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        Pin::new(&mut self.get_mut().body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}
