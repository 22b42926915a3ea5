//! Routes of a routed cluster (6Stor's network mode): which prefixes one
//! host must deliver locally, and through which host every other prefix
//! goes, and a keeper that installs them with `ip -6 route`.
//!
//! A node in a routed cluster keeps its own host's routes in step with the
//! prefix table: a new storage node, or a metadata group handed to another
//! node, changes them at the next table refresh. The prefixes the host owns
//! are `local` routes on `lo` (a wildcard socket then receives every
//! address in them); every other prefix goes via its owner's address.

use std::collections::BTreeMap;
use std::io::Write;
use std::net::IpAddr;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use strata_store_protocol::addr::{fmt_addr, Addr};
use strata_store_protocol::table::Table;
use strata_store_protocol::Error;

/// One route a host needs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Route {
    /// The prefix, as `ADDR/LEN`.
    pub prefix: String,
    /// The owner's address when another host owns the prefix; `None` when
    /// this host does (a local route).
    pub via: Option<IpAddr>,
}

impl Route {
    /// The `ip -6 -batch` line that installs it.
    pub fn install_line(&self) -> String {
        match self.via {
            Some(v) => format!("route replace {} via {v}", self.prefix),
            None => format!("route replace local {} dev lo", self.prefix),
        }
    }

    /// The `ip -6 -batch` line that removes it.
    fn remove_line(&self) -> String {
        match self.via {
            Some(_) => format!("route del {}", self.prefix),
            None => format!("route del local {} dev lo", self.prefix),
        }
    }
}

/// The routes the host whose address on the shared network is `host`
/// needs: one per metadata group and one per storage-node prefix.
pub fn host_routes(table: &Table, host: IpAddr) -> Vec<Route> {
    let mut owned: Vec<(Addr, u8, IpAddr)> = Vec::new();
    for (mg, slot) in table.mg_owner.iter().enumerate() {
        if let Some(m) = table.mns.iter().find(|m| m.slot == *slot) {
            let (prefix, len) = table.layout.mg_prefix(mg as u32);
            owned.push((prefix, len, m.endpoint.ip()));
        }
    }
    for s in &table.sns {
        owned.push((table.layout.sn_prefix(s.index), 64, s.endpoint.ip()));
    }
    owned
        .into_iter()
        .map(|(prefix, len, owner)| Route {
            prefix: format!("{}/{len}", fmt_addr(prefix)),
            via: (owner != host).then_some(owner),
        })
        .collect()
}

/// Keeps one host's routes equal to what the table says, changing only
/// what differs from what it installed last.
#[derive(Debug, Default)]
pub struct RouteKeeper {
    installed: BTreeMap<String, Route>,
    /// When the last attempt failed: the same routes are not tried again
    /// for [`RETRY_AFTER`] (a node without `CAP_NET_ADMIN` would otherwise
    /// run `ip` at every table refresh).
    failed: Option<(BTreeMap<String, Route>, Instant)>,
}

/// How long a failed set of routes waits before it is tried again.
pub const RETRY_AFTER: Duration = Duration::from_secs(30);

impl RouteKeeper {
    /// A keeper that has installed nothing yet.
    pub fn new() -> RouteKeeper {
        RouteKeeper::default()
    }

    /// Brings the host's routes in line with `table` for `host`; returns how
    /// many routes it added, changed or removed (0 when nothing changed,
    /// without running `ip`). Needs `CAP_NET_ADMIN`.
    pub fn sync(&mut self, table: &Table, host: IpAddr) -> Result<usize, Error> {
        let wanted: BTreeMap<String, Route> = host_routes(table, host)
            .into_iter()
            .map(|r| (r.prefix.clone(), r))
            .collect();
        let mut lines = Vec::new();
        for (prefix, old) in &self.installed {
            // A local route lives in the local table, which the kernel
            // consults first: it must go before a route via another host
            // can take effect.
            if wanted
                .get(prefix)
                .is_none_or(|r| r.via.is_none() != old.via.is_none())
            {
                lines.push(old.remove_line());
            }
        }
        let changed = wanted
            .iter()
            .filter(|(prefix, r)| self.installed.get(*prefix) != Some(*r))
            .count();
        if changed == 0 && lines.is_empty() {
            return Ok(0);
        }
        if let Some((routes, at)) = &self.failed {
            if *routes == wanted && at.elapsed() < RETRY_AFTER {
                return Ok(0);
            }
        }
        let removed = lines.len();
        lines.extend(wanted.values().map(Route::install_line));
        if let Err(e) = run_ip_batch(&lines.join("\n")) {
            self.failed = Some((wanted, Instant::now()));
            return Err(e);
        }
        self.failed = None;
        self.installed = wanted;
        Ok(changed + removed)
    }
}

/// Runs `ip -6 -force -batch -` with `batch` on its input (`-force` goes on
/// past a line that fails, such as removing a route already gone).
fn run_ip_batch(batch: &str) -> Result<(), Error> {
    let mut child = Command::new("ip")
        .args(["-6", "-force", "-batch", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| Error::io("running `ip` to install routes (is iproute2 installed?)", e))?;
    if let Some(mut input) = child.stdin.take() {
        input
            .write_all(batch.as_bytes())
            .map_err(|e| Error::io("writing routes to `ip -batch`", e))?;
    }
    let out = child
        .wait_with_output()
        .map_err(|e| Error::io("waiting for `ip -batch`", e))?;
    // With -force, ip reports failed lines on stderr but may still exit 0
    // when some succeeded; route replace lines must all succeed.
    let errors = String::from_utf8_lossy(&out.stderr);
    let fatal: Vec<&str> = errors
        .lines()
        .filter(|l| !l.trim().is_empty() && !l.contains("No such process"))
        .filter(|l| !l.starts_with("Command failed"))
        .collect();
    if !fatal.is_empty() {
        return Err(Error::config(format!(
            "installing routes with `ip -6 route` failed: {} (routed mode needs CAP_NET_ADMIN; \
             or start the node with --no-routes and install `strata store routes` yourself)",
            fatal.join("; ")
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use strata_store_protocol::addr::{Layout, DEFAULT_CLUSTER_PREFIX};
    use strata_store_protocol::table::{Device, MnEntry, Params, SnEntry, State};

    fn table() -> Table {
        Table {
            epoch: 1,
            layout: Layout::new(DEFAULT_CLUSTER_PREFIX, 4),
            routed: true,
            params: Params::default(),
            buckets: vec![],
            mns: vec![MnEntry {
                uuid: 1,
                slot: 0,
                endpoint: "[fd00::2]:7481".parse().unwrap(),
                state: State::Up,
            }],
            mg_owner: vec![0; 16],
            sns: vec![SnEntry {
                uuid: 2,
                index: 1,
                endpoint: "[fd00::3]:7482".parse().unwrap(),
                capacity: 100,
                free: 50,
                objects: 0,
                device: Device::Ssd,
                state: State::Up,
            }],
            moves: vec![],
            stand_ins: vec![],
            drains: vec![],
            keys: Vec::new(),
            on_keys: None,
            revoked: Vec::new(),
        }
    }

    #[test]
    fn a_host_routes_its_own_prefixes_locally_and_others_via_their_owner() {
        let t = table();
        let at_mn = host_routes(&t, "fd00::2".parse().unwrap());
        assert_eq!(at_mn.len(), 16 + 1);
        assert_eq!(at_mn.iter().filter(|r| r.via.is_none()).count(), 16);
        assert!(at_mn[0]
            .install_line()
            .starts_with("route replace local fd53:7472:6174::"));
        let sn = &at_mn[16];
        assert_eq!(sn.via, Some("fd00::3".parse().unwrap()));
        assert_eq!(sn.prefix, "fd53:7472:6174:1::/64");
        assert_eq!(
            sn.install_line(),
            "route replace fd53:7472:6174:1::/64 via fd00::3"
        );
        assert_eq!(sn.remove_line(), "route del fd53:7472:6174:1::/64");
        let at_client = host_routes(&t, "fd00::9".parse().unwrap());
        assert!(at_client.iter().all(|r| r.via.is_some()));
        assert!(at_client[0].install_line().ends_with(" via fd00::2"));
    }
}
