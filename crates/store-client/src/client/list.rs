//! Listing: one page of names gathered from every metadata node, asked
//! again while metadata groups move under it.

use super::calls::{unexpected, Call};
use super::udp::run_call;
use super::{Client, META_ATTEMPTS, META_TIMEOUT_MS, MOVING_RETRY_MS};
use crate::transport::request_id;
use std::time::Duration;
use strata_store_protocol::wire::{Body, Code, ListEntry};
use strata_store_protocol::Error;

impl Client {
    /// One page of names starting with `prefix` after `after`, gathered
    /// from every metadata node; the second value is the cursor for the
    /// next page (`None` at the end).
    pub async fn list(
        &self,
        prefix: &str,
        after: &str,
        limit: u32,
    ) -> Result<(Vec<ListEntry>, Option<String>), Error> {
        // A List asks each metadata node once, and a node lists the rows it
        // holds. A group handed over between the table this client used
        // and the nodes' answers could be missed: its new owner was not
        // asked and its old one had dropped it. So the page counts only
        // if group ownership was the same in fresh tables before and after
        // it. A node whose group moved answers WrongAddress or Moving and
        // lists nothing: then too, refresh and ask again.
        let start = tokio::time::Instant::now();
        let mut pause = Duration::from_millis(50);
        loop {
            let _ = self.refresh().await;
            let owners = self.table().mg_owner.clone();
            let page = self.list_once(prefix, after, limit).await;
            let in_time = start.elapsed() < Duration::from_millis(MOVING_RETRY_MS);
            match page {
                Err(Error::Remote {
                    code: Code::WrongAddress | Code::Moving,
                    message,
                }) if in_time => {
                    tracing::debug!("listing again after a refreshed table: {message}");
                }
                Ok(page) => {
                    let _ = self.refresh().await;
                    if self.table().mg_owner == owners || !in_time {
                        return Ok(page);
                    }
                    tracing::debug!("listing again: metadata groups moved meanwhile");
                }
                other => return other,
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_millis(500));
        }
    }

    /// One scatter-gather of a List page over every metadata node.
    async fn list_once(
        &self,
        prefix: &str,
        after: &str,
        limit: u32,
    ) -> Result<(Vec<ListEntry>, Option<String>), Error> {
        let table = self.table();
        let limit = limit.clamp(1, 1000);
        let mut calls = tokio::task::JoinSet::new();
        for mn in &table.mns {
            // Ask through a group the node owns and keeps: a group being
            // handed over may be sealed, which refuses everything.
            let owned = |mg: &usize| table.mg_owner.get(*mg) == Some(&mn.slot);
            let moving = |mg: &usize| table.moves.iter().any(|m| m.group as usize == *mg);
            let mut groups = (0..table.mg_owner.len()).filter(owned);
            let Some(mg) = groups
                .clone()
                .find(|mg| !moving(mg))
                .or_else(|| groups.next())
            else {
                continue;
            };
            let target = table.layout.meta_prefix() | ((mg as u128) << (64 - table.layout.mg_bits));
            let call = Call::new(
                request_id(),
                vec![target],
                Body::List {
                    prefix: prefix.to_string(),
                    after: after.to_string(),
                    limit,
                },
                META_ATTEMPTS,
                META_TIMEOUT_MS,
            );
            let table = table.clone();
            let credential = self.credential.clone();
            calls.spawn(async move { run_call(&table, &credential, call).await });
        }
        let mut all: Vec<ListEntry> = Vec::new();
        let mut more = false;
        while let Some(page) = calls.join_next().await {
            let page = page.map_err(|e| Error::Task {
                context: "a List call to a metadata node did not finish".into(),
                source: Some(Box::new(e)),
            })?;
            match page? {
                Body::ListPage { entries, more: m } => {
                    more |= m;
                    all.extend(entries);
                }
                other => return Err(unexpected("List", &other)),
            }
        }
        all.sort_by(|a, b| a.name.cmp(&b.name).then(b.version.cmp(&a.version)));
        all.dedup_by(|a, b| a.name == b.name);
        if all.len() > limit as usize {
            all.truncate(limit as usize);
            more = true;
        }
        let cursor = if more {
            all.last().map(|e| e.name.clone())
        } else {
            None
        };
        Ok((all, cursor))
    }
}
