//! Crash points for tests.
//!
//! The crash tests need a daemon killed at exact steps of a multi-step
//! change (between a merge and its catalog commit, say), which a SIGKILL
//! sent from outside only hits by luck. When the environment variable
//! `STRATA_FAILPOINT` names a point, the process kills itself with SIGKILL
//! there: no destructor runs and nothing is flushed, exactly as if the
//! machine had lost the process. Unset, a point costs one environment
//! look-up per multi-step change, never per I/O.

/// The environment variable naming the point to crash at.
pub const FAILPOINT_ENV: &str = "STRATA_FAILPOINT";

/// Kills the process with SIGKILL if `STRATA_FAILPOINT` equals `name`.
pub fn failpoint(name: &str) {
    if std::env::var(FAILPOINT_ENV).is_ok_and(|v| v == name) {
        tracing::warn!("failpoint {name}: killing the process");
        // SAFETY: kill(2) on our own pid has no memory-safety conditions.
        unsafe {
            libc::kill(libc::getpid(), libc::SIGKILL);
        }
    }
}
