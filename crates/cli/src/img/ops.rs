//! `strata img resize | rebase | commit | amend | measure`: qemu-img 10's
//! flags and output, on the disk engine (so the image locks apply).

use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use clap::Args;
use strata_disk::amend::{amend, AmendOptions};
use strata_disk::commit::{commit, CommitOptions};
use strata_disk::layer::Format;
use strata_disk::measure::{measure, MeasureSource, MeasureTarget, Measurement};
use strata_disk::rebase::{rebase, RebaseOptions};
use strata_disk::resize::{resize, SizeChange};

use crate::img::{print_json, progress_bar, Output};
use crate::stdio;
use crate::units::parse_size;

/// `strata img resize`.
#[derive(Args)]
pub struct ResizeArgs {
    /// Format of the image (probed if absent).
    #[arg(short = 'f')]
    format: Option<String>,
    /// Allow a smaller size: whatever lies past the new end is lost.
    #[arg(long)]
    shrink: bool,
    /// Print nothing.
    #[arg(short = 'q')]
    quiet: bool,
    /// The image.
    #[arg(value_parser = stdio::image())]
    filename: PathBuf,
    /// New size (10G), or a change of size (+1G, -512M).
    #[arg(allow_hyphen_values = true)]
    size: String,
}

/// `strata img rebase`.
#[derive(Args)]
pub struct RebaseArgs {
    /// Format of the image (probed if absent).
    #[arg(short = 'f')]
    format: Option<String>,
    /// Format of the new backing file (required with a non-empty -b).
    #[arg(short = 'F')]
    backing_format: Option<String>,
    /// Unsafe: only rewrite the backing name, copy nothing.
    #[arg(short = 'u')]
    unsafe_mode: bool,
    /// Show a progress bar.
    #[arg(short = 'p')]
    progress: bool,
    /// Print nothing.
    #[arg(short = 'q')]
    quiet: bool,
    /// New backing file, as it will be stored (relative to the image's
    /// directory); "" makes the image standalone.
    #[arg(short = 'b')]
    backing: String,
    /// The image.
    #[arg(value_parser = stdio::image())]
    filename: PathBuf,
}

/// `strata img commit`.
#[derive(Args)]
pub struct CommitArgs {
    /// Format of the image (probed if absent).
    #[arg(short = 'f')]
    format: Option<String>,
    /// Image of the backing chain to commit into (default: the backing
    /// file); implies -d.
    #[arg(short = 'b', value_parser = stdio::image())]
    base: Option<PathBuf>,
    /// Do not empty the image after the commit.
    #[arg(short = 'd')]
    keep: bool,
    /// Show a progress bar.
    #[arg(short = 'p')]
    progress: bool,
    /// Print nothing.
    #[arg(short = 'q')]
    quiet: bool,
    /// The image.
    #[arg(value_parser = stdio::image())]
    filename: PathBuf,
}

/// `strata img amend`.
#[derive(Args)]
pub struct AmendArgs {
    /// Options to change: lazy_refcounts=on|off, backing_file, backing_fmt.
    #[arg(short = 'o', required = true)]
    options: Vec<String>,
    /// Format of the image (probed if absent).
    #[arg(short = 'f')]
    format: Option<String>,
    /// Print nothing.
    #[arg(short = 'q')]
    quiet: bool,
    /// The image.
    #[arg(value_parser = stdio::image())]
    filename: PathBuf,
}

/// `strata img measure`.
#[derive(Args)]
pub struct MeasureArgs {
    /// Output format.
    #[arg(long, value_enum, default_value = "human")]
    output: Output,
    /// Format of the source image (probed if absent).
    #[arg(short = 'f')]
    format: Option<String>,
    /// Format of the image to be created.
    #[arg(short = 'O', default_value = "raw")]
    out_format: String,
    /// Options of the image to be created (as for create).
    #[arg(short = 'o')]
    options: Vec<String>,
    /// Measure a new empty image of this size.
    #[arg(long, conflicts_with = "filename")]
    size: Option<String>,
    /// Measure this image's content (its whole chain).
    #[arg(required_unless_present = "size", value_parser = stdio::image())]
    filename: Option<PathBuf>,
}

/// Runs `resize`.
pub fn run_resize(a: ResizeArgs) -> Result<i32> {
    let change = parse_change(&a.size)?;
    resize(&a.filename, format(&a.format)?, change, a.shrink)
        .with_context(|| format!("could not resize '{}'", a.filename.display()))?;
    if !a.quiet {
        println!("Image resized.");
    }
    Ok(0)
}

/// Runs `rebase`.
pub fn run_rebase(a: RebaseArgs) -> Result<i32> {
    stdio::refuse_dash("img rebase -b", &a.backing, stdio::BACKING_WHY)?;
    let opts = RebaseOptions {
        format: format(&a.format)?,
        backing_format: format(&a.backing_format)?,
        unsafe_mode: a.unsafe_mode,
    };
    let bar = progress_bar(a.progress && !a.quiet, 0);
    rebase(&a.filename, &a.backing, &opts, |done, total| {
        bar.set_length(total);
        bar.set_position(done);
    })
    .with_context(|| format!("could not rebase '{}'", a.filename.display()))?;
    bar.finish_and_clear();
    Ok(0)
}

/// Runs `commit`.
pub fn run_commit(a: CommitArgs) -> Result<i32> {
    let opts = CommitOptions {
        format: format(&a.format)?,
        base: a.base,
        keep_top: a.keep,
    };
    let bar = progress_bar(a.progress && !a.quiet, 0);
    commit(&a.filename, &opts, |done, total| {
        bar.set_length(total);
        bar.set_position(done);
    })
    .with_context(|| format!("could not commit '{}'", a.filename.display()))?;
    bar.finish_and_clear();
    if !a.quiet {
        println!("Image committed.");
    }
    Ok(0)
}

/// Runs `amend`.
pub fn run_amend(a: AmendArgs) -> Result<i32> {
    let opts = amend_options(&a.options)?;
    amend(&a.filename, format(&a.format)?, &opts)
        .with_context(|| format!("could not amend '{}'", a.filename.display()))?;
    let _ = a.quiet; // amend prints nothing on success, as in qemu-img
    Ok(0)
}

/// Runs `measure`.
pub fn run_measure(a: MeasureArgs) -> Result<i32> {
    let target = measure_target(&a.out_format, &a.options)?;
    let source = match (&a.size, &a.filename) {
        (Some(s), _) => MeasureSource::Size(parse_size(s).map_err(anyhow::Error::msg)?),
        (None, Some(f)) => MeasureSource::Image(f, format(&a.format)?),
        (None, None) => bail!("either --size SIZE or an image is required"),
    };
    let m = measure(source, &target).context("could not measure")?;
    match a.output {
        Output::Json => print_json(&m)?,
        Output::Human => print_measurement(&m),
    }
    Ok(0)
}

fn print_measurement(m: &Measurement) {
    println!("required size: {}", m.required);
    println!("fully allocated size: {}", m.fully_allocated);
    if let Some(b) = m.bitmaps {
        println!("bitmaps size: {b}");
    }
}

/// `SIZE`, `+SIZE` or `-SIZE`.
fn parse_change(s: &str) -> Result<SizeChange> {
    let size = |v: &str| parse_size(v).map_err(anyhow::Error::msg);
    Ok(match s.as_bytes().first() {
        Some(b'+') => SizeChange::Grow(size(&s[1..])?),
        Some(b'-') => SizeChange::Shrink(size(&s[1..])?),
        _ => SizeChange::To(size(s)?),
    })
}

fn format(name: &Option<String>) -> Result<Option<Format>> {
    Ok(name.as_deref().map(Format::parse).transpose()?)
}

/// Splits `-o a=b,c=d` (repeatable) into pairs.
fn pairs(options: &[String]) -> impl Iterator<Item = (&str, &str)> {
    options
        .iter()
        .flat_map(|s| s.split(','))
        .filter(|o| !o.is_empty())
        .map(|o| o.split_once('=').unwrap_or((o, "on")))
}

fn on_off(key: &str, v: &str) -> Result<bool> {
    match v {
        "on" | "true" | "yes" => Ok(true),
        "off" | "false" | "no" => Ok(false),
        _ => bail!("option {key} takes on or off, not '{v}'"),
    }
}

/// Parses amend's options; anything that is not a header-only change is
/// refused before the image is opened.
fn amend_options(options: &[String]) -> Result<AmendOptions> {
    let mut o = AmendOptions::default();
    for (k, v) in pairs(options) {
        match k {
            "lazy_refcounts" => o.lazy_refcounts = Some(on_off(k, v)?),
            "backing_file" => o.backing_file = Some(v.to_string()),
            "backing_fmt" => o.backing_format = Some(Format::parse(v)?),
            _ => bail!(
                "option '{k}' cannot be amended (supported: lazy_refcounts, backing_file, \
                 backing_fmt); nothing was changed"
            ),
        }
    }
    Ok(o)
}

/// The target of a measure, from `-O` and `-o`.
fn measure_target(out_format: &str, options: &[String]) -> Result<MeasureTarget> {
    let mut t = MeasureTarget {
        format: Format::parse(out_format)?,
        ..MeasureTarget::default()
    };
    let qcow2 = t.format == Format::Qcow2;
    for (k, v) in pairs(options) {
        match k {
            "preallocation" => {
                t.full_preallocation = match v {
                    "off" | "metadata" => false,
                    "falloc" | "full" => true,
                    _ => bail!("preallocation must be off, metadata, falloc or full, not '{v}'"),
                }
            }
            "cluster_size" if qcow2 => {
                t.cluster_size = parse_size(v).map_err(anyhow::Error::msg)?
            }
            "compat" if qcow2 => {
                t.version = match v {
                    "0.10" | "v2" => 2,
                    "1.1" | "v3" => 3,
                    _ => bail!("compat must be 0.10 or 1.1, not '{v}'"),
                }
            }
            "refcount_bits" if qcow2 => t.refcount_bits = v.parse().context("refcount_bits")?,
            "extended_l2" if qcow2 => t.extended_l2 = on_off(k, v)?,
            "backing_file" if qcow2 => t.has_backing = !v.is_empty(),
            // Accepted as qemu-img does; they do not change the figures.
            "backing_fmt" | "lazy_refcounts" | "compression_type" if qcow2 => {}
            _ => bail!("invalid parameter '{k}' for a {out_format} target"),
        }
    }
    if t.version < 3 && t.refcount_bits != 16 {
        bail!("compat=0.10 images only support refcount_bits=16");
    }
    Ok(t)
}
