//! `strata s3`: the S3 gateway on its own, and the one `strata store up`
//! starts beside its cluster. The gateway itself is `strata_s3`.

use super::*;

/// Where `strata s3` listens unless told: loopback, port 10900.
pub const DEFAULT_S3_LISTEN: &str = "127.0.0.1:10900";

/// `strata s3` arguments.
#[derive(Args)]
pub struct S3Args {
    /// The orchestrator's UDP endpoint of the cluster to serve.
    #[arg(long, env = "STRATA_CLUSTER", default_value = "127.0.0.1:10890")]
    pub(super) cluster: SocketAddr,
    /// Where to serve S3 (HTTP; put TLS in front of it for other hosts).
    #[arg(long, default_value = DEFAULT_S3_LISTEN)]
    pub(super) listen: SocketAddr,
    /// The gateway derives every tenant's credential (and S3 secret)
    /// from the cluster key; default: ./cluster.key.
    #[command(flatten)]
    pub(super) key: KeyArg,
    #[command(flatten)]
    pub(super) expiry: UploadExpiryArg,
}

/// How long the gateway keeps multipart uploads nobody completes.
#[derive(Args)]
pub struct UploadExpiryArg {
    /// Abort multipart uploads still pending this long after they
    /// started, and delete their parts (`90s`, `12h`, `7d`); the gateway
    /// looks every tenth of it (at least every second, at most hourly).
    #[arg(long, value_name = "DURATION", default_value = "7d", value_parser = crate::units::parse_duration)]
    pub(super) multipart_expiry: std::time::Duration,
}

/// What a gateway started beside its cluster's nodes (`strata store up`)
/// reaches without the network; nothing for `strata s3`.
#[derive(Default)]
pub(super) struct Local {
    /// The replicas of this process's storage nodes, read from their files.
    pub replicas: Option<std::sync::Arc<strata_store_client::client::local::LocalDisk>>,
    /// This process's metadata nodes, asked for records by a direct call.
    pub metadata: Option<std::sync::Arc<dyn LocalMetadata>>,
}

/// Binds the gateway of the cluster at `cluster` on `listen`; the bound
/// endpoint and its task (stopped when dropped).
pub(super) async fn start_gateway(
    cluster: SocketAddr,
    key: ClusterKey,
    listen: SocketAddr,
    expiry: &UploadExpiryArg,
    local: Local,
) -> Result<(SocketAddr, AbortOnDrop)> {
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .with_context(|| format!("could not listen for S3 on {listen}; is the port taken?"))?;
    let bound = listener.local_addr()?;
    let mut gateway =
        strata_s3::Gateway::new(cluster, key).with_upload_expiry(expiry.multipart_expiry);
    if let Some(replicas) = local.replicas {
        gateway = gateway.with_local_replicas(replicas);
    }
    if let Some(metadata) = local.metadata {
        gateway = gateway.with_local_metadata(metadata);
    }
    let task = tokio::spawn(async move {
        if let Err(e) = strata_s3::serve(listener, gateway).await {
            tracing::error!("the S3 gateway stopped: {e}");
        }
    });
    Ok((bound, AbortOnDrop(task)))
}

/// Runs `strata s3` until SIGTERM or SIGINT.
pub fn run_s3(args: S3Args) -> Result<i32> {
    crate::serve::init_logging();
    let key = args.key.load(&[PathBuf::from(KEY_FILE)])?;
    runtime()?.block_on(async {
        let stop = crate::serve::shutdown_signal();
        // Fails early, with the cluster named, if no orchestrator answers.
        strata_store_client::transport::fetch_table(args.cluster, Some(&key))
            .await
            .with_context(|| format!("no cluster answered at {}", args.cluster))?;
        let (bound, _task) = start_gateway(
            args.cluster,
            key.clone(),
            args.listen,
            &args.expiry,
            Local::default(),
        )
        .await?;
        reload_on_hangup(key, None)?;
        let mut out = std::io::stdout().lock();
        writeln!(
            out,
            "strata s3: ready on http://{bound} (cluster {})",
            args.cluster
        )?;
        out.flush()?;
        drop(out);
        stop.await;
        anyhow::Ok(0)
    })
}

/// The S3 access key and secret of `credential`, as `tenant add` prints
/// them.
pub(super) fn s3_keys(credential: &TenantCredential) -> (String, String) {
    (
        strata_s3::access::access_key(credential),
        strata_s3::access::secret_key(credential),
    )
}
