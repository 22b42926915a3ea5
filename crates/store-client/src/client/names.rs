//! Changing names: Delete, and Rename in four metadata steps (no data
//! moves), with the rename link both records carry until it is done.

use super::calls::{unexpected, Call};
use super::{checked_name, Client, COMMIT_ATTEMPTS, META_TIMEOUT_MS};
use crate::transport::request_id;
use strata_store_protocol::wire::{Body, Code, Record, RenameLink};
use strata_store_protocol::Error;

/// The steps of [`Client::rename_with`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RenameStep {
    /// The old name is marked.
    Marked,
    /// The new name is bound.
    Linked,
    /// The old name is gone.
    Dropped,
}

impl Client {
    /// Deletes an object (acknowledged once W_m metadata nodes deleted it).
    ///
    /// An object left half renamed shares its replicas with its other
    /// name: then only the name goes, and the data stays with the other.
    pub async fn delete(&self, name: &str) -> Result<u64, Error> {
        let record = match self.stat(name).await {
            Ok(r) => r,
            // Let the coordinator give its own answer (deleted, not found).
            Err(_) => return self.delete_if(name, 0, false).await,
        };
        let keep = match &record.rename {
            Some(RenameLink::To(other) | RenameLink::From(other)) => self
                .stat(other)
                .await
                .is_ok_and(|o| shares_replicas(&o, &record)),
            None => false,
        };
        let deleted = self.delete_if(name, record.version, keep).await?;
        if let (false, Some(local)) = (keep, self.local.get()) {
            // The record is gone: no GET asks for its replicas again.
            for &addr in &record.replicas {
                local.pinned.forget(addr);
            }
        }
        Ok(deleted)
    }

    async fn delete_if(&self, name: &str, if_version: u64, keep_data: bool) -> Result<u64, Error> {
        let call = Call::new(
            request_id(),
            vec![self.coordinator(name)?],
            Body::Delete {
                name: name.to_string(),
                if_version,
                keep_data,
            },
            COMMIT_ATTEMPTS,
            META_TIMEOUT_MS,
        );
        match self.run(call).await {
            Ok(Body::Done { version }) => Ok(version),
            Ok(other) => Err(unexpected("Delete", &other)),
            Err(Error::Remote {
                code: Code::Deleted,
                message,
            }) => Err(Error::Remote {
                code: Code::NotFound,
                message,
            }),
            Err(e) => Err(e),
        }
    }

    /// Renames an object: no data moves. See [`Client::rename_with`].
    pub async fn rename(&self, from: &str, to: &str) -> Result<Record, Error> {
        self.rename_with(from, to, &|_| {}).await
    }

    /// Renames an object in four metadata steps, calling `after_step`
    /// after each (tests stop a rename there):
    /// 1. mark `from` as being renamed to `to`;
    /// 2. bind the replicas under `to`, marked as renamed from `from`;
    /// 3. drop `from`, keeping the data;
    /// 4. clear the mark on `to`.
    ///
    /// A rename stopped after step 2 leaves both names on the same
    /// replicas, each naming the other: deleting either keeps the data
    /// ([`Client::delete`]), and running the rename again finishes it.
    ///
    /// The old name is looked up with a link proof for its replicas
    /// (issued to this tenant), which the `Link` of step 2 carries: a
    /// metadata node binds only replicas a tenant proves it may read.
    pub async fn rename_with(
        &self,
        from: &str,
        to: &str,
        after_step: &(dyn Fn(RenameStep) + Sync),
    ) -> Result<Record, Error> {
        checked_name(to, "the new name")?;
        let (mut record, proof) = self.stat_for_link(from).await?;
        if from == to {
            return Ok(record);
        }
        if let Some(RenameLink::To(other) | RenameLink::From(other)) = &record.rename {
            let shared = self
                .stat(other)
                .await
                .is_ok_and(|o| shares_replicas(&o, &record));
            if shared && other != to {
                return Err(Error::state(format!(
                    "{from:?} still shares its data with {other:?} after an interrupted \
                     rename; finish that one first (strata obj mv {from} {other}, or \
                     strata obj rm one of the two names)"
                )));
            }
        }
        let marked = self
            .update(&record, Some(RenameLink::To(to.to_string())))
            .await?;
        after_step(RenameStep::Marked);
        record.name = to.to_string();
        record.rename = Some(RenameLink::From(from.to_string()));
        let call = Call::new(
            request_id(),
            vec![self.coordinator(to)?],
            Body::Link {
                record: record.clone(),
                proof,
            },
            COMMIT_ATTEMPTS,
            META_TIMEOUT_MS,
        );
        match self.run(call).await {
            Ok(Body::Done { version }) => record.version = version,
            Ok(other) => return Err(unexpected("Link", &other)),
            // An earlier, interrupted run of this rename bound it already
            // (`Exists`), or this one did and its answer was lost (a
            // resend refused or timed out): the replicas are bound, so
            // the mark on `from` must stay.
            Err(e) => match self.stat(to).await {
                Ok(bound) if shares_replicas(&bound, &record) => {
                    tracing::debug!("{to:?} holds the replicas already: {}", e.report());
                    record = bound;
                }
                _ => {
                    // Nothing shares the replicas: take the mark off again.
                    if let Ok(marked_record) = self.stat(from).await {
                        let _ = self.update(&marked_record, None).await;
                    }
                    return Err(e);
                }
            },
        }
        after_step(RenameStep::Linked);
        self.delete_if(from, marked, true).await?;
        after_step(RenameStep::Dropped);
        let version = self.update(&record, None).await?;
        record.rename = None;
        record.version = version;
        Ok(record)
    }

    /// Replaces `record`'s rename link; returns the new version.
    async fn update(&self, record: &Record, rename: Option<RenameLink>) -> Result<u64, Error> {
        let mut new = record.clone();
        new.rename = rename;
        let call = Call::new(
            request_id(),
            vec![self.coordinator(&record.name)?],
            Body::Update {
                record: new,
                if_version: record.version,
            },
            COMMIT_ATTEMPTS,
            META_TIMEOUT_MS,
        );
        match self.run(call).await? {
            Body::Done { version } => Ok(version),
            other => Err(unexpected("Update", &other)),
        }
    }
}

/// Whether two records share a replica address.
fn shares_replicas(a: &Record, b: &Record) -> bool {
    a.replicas.iter().any(|r| b.replicas.contains(r))
}
