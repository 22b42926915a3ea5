//! The orchestrator: admission, prefix assignment, heartbeats and the
//! table it publishes ([`state`], without I/O), and its runtime on a UDP
//! socket ([`server`]).

pub mod server;
pub mod state;
