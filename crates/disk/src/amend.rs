//! Changing a qcow2 image's header options in place (`qemu-img amend`),
//! and the header rewrite the other image operations share.
//!
//! Only options whose change touches nothing but the header are
//! supported: `lazy_refcounts`, and (as in qemu-img 10) `backing_file`
//! and `backing_fmt` when they repeat the current ones. Anything else is
//! refused by name before a byte changes.

use std::path::Path;

use strata_format::header::{
    Header, HeaderExtension, AUTOCLEAR_STRATA_INDEX, COMPAT_LAZY_REFCOUNTS, INCOMPAT_CORRUPT,
    INCOMPAT_DIRTY,
};

use crate::error::{DiskError, Result};
use crate::header::write_header;
use crate::layer::{read_header, Format, Layer};

/// What `amend` may change; `None` leaves a setting as it is.
#[derive(Debug, Clone, Default)]
pub struct AmendOptions {
    /// Turn lazy refcounts on or off (qcow2 v3 only).
    pub lazy_refcounts: Option<bool>,
    /// Backing file name: accepted only when it is the current one.
    pub backing_file: Option<String>,
    /// Backing file format: accepted only when it is the current one.
    pub backing_format: Option<Format>,
}

/// Applies `opts` to the qcow2 image at `path`, holding its write lock.
pub fn amend(path: &Path, format: Option<Format>, opts: &AmendOptions) -> Result<()> {
    let layer = Layer::open(path, 0, true, format)?;
    let h = header_of(&layer)?;
    if opts.lazy_refcounts == Some(true) && h.version < 3 {
        return Err(DiskError::Invalid(format!(
            "{}: lazy refcounts need compat=1.1 (qcow2 v3); this image is v{}",
            path.display(),
            h.version
        )));
    }
    refuse_backing_change(path, &h, opts)?;
    edit_header(&layer, |h| {
        if let Some(on) = opts.lazy_refcounts {
            if on {
                h.compatible_features |= COMPAT_LAZY_REFCOUNTS;
            } else {
                h.compatible_features &= !COMPAT_LAZY_REFCOUNTS;
            }
        }
    })
}

/// Like qemu-img 10, amend accepts `backing_file` and `backing_fmt` only
/// when they repeat what the header says: a new backing file changes what
/// the image reads, which is rebase's job.
fn refuse_backing_change(path: &Path, h: &Header, opts: &AmendOptions) -> Result<()> {
    let name_changes = opts
        .backing_file
        .as_deref()
        .is_some_and(|b| Some(b).filter(|b| !b.is_empty()) != h.backing_file.as_deref());
    let format_changes = opts
        .backing_format
        .is_some_and(|f| Some(f.name()) != h.backing_format());
    if name_changes || format_changes {
        return Err(DiskError::Invalid(format!(
            "{}: cannot amend the backing file (as qemu-img 10 refuses to); use \
             `strata img rebase` (or `rebase -u` to rewrite only the name) instead; \
             nothing was changed",
            path.display()
        )));
    }
    Ok(())
}

/// The header of a qcow2 layer that is safe to rewrite: not marked
/// corrupt, closed cleanly, without internal snapshots.
pub(crate) fn header_of(layer: &Layer) -> Result<Header> {
    let path = layer.path().display();
    let h = layer
        .header()
        .ok_or_else(|| DiskError::Invalid(format!("{path} is not a qcow2 image")))?;
    if h.incompatible_features & INCOMPAT_CORRUPT != 0 {
        return Err(DiskError::corrupt(
            layer.place(),
            "image is marked corrupt; repair it with `strata img check -r all` first",
        ));
    }
    if h.incompatible_features & INCOMPAT_DIRTY != 0 {
        return Err(DiskError::Invalid(format!(
            "{path} was not closed cleanly (dirty bit set); run `strata img check -r all` first"
        )));
    }
    if h.nb_snapshots > 0 {
        return Err(DiskError::Unsupported {
            place: layer.place().clone(),
            detail: format!(
                "changing an image with {} internal snapshots",
                h.nb_snapshots
            ),
        });
    }
    Ok(h)
}

/// Rewrites the header of `layer` (opened for writing, its write lock
/// held) with `edit` applied, then syncs. The header is read back from
/// the file first, so edits made through other handles are kept.
///
/// The chain index descriptor is dropped: every caller changes the size
/// or the chain it describes, and an index that no longer matches would
/// only be found stale at the next open. Without it lookups walk the
/// chain, and the next write-open builds a new one.
pub(crate) fn edit_header(layer: &Layer, edit: impl FnOnce(&mut Header)) -> Result<()> {
    let mut h = read_header(&layer.file)?;
    edit(&mut h);
    h.set_chain_index(None);
    h.autoclear_features &= !AUTOCLEAR_STRATA_INDEX;
    write_header(layer, &h)?;
    layer.file.sync()
}

/// Sets the backing name (an empty name removes the backing file) and
/// its format extension.
pub(crate) fn set_backing(h: &mut Header, name: &str, format: Option<Format>) {
    h.extensions
        .retain(|e| !matches!(e, HeaderExtension::BackingFormat(_)));
    if name.is_empty() {
        h.backing_file = None;
        return;
    }
    h.backing_file = Some(name.to_string());
    if let Some(f) = format {
        h.extensions
            .insert(0, HeaderExtension::BackingFormat(f.name().to_string()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::create::{create, CreateOptions};

    #[test]
    fn lazy_refcounts_toggle_and_a_backing_change_is_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        let base = dir.path().join("base.qcow2");
        let top = dir.path().join("top.qcow2");
        let opts = CreateOptions {
            size: Some(1 << 20),
            ..CreateOptions::default()
        };
        create(&base, &opts).expect("create base");
        create(&top, &opts).expect("create top");
        let on = AmendOptions {
            lazy_refcounts: Some(true),
            ..AmendOptions::default()
        };
        amend(&top, None, &on).expect("amend");
        let layer = Layer::open(&top, 0, false, None).expect("open");
        let h = layer.header().expect("qcow2");
        assert_ne!(h.compatible_features & COMPAT_LAZY_REFCOUNTS, 0);
        drop(layer);
        let backing = AmendOptions {
            backing_file: Some("base.qcow2".into()),
            backing_format: Some(Format::Qcow2),
            ..AmendOptions::default()
        };
        let before = std::fs::read(&top).expect("read");
        assert!(
            amend(&top, None, &backing).is_err(),
            "a new backing file is rebase's job"
        );
        assert_eq!(before, std::fs::read(&top).expect("read"));
    }
}
