//! `strata-bench`: declarative benchmarks that mix I/O workloads with
//! control operations on volumes (after CNSBench). A YAML spec
//! ([`spec`]) names volume groups (reached over NBD, or through a file
//! system: [`attach`]), workloads (fio, pgbench ([`pgbench`]) or any
//! command), control operations (create, delete, snapshot, clone,
//! resize, compact, restore-and-verify ([`verify`])) and the rates that
//! drive them ([`rate`]); a run
//! drives a provider ([`provider`]: Strata's volume daemon, or a null
//! provider as the ceiling), records one JSON line per operation and the
//! workloads' I/O per second ([`record`]), cleans up everything it made,
//! and a report ([`report`]) summarizes or compares runs (from the run's
//! results database, [`results`]), or draws them on an HTML page
//! ([`html`]), several runs' rates against their parallelism too
//! ([`parallelism`]). [`s3_load`] is apart: a load generator for
//! S3 gateways and plain HTTP servers. Never prints:
//! progress goes to the caller as events.

pub mod attach;
pub mod bounded;
pub mod cleanup;
pub mod daemon_usage;
pub mod error;
pub mod html;
pub mod inventory;
pub mod metrics;
pub mod output_parser;
pub mod parallelism;
pub mod pgbench;
pub mod provider;
pub mod rate;
pub mod record;
pub mod report;
pub mod results;
pub mod run;
pub mod s3_load;
pub mod sink;
pub mod spec;
pub mod units;
pub mod verify;
pub mod workload;
