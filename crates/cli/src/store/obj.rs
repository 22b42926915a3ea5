//! `strata obj`: put, get, list, rename and delete objects.

use super::*;

/// Runs a `strata obj` subcommand.
pub fn run_obj(cmd: ObjCommand) -> Result<i32> {
    crate::serve::init_logging();
    runtime()?.block_on(obj(cmd))
}

pub(super) async fn connect(c: &ClusterArg, tenant: &TenantArg) -> Result<Client> {
    let credential = tenant.load()?;
    Ok(Client::connect(c.cluster, credential).await?)
}

pub(super) fn record_json(r: &strata_store_protocol::wire::Record) -> serde_json::Value {
    json!({
        "name": r.name,
        "size": r.size,
        "crc32c": format!("{:08x}", r.crc),
        "version": r.version,
        "metadata_addresses": r.meta.iter().map(|&a| strata_store_protocol::addr::fmt_addr(a)).collect::<Vec<_>>(),
        "replicas": r.replicas.iter().map(|&a| strata_store_protocol::addr::fmt_addr(a)).collect::<Vec<_>>(),
        "rename": match &r.rename {
            None => serde_json::Value::Null,
            Some(RenameLink::To(n)) => json!({"to": n}),
            Some(RenameLink::From(n)) => json!({"from": n}),
        },
        "class": record_class(r),
        "inline": r.inline.is_some(),
        "fragment_crc32c": r.fragments.as_ref().map(|f| {
            f.crcs.iter().map(|c| format!("{c:08x}")).collect::<Vec<_>>()
        }),
    })
}

/// How a record's data is kept: its storage class, or `inline` for an
/// object whose bytes are inside the record (on its metadata copies).
fn record_class(r: &strata_store_protocol::wire::Record) -> String {
    if r.inline.is_some() {
        return "inline (in its record, on every metadata copy)".to_string();
    }
    let class = match &r.fragments {
        Some(f) => StorageClass::ErasureCoded {
            data: f.data,
            parity: f.parity(),
        },
        None => StorageClass::Replicated {
            copies: r.replicas.len() as u8,
        },
    };
    class.to_string()
}

pub(super) async fn obj(cmd: ObjCommand) -> Result<i32> {
    match cmd {
        ObjCommand::Put {
            cluster,
            tenant,
            progress,
            class,
            file,
            name,
        } => {
            let class = class
                .map(|c| StorageClass::parse(&c).map_err(anyhow::Error::msg))
                .transpose()
                .context("invalid --class")?;
            if file == Input::Stdin && tenant.credential == Some(Input::Stdin) {
                bail!(
                    "obj put: the object's data and --credential both read standard input \
                     ('-'): give the credential as a file (or in {CREDENTIAL_ENV})"
                );
            }
            let client = connect(&cluster, &tenant).await?;
            let mut f = open_source(&file).await?;
            let size = f.metadata().await?.len();
            let bar = progress_bar(progress, size);
            let r = client
                .put_in_class(
                    &name,
                    size,
                    &mut f,
                    &|done| bar.set_position(done),
                    class,
                    || Ok(Vec::new()),
                )
                .await
                .with_context(|| format!("could not post '{name}'"))?;
            bar.finish_and_clear();
            if cluster.output == Output::Json {
                println!(
                    "{}",
                    json!({"name": name, "size": size, "version": r.version, "crc32c": format!("{:08x}", r.crc), "copies": r.copies, "data_fragments": r.data_fragments, "inline": r.inline})
                );
            } else {
                let kept = match r.data_fragments {
                    _ if r.inline => "inline in its record".to_string(),
                    0 if r.copies == 1 => "1 copy".to_string(),
                    0 => format!("{} copies", r.copies),
                    k => format!(
                        "{} fragments in ec({k},{})",
                        r.copies,
                        r.replicas.len().saturating_sub(usize::from(k))
                    ),
                };
                println!(
                    "posted {name}: {} version {} crc32c {:08x}, {kept}",
                    human(size),
                    r.version,
                    r.crc,
                );
            }
        }
        ObjCommand::Get {
            cluster,
            tenant,
            progress,
            replica_choice,
            range,
            name,
            file,
        } => {
            let client = connect(&cluster, &tenant).await?;
            client.set_replica_choice(replica_choice.parse().map_err(anyhow::Error::msg)?);
            let tmp = match &file {
                StdOutput::Stdout => None,
                StdOutput::File(path) => Some(tmp_path(path)),
            };
            let mut f = match &tmp {
                None => tokio::fs::File::from_std(spool_file()?),
                Some(tmp) => tokio::fs::File::create(tmp)
                    .await
                    .with_context(|| format!("could not create '{}'", tmp.display()))?,
            };
            let bar = progress_bar(progress, 0);
            let told = |done| bar.set_position(done);
            let got = match &range {
                None => client.get(&name, &mut f, &told).await.map(|r| (r.size, r)),
                Some(range) => get_range(&client, &name, range, &mut f, &told).await,
            };
            bar.finish_and_clear();
            let (length, record) = match got {
                Ok(r) => r,
                Err(e) => {
                    if let Some(tmp) = &tmp {
                        let _ = std::fs::remove_file(tmp);
                    }
                    return Err(anyhow::Error::new(e).context(format!("could not get '{name}'")));
                }
            };
            f.set_len(length).await?;
            let (Some(tmp), StdOutput::File(file)) = (tmp, &file) else {
                // The data goes to stdout, so the record goes nowhere: a
                // pipe is for the object's bytes only.
                let mut spool = f.into_std().await;
                std::io::Seek::rewind(&mut spool)?;
                stdio::copy_to_stdout(&mut spool)
                    .with_context(|| format!("could not write '{name}' to standard output"))?;
                return Ok(0);
            };
            f.sync_all().await?;
            std::fs::rename(&tmp, file)
                .with_context(|| format!("could not rename into '{}'", file.display()))?;
            if cluster.output == Output::Json {
                println!("{}", record_json(&record));
            }
        }
        ObjCommand::Rm {
            cluster,
            tenant,
            name,
        } => {
            let client = connect(&cluster, &tenant).await?;
            let v = client
                .delete(&name)
                .await
                .with_context(|| format!("could not delete '{name}'"))?;
            if cluster.output == Output::Json {
                println!("{}", json!({"deleted": name, "version": v}));
            }
        }
        ObjCommand::Mv {
            cluster,
            tenant,
            from,
            to,
        } => {
            let client = connect(&cluster, &tenant).await?;
            // Tests stop a rename between its steps (STRATA_FAILPOINT=
            // rename-after-marked, -linked or -dropped).
            let r = client
                .rename_with(&from, &to, &|step| {
                    let point = match step {
                        RenameStep::Marked => "rename-after-marked",
                        RenameStep::Linked => "rename-after-linked",
                        RenameStep::Dropped => "rename-after-dropped",
                    };
                    strata_volume::failpoint::failpoint(point);
                })
                .await
                .with_context(|| format!("could not rename '{from}' to '{to}'"))?;
            if cluster.output == Output::Json {
                println!("{}", record_json(&r));
            }
        }
        ObjCommand::Stat {
            cluster,
            tenant,
            name,
        } => {
            let client = connect(&cluster, &tenant).await?;
            let r = client
                .stat(&name)
                .await
                .with_context(|| format!("could not stat '{name}'"))?;
            if cluster.output == Output::Json {
                println!("{}", serde_json::to_string_pretty(&record_json(&r))?);
            } else {
                println!("name: {}", r.name);
                println!("size: {} ({} bytes)", human(r.size), r.size);
                println!("crc32c: {:08x}", r.crc);
                println!("version: {}", r.version);
                match &r.rename {
                    Some(RenameLink::To(n)) => println!("being renamed to: {n} (interrupted?)"),
                    Some(RenameLink::From(n)) => println!("renamed from: {n} (not finished)"),
                    None => {}
                }
                for a in &r.meta {
                    println!(
                        "metadata address: {}",
                        strata_store_protocol::addr::fmt_addr(*a)
                    );
                }
                println!("class: {}", record_class(&r));
                match &r.fragments {
                    Some(f) => {
                        for (index, (a, crc)) in r.replicas.iter().zip(&f.crcs).enumerate() {
                            let kind = if index < usize::from(f.data) {
                                "data"
                            } else {
                                "parity"
                            };
                            println!(
                                "fragment {index} ({kind}): {} crc32c {crc:08x}",
                                strata_store_protocol::addr::fmt_addr(*a)
                            );
                        }
                    }
                    None => {
                        for a in &r.replicas {
                            println!("replica: {}", strata_store_protocol::addr::fmt_addr(*a));
                        }
                    }
                }
            }
        }
        ObjCommand::Ls {
            cluster,
            tenant,
            prefix,
            limit,
            after,
            all,
        } => {
            let client = connect(&cluster, &tenant).await?;
            let mut after = after;
            let mut entries = Vec::new();
            let cursor = loop {
                let (page, cursor) = client.list(&prefix, &after, limit).await?;
                entries.extend(page);
                match cursor {
                    Some(c) if all => after = c,
                    c => break c,
                }
            };
            if cluster.output == Output::Json {
                let items: Vec<_> = entries
                    .iter()
                    .map(|e| json!({"name": e.name, "size": e.size, "version": e.version}))
                    .collect();
                println!("{}", json!({"objects": items, "next": cursor}));
            } else {
                for e in &entries {
                    println!("{:>10}  {}", human(e.size), e.name);
                }
                if let Some(c) = cursor {
                    println!("(more: --after '{c}')");
                }
            }
        }
    }
    Ok(0)
}

/// The file `obj put` reads: FILE, or with `-` its standard input, copied
/// first to an unlinked spool file (a Post declares its size up front).
pub(super) async fn open_source(file: &Input) -> Result<tokio::fs::File> {
    if let Input::File(file) = file {
        return tokio::fs::File::open(file)
            .await
            .with_context(|| format!("could not open '{}'", file.display()));
    }
    let mut spool = spool_file()?;
    std::io::copy(&mut std::io::stdin().lock(), &mut spool)
        .context("could not read the object's data from standard input")?;
    let mut f = tokio::fs::File::from_std(spool);
    tokio::io::AsyncSeekExt::rewind(&mut f).await?;
    Ok(f)
}

/// An unlinked read-write file in the temporary directory ($TMPDIR):
/// room for an object on its way from stdin or to stdout, gone with the
/// process.
pub(super) fn spool_file() -> Result<std::fs::File> {
    let dir = std::env::temp_dir();
    let path = dir.join(format!(".strata-spool-{}", std::process::id()));
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .open(&path)
        .with_context(|| {
            format!(
                "could not create a spool file in '{}' (set TMPDIR to a writable directory)",
                dir.display()
            )
        })?;
    std::fs::remove_file(&path)
        .with_context(|| format!("could not unlink the spool file '{}'", path.display()))?;
    Ok(file)
}

pub(super) fn tmp_path(file: &std::path::Path) -> PathBuf {
    let mut name = file
        .file_name()
        .map(|n| n.to_os_string())
        .unwrap_or_default();
    name.push(format!(".strata-part-{}", std::process::id()));
    file.with_file_name(name)
}

/// Reads the bytes `range` (both ends included) of `name` into `out`:
/// their length and the object's record. A range beyond the object is
/// an error that says its size.
async fn get_range(
    client: &Client,
    name: &str,
    range: &std::ops::RangeInclusive<u64>,
    out: &mut tokio::fs::File,
    progress: &(dyn Fn(u64) + Sync),
) -> Result<(u64, strata_store_client::protocol::wire::Record), strata_store_client::protocol::Error>
{
    let opened = client.open(name).await?;
    let size = opened.record.size;
    if *range.end() >= size {
        let held = match size {
            0 => "is empty: no range of it can be read".to_string(),
            _ => format!("holds {size} bytes (0-{}); ask within them", size - 1),
        };
        return Err(strata_store_client::protocol::Error::config(format!(
            "--range {}-{}: '{name}' {held}",
            range.start(),
            range.end()
        )));
    }
    let span = *range.start()..range.end() + 1;
    client
        .read_range(&opened, span.clone(), out, progress)
        .await?;
    Ok((span.end - span.start, opened.record))
}
