//! Listings: a page of the names this node owns under a prefix, cut to
//! fit one datagram. Entries carry no inline bytes
//! ([`strata_store_protocol::wire::ListEntry`]), so a page of small
//! objects holds as many names as a page of large ones.

use super::*;
use strata_store_protocol::wire::ListEntry;

/// Most entries a List may ask for at once.
const MAX_LIST_LIMIT: u32 = 1000;

impl<P: Clone + Eq + Hash> MnCore<P> {
    /// Up to `limit` (1 to [`MAX_LIST_LIMIT`]) names of the groups this
    /// node owns that start with `prefix` and sort after `after`, as a
    /// [`Body::ListPage`] that fits one datagram.
    pub(super) fn list(&self, prefix: &str, after: &str, limit: u32) -> Result<Body, Error> {
        let limit = limit.clamp(1, MAX_LIST_LIMIT) as usize;
        let (entries, more) = self.db.list(&self.owned_groups(), prefix, after, limit)?;
        Ok(fit_page(entries, more))
    }
}

/// Trims a list page so it fits in one datagram.
fn fit_page(mut entries: Vec<ListEntry>, mut more: bool) -> Body {
    let mut bytes = 64;
    let mut keep = 0;
    for e in &entries {
        bytes += e.name.len() + 24 + e.attributes.len();
        if bytes > strata_store_protocol::wire::MAX_DATAGRAM - 1024 {
            break;
        }
        keep += 1;
    }
    if keep < entries.len() {
        entries.truncate(keep);
        more = true;
    }
    Body::ListPage { entries, more }
}
