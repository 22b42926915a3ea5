//! The metadata node: its redb database ([`database`]), its protocol
//! state machine, deterministic and without I/O ([`state`]), and the
//! runtime that serves it on UDP sockets ([`server`]).

pub mod database;
pub mod server;
pub mod state;
