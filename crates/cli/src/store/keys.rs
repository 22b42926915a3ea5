//! `strata store key`: the cluster key, its fingerprints and its
//! rotation (a running node reloads its keys on SIGHUP).

use super::*;

pub(super) fn key_command(cmd: KeyCommand) -> Result<i32> {
    match cmd {
        KeyCommand::New(arg) => {
            let path = arg.path();
            let next = sibling(&path, NEXT_SUFFIX);
            ClusterKey::create(&next)?;
            println!(
                "wrote a new cluster key to {}: copy it next to the key file of every host \
                 (mode 0600), SIGHUP every node, then run `strata store key swap`",
                next.display()
            );
            Ok(0)
        }
        KeyCommand::Swap(arg) => {
            let path = arg.path();
            swap_keys(&path)?;
            println!(
                "{} now holds the new key and {} the old one: SIGHUP every node; once \
                 every host has swapped, remove {} on every host and SIGHUP every node again",
                path.display(),
                sibling(&path, PREV_SUFFIX).display(),
                sibling(&path, PREV_SUFFIX).display()
            );
            Ok(0)
        }
        KeyCommand::Fingerprint(args) => {
            let prints = ClusterKey::load(&args.file.path())?.fingerprints();
            match args.output {
                Output::Json => println!("{}", serde_json::to_string_pretty(&prints_json(prints))?),
                Output::Human => {
                    println!("active {}", fmt_fingerprint(prints.active));
                    if let Some(o) = prints.other {
                        println!("also accepted {}", fmt_fingerprint(o));
                    }
                }
            }
            Ok(0)
        }
    }
}

/// A keyring's fingerprints in JSON: `{"active": hex, "other": hex or null}`.
pub(super) fn prints_json(k: Fingerprints) -> serde_json::Value {
    json!({
        "active": fmt_fingerprint(k.active),
        "other": k.other.map(fmt_fingerprint),
    })
}

/// The fingerprints node `uuid` reported, as shown: `active[+other]`, or
/// `?` if it has not reported any (yet, or it runs an older build).
pub(super) fn node_keys(t: &Table, uuid: u64) -> String {
    t.keys_of(uuid)
        .map_or_else(|| "?".to_string(), |k| k.to_string())
}

/// Makes `path.next` the key file and the key file's key `path.prev`. The
/// key file exists at every moment (a node restarted meanwhile starts with
/// the old key or the new one, both accepted by every node), and each file
/// is checked before anything changes.
pub(super) fn swap_keys(path: &std::path::Path) -> Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    let next = sibling(path, NEXT_SUFFIX);
    let prev = sibling(path, PREV_SUFFIX);
    if !next.exists() {
        bail!(
            "there is no {} to swap in: make it with `strata store key new` (and copy it \
             to every host) first",
            next.display()
        );
    }
    // Both files hold valid keys, and no third key lies around.
    ClusterKey::load(path)?;
    ClusterKey::load(&next)?;
    let old = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    let tmp = sibling(&prev, ".tmp");
    let _ = std::fs::remove_file(&tmp);
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&tmp)
        .with_context(|| format!("creating {}", tmp.display()))?;
    file.write_all(&old)
        .and_then(|()| file.sync_all())
        .with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::rename(&tmp, &prev)
        .with_context(|| format!("renaming {} to {}", tmp.display(), prev.display()))?;
    std::fs::rename(&next, path)
        .with_context(|| format!("renaming {} to {}", next.display(), path.display()))?;
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        if let Ok(d) = std::fs::File::open(dir) {
            let _ = d.sync_all();
        }
    }
    Ok(())
}

/// Re-reads the cluster key files on every SIGHUP, for every node holding
/// a clone of `key` (see [`ClusterKey::reload`]); an error keeps the keys
/// in use and is printed.
/// With `admin_credential`, the admin tenant's credential is issued again
/// there after each reload (it follows the active key).
pub(super) fn reload_on_hangup(key: ClusterKey, admin_credential: Option<PathBuf>) -> Result<()> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut hup = signal(SignalKind::hangup()).context("could not install the SIGHUP handler")?;
    tokio::spawn(async move {
        while hup.recv().await.is_some() {
            let from = key
                .path()
                .map(|p| p.display().to_string())
                .unwrap_or_default();
            match key.reload() {
                Ok(n) => {
                    eprintln!(
                        "strata store: reloaded the cluster key {from} ({n} key{} accepted)",
                        if n == 1 { "" } else { "s" }
                    );
                    if let Some(path) = &admin_credential {
                        let issued =
                            TenantCredential::issue(&key, ADMIN).and_then(|c| c.save(path));
                        if let Err(e) = issued {
                            eprintln!(
                                "strata store: could not issue the admin credential again: {}",
                                e.report()
                            );
                        }
                    }
                }
                Err(e) => eprintln!(
                    "strata store: could not reload the cluster key, keeping the keys in use: {}",
                    e.report()
                ),
            }
        }
    });
    Ok(())
}
