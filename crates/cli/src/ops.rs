//! Operator conveniences: `strata completions`, `strata man`, and the TOML
//! configuration file behind `--config FILE` of `strata up`, `strata
//! daemon`, `strata store up` and `strata mirror`.
//!
//! A configuration file holds one table per command, whose keys are that
//! command's long flag names; its values become those flags on the command
//! line, ahead of the flags actually given, and a flag given on the command
//! line wins over the file's key for it:
//!
//! ```toml
//! [daemon]
//! pool = "/var/lib/strata/pool"
//! nbd-port = 10810
//! no-auto-compact = true   # a switch: true gives the flag, false leaves it out
//! ```

use std::ffi::{OsStr, OsString};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use clap::ArgAction;
use clap_complete::Shell;

/// The commands a configuration file configures: their path of subcommand
/// names and the file's table for them.
const CONFIGURED: &[(&[&str], &str)] = &[
    (&["up"], "up"),
    (&["daemon"], "daemon"),
    (&["store", "up"], "store"),
    (&["mirror"], "mirror"),
];

/// A configuration file bigger than this is refused (it is a few lines).
const MAX_CONFIG_BYTES: u64 = 1 << 20;

/// Writes the completion script of `command` for `shell` to stdout.
pub fn completions(shell: Shell, mut command: clap::Command) -> Result<i32> {
    let name = command.get_name().to_string();
    let mut out = std::io::stdout().lock();
    clap_complete::generate(shell, &mut command, name, &mut out);
    Ok(0)
}

/// Writes one man page per command and subcommand of `command` into
/// `dir` (created if missing); prints how many.
pub fn man_pages(dir: &Path, mut command: clap::Command) -> Result<i32> {
    std::fs::create_dir_all(dir)
        .with_context(|| format!("cannot create the man page directory '{}'", dir.display()))?;
    // Built, every subcommand knows its full name (strata-volume-create),
    // which names its page.
    command = command.disable_help_subcommand(true);
    command.build();
    let mut written = Vec::new();
    write_pages(command, dir, &mut written)
        .with_context(|| format!("cannot write man pages into '{}'", dir.display()))?;
    println!(
        "strata: wrote {} man pages into {} (try `man -l {}`)",
        written.len(),
        dir.display(),
        dir.join("strata.1").display()
    );
    Ok(0)
}

/// Writes the page of `command`, then those of its subcommands.
fn write_pages(command: clap::Command, dir: &Path, written: &mut Vec<PathBuf>) -> Result<()> {
    for sub in command.get_subcommands().filter(|s| !s.is_hide_set()) {
        write_pages(sub.clone(), dir, written)?;
    }
    written.push(clap_mangen::Man::new(command).generate_to(dir)?);
    Ok(())
}

/// The command line with `--config FILE` applied: the file's table for the
/// command becomes flags placed before the user's own. `--config` is kept
/// for commands that declare it (they read the file themselves too) and
/// removed for the others. `command` builds the full command definition,
/// only needed when `--config` is there.
pub fn apply_config(
    argv: Vec<OsString>,
    command: impl FnOnce() -> clap::Command,
) -> Result<Vec<OsString>> {
    let Some(path_len) = configured_path(&argv) else {
        return Ok(argv);
    };
    let (prefix, rest) = argv.split_at(1 + path_len);
    let Some((file, user)) = take_config(rest)? else {
        return Ok(argv);
    };
    let root = command();
    let mut target = &root;
    for name in &prefix[1..] {
        let name = name.to_string_lossy();
        target = target
            .find_subcommand(name.as_ref())
            .with_context(|| format!("no subcommand '{name}'"))?;
    }
    let table_name = table_of(&prefix[1..]);
    let flags = config_flags(&file, table_name, target, &user)?;
    let mut out = prefix.to_vec();
    out.extend(flags);
    if target
        .get_arguments()
        .any(|a| a.get_long() == Some("config"))
    {
        out.push("--config".into());
        out.push(file.into_os_string());
    }
    out.extend(user);
    Ok(out)
}

/// How many subcommand names after the program name select a configured
/// command; `None` if the command line names none (or `strata mirror`
/// runs a tool, which takes no configuration).
fn configured_path(argv: &[OsString]) -> Option<usize> {
    let words: Vec<&OsStr> = argv.iter().skip(1).map(|a| a.as_os_str()).collect();
    let mentions_config = words
        .iter()
        .any(|w| *w == "--config" || w.to_string_lossy().starts_with("--config="));
    if !mentions_config {
        return None;
    }
    CONFIGURED
        .iter()
        .filter(|(path, _)| {
            words.len() >= path.len() && path.iter().zip(&words).all(|(p, w)| *w == *p)
        })
        .map(|(path, _)| path.len())
        .max()
        .filter(|_| !(words[0] == "mirror" && words.get(1).is_some_and(|w| is_tool(w))))
}

/// A word after `strata mirror` that names one of its tools.
fn is_tool(word: &OsStr) -> bool {
    let word = word.to_string_lossy();
    !word.starts_with('-') && ["digest", "repo-serve", "publish", "stats", "help"].contains(&&*word)
}

/// The table of a command path.
fn table_of(path: &[OsString]) -> &'static str {
    CONFIGURED
        .iter()
        .find(|(p, _)| p.len() == path.len() && p.iter().zip(path).all(|(a, b)| *b == *a))
        .map_or("", |(_, table)| table)
}

/// Splits `--config FILE` (or `--config=FILE`) out of `args`; `None` if it
/// is not there.
fn take_config(args: &[OsString]) -> Result<Option<(PathBuf, Vec<OsString>)>> {
    let mut file = None;
    let mut rest = Vec::with_capacity(args.len());
    let mut words = args.iter();
    while let Some(word) = words.next() {
        if word == "--" {
            rest.push(word.clone());
            rest.extend(words.by_ref().cloned());
            break;
        }
        let text = word.to_string_lossy();
        let value = if word == "--config" {
            let Some(value) = words.next() else {
                bail!("--config needs a file: --config FILE");
            };
            value.clone()
        } else if let Some(value) = text.strip_prefix("--config=") {
            value.into()
        } else {
            rest.push(word.clone());
            continue;
        };
        if file.replace(PathBuf::from(value)).is_some() {
            bail!("--config is given twice: give one configuration file");
        }
    }
    Ok(file.map(|f| (f, rest)))
}

/// The configuration read from standard input (`--config -`): read once,
/// as the command line is rewritten, and kept for the command's own read
/// (and, for `strata up`, for its services' standard input).
static STDIN_CONFIG: std::sync::OnceLock<std::result::Result<String, String>> =
    std::sync::OnceLock::new();

/// The text of `--config -`, read from standard input on first use.
pub fn stdin_config() -> Result<&'static str> {
    let text = STDIN_CONFIG.get_or_init(|| {
        crate::stdio::Input::Stdin
            .read_text(MAX_CONFIG_BYTES)
            .map_err(|e| format!("{e:#}"))
    });
    match text {
        Ok(text) => Ok(text),
        Err(e) => bail!("configuration (--config -): {e}"),
    }
}

/// The text of the configuration file `file` (`-`: standard input).
fn config_text(file: &Path) -> Result<String> {
    if file.as_os_str() == crate::stdio::DASH {
        return Ok(stdin_config()?.to_string());
    }
    let size = std::fs::metadata(file)
        .with_context(|| format!("cannot read the configuration file '{}'", file.display()))?
        .len();
    if size > MAX_CONFIG_BYTES {
        bail!(
            "configuration file '{}' is {size} bytes; at most {MAX_CONFIG_BYTES} are read",
            file.display()
        );
    }
    std::fs::read_to_string(file)
        .with_context(|| format!("cannot read the configuration file '{}'", file.display()))
}

/// How messages name a configuration: "file 'PATH'", or standard input.
fn config_name(file: &Path) -> String {
    if file.as_os_str() == crate::stdio::DASH {
        "from standard input (--config -)".into()
    } else {
        format!("file '{}'", file.display())
    }
}

/// Reads `file` (`-`: standard input) and checks its tables: only the
/// configured commands'.
pub fn read_config(file: &Path) -> Result<toml::Table> {
    let text = config_text(file)?;
    let name = config_name(file);
    let table: toml::Table = text
        .parse()
        .with_context(|| format!("configuration {name} is not valid TOML"))?;
    for (key, value) in &table {
        let known = CONFIGURED.iter().any(|(_, t)| t == key);
        if !known || !value.is_table() {
            bail!(
                "configuration {name}: '{key}' is not one of the tables [up], [daemon], \
                 [store] or [mirror]"
            );
        }
    }
    Ok(table)
}

/// The value of `key` in table `table` of a configuration, if set.
pub fn config_value<'a>(
    config: &'a toml::Table,
    table: &str,
    key: &str,
) -> Option<&'a toml::Value> {
    config.get(table)?.as_table()?.get(key)
}

/// The flags table `table_name` of `file` gives `command`, leaving out
/// those the user's arguments `user` already give.
fn config_flags(
    file: &Path,
    table_name: &str,
    command: &clap::Command,
    user: &[OsString],
) -> Result<Vec<OsString>> {
    let config = read_config(file)?;
    let Some(table) = config.get(table_name).and_then(|t| t.as_table()) else {
        return Ok(Vec::new());
    };
    let mut flags = Vec::new();
    for (key, value) in table {
        let where_ = || format!("configuration {}, [{table_name}] {key}", config_name(file));
        let Some(arg) = command
            .get_arguments()
            .find(|a| a.get_long() == Some(key.as_str()) && key != "config")
        else {
            bail!(
                "{}: not a flag of `strata {}`; the keys are its long flag names (see its --help)",
                where_(),
                command.get_bin_name().unwrap_or(command.get_name())
            );
        };
        if given(user, key, arg.get_short()) {
            continue;
        }
        flags.extend(to_flags(key, value, arg).with_context(where_)?);
    }
    Ok(flags)
}

/// Whether the user's arguments give flag `--long` (or its `-short`).
fn given(user: &[OsString], long: &str, short: Option<char>) -> bool {
    let long_flag = format!("--{long}");
    let long_prefix = format!("--{long}=");
    user.iter().take_while(|w| *w != "--").any(|word| {
        let text = word.to_string_lossy();
        text == long_flag
            || text.starts_with(&long_prefix)
            || short.is_some_and(|s| {
                text.starts_with('-') && !text.starts_with("--") && text[1..].starts_with(s)
            })
    })
}

/// The command-line words of one key of the file.
fn to_flags(key: &str, value: &toml::Value, arg: &clap::Arg) -> Result<Vec<OsString>> {
    let flag = OsString::from(format!("--{key}"));
    let switch = matches!(arg.get_action(), ArgAction::SetTrue | ArgAction::SetFalse);
    let repeatable = matches!(arg.get_action(), ArgAction::Append);
    Ok(match value {
        toml::Value::Boolean(on) if switch => {
            if *on {
                vec![flag]
            } else {
                Vec::new()
            }
        }
        toml::Value::Array(items) if repeatable => {
            let mut words = Vec::new();
            for item in items {
                words.push(flag.clone());
                words.push(scalar(item)?.into());
            }
            words
        }
        _ if switch => bail!("this flag is a switch: give true or false"),
        toml::Value::Array(_) => bail!("this flag takes one value, not a list"),
        _ => vec![flag, scalar(value)?.into()],
    })
}

/// A string, number or boolean as the command line spells it.
fn scalar(value: &toml::Value) -> Result<String> {
    Ok(match value {
        toml::Value::String(s) => s.clone(),
        toml::Value::Integer(n) => n.to_string(),
        toml::Value::Float(x) => x.to_string(),
        toml::Value::Boolean(b) => b.to_string(),
        _ => bail!("give a string, a number or a boolean"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(line: &str) -> Vec<OsString> {
        line.split_whitespace().map(OsString::from).collect()
    }

    #[test]
    fn short_flags_count_as_given() {
        assert!(given(&words("-p 5"), "port", Some('p')));
        assert!(given(&words("--port=5"), "port", Some('p')));
        assert!(!given(&words("--pool x"), "port", Some('p')));
        assert!(!given(&words("-- --port"), "port", None));
    }

    #[test]
    fn config_is_split_out() {
        let (file, rest) = take_config(&words("--a 1 --config f.toml --b"))
            .unwrap()
            .unwrap();
        assert_eq!(file, PathBuf::from("f.toml"));
        assert_eq!(rest, words("--a 1 --b"));
        assert!(take_config(&words("--config")).is_err());
        assert!(take_config(&words("--config=a --config b")).is_err());
    }
}
