//! `strata img convert | compare`: copying an image (or a raw stream) into
//! another, and comparing two.

use super::*;

/// Runs `strata img convert`; returns the exit code.
pub(super) fn convert(args: ConvertArgs) -> Result<i32> {
    let ConvertArgs {
        format,
        out_format,
        options,
        progress,
        quiet,
        cache,
        force_share,
        source,
        target,
    } = args;
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
            let report = convert::convert_with(&src, target, &opts, &durable, &mut |done, _| {
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

/// Runs `strata img compare`; returns the exit code.
pub(super) fn compare(args: CompareArgs) -> Result<i32> {
    let CompareArgs {
        format_a,
        format_b,
        strict,
        progress,
        quiet,
        force_share,
        first,
        second,
    } = args;
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
            stream::check_raw_stdout(options.format)?;
            None
        }
        StdOutput::File(path) => Some(path.as_path()),
    };
    let (size, bar) = match source {
        Input::File(path) => {
            let src = open_ro(path, format, None, force_share)?;
            let bar = progress_bar(show, src.size());
            (
                stream::disk_to_stdout(&src, &|done| bar.set_position(done))?,
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
                stream::stdin_to(format, destination, options, &progress)?,
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
