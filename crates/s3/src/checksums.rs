//! S3's flexible checksums: the `x-amz-checksum-*` values a PutObject or
//! UploadPart carries (in headers, or as trailers of an aws-chunked
//! body), checked against the body as it streams, and the one checksum
//! kept with the object ([`KeptChecksum`], in its record's attributes)
//! and answered by GetObject and HeadObject with `x-amz-checksum-mode:
//! ENABLED`. A multipart object keeps S3's *composite* checksum: the
//! checksum of its parts' binary checksums, then `-N` for N parts. The
//! digests are s3s's [`ChecksumHasher`] (crc32fast, crc32c, sha1, sha2
//! and crc-fast underneath): no checksum is written here by hand.

use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use s3s::checksum::ChecksumHasher;
use s3s::dto::{Checksum, ChecksumAlgorithm, ChecksumType};
use s3s::TrailingHeaders;
use serde::{Deserialize, Serialize};

/// A checksum algorithm of S3's.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum Algorithm {
    /// CRC-32 (ISO HDLC), 4 bytes.
    Crc32,
    /// CRC-32C (Castagnoli), 4 bytes.
    Crc32c,
    /// SHA-1, 20 bytes.
    Sha1,
    /// SHA-256, 32 bytes.
    Sha256,
    /// CRC-64/NVME, 8 bytes.
    Crc64nvme,
}

impl Algorithm {
    /// Every algorithm, in the order S3's documents list them.
    pub const ALL: [Algorithm; 5] = [
        Algorithm::Crc32,
        Algorithm::Crc32c,
        Algorithm::Sha1,
        Algorithm::Sha256,
        Algorithm::Crc64nvme,
    ];

    /// Its name as S3 writes it (`CRC32C`).
    pub fn name(self) -> &'static str {
        match self {
            Algorithm::Crc32 => "CRC32",
            Algorithm::Crc32c => "CRC32C",
            Algorithm::Sha1 => "SHA1",
            Algorithm::Sha256 => "SHA256",
            Algorithm::Crc64nvme => "CRC64NVME",
        }
    }

    /// The algorithm S3 names `name` (any case), if it is one.
    pub fn parse(name: &str) -> Option<Algorithm> {
        Algorithm::ALL
            .into_iter()
            .find(|algorithm| algorithm.name().eq_ignore_ascii_case(name))
    }

    /// The header (or trailer) that carries its value.
    pub fn header(self) -> String {
        format!("x-amz-checksum-{}", self.name().to_ascii_lowercase())
    }

    /// How many bytes its digest has.
    pub fn digest_len(self) -> usize {
        match self {
            Algorithm::Crc32 | Algorithm::Crc32c => 4,
            Algorithm::Sha1 => 20,
            Algorithm::Sha256 => 32,
            Algorithm::Crc64nvme => 8,
        }
    }

    /// Its value in `checksum` (base64), if there is one.
    pub fn of(self, checksum: &Checksum) -> Option<&String> {
        match self {
            Algorithm::Crc32 => checksum.checksum_crc32.as_ref(),
            Algorithm::Crc32c => checksum.checksum_crc32c.as_ref(),
            Algorithm::Sha1 => checksum.checksum_sha1.as_ref(),
            Algorithm::Sha256 => checksum.checksum_sha256.as_ref(),
            Algorithm::Crc64nvme => checksum.checksum_crc64nvme.as_ref(),
        }
    }

    /// Sets its value in `checksum`.
    pub fn set(self, checksum: &mut Checksum, value: String) {
        let field = match self {
            Algorithm::Crc32 => &mut checksum.checksum_crc32,
            Algorithm::Crc32c => &mut checksum.checksum_crc32c,
            Algorithm::Sha1 => &mut checksum.checksum_sha1,
            Algorithm::Sha256 => &mut checksum.checksum_sha256,
            Algorithm::Crc64nvme => &mut checksum.checksum_crc64nvme,
        };
        *field = Some(value);
    }

    /// Turns it on in `hasher`.
    pub fn enable(self, hasher: &mut ChecksumHasher) {
        match self {
            Algorithm::Crc32 => hasher.crc32 = Some(Default::default()),
            Algorithm::Crc32c => hasher.crc32c = Some(Default::default()),
            Algorithm::Sha1 => hasher.sha1 = Some(Default::default()),
            Algorithm::Sha256 => hasher.sha256 = Some(Default::default()),
            Algorithm::Crc64nvme => hasher.crc64nvme = Some(Default::default()),
        }
    }

    /// Its checksum of `bytes`, in base64.
    pub fn digest(self, bytes: &[u8]) -> String {
        let mut hasher = ChecksumHasher::default();
        self.enable(&mut hasher);
        hasher.update(bytes);
        self.of(&hasher.finalize()).cloned().unwrap_or_default()
    }
}

/// The algorithm an s3s field names (`x-amz-checksum-algorithm`,
/// `x-amz-sdk-checksum-algorithm`); InvalidRequest for one S3 lacks.
pub fn requested(field: Option<&ChecksumAlgorithm>) -> Result<Option<Algorithm>, String> {
    let Some(field) = field else {
        return Ok(None);
    };
    Algorithm::parse(field.as_str()).map(Some).ok_or_else(|| {
        format!(
            "checksum algorithm {:?} is not one of CRC32, CRC32C, SHA1, SHA256, CRC64NVME",
            field.as_str()
        )
    })
}

/// Whether a CreateMultipartUpload asks for a `FULL_OBJECT` checksum
/// (`x-amz-checksum-type`); InvalidRequest for a type S3 lacks, for
/// `FULL_OBJECT` without an algorithm or with a SHA (S3 keeps those only
/// as composites), and for `COMPOSITE` with CRC-64/NVME (S3 keeps that
/// only whole).
pub fn full_object_requested(
    algorithm: Option<Algorithm>,
    kind: Option<&ChecksumType>,
) -> Result<bool, String> {
    let Some(kind) = kind else {
        // S3's default: composite, but CRC-64/NVME is full-object only.
        return Ok(algorithm == Some(Algorithm::Crc64nvme));
    };
    match (kind.as_str(), algorithm) {
        (ChecksumType::FULL_OBJECT, Some(algorithm)) if full_object_crc(algorithm).is_some() => {
            Ok(true)
        }
        (ChecksumType::FULL_OBJECT, Some(algorithm)) => Err(format!(
            "checksum type FULL_OBJECT needs a CRC (CRC32, CRC32C or CRC64NVME), not {}: \
             use COMPOSITE with it",
            algorithm.name()
        )),
        (ChecksumType::COMPOSITE, Some(Algorithm::Crc64nvme)) => Err(
            "checksum type COMPOSITE cannot be used with CRC64NVME: use FULL_OBJECT".to_string(),
        ),
        (ChecksumType::COMPOSITE, Some(_)) => Ok(false),
        (ChecksumType::FULL_OBJECT | ChecksumType::COMPOSITE, None) => Err(format!(
            "checksum type {} needs x-amz-checksum-algorithm too",
            kind.as_str()
        )),
        (other, _) => Err(format!(
            "checksum type {other:?} is not one of COMPOSITE, FULL_OBJECT"
        )),
    }
}

/// The checksum kept with an object or part: its algorithm and value
/// (base64; for a multipart object, S3's composite, ending `-N`). A
/// pending upload keeps its algorithm here with an empty value: every
/// part is checked and kept with it, and Complete answers the composite.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeptChecksum {
    /// The algorithm.
    #[serde(rename = "a")]
    pub algorithm: Algorithm,
    /// The value, base64 (and `-N` for a composite of N parts).
    #[serde(rename = "v")]
    pub value: String,
    /// A multipart upload started with checksum type `FULL_OBJECT`: its
    /// Complete keeps the whole object's CRC (combined from its parts'),
    /// not a composite.
    #[serde(rename = "f", default, skip_serializing_if = "std::ops::Not::not")]
    pub full_object: bool,
}

impl KeptChecksum {
    /// Whether it is a multipart object's composite (ends in `-N`).
    pub fn is_composite(&self) -> bool {
        self.value.contains('-')
    }

    /// The value as s3s's output fields carry it, with its type.
    pub fn to_dto(&self) -> Checksum {
        let mut checksum = Checksum::default();
        self.algorithm.set(&mut checksum, self.value.clone());
        checksum.checksum_type = Some(ChecksumType::from_static(if self.is_composite() {
            ChecksumType::COMPOSITE
        } else {
            ChecksumType::FULL_OBJECT
        }));
        checksum
    }

    /// A value as long as the longest this algorithm's can be for an
    /// object of up to `parts` parts (0: a plain object): the attributes
    /// are checked for size with it before the body is read.
    pub fn placeholder(algorithm: Algorithm, parts: u32) -> KeptChecksum {
        let mut value = STANDARD.encode(vec![0u8; algorithm.digest_len()]);
        if parts > 0 {
            value.push_str(&format!("-{parts}"));
        }
        KeptChecksum {
            algorithm,
            value,
            full_object: false,
        }
    }
}

/// The CRC of a whole object from its parts' CRCs in `algorithm` (base64,
/// each with its part's length), as S3 keeps for a multipart upload of
/// checksum type `FULL_OBJECT`: crc-fast's combination, so no byte is
/// read again. `None` for an algorithm that is not a CRC, or a value
/// that is not the base64 of one.
pub fn combined_crc(algorithm: Algorithm, parts: &[(&str, u64)]) -> Option<String> {
    let crc = full_object_crc(algorithm)?;
    let width = algorithm.digest_len();
    let mut whole: Option<u64> = None;
    for &(value, length) in parts {
        let digest = STANDARD.decode(value).ok()?;
        if digest.len() != width {
            return None;
        }
        let part = digest
            .iter()
            .fold(0u64, |acc, &byte| (acc << 8) | u64::from(byte));
        whole = Some(match whole {
            None => part,
            Some(before) => crc_fast::checksum_combine(crc, before, part, length),
        });
    }
    // No part: the CRC of nothing, which is 0 for these three.
    let whole = whole.unwrap_or(0);
    Some(STANDARD.encode(&whole.to_be_bytes()[8 - width..]))
}

/// The crc-fast algorithm of a CRC that S3 can keep `FULL_OBJECT`.
pub fn full_object_crc(algorithm: Algorithm) -> Option<crc_fast::CrcAlgorithm> {
    match algorithm {
        Algorithm::Crc32 => Some(crc_fast::CrcAlgorithm::Crc32IsoHdlc),
        Algorithm::Crc32c => Some(crc_fast::CrcAlgorithm::Crc32Iscsi),
        Algorithm::Crc64nvme => Some(crc_fast::CrcAlgorithm::Crc64Nvme),
        Algorithm::Sha1 | Algorithm::Sha256 => None,
    }
}

/// S3's composite checksum of parts whose checksums (base64, each of
/// `algorithm`) are `parts`: the checksum of their concatenated binary
/// digests, then `-` and how many there are. `None` if a value is not
/// the base64 of a digest of that algorithm.
pub fn composite(algorithm: Algorithm, parts: &[&str]) -> Option<String> {
    let mut joined = Vec::with_capacity(parts.len() * algorithm.digest_len());
    for part in parts {
        let digest = STANDARD.decode(part).ok()?;
        if digest.len() != algorithm.digest_len() {
            return None;
        }
        joined.extend(digest);
    }
    Some(format!("{}-{}", algorithm.digest(&joined), parts.len()))
}

/// What a request says its body's checksums are, and which one to keep.
#[derive(Default)]
pub struct ChecksumClaims {
    /// The `x-amz-checksum-*` header values (base64).
    pub headers: Checksum,
    /// The algorithm to compute and keep with the object, if any.
    pub keep: Option<Algorithm>,
    /// The algorithms `x-amz-trailer` announced as trailers of an
    /// aws-chunked body, and where s3s hands their values over.
    pub trailers: Option<(Vec<Algorithm>, TrailingHeaders)>,
}

/// The checksum fields of a PutObject or UploadPart, as the request
/// gave them.
#[derive(Default)]
pub struct ChecksumRequest {
    /// The `x-amz-checksum-*` header values (base64).
    pub headers: Checksum,
    /// The algorithm `x-amz-sdk-checksum-algorithm` names.
    pub named: Option<Algorithm>,
    /// The `x-amz-trailer` header: the trailers an aws-chunked body ends
    /// with.
    pub trailer: Option<String>,
    /// Where s3s hands those trailers over once the body was read.
    pub trailing: Option<TrailingHeaders>,
}

impl ChecksumRequest {
    /// What the request claims, and the checksum to keep: `forced`'s
    /// (an upload's algorithm) if given, else the first header's, else
    /// the first trailer's, else the algorithm named.
    pub fn claims(self, forced: Option<Algorithm>) -> ChecksumClaims {
        let announced: Vec<Algorithm> = self
            .trailer
            .iter()
            .flat_map(|value| value.split(','))
            .filter_map(|name| {
                let name = name.trim().to_ascii_lowercase();
                Algorithm::parse(name.strip_prefix("x-amz-checksum-")?)
            })
            .collect();
        let in_headers = Algorithm::ALL
            .into_iter()
            .find(|algorithm| algorithm.of(&self.headers).is_some());
        let keep = forced
            .or(in_headers)
            .or(announced.first().copied())
            .or(self.named);
        let trailers = self
            .trailing
            .filter(|_| !announced.is_empty())
            .map(|handle| (announced, handle));
        ChecksumClaims {
            headers: self.headers,
            keep,
            trailers,
        }
    }
}

impl ChecksumClaims {
    /// A hasher computing every algorithm claimed or kept.
    pub fn hasher(&self) -> ChecksumHasher {
        let mut hasher = ChecksumHasher::default();
        for algorithm in Algorithm::ALL {
            let trailed = self
                .trailers
                .as_ref()
                .is_some_and(|(announced, _)| announced.contains(&algorithm));
            if algorithm.of(&self.headers).is_some() || self.keep == Some(algorithm) || trailed {
                algorithm.enable(&mut hasher);
            }
        }
        hasher
    }

    /// Checks the `computed` checksums against those claimed (headers,
    /// then the trailers once the body was read): the first algorithm
    /// that differs, as S3 names it. A trailer announced but not sent is
    /// missing, and counts as differing.
    pub fn mismatched(&self, computed: &Checksum) -> Option<&'static str> {
        for algorithm in Algorithm::ALL {
            if let Some(claimed) = algorithm.of(&self.headers) {
                if algorithm.of(computed) != Some(claimed) {
                    return Some(algorithm.name());
                }
            }
        }
        let (announced, handle) = self.trailers.as_ref()?;
        let sent = handle.read(|headers| {
            announced
                .iter()
                .map(|algorithm| {
                    let value = headers.get(algorithm.header());
                    let value = value.and_then(|v| v.to_str().ok()).map(str::to_string);
                    (*algorithm, value)
                })
                .collect::<Vec<_>>()
        });
        let Some(sent) = sent else {
            return announced.first().map(|algorithm| algorithm.name());
        };
        sent.into_iter()
            .find(|(algorithm, value)| value.is_none() || value.as_ref() != algorithm.of(computed))
            .map(|(algorithm, _)| algorithm.name())
    }

    /// The checksum to keep, from the `computed` ones.
    pub fn kept(&self, computed: &Checksum) -> Option<KeptChecksum> {
        let algorithm = self.keep?;
        Some(KeptChecksum {
            algorithm,
            value: algorithm.of(computed)?.clone(),
            full_object: false,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digests_are_the_crates_and_known_values() {
        // "123456789", the check input of every CRC catalogue.
        let check = |algorithm: Algorithm| {
            let value = algorithm.digest(b"123456789");
            STANDARD.decode(value).unwrap()
        };
        assert_eq!(check(Algorithm::Crc32), 0xCBF4_3926u32.to_be_bytes());
        assert_eq!(check(Algorithm::Crc32c), 0xE306_9283u32.to_be_bytes());
        assert_eq!(check(Algorithm::Sha1).len(), 20);
        assert_eq!(check(Algorithm::Sha256).len(), 32);
        assert_eq!(check(Algorithm::Crc64nvme).len(), 8);
    }

    #[test]
    fn a_full_object_crc_combines_the_parts_crcs() {
        let whole: Vec<u8> = (0..300_000u32).map(|i| (i * 7 + i / 13) as u8).collect();
        let (first, rest) = whole.split_at(123_457);
        let (second, third) = rest.split_at(100_000);
        for algorithm in [Algorithm::Crc32, Algorithm::Crc32c, Algorithm::Crc64nvme] {
            let parts = [first, second, third].map(|part| algorithm.digest(part));
            let listed: Vec<(&str, u64)> = parts
                .iter()
                .zip([first, second, third])
                .map(|(value, part)| (value.as_str(), part.len() as u64))
                .collect();
            assert_eq!(
                combined_crc(algorithm, &listed),
                Some(algorithm.digest(&whole)),
                "{algorithm:?}"
            );
            assert_eq!(
                combined_crc(algorithm, &listed[..1]),
                Some(algorithm.digest(first))
            );
            assert_eq!(combined_crc(algorithm, &[("!!", 1)]), None);
        }
        // SHA digests do not combine: no full-object value.
        let sha = Algorithm::Sha256.digest(first);
        assert_eq!(combined_crc(Algorithm::Sha256, &[(&sha, 1)]), None);
        // A CRC32 value given where a CRC64 is expected: refused.
        let short = Algorithm::Crc32.digest(first);
        assert_eq!(combined_crc(Algorithm::Crc64nvme, &[(&short, 1)]), None);
    }

    #[test]
    fn a_composite_is_the_checksum_of_the_part_digests() {
        let a = Algorithm::Crc32c.digest(b"first");
        let b = Algorithm::Crc32c.digest(b"second");
        let mut joined = STANDARD.decode(&a).unwrap();
        joined.extend(STANDARD.decode(&b).unwrap());
        let expected = format!("{}-2", Algorithm::Crc32c.digest(&joined));
        assert_eq!(composite(Algorithm::Crc32c, &[&a, &b]), Some(expected));
        // A part checksum of another length or not base64: no composite.
        let sha = Algorithm::Sha1.digest(b"x");
        assert_eq!(composite(Algorithm::Crc32c, &[&a, &sha]), None);
        assert_eq!(composite(Algorithm::Crc32c, &[&a, "!!"]), None);
    }

    #[test]
    fn names_parse_in_any_case_and_headers_are_lowercase() {
        assert_eq!(Algorithm::parse("crc32c"), Some(Algorithm::Crc32c));
        assert_eq!(Algorithm::parse("SHA256"), Some(Algorithm::Sha256));
        assert_eq!(Algorithm::parse("md5"), None);
        assert_eq!(Algorithm::Crc64nvme.header(), "x-amz-checksum-crc64nvme");
        let bad = ChecksumAlgorithm::from("MD5".to_string());
        assert!(requested(Some(&bad)).is_err());
    }

    #[test]
    fn claims_keep_the_upload_then_header_then_trailer_then_named() {
        let mut headers = Checksum::default();
        Algorithm::Sha1.set(&mut headers, Algorithm::Sha1.digest(b"body"));
        let request = |named| ChecksumRequest {
            headers: headers.clone(),
            named,
            ..Default::default()
        };
        assert_eq!(request(None).claims(None).keep, Some(Algorithm::Sha1));
        let forced = Some(Algorithm::Crc32c);
        let claims = request(None).claims(forced);
        assert_eq!(claims.keep, forced);
        let mut hasher = claims.hasher();
        hasher.update(b"body");
        let computed = hasher.finalize();
        assert_eq!(claims.mismatched(&computed), None);
        let kept = claims.kept(&computed).unwrap();
        assert_eq!(kept.value, Algorithm::Crc32c.digest(b"body"));
        let mut hasher = claims.hasher();
        hasher.update(b"other");
        assert_eq!(claims.mismatched(&hasher.finalize()), Some("SHA1"));
        let named = ChecksumRequest {
            named: Some(Algorithm::Sha256),
            ..Default::default()
        };
        assert_eq!(named.claims(None).keep, Some(Algorithm::Sha256));
    }

    #[test]
    fn placeholders_are_as_long_as_values() {
        let plain = KeptChecksum::placeholder(Algorithm::Sha256, 0);
        assert_eq!(plain.value.len(), Algorithm::Sha256.digest(b"").len());
        let parted = KeptChecksum::placeholder(Algorithm::Crc32, 10_000);
        assert!(parted.is_composite() && parted.value.ends_with("-10000"));
    }
}
