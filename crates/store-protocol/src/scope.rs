//! The names a tenant may touch: a tenant's requests reach only names
//! under its scope ([`crate::tenant::scope_prefix`]).

use crate::tenant::scope_prefix;
use crate::wire::{Body, RenameLink};

/// Checks that every name request `body` touches is in tenant `id`'s
/// scope: the name of a Post, Get (or GetLinkProof), Delete or bad
/// replica report; both names of a rename's
/// Link or Update (the record's and the one its rename link names); a
/// List's prefix. The error says what was refused and what is allowed.
pub fn check_scope(id: &str, body: &Body) -> Result<(), String> {
    let Some(prefix) = scope_prefix(id) else {
        return Ok(());
    };
    let refuse = |what: &str, name: &str| {
        Err(format!(
            "tenant '{id}' may only use names under '{prefix}'; {what}'{name}' refused"
        ))
    };
    let names: Vec<&str> = match body {
        Body::PostBegin { name, .. }
        | Body::PostInline { name, .. }
        | Body::PostCommit { name, .. }
        | Body::PostAbort { name, .. }
        | Body::Get { name }
        | Body::GetLinkProof { name }
        | Body::BadReplica { name, .. }
        | Body::Delete { name, .. } => vec![name],
        Body::Link { record, .. } | Body::Update { record, .. } => {
            let mut v = vec![record.name.as_str()];
            match &record.rename {
                Some(RenameLink::To(other) | RenameLink::From(other)) => v.push(other),
                None => {}
            }
            v
        }
        Body::List { prefix: asked, .. } => {
            if asked.starts_with(&prefix) {
                return Ok(());
            }
            return refuse("the List prefix ", asked);
        }
        // Not a tenant's request: the gate never lets one in with a
        // tenant's seal; refuse rather than guess.
        _ => return Err(format!("tenant '{id}' may not send this kind of request")),
    };
    match names.into_iter().find(|n| !n.starts_with(&prefix)) {
        Some(outside) => refuse("", outside),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tenant::ADMIN;
    use crate::wire::Record;

    #[test]
    fn scopes_cover_every_name_a_request_touches() {
        let get = |n: &str| Body::Get { name: n.into() };
        assert!(check_scope("acme", &get("acme/x")).is_ok());
        let err = check_scope("acme", &get("other/x")).unwrap_err();
        assert_eq!(
            err,
            "tenant 'acme' may only use names under 'acme/'; 'other/x' refused"
        );
        // A name that merely starts with the id is another bucket.
        assert!(check_scope("acme", &get("acme")).is_err());
        assert!(check_scope("acme", &get("acmex/y")).is_err());
        assert!(check_scope(ADMIN, &get("anything")).is_ok());
        let prove = |n: &str| Body::GetLinkProof { name: n.into() };
        assert!(check_scope("acme", &prove("acme/x")).is_ok());
        assert!(check_scope("acme", &prove("other/x")).is_err());
        let report = |n: &str| Body::BadReplica {
            name: n.into(),
            replica: 1,
        };
        assert!(check_scope("acme", &report("acme/x")).is_ok());
        assert!(check_scope("acme", &report("other/x")).is_err());
        let rec = |name: &str, rename: Option<RenameLink>| Record {
            name: name.into(),
            size: 0,
            crc: 0,
            version: 1,
            meta: vec![],
            replicas: vec![],
            rename,
            attributes: vec![],
            fragments: None,
            inline: None,
        };
        let link = |from: &str| Body::Link {
            record: rec("acme/new", Some(RenameLink::From(from.into()))),
            proof: vec![],
        };
        assert!(check_scope("acme", &link("acme/old")).is_ok());
        let err = check_scope("acme", &link("other/old")).unwrap_err();
        assert!(err.contains("'other/old' refused"), "{err}");
        let update = Body::Update {
            record: rec("acme/old", Some(RenameLink::To("zeta/new".into()))),
            if_version: 1,
        };
        assert!(check_scope("acme", &update)
            .unwrap_err()
            .contains("zeta/new"));
        let list = |p: &str| Body::List {
            prefix: p.into(),
            after: String::new(),
            limit: 10,
        };
        assert!(check_scope("acme", &list("acme/")).is_ok());
        assert!(check_scope("acme", &list("acme/sub")).is_ok());
        for p in ["", "acme", "other/"] {
            let err = check_scope("acme", &list(p)).unwrap_err();
            assert!(err.contains("List prefix"), "{p}: {err}");
        }
        assert!(check_scope(ADMIN, &list("")).is_ok());
        for body in [
            Body::PostBegin {
                name: "b/x".into(),
                size: 1,
                class: None,
            },
            Body::PostCommit {
                name: "b/x".into(),
                version: 1,
                crc: 0,
                attributes: Vec::new(),
                fragment_crcs: Vec::new(),
            },
            Body::PostInline {
                name: "b/x".into(),
                class: None,
                crc: crc32c::crc32c(b"x"),
                data: b"x".to_vec(),
                attributes: Vec::new(),
            },
            Body::PostAbort {
                name: "b/x".into(),
                version: 1,
            },
            Body::Delete {
                name: "b/x".into(),
                if_version: 0,
                keep_data: false,
            },
        ] {
            assert!(check_scope("acme", &body).is_err(), "{body:?}");
            assert!(check_scope("b", &body).is_ok(), "{body:?}");
        }
        // Never an internal kind.
        let done = Body::Done { version: 1 };
        assert!(check_scope("acme", &done).is_err());
    }
}
