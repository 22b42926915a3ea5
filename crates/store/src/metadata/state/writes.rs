//! Writes at the coordinator and the replicas: Post (begin, placement,
//! commit), Update, Link, Get and Delete, with the name locks that keep
//! two writes of one name apart.

use super::*;
use strata_store_protocol::wire::MAX_INLINE;

/// What a Post's commit names: the version planned, the data's CRC-32C
/// and the record's attributes.
pub(super) struct Commit<'a> {
    /// The version from the plan.
    pub version: u64,
    /// CRC-32C of the data.
    pub crc: u32,
    /// The record's attributes (decoding bounded them).
    pub attributes: &'a [u8],
    /// Each fragment's CRC-32C for an erasure-coded Post (empty for
    /// replicas).
    pub fragment_crcs: &'a [u32],
    /// The object's bytes, for a Post that keeps them in the record
    /// ([`Body::PostInline`]); `None` on the data path.
    pub inline: Option<&'a [u8]>,
}

/// A Post of a small object in one request ([`Body::PostInline`]), as
/// decoding checked it: at most [`MAX_INLINE`] bytes matching `crc`.
pub(super) struct Inline<'a> {
    /// The storage class asked for, if not the bucket's.
    pub class: Option<StorageClass>,
    /// CRC-32C of `data`.
    pub crc: u32,
    /// The object's bytes.
    pub data: &'a [u8],
    /// The record's attributes.
    pub attributes: &'a [u8],
}

impl<P: Clone + Eq + Hash> MnCore<P> {
    /// Drops the Post in its data phase whose first replica is `replica`:
    /// a storage node saw its client's connection close before the data
    /// was whole ([`Body::PutAbandoned`]), so the client is gone and its
    /// name is unlocked now rather than at the data deadline. Its replicas
    /// are freed. Returns the version dropped (0: none matched, as for a
    /// Post already committed or aborted).
    pub(super) fn abandon(&mut self, replica: Addr, out: &mut Vec<Out<P>>) -> u64 {
        let found = self.pending.iter().find_map(|(name, p)| match &p.phase {
            // The first replica takes a replicated Post's data; each
            // fragment's node takes an erasure-coded one's.
            Phase::Data {
                replicas,
                data_fragments,
                ..
            } if replicas.first() == Some(&replica)
                || (*data_fragments > 0 && replicas.contains(&replica)) =>
            {
                Some(name.clone())
            }
            _ => None,
        });
        let Some(p) = found.and_then(|name| self.pending.remove(&name)) else {
            return 0;
        };
        if let Phase::Data { replicas, .. } = p.phase {
            out.extend(replicas.into_iter().map(Out::Free));
        }
        p.version
    }

    /// Whether this request is a resend of the one `name` is locked for:
    /// it will be answered when that one finishes (answering Conflict would
    /// tell the client its own operation did not happen).
    pub(super) fn in_progress(&self, name: &str, from: &P, req: u64) -> bool {
        self.pending
            .get(name)
            .is_some_and(|p| &p.client == from && p.client_req == req)
    }

    /// Begins a Post of `size` bytes: locks the name and plans its
    /// version and replicas; the ticket is the runtime's to add.
    pub(super) fn post_begin(
        &mut self,
        now: u64,
        from: &P,
        req: u64,
        name: &str,
        size: u64,
        class: Option<StorageClass>,
    ) -> Result<Body, Error> {
        let params = match class {
            Some(class) => self.table.params_for(name).with_class(class),
            None => self.table.params_for(name),
        };
        let (version, replicas) = self.begin(now, from, req, name, size, params, false)?;
        Ok(Body::PostPlan {
            version,
            size,
            replicas,
            ticket: Vec::new(),
            data_fragments: params.data_fragments,
        })
    }

    /// Posts a small object in one request, its bytes kept in its record:
    /// begun and committed at once, as a [`Body::PostBegin`] and then its
    /// [`Body::PostCommit`] would be, since there is no data to wait for.
    /// Refused unless the object's class allows it on the name's metadata
    /// copies ([`Params::inlines`]): the client takes the data path then.
    /// A resend of the request in progress is answered when it finishes.
    pub(super) fn post_inline(
        &mut self,
        now: u64,
        from: &P,
        req: u64,
        name: &str,
        post: Inline<'_>,
        out: &mut Vec<Out<P>>,
    ) -> Result<Option<Body>, Error> {
        if self.in_progress(name, from, req) {
            return Ok(None);
        }
        let params = match post.class {
            Some(class) => self.table.params_for(name).with_class(class),
            None => self.table.params_for(name),
        };
        let size = post.data.len() as u64;
        if !params.inlines(size) {
            return Err(remote(
                Code::BadRequest,
                format!(
                    "{name:?} is kept as {} with {} metadata copies, too few to hold its \
                     {size} bytes inline without losing redundancy (replicated(n) needs n \
                     copies, ec(k,m) needs m+1, and at most {MAX_INLINE} bytes): post it \
                     with PostBegin",
                    params.class(),
                    params.n_m
                ),
            ));
        }
        let (version, _) = self.begin(now, from, req, name, size, params, true)?;
        let commit = Commit {
            version,
            crc: post.crc,
            attributes: post.attributes,
            fragment_crcs: &[],
            inline: Some(post.data),
        };
        self.post_commit(now, from, req, name, commit, out)
    }

    /// Locks `name` for a Post of `size` bytes kept as `params` say, and
    /// chooses its version and replicas (none for an empty object, nor
    /// one kept `inline` in its record), or for an erasure-coded one its
    /// fragments' nodes: one each, all distinct, or the Post is refused.
    #[allow(clippy::too_many_arguments)]
    fn begin(
        &mut self,
        now: u64,
        from: &P,
        req: u64,
        name: &str,
        size: u64,
        params: Params,
        inline: bool,
    ) -> Result<(u64, Vec<Addr>), Error> {
        if size > strata_store_protocol::wire::MAX_OBJECT {
            return Err(remote(
                Code::BadRequest,
                format!("object size {size} exceeds the 1 TiB limit"),
            ));
        }
        if let Some(p) = self.pending.get(name) {
            return Err(remote(
                Code::Conflict,
                format!(
                    "another Post or Delete of {name:?} (version {}) is in progress",
                    p.version
                ),
            ));
        }
        let mg0 = self.owned(self.table.meta_addrs(name)[0])?;
        let version = self.db.latest_version(mg0, name)? + 1;
        // An empty or inline object has no data elsewhere: its record
        // (with the bytes, if any) is all of it, durable on the metadata
        // copies, and a Get never reads a replica for it. So it gets none,
        // and its Post costs no storage node a file and its syncs.
        let dataless = size == 0 || inline;
        let data_fragments = if dataless { 0 } else { params.data_fragments };
        let replicas = match (dataless, data_fragments) {
            (true, _) => Vec::new(),
            (_, 0) => self.place_n(
                name,
                version,
                size,
                params.n_d as usize,
                params.w_d as usize,
                &[],
            )?,
            (_, k) => {
                let nodes = params.n_d as usize;
                let layout = StripeLayout::new(size, k, params.n_d - k);
                self.place_n(name, version, layout.fragment_len(), nodes, nodes, &[])?
            }
        };
        self.next_op += 1;
        self.pending.insert(
            name.to_string(),
            Pending {
                op: self.next_op,
                version,
                client: from.clone(),
                client_req: req,
                deadline: now + DATA_BASE_MS + size / (16 << 20) * 1000,
                phase: Phase::Data {
                    size,
                    replicas: replicas.clone(),
                    data_fragments,
                },
            },
        );
        Ok((version, replicas))
    }

    /// Chooses up to `count` storage nodes (at least `min`): up, with
    /// room, the preferred device type first (SSD for small objects, HDD
    /// for large), then most free space, with a per-object hash so equal
    /// nodes share the load; leaving out the prefixes in `exclude`.
    pub(super) fn place_n(
        &mut self,
        name: &str,
        version: u64,
        size: u64,
        count: usize,
        min: usize,
        exclude: &[u16],
    ) -> Result<Vec<Addr>, Error> {
        let want = if size < SMALL_OBJECT {
            Device::Ssd
        } else {
            Device::Hdd
        };
        let seed = strata_store_protocol::addr::hash(name.as_bytes(), version);
        let mut candidates: Vec<_> = self
            .table
            .sns
            .iter()
            .filter(|s| {
                s.state == State::Up
                    && s.free >= size
                    && !exclude.contains(&s.index)
                    // A node being drained takes no new replica.
                    && !self.table.retiring(s.index)
            })
            .map(|s| {
                let jitter = splitmix64(seed ^ s.uuid) % 1024 + 1;
                let score = (s.free >> 20).saturating_add(1).saturating_mul(jitter);
                ((s.device == want) as u8, score, s.index)
            })
            .collect();
        if candidates.len() < min {
            return Err(remote(
                Code::Unavailable,
                format!(
                    "{} storage nodes are up (and not being retired) with {size} bytes free \
                     and {min} are needed: add storage nodes or free space",
                    candidates.len(),
                ),
            ));
        }
        candidates.sort_by_key(|c| std::cmp::Reverse((c.0, c.1)));
        candidates.truncate(count);
        Ok(candidates
            .iter()
            .map(|&(_, _, index)| {
                self.nonce = splitmix64(self.nonce);
                self.table.layout.replica_addr(index, self.nonce)
            })
            .collect())
    }

    /// Commits the Post of `name` in its data phase: its record, with
    /// the commit's checksum and attributes, replicated to the name's
    /// metadata addresses.
    pub(super) fn post_commit(
        &mut self,
        now: u64,
        from: &P,
        req: u64,
        name: &str,
        commit: Commit<'_>,
        out: &mut Vec<Out<P>>,
    ) -> Result<Option<Body>, Error> {
        let Commit {
            version,
            crc,
            attributes,
            fragment_crcs,
            inline,
        } = commit;
        let Some(p) = self.pending.get(name) else {
            let mg0 = self.owned(self.table.meta_addrs(name)[0])?;
            self.not_frozen(mg0)?;
            if let Some(r) = self.db.get(mg0, name)? {
                // Committed here before a restart lost the replication
                // state: replicate again before acknowledging. The version
                // alone does not tell: the plan was lost with the restart,
                // so a repair may have taken the same version since (for
                // the old data); the checksum must be this Post's too.
                if r.version == version
                    && r.crc == crc
                    && r.attributes == attributes
                    && r.fragments.as_ref().map_or(&[][..], |f| &f.crcs[..]) == fragment_crcs
                    && r.rename.is_none()
                {
                    return self.commit_record(now, from.clone(), req, r, Vec::new(), out);
                }
            }
            return Err(remote(
                Code::Conflict,
                format!("no Post of {name:?} version {version} is in progress (it expired or the node restarted); post again"),
            ));
        };
        let Phase::Data {
            size,
            replicas,
            data_fragments,
        } = &p.phase
        else {
            return Ok(None);
        };
        let fragments = checked_fragments(name, *data_fragments, replicas.len(), fragment_crcs)?;
        if p.version != version {
            return Err(remote(
                Code::Conflict,
                format!(
                    "Post of {name:?} is at version {}, not {version}",
                    p.version
                ),
            ));
        }
        // A Post without replicas keeps its bytes (none for an empty
        // object) in the record: they must be the planned size and match.
        let held = inline.unwrap_or(&[]);
        if replicas.is_empty() && (held.len() as u64 != *size || crc != crc32c::crc32c(held)) {
            return Err(remote(
                Code::BadRequest,
                format!(
                    "the commit of {name:?}, planned without replicas for {size} bytes \
                     kept in its record, gives {} bytes with checksum {crc:08x}, not \
                     theirs ({:08x}); post it again",
                    held.len(),
                    crc32c::crc32c(held)
                ),
            ));
        }
        let record = Record {
            name: name.to_string(),
            size: *size,
            crc,
            version,
            meta: self.table.meta_addrs(name),
            replicas: replicas.clone(),
            rename: None,
            attributes: attributes.to_vec(),
            fragments,
            // An empty object's record says all of it without bytes.
            inline: inline.filter(|data| !data.is_empty()).map(<[u8]>::to_vec),
        };
        // A Post over an existing object frees the old replicas once the new
        // record is acknowledged, unless an interrupted rename may share
        // them with another name (a leak then, never a loss).
        let mg0 = self.owned(record.meta[0])?;
        let old = self
            .db
            .get(mg0, name)?
            .filter(|r| r.rename.is_none())
            .map(|r| r.replicas)
            .unwrap_or_default();
        // Answer the commit request itself (its own request id and socket).
        self.commit_record(now, from.clone(), req, record, old, out)
    }

    /// Whether a change of `name` may start: `Ok(false)` for a resend of
    /// the request already in progress (its answer will come), an error
    /// while another Post or Delete of the name runs.
    pub(super) fn admit(&self, name: &str, from: &P, req: u64) -> Result<bool, Error> {
        if self.in_progress(name, from, req) {
            return Ok(false);
        }
        if self.pending.contains_key(name) {
            return Err(remote(
                Code::Conflict,
                format!("a Post or Delete of {name:?} is in progress"),
            ));
        }
        Ok(true)
    }

    /// Replaces a record's rename link (nothing else may change) under a
    /// new version, if the stored record is at `if_version`.
    pub(super) fn update(
        &mut self,
        now: u64,
        from: &P,
        req: u64,
        record: &Record,
        if_version: u64,
        out: &mut Vec<Out<P>>,
    ) -> Result<Option<Body>, Error> {
        let name = &record.name;
        if !self.admit(name, from, req)? {
            return Ok(None);
        }
        let mg0 = self.owned(self.table.meta_addrs(name)[0])?;
        let Some(stored) = self.db.get(mg0, name)? else {
            return Err(remote(Code::NotFound, format!("no object named {name:?}")));
        };
        if stored.version != if_version {
            return Err(remote(
                Code::Conflict,
                format!(
                    "{name:?} is at version {}, not {if_version}",
                    stored.version
                ),
            ));
        }
        if (stored.size, stored.crc, &stored.replicas)
            != (record.size, record.crc, &record.replicas)
        {
            return Err(remote(
                Code::BadRequest,
                "an update may change only the rename link; Post to change the data",
            ));
        }
        let mut rec = stored;
        rec.rename = record.rename.clone();
        rec.version = self.db.latest_version(mg0, name)? + 1;
        rec.meta = self.table.meta_addrs(name);
        self.commit_record(now, from.clone(), req, rec, Vec::new(), out)
    }

    pub(super) fn link(
        &mut self,
        now: u64,
        from: &P,
        req: u64,
        record: &Record,
        out: &mut Vec<Out<P>>,
    ) -> Result<Option<Body>, Error> {
        let name = &record.name;
        if !self.admit(name, from, req)? {
            return Ok(None);
        }
        let mg0 = self.owned(self.table.meta_addrs(name)[0])?;
        if self.db.get(mg0, name)?.is_some() {
            return Err(remote(
                Code::Exists,
                format!("{name:?} already exists; delete it first"),
            ));
        }
        if record
            .replicas
            .iter()
            .any(|&a| self.table.layout.sn_of(a).is_none())
        {
            return Err(remote(
                Code::BadRequest,
                "a replica address is outside the storage space",
            ));
        }
        // Bound inline, the bytes must stay as redundant as the name's
        // class wants (decoding checked them against the record).
        let params = self.table.params_for(name);
        if record.inline.is_some() && !params.inlines(record.size) {
            return Err(remote(
                Code::BadRequest,
                format!(
                    "{name:?} is kept as {} with {} metadata copies, too few to hold \
                     its bytes inline: post it instead of linking it",
                    params.class(),
                    params.n_m
                ),
            ));
        }
        let mut rec = record.clone();
        rec.version = self.db.latest_version(mg0, name)? + 1;
        rec.meta = self.table.meta_addrs(name);
        self.commit_record(now, from.clone(), req, rec, Vec::new(), out)
    }

    /// Stores `record` at our own addresses, sends it to the others, and
    /// registers the Post as replicating; replies when W_m hold it.
    pub(super) fn commit_record(
        &mut self,
        now: u64,
        client: P,
        req: u64,
        record: Record,
        free_after: Vec<Addr>,
        out: &mut Vec<Out<P>>,
    ) -> Result<Option<Body>, Error> {
        let addrs = record.meta.clone();
        let mut acked = vec![false; addrs.len()];
        self.next_op += 1;
        let op = self.next_op;
        for (i, &a) in addrs.iter().enumerate() {
            if let Some(mg) = self.owns_writable(a) {
                acked[i] = self.db.apply_record(mg, &record)?;
            } else {
                let msg = Msg::new(
                    0,
                    a,
                    Body::Replicate {
                        record: record.clone(),
                    },
                );
                self.send_replication(now, &record.name, op, i, msg, out);
            }
        }
        self.start_replicating(
            now,
            client,
            req,
            &record.name,
            op,
            record.version,
            acked,
            free_after,
            None,
            out,
        )
    }

    pub(super) fn get(&self, target: Addr, name: &str) -> Result<Body, Error> {
        let mg = self.replica_check(target, name)?;
        self.not_sealed(mg)?;
        // Rows still being gathered: a "not found" here could be wrong, so
        // the client falls through to the name's other addresses.
        if self.table.restoring(mg) {
            return Err(restoring(mg));
        }
        if let Some(record) = self.db.get(mg, name)? {
            return Ok(Body::Found {
                record,
                ticket: Vec::new(),
            });
        }
        if self.db.tombstone(mg, name)? > 0 {
            return Err(remote(Code::Deleted, format!("{name:?} was deleted")));
        }
        Err(remote(Code::NotFound, format!("no object named {name:?}")))
    }

    /// Whether a Get of `name` at `target` would be answered from memory,
    /// its record in the database's read cache: a direct call from this
    /// process answers only such a Get, so that its caller (an async
    /// worker) never waits for a disk read. A Get the node would refuse
    /// is left to the datagram path too.
    pub fn get_is_cached(&self, target: Addr, name: &str) -> bool {
        let Ok(mg) = self.replica_check(target, name) else {
            return false;
        };
        self.not_sealed(mg).is_ok() && !self.table.restoring(mg) && self.db.is_cached(mg, name)
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn delete(
        &mut self,
        now: u64,
        from: &P,
        req: u64,
        name: &str,
        if_version: u64,
        keep_data: bool,
        out: &mut Vec<Out<P>>,
    ) -> Result<Option<Body>, Error> {
        if !self.admit(name, from, req)? {
            return Ok(None);
        }
        let addrs = self.table.meta_addrs(name);
        let mg0 = self.owned(addrs[0])?;
        let (version, replicas, answer) = match self.db.get(mg0, name)? {
            Some(rec) => {
                if if_version != 0 && rec.version != if_version {
                    return Err(remote(
                        Code::Conflict,
                        format!("{name:?} is at version {}, not {if_version}", rec.version),
                    ));
                }
                (rec.version, rec.replicas, None)
            }
            None => {
                let tomb = self.db.tombstone(mg0, name)?;
                if tomb == 0 {
                    return Err(remote(Code::NotFound, format!("no object named {name:?}")));
                }
                // Deleted here, perhaps by this very request before a restart
                // lost its replication: replicate the tombstone again, and
                // answer "deleted" once W_m hold it.
                let answer = Body::Error {
                    code: Code::Deleted,
                    message: format!("no object named {name:?} (deleted)"),
                };
                (tomb, Vec::new(), Some(answer))
            }
        };
        let mut acked = vec![false; addrs.len()];
        self.next_op += 1;
        let op = self.next_op;
        for (i, &a) in addrs.iter().enumerate() {
            if let Some(mg) = self.owns_writable(a) {
                self.db.apply_delete(mg, name, version)?;
                acked[i] = true;
            } else {
                let msg = Msg::new(
                    0,
                    a,
                    Body::Unreplicate {
                        name: name.to_string(),
                        version,
                    },
                );
                self.send_replication(now, name, op, i, msg, out);
            }
        }
        let free_after = if keep_data { Vec::new() } else { replicas };
        self.start_replicating(
            now,
            from.clone(),
            req,
            name,
            op,
            version,
            acked,
            free_after,
            answer,
            out,
        )
    }
}

/// The fragments of the record a commit makes: one CRC-32C per fragment
/// for an erasure-coded Post (`data_fragments` > 0), none for replicas.
fn checked_fragments(
    name: &str,
    data_fragments: u8,
    replicas: usize,
    crcs: &[u32],
) -> Result<Option<Fragments>, Error> {
    match data_fragments {
        0 if crcs.is_empty() => Ok(None),
        0 => Err(remote(
            Code::BadRequest,
            format!(
                "the commit of {name:?} gives {} fragment checksums, but it is kept as \
                 replicas; commit it without them",
                crcs.len()
            ),
        )),
        data if crcs.len() == replicas => Ok(Some(Fragments {
            data,
            crcs: crcs.to_vec(),
        })),
        _ => Err(remote(
            Code::BadRequest,
            format!(
                "the commit of {name:?} gives {} fragment checksums for its {replicas} \
                 fragments; post it again",
                crcs.len()
            ),
        )),
    }
}
