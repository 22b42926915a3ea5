//! `strata store` (run and manage a cluster) and `strata obj` (objects),
//! one module per group of subcommands.

mod args;
mod bench;
mod keys;
mod node;
mod obj;
mod s3;
mod schedule;
mod status;
mod tenant;
mod up;

pub use args::*;
use bench::bench;
use keys::*;
use node::*;
pub use obj::run_obj;
use s3::*;
pub use s3::{run_s3, S3Args};
use schedule::*;
use status::*;
use tenant::*;
use up::*;

use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand};
use serde_json::json;
use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;
use strata_store::cluster::{Cluster, ClusterConfig};
use strata_store_client::admin;
use strata_store_client::client::local_metadata::LocalMetadata;
use strata_store_client::client::{Client, RenameStep};
use strata_store_protocol::auth::{
    fmt_fingerprint, sibling, ClusterKey, Fingerprints, KEY_FILE, NEXT_SUFFIX, PREV_SUFFIX,
};
use strata_store_protocol::class::StorageClass;
use strata_store_protocol::table::{Device, Params, Table};
use strata_store_protocol::tenant::{
    describe_scope, TenantCredential, ADMIN, ADMIN_CREDENTIAL_FILE, CREDENTIAL_ENV,
};
use strata_store_protocol::wire::RenameLink;

use crate::img::{progress_bar, Output};
use crate::stdio::{self, Input, Output as StdOutput};
use crate::units::{human, parse_size};

fn runtime() -> Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("could not start the async runtime")
}

fn parse_params(s: &str) -> Result<Params> {
    let v: Vec<u8> = s
        .split(',')
        .map(|x| x.trim().parse::<u8>())
        .collect::<Result<_, _>>()
        .with_context(|| format!("invalid replication '{s}': expected N_m,W_m,N_d,W_d"))?;
    let [n_m, w_m, n_d, w_d] = v[..] else {
        bail!("invalid replication '{s}': expected four numbers N_m,W_m,N_d,W_d");
    };
    let p = Params {
        n_m,
        w_m,
        n_d,
        w_d,
        data_fragments: 0,
    };
    p.validate().map_err(anyhow::Error::msg)?;
    Ok(p)
}

/// A storage class from the command line: `replicated` (keep the
/// replication as given), `replicated(N)` or `ec(K,M)`.
fn parse_class(text: &str) -> Result<Option<StorageClass>> {
    if text.trim() == "replicated" {
        return Ok(None);
    }
    StorageClass::parse(text)
        .map(Some)
        .map_err(anyhow::Error::msg)
}

/// Applies `--class` to the cluster's parameters and each
/// `--bucket-class NAME=CLASS` to that bucket's (its `--bucket` override,
/// or a copy of the cluster's).
fn apply_classes(cfg: &mut ClusterConfig, class: &str, buckets: &[String]) -> Result<()> {
    if let Some(class) = parse_class(class).context("invalid --class")? {
        cfg.params = cfg.params.with_class(class);
    }
    for entry in buckets {
        let (name, class) = entry.split_once('=').with_context(|| {
            format!("invalid --bucket-class '{entry}': expected NAME=CLASS, such as photos=ec(4,2)")
        })?;
        let class = parse_class(class)
            .with_context(|| format!("invalid --bucket-class '{entry}'"))?
            .unwrap_or(StorageClass::Replicated {
                copies: cfg.params.n_d,
            });
        match cfg.buckets.iter_mut().find(|(bucket, _)| bucket == name) {
            Some((_, params)) => *params = params.with_class(class),
            None => {
                let params = cfg.params.with_class(class);
                cfg.buckets.push((name.to_string(), params));
            }
        }
    }
    Ok(())
}

fn device(s: &str) -> Device {
    if s == "hdd" {
        Device::Hdd
    } else {
        Device::Ssd
    }
}

/// Runs a `strata store` subcommand.
pub fn run_store(cmd: StoreCommand) -> Result<i32> {
    crate::serve::init_logging();
    match cmd {
        StoreCommand::Up(args) => up(*args),
        StoreCommand::Status(args) => status(&args),
        StoreCommand::Routes(args) => routes(&args),
        StoreCommand::Node { command } => node(command),
        StoreCommand::Bench(args) => bench(args),
        StoreCommand::Key { command } => key_command(command),
        StoreCommand::Schedule(args) => schedule(*args),
        StoreCommand::Tenant {
            command: TenantCommand::Add(args),
        } => tenant_add(args),
        StoreCommand::Tenant {
            command: TenantCommand::Revoke(args),
        } => tenant_revoke(args),
    }
}
