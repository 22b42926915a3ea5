//! The metadata service's `/metrics`: nodes alive and silent, files and
//! their bytes by tier, and the loss and recovery events recorded.

use redb::ReadableTable;

use crate::catalog::{decode, store_error, Catalog, FILES};
use crate::Result;

impl Catalog {
    /// The service's `/metrics`, in Prometheus' text format: nodes alive
    /// and silent, files and their bytes by tier (a scan of the catalog
    /// per scrape), and the events recorded.
    pub fn exposition(&self) -> Result<String> {
        use std::fmt::Write;
        let nodes = self.nodes()?;
        let alive = nodes.iter().filter(|n| n.alive).count();
        let txn = self
            .database
            .begin_read()
            .map_err(|e| store_error("reading", e))?;
        let files = txn
            .open_table(FILES)
            .map_err(|e| store_error("opening the files", e))?;
        let (mut counts, mut bytes) = ([0u64; 2], [0u64; 2]);
        for row in files.iter().map_err(|e| store_error("listing files", e))? {
            let (path, value) = row.map_err(|e| store_error("listing files", e))?;
            let entry = decode(path.value(), value.value())?;
            if entry.directory {
                continue;
            }
            let tier = usize::from(entry.ephemeral);
            counts[tier] += 1;
            bytes[tier] += entry.size;
        }
        let events = self.events(0, 1)?;
        let lost = self.lapsed.lock().len();
        let mut out = String::new();
        let _ = writeln!(
            out,
            "# HELP strata_f3_nodes Registered nodes, by whether their lease is current.\n\
             # TYPE strata_f3_nodes gauge\n\
             strata_f3_nodes{{state=\"alive\"}} {alive}\n\
             strata_f3_nodes{{state=\"silent\"}} {}\n\
             # HELP strata_f3_lapsed_nodes Nodes whose files were reported lost and that have not come back.\n\
             # TYPE strata_f3_lapsed_nodes gauge\n\
             strata_f3_lapsed_nodes {lost}",
            nodes.len() - alive
        );
        let _ = writeln!(
            out,
            "# HELP strata_f3_files Files in the namespace, by tier.\n# TYPE strata_f3_files gauge"
        );
        for (tier, index) in [("durable", 0), ("ephemeral", 1)] {
            let _ = writeln!(out, "strata_f3_files{{tier=\"{tier}\"}} {}", counts[index]);
        }
        let _ = writeln!(
            out,
            "# HELP strata_f3_file_bytes Bytes of the namespace's files, by tier.\n\
             # TYPE strata_f3_file_bytes gauge"
        );
        for (tier, index) in [("durable", 0), ("ephemeral", 1)] {
            let _ = writeln!(
                out,
                "strata_f3_file_bytes{{tier=\"{tier}\"}} {}",
                bytes[index]
            );
        }
        let _ = writeln!(
            out,
            "# HELP strata_f3_events_total Loss and recovery events recorded (the newest event's number).\n\
             # TYPE strata_f3_events_total counter\n\
             strata_f3_events_total {}",
            events.last
        );
        Ok(out)
    }
}
