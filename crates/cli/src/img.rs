//! `strata img`: qemu-img-like commands on images and chains.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use clap::{Subcommand, ValueEnum};
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

#[path = "img_ops.rs"]
mod img_ops;
#[path = "img_stream.rs"]
mod img_stream;

/// Output format, as qemu-img's `--output`.
#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Output {
    /// Text for people.
    Human,
    /// JSON for programs.
    Json,
}

/// `strata img` subcommands.
#[derive(Subcommand)]
pub enum ImgCommand {
    /// Create an image, optionally on top of a backing file.
    Create {
        /// Format of the new image.
        #[arg(short = 'f', default_value = "qcow2")]
        format: String,
        /// Backing file (stored as given; relative to the new image's directory).
        #[arg(short = 'b')]
        backing: Option<String>,
        /// Backing file format.
        #[arg(short = 'F')]
        backing_format: Option<String>,
        /// Options: cluster_size, compat, refcount_bits, lazy_refcounts,
        /// compression_type, chain_index (comma separated key=value).
        #[arg(short = 'o')]
        options: Vec<String>,
        /// Print nothing.
        #[arg(short = 'q')]
        quiet: bool,
        /// Output format.
        #[arg(long, value_enum, default_value = "human")]
        output: Output,
        /// The new image.
        #[arg(value_parser = stdio::image())]
        filename: PathBuf,
        /// Virtual size (512, 64k, 10G...); defaults to the backing file's.
        size: Option<String>,
    },
    /// Show information about an image (or its whole chain).
    Info {
        /// Format of the image (probed if absent).
        #[arg(short = 'f')]
        format: Option<String>,
        /// Show every image of the backing chain, top first.
        #[arg(long)]
        backing_chain: bool,
        /// Output format.
        #[arg(long, value_enum, default_value = "human")]
        output: Output,
        /// Open the image even while another process writes it (what is
        /// read may be inconsistent); without it such an image is refused.
        #[arg(short = 'U', long = "force-share")]
        force_share: bool,
        /// The image.
        #[arg(value_parser = stdio::image())]
        filename: PathBuf,
    },
    /// Check an image for leaks and corruption (exit 0 clean, 2 corrupt, 3 leaks).
    Check {
        /// Format of the image.
        #[arg(short = 'f')]
        format: Option<String>,
        /// Repair: "leaks" or "all".
        #[arg(short = 'r')]
        repair: Option<String>,
        /// Output format.
        #[arg(long, value_enum, default_value = "human")]
        output: Output,
        /// Print nothing.
        #[arg(short = 'q')]
        quiet: bool,
        /// Check the image even while another process writes it (what is
        /// counted may be inconsistent); not with -r.
        #[arg(short = 'U', long = "force-share")]
        force_share: bool,
        /// The image.
        #[arg(value_parser = stdio::image())]
        filename: PathBuf,
    },
    /// External snapshot: create NEW_TOP on top of IMAGE, carrying the chain index forward.
    Snapshot {
        /// Output format.
        #[arg(long, value_enum, default_value = "human")]
        output: Output,
        /// Print nothing.
        #[arg(short = 'q')]
        quiet: bool,
        /// The current top of the chain.
        #[arg(value_parser = stdio::image())]
        image: PathBuf,
        /// The new top layer to create (backed by IMAGE).
        #[arg(value_parser = stdio::image())]
        new_top: PathBuf,
    },
    /// Build the chain index of IMAGE's chain and store it in IMAGE.
    Index {
        /// Output format.
        #[arg(long, value_enum, default_value = "human")]
        output: Output,
        /// The top of the chain (opened for writing).
        #[arg(value_parser = stdio::image())]
        image: PathBuf,
    },
    /// Show the allocation map, with the layer owning each range.
    Map {
        /// Format of the image.
        #[arg(short = 'f')]
        format: Option<String>,
        /// Output format.
        #[arg(long, value_enum, default_value = "human")]
        output: Output,
        /// Open the image even while another process writes it (what is
        /// read may be inconsistent); without it such an image is refused.
        #[arg(short = 'U', long = "force-share")]
        force_share: bool,
        /// The image.
        #[arg(value_parser = stdio::image())]
        filename: PathBuf,
    },
    /// Copy an image or a whole chain (flattened) to a new image.
    Convert {
        /// Source format.
        #[arg(short = 'f')]
        format: Option<String>,
        /// Target format.
        #[arg(short = 'O', default_value = "raw")]
        out_format: String,
        /// Target options (as for create).
        #[arg(short = 'o')]
        options: Vec<String>,
        /// Show a progress bar.
        #[arg(short = 'p')]
        progress: bool,
        /// Print nothing.
        #[arg(short = 'q')]
        quiet: bool,
        /// The target's cache mode, as qemu-img's: `unsafe` (the default)
        /// writes everything in a safe order but does not wait for the
        /// disk; `writeback`, `writethrough`, `none` and `directsync` make
        /// the target durable before the command returns.
        #[arg(short = 't', value_name = "CACHE", default_value = "unsafe",
              value_parser = ["unsafe", "writeback", "writethrough", "none", "directsync"])]
        cache: String,
        /// Open the image even while another process writes it (what is
        /// read may be inconsistent); without it such an image is refused.
        #[arg(short = 'U', long = "force-share")]
        force_share: bool,
        /// Source image; `-`: a raw image on standard input (read once, in
        /// order, until it ends).
        source: Input,
        /// Target file (may be /dev/null for raw); `-`: standard output
        /// (-O raw only; every byte is written, zeros too).
        target: StdOutput,
    },
    /// Compare the content of two images (exit 0 same, 1 different, 2 error).
    Compare {
        /// First image's format.
        #[arg(short = 'f')]
        format_a: Option<String>,
        /// Second image's format.
        #[arg(short = 'F')]
        format_b: Option<String>,
        /// Strict: images of different sizes differ.
        #[arg(short = 's')]
        strict: bool,
        /// Show a progress bar.
        #[arg(short = 'p')]
        progress: bool,
        /// Print nothing.
        #[arg(short = 'q')]
        quiet: bool,
        /// Open the images even while another process writes them.
        #[arg(short = 'U', long = "force-share")]
        force_share: bool,
        /// First image.
        #[arg(value_parser = stdio::image())]
        first: PathBuf,
        /// Second image.
        #[arg(value_parser = stdio::image())]
        second: PathBuf,
    },
    /// Run a simple I/O benchmark (qemu-img bench's flags and access pattern).
    Bench {
        /// Requests to issue.
        #[arg(short = 'c', default_value_t = 75000)]
        count: u64,
        /// Requests in flight.
        #[arg(short = 'd', default_value_t = 64)]
        depth: u64,
        /// Image format.
        #[arg(short = 'f')]
        format: Option<String>,
        /// Bytes per request.
        #[arg(short = 's', default_value = "4k")]
        bufsize: String,
        /// Distance between request offsets (defaults to the buffer size).
        #[arg(short = 'S')]
        step: Option<String>,
        /// First offset.
        #[arg(short = 'o', default_value = "0")]
        offset: String,
        /// Write instead of read.
        #[arg(short = 'w')]
        write: bool,
        /// Byte written with -w.
        #[arg(long, default_value = "0xa5", value_parser = parse_byte)]
        pattern: u8,
        /// Metadata cache bound (default 32M).
        #[arg(long, default_value = "32M")]
        cache_size: String,
        /// Ignore the stored chain index and walk the chain.
        #[arg(long)]
        no_index: bool,
        /// Output format.
        #[arg(long, value_enum, default_value = "human")]
        output: Output,
        /// The image.
        #[arg(value_parser = stdio::image())]
        filename: PathBuf,
    },
    /// Change the virtual size (qemu-img resize).
    Resize(img_ops::ResizeArgs),
    /// Change the backing file, copying what differs unless -u (qemu-img rebase).
    Rebase(img_ops::RebaseArgs),
    /// Write an image's data into its backing file (qemu-img commit).
    Commit(img_ops::CommitArgs),
    /// Change header options of a qcow2 image (qemu-img amend).
    Amend(img_ops::AmendArgs),
    /// Compute the file size a new image needs (qemu-img measure).
    Measure(img_ops::MeasureArgs),
}

/// Runs one `strata img` command; returns the exit code.
pub fn run(cmd: ImgCommand) -> Result<i32> {
    match cmd {
        ImgCommand::Resize(a) => img_ops::run_resize(a),
        ImgCommand::Rebase(a) => img_ops::run_rebase(a),
        ImgCommand::Commit(a) => img_ops::run_commit(a),
        ImgCommand::Amend(a) => img_ops::run_amend(a),
        ImgCommand::Measure(a) => img_ops::run_measure(a),
        ImgCommand::Create {
            format,
            backing,
            backing_format,
            options,
            quiet,
            output,
            filename,
            size,
        } => {
            if let Some(backing) = &backing {
                stdio::refuse_dash("img create -b", backing, stdio::BACKING_WHY)?;
            }
            let mut opts = create_options(&options)?;
            opts.format = parse_format(&format)?;
            opts.backing = backing;
            opts.backing_format = backing_format.as_deref().map(parse_format).transpose()?;
            opts.size = size
                .as_deref()
                .map(parse_size)
                .transpose()
                .map_err(anyhow::Error::msg)?;
            let report = create(&filename, &opts)?;
            if output == Output::Json {
                print_json(&report)?;
            } else if !quiet {
                println!(
                    "Formatting '{}', fmt={} size={}{}",
                    filename.display(),
                    opts.format.name(),
                    report.size,
                    opts.backing
                        .as_ref()
                        .map(|b| format!(" backing_file={b}"))
                        .unwrap_or_default()
                );
            }
            Ok(0)
        }
        ImgCommand::Info {
            format,
            backing_chain,
            output,
            force_share,
            filename,
        } => {
            let fmt = format.as_deref().map(parse_format).transpose()?;
            let infos = if backing_chain {
                info::chain_info(&filename, fmt, force_share)?
            } else {
                vec![info::info(&filename, fmt, force_share)?]
            };
            match (output, backing_chain) {
                (Output::Json, true) => print_qemu_json(&infos)?,
                (Output::Json, false) => print_qemu_json(&infos[0])?,
                (Output::Human, _) => {
                    for (i, inf) in infos.iter().enumerate() {
                        if i > 0 {
                            println!();
                        }
                        print_info(inf);
                    }
                }
            }
            Ok(0)
        }
        ImgCommand::Check {
            format,
            repair,
            output,
            quiet,
            force_share,
            filename,
        } => {
            let probed = match format.as_deref() {
                Some(f) => parse_format(f)?,
                None => Format::parse(&info::info(&filename, None, true)?.format)?,
            };
            // qemu-img's answer (and exit code) for formats without checks.
            if probed != Format::Qcow2 {
                eprintln!("strata: This image format does not support checks");
                return Ok(63);
            }
            let repair = match repair.as_deref() {
                None => Repair::None,
                Some("leaks") => Repair::Leaks,
                Some("all") => Repair::All,
                Some(other) => bail!("-r takes 'leaks' or 'all', not '{other}'"),
            };
            let report = check::check_shared(&filename, repair, force_share)?;
            // As qemu-img: the problems on stderr, the summary on stdout.
            for m in &report.messages {
                eprintln!("{m}");
            }
            if output == Output::Json {
                print_qemu_json(&report)?;
            } else if !quiet {
                print_check(&report);
            }
            Ok(report.exit_code())
        }
        ImgCommand::Snapshot {
            output,
            quiet,
            image,
            new_top,
        } => {
            // Only the current top's header is needed here; `create` opens
            // the chain once to carry its index forward.
            let current = info::info(&image, None, false)?;
            let mut opts = CreateOptions {
                backing: Some(backing_name(&image, &new_top)),
                backing_format: Some(Format::parse(&current.format)?),
                ..CreateOptions::default()
            };
            if let Some(cs) = current.cluster_size {
                opts.cluster_size = cs;
            }
            if let Some(q) = &current.format_specific {
                opts.refcount_bits = q.refcount_bits;
                // The new layer keeps the L2 format of the one it covers.
                opts.extended_l2 = q.extended_l2;
                if q.compression_type == "zstd" {
                    opts.compression = CompressionType::Zstd;
                }
            }
            let report = create(&new_top, &opts)?;
            if output == Output::Json {
                print_json(&report)?;
            } else if !quiet {
                println!(
                    "Created {} (layer {} of the chain) in {:.1} ms; index {} bytes, file {} bytes",
                    new_top.display(),
                    report.depth,
                    report.seconds * 1000.0,
                    report.index_bytes,
                    report.file_bytes
                );
            }
            Ok(0)
        }
        ImgCommand::Index { output, image } => {
            let started = std::time::Instant::now();
            let disk = Disk::open(&image, &OpenOptions::read_write())?;
            let state = disk.index_state();
            let depth = disk.depth();
            disk.close()?;
            let seconds = started.elapsed().as_secs_f64();
            if output == Output::Json {
                print_json(&serde_json::json!({
                    "filename": image.display().to_string(),
                    "layers": depth,
                    "index": state,
                    "seconds": seconds,
                }))?;
            } else {
                println!(
                    "Indexed {} ({depth} layers) in {:.3} s",
                    image.display(),
                    seconds
                );
            }
            Ok(0)
        }
        ImgCommand::Map {
            format,
            output,
            force_share,
            filename,
        } => {
            let disk = open_ro(&filename, format.as_deref(), None, force_share)?;
            let extents = map::map(&disk)?;
            Ok(if output == Output::Json {
                print_map_json(&extents);
                0
            } else {
                print_map_human(&extents)
            })
        }
        ImgCommand::Convert {
            format,
            out_format,
            options,
            progress,
            quiet,
            cache,
            force_share,
            source,
            target,
        } => {
            let durable = convert::ConvertOptions {
                flush: cache != "unsafe",
            };
            let mut opts = create_options(&options)?;
            opts.format = parse_format(&out_format)?;
            let show = progress && !quiet;
            let report = match (&source, &target) {
                (Input::File(source), StdOutput::File(target)) => {
                    let src = open_ro(source, format.as_deref(), None, force_share)?;
                    let bar = progress_bar(show, src.size());
                    let report =
                        convert::convert_with(&src, target, &opts, &durable, &mut |done, _| {
                            bar.set_position(done)
                        })?;
                    bar.finish_and_clear();
                    report
                }
                _ => convert_stream(
                    &source,
                    &target,
                    format.as_deref(),
                    &opts,
                    show,
                    force_share,
                )?,
            };
            if !quiet && progress {
                // When standard output carries the image, it carries nothing else.
                let line = format!(
                    "Converted {} in {:.2} s ({} written)",
                    human(report.size),
                    report.seconds,
                    human(report.bytes_written)
                );
                if target.is_stdout() {
                    eprintln!("{line}");
                } else {
                    println!("{line}");
                }
            }
            Ok(0)
        }
        ImgCommand::Compare {
            format_a,
            format_b,
            strict,
            progress,
            quiet,
            force_share,
            first,
            second,
        } => {
            let result = (|| -> Result<Comparison> {
                let a = open_ro(&first, format_a.as_deref(), None, force_share)?;
                let b = open_ro(&second, format_b.as_deref(), None, force_share)?;
                let bar = progress_bar(progress && !quiet, a.size().max(b.size()));
                let r = compare::compare(&a, &b, strict, &mut |done, _| bar.set_position(done))?;
                bar.finish_and_clear();
                Ok(r)
            })();
            match result {
                Ok(Comparison::Identical) => {
                    if !quiet {
                        println!("Images are identical.");
                    }
                    Ok(0)
                }
                Ok(Comparison::Mismatch { offset }) => {
                    if !quiet {
                        println!("Content mismatch at offset {offset}!");
                    }
                    Ok(1)
                }
                Ok(Comparison::SizeMismatch { .. }) => {
                    if !quiet {
                        println!("Strict mode: Image size mismatch!");
                    }
                    Ok(1)
                }
                Err(e) => {
                    eprintln!("strata: {e:#}");
                    Ok(2)
                }
            }
        }
        ImgCommand::Bench {
            count,
            depth,
            format,
            bufsize,
            step,
            offset,
            write,
            pattern,
            cache_size,
            no_index,
            output,
            filename,
        } => {
            let cache = parse_size(&cache_size).map_err(anyhow::Error::msg)?;
            let opened = std::time::Instant::now();
            let disk = Disk::open(
                &filename,
                &OpenOptions {
                    writable: write,
                    cache_bytes: cache,
                    format: format.as_deref().map(parse_format).transpose()?,
                    ignore_index: no_index,
                    force_share: false,
                },
            )?;
            let open_seconds = opened.elapsed().as_secs_f64();
            let params = BenchParams {
                count,
                depth,
                bufsize: parse_size(&bufsize).map_err(anyhow::Error::msg)?,
                step: step
                    .as_deref()
                    .map(parse_size)
                    .transpose()
                    .map_err(anyhow::Error::msg)?,
                offset: parse_size(&offset).map_err(anyhow::Error::msg)?,
                write,
                pattern,
            };
            let report = bench::run(&disk, &params)?;
            let stats = disk.cache_stats();
            let index = disk.index_state();
            disk.close()?;
            if output == Output::Json {
                print_json(&serde_json::json!({
                    "ops": report.ops,
                    "seconds": report.seconds,
                    "iops": report.iops,
                    "bytes_per_second": report.bytes_per_second,
                    "open_seconds": open_seconds,
                    "cache": stats,
                    "index": index,
                }))?;
            } else {
                println!(
                    "Sending {count} {} requests, {} bytes each, {depth} in parallel",
                    if write { "write" } else { "read" },
                    params.bufsize
                );
                println!("Run completed in {:.3} seconds.", report.seconds);
            }
            Ok(0)
        }
    }
}

/// `img convert` with `-` as its source or target: a raw stream.
fn convert_stream(
    source: &Input,
    target: &StdOutput,
    format: Option<&str>,
    options: &CreateOptions,
    show: bool,
    force_share: bool,
) -> Result<convert::ConvertReport> {
    let started = std::time::Instant::now();
    let destination = match target {
        StdOutput::Stdout => {
            img_stream::check_raw_stdout(options.format)?;
            None
        }
        StdOutput::File(path) => Some(path.as_path()),
    };
    let (size, bar) = match source {
        Input::File(path) => {
            let src = open_ro(path, format, None, force_share)?;
            let bar = progress_bar(show, src.size());
            (
                img_stream::disk_to_stdout(&src, &|done| bar.set_position(done))?,
                bar,
            )
        }
        Input::Stdin => {
            // The length is unknown until the input ends.
            let bar = progress_bar(show, 0);
            let progress = |done| {
                bar.set_length(done);
                bar.set_position(done)
            };
            (
                img_stream::stdin_to(format, destination, options, &progress)?,
                bar,
            )
        }
    };
    bar.finish_and_clear();
    Ok(convert::ConvertReport {
        size,
        bytes_written: size,
        seconds: started.elapsed().as_secs_f64(),
    })
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

fn parse_byte(s: &str) -> Result<u8, String> {
    let parsed = match s.strip_prefix("0x") {
        Some(hex) => u8::from_str_radix(hex, 16),
        None => s.parse(),
    };
    parsed.map_err(|_| format!("'{s}' is not a byte (0-255 or 0x00-0xff)"))
}

fn parse_format(s: &str) -> Result<Format> {
    Ok(Format::parse(s)?)
}

/// How NEW_TOP should name IMAGE: relative to NEW_TOP's directory when both
/// share one, else absolute.
fn backing_name(image: &Path, new_top: &Path) -> String {
    let img_dir = image.parent().unwrap_or(Path::new(""));
    let new_dir = new_top.parent().unwrap_or(Path::new(""));
    if img_dir == new_dir {
        if let Some(name) = image.file_name() {
            return name.to_string_lossy().into_owned();
        }
    }
    std::fs::canonicalize(image)
        .unwrap_or_else(|_| image.to_path_buf())
        .display()
        .to_string()
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

/// Prints `v` as qemu-img prints JSON (QEMU's pretty printer): four
/// spaces of indent, and empty arrays and objects split over two lines.
pub(crate) fn print_qemu_json<T: serde::Serialize>(v: &T) -> Result<()> {
    let mut out = Vec::new();
    let mut ser = serde_json::Serializer::with_formatter(&mut out, QemuFormatter { indent: 0 });
    v.serialize(&mut ser)?;
    println!("{}", String::from_utf8_lossy(&out));
    Ok(())
}

/// serde_json formatter for QEMU's JSON layout.
struct QemuFormatter {
    indent: usize,
}

impl QemuFormatter {
    fn newline<W: ?Sized + std::io::Write>(&self, w: &mut W) -> std::io::Result<()> {
        w.write_all(b"\n")?;
        for _ in 0..self.indent {
            w.write_all(b"    ")?;
        }
        Ok(())
    }
}

impl serde_json::ser::Formatter for QemuFormatter {
    fn begin_array<W: ?Sized + std::io::Write>(&mut self, w: &mut W) -> std::io::Result<()> {
        self.indent += 1;
        w.write_all(b"[")
    }
    fn end_array<W: ?Sized + std::io::Write>(&mut self, w: &mut W) -> std::io::Result<()> {
        self.indent -= 1;
        self.newline(w)?;
        w.write_all(b"]")
    }
    fn begin_array_value<W: ?Sized + std::io::Write>(
        &mut self,
        w: &mut W,
        first: bool,
    ) -> std::io::Result<()> {
        if !first {
            w.write_all(b",")?;
        }
        self.newline(w)
    }
    fn end_array_value<W: ?Sized + std::io::Write>(&mut self, _: &mut W) -> std::io::Result<()> {
        Ok(())
    }
    fn begin_object<W: ?Sized + std::io::Write>(&mut self, w: &mut W) -> std::io::Result<()> {
        self.indent += 1;
        w.write_all(b"{")
    }
    fn end_object<W: ?Sized + std::io::Write>(&mut self, w: &mut W) -> std::io::Result<()> {
        self.indent -= 1;
        self.newline(w)?;
        w.write_all(b"}")
    }
    fn begin_object_key<W: ?Sized + std::io::Write>(
        &mut self,
        w: &mut W,
        first: bool,
    ) -> std::io::Result<()> {
        if !first {
            w.write_all(b",")?;
        }
        self.newline(w)
    }
    fn begin_object_value<W: ?Sized + std::io::Write>(&mut self, w: &mut W) -> std::io::Result<()> {
        w.write_all(b": ")
    }
    fn end_object_value<W: ?Sized + std::io::Write>(&mut self, _: &mut W) -> std::io::Result<()> {
        Ok(())
    }
}

/// A size as QEMU's `size_to_str` writes it: three significant digits
/// ("%0.3g") in the unit that keeps the number below 1000 ("0.977 MiB").
fn qemu_size(bytes: u64) -> String {
    const SUFFIXES: [&str; 7] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
    let scaled = bytes as f64 / (1000.0 / 1024.0);
    // frexp's exponent: scaled = m * 2^e with m in [0.5, 1).
    let exponent = if scaled == 0.0 {
        0
    } else {
        ((scaled.to_bits() >> 52) & 0x7ff) as i64 - 1022
    };
    // C's integer division truncates toward zero.
    let i = ((exponent - 1) / 10).clamp(0, 6) as usize;
    let value = bytes as f64 / (1u64 << (i * 10)) as f64;
    format!("{} {}", format_g3(value), SUFFIXES[i])
}

/// C's "%0.3g" for a non-negative number.
fn format_g3(value: f64) -> String {
    if value == 0.0 {
        return "0".into();
    }
    // The decimal exponent after rounding to three significant digits.
    let sci = format!("{value:.2e}");
    let exp: i32 = sci
        .split_once('e')
        .and_then(|(_, e)| e.parse().ok())
        .unwrap_or(0);
    if !(-4..3).contains(&exp) {
        let (mantissa, _) = sci.split_once('e').unwrap_or((&sci, ""));
        let mantissa = trim_fraction(mantissa);
        let sign = if exp < 0 { '-' } else { '+' };
        return format!("{mantissa}e{sign}{:02}", exp.abs());
    }
    let decimals = (2 - exp).max(0) as usize;
    trim_fraction(&format!("{value:.decimals$}")).to_string()
}

/// "1.50" -> "1.5", "2.00" -> "2", as %g drops trailing zeros.
fn trim_fraction(s: &str) -> &str {
    if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.')
    } else {
        s
    }
}

/// Prints one image as `qemu-img info` does (QEMU 10's
/// `bdrv_node_info_dump`), then Strata's own lines.
fn print_info(inf: &ImageInfo) {
    println!("image: {}", inf.filename);
    println!("file format: {}", inf.format);
    println!(
        "virtual size: {} ({} bytes)",
        qemu_size(inf.virtual_size),
        inf.virtual_size
    );
    println!("disk size: {}", qemu_size(inf.actual_size));
    if let Some(cs) = inf.cluster_size {
        println!("cluster_size: {cs}");
    }
    if inf.dirty_flag {
        println!("cleanly shut down: no");
    }
    if let Some(b) = &inf.backing_filename {
        match &inf.full_backing_filename {
            Some(full) if full != b => println!("backing file: {b} (actual path: {full})"),
            Some(_) => println!("backing file: {b}"),
            None => println!("backing file: {b} (cannot determine actual path)"),
        }
    }
    if let Some(f) = &inf.backing_filename_format {
        println!("backing file format: {f}");
    }
    if !inf.snapshots.is_empty() {
        println!("Snapshot list:");
        println!(
            "{:<7} {:<16} {:>8} {:>19} {:>15} {:>10}",
            "ID", "TAG", "VM_SIZE", "DATE", "VM_CLOCK", "ICOUNT"
        );
        for s in &inf.snapshots {
            let secs = s.vm_clock_sec;
            let clock = format!(
                "{:04}:{:02}:{:02}.{:03}",
                secs / 3600,
                (secs / 60) % 60,
                secs % 60,
                s.vm_clock_nsec / 1_000_000
            );
            println!(
                "{:<7} {:<16} {:>8} {:>19} {:>15} {:>10}",
                s.id,
                s.name,
                qemu_size(s.vm_state_size),
                local_date(s.date_sec),
                clock,
                s.icount.map(|n| n.to_string()).unwrap_or_default()
            );
        }
    }
    if let Some(q) = &inf.format_specific {
        println!("Format specific information:");
        for (key, value) in q.fields() {
            println!("    {}: {value}", key.replace('-', " "));
            // QEMU's key order puts the bitmaps right after this one.
            if key == "lazy-refcounts" {
                print_bitmaps(&q.bitmaps);
            }
        }
    }
    for child in &inf.children {
        println!("Child node '/{}':", child.name);
        println!("    filename: {}", child.info.filename);
        println!("    protocol type: {}", child.info.format);
        println!(
            "    file length: {} ({} bytes)",
            qemu_size(child.info.virtual_size),
            child.info.virtual_size
        );
        println!("    disk size: {}", qemu_size(child.info.actual_size));
    }
    if let Some(ci) = &inf.chain_index {
        let state = match (ci.in_use, &ci.reason) {
            (Some(true), _) => "in use".to_string(),
            (Some(false), Some(r)) => format!("not used: {r}"),
            _ if ci.flag_set => "stored".to_string(),
            _ => "stale (flag cleared by another writer)".to_string(),
        };
        println!(
            "Strata chain index: {state}; {} layers, {} per entry, {} bytes",
            ci.depth,
            human(ci.granularity),
            ci.bytes
        );
    }
}

/// The bitmaps as qemu-img's human dump of its QAPI objects shows them.
fn print_bitmaps(bitmaps: &[strata_disk::info::BitmapInfo]) {
    if bitmaps.is_empty() {
        return;
    }
    println!("    bitmaps:");
    for (i, b) in bitmaps.iter().enumerate() {
        println!("        [{i}]:");
        println!("            flags:");
        for (j, f) in b.flags.iter().enumerate() {
            println!("                [{j}]: {f}");
        }
        println!("            name: {}", b.name);
        println!("            granularity: {}", b.granularity);
    }
}

/// Seconds since the epoch as local "%Y-%m-%d %H:%M:%S", as qemu-img
/// dates snapshots.
fn local_date(secs: u32) -> String {
    let t = libc::time_t::from(secs);
    // SAFETY: localtime_r only writes the tm we hand it.
    let mut tm: libc::tm = unsafe { std::mem::zeroed() };
    if unsafe { libc::localtime_r(&t, &mut tm) }.is_null() {
        return secs.to_string();
    }
    format!(
        "{:04}-{:02}-{:02} {:02}:{:02}:{:02}",
        tm.tm_year + 1900,
        tm.tm_mon + 1,
        tm.tm_mday,
        tm.tm_hour,
        tm.tm_min,
        tm.tm_sec
    )
}

/// Prints a check report as `qemu-img check` does (its
/// `dump_human_image_check`), then Strata's chain index line.
fn print_check(r: &strata_disk::check::CheckReport) {
    if r.leaks_fixed > 0 || r.corruptions_fixed > 0 {
        println!(
            "The following inconsistencies were found and repaired:\n\n    {} leaked clusters\n    {} corruptions\n\nDouble checking the fixed image now...",
            r.leaks_fixed, r.corruptions_fixed
        );
    }
    if r.corruptions == 0 && r.leaks == 0 && r.check_errors == 0 {
        println!("No errors were found on the image.");
    } else {
        if r.corruptions > 0 {
            println!(
                "\n{} errors were found on the image.\nData may be corrupted, or further writes to the image may corrupt it.",
                r.corruptions
            );
        }
        if r.leaks > 0 {
            println!(
                "\n{} leaked clusters were found on the image.\nThis means waste of disk space, but no harm to data.",
                r.leaks
            );
        }
        if r.check_errors > 0 {
            println!(
                "\n{} internal errors have occurred during the check.",
                r.check_errors
            );
        }
    }
    if r.total_clusters != 0 && r.allocated_clusters != 0 {
        let allocated = r.allocated_clusters as f64;
        println!(
            "{}/{} = {:.2}% allocated, {:.2}% fragmented, {:.2}% compressed clusters",
            r.allocated_clusters,
            r.total_clusters,
            allocated * 100.0 / r.total_clusters as f64,
            r.fragmented_clusters as f64 * 100.0 / allocated,
            r.compressed_clusters as f64 * 100.0 / allocated
        );
    }
    if r.image_end_offset != 0 {
        println!("Image end offset: {}", r.image_end_offset);
    }
    if let Some(ci) = &r.chain_index {
        println!("Strata chain index: {ci}");
    }
}

/// C's "%#-16x" as qemu-img map uses it: "0" for zero, else "0x...",
/// left-aligned in 16 columns.
fn map_hex(v: u64) -> String {
    let s = if v == 0 {
        "0".to_string()
    } else {
        format!("{v:#x}")
    };
    format!("{s:<16}")
}

/// Prints the map as `qemu-img map` does: the data ranges with their
/// host offset and file. Compressed data has no host offset to print: as
/// qemu-img, stop there with an error (exit 1); `--output json` shows it.
fn print_map_human(extents: &[map::MapExtent]) -> i32 {
    println!(
        "{}{}{}File",
        map_hex_title("Offset"),
        map_hex_title("Length"),
        map_hex_title("Mapped to")
    );
    for e in extents {
        if e.data && e.offset.is_none() {
            eprintln!("strata: File contains external, encrypted or compressed clusters.");
            return 1;
        }
        if e.data && !e.zero {
            println!(
                "{}{}{}{}",
                map_hex(e.start),
                map_hex(e.length),
                map_hex(e.offset.unwrap_or(0)),
                e.filename.as_deref().unwrap_or("")
            );
        }
    }
    0
}

fn map_hex_title(title: &str) -> String {
    format!("{title:<16}")
}

/// Prints the map as `qemu-img map --output json` does: one object per
/// line, qemu-img's keys in its order, then Strata's owning layer.
fn print_map_json(extents: &[map::MapExtent]) {
    let mut out = String::from("[");
    for (i, e) in extents.iter().enumerate() {
        out.push_str(&format!(
            "{{ \"start\": {}, \"length\": {}, \"depth\": {}, \"present\": {}, \"zero\": {}, \"data\": {}, \"compressed\": {}",
            e.start, e.length, e.depth, e.present, e.zero, e.data, e.compressed
        ));
        if let Some(o) = e.offset {
            out.push_str(&format!(", \"offset\": {o}"));
        }
        out.push_str(&format!(", \"layer\": {}}}", e.layer));
        if i + 1 < extents.len() {
            out.push_str(",\n");
        }
    }
    out.push(']');
    println!("{out}");
}
