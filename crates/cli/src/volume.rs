//! `strata volume ...` and `strata snapshot ...`: thin clients of the
//! daemon's HTTP API.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand, ValueEnum};
use indicatif::{ProgressBar, ProgressStyle};
use serde_json::{json, Value};

use crate::daemon::DEFAULT_API;
use crate::humanize;
use crate::units::{human, parse_size};

/// Output formats.
#[derive(Clone, Copy, ValueEnum, PartialEq, Eq)]
pub enum Output {
    /// Human-readable text.
    Human,
    /// The API's JSON, pretty-printed.
    Json,
}

/// Options every client command takes.
#[derive(Args)]
pub struct ClientArgs {
    /// Address of the daemon's API (or set STRATA_API).
    #[arg(long, global = true, env = "STRATA_API", default_value = DEFAULT_API)]
    api: String,
    /// The daemon's pool directory, whose api.token file holds the API
    /// token (or set STRATA_POOL; the default is the daemon's).
    #[arg(
        long,
        global = true,
        env = "STRATA_POOL",
        default_value = "strata-pool",
        value_parser = crate::stdio::directory()
    )]
    pool: PathBuf,
    /// File holding the API token (`-`: standard input; or set
    /// STRATA_TOKEN_FILE, or the token itself in STRATA_TOKEN) [default:
    /// POOL/api.token].
    #[arg(long = "token-file", global = true, env = "STRATA_TOKEN_FILE")]
    token_file: Option<PathBuf>,
    /// Output format.
    #[arg(long, global = true, value_enum, default_value = "human")]
    output: Output,
}

/// `strata volume` subcommands.
#[derive(Subcommand)]
pub enum VolumeCommand {
    /// Create an empty volume of SIZE (e.g. 10G) and export it over NBD.
    Create {
        /// Volume name (also the NBD export name).
        name: String,
        /// Size, with an optional K/M/G/T suffix.
        size: String,
        /// Cluster size of its layers (512 to 2M; default: the daemon's
        /// --cluster-size). 4k suits volumes snapshotted every few seconds.
        #[arg(long = "cluster-size")]
        cluster_size: Option<String>,
        /// Extended L2 entries (subclusters) in its layers, on or off
        /// (default: the daemon's --extended-l2; needs clusters of 16k or more).
        #[arg(long = "extended-l2", value_parser = ["on", "off"])]
        extended_l2: Option<String>,
    },
    /// List volumes.
    List,
    /// Show one volume.
    Info {
        /// Volume name.
        name: String,
    },
    /// Grow a volume (clients see the new size when they reconnect).
    Resize {
        /// Volume name.
        name: String,
        /// New size, with an optional K/M/G/T suffix.
        size: String,
    },
    /// Delete a volume and its snapshots (layers clones still read are kept).
    Delete {
        /// Volume name.
        name: String,
    },
    /// Merge the layers of a volume's chain that no snapshot or clone names
    /// (deleted snapshots, grows), online and paced; waits with a progress
    /// bar unless --no-wait.
    Compact {
        /// Volume name.
        name: String,
        /// Copy pace, bytes per second, with an optional K/M/G suffix
        /// (default 32M; at least 1M).
        #[arg(long)]
        rate: Option<String>,
        /// Start the compaction and return at once.
        #[arg(long, conflicts_with = "status")]
        no_wait: bool,
        /// Show the running or last compaction instead of starting one.
        #[arg(long)]
        status: bool,
    },
    /// Create volume NEW from SNAPSHOT (VOLUME@SNAPSHOT), sharing its layers.
    Clone {
        /// The snapshot, as VOLUME@SNAPSHOT.
        snapshot: String,
        /// Name of the new volume.
        new: String,
    },
}

/// `strata snapshot` subcommands.
#[derive(Subcommand)]
pub enum SnapshotCommand {
    /// Take a snapshot of a volume while it serves I/O.
    Create {
        /// Volume name.
        volume: String,
        /// Snapshot name.
        name: String,
        /// Return only once the snapshot's layer is durable on disk (by
        /// default it becomes durable with the volume's next flush, or
        /// within the daemon's `--durable-within`).
        #[arg(long)]
        sync: bool,
    },
    /// List a volume's snapshots.
    List {
        /// Volume name.
        volume: String,
    },
    /// Delete a snapshot (refused while a clone was made from it).
    Delete {
        /// Volume name.
        volume: String,
        /// Snapshot name.
        name: String,
    },
}

/// Runs a `strata volume` command.
pub fn run_volume(client: ClientArgs, command: VolumeCommand) -> Result<i32> {
    let api = Api::new(&client)?;
    let value = match command {
        VolumeCommand::Create {
            name,
            size,
            cluster_size,
            extended_l2,
        } => {
            let size = parse_size(&size).map_err(anyhow::Error::msg)?;
            let mut body = json!({"name": name, "size": size});
            if let Some(cs) = cluster_size {
                body["cluster_size"] = json!(parse_size(&cs).map_err(anyhow::Error::msg)?);
            }
            if let Some(on) = extended_l2 {
                body["extended_l2"] = json!(on == "on");
            }
            api.call("POST", "/v1/volumes", Some(body))?
        }
        VolumeCommand::List => api.call("GET", "/v1/volumes", None)?,
        VolumeCommand::Info { name } => api.call("GET", &format!("/v1/volumes/{name}"), None)?,
        VolumeCommand::Resize { name, size } => {
            let size = parse_size(&size).map_err(anyhow::Error::msg)?;
            api.call(
                "POST",
                &format!("/v1/volumes/{name}/resize"),
                Some(json!({"size": size})),
            )?
        }
        VolumeCommand::Delete { name } => {
            api.call("DELETE", &format!("/v1/volumes/{name}"), None)?
        }
        VolumeCommand::Compact {
            name,
            rate,
            no_wait,
            status,
        } => {
            let path = format!("/v1/volumes/{name}/compact");
            if status {
                api.call("GET", &path, None)?
            } else {
                let body = match rate {
                    Some(r) => json!({"rate": parse_size(&r).map_err(anyhow::Error::msg)?}),
                    None => json!({}),
                };
                let started = api.call("POST", &path, Some(body))?;
                if no_wait {
                    started
                } else {
                    let done = wait_for_compaction(&api, &path, client.output)?;
                    render(client.output, &done);
                    return Ok(if done["state"] == "done" { 0 } else { 1 });
                }
            }
        }
        VolumeCommand::Clone { snapshot, new } => {
            let Some((volume, snap)) = snapshot.split_once('@') else {
                bail!("give the snapshot as VOLUME@SNAPSHOT (got '{snapshot}')");
            };
            api.call(
                "POST",
                &format!("/v1/volumes/{volume}/snapshots/{snap}/clone"),
                Some(json!({"name": new})),
            )?
        }
    };
    render(client.output, &value);
    Ok(0)
}

/// Runs a `strata snapshot` command.
pub fn run_snapshot(client: ClientArgs, command: SnapshotCommand) -> Result<i32> {
    let api = Api::new(&client)?;
    let value = match command {
        SnapshotCommand::Create { volume, name, sync } => api.call(
            "POST",
            &format!("/v1/volumes/{volume}/snapshots"),
            Some(json!({"name": name, "sync": sync})),
        )?,
        SnapshotCommand::List { volume } => {
            api.call("GET", &format!("/v1/volumes/{volume}/snapshots"), None)?
        }
        SnapshotCommand::Delete { volume, name } => api.call(
            "DELETE",
            &format!("/v1/volumes/{volume}/snapshots/{name}"),
            None,
        )?,
    };
    render(client.output, &value);
    Ok(0)
}

/// Polls a compaction until it ends, drawing a progress bar on a terminal.
fn wait_for_compaction(api: &Api, path: &str, output: Output) -> Result<Value> {
    let bar = if output == Output::Human {
        ProgressBar::new(1000)
    } else {
        ProgressBar::hidden()
    };
    bar.set_style(
        ProgressStyle::with_template("{bar:40} {percent:>3}% {elapsed} {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    loop {
        let status = api.call("GET", path, None)?;
        let progress = status["progress"].as_f64().unwrap_or(0.0);
        bar.set_position((progress * 1000.0) as u64);
        bar.set_message(format!(
            "{} layers, {} MiB copied",
            status["layers_now"],
            status["bytes_copied"].as_u64().unwrap_or(0) >> 20
        ));
        if status["state"] != "running" {
            bar.finish_and_clear();
            return Ok(status);
        }
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
}

/// Name of the token file in a pool (the daemon makes it).
const TOKEN_FILE: &str = "api.token";

/// The API token, and where it came from (for messages).
struct Token {
    secret: String,
    from: String,
}

/// Finds the API token: STRATA_TOKEN, else `--token-file` (or
/// STRATA_TOKEN_FILE), else the pool's token file if it is there. None
/// when there is none (a daemon with `--insecure-local` needs none).
fn find_token(client: &ClientArgs) -> Result<Option<Token>> {
    if let Some(secret) = std::env::var("STRATA_TOKEN")
        .ok()
        .filter(|t| !t.trim().is_empty())
    {
        return Ok(Some(Token {
            secret: secret.trim().to_string(),
            from: "STRATA_TOKEN".into(),
        }));
    }
    if let Some(file) = &client.token_file {
        return read_token(file).map(Some);
    }
    let default = client.pool.join(TOKEN_FILE);
    if default.exists() {
        return read_token(&default).map(Some);
    }
    Ok(None)
}

/// Most bytes of a token read from standard input (a token is a line).
const MAX_TOKEN_BYTES: u64 = 4096;

/// Reads a token file (`-`: standard input).
fn read_token(file: &Path) -> Result<Token> {
    if file.as_os_str() == crate::stdio::DASH {
        let secret = crate::stdio::Input::Stdin.read_text(MAX_TOKEN_BYTES)?;
        let secret = secret.trim().to_string();
        if secret.is_empty() {
            bail!("--token-file -: standard input holds no API token");
        }
        return Ok(Token {
            secret,
            from: "standard input (--token-file -)".into(),
        });
    }
    let text = std::fs::read_to_string(file).with_context(|| {
        format!(
            "cannot read the API token file {} (it is readable by the daemon's user only; \
             run as that user, or give the token in STRATA_TOKEN)",
            file.display()
        )
    })?;
    let secret = text.trim().to_string();
    if secret.is_empty() {
        bail!("the API token file {} is empty", file.display());
    }
    Ok(Token {
        secret,
        from: file.display().to_string(),
    })
}

/// A blocking client of the daemon's API.
struct Api {
    base: String,
    token: Option<Token>,
    pool: PathBuf,
}

impl Api {
    fn new(client: &ClientArgs) -> Result<Api> {
        let addr = &client.api;
        let base = if addr.starts_with("http://") {
            addr.trim_end_matches('/').to_string()
        } else {
            format!("http://{addr}")
        };
        Ok(Api {
            base,
            token: find_token(client)?,
            pool: client.pool.clone(),
        })
    }

    /// What to add to a 401's message: where the token came from, or
    /// where it was looked for.
    fn token_hint(&self) -> String {
        match &self.token {
            Some(t) => format!("the token sent came from {}", t.from),
            None => format!(
                "no token was found: give --pool DIR of the daemon's pool (looked in {}), \
                 --token-file FILE, STRATA_TOKEN_FILE or STRATA_TOKEN",
                self.pool.join(TOKEN_FILE).display()
            ),
        }
    }

    /// Sends a request; an API error becomes an error with its message.
    fn call(&self, method: &str, path: &str, body: Option<Value>) -> Result<Value> {
        let url = format!("{}{path}", self.base);
        let mut request = ureq::request(method, &url);
        if let Some(token) = &self.token {
            request = request.set("Authorization", &format!("Bearer {}", token.secret));
        }
        let response = match body {
            Some(b) => request.send_json(b),
            None => request.call(),
        };
        match response {
            Ok(r) => r
                .into_json()
                .with_context(|| format!("{method} {url}: the reply is not JSON")),
            Err(ureq::Error::Status(code, r)) => {
                let v: Value = r.into_json().unwrap_or(Value::Null);
                let msg = v["error"].as_str().unwrap_or("no message").to_string();
                if code == 401 {
                    bail!("{msg} (HTTP 401; {})", self.token_hint())
                }
                bail!("{msg} (HTTP {code})")
            }
            Err(e) => bail!(
                "cannot reach the daemon at {}: {e} (is `strata daemon` running? set --api or STRATA_API)",
                self.base
            ),
        }
    }
}

/// Prints a reply as JSON (exact, as the API gave it) or as text for
/// people: sizes and times humanized, one line per item or field.
fn render(output: Output, value: &Value) {
    if output == Output::Json {
        println!(
            "{}",
            serde_json::to_string_pretty(value).unwrap_or_default()
        );
        return;
    }
    match value {
        Value::Array(items) => {
            for item in items {
                println!("{}", list_line(item));
            }
        }
        Value::Object(map) => print_fields(map, ""),
        other => println!("{other}"),
    }
}

/// One volume or snapshot of a list: `NAME<TAB>SIZE<TAB>created TIME`.
fn list_line(item: &Value) -> String {
    let name = item["name"].as_str().unwrap_or("?");
    let mut line = format!("{name}\t{}", human(item["size"].as_u64().unwrap_or(0)));
    if let Some(created) = item["created"].as_u64() {
        line.push_str(&format!("\tcreated {}", humanize::utc(created)));
    }
    line
}

/// Fields as `key: value` lines, nested objects indented under their key.
fn print_fields(map: &serde_json::Map<String, Value>, indent: &str) {
    for (key, value) in map {
        match value {
            Value::Object(inner) => {
                println!("{indent}{key}:");
                print_fields(inner, &format!("{indent}  "));
            }
            other => println!("{indent}{key}: {}", field_text(key, other)),
        }
    }
}

/// A field's value for people: byte counts and rates humanized with the
/// exact figure, epoch seconds as UTC times, fractions to three decimals,
/// lists joined, null as "-".
fn field_text(key: &str, value: &Value) -> String {
    match (key, value) {
        ("size" | "old_size" | "cluster_size" | "bytes_copied", Value::Number(n)) => {
            n.as_u64().map_or_else(|| n.to_string(), humanize::size)
        }
        ("rate", Value::Number(n)) => n
            .as_u64()
            .map_or_else(|| n.to_string(), |r| format!("{}/s", human(r))),
        ("created", Value::Number(n)) => n.as_u64().map_or_else(|| n.to_string(), humanize::utc),
        // Durations and ratios: three decimals are all a person reads.
        (_, Value::Number(n)) if n.is_f64() => n
            .as_f64()
            .map_or_else(|| n.to_string(), |f| format!("{f:.3}")),
        (_, Value::String(s)) => s.clone(),
        (_, Value::Null) => "-".into(),
        (_, Value::Array(items)) if items.is_empty() => "-".into(),
        (_, Value::Array(items)) => items
            .iter()
            .map(|i| i.as_str().map_or_else(|| i.to_string(), str::to_string))
            .collect::<Vec<_>>()
            .join(", "),
        (_, other) => other.to_string(),
    }
}
