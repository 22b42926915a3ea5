//! The metadata node: its redb database ([`database`]), its protocol
//! state machine, deterministic and without I/O ([`state`]), and the
//! runtime that serves it on UDP sockets ([`server`]); [`faulty_storage`]
//! is a simulated disk for the tests only.

pub mod database;
pub mod faulty_storage;
mod hot_rows;
pub mod server;
pub mod state;
mod work;
