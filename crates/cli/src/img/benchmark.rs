//! `strata img bench`: I/O requests timed on an image (qemu-img bench).

use super::*;

/// Runs `strata img bench`; returns the exit code.
pub(super) fn bench(args: BenchArgs) -> Result<i32> {
    let BenchArgs {
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
    } = args;
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
