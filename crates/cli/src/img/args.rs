//! The arguments of `strata img`: the subcommands and their options.

use super::*;

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
    Create(CreateArgs),
    /// Show information about an image (or its whole chain).
    Info(InfoArgs),
    /// Check an image for leaks and corruption (exit 0 clean, 2 corrupt, 3 leaks).
    Check(CheckArgs),
    /// External snapshot: create NEW_TOP on top of IMAGE, carrying the chain index forward.
    Snapshot(SnapshotArgs),
    /// Build the chain index of IMAGE's chain and store it in IMAGE.
    Index(IndexArgs),
    /// Show the allocation map, with the layer owning each range.
    Map(MapArgs),
    /// Copy an image or a whole chain (flattened) to a new image.
    Convert(ConvertArgs),
    /// Compare the content of two images (exit 0 same, 1 different, 2 error).
    Compare(CompareArgs),
    /// Run a simple I/O benchmark (qemu-img bench's flags and access pattern).
    Bench(BenchArgs),
    /// Change the virtual size (qemu-img resize).
    Resize(ops::ResizeArgs),
    /// Change the backing file, copying what differs unless -u (qemu-img rebase).
    Rebase(ops::RebaseArgs),
    /// Write an image's data into its backing file (qemu-img commit).
    Commit(ops::CommitArgs),
    /// Change header options of a qcow2 image (qemu-img amend).
    Amend(ops::AmendArgs),
    /// Compute the file size a new image needs (qemu-img measure).
    Measure(ops::MeasureArgs),
}

/// `strata img create`.
#[derive(Args)]
pub struct CreateArgs {
    /// Format of the new image.
    #[arg(short = 'f', default_value = "qcow2")]
    pub(super) format: String,
    /// Backing file (stored as given; relative to the new image's directory).
    #[arg(short = 'b')]
    pub(super) backing: Option<String>,
    /// Backing file format.
    #[arg(short = 'F')]
    pub(super) backing_format: Option<String>,
    /// Options: cluster_size, compat, refcount_bits, lazy_refcounts,
    /// compression_type, chain_index (comma separated key=value).
    #[arg(short = 'o')]
    pub(super) options: Vec<String>,
    /// Print nothing.
    #[arg(short = 'q')]
    pub(super) quiet: bool,
    /// Output format.
    #[arg(long, value_enum, default_value = "human")]
    pub(super) output: Output,
    /// The new image.
    #[arg(value_parser = stdio::image())]
    pub(super) filename: PathBuf,
    /// Virtual size (512, 64k, 10G...); defaults to the backing file's.
    pub(super) size: Option<String>,
}

/// `strata img info`.
#[derive(Args)]
pub struct InfoArgs {
    /// Format of the image (probed if absent).
    #[arg(short = 'f')]
    pub(super) format: Option<String>,
    /// Show every image of the backing chain, top first.
    #[arg(long)]
    pub(super) backing_chain: bool,
    /// Output format.
    #[arg(long, value_enum, default_value = "human")]
    pub(super) output: Output,
    /// Open the image even while another process writes it (what is
    /// read may be inconsistent); without it such an image is refused.
    #[arg(short = 'U', long = "force-share")]
    pub(super) force_share: bool,
    /// The image.
    #[arg(value_parser = stdio::image())]
    pub(super) filename: PathBuf,
}

/// `strata img check`.
#[derive(Args)]
pub struct CheckArgs {
    /// Format of the image.
    #[arg(short = 'f')]
    pub(super) format: Option<String>,
    /// Repair: "leaks" or "all".
    #[arg(short = 'r')]
    pub(super) repair: Option<String>,
    /// Output format.
    #[arg(long, value_enum, default_value = "human")]
    pub(super) output: Output,
    /// Print nothing.
    #[arg(short = 'q')]
    pub(super) quiet: bool,
    /// Check the image even while another process writes it (what is
    /// counted may be inconsistent); not with -r.
    #[arg(short = 'U', long = "force-share")]
    pub(super) force_share: bool,
    /// The image.
    #[arg(value_parser = stdio::image())]
    pub(super) filename: PathBuf,
}

/// `strata img snapshot`.
#[derive(Args)]
pub struct SnapshotArgs {
    /// Output format.
    #[arg(long, value_enum, default_value = "human")]
    pub(super) output: Output,
    /// Print nothing.
    #[arg(short = 'q')]
    pub(super) quiet: bool,
    /// The current top of the chain.
    #[arg(value_parser = stdio::image())]
    pub(super) image: PathBuf,
    /// The new top layer to create (backed by IMAGE).
    #[arg(value_parser = stdio::image())]
    pub(super) new_top: PathBuf,
}

/// `strata img index`.
#[derive(Args)]
pub struct IndexArgs {
    /// Output format.
    #[arg(long, value_enum, default_value = "human")]
    pub(super) output: Output,
    /// The top of the chain (opened for writing).
    #[arg(value_parser = stdio::image())]
    pub(super) image: PathBuf,
}

/// `strata img map`.
#[derive(Args)]
pub struct MapArgs {
    /// Format of the image.
    #[arg(short = 'f')]
    pub(super) format: Option<String>,
    /// Output format.
    #[arg(long, value_enum, default_value = "human")]
    pub(super) output: Output,
    /// Open the image even while another process writes it (what is
    /// read may be inconsistent); without it such an image is refused.
    #[arg(short = 'U', long = "force-share")]
    pub(super) force_share: bool,
    /// The image.
    #[arg(value_parser = stdio::image())]
    pub(super) filename: PathBuf,
}

/// `strata img convert`.
#[derive(Args)]
pub struct ConvertArgs {
    /// Source format.
    #[arg(short = 'f')]
    pub(super) format: Option<String>,
    /// Target format.
    #[arg(short = 'O', default_value = "raw")]
    pub(super) out_format: String,
    /// Target options (as for create).
    #[arg(short = 'o')]
    pub(super) options: Vec<String>,
    /// Show a progress bar.
    #[arg(short = 'p')]
    pub(super) progress: bool,
    /// Print nothing.
    #[arg(short = 'q')]
    pub(super) quiet: bool,
    /// The target's cache mode, as qemu-img's: `unsafe` (the default)
    /// writes everything in a safe order but does not wait for the
    /// disk; `writeback`, `writethrough`, `none` and `directsync` make
    /// the target durable before the command returns.
    #[arg(short = 't', value_name = "CACHE", default_value = "unsafe",
          value_parser = ["unsafe", "writeback", "writethrough", "none", "directsync"])]
    pub(super) cache: String,
    /// Open the image even while another process writes it (what is
    /// read may be inconsistent); without it such an image is refused.
    #[arg(short = 'U', long = "force-share")]
    pub(super) force_share: bool,
    /// Source image; `-`: a raw image on standard input (read once, in
    /// order, until it ends).
    pub(super) source: Input,
    /// Target file (may be /dev/null for raw); `-`: standard output
    /// (-O raw only; every byte is written, zeros too).
    pub(super) target: StdOutput,
}

/// `strata img compare`.
#[derive(Args)]
pub struct CompareArgs {
    /// First image's format.
    #[arg(short = 'f')]
    pub(super) format_a: Option<String>,
    /// Second image's format.
    #[arg(short = 'F')]
    pub(super) format_b: Option<String>,
    /// Strict: images of different sizes differ.
    #[arg(short = 's')]
    pub(super) strict: bool,
    /// Show a progress bar.
    #[arg(short = 'p')]
    pub(super) progress: bool,
    /// Print nothing.
    #[arg(short = 'q')]
    pub(super) quiet: bool,
    /// Open the images even while another process writes them.
    #[arg(short = 'U', long = "force-share")]
    pub(super) force_share: bool,
    /// First image.
    #[arg(value_parser = stdio::image())]
    pub(super) first: PathBuf,
    /// Second image.
    #[arg(value_parser = stdio::image())]
    pub(super) second: PathBuf,
}

/// `strata img bench`.
#[derive(Args)]
pub struct BenchArgs {
    /// Requests to issue.
    #[arg(short = 'c', default_value_t = 75000)]
    pub(super) count: u64,
    /// Requests in flight.
    #[arg(short = 'd', default_value_t = 64)]
    pub(super) depth: u64,
    /// Image format.
    #[arg(short = 'f')]
    pub(super) format: Option<String>,
    /// Bytes per request.
    #[arg(short = 's', default_value = "4k")]
    pub(super) bufsize: String,
    /// Distance between request offsets (defaults to the buffer size).
    #[arg(short = 'S')]
    pub(super) step: Option<String>,
    /// First offset.
    #[arg(short = 'o', default_value = "0")]
    pub(super) offset: String,
    /// Write instead of read.
    #[arg(short = 'w')]
    pub(super) write: bool,
    /// Byte written with -w.
    #[arg(long, default_value = "0xa5", value_parser = parse_byte)]
    pub(super) pattern: u8,
    /// Metadata cache bound (default 32M).
    #[arg(long, default_value = "32M")]
    pub(super) cache_size: String,
    /// Ignore the stored chain index and walk the chain.
    #[arg(long)]
    pub(super) no_index: bool,
    /// Output format.
    #[arg(long, value_enum, default_value = "human")]
    pub(super) output: Output,
    /// The image.
    #[arg(value_parser = stdio::image())]
    pub(super) filename: PathBuf,
}

/// A byte as `--pattern` takes it: decimal, or hexadecimal after `0x`.
fn parse_byte(s: &str) -> Result<u8, String> {
    let parsed = match s.strip_prefix("0x") {
        Some(hex) => u8::from_str_radix(hex, 16),
        None => s.parse(),
    };
    parsed.map_err(|_| format!("'{s}' is not a byte (0-255 or 0x00-0xff)"))
}
