//! `strata img convert` with `-`: a raw image streamed from standard
//! input or to standard output. A stream is read or written once, in
//! order, so only raw data can go through it: a qcow2 image needs random
//! access.

use std::io::{Read, Write};
use std::os::unix::fs::FileExt;
use std::path::Path;

use anyhow::{bail, Context, Result};
use strata_disk::convert::{is_zero, open_raw_target};
use strata_disk::layer::Format;
use strata_disk::resize::{resize, SizeChange};
use strata_disk::{create, CreateOptions, Disk, OpenOptions};

/// Bytes read or written per step.
const STEP: usize = 2 << 20;

/// Unit of the zero runs left unwritten: 4 KiB in a raw file (as qemu-img's
/// `-S 4k`), a 64 KiB cluster in qcow2 (as `strata_disk::convert`).
const RAW_ZERO_STEP: usize = 4096;
const QCOW2_ZERO_STEP: usize = 64 * 1024;

/// Virtual size a qcow2 target starts with when the stream is longer than
/// its first step; it doubles as data comes, and is cut to the stream's
/// length at the end.
const FIRST_QCOW2_SIZE: u64 = 1 << 30;

/// The magic of a qcow2 header ("QFI\xfb").
const QCOW2_MAGIC: &[u8] = b"QFI\xfb";

/// Why standard input or output can only carry raw data.
const STREAM_WHY: &str = "a qcow2 image needs random access, which a pipe cannot give";

/// Writes every byte of `source`'s virtual disk to standard output, in
/// order (ranges that read as zeros are written as zeros: a pipe cannot
/// skip). `progress` gets the bytes written so far.
pub fn disk_to_stdout(source: &Disk, progress: &dyn Fn(u64)) -> Result<u64> {
    let size = source.size();
    let zeros = vec![0u8; STEP];
    let mut buffer = vec![0u8; STEP];
    let mut out = std::io::stdout().lock();
    let mut pos = 0u64;
    while pos < size {
        let length = (size - pos).min(STEP as u64) as usize;
        let data = if source.reads_as_zero(pos, length as u64)? {
            &zeros[..length]
        } else {
            source
                .read_at(&mut buffer[..length], pos)
                .with_context(|| format!("could not read the source at offset {pos}"))?;
            &buffer[..length]
        };
        out.write_all(data)
            .context("could not write to standard output")?;
        pos += length as u64;
        progress(pos);
    }
    out.flush().context("could not write to standard output")?;
    Ok(size)
}

/// Refuses `-O qcow2` (or any format but raw) to standard output.
pub fn check_raw_stdout(format: Format) -> Result<()> {
    if format != Format::Raw {
        bail!(
            "img convert: -O {} cannot write to target '-' (standard output): {STREAM_WHY}; \
             use -O raw, or give a file path",
            format.name()
        );
    }
    Ok(())
}

/// Checks that standard input, given with `-f format` (or none), can be
/// read as raw data; `first` is its first step, to recognise a qcow2
/// image given without -f.
fn check_raw_stdin(format: Option<&str>, first: &[u8]) -> Result<()> {
    match format.map(Format::parse).transpose()? {
        Some(Format::Raw) => Ok(()),
        Some(Format::Qcow2) => bail!(
            "img convert: source '-' (standard input) cannot be read with -f qcow2: \
             {STREAM_WHY}; give the image's file path, or stream a raw image with -f raw"
        ),
        None if first.starts_with(QCOW2_MAGIC) => bail!(
            "img convert: source '-' (standard input) holds a qcow2 image: {STREAM_WHY}; \
             give the image's file path, or stream a raw image"
        ),
        None => Ok(()),
    }
}

/// Reads standard input until `buffer` is full or the input ends; returns
/// the bytes read.
fn fill(input: &mut dyn Read, buffer: &mut [u8]) -> Result<usize> {
    let mut filled = 0;
    while filled < buffer.len() {
        match input.read(&mut buffer[filled..]) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e).context("could not read standard input"),
        }
    }
    Ok(filled)
}

/// Where a stream from standard input is written.
enum Sink {
    /// Standard output: bytes pass through.
    Stdout(std::io::StdoutLock<'static>),
    /// A raw file (sparse: zero blocks are skipped) or a device (every
    /// byte written, since it may hold old data).
    Raw { file: std::fs::File, special: bool },
    /// A new qcow2 image, grown as the stream goes on.
    Qcow2 { disk: Option<Box<Disk>>, size: u64 },
}

/// Copies the raw image on standard input to `target` (`None`: standard
/// output) in `options.format`; returns the bytes read. The length is
/// only known at the end: a qcow2 target is created with a provisional
/// size, grown as needed, then cut to the stream's length (rounded up to
/// 512 bytes, as qcow2 sizes are).
pub fn stdin_to(
    format: Option<&str>,
    target: Option<&Path>,
    options: &CreateOptions,
    progress: &dyn Fn(u64),
) -> Result<u64> {
    let mut input = std::io::stdin().lock();
    let mut buffer = vec![0u8; STEP];
    let mut length = fill(&mut input, &mut buffer)?;
    check_raw_stdin(format, &buffer[..length])?;
    let mut sink = open_sink(target, options, length < STEP, length as u64)?;
    let mut pos = 0u64;
    while length > 0 {
        sink.write(&buffer[..length], pos, target)?;
        pos += length as u64;
        progress(pos);
        length = fill(&mut input, &mut buffer)?;
    }
    sink.finish(pos, target)?;
    Ok(pos)
}

/// Opens the target of a stream; `known` says the whole stream is already
/// read and is `first` bytes long.
fn open_sink(
    target: Option<&Path>,
    options: &CreateOptions,
    known: bool,
    first: u64,
) -> Result<Sink> {
    let Some(path) = target else {
        return Ok(Sink::Stdout(std::io::stdout().lock()));
    };
    match options.format {
        Format::Raw => {
            let (file, special) = open_raw_target(path)
                .with_context(|| format!("could not create '{}'", path.display()))?;
            Ok(Sink::Raw { file, special })
        }
        Format::Qcow2 => {
            let size = if known {
                first.next_multiple_of(512)
            } else {
                FIRST_QCOW2_SIZE
            };
            let options = CreateOptions {
                size: Some(size),
                backing: None,
                backing_format: None,
                ..options.clone()
            };
            create(path, &options)?;
            Ok(Sink::Qcow2 {
                disk: Some(Box::new(open_target(path)?)),
                size,
            })
        }
    }
}

fn open_target(path: &Path) -> Result<Disk> {
    Disk::open(path, &OpenOptions::read_write())
        .with_context(|| format!("could not open '{}'", path.display()))
}

impl Sink {
    /// Writes `data` at `pos`, skipping zero blocks where the target
    /// already reads as zeros there.
    fn write(&mut self, data: &[u8], pos: u64, path: Option<&Path>) -> Result<()> {
        let name = || path.map_or_else(String::new, |p| p.display().to_string());
        match self {
            Sink::Stdout(out) => out
                .write_all(data)
                .context("could not write to standard output"),
            Sink::Raw { file, special } => {
                if *special {
                    return file
                        .write_all_at(data, pos)
                        .with_context(|| format!("could not write '{}'", name()));
                }
                for (index, block) in data.chunks(RAW_ZERO_STEP).enumerate() {
                    if !is_zero(block) {
                        let at = pos + (index * RAW_ZERO_STEP) as u64;
                        file.write_all_at(block, at)
                            .with_context(|| format!("could not write '{}'", name()))?;
                    }
                }
                Ok(())
            }
            Sink::Qcow2 { disk, size } => {
                let end = pos + data.len() as u64;
                if end > *size {
                    let path = path.context("a qcow2 target has a path")?;
                    let grown = (*size * 2).max(end.next_multiple_of(512));
                    resize_qcow2(disk, path, grown)?;
                    *size = grown;
                }
                let disk = disk.as_ref().context("the qcow2 target is open")?;
                for (index, block) in data.chunks(QCOW2_ZERO_STEP).enumerate() {
                    if !is_zero(block) {
                        disk.write_at(block, pos + (index * QCOW2_ZERO_STEP) as u64)?;
                    }
                }
                Ok(())
            }
        }
    }

    /// Ends the stream at `length` bytes: a raw file gets that length, a
    /// qcow2 image that size rounded up to 512 bytes, and is closed.
    fn finish(self, length: u64, path: Option<&Path>) -> Result<()> {
        match self {
            Sink::Stdout(mut out) => out.flush().context("could not write to standard output"),
            Sink::Raw { file, special } => {
                if !special {
                    file.set_len(length).with_context(|| {
                        format!(
                            "could not set the length of '{}'",
                            path.map(|p| p.display().to_string()).unwrap_or_default()
                        )
                    })?;
                }
                Ok(())
            }
            Sink::Qcow2 { mut disk, size } => {
                let path = path.context("a qcow2 target has a path")?;
                let exact = length.next_multiple_of(512);
                if exact != size {
                    resize_qcow2(&mut disk, path, exact)?;
                }
                match disk {
                    Some(disk) => disk
                        .close()
                        .with_context(|| format!("could not close '{}'", path.display())),
                    None => Ok(()),
                }
            }
        }
    }
}

/// Closes the qcow2 target, gives it `size` bytes (growing, or cutting
/// what lies past the stream's end: nothing was written there), and opens
/// it again.
fn resize_qcow2(disk: &mut Option<Box<Disk>>, path: &Path, size: u64) -> Result<()> {
    if let Some(open) = disk.take() {
        open.close()
            .with_context(|| format!("could not close '{}'", path.display()))?;
    }
    resize(path, Some(Format::Qcow2), SizeChange::To(size), true)
        .with_context(|| format!("could not resize '{}' to {size} bytes", path.display()))?;
    *disk = Some(Box::new(open_target(path)?));
    Ok(())
}
