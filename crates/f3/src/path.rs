//! Namespace paths: `/` and `/a/b/c`, checked once where they enter (a
//! request, a command line, a FUSE name), so that no path can name
//! anything outside the namespace or a mount: no `.` or `..` component,
//! no empty component, no NUL, bounded lengths.

use crate::{F3Error, Result};

/// Longest namespace path, in bytes.
pub const MAX_PATH_BYTES: usize = 1024;

/// Longest component of a path, in bytes (the kernel's NAME_MAX).
pub const MAX_NAME_BYTES: usize = 255;

/// Most components of a path.
pub const MAX_DEPTH: usize = 64;

/// A checked namespace path: absolute, normalized, within bounds.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct NamespacePath(String);

impl NamespacePath {
    /// The root, `/`.
    pub fn root() -> NamespacePath {
        NamespacePath("/".to_string())
    }

    /// Checks `text` as a namespace path; the error says what is wrong.
    pub fn parse(text: &str) -> Result<NamespacePath> {
        let bad = |why: &str| {
            F3Error::invalid(format!(
                "path {:?}: {why}; give an absolute path inside the F3 namespace, such as \
                 /jobs/input.eph",
                truncated(text)
            ))
        };
        if text.len() > MAX_PATH_BYTES {
            return Err(bad(&format!("longer than {MAX_PATH_BYTES} bytes")));
        }
        if !text.starts_with('/') {
            return Err(bad("not absolute (it must start with /)"));
        }
        if text.contains('\0') {
            return Err(bad("contains a NUL byte"));
        }
        if text == "/" {
            return Ok(NamespacePath::root());
        }
        let components: Vec<&str> = text[1..].split('/').collect();
        if components.len() > MAX_DEPTH {
            return Err(bad(&format!("deeper than {MAX_DEPTH} components")));
        }
        for component in &components {
            check_name(component).map_err(|why| bad(&why))?;
        }
        Ok(NamespacePath(text.to_string()))
    }

    /// `self/name`, with `name` checked as one component.
    pub fn join(&self, name: &str) -> Result<NamespacePath> {
        check_name(name).map_err(|why| {
            F3Error::invalid(format!("name {:?} in {}: {why}", truncated(name), self.0))
        })?;
        let joined = if self.is_root() {
            format!("/{name}")
        } else {
            format!("{}/{name}", self.0)
        };
        NamespacePath::parse(&joined)
    }

    /// The parent directory (the root's parent is the root).
    pub fn parent(&self) -> NamespacePath {
        match self.0.rfind('/') {
            Some(0) | None => NamespacePath::root(),
            Some(at) => NamespacePath(self.0[..at].to_string()),
        }
    }

    /// The last component (empty for the root).
    pub fn name(&self) -> &str {
        self.0.rsplit('/').next().unwrap_or_default()
    }

    /// Whether this is `/`.
    pub fn is_root(&self) -> bool {
        self.0 == "/"
    }

    /// The path as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The prefix every descendant's path starts with (`/a/` for `/a`,
    /// `/` for the root).
    pub fn child_prefix(&self) -> String {
        if self.is_root() {
            "/".to_string()
        } else {
            format!("{}/", self.0)
        }
    }
}

impl std::fmt::Display for NamespacePath {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// Checks one component of a path.
fn check_name(name: &str) -> std::result::Result<(), String> {
    if name.is_empty() {
        return Err("has an empty component (// or a trailing /)".into());
    }
    if name == "." || name == ".." {
        return Err(format!(
            "has a '{name}' component, which could name something outside the namespace"
        ));
    }
    if name.len() > MAX_NAME_BYTES {
        return Err(format!(
            "has a component longer than {MAX_NAME_BYTES} bytes"
        ));
    }
    if name.contains('/') || name.contains('\0') {
        return Err("has a component with '/' or NUL".into());
    }
    Ok(())
}

/// At most 80 characters of `text`, for messages.
fn truncated(text: &str) -> String {
    text.chars().take(80).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_that_escape_or_are_malformed_are_refused() {
        for bad in ["", "a", "/a/../b", "/..", "/a/./b", "/a//b", "/a/", "/a\0b"] {
            assert!(NamespacePath::parse(bad).is_err(), "{bad:?} accepted");
        }
        let long = format!("/{}", "x".repeat(MAX_NAME_BYTES + 1));
        assert!(NamespacePath::parse(&long).is_err());
        assert!(NamespacePath::root().join("..").is_err());
    }

    #[test]
    fn parents_names_and_joins_agree() {
        let path = NamespacePath::parse("/jobs/run-1/out.eph").unwrap();
        assert_eq!(path.name(), "out.eph");
        assert_eq!(path.parent().as_str(), "/jobs/run-1");
        assert_eq!(path.parent().parent().parent(), NamespacePath::root());
        assert_eq!(path.parent().join("out.eph").unwrap(), path);
        assert_eq!(NamespacePath::root().join("a").unwrap().as_str(), "/a");
        assert_eq!(NamespacePath::root().child_prefix(), "/");
    }
}
