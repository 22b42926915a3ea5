//! `strata store tenant`: issue and revoke tenants' credentials.

use super::*;

/// `strata store tenant revoke`: asks the orchestrator to raise the
/// tenant's minimum generation to one above the one its table shows.
pub(super) fn tenant_revoke(args: TenantRevokeArgs) -> Result<i32> {
    strata_store_protocol::tenant::check_tenant_id(&args.tenant).map_err(anyhow::Error::msg)?;
    if args.tenant == ADMIN {
        bail!(
            "the admin tenant '{ADMIN}' cannot be revoked alone (`strata store up` issues its \
             credential again at every start): rotate the cluster key instead"
        );
    }
    let key = args.key.load(&[])?;
    let on = args.cluster.cluster;
    let (before, min) = runtime()?.block_on(async {
        let table = strata_store_client::transport::fetch_table(on, Some(&key)).await?;
        let before = table.min_generation(&args.tenant);
        let below = before.checked_add(1).with_context(|| {
            format!(
                "tenant '{}' is at the last generation ({before}): rotate the cluster key",
                args.tenant
            )
        })?;
        let min = admin::revoke_tenant(on, &key, &args.tenant, below).await?;
        anyhow::Ok((before, min))
    })?;
    let bound_ms = strata_store::runtime::REVOCATION_BOUND.as_millis();
    match args.cluster.output {
        Output::Json => println!(
            "{}",
            json!({
                "tenant": args.tenant,
                "revoked_below": min,
                "previous_min_generation": before,
                "takes_effect_within_ms": bound_ms,
            })
        ),
        Output::Human => println!(
            "revoked tenant '{}''s credentials of generations below {min}: metadata nodes \
             refuse them within {bound_ms} ms (their next table refresh; a node that cannot \
             reach the orchestrator keeps its last table until it can); issue a new one with \
             `strata store tenant add --cluster {on} --tenant {}`",
            args.tenant, args.tenant
        ),
    }
    Ok(0)
}

pub(super) fn tenant_add(args: TenantAddArgs) -> Result<i32> {
    let key_path = args.file.path();
    let key = ClusterKey::load(&key_path)?;
    strata_store_protocol::tenant::check_tenant_id(&args.tenant).map_err(anyhow::Error::msg)?;
    let generation = match args.cluster {
        // The table sealed with the key: a forged one cannot make this
        // issue a revoked generation.
        Some(on) => runtime()?
            .block_on(strata_store_client::transport::fetch_table(on, Some(&key)))
            .with_context(|| {
                format!("could not ask the orchestrator at {on} for the tenant's generation")
            })?
            .min_generation(&args.tenant),
        None => args.generation.unwrap_or(0),
    };
    let cred = TenantCredential::issue_generation(&key, &args.tenant, generation)?;
    // Derived from the credential (strata_s3::access): printed here once,
    // re-derived by the gateway, stored nowhere.
    let (access_key, secret_key) = s3_keys(&cred);
    let out = args
        .out
        .clone()
        .unwrap_or_else(|| StdOutput::File(default_credential_path(&args.tenant, &key_path)));
    let out = match out {
        StdOutput::File(path) => path,
        StdOutput::Stdout => {
            // Standard output carries the credential alone; the report
            // goes to standard error.
            print!("{}", cred.to_file_text());
            std::io::stdout().flush()?;
            let scope = describe_scope(&args.tenant);
            match args.output {
                Output::Json => eprintln!(
                    "{}",
                    json!({"tenant": args.tenant, "scope": scope, "credential": "-",
                           "generation": generation, "s3_access_key": access_key,
                           "s3_secret_key": secret_key})
                ),
                Output::Human => eprintln!(
                    "strata: wrote tenant '{}''s credential (generation {generation}) to \
                     standard output ({scope}): keep it as secret as the cluster key\n{}",
                    args.tenant,
                    s3_lines(&access_key, &secret_key)
                ),
            }
            return Ok(0);
        }
    };
    cred.save(&out)?;
    let scope = describe_scope(&args.tenant);
    match args.output {
        Output::Json => println!(
            "{}",
            json!({"tenant": args.tenant, "scope": scope, "credential": out,
                   "generation": generation, "s3_access_key": access_key,
                   "s3_secret_key": secret_key})
        ),
        Output::Human => println!(
            "wrote tenant '{}''s credential (generation {generation}) to {} ({scope}): give it \
             to the tenant, who runs `strata obj --credential FILE ...` (or sets \
             {CREDENTIAL_ENV}=FILE){}\n{}",
            args.tenant,
            out.display(),
            if args.cluster.is_none() {
                "; issued without asking the orchestrator (no --cluster): if this tenant was \
                 revoked, this generation may be refused"
            } else {
                ""
            },
            s3_lines(&access_key, &secret_key)
        ),
    }
    Ok(0)
}

/// The S3 key pair as `tenant add` prints it: one `name value` line each,
/// so scripts can pick them out (`awk '/^s3 access key/ {print $4}'`).
fn s3_lines(access_key: &str, secret_key: &str) -> String {
    format!(
        "s3 access key {access_key}\ns3 secret key {secret_key}\n\
         (the S3 gateway derives the same pair from the cluster key: it is stored nowhere; \
         revoking the tenant revokes it)"
    )
}

/// Where `tenant add` writes a credential without --out: ID.credential
/// (admin.credential for '*') next to the key file.
pub(super) fn default_credential_path(tenant: &str, key_path: &std::path::Path) -> PathBuf {
    let name = if tenant == ADMIN {
        ADMIN_CREDENTIAL_FILE.to_string()
    } else {
        format!("{tenant}.credential")
    };
    match key_path.parent() {
        Some(dir) => dir.join(name),
        None => PathBuf::from(name),
    }
}
