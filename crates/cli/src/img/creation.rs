//! `strata img create | snapshot | index`: new images and layers, and
//! the chain index of an existing chain.

use super::*;

/// Runs `strata img create`; returns the exit code.
pub(super) fn create_image(args: CreateArgs) -> Result<i32> {
    let CreateArgs {
        format,
        backing,
        backing_format,
        options,
        quiet,
        output,
        filename,
        size,
    } = args;
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

/// Runs `strata img snapshot`; returns the exit code.
pub(super) fn snapshot(args: SnapshotArgs) -> Result<i32> {
    let SnapshotArgs {
        output,
        quiet,
        image,
        new_top,
    } = args;
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

/// Runs `strata img index`; returns the exit code.
pub(super) fn index(args: IndexArgs) -> Result<i32> {
    let IndexArgs { output, image } = args;
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
