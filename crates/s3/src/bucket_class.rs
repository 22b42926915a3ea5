//! A bucket's storage class, chosen at CreateBucket with the
//! [`CLASS_HEADER`] header and kept in the attributes of the bucket's
//! marker, so every gateway of the cluster posts the bucket's objects
//! and parts in it. A bucket made without it has none: its objects take
//! the store's class for their names (the bucket's `--bucket-class`, or
//! the cluster's).

use crate::errors::s3;
use s3s::{S3ErrorCode, S3Result};
use strata_store_protocol::class::StorageClass;
use strata_store_protocol::table::{State, Table};

/// The request header of CreateBucket naming the bucket's class
/// (`replicated(N)` or `ec(K,M)`), and the response header of HeadBucket
/// that shows it.
pub const CLASS_HEADER: &str = "x-strata-storage-class";

/// The first byte of a marker's attributes that hold a class: their
/// format's version (a marker without attributes has no class).
const MARKER_VERSION: u8 = 1;

/// Longest class header taken: `replicated(16)` and `ec(14,2)` are far
/// shorter, so a longer value is refused before it is parsed.
const MAX_CLASS_TEXT: usize = 64;

/// The class a CreateBucket's header asks for, checked against the
/// bounds of a class and the cluster `table` (one storage node per
/// replica or fragment); InvalidArgument, naming what to give, if it is
/// not one the cluster can hold.
pub(crate) fn requested(header: Option<&[u8]>, table: &Table) -> S3Result<Option<StorageClass>> {
    let Some(value) = header else {
        return Ok(None);
    };
    let text = std::str::from_utf8(value)
        .ok()
        .filter(|text| text.len() <= MAX_CLASS_TEXT)
        .ok_or_else(|| {
            invalid("is not a short text: give replicated(N) or ec(K,M), such as ec(4,2)".into())
        })?;
    let class = StorageClass::parse(text).map_err(|why| invalid(format!("is refused: {why}")))?;
    let nodes = table
        .sns
        .iter()
        .filter(|node| matches!(node.state, State::Up | State::Down))
        .count();
    if class.nodes() as usize > nodes {
        return Err(invalid(format!(
            "{class} keeps each object on {} storage nodes, and the cluster has {nodes}: \
             choose a class of at most {nodes} replicas or fragments, or add storage nodes",
            class.nodes()
        )));
    }
    Ok(Some(class))
}

/// InvalidArgument for a class header `why` refuses.
fn invalid(why: String) -> s3s::S3Error {
    s3(
        S3ErrorCode::InvalidArgument,
        format!("the {CLASS_HEADER} header {why}; no bucket was made"),
    )
}

/// The attributes of a bucket's marker holding `class`.
pub(crate) fn marker_attributes(class: Option<StorageClass>) -> Vec<u8> {
    match class {
        Some(class) => {
            let mut bytes = vec![MARKER_VERSION];
            bytes.extend(class.to_string().as_bytes());
            bytes
        }
        None => Vec::new(),
    }
}

/// The class a marker's attributes hold: none for a marker without
/// (made before classes, or without the header), or whose attributes
/// are not a valid class (written by something else: the store's class
/// then applies, as for any name).
pub(crate) fn from_marker(attributes: &[u8]) -> Option<StorageClass> {
    match attributes.split_first() {
        Some((&MARKER_VERSION, text)) => std::str::from_utf8(text)
            .ok()
            .and_then(|text| StorageClass::parse(text).ok()),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_class_survives_its_marker() {
        for class in [
            StorageClass::Replicated { copies: 3 },
            StorageClass::ErasureCoded { data: 4, parity: 2 },
        ] {
            assert_eq!(from_marker(&marker_attributes(Some(class))), Some(class));
        }
        assert_eq!(marker_attributes(None), Vec::<u8>::new());
        for attributes in [
            &b""[..],
            b"\x01",
            b"\x01ec(99,1)",
            b"\x02ec(4,2)",
            b"\x01\xff",
        ] {
            assert_eq!(from_marker(attributes), None, "{attributes:?}");
        }
    }
}
