//! S3 access keys: which store tenant an access key names, and the secret
//! that signs its requests.
//!
//! Nothing new is stored. An access key is `TENANT~GENERATION` (a tenant
//! id holds no `~`), and its secret is derived from that tenant
//! credential's secret:
//! `hex(HMAC-SHA256(tenant secret, "strata s3 secret key v1" 0x00))[..40]`.
//! So `strata store tenant add`, which issues the credential, can print
//! the pair, and the gateway, which holds the cluster key, re-derives the
//! credential (and from it the secret) for every access key it is shown.
//! Revoking the tenant's generation revokes its S3 key with it: the store
//! refuses the credential the gateway acts with.

use hmac::{Hmac, Mac};
use sha2::Sha256;
use strata_store_protocol::key::ClusterKey;
use strata_store_protocol::tenant::{check_tenant_id, Generation, TenantCredential};

/// Domain-separation prefix of an S3 secret: no tag or key the tenant's
/// secret makes for the store's own messages is ever this.
const SECRET_DOMAIN: &[u8] = b"strata s3 secret key v1\0";

/// Hex digits of an S3 secret: 160 bits, as long as AWS's own secrets.
const SECRET_HEX_DIGITS: usize = 40;

/// What separates the tenant id from the generation in an access key.
const SEPARATOR: char = '~';

/// The access key of tenant credential `credential`.
pub fn access_key(credential: &TenantCredential) -> String {
    format!(
        "{}{SEPARATOR}{}",
        credential.tenant(),
        credential.generation()
    )
}

/// The S3 secret of tenant credential `credential` (40 hex digits).
pub fn secret_key(credential: &TenantCredential) -> String {
    let Ok(mut mac) = Hmac::<Sha256>::new_from_slice(&credential.secret_bytes()) else {
        unreachable!("HMAC takes keys of any length");
    };
    mac.update(SECRET_DOMAIN);
    let digest = mac.finalize().into_bytes();
    let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    hex[..SECRET_HEX_DIGITS].to_string()
}

/// The tenant id and generation an access key names, or why it names
/// none.
pub fn parse_access_key(access_key: &str) -> Result<(&str, Generation), String> {
    let Some((tenant, generation)) = access_key.rsplit_once(SEPARATOR) else {
        return Err(format!(
            "access key {access_key:?} is not TENANT{SEPARATOR}GENERATION; \
             `strata store tenant add` prints a tenant's access key"
        ));
    };
    check_tenant_id(tenant)?;
    let generation = generation.parse::<Generation>().map_err(|_| {
        format!("access key {access_key:?}: the generation {generation:?} is not a number")
    })?;
    Ok((tenant, generation))
}

/// Issues the tenant credential an access key names, under the active
/// cluster key.
pub fn credential_for(key: &ClusterKey, access_key: &str) -> Result<TenantCredential, String> {
    let (tenant, generation) = parse_access_key(access_key)?;
    TenantCredential::issue_generation(key, tenant, generation).map_err(|e| e.report().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_access_key_names_its_tenant_and_generation() {
        let key = ClusterKey::from_bytes(&[7; 32]);
        let credential = TenantCredential::issue_generation(&key, "acme.eu", 3).unwrap();
        let access = access_key(&credential);
        assert_eq!(access, "acme.eu~3");
        assert_eq!(parse_access_key(&access).unwrap(), ("acme.eu", 3));
        let again = credential_for(&key, &access).unwrap();
        assert_eq!(secret_key(&again), secret_key(&credential));
        assert_eq!(secret_key(&credential).len(), SECRET_HEX_DIGITS);
    }

    #[test]
    fn secrets_differ_by_tenant_generation_and_key() {
        let key = ClusterKey::from_bytes(&[7; 32]);
        let other_key = ClusterKey::from_bytes(&[8; 32]);
        let secrets = [
            secret_key(&credential_for(&key, "acme~0").unwrap()),
            secret_key(&credential_for(&key, "acme~1").unwrap()),
            secret_key(&credential_for(&key, "globex~0").unwrap()),
            secret_key(&credential_for(&other_key, "acme~0").unwrap()),
        ];
        for (i, a) in secrets.iter().enumerate() {
            for b in &secrets[i + 1..] {
                assert_ne!(a, b);
            }
        }
    }

    #[test]
    fn malformed_access_keys_are_refused_with_the_reason() {
        for bad in ["acme", "acme~", "acme~x", "a/b~0", "~0", "acme~99999999999"] {
            assert!(parse_access_key(bad).is_err(), "{bad}");
        }
        assert_eq!(parse_access_key("*~0").unwrap(), ("*", 0));
    }
}
