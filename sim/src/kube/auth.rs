//! EKS bearer tokens: `k8s-aws-v1.` + base64url of a presigned STS GetCallerIdentity URL.
//! EKS forwards the URL to STS; the sim has no STS of its own, so it recomputes the SigV4
//! signature with the world's secret key and the header `x-k8s-aws-id: <this cluster>`,
//! which is what makes a token valid for one cluster only.

use base64::Engine;
use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};

/// EKS refuses presigned URLs that live longer than this.
pub const MAX_EXPIRES_SECS: i64 = 900;
/// Clock skew tolerated on a token signed "in the future".
const SKEW_SECS: i64 = 300;
const EMPTY_SHA256: &str = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";

/// Checks `token` for cluster `cluster` at real time `now` (epoch seconds); the error is
/// the reason, for the 401's message.
pub fn verify(token: &str, cluster: &str, secret: &str, now: i64) -> Result<(), String> {
    let encoded = token
        .strip_prefix("k8s-aws-v1.")
        .ok_or("token is not an EKS token (no k8s-aws-v1. prefix)")?;
    let url = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(encoded.trim_end_matches('='))
        .map_err(|_| "token is not base64url")?;
    let url = String::from_utf8(url).map_err(|_| "token is not a URL")?;
    let rest = url
        .strip_prefix("https://")
        .ok_or("token URL is not https")?;
    let (host, path_query) = rest.split_at(rest.find('/').ok_or("token URL has no path")?);
    let host_ok = host == "sts.amazonaws.com"
        || (host.starts_with("sts.") && host.ends_with(".amazonaws.com"));
    if !host_ok {
        return Err(format!("token URL host {host} is not STS"));
    }
    let (path, query) = path_query.split_once('?').ok_or("token URL has no query")?;
    if path != "/" {
        return Err("token URL path must be /".into());
    }
    let mut params = Vec::new();
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        params.push((percent_decode(k)?, percent_decode(v)?));
    }
    let get = |name: &str| {
        params
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
            .ok_or(format!("token URL lacks {name}"))
    };
    if get("Action")? != "GetCallerIdentity" || get("Version")? != "2011-06-15" {
        return Err("token URL is not STS GetCallerIdentity 2011-06-15".into());
    }
    if get("X-Amz-Algorithm")? != "AWS4-HMAC-SHA256" {
        return Err("token is not signed with AWS4-HMAC-SHA256".into());
    }
    let credential = get("X-Amz-Credential")?;
    let scope: Vec<&str> = credential.split('/').collect();
    let [_, date, region, service, terminator] = scope[..] else {
        return Err("malformed X-Amz-Credential".into());
    };
    if service != "sts" || terminator != "aws4_request" {
        return Err("X-Amz-Credential is not scoped to sts".into());
    }
    let amz_date = get("X-Amz-Date")?;
    let signed_at = parse_amz_date(amz_date).ok_or("malformed X-Amz-Date")?;
    if !amz_date.starts_with(date) {
        return Err("X-Amz-Date does not match the credential scope".into());
    }
    let expires: i64 = get("X-Amz-Expires")?
        .parse()
        .map_err(|_| "malformed X-Amz-Expires")?;
    if !(1..=MAX_EXPIRES_SECS).contains(&expires) {
        return Err(format!(
            "X-Amz-Expires must be between 1 and {MAX_EXPIRES_SECS}"
        ));
    }
    if now > signed_at + expires {
        return Err("token has expired".into());
    }
    if now + SKEW_SECS < signed_at {
        return Err("token is signed in the future".into());
    }
    let signed_headers = get("X-Amz-SignedHeaders")?;
    let mut canonical_headers = String::new();
    for h in signed_headers.split(';') {
        let value = match h {
            "host" => host,
            "x-k8s-aws-id" => cluster,
            other => return Err(format!("unexpected signed header {other}")),
        };
        canonical_headers.push_str(&format!("{h}:{value}\n"));
    }
    if !signed_headers.split(';').any(|h| h == "x-k8s-aws-id") {
        return Err("token does not sign x-k8s-aws-id".into());
    }
    let signature = get("X-Amz-Signature")?;
    let mut canonical_query: Vec<(String, String)> = params
        .iter()
        .filter(|(k, _)| k != "X-Amz-Signature")
        .map(|(k, v)| (uri_encode(k), uri_encode(v)))
        .collect();
    canonical_query.sort();
    let canonical_query = canonical_query
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join("&");
    let key = signing_key(secret, date, region);
    // Signers hash an empty body either way; some mark it UNSIGNED-PAYLOAD.
    for payload in [EMPTY_SHA256, "UNSIGNED-PAYLOAD"] {
        let canonical =
            format!("GET\n/\n{canonical_query}\n{canonical_headers}\n{signed_headers}\n{payload}");
        let to_sign = format!(
            "AWS4-HMAC-SHA256\n{amz_date}\n{date}/{region}/sts/aws4_request\n{}",
            hex::encode(Sha256::digest(canonical.as_bytes()))
        );
        if hex::encode(hmac(&key, to_sign.as_bytes())) == signature {
            return Ok(());
        }
    }
    Err(format!(
        "token signature does not match (signed for another cluster than {cluster}, or with another key)"
    ))
}

/// The access key id a token was signed with (its presigned URL's `X-Amz-Credential`),
/// read without checking the signature: it names the caller in the call log and for
/// scoped faults, while [`verify`] decides whether the caller is let in.
pub fn access_key(token: &str) -> Option<String> {
    let encoded = token.strip_prefix("k8s-aws-v1.")?;
    let url = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(encoded.trim_end_matches('='))
        .ok()?;
    let url = String::from_utf8(url).ok()?;
    let (_, query) = url.split_once('?')?;
    query.split('&').find_map(|pair| {
        let value = pair.strip_prefix("X-Amz-Credential=")?;
        let credential = percent_decode(value).ok()?;
        let key = credential.split('/').next()?;
        (!key.is_empty()).then(|| key.to_owned())
    })
}

fn hmac(key: &[u8], data: &[u8]) -> Vec<u8> {
    let mut mac = match Hmac::<Sha256>::new_from_slice(key) {
        Ok(m) => m,
        // HMAC takes keys of any length; this arm cannot be reached.
        Err(_) => return Vec::new(),
    };
    mac.update(data);
    mac.finalize().into_bytes().to_vec()
}

fn signing_key(secret: &str, date: &str, region: &str) -> Vec<u8> {
    let k = hmac(format!("AWS4{secret}").as_bytes(), date.as_bytes());
    let k = hmac(&k, region.as_bytes());
    let k = hmac(&k, b"sts");
    hmac(&k, b"aws4_request")
}

pub(super) fn percent_decode(s: &str) -> Result<String, String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' => {
                let hex = s.get(i + 1..i + 3).ok_or("bad percent-encoding")?;
                out.push(u8::from_str_radix(hex, 16).map_err(|_| "bad percent-encoding")?);
                i += 3;
            }
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            b => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8(out).map_err(|_| "query is not UTF-8".to_owned())
}

/// SigV4's URI encoding: unreserved characters stay, everything else is %XX.
fn uri_encode(s: &str) -> String {
    let mut out = String::new();
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// `YYYYMMDDTHHMMSSZ` as epoch seconds.
fn parse_amz_date(s: &str) -> Option<i64> {
    if s.len() != 16 || &s[8..9] != "T" || !s.ends_with('Z') {
        return None;
    }
    let n = |r: std::ops::Range<usize>| s.get(r)?.parse::<i64>().ok();
    let (y, m, d) = (n(0..4)?, n(4..6)?, n(6..8)?);
    let (hh, mm, ss) = (n(9..11)?, n(11..13)?, n(13..15)?);
    if !(1..=12).contains(&m) || !(1..=31).contains(&d) || hh > 23 || mm > 59 || ss > 60 {
        return None;
    }
    Some(super::time::days_from_civil(y, m, d) * 86_400 + hh * 3600 + mm * 60 + ss)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn amz_dates_parse_to_epoch() {
        assert_eq!(parse_amz_date("19700101T000000Z"), Some(0));
        assert_eq!(parse_amz_date("20261130T020000Z"), Some(1_796_004_000));
        assert_eq!(parse_amz_date("2026-11-30"), None);
    }

    #[test]
    fn malformed_tokens_are_refused_with_a_reason() {
        assert!(
            verify("Bearer x", "c", "testing", 0)
                .unwrap_err()
                .contains("prefix")
        );
        assert!(
            verify("k8s-aws-v1.!!!", "c", "testing", 0)
                .unwrap_err()
                .contains("base64")
        );
        let url = base64::engine::general_purpose::URL_SAFE_NO_PAD
            .encode("https://evil.example.com/?Action=GetCallerIdentity");
        assert!(
            verify(&format!("k8s-aws-v1.{url}"), "c", "testing", 0)
                .unwrap_err()
                .contains("not STS")
        );
    }
}
