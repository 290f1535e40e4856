//! The sim as a fault-injecting front for moto: with `--moto-url`, every request the sim
//! does not serve itself (EC2, IAM, STS, S3, ...) is forwarded to moto unchanged, after
//! the faults injected for its service and operation have had their say. Tests point
//! `AWS_ENDPOINT_URL` at the sim, so every AWS call hypd makes can fail on demand.
//!
//! The constraint that shapes it: the SDKs must not notice the hop. The request goes on
//! as it came (method, path, query, headers with the SigV4 `authorization`, body) and
//! moto's answer comes back as it is (no redirects followed, nothing decompressed);
//! injected errors are shaped as each service's protocol shapes them, so the real
//! clients parse their code and message and classify throttling as AWS's would.
//!
//! Which requests are the sim's: the control API (`/_sim/...`), requests signed for
//! `eks` or `sagemaker` (the SigV4 credential scope names the service), and unsigned
//! requests the sim's routes claim (`POST /` with `X-Amz-Target: SageMaker.*`, the EKS
//! REST paths). Everything else goes to moto. Deciding by the signing service rather
//! than by path means an S3 bucket named like an EKS path (`clusters`, `addons`) still
//! reaches moto when the request is signed, as the SDKs sign every request. Limits:
//! only path-style S3 addressing is recognised for operation names (the sim is reached
//! by IP, so the SDKs use path style unless told otherwise); unsigned S3 requests to
//! `/clusters...` or `/addons/supported-versions` are answered by the sim's EKS routes;
//! bodies are buffered (up to `MAX_BODY`), not streamed. The sim's own questions to moto
//! (does this subnet exist?) do not pass through here, so faults never hit them.

use std::sync::atomic::{AtomicU64, Ordering};

use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode, Uri, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use crate::moto::Moto;
use crate::world::{AwsError, FaultKind, Shared};

/// Services whose requests the sim answers itself.
const SIM_SERVICES: [&str; 4] = ["eks", "sagemaker", "servicequotas", "fsx"];

/// Services forwarded to moto for which faults can be injected (their error shapes are
/// known here).
pub const PROXIED_SERVICES: [&str; 4] = ["ec2", "iam", "s3", "sts"];

/// The largest request or response body relayed; test payloads are far smaller.
const MAX_BODY: usize = 256 * 1024 * 1024;

/// Headers that describe one hop, not the message: the relay sets its own.
const HOP_BY_HOP: [&str; 8] = [
    "connection",
    "keep-alive",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
];

/// The SigV4 credential scope of a request (`Credential=AKID/DATE/REGION/SERVICE/
/// aws4_request` in `authorization`, or `X-Amz-Credential` in a presigned URL's query):
/// its service.
pub fn signing_service(headers: &HeaderMap, uri: &Uri) -> Option<String> {
    let scope = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split("Credential=").nth(1))
        .map(|c| c.split([',', ' ']).next().unwrap_or_default().to_owned())
        .or_else(|| {
            query_pairs(uri.query().unwrap_or_default())
                .find(|(k, _)| k.eq_ignore_ascii_case("X-Amz-Credential"))
                .map(|(_, v)| v)
        })?;
    scope
        .split('/')
        .nth(3)
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
}

/// `k=v&k2=v2` pairs, percent-decoded (`+` as space, as forms encode it).
fn query_pairs(query: &str) -> impl Iterator<Item = (String, String)> + '_ {
    query.split('&').filter(|p| !p.is_empty()).map(|pair| {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        (percent_decode(k), percent_decode(v))
    })
}

fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < bytes.len() => {
                let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).unwrap_or_default();
                match u8::from_str_radix(hex, 16) {
                    Ok(b) => {
                        out.push(b);
                        i += 2;
                    }
                    Err(_) => out.push(b'%'),
                }
            }
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Whether the sim answers this request itself rather than forwarding it.
fn is_sims(method: &Method, uri: &Uri, headers: &HeaderMap) -> bool {
    if uri.path().starts_with("/_sim/") {
        return true;
    }
    match signing_service(headers, uri) {
        Some(service) => SIM_SERVICES.contains(&service.as_str()),
        // Unsigned: the SageMaker dispatcher only for its own targets; other paths are
        // left to the routes, whose fallback forwards what they do not claim.
        None if method == Method::POST && uri.path() == "/" => headers
            .get("x-amz-target")
            .and_then(|v| v.to_str().ok())
            .is_some_and(|t| {
                t.starts_with("SageMaker.")
                    || t.starts_with(crate::quotas::TARGET_PREFIX)
                    || t.starts_with(crate::fsx::TARGET_PREFIX)
            }),
        None => true,
    }
}

/// Middleware in front of every route: forwards to moto what is not the sim's.
pub async fn front(State(state): State<Shared>, request: Request, next: Next) -> Response {
    if is_sims(request.method(), request.uri(), request.headers()) {
        return next.run(request).await;
    }
    match &state.moto {
        Some(moto) => relay(&state, moto, request).await,
        None => next.run(request).await,
    }
}

/// The routes' fallback when moto is there: what the sim does not serve goes to moto,
/// except calls signed for EKS or SageMaker, which the sim answers as unknown rather
/// than let moto's own EKS or SageMaker answer them.
pub async fn fallback(state: &Shared, request: Request) -> Result<Response, Request> {
    if signing_service(request.headers(), request.uri())
        .is_some_and(|s| SIM_SERVICES.contains(&s.as_str()))
    {
        return Err(request);
    }
    match &state.moto {
        Some(moto) => Ok(relay(state, moto, request).await),
        None => Err(request),
    }
}

/// The operation a forwarded request calls: `Action=` of the Query protocol (form body or
/// query string), the `X-Amz-Target` of the JSON protocols, or S3's method and path.
pub fn operation(
    service: &str,
    method: &Method,
    uri: &Uri,
    headers: &HeaderMap,
    body: &[u8],
) -> String {
    if service == "s3" {
        return s3_operation(method, uri, headers);
    }
    if let Some(target) = headers.get("x-amz-target").and_then(|v| v.to_str().ok()) {
        return target.rsplit('.').next().unwrap_or_default().to_owned();
    }
    let form = std::str::from_utf8(body).unwrap_or_default();
    query_pairs(form)
        .chain(query_pairs(uri.query().unwrap_or_default()))
        .find(|(k, _)| k == "Action")
        .map(|(_, v)| v)
        .unwrap_or_default()
}

/// The query parameters of ListObjects (v1); any other makes a GET on a bucket a
/// sub-resource call (`?acl`, `?cors`, ...).
const LIST_OBJECTS_PARAMS: [&str; 5] =
    ["prefix", "delimiter", "marker", "max-keys", "encoding-type"];

/// S3's path-style REST operations by method, path depth and sub-resource; a request
/// not recognised here is named by no operation (only `*` faults match it).
fn s3_operation(method: &Method, uri: &Uri, headers: &HeaderMap) -> String {
    let path = uri.path().trim_start_matches('/');
    let (bucket, key) = path.split_once('/').unwrap_or((path, ""));
    let pairs: Vec<(String, String)> = query_pairs(uri.query().unwrap_or_default()).collect();
    // The SDKs name the operation themselves on calls whose shape is ambiguous.
    if let Some((_, op)) = pairs.iter().find(|(k, _)| k == "x-id") {
        return op.clone();
    }
    let keys: Vec<&str> = pairs.iter().map(|(k, _)| k.as_str()).collect();
    let has = |k: &str| keys.contains(&k);
    let op = if bucket.is_empty() {
        match *method {
            Method::GET => "ListBuckets",
            _ => "",
        }
    } else if key.is_empty() {
        match *method {
            Method::PUT if has("tagging") => "PutBucketTagging",
            Method::GET if has("tagging") => "GetBucketTagging",
            Method::DELETE if has("tagging") => "DeleteBucketTagging",
            Method::PUT if has("policy") => "PutBucketPolicy",
            Method::GET if has("policy") => "GetBucketPolicy",
            Method::PUT if has("publicAccessBlock") => "PutPublicAccessBlock",
            Method::GET if has("publicAccessBlock") => "GetPublicAccessBlock",
            Method::PUT if has("encryption") => "PutBucketEncryption",
            Method::GET if has("encryption") => "GetBucketEncryption",
            Method::PUT if has("versioning") => "PutBucketVersioning",
            Method::GET if has("versioning") => "GetBucketVersioning",
            Method::GET if has("location") => "GetBucketLocation",
            Method::POST if has("delete") => "DeleteObjects",
            Method::GET if has("list-type") => "ListObjectsV2",
            Method::GET if keys.iter().all(|k| LIST_OBJECTS_PARAMS.contains(k)) => "ListObjects",
            Method::PUT if keys.is_empty() => "CreateBucket",
            Method::HEAD => "HeadBucket",
            Method::DELETE if keys.is_empty() => "DeleteBucket",
            _ => "",
        }
    } else {
        match *method {
            Method::PUT if has("tagging") => "PutObjectTagging",
            Method::GET if has("tagging") => "GetObjectTagging",
            Method::PUT if headers.contains_key("x-amz-copy-source") => "CopyObject",
            Method::PUT if !has("uploadId") => "PutObject",
            Method::PUT => "UploadPart",
            Method::POST if has("uploads") => "CreateMultipartUpload",
            Method::POST if has("uploadId") => "CompleteMultipartUpload",
            Method::GET if !has("uploadId") => "GetObject",
            Method::HEAD => "HeadObject",
            Method::DELETE if has("uploadId") => "AbortMultipartUpload",
            Method::DELETE => "DeleteObject",
            _ => "",
        }
    };
    op.to_owned()
}

/// Injected faults first, then moto.
async fn relay(state: &Shared, moto: &Moto, request: Request) -> Response {
    let (parts, body) = request.into_parts();
    let service = signing_service(&parts.headers, &parts.uri);
    // What goes wrong on the way to moto is answered in the caller's protocol, as AWS
    // would answer its own failures.
    let fail = |status, code: &str, message: String| {
        service_error(
            service.as_deref().unwrap_or_default(),
            &parts.headers,
            status,
            code,
            &message,
        )
    };
    let body = match axum::body::to_bytes(body, MAX_BODY).await {
        Ok(b) => b,
        Err(e) => {
            return fail(
                StatusCode::PAYLOAD_TOO_LARGE,
                "RequestEntityTooLarge",
                format!("hypd-sim relays bodies up to {MAX_BODY} bytes: {e}"),
            );
        }
    };
    let mut lost = None;
    if let Some(service) = &service {
        let op = operation(service, &parts.method, &parts.uri, &parts.headers, &body);
        match crate::world::injected(state, service, &op).await {
            // Forwarded as usual; the answer is replaced below.
            Some(FaultKind::Lost) => lost = Some(service.clone()),
            Some(kind) => {
                if let Some(response) = fault_response(service, &parts.headers, kind) {
                    return response;
                }
            }
            None => {}
        }
    }
    let path = parts
        .uri
        .path_and_query()
        .map(|p| p.as_str())
        .unwrap_or("/");
    let mut headers = parts.headers.clone();
    strip_hop_by_hop(&mut headers);
    // The relay sends the buffered body with its own length.
    headers.remove(header::CONTENT_LENGTH);
    let sent = moto
        .http()
        .request(parts.method.clone(), format!("{}{path}", moto.url()))
        .headers(headers)
        .body(body)
        .send()
        .await;
    let answer = match sent {
        Ok(answer) => answer,
        Err(e) => {
            return fail(
                StatusCode::BAD_GATEWAY,
                "InternalFailure",
                format!("hypd-sim cannot reach moto: {e}"),
            );
        }
    };
    let status = answer.status();
    let mut headers = answer.headers().clone();
    strip_hop_by_hop(&mut headers);
    let body = match answer.bytes().await {
        Ok(b) => b,
        Err(e) => {
            return fail(
                StatusCode::BAD_GATEWAY,
                "InternalFailure",
                format!("hypd-sim cannot read moto's answer: {e}"),
            );
        }
    };
    if let Some(service) = lost
        && let Some(response) = fault_response(&service, &parts.headers, FaultKind::Lost)
    {
        return response;
    }
    let mut response = Response::new(Body::from(body));
    *response.status_mut() = status;
    *response.headers_mut() = headers;
    response
}

fn strip_hop_by_hop(headers: &mut HeaderMap) {
    for name in HOP_BY_HOP {
        headers.remove(name);
    }
}

/// The answer an injected fault gives, as `service` shapes its errors; none for `stuck`,
/// which has no meaning for a forwarded call.
fn fault_response(service: &str, headers: &HeaderMap, kind: FaultKind) -> Option<Response> {
    let (status, code, message) = match kind {
        FaultKind::Throttle => {
            let (status, code, message) = match service {
                "ec2" => (503, "RequestLimitExceeded", "Request limit exceeded."),
                "s3" => (503, "SlowDown", "Please reduce your request rate."),
                _ => (400, "Throttling", "Rate exceeded"),
            };
            (status, code.to_owned(), message.to_owned())
        }
        FaultKind::ServerError | FaultKind::Lost => {
            let (code, message) = match service {
                "ec2" => ("InternalError", "An internal error has occurred"),
                "s3" => (
                    "InternalError",
                    "We encountered an internal error. Please try again.",
                ),
                "iam" => (
                    "ServiceFailure",
                    "Request processing has failed due to some unknown error, exception or failure.",
                ),
                _ => ("InternalFailure", "An internal error occurred"),
            };
            (500, code.to_owned(), message.to_owned())
        }
        FaultKind::Error {
            code,
            status,
            message,
        } => (status, code, message),
        FaultKind::Stuck | FaultKind::Delay { .. } | FaultKind::Fails { .. } => return None,
    };
    let status = StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_REQUEST);
    Some(service_error(
        service,
        headers,
        status,
        &code,
        &format!("{message} (injected by hypd-sim)"),
    ))
}

static REQUEST_IDS: AtomicU64 = AtomicU64::new(1);

fn xml_escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
        .replace('\'', "&apos;")
}

/// An error in the protocol the caller speaks: EC2's Query `<Response><Errors>`, S3's
/// REST-XML `<Error>`, the JSON protocols' `__type` when the call came with
/// `X-Amz-Target`, otherwise the Query protocol's `<ErrorResponse>` (IAM, STS, ...).
fn service_error(
    service: &str,
    headers: &HeaderMap,
    status: StatusCode,
    code: &str,
    message: &str,
) -> Response {
    let id = format!(
        "00000000-0000-4000-8000-{:012x}",
        REQUEST_IDS.fetch_add(1, Ordering::Relaxed)
    );
    if headers.contains_key("x-amz-target") {
        let mut response = AwsError::new(status.as_u16(), code, message).into_response();
        *response.status_mut() = status;
        return response;
    }
    let (code, message) = (xml_escape(code), xml_escape(message));
    let decl = r#"<?xml version="1.0" encoding="UTF-8"?>"#;
    let (body, id_header) = match service {
        "ec2" => (
            format!(
                "{decl}\n<Response><Errors><Error><Code>{code}</Code><Message>{message}</Message></Error></Errors><RequestID>{id}</RequestID></Response>"
            ),
            "x-amzn-requestid",
        ),
        "s3" => (
            format!(
                "{decl}\n<Error><Code>{code}</Code><Message>{message}</Message><RequestId>{id}</RequestId></Error>"
            ),
            "x-amz-request-id",
        ),
        _ => {
            let kind = if status.is_server_error() {
                "Receiver"
            } else {
                "Sender"
            };
            (
                format!(
                    "{decl}\n<ErrorResponse><Error><Type>{kind}</Type><Code>{code}</Code><Message>{message}</Message></Error><RequestId>{id}</RequestId></ErrorResponse>"
                ),
                "x-amzn-requestid",
            )
        }
    };
    let mut response = (status, Bytes::from(body)).into_response();
    let h = response.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/xml"));
    if let Ok(v) = HeaderValue::from_str(&id) {
        h.insert(HeaderName::from_static(id_header), v);
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    fn signed(service: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        let auth = format!(
            "AWS4-HMAC-SHA256 Credential=AKID/20260101/eu-west-1/{service}/aws4_request, SignedHeaders=host;x-amz-date, Signature=abc"
        );
        h.insert(header::AUTHORIZATION, HeaderValue::from_str(&auth).unwrap());
        h
    }

    #[test]
    fn service_comes_from_the_credential_scope() {
        let uri: Uri = "/".parse().unwrap();
        assert_eq!(
            signing_service(&signed("ec2"), &uri).as_deref(),
            Some("ec2")
        );
        assert_eq!(signing_service(&HeaderMap::new(), &uri), None);
        let presigned: Uri = "/b/k?X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential=AKID%2F20260101%2Fus-east-1%2Fs3%2Faws4_request"
            .parse()
            .unwrap();
        assert_eq!(
            signing_service(&HeaderMap::new(), &presigned).as_deref(),
            Some("s3")
        );
    }

    #[test]
    fn the_sim_keeps_its_own_requests() {
        let root: Uri = "/".parse().unwrap();
        let mut sagemaker = HeaderMap::new();
        sagemaker.insert(
            "x-amz-target",
            HeaderValue::from_static("SageMaker.CreateCluster"),
        );
        assert!(is_sims(&Method::POST, &root, &sagemaker));
        assert!(!is_sims(&Method::POST, &root, &HeaderMap::new()));
        assert!(!is_sims(&Method::POST, &root, &signed("iam")));
        assert!(is_sims(&Method::POST, &root, &signed("sagemaker")));
        let clusters: Uri = "/clusters".parse().unwrap();
        assert!(is_sims(&Method::GET, &clusters, &signed("eks")));
        assert!(!is_sims(&Method::PUT, &clusters, &signed("s3")));
        let control: Uri = "/_sim/faults".parse().unwrap();
        assert!(is_sims(&Method::POST, &control, &signed("s3")));
    }

    #[test]
    fn operations_by_protocol() {
        let root: Uri = "/".parse().unwrap();
        let h = HeaderMap::new();
        assert_eq!(
            operation(
                "ec2",
                &Method::POST,
                &root,
                &h,
                b"Action=CreateVpc&Version=2016-11-15"
            ),
            "CreateVpc"
        );
        let get: Uri = "/?Version=2016-11-15&Action=DescribeVpcs".parse().unwrap();
        assert_eq!(
            operation("ec2", &Method::GET, &get, &h, b""),
            "DescribeVpcs"
        );
        let s3 = |m: Method, uri: &str| operation("s3", &m, &uri.parse().unwrap(), &h, b"");
        assert_eq!(s3(Method::PUT, "/b"), "CreateBucket");
        assert_eq!(s3(Method::HEAD, "/b"), "HeadBucket");
        assert_eq!(s3(Method::DELETE, "/b"), "DeleteBucket");
        assert_eq!(s3(Method::PUT, "/b?tagging"), "PutBucketTagging");
        assert_eq!(s3(Method::GET, "/b?tagging"), "GetBucketTagging");
        assert_eq!(s3(Method::GET, "/b?list-type=2&prefix=a"), "ListObjectsV2");
        assert_eq!(s3(Method::GET, "/b?prefix=a"), "ListObjects");
        assert_eq!(s3(Method::GET, "/b?acl"), "");
        assert_eq!(s3(Method::PUT, "/b/a/key.txt?x-id=PutObject"), "PutObject");
        assert_eq!(s3(Method::PUT, "/b/a/key.txt"), "PutObject");
        assert_eq!(s3(Method::GET, "/b/k"), "GetObject");
        assert_eq!(s3(Method::HEAD, "/b/k"), "HeadObject");
        assert_eq!(s3(Method::DELETE, "/b/k"), "DeleteObject");
        assert_eq!(s3(Method::GET, "/"), "ListBuckets");
    }

    #[test]
    fn xml_errors_escape_their_text() {
        assert_eq!(xml_escape("a<b & 'c'"), "a&lt;b &amp; &apos;c&apos;");
        assert_eq!(percent_decode("a%2Fb+c%zz"), "a/b c%zz");
    }
}
