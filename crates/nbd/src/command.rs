//! Checking a decoded request against the export and the negotiated
//! session, before anything touches the disk.
//!
//! Pure: given the header and what was negotiated, decide the operation
//! or the error reply. Every on-wire value the executor later uses (flags,
//! offset, length) has been checked here.

use crate::proto::{self, Request};

/// Largest READ or WRITE payload, and the maximum block size advertised.
pub const MAX_PAYLOAD: u32 = 32 * 1024 * 1024;

/// What a request is checked against.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Session {
    /// Export size in bytes.
    pub size: u64,
    /// Writes are refused with `EPERM`.
    pub read_only: bool,
    /// Structured replies were negotiated.
    pub structured: bool,
    /// `base:allocation` was selected for this export.
    pub block_status: bool,
}

/// A checked request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// Read `len` bytes.
    Read {
        /// Byte offset.
        offset: u64,
        /// Byte count (at most [`MAX_PAYLOAD`]).
        len: u32,
        /// Send one content chunk only.
        df: bool,
    },
    /// Write the `len`-byte payload that follows the header.
    Write {
        /// Byte offset.
        offset: u64,
        /// Payload bytes (at most [`MAX_PAYLOAD`]).
        len: u32,
        /// Flush before replying.
        fua: bool,
    },
    /// Make completed writes durable.
    Flush,
    /// Discard (advisory).
    Trim {
        /// Byte offset.
        offset: u64,
        /// Byte count.
        len: u32,
        /// Flush before replying.
        fua: bool,
    },
    /// Prefetch.
    Cache {
        /// Byte offset.
        offset: u64,
        /// Byte count.
        len: u32,
    },
    /// Make a range read as zeroes.
    WriteZeroes {
        /// Byte offset.
        offset: u64,
        /// Byte count.
        len: u32,
        /// Flush before replying.
        fua: bool,
        /// Allocate: write real zeroes, leave no hole.
        no_hole: bool,
        /// Fail with `ENOTSUP` unless it is faster than a write.
        fast: bool,
    },
    /// `base:allocation` extents.
    BlockStatus {
        /// Byte offset.
        offset: u64,
        /// Byte count (non-zero).
        len: u32,
        /// Describe one extent only.
        req_one: bool,
    },
    /// End the session.
    Disc,
}

impl Op {
    /// Whether the operation changes the disk.
    pub fn writes(&self) -> bool {
        matches!(
            self,
            Op::Write { .. } | Op::Trim { .. } | Op::WriteZeroes { .. }
        )
    }
}

/// Why a request is refused: the NBD error and a message for people.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// `proto::E*`.
    pub error: u32,
    /// Sent in structured error chunks and logged.
    pub message: String,
}

fn refuse(error: u32, message: impl Into<String>) -> Refusal {
    Refusal {
        error,
        message: message.into(),
    }
}

/// Decides what `req` does, or why it is refused.
pub fn check(req: &Request, s: &Session) -> Result<Op, Refusal> {
    use proto::*;
    if req.command == CMD_DISC {
        // Never answered, so never refused: whatever its flags and
        // reserved fields, the client is leaving.
        return Ok(Op::Disc);
    }
    let allowed = match req.command {
        CMD_READ if s.structured => CMD_FLAG_FUA | CMD_FLAG_DF,
        CMD_READ => CMD_FLAG_FUA,
        CMD_WRITE | CMD_FLUSH | CMD_TRIM | CMD_CACHE => CMD_FLAG_FUA,
        CMD_WRITE_ZEROES => CMD_FLAG_FUA | CMD_FLAG_NO_HOLE | CMD_FLAG_FAST_ZERO,
        CMD_BLOCK_STATUS => CMD_FLAG_FUA | CMD_FLAG_REQ_ONE,
        other => return Err(refuse(EINVAL, format!("unknown command {other}"))),
    };
    if req.flags & !allowed != 0 {
        return Err(refuse(
            EINVAL,
            format!(
                "flags {:#x} are not valid for command {}",
                req.flags & !allowed,
                req.command
            ),
        ));
    }
    let fua = req.flags & CMD_FLAG_FUA != 0;
    let (offset, len) = (req.offset, req.length);
    let writes = matches!(req.command, CMD_WRITE | CMD_TRIM | CMD_WRITE_ZEROES);
    if writes && s.read_only {
        return Err(refuse(EPERM, "the export is read-only"));
    }
    // CACHE counts too: the spec bounds it by the maximum block size, and
    // the prefetch reads what it covers.
    if matches!(req.command, CMD_READ | CMD_WRITE | CMD_CACHE) && len > MAX_PAYLOAD {
        return Err(refuse(
            EINVAL,
            format!("length {len} is over the maximum of {MAX_PAYLOAD} bytes"),
        ));
    }
    let in_range = offset
        .checked_add(u64::from(len))
        .is_some_and(|end| end <= s.size);
    if !in_range && req.command != CMD_FLUSH {
        // The spec asks for ENOSPC on writes past the end, EINVAL otherwise.
        let error = if matches!(req.command, CMD_WRITE | CMD_WRITE_ZEROES) {
            ENOSPC
        } else {
            EINVAL
        };
        return Err(refuse(
            error,
            format!(
                "{len} bytes at offset {offset} are beyond the end of the export ({} bytes)",
                s.size
            ),
        ));
    }
    Ok(match req.command {
        CMD_READ => Op::Read {
            offset,
            len,
            df: req.flags & CMD_FLAG_DF != 0,
        },
        CMD_WRITE => Op::Write { offset, len, fua },
        // Offset and length of a flush are reserved; accepting any value,
        // as qemu-nbd does, costs nothing.
        CMD_FLUSH => Op::Flush,
        CMD_TRIM => Op::Trim { offset, len, fua },
        CMD_CACHE => Op::Cache { offset, len },
        CMD_WRITE_ZEROES => Op::WriteZeroes {
            offset,
            len,
            fua,
            no_hole: req.flags & CMD_FLAG_NO_HOLE != 0,
            fast: req.flags & CMD_FLAG_FAST_ZERO != 0,
        },
        CMD_BLOCK_STATUS => {
            if !s.block_status {
                return Err(refuse(
                    EINVAL,
                    "block status needs base:allocation selected with NBD_OPT_SET_META_CONTEXT",
                ));
            }
            if len == 0 {
                // A reply must hold at least one extent of non-zero length.
                return Err(refuse(EINVAL, "block status of zero bytes"));
            }
            Op::BlockStatus {
                offset,
                len,
                req_one: req.flags & CMD_FLAG_REQ_ONE != 0,
            }
        }
        // Every other command was refused above.
        _ => return Err(refuse(EINVAL, format!("unknown command {}", req.command))),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::*;
    use proptest::prelude::*;

    const RW: Session = Session {
        size: 1 << 20,
        read_only: false,
        structured: true,
        block_status: true,
    };

    fn req(command: u16, flags: u16, offset: u64, length: u32) -> Request {
        Request {
            flags,
            command,
            handle: 1,
            offset,
            length,
        }
    }

    fn err(r: Result<Op, Refusal>) -> u32 {
        r.map(|op| panic!("accepted {op:?}")).unwrap_err().error
    }

    #[test]
    fn ranges() {
        assert!(check(&req(CMD_READ, 0, 0, 1 << 20), &RW).is_ok());
        assert_eq!(err(check(&req(CMD_READ, 0, 1, 1 << 20), &RW)), EINVAL);
        assert_eq!(err(check(&req(CMD_WRITE, 0, 1 << 20, 1), &RW)), ENOSPC);
        assert_eq!(
            err(check(&req(CMD_WRITE_ZEROES, 0, u64::MAX, 2), &RW)),
            ENOSPC
        );
        assert_eq!(err(check(&req(CMD_TRIM, 0, u64::MAX, 2), &RW)), EINVAL);
        assert_eq!(
            err(check(&req(CMD_BLOCK_STATUS, 0, 1 << 20, 1), &RW)),
            EINVAL
        );
        // Flush and disconnect ignore their reserved fields.
        assert_eq!(check(&req(CMD_FLUSH, 0, u64::MAX, 9), &RW), Ok(Op::Flush));
        assert_eq!(
            check(&req(CMD_DISC, 0xffff, u64::MAX, 9), &RW),
            Ok(Op::Disc)
        );
    }

    #[test]
    fn sizes_flags_and_permissions() {
        let big = Session {
            size: 1 << 40,
            ..RW
        };
        assert_eq!(
            err(check(&req(CMD_READ, 0, 0, MAX_PAYLOAD + 1), &big)),
            EINVAL
        );
        assert_eq!(
            err(check(&req(CMD_WRITE, 0, 0, MAX_PAYLOAD + 1), &big)),
            EINVAL
        );
        // Commands without a payload may be longer.
        assert!(check(&req(CMD_TRIM, 0, 0, u32::MAX), &big).is_ok());
        assert_eq!(
            err(check(&req(CMD_READ, CMD_FLAG_NO_HOLE, 0, 1), &RW)),
            EINVAL
        );
        assert_eq!(err(check(&req(99, 0, 0, 1), &RW)), EINVAL);
        let ro = Session {
            read_only: true,
            ..RW
        };
        assert_eq!(err(check(&req(CMD_WRITE, 0, 0, 512), &ro)), EPERM);
        assert_eq!(err(check(&req(CMD_TRIM, 0, 0, 512), &ro)), EPERM);
        assert_eq!(err(check(&req(CMD_WRITE_ZEROES, 0, 0, 512), &ro)), EPERM);
        assert!(check(&req(CMD_READ, 0, 0, 512), &ro).is_ok());
        assert!(check(&req(CMD_FLUSH, 0, 0, 0), &ro).is_ok());
        // DF only with structured replies.
        let simple = Session {
            structured: false,
            block_status: false,
            ..RW
        };
        assert_eq!(
            err(check(&req(CMD_READ, CMD_FLAG_DF, 0, 1), &simple)),
            EINVAL
        );
        assert_eq!(err(check(&req(CMD_BLOCK_STATUS, 0, 0, 1), &simple)), EINVAL);
        assert_eq!(err(check(&req(CMD_BLOCK_STATUS, 0, 0, 0), &RW)), EINVAL);
        assert_eq!(
            check(
                &req(
                    CMD_WRITE_ZEROES,
                    CMD_FLAG_NO_HOLE | CMD_FLAG_FAST_ZERO | CMD_FLAG_FUA,
                    0,
                    4096
                ),
                &RW
            ),
            Ok(Op::WriteZeroes {
                offset: 0,
                len: 4096,
                fua: true,
                no_hole: true,
                fast: true
            })
        );
    }

    proptest! {
        /// Whatever arrives, an accepted operation lies inside the export
        /// and carries at most MAX_PAYLOAD bytes of payload.
        #[test]
        fn accepted_ops_are_in_bounds(command in 0u16..12, flags: u16, offset: u64, length: u32,
                                      size in 0u64..(1 << 45), ro: bool, structured: bool) {
            let s = Session { size, read_only: ro, structured, block_status: structured };
            if let Ok(op) = check(&req(command, flags, offset, length), &s) {
                prop_assert!(!(ro && op.writes()));
                match op {
                    Op::Read { offset, len, .. } | Op::Write { offset, len, .. } => {
                        prop_assert!(len <= MAX_PAYLOAD);
                        prop_assert!(offset + u64::from(len) <= size);
                    }
                    Op::Trim { offset, len, .. } | Op::Cache { offset, len }
                    | Op::WriteZeroes { offset, len, .. } | Op::BlockStatus { offset, len, .. } => {
                        prop_assert!(offset + u64::from(len) <= size);
                    }
                    Op::Flush | Op::Disc => {}
                }
            }
        }
    }
}
