//! One Put on a storage node as a state machine without I/O: the data
//! arrives, is written to a temporary file and forwarded to the next
//! replica of the chain; once the sender's checksum matches, the file is
//! synced, then installed (renamed into place, its directory synced), and
//! only then is the Put acknowledged, with the number of durable copies
//! this node and the rest of the chain hold.
//!
//! [`PutMachine::handle`] takes what happened ([`PutEvent`]) and returns
//! what to do ([`PutAction`]); the I/O shell
//! ([`crate::storage::replicas`]) and the simulation execute the actions
//! and feed back their outcome. The node's own bookkeeping (counters,
//! Puts in flight) goes through [`crate::storage::core::StorageCore`],
//! which alone may tell a machine that its file is installed.

use crate::storage::file::{header, ChunkTable, FILE_HEADER};
use strata_store_protocol::addr::{fmt_addr, Addr};

/// What a Put's sender is told at the end.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PutReply {
    /// Stored: `copies` replicas of the chain, this one first, are
    /// durable.
    Ack {
        /// Durable copies: 1 for this node plus what the rest of the
        /// chain reported (0 if it failed).
        copies: u8,
    },
    /// Refused, with the reason.
    Error(String),
}

/// What the executor of a Put does next, in order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PutAction {
    /// Create the temporary file and write `header` to it.
    CreateTemp {
        /// The replica file's header, its checksum still zero.
        header: [u8; FILE_HEADER],
    },
    /// Open the next replica of the chain and send it a Put of `size`
    /// bytes for `next` whose own chain is `chain`.
    OpenForward {
        /// The next replica's address.
        next: Addr,
        /// The replicas after it.
        chain: Vec<Addr>,
        /// The Put's size.
        size: u64,
    },
    /// Append the chunk just received to the temporary file.
    Write,
    /// Send the chunk just received to the next replica.
    Forward,
    /// Send the sender's checksum to the next replica and flush.
    ForwardChecksum {
        /// The checksum the sender sent.
        crc: u32,
    },
    /// Append the chunk table after the data, then write the data's
    /// checksum into the temporary file's header.
    WriteChecksum {
        /// CRC-32C of the data.
        crc: u32,
        /// The chunk table ([`crate::storage::file::ChunkTable`]).
        table: Vec<u8>,
    },
    /// Sync the temporary file; report [`PutEvent::Synced`].
    Sync,
    /// Rename the temporary file into place and sync the directory (a
    /// sync the shell may share with other Puts installed meanwhile, as
    /// long as it begins after this rename:
    /// [`crate::storage::group_sync`]); report through
    /// [`crate::storage::core::StorageCore::installed`].
    Install,
    /// Read the next replica's answer; report
    /// [`PutEvent::ForwardAnswer`].
    AwaitForward,
    /// Send the reply to the Put's sender.
    Reply(PutReply),
    /// Remove the temporary file: the Put will never be installed.
    RemoveTemp,
    /// Tell the tenant's coordinator that the Put was abandoned, so the
    /// name is unlocked at once.
    ReportAbandoned {
        /// The coordinator's metadata address.
        coordinator: Addr,
        /// The replica whose Put was abandoned.
        replica: Addr,
    },
}

/// What happened to a Put.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PutEvent<'a> {
    /// A chunk of data arrived (at most what is still due).
    Data(&'a [u8]),
    /// The next replica cannot be reached or stopped taking data.
    ForwardFailed,
    /// The sender's checksum arrived after the data.
    Checksum(u32),
    /// Writing the temporary file failed: the Put is refused with this
    /// reason.
    WriteFailed(&'a str),
    /// The temporary file is synced.
    Synced,
    /// The next replica answered with this many durable copies (`None`:
    /// it failed or did not answer in time).
    ForwardAnswer(Option<u8>),
    /// The sender went away or stopped sending, or the disk failed after
    /// the data was taken: nothing can be replied. After the reply, it
    /// means the reply did not get through.
    Broken,
}

/// Where a Put stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PutPhase {
    /// Taking data.
    Receiving,
    /// Waiting for the temporary file's sync.
    Syncing,
    /// Waiting for the rename into place.
    Installing,
    /// Installed; waiting for the next replica's answer.
    AwaitingForward,
    /// Replied to, refused or broken: nothing more to do.
    Done,
}

/// One Put's state (see the module documentation).
#[derive(Debug)]
pub struct PutMachine {
    addr: Addr,
    size: u64,
    chain: Vec<Addr>,
    /// The tenant's coordinator, told when the Put is abandoned (none for
    /// a node's Put).
    coordinator: Option<Addr>,
    phase: PutPhase,
    left: u64,
    /// The CRC of every chunk of the data so far, and of all of it.
    chunks: ChunkTable,
    /// Whether the next replica is still taking data.
    forwarding: bool,
    /// The next replica's answer, if it came before this node was
    /// installed.
    answer: Option<Option<u8>>,
}

impl PutMachine {
    /// A Put admitted by [`crate::storage::core::StorageCore::admit_put`],
    /// and its first actions.
    pub(super) fn start(
        addr: Addr,
        size: u64,
        chain: Vec<Addr>,
        coordinator: Option<Addr>,
    ) -> (PutMachine, Vec<PutAction>) {
        let mut actions = vec![PutAction::CreateTemp {
            header: header(size),
        }];
        if let Some((&next, rest)) = chain.split_first() {
            actions.push(PutAction::OpenForward {
                next,
                chain: rest.to_vec(),
                size,
            });
        }
        let machine = PutMachine {
            addr,
            size,
            forwarding: !chain.is_empty(),
            chain,
            coordinator,
            phase: PutPhase::Receiving,
            left: size,
            chunks: ChunkTable::default(),
            answer: None,
        };
        (machine, actions)
    }

    /// The replica's address.
    pub fn addr(&self) -> Addr {
        self.addr
    }

    /// The replica's size.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// The replicas after this one.
    pub fn chain(&self) -> &[Addr] {
        &self.chain
    }

    /// Data bytes still due.
    pub fn left(&self) -> u64 {
        self.left
    }

    /// Where the Put stands.
    pub fn phase(&self) -> PutPhase {
        self.phase
    }

    /// Whether the next replica is still taking data.
    pub fn forwarding(&self) -> bool {
        self.forwarding
    }

    /// Takes one event and returns what to do. An event that does not
    /// fit the phase (data after the checksum, a sync before it) does
    /// nothing: above all, no reply is ever sent before the replica is
    /// synced and installed.
    pub fn handle(&mut self, event: PutEvent) -> Vec<PutAction> {
        match (self.phase, event) {
            (PutPhase::Receiving, PutEvent::Data(chunk)) => self.data(chunk),
            // The reply did not get through: the sender is gone.
            (PutPhase::Done, PutEvent::Broken) => self.abandoned(),
            (PutPhase::Done, _) => Vec::new(),
            (_, PutEvent::ForwardFailed) => self.forward_failed(),
            (PutPhase::Receiving, PutEvent::Checksum(sent)) => self.checksum(sent),
            (PutPhase::Receiving | PutPhase::Syncing, PutEvent::WriteFailed(why)) => {
                self.refuse(why.to_string())
            }
            (PutPhase::Syncing, PutEvent::Synced) => {
                self.phase = PutPhase::Installing;
                vec![PutAction::Install]
            }
            (_, PutEvent::ForwardAnswer(copies)) => self.forward_answer(copies),
            (_, PutEvent::Broken) => self.broken(),
            _ => Vec::new(),
        }
    }

    /// The file is in place (called by the core, which counts it).
    pub(super) fn installed(&mut self) -> Vec<PutAction> {
        if self.phase != PutPhase::Installing {
            return Vec::new();
        }
        match self.answer {
            Some(copies) => self.acknowledge(copies),
            None if self.forwarding => {
                self.phase = PutPhase::AwaitingForward;
                vec![PutAction::AwaitForward]
            }
            None => self.acknowledge(None),
        }
    }

    fn data(&mut self, chunk: &[u8]) -> Vec<PutAction> {
        let n = chunk.len() as u64;
        if n == 0 || n > self.left {
            // More than the header announced: the sender is out of step.
            return self.broken();
        }
        self.chunks.push(chunk);
        self.left -= n;
        let mut actions = vec![PutAction::Write];
        if self.forwarding {
            actions.push(PutAction::Forward);
        }
        actions
    }

    fn forward_failed(&mut self) -> Vec<PutAction> {
        self.forwarding = false;
        if self.phase == PutPhase::AwaitingForward {
            return self.acknowledge(None);
        }
        Vec::new()
    }

    fn checksum(&mut self, sent: u32) -> Vec<PutAction> {
        if self.left > 0 {
            // The checksum cannot come before the data.
            return self.broken();
        }
        let mut actions = Vec::new();
        if self.forwarding {
            // The next replica checks the same checksum on its own copy.
            actions.push(PutAction::ForwardChecksum { crc: sent });
        }
        let crc = self.chunks.data_crc();
        if sent != crc {
            self.phase = PutPhase::Done;
            actions.push(PutAction::RemoveTemp);
            actions.push(PutAction::Reply(PutReply::Error(format!(
                "checksum mismatch: the sender says {sent:08x}, the data has {crc:08x}"
            ))));
            return actions;
        }
        self.phase = PutPhase::Syncing;
        let table = std::mem::take(&mut self.chunks).finish();
        actions.push(PutAction::WriteChecksum { crc, table });
        actions.push(PutAction::Sync);
        actions
    }

    fn forward_answer(&mut self, copies: Option<u8>) -> Vec<PutAction> {
        if self.phase == PutPhase::AwaitingForward {
            return self.acknowledge(copies);
        }
        // Early (the next replica finished first): kept for the install.
        self.answer = Some(copies);
        Vec::new()
    }

    fn acknowledge(&mut self, downstream: Option<u8>) -> Vec<PutAction> {
        debug_assert!(matches!(
            self.phase,
            PutPhase::Installing | PutPhase::AwaitingForward
        ));
        self.phase = PutPhase::Done;
        let copies = 1u8.saturating_add(downstream.unwrap_or(0));
        vec![PutAction::Reply(PutReply::Ack { copies })]
    }

    fn refuse(&mut self, why: String) -> Vec<PutAction> {
        self.phase = PutPhase::Done;
        vec![
            PutAction::RemoveTemp,
            PutAction::Reply(PutReply::Error(why)),
        ]
    }

    fn broken(&mut self) -> Vec<PutAction> {
        let before_install = matches!(self.phase, PutPhase::Receiving | PutPhase::Syncing);
        self.phase = PutPhase::Done;
        let mut actions = Vec::new();
        if before_install {
            actions.push(PutAction::RemoveTemp);
        }
        actions.extend(self.abandoned());
        actions
    }

    /// The tenant's connection broke mid-Put: its client is gone (a
    /// client never resends on another connection), so its coordinator
    /// is told.
    fn abandoned(&self) -> Vec<PutAction> {
        self.coordinator
            .map(|coordinator| PutAction::ReportAbandoned {
                coordinator,
                replica: self.addr,
            })
            .into_iter()
            .collect()
    }

    /// A one-line account for logs.
    pub fn describe(&self) -> String {
        format!(
            "Put of {} ({} bytes, {} left, {:?})",
            fmt_addr(self.addr),
            self.size,
            self.left,
            self.phase
        )
    }
}
