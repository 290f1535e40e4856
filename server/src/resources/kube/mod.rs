//! Kubernetes objects hypd applies inside a cluster, and the client that reaches a
//! cluster's API as EKS clients do: the endpoint and CA come from `DescribeCluster`, the
//! bearer token is a presigned STS `GetCallerIdentity` URL naming the cluster (what `aws
//! eks get-token` prints), signed in-process with hypd's own credentials. No kubeconfig,
//! no `aws` CLI, and the same path against the sim's API servers as against EKS. The
//! client's own retry layer is off: throttling and server errors come back as transient
//! errors, which the operations engine waits out with a note and backoff, as for AWS.

pub mod inference;
pub mod karpenter;
pub mod keda;
pub mod kind;
pub mod manifest;
pub mod object;
pub mod training;

use std::time::{Duration, SystemTime};

use app::api::ApiError;
use base64::Engine;
use kube::api::{Api, ListParams};
use serde::de::DeserializeOwned;

use crate::aws::Aws;

/// hypd's field manager for server-side apply: what it applies it owns, and a later
/// apply of the same object with no change is a no-op.
pub const FIELD_MANAGER: &str = "hypd";

/// EKS accepts tokens for at most 15 minutes; a client lives for one stage step.
const TOKEN_LIFETIME: Duration = Duration::from_secs(14 * 60);

/// How long a [`connect_watching`] client is used before its watches start again with a
/// new one: within its token's life.
pub const WATCH_SESSION: Duration = Duration::from_secs(13 * 60);

/// A read of a client for requests that answer at once.
const READ_TIMEOUT: Duration = Duration::from_secs(30);
/// A read of a watching client: longer than the API server keeps a quiet watch open
/// (kube's watcher asks for 290 s), so a cluster where nothing happens is not an error.
const WATCH_READ_TIMEOUT: Duration = Duration::from_secs(330);

/// A client for EKS cluster `cluster` in `region`, authenticated as hypd. In a plan that
/// creates the cluster, a client of a cluster with nothing in it yet ([`EmptyCluster`]).
pub async fn connect(aws: &Aws, region: &str, cluster: &str) -> Result<kube::Client, ApiError> {
    connect_with(aws, region, cluster, READ_TIMEOUT).await
}

/// A client for long watches of cluster `cluster`; use it for at most [`WATCH_SESSION`].
pub async fn connect_watching(
    aws: &Aws,
    region: &str,
    cluster: &str,
) -> Result<kube::Client, ApiError> {
    connect_with(aws, region, cluster, WATCH_READ_TIMEOUT).await
}

async fn connect_with(
    aws: &Aws,
    region: &str,
    cluster: &str,
    read_timeout: Duration,
) -> Result<kube::Client, ApiError> {
    let c = super::eks::cluster::describe(&aws.eks(region), cluster).await?;
    if c.is_none() && super::eks::cluster::made_by_this_plan(cluster) {
        return Ok(kube::Client::new(EmptyCluster, "default"));
    }
    let c = c.ok_or_else(|| ApiError::NotFound {
        resource: "EKS cluster".into(),
        name: cluster.to_owned(),
    })?;
    let endpoint = c.endpoint.as_deref().ok_or_else(|| ApiError::Conflict {
        message: format!(
            "EKS cluster {cluster} has no API endpoint yet (status {})",
            c.status.as_ref().map_or("unknown", |s| s.as_str())
        ),
        operation_id: None,
        field: None,
    })?;
    let ca = c
        .certificate_authority
        .as_deref()
        .ok_or_else(|| ApiError::internal(format!("EKS cluster {cluster} has no CA data")))?;
    let token = token(aws, region, cluster, SystemTime::now()).await?;
    client(endpoint, ca, &token, &aws.user_agent(), read_timeout)
}

/// The API of a cluster a plan creates, as it is when first up: no object of any kind.
/// A read of one object is a 404, a list is empty; nothing else is asked in a plan (its
/// changes are recorded, not applied), and anything else is refused.
#[derive(Clone, Copy)]
pub struct EmptyCluster;

impl tower::Service<http::Request<kube::client::Body>> for EmptyCluster {
    type Response = http::Response<http_body_util::Full<axum::body::Bytes>>;
    type Error = std::convert::Infallible;
    type Future = std::future::Ready<Result<Self::Response, Self::Error>>;

    fn poll_ready(
        &mut self,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<kube::client::Body>) -> Self::Future {
        std::future::ready(Ok(empty_cluster_answer(req.method(), req.uri().path())))
    }
}

/// What [`EmptyCluster`] answers: after `/api/<v>` or `/apis/<group>/<v>`, an odd number
/// of segments names a collection (`pods`, `namespaces/ns/pods`), an even one an object.
fn empty_cluster_answer(
    method: &http::Method,
    path: &str,
) -> http::Response<http_body_util::Full<axum::body::Bytes>> {
    let segments: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    let prefix = if segments.first() == Some(&"apis") {
        3
    } else {
        2
    };
    let rest = segments.len().saturating_sub(prefix);
    let status = |code: u16, reason: &str, message: &str| {
        serde_json::json!({
            "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": message, "reason": reason, "code": code,
        })
    };
    let (code, body) = match *method {
        http::Method::GET if rest % 2 == 1 => (
            200,
            serde_json::json!({"kind": "List", "apiVersion": "v1", "metadata": {"resourceVersion": "0"}, "items": []}),
        ),
        http::Method::GET => (
            404,
            status(
                404,
                "NotFound",
                "the cluster is not made yet: nothing is in it",
            ),
        ),
        _ => (
            405,
            status(
                405,
                "MethodNotAllowed",
                "a plan does not change a cluster it has not made",
            ),
        ),
    };
    http::Response::builder()
        .status(code)
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(http_body_util::Full::new(axum::body::Bytes::from(
            body.to_string(),
        )))
        .unwrap_or_default()
}

fn client(
    endpoint: &str,
    ca_base64: &str,
    token: &str,
    user_agent: &str,
    read_timeout: Duration,
) -> Result<kube::Client, ApiError> {
    // The AWS SDK and kube both link rustls; with more than one crypto provider compiled
    // in, rustls needs the process default chosen once. A second call is a no-op error.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let b64 = base64::engine::general_purpose::STANDARD;
    let pem = b64
        .decode(ca_base64)
        .map_err(|e| ApiError::internal(format!("the cluster's CA is not base64: {e}")))?;
    let pem = String::from_utf8_lossy(&pem);
    let body: String = pem.lines().filter(|l| !l.starts_with("-----")).collect();
    let der = b64.decode(body.trim()).map_err(|e| {
        ApiError::internal(format!("the cluster's CA is not a PEM certificate: {e}"))
    })?;
    let url = endpoint
        .parse()
        .map_err(|e| ApiError::internal(format!("the cluster's endpoint {endpoint}: {e}")))?;
    let mut config = kube::Config::new(url);
    config.root_cert = Some(vec![der]);
    config.auth_info.token = Some(token.to_owned().into());
    config.read_timeout = Some(read_timeout);
    config.default_retry = false;
    // The audit log's userAgent: which hypd step made a call.
    if let Ok(agent) = http::HeaderValue::from_str(user_agent) {
        config.headers.push((http::header::USER_AGENT, agent));
    }
    kube::Client::try_from(config)
        .map_err(|e| ApiError::internal(format!("Kubernetes client for {endpoint}: {e}")))
}

/// The EKS bearer token: `k8s-aws-v1.` + base64url of an STS `GetCallerIdentity` URL
/// presigned with the header `x-k8s-aws-id: <cluster>`.
pub async fn token(
    aws: &Aws,
    region: &str,
    cluster: &str,
    at: SystemTime,
) -> Result<String, ApiError> {
    use aws_sigv4::http_request::{
        SignableBody, SignableRequest, SignatureLocation, SigningSettings, sign,
    };
    let identity = aws.signing_identity("the EKS token").await?;
    let mut settings = SigningSettings::default();
    settings.signature_location = SignatureLocation::QueryParams;
    settings.expires_in = Some(TOKEN_LIFETIME);
    let params = aws_sigv4::sign::v4::SigningParams::builder()
        .identity(&identity)
        .region(region)
        .name("sts")
        .time(at)
        .settings(settings)
        .build()
        .map_err(|e| ApiError::internal(format!("signing the EKS token: {e}")))?
        .into();
    let host = format!("sts.{region}.amazonaws.com");
    let url = format!("https://{host}/?Action=GetCallerIdentity&Version=2011-06-15");
    let headers = [("host", host.as_str()), ("x-k8s-aws-id", cluster)];
    let request = SignableRequest::new("GET", &url, headers.into_iter(), SignableBody::Bytes(&[]))
        .map_err(|e| ApiError::internal(format!("signing the EKS token: {e}")))?;
    let (instructions, _) = sign(request, &params)
        .map_err(|e| ApiError::internal(format!("signing the EKS token: {e}")))?
        .into_parts();
    let mut signed = http::Request::builder()
        .uri(&url)
        .body(())
        .map_err(|e| ApiError::internal(format!("signing the EKS token: {e}")))?;
    instructions.apply_to_request_http1x(&mut signed);
    Ok(format!(
        "k8s-aws-v1.{}",
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(signed.uri().to_string())
    ))
}

/// Whether the API server serves the kind CRD `name` (`<plural>.<group>`) defines: its
/// operator is installed. A read of an unserved kind answers 404 like a missing object,
/// so only the CRD can say which it is.
pub async fn crd_served(client: &kube::Client, name: &str) -> Result<bool, ApiError> {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    let crds = Api::<CustomResourceDefinition>::all(client.clone());
    Ok(get(&crds, name).await?.is_some())
}

/// Reads one object; absent is `None`.
pub async fn get<K>(api: &Api<K>, name: &str) -> Result<Option<K>, ApiError>
where
    K: kube::Resource + Clone + DeserializeOwned + std::fmt::Debug,
    K::DynamicType: Default,
{
    api.get_opt(name)
        .await
        .map_err(|e| upstream(&format!("get {}/{name}", K::kind(&Default::default())), e))
}

/// Objects a page of [`each_listed`] asks for: kubectl's own page size.
const LIST_PAGE: u32 = 500;

/// Lists what `params` selects page by page (the API server's `limit` and `continue`),
/// handing each object to `each`: only a page is held at once, and a big cluster has
/// thousands of pods.
pub async fn each_listed<K>(
    api: &Api<K>,
    params: ListParams,
    mut each: impl FnMut(K),
) -> Result<(), ApiError>
where
    K: kube::Resource + Clone + DeserializeOwned + std::fmt::Debug,
    K::DynamicType: Default,
{
    let mut params = params.limit(LIST_PAGE);
    loop {
        let page = api
            .list(&params)
            .await
            .map_err(|e| upstream(&format!("list {}", K::kind(&Default::default())), e))?;
        let next = page.metadata.continue_.filter(|c| !c.is_empty());
        page.items.into_iter().for_each(&mut each);
        match next {
            Some(token) => params = params.continue_token(&token),
            None => return Ok(()),
        }
    }
}

/// Whether `e` is a server-side apply refused because the API server serves no such
/// kind: an apply makes a missing object, so its 404 can only mean a missing kind. A kind
/// another party installs (HyperPod's managed Karpenter) is served some time after that
/// party reports it installed, so a step meeting this waits instead of failing.
pub fn kind_not_served(e: &ApiError) -> bool {
    matches!(
        e,
        ApiError::Upstream { service, call, code: Some(code), .. }
            if service == "kubernetes"
                && (call.starts_with("apply ") || call.starts_with("list "))
                && code == "NotFound"
    )
}

/// Status reasons with which the API server says "not now" rather than "no".
const TRANSIENT_REASONS: &[&str] = &[
    "TooManyRequests",
    "Timeout",
    "ServerTimeout",
    "InternalError",
    "ServiceUnavailable",
];

/// A failed Kubernetes call, kept whole as the API server reported it; throttling, server
/// errors and transport failures are transient.
pub fn upstream(call: &str, e: kube::Error) -> ApiError {
    match e {
        kube::Error::Api(status) => ApiError::Upstream {
            service: "kubernetes".into(),
            call: call.to_owned(),
            transient: status.code == 429
                || status.code >= 500
                || TRANSIENT_REASONS.contains(&status.reason.as_str()),
            code: Some(status.reason.clone()),
            message: status.message.clone(),
            request_id: None,
        },
        other => ApiError::Upstream {
            service: "kubernetes".into(),
            call: call.to_owned(),
            code: None,
            transient: !matches!(
                other,
                kube::Error::SerdeError(_)
                    | kube::Error::BuildRequest(_)
                    | kube::Error::InferConfig(_)
            ),
            message: other.to_string(),
            request_id: None,
        },
    }
}

/// Why a pod is not running yet (unscheduled, a container waiting: an image that does
/// not pull, a Secret missing, a volume that does not mount), if it is not.
pub fn not_running(pod: &k8s_openapi::api::core::v1::Pod) -> Option<String> {
    let status = pod.status.as_ref()?;
    let unscheduled = status
        .conditions
        .iter()
        .flatten()
        .find(|c| c.type_ == "PodScheduled" && c.status == "False");
    if let Some(c) = unscheduled {
        return Some(format!(
            "unscheduled: {}",
            c.message.clone().unwrap_or_else(|| "no node fits".into())
        ));
    }
    status
        .container_statuses
        .iter()
        .flatten()
        .find_map(|c| c.state.as_ref()?.waiting.as_ref())
        .map(|w| match (&w.reason, &w.message) {
            (Some(r), Some(m)) => format!("{r}: {m}"),
            (Some(r), None) => r.clone(),
            _ => "waiting".to_owned(),
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn token_is_a_presigned_sts_url_naming_the_cluster() {
        let config = aws_config::SdkConfig::builder()
            .behavior_version(aws_config::BehaviorVersion::latest())
            .credentials_provider(
                aws_credential_types::provider::SharedCredentialsProvider::new(
                    aws_credential_types::Credentials::new(
                        "AKIDEXAMPLE",
                        "secret",
                        None,
                        None,
                        "t",
                    ),
                ),
            )
            .build();
        let aws = Aws::new(config);
        let t = token(&aws, "eu-west-1", "ml", SystemTime::UNIX_EPOCH)
            .await
            .unwrap();
        let url = t.strip_prefix("k8s-aws-v1.").unwrap();
        let url = String::from_utf8(
            base64::engine::general_purpose::URL_SAFE_NO_PAD
                .decode(url)
                .unwrap(),
        )
        .unwrap();
        assert!(url.starts_with("https://sts.eu-west-1.amazonaws.com/?Action=GetCallerIdentity"));
        assert!(
            url.contains("X-Amz-SignedHeaders=host%3Bx-k8s-aws-id"),
            "{url}"
        );
        assert!(url.contains("X-Amz-Expires=840"), "{url}");
        assert!(
            url.contains("X-Amz-Credential=AKIDEXAMPLE%2F19700101%2Feu-west-1%2Fsts"),
            "{url}"
        );
        assert!(!t.ends_with('='), "EKS tokens carry no base64 padding");
    }
}
