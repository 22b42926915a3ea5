//! `strata img`: qemu-img-like commands on images and chains, one module
//! per group of subcommands.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand, ValueEnum};
use indicatif::{ProgressBar, ProgressStyle};
use strata_disk::bench::{self, BenchParams};
use strata_disk::check::{self, Repair};
use strata_disk::compare::{self, Comparison};
use strata_disk::convert;
use strata_disk::info::{self, ImageInfo};
use strata_disk::layer::Format;
use strata_disk::map;
use strata_disk::{create, CreateOptions, Disk, OpenOptions};
use strata_format::CompressionType;

use crate::stdio::{self, Input, Output as StdOutput};
use crate::units::{human, parse_size};

mod args;
mod benchmark;
mod conversion;
mod creation;
mod inspect;
mod ops;
mod qemu_json;
mod stream;

pub use args::*;
use qemu_json::print_qemu_json;

/// Runs one `strata img` command; returns the exit code.
pub fn run(cmd: ImgCommand) -> Result<i32> {
    match cmd {
        ImgCommand::Resize(a) => ops::run_resize(a),
        ImgCommand::Rebase(a) => ops::run_rebase(a),
        ImgCommand::Commit(a) => ops::run_commit(a),
        ImgCommand::Amend(a) => ops::run_amend(a),
        ImgCommand::Measure(a) => ops::run_measure(a),
        ImgCommand::Create(a) => creation::create_image(a),
        ImgCommand::Info(a) => inspect::info(a),
        ImgCommand::Check(a) => inspect::check(a),
        ImgCommand::Snapshot(a) => creation::snapshot(a),
        ImgCommand::Index(a) => creation::index(a),
        ImgCommand::Map(a) => inspect::map_image(a),
        ImgCommand::Convert(a) => conversion::convert(a),
        ImgCommand::Compare(a) => conversion::compare(a),
        ImgCommand::Bench(a) => benchmark::bench(a),
    }
}

fn open_ro(
    path: &Path,
    format: Option<&str>,
    cache: Option<u64>,
    force_share: bool,
) -> Result<Disk> {
    let mut opts = OpenOptions::read_only();
    opts.force_share = force_share;
    opts.format = format.map(parse_format).transpose()?;
    if let Some(c) = cache {
        opts.cache_bytes = c;
    }
    Disk::open(path, &opts).with_context(|| format!("could not open '{}'", path.display()))
}

fn parse_format(s: &str) -> Result<Format> {
    Ok(Format::parse(s)?)
}

/// Parses `-o key=value,...` options.
fn create_options(options: &[String]) -> Result<CreateOptions> {
    let mut o = CreateOptions::default();
    for opt in options.iter().flat_map(|s| s.split(',')) {
        if opt.is_empty() {
            continue;
        }
        let (k, v) = opt.split_once('=').unwrap_or((opt, "on"));
        let on = |v: &str| -> Result<bool> {
            match v {
                "on" | "true" | "yes" => Ok(true),
                "off" | "false" | "no" => Ok(false),
                _ => bail!("option {k} takes on or off, not '{v}'"),
            }
        };
        match k {
            "cluster_size" => o.cluster_size = parse_size(v).map_err(anyhow::Error::msg)?,
            "compat" => {
                o.version = match v {
                    "0.10" | "v2" => 2,
                    "1.1" | "v3" => 3,
                    _ => bail!("compat must be 0.10 or 1.1, not '{v}'"),
                }
            }
            "refcount_bits" => o.refcount_bits = v.parse().context("refcount_bits")?,
            "lazy_refcounts" => o.lazy_refcounts = on(v)?,
            "compression_type" => {
                o.compression = match v {
                    "zlib" => CompressionType::Zlib,
                    "zstd" => CompressionType::Zstd,
                    _ => bail!("compression_type must be zlib or zstd, not '{v}'"),
                }
            }
            "chain_index" => o.chain_index = on(v)?,
            "backing_file" => o.backing = Some(v.to_string()),
            "backing_fmt" => o.backing_format = Some(parse_format(v)?),
            "preallocation" if v == "off" => {}
            "extended_l2" => o.extended_l2 = on(v)?,
            _ => bail!("unknown option '{k}' (known: cluster_size, compat, refcount_bits, lazy_refcounts, compression_type, chain_index, extended_l2, backing_file, backing_fmt)"),
        }
    }
    Ok(o)
}

pub(crate) fn progress_bar(show: bool, total: u64) -> ProgressBar {
    if !show {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(total);
    if let Ok(style) = ProgressStyle::with_template(
        "    ({percent:>3}/100%) {wide_bar} {bytes}/{total_bytes} {bytes_per_sec}",
    ) {
        bar.set_style(style);
    }
    bar
}

pub(crate) fn print_json<T: serde::Serialize>(v: &T) -> Result<()> {
    println!("{}", serde_json::to_string_pretty(v)?);
    Ok(())
}
