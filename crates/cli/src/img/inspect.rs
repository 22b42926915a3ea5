//! `strata img info | check | map`, printed as qemu-img prints them.

use super::*;

/// Runs `strata img info`; returns the exit code.
pub(super) fn info(args: InfoArgs) -> Result<i32> {
    let InfoArgs {
        format,
        backing_chain,
        output,
        force_share,
        filename,
    } = args;
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

/// Runs `strata img check`; returns the exit code.
pub(super) fn check(args: CheckArgs) -> Result<i32> {
    let CheckArgs {
        format,
        repair,
        output,
        quiet,
        force_share,
        filename,
    } = args;
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

/// Runs `strata img map`; returns the exit code.
pub(super) fn map_image(args: MapArgs) -> Result<i32> {
    let MapArgs {
        format,
        output,
        force_share,
        filename,
    } = args;
    let disk = open_ro(&filename, format.as_deref(), None, force_share)?;
    let extents = map::map(&disk)?;
    Ok(if output == Output::Json {
        print_map_json(&extents);
        0
    } else {
        print_map_human(&extents)
    })
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
