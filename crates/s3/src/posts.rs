//! Posts that wait their turn: the store takes one Post of a name at a
//! time and refuses another meanwhile (Conflict), where S3 lets
//! concurrent PutObjects of a key all succeed and the last one win. So
//! the gateway posts again, after a short and growing pause, until the
//! name is free or [`RETRY_FOR`] has passed; the data is read again from
//! its start ([`Rewind`]), which the store allows only because it refuses
//! a Post before reading its data (or, for an inline object, after
//! reading at most 4 KiB, which the reader keeps).

use crate::streams::Rewind;
use std::time::Duration;
use strata_store_client::client::{Client, PutResult};
use strata_store_protocol::class::StorageClass;
use strata_store_protocol::{Code, Error};
use tokio::time::Instant;

/// How long a Post keeps trying while other Posts of its name hold it:
/// longer than a large object's upload on a busy link would be
/// unbounded, so a Put that waited this long answers OperationAborted.
pub(crate) const RETRY_FOR: Duration = Duration::from_secs(30);

/// The first pause before posting again; each later one doubles, up to
/// [`LONGEST_PAUSE`].
const FIRST_PAUSE: Duration = Duration::from_millis(2);

/// The longest pause between two tries.
const LONGEST_PAUSE: Duration = Duration::from_millis(200);

/// What a Post writes: the store name, the data's size and the class
/// (`None`: the store's for the name).
pub(crate) struct Target<'a> {
    /// The store name.
    pub name: &'a str,
    /// The data's size in bytes.
    pub size: u64,
    /// The class to keep it in, if not the store's for the name.
    pub class: Option<StorageClass>,
}

/// Posts `data` to `target` as [`Client::put_in_class`] does, with the
/// attributes `finish` gives (it may be called once per try that read
/// the whole data), trying again while another Post of the name is in
/// progress, for up to [`RETRY_FOR`].
pub(crate) async fn post<R: Rewind>(
    client: &Client,
    target: &Target<'_>,
    data: &mut R,
    mut finish: impl FnMut() -> Result<Vec<u8>, Error>,
) -> Result<PutResult, Error> {
    let deadline = Instant::now() + RETRY_FOR;
    let mut pause = FIRST_PAUSE;
    loop {
        let posted = client
            .put_in_class(
                target.name,
                target.size,
                data,
                &|_| {},
                target.class,
                &mut finish,
            )
            .await;
        match posted {
            Err(e) if is_busy(&e) && Instant::now() + pause < deadline && data.rewind() => {
                tokio::time::sleep(jittered(pause)).await;
                pause = (pause * 2).min(LONGEST_PAUSE);
            }
            other => return other,
        }
    }
}

/// Whether the store refused a Post because another change of the name
/// was in progress.
fn is_busy(error: &Error) -> bool {
    matches!(
        error,
        Error::Remote {
            code: Code::Conflict,
            ..
        }
    )
}

/// `pause` plus up to half of it again, at random: concurrent Puts that
/// met each other do not try again in step.
fn jittered(pause: Duration) -> Duration {
    let mut byte = [0u8];
    let random = getrandom::fill(&mut byte).map_or(0, |_| byte[0]);
    pause + pause * u32::from(random) / 510
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pauses_are_jittered_within_half_again() {
        for _ in 0..100 {
            let pause = jittered(Duration::from_millis(100));
            assert!(pause >= Duration::from_millis(100) && pause <= Duration::from_millis(150));
        }
    }
}
