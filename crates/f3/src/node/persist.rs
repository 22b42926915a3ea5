//! Promoting an ephemeral file to the durable tier: asked by `strata f3
//! persist` (through the transfer service) or done by the quota to make
//! room ([`super::budget`]).

use super::Shared;
use crate::path::NamespacePath;
use crate::protocol::*;
use crate::{F3Error, Result};

/// Promotes ephemeral file `path`, held here, to the durable tier.
pub fn persist_file(shared: &Shared, path: &str) -> Result<Entry> {
    let path = NamespacePath::parse(path)?;
    let entry = shared.service.stat(path.as_str())?;
    if entry.directory {
        return Err(F3Error::invalid(format!(
            "{path} is a directory; persist files"
        )));
    }
    if !entry.ephemeral {
        return Err(F3Error::conflict(format!("{path} is durable already")));
    }
    if entry.holder.as_deref() != Some(shared.name.as_str()) {
        return Err(F3Error::invalid(format!(
            "{path} is held by node {}, not {}: ask its holder",
            entry.holder.as_deref().unwrap_or("(none)"),
            shared.name
        )));
    }
    if !entry.writers.is_empty() {
        return Err(F3Error::conflict(format!(
            "{path} has writers open (on {}): persist it once they close it",
            entry.writers.keys().cloned().collect::<Vec<_>>().join(", ")
        )));
    }
    let durable = shared.durable()?;
    let content = shared.local.content_path(path.as_str());
    durable.upload(path.as_str(), &content)?;
    let updated = shared.service.update(&UpdateRequest {
        path: path.to_string(),
        ephemeral: Some(false),
        clear_holder: true,
        ..UpdateRequest::default()
    })?;
    shared
        .local
        .take(path.as_str(), &shared.cache_path(path.as_str()))?;
    shared
        .cached
        .lock()
        .insert(path.to_string(), updated.version);
    Ok(updated)
}
