//! Strata's integration tests: one test binary that runs the real
//! `strata` binary against real peers (QEMU's tools, libnbd, fio, the
//! kernel's network namespaces), with one shared harness in [`common`].
//!
//! Run one area with a filter on its module path, for example
//! `cargo test -p strata --test integration -- nbd_tls::` or
//! `-- store::`.

mod architecture;
mod bench;
mod bench_fs;
mod bench_qemu;
mod bench_scripts;
mod common;
mod damaged;
mod docs_examples;
mod f3;
mod f3_netns;
mod f3_range;
mod f3_run;
mod hostile;
mod img_ops;
mod interop;
mod locking;
mod mirror;
mod nbd;
mod nbd_tls;
mod output;
mod qemu_parity;
mod s3;
mod s3_checksums;
mod s3_clients;
mod s3_load;
mod s3_local;
mod store;
mod store_routed;
mod up;
mod volume;
