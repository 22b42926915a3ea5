//! Cleanup: every volume whose name carries a run's id is deleted, with
//! its snapshots, at the end of a run and by `strata bench clean`.

use std::path::Path;
use std::time::Instant;

use crate::error::{Error, Result};
use crate::provider::{Answer, Provider, StrataProvider};
use crate::record::RunInfo;

/// Deletes the provider's volumes named `prefix...`, calling `each` for
/// every delete; what is still there after a few passes (or the error of
/// listing them).
pub fn cleanup_prefix(
    provider: &dyn Provider,
    prefix: &str,
    each: &mut dyn FnMut(&str, Instant, Answer),
) -> Vec<String> {
    for _ in 0..3 {
        let names = match provider.volumes_named(prefix) {
            Ok(names) => names,
            Err(e) => return vec![format!("(cannot list volumes: {e})")],
        };
        if names.is_empty() {
            return Vec::new();
        }
        for name in &names {
            let start = Instant::now();
            each(name, start, provider.delete_volume(name));
        }
    }
    provider
        .volumes_named(prefix)
        .unwrap_or_else(|e| vec![format!("(cannot list volumes: {e})")])
}

/// What `clean` did: the volumes it deleted and those still there.
#[derive(Debug, Default)]
pub struct Cleaned {
    /// Volumes deleted.
    pub deleted: Vec<String>,
    /// Deletes that failed, with their errors.
    pub failed: Vec<String>,
    /// Volumes of the run still there.
    pub leftovers: Vec<String>,
}

/// Deletes what the run in `dir` left (after a crash or a kill): on the
/// daemon it used (`api` overrides the recorded address), or on its own
/// daemon, started again on the run's pool with the `strata` binary;
/// before that, its file systems (`attach: fs`) are unmounted and
/// detached, and PostgreSQL servers on them stopped.
pub fn clean(
    dir: &Path,
    strata: &Path,
    api: Option<String>,
    token: Option<String>,
) -> Result<Cleaned> {
    let info = RunInfo::load(dir)?;
    // File systems first: their volumes cannot go while mounted.
    let mut cleaned = Cleaned {
        leftovers: crate::attach::clean_run(&info.run_id),
        ..Cleaned::default()
    };
    let provider: Box<dyn Provider> = match (
        info.provider.as_str(),
        info.own_daemon,
        api.or(info.api.clone()),
    ) {
        // The null provider keeps nothing; the QEMU provider's volumes live
        // only while its daemon runs, and their files are in the run's
        // directory.
        ("null" | "qemu", _, _) => return Ok(cleaned),
        ("strata", true, _) => Box::new(
            StrataProvider::start(strata, &dir.join("pool"), &dir.join("clean-daemon.log"))
                .map_err(Error::Provider)?,
        ),
        ("strata", false, Some(api)) => Box::new(StrataProvider::connect(&api, token)),
        (other, _, _) => {
            return Err(Error::RunDirectory {
                path: dir.join(crate::record::RUN_INFO),
                message: format!("provider `{other}` without an API address: give --api"),
            })
        }
    };
    let volumes_left = cleanup_prefix(
        provider.as_ref(),
        &format!("{}-", info.run_id),
        &mut |name, _, result| match result {
            Ok(_) => cleaned.deleted.push(name.to_string()),
            Err(e) => cleaned.failed.push(format!("{name}: {e}")),
        },
    );
    cleaned.leftovers.extend(volumes_left);
    provider.shutdown().map_err(Error::Provider)?;
    Ok(cleaned)
}
