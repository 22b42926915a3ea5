//! `-` on the command line, the Unix convention: standard input or
//! standard output where a command can stream its data, and a clear
//! refusal (naming the argument and saying why) where it needs a real
//! file, so that no command ever creates a file named `-`.

use std::ffi::{OsStr, OsString};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use clap::builder::TypedValueParser;
use clap::error::ErrorKind;

/// The word that names standard input or output.
pub const DASH: &str = "-";

/// A file argument that may be read from standard input (`-`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Input {
    /// `-`: standard input, read once from start to end.
    Stdin,
    /// A file path.
    File(PathBuf),
}

impl From<OsString> for Input {
    fn from(value: OsString) -> Self {
        if value == DASH {
            Input::Stdin
        } else {
            Input::File(value.into())
        }
    }
}

impl Input {
    /// How messages name this input.
    pub fn describe(&self) -> String {
        match self {
            Input::Stdin => "standard input".into(),
            Input::File(path) => format!("'{}'", path.display()),
        }
    }

    /// The whole input as text, at most `limit` bytes of it.
    pub fn read_text(&self, limit: u64) -> Result<String> {
        let mut bytes = Vec::new();
        let read = match self {
            Input::Stdin => std::io::stdin()
                .lock()
                .take(limit + 1)
                .read_to_end(&mut bytes),
            Input::File(path) => std::fs::File::open(path)
                .and_then(|file| file.take(limit + 1).read_to_end(&mut bytes)),
        };
        read.with_context(|| format!("cannot read {}", self.describe()))?;
        if bytes.len() as u64 > limit {
            bail!("{} is longer than {limit} bytes", self.describe());
        }
        String::from_utf8(bytes).with_context(|| format!("{} is not UTF-8 text", self.describe()))
    }
}

/// A file argument that may be written to standard output (`-`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Output {
    /// `-`: standard output, written once from start to end (it may be a
    /// pipe, which cannot seek).
    Stdout,
    /// A file path.
    File(PathBuf),
}

impl From<OsString> for Output {
    fn from(value: OsString) -> Self {
        if value == DASH {
            Output::Stdout
        } else {
            Output::File(value.into())
        }
    }
}

impl Output {
    /// True when the data goes to standard output: messages and
    /// progress must then go to standard error.
    pub fn is_stdout(&self) -> bool {
        matches!(self, Output::Stdout)
    }
}

/// Copies `reader` to standard output and flushes it.
pub fn copy_to_stdout(reader: &mut dyn Read) -> Result<u64> {
    let mut out = std::io::stdout().lock();
    let copied = std::io::copy(reader, &mut out).context("could not write to standard output")?;
    out.flush().context("could not write to standard output")?;
    Ok(copied)
}

/// A value parser for a path argument that cannot be standard input or
/// output: `-` is refused with `why` (the parsed value is a `PathBuf`).
#[derive(Clone, Copy, Debug)]
pub struct FileOnly {
    /// Why this argument needs a real file.
    why: &'static str,
}

/// Why an image argument cannot be a pipe.
pub const IMAGE_WHY: &str =
    "an image is opened for random access (reads and writes anywhere in it), which a pipe \
     cannot give";

/// Why a backing file cannot be `-`.
pub const BACKING_WHY: &str =
    "a backing file is a name stored in the image and opened for random access";

/// Why a Unix socket cannot be `-`.
pub const SOCKET_WHY: &str = "a Unix socket is a name in the file system that clients connect to";

/// Why a pid file cannot be `-`.
pub const PID_FILE_WHY: &str =
    "a pid file is read by other programs while the server runs, and removed on exit";

/// Why a cluster key file cannot be `-`.
pub const KEY_WHY: &str = "a cluster key is found by its path (nodes re-read it on SIGHUP, \
     and a rotation's .next and .prev files sit next to it)";

/// Why a directory argument cannot be `-`.
pub const DIRECTORY_WHY: &str = "this argument is a directory";

/// An image (qcow2 or raw) opened for random access.
pub fn image() -> FileOnly {
    FileOnly { why: IMAGE_WHY }
}

/// A directory.
pub fn directory() -> FileOnly {
    FileOnly { why: DIRECTORY_WHY }
}

/// Another file, with its reason.
pub fn file(why: &'static str) -> FileOnly {
    FileOnly { why }
}

/// The refusal of `-` for the argument `name`, and why.
pub fn refusal(name: &str, why: &str) -> String {
    format!(
        "{name}: '-' (standard input or output) cannot be used here: {why}; give a path \
         (./- for a file named '-')"
    )
}

/// Fails with [`refusal`] when `value` is `-`.
pub fn refuse_dash(name: &str, value: &str, why: &str) -> Result<()> {
    if value == DASH {
        bail!(refusal(name, why));
    }
    Ok(())
}

impl TypedValueParser for FileOnly {
    type Value = PathBuf;

    fn parse_ref(
        &self,
        command: &clap::Command,
        argument: Option<&clap::Arg>,
        value: &OsStr,
    ) -> Result<PathBuf, clap::Error> {
        if value != DASH {
            return Ok(Path::new(value).to_path_buf());
        }
        let name = argument.map_or_else(|| "argument".to_string(), |a| a.to_string());
        // Built, a subcommand knows its full name ("strata img info").
        let command_name = command.get_bin_name().unwrap_or(command.get_name());
        let command_name = command_name.strip_prefix("strata ").unwrap_or(command_name);
        let text = format!("{command_name} {}\n", refusal(&name, self.why));
        Err(clap::Error::raw(ErrorKind::ValueValidation, text).with_cmd(command))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dash_is_the_standard_stream() {
        assert_eq!(Input::from(OsString::from("-")), Input::Stdin);
        assert_eq!(Output::from(OsString::from("-")), Output::Stdout);
        assert_eq!(
            Input::from(OsString::from("./-")),
            Input::File(PathBuf::from("./-"))
        );
    }

    #[test]
    fn a_file_only_argument_refuses_dash_by_name() {
        let command = clap::Command::new("info").arg(
            clap::Arg::new("filename")
                .value_name("FILENAME")
                .value_parser(image()),
        );
        let error = command
            .try_get_matches_from(["info", "-"])
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(error.contains("info [FILENAME]: '-'"), "{error}");
        assert!(error.contains("random access"), "{error}");
        let matches = clap::Command::new("info")
            .arg(clap::Arg::new("filename").value_parser(image()))
            .try_get_matches_from(["info", "x.qcow2"]);
        assert!(matches.is_ok());
    }
}
