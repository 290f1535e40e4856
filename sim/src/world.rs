//! The sim's shared state: a scaled clock that drives every state machine, injected
//! faults, the call log, EKS and SageMaker, and a Kubernetes API server per EKS cluster,
//! with the error shape AWS answers with. Transitions are computed from the clock when
//! a resource is read, so a test that changes the time scale changes every pending
//! transition at once.
//!
//! Locks follow the real system's consistency, so that many clusters are served at
//! once: EKS and SageMaker, which check each other (HyperPod needs an ACTIVE EKS
//! cluster), share one lock ([`Aws`]); each EKS cluster's Kubernetes objects have their
//! own (each real cluster has its own etcd; see `kube`); the clock, the faults, the call
//! log and the table of API servers are leaf locks, held for a few instructions and
//! never while waiting for anything. Order: the AWS lock before a cluster's objects,
//! either before a leaf lock; nothing holds a cluster's objects while it waits for the
//! AWS lock.

use std::collections::VecDeque;
use std::sync::{Arc, MutexGuard};

use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Json, Response};
use serde::{Deserialize, Serialize};
use serde_json::json;
use tokio::sync::Mutex;

pub use crate::clock::Clock;
use crate::eks::Eks;
use crate::kube::Kube;
use crate::moto::Moto;
use crate::sagemaker::SageMaker;

pub const ACCOUNT: &str = "123456789012";
pub const DEFAULT_REGION: &str = "us-east-1";

/// FNV-1a over `bytes`, continuing from `h`: ids, addresses and suffixes the sim derives
/// from names must be the same on every run, which `std`'s randomly seeded hasher is not.
pub fn fnv1a_extend(h: u64, bytes: &[u8]) -> u64 {
    bytes
        .iter()
        .fold(h, |h, b| (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3))
}

/// FNV-1a of `s` from the standard offset basis.
pub fn fnv1a(s: &str) -> u64 {
    fnv1a_extend(0xcbf2_9ce4_8422_2325, s.as_bytes())
}

/// The transitional states AWS resources pass through; a resource with none is settled
/// (ACTIVE / InService).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    Creating,
    Updating,
    Deleting,
}

/// What an injected fault does to the matching calls.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum FaultKind {
    /// Throttling as the service answers it (EKS/SageMaker 429 ThrottlingException, EC2
    /// 503 RequestLimitExceeded, IAM/STS 400 Throttling, S3 503 SlowDown): the SDK's
    /// retry should absorb it.
    Throttle,
    /// HTTP 500 InternalFailure (EC2/S3 InternalError, IAM ServiceFailure): a transient
    /// server error.
    ServerError,
    /// A given AWS error code, status and message.
    Error {
        code: String,
        status: u16,
        message: String,
    },
    /// The call succeeds, but what it started never leaves its transitional state
    /// while the fault is registered.
    Stuck,
    /// The call is carried out, but its answer is lost on the way back: the caller gets
    /// a server error (as after a dropped connection) while the change is made. What a
    /// client must survive by observing before it acts again.
    Lost,
    /// The answer comes `seconds` (real seconds) late: a call held in flight, e.g. to
    /// stop its caller in the middle of it.
    Delay { seconds: f64 },
    /// The call succeeds, but what it starts ends in its failed state (an EKS cluster or
    /// an FSx file system FAILED) with this health issue, for objects started while the fault is
    /// registered.
    Fails { code: String, message: String },
}

impl FaultKind {
    /// Registered faults that shape what calls start rather than answering one call.
    fn lasting(&self) -> bool {
        matches!(self, FaultKind::Stuck | FaultKind::Fails { .. })
    }
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Fault {
    #[serde(default)]
    pub id: u64,
    /// `eks`, `sagemaker` or `fsx`, served by the sim, or `ec2`, `iam`, `s3`, `sts`, forwarded
    /// to moto (see `proxy`), or `kubernetes` (every emulated API server; the operation
    /// is `<verb> <Kind>`, e.g. `patch DaemonSet`).
    pub service: String,
    /// The API operation name, e.g. `CreateCluster`; `*` matches every operation.
    pub operation: String,
    #[serde(flatten)]
    pub kind: FaultKind,
    /// How many calls it hits (not used by `stuck`); default 1.
    #[serde(default = "one")]
    pub times: u32,
    /// How many matching calls pass untouched before it hits (e.g. to let a client's
    /// pre-flight read through and fail the same read in its next step); default 0.
    #[serde(default)]
    pub after: u32,
    /// The access key id whose calls it hits (see [`Caller`]); every caller's when
    /// absent. Tests that share one world give each client its own key, so one test's
    /// faults never reach another's calls.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub caller: Option<String>,
}

fn one() -> u32 {
    1
}

/// An error as AWS returns it.
#[derive(Debug, Clone)]
pub struct AwsError {
    pub status: StatusCode,
    pub code: String,
    pub message: String,
}

impl AwsError {
    pub fn new(status: u16, code: &str, message: impl Into<String>) -> Self {
        Self {
            status: StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_REQUEST),
            code: code.to_owned(),
            message: message.into(),
        }
    }

    pub fn invalid_parameter(message: impl Into<String>) -> Self {
        Self::new(400, "InvalidParameterException", message)
    }

    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(404, "ResourceNotFoundException", message)
    }

    pub fn in_use(message: impl Into<String>) -> Self {
        Self::new(409, "ResourceInUseException", message)
    }
}

/// REST-JSON errors (EKS): the code in `x-amzn-ErrorType`, the message in the body.
impl IntoResponse for AwsError {
    fn into_response(self) -> Response {
        let mut headers = HeaderMap::new();
        if let Ok(v) = HeaderValue::from_str(&self.code) {
            headers.insert("x-amzn-errortype", v);
        }
        headers.insert(
            "x-amzn-requestid",
            HeaderValue::from_static("00000000-0000-4000-8000-00000000sim0"),
        );
        (
            self.status,
            headers,
            Json(json!({ "message": self.message, "__type": self.code })),
        )
            .into_response()
    }
}

/// Everything the sim serves, shared by every request and controller.
pub struct World {
    pub clock: Arc<Clock>,
    pub faults: Arc<Faults>,
    pub calls: Calls,
    /// EKS and SageMaker.
    pub aws: Mutex<Aws>,
    /// The Kubernetes API servers, each with its objects behind its own lock.
    pub kube: Arc<Kube>,
    /// Fixed at start: a reset keeps it.
    pub moto: Option<Moto>,
    /// Where containers' writes through bucket volumes land (moto's S3): `--s3-url`,
    /// else moto. Fixed at start.
    pub s3: Option<Moto>,
}

pub type Shared = Arc<World>;

impl World {
    /// A world at `scale` whose API servers accept tokens signed with `secret`.
    pub fn new(scale: f64, moto: Option<Moto>, secret: String) -> Self {
        let clock = Arc::new(Clock::new(scale));
        let faults = Arc::new(Faults::default());
        let kube = Arc::new(Kube::new(secret));
        Self {
            aws: Mutex::new(Aws::new(clock.clone(), faults.clone(), kube.clone())),
            clock,
            faults,
            calls: Calls::default(),
            kube,
            s3: moto.clone(),
            moto,
        }
    }

    /// Forgets every resource, fault and call, and starts time again from zero; keeps
    /// the time scale and moto.
    pub async fn reset(&self) {
        let mut aws = self.aws.lock().await;
        *aws = Aws::new(self.clock.clone(), self.faults.clone(), self.kube.clone());
        self.kube.clear();
        self.faults.clear();
        self.calls.clear();
        self.clock.restart();
    }
}

/// EKS and SageMaker, under one lock: their calls check each other's state, as HyperPod
/// checks the EKS cluster it is to run on. Holds the shared parts of the world it reads
/// (the clock and faults every transition depends on, the API servers EKS starts and
/// stops).
pub struct Aws {
    pub clock: Arc<Clock>,
    pub faults: Arc<Faults>,
    pub kube: Arc<Kube>,
    pub eks: Eks,
    pub sagemaker: SageMaker,
    /// FSx for Lustre: its file systems are what pods on the EKS clusters mount.
    pub fsx: crate::fsx::Fsx,
}

impl Aws {
    pub fn new(clock: Arc<Clock>, faults: Arc<Faults>, kube: Arc<Kube>) -> Self {
        Self {
            clock,
            faults,
            kube,
            eks: Eks::default(),
            sagemaker: SageMaker::new(),
            fsx: crate::fsx::Fsx::default(),
        }
    }

    /// EKS and SageMaker on a clock of their own at `scale`, for unit tests.
    #[cfg(test)]
    pub fn standalone(scale: f64) -> Self {
        Self::new(
            Arc::new(Clock::new(scale)),
            Arc::new(Faults::default()),
            Arc::new(Kube::new("testing".to_owned())),
        )
    }

    /// The health issue (code, message) what `operation` starts now must fail with.
    pub fn failing(&self, service: &str, operation: &str) -> Option<(String, String)> {
        self.faults.failing(service, operation)
    }

    /// Whether what `operation` started must stay in its transitional state.
    pub fn stuck(&self, service: &str, operation: &str) -> bool {
        self.faults.stuck(service, operation)
    }
}

/// One API call as the log keeps it.
#[derive(Clone, Debug, Serialize)]
pub struct Call {
    pub service: String,
    pub operation: String,
    /// The caller's application name from its user agent (`app/NAME`, as the AWS SDKs
    /// write it and CloudTrail records it), if it gave one.
    pub agent: Option<String>,
    /// The access key id the call was signed with (see [`Caller`]).
    pub caller: Option<String>,
}

/// Who made the request being answered, as AWS tells callers apart: the access key id
/// it was signed with (CloudTrail's `accessKeyId`) and the application name of its user
/// agent.
#[derive(Clone, Debug, Default)]
pub struct Caller {
    pub agent: Option<String>,
    pub key: Option<String>,
}

tokio::task_local! {
    /// The caller of the request being answered (see [`with_caller`]).
    static CALLER: Caller;
}

impl Caller {
    /// The caller of a request: the `app/NAME` of its user agent (the AWS SDKs put it in
    /// `x-amz-user-agent` and `User-Agent`, Kubernetes clients in `User-Agent`) and the
    /// access key id of its SigV4 `Authorization` header or, for the Kubernetes API, of
    /// the presigned URL inside its EKS bearer token. Only read, never trusted: the
    /// signature is checked where the request is authorised.
    pub fn of(headers: &HeaderMap) -> Caller {
        let agent = ["x-amz-user-agent", "user-agent"].iter().find_map(|h| {
            headers
                .get(*h)?
                .to_str()
                .ok()?
                .split_whitespace()
                .find_map(|t| t.strip_prefix("app/"))
                .map(str::to_owned)
        });
        let authorization = headers
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default();
        let key = match authorization.strip_prefix("Bearer ") {
            Some(token) => crate::kube::token_access_key(token.trim()),
            None => authorization
                .split("Credential=")
                .nth(1)
                .and_then(|c| c.split('/').next())
                .filter(|k| !k.is_empty())
                .map(str::to_owned),
        };
        Caller { agent, key }
    }

    /// The caller of the request being answered (none outside a request: a controller).
    pub fn current() -> Caller {
        CALLER.try_with(Clone::clone).unwrap_or_default()
    }
}

/// Middleware: every call logged or faulted while `request` is answered knows its caller.
pub async fn with_caller(
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let caller = Caller::of(request.headers());
    CALLER.scope(caller, next.run(request)).await
}

/// Calls the log keeps; older ones are dropped.
pub const CALLS_KEPT: usize = 100_000;

/// The faults a test registered: a leaf lock, taken by every call the sim answers.
#[derive(Default)]
pub struct Faults(std::sync::Mutex<FaultList>);

#[derive(Default)]
struct FaultList {
    faults: Vec<Fault>,
    /// The id the next fault gets less one.
    last_id: u64,
}

fn matches(f: &Fault, service: &str, operation: &str) -> bool {
    f.service == service && (f.operation == "*" || f.operation == operation)
}

impl Faults {
    fn lock(&self) -> MutexGuard<'_, FaultList> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn add(&self, mut fault: Fault) -> u64 {
        let mut list = self.lock();
        list.last_id += 1;
        fault.id = list.last_id;
        list.faults.push(fault);
        list.last_id
    }

    pub fn list(&self) -> Vec<Fault> {
        self.lock().faults.clone()
    }

    pub fn retain(&self, keep: impl FnMut(&Fault) -> bool) {
        self.lock().faults.retain(keep);
    }

    /// No faults, and ids from 1 again.
    pub fn clear(&self) {
        *self.lock() = FaultList::default();
    }

    /// The kind of the first error fault matching this call by `caller`, if any
    /// (consuming one use); the caller shapes it as its service answers.
    pub fn take(&self, service: &str, operation: &str, caller: Option<&str>) -> Option<FaultKind> {
        let mut list = self.lock();
        let index = list.faults.iter().position(|f| {
            !f.kind.lasting()
                && matches(f, service, operation)
                && f.caller.as_deref().is_none_or(|c| Some(c) == caller)
        })?;
        let fault = &mut list.faults[index];
        if fault.after > 0 {
            fault.after -= 1;
            return None;
        }
        let kind = fault.kind.clone();
        fault.times = fault.times.saturating_sub(1);
        if fault.times == 0 {
            list.faults.remove(index);
        }
        Some(kind)
    }

    /// The health issue (code, message) what `operation` starts now must fail with.
    pub fn failing(&self, service: &str, operation: &str) -> Option<(String, String)> {
        self.lock().faults.iter().find_map(|f| match &f.kind {
            FaultKind::Fails { code, message } if matches(f, service, operation) => {
                Some((code.clone(), message.clone()))
            }
            _ => None,
        })
    }

    /// Whether what `operation` started must stay in its transitional state.
    pub fn stuck(&self, service: &str, operation: &str) -> bool {
        self.lock()
            .faults
            .iter()
            .any(|f| f.kind == FaultKind::Stuck && matches(f, service, operation))
    }
}

/// Every API call the world answered (or refused), oldest first: tests compare what a
/// client did with what it said it would do. Bounded by [`CALLS_KEPT`]; a leaf lock.
#[derive(Default)]
pub struct Calls(std::sync::Mutex<VecDeque<Call>>);

impl Calls {
    fn lock(&self) -> MutexGuard<'_, VecDeque<Call>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn record(&self, service: &str, operation: &str, caller: Caller) {
        let mut calls = self.lock();
        if calls.len() >= CALLS_KEPT {
            calls.pop_front();
        }
        calls.push_back(Call {
            service: service.to_owned(),
            operation: operation.to_owned(),
            agent: caller.agent,
            caller: caller.key,
        });
    }

    /// The calls `keep` selects, oldest first.
    pub fn list(&self, mut keep: impl FnMut(&Call) -> bool) -> Vec<Call> {
        self.lock().iter().filter(|c| keep(c)).cloned().collect()
    }

    pub fn retain(&self, keep: impl FnMut(&Call) -> bool) {
        self.lock().retain(keep);
    }

    pub fn clear(&self) {
        self.lock().clear();
    }
}

/// The error an AWS-shaped dispatcher answers for fault `kind`: a refusal, or (for a lost
/// answer) the server error the caller sees instead of the answer. `None` for `stuck`
/// and `delay`, which change when, not what.
pub fn aws_error(kind: FaultKind) -> Option<AwsError> {
    Some(match kind {
        FaultKind::Throttle => AwsError::new(
            429,
            "ThrottlingException",
            "Rate exceeded (injected by hypd-sim)",
        ),
        FaultKind::ServerError | FaultKind::Lost => AwsError::new(
            500,
            "InternalFailure",
            "An internal error occurred (injected by hypd-sim)",
        ),
        FaultKind::Error {
            code,
            status,
            message,
        } => AwsError::new(status, &code, message),
        FaultKind::Stuck | FaultKind::Delay { .. } | FaultKind::Fails { .. } => return None,
    })
}

/// Takes the fault for this call, if any, and waits out a `delay` holding no lock (so
/// other calls go on meanwhile). What is left for the dispatcher: refuse
/// the call (an error kind), or carry it out and lose its answer (`lost`).
pub async fn injected(state: &Shared, service: &str, operation: &str) -> Option<FaultKind> {
    let caller = Caller::current();
    let kind = state.faults.take(service, operation, caller.key.as_deref());
    state.calls.record(service, operation, caller);
    let kind = kind?;
    if let FaultKind::Delay { seconds } = kind {
        tracing::info!(%service, %operation, seconds, "injected delay");
        tokio::time::sleep(std::time::Duration::from_secs_f64(seconds.max(0.0))).await;
        return None;
    }
    tracing::info!(%service, %operation, ?kind, "injected fault");
    Some(kind)
}

/// The region a request was signed for (SigV4 credential scope), as AWS routes it.
pub fn region_of(headers: &HeaderMap) -> String {
    headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split("Credential=").nth(1))
        .and_then(|c| c.split('/').nth(2))
        .filter(|r| !r.is_empty())
        .unwrap_or(DEFAULT_REGION)
        .to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn faults_are_consumed_and_matched_by_operation() {
        let w = Faults::default();
        w.add(Fault {
            id: 0,
            service: "eks".into(),
            operation: "CreateCluster".into(),
            kind: FaultKind::Throttle,
            times: 2,
            after: 0,
            caller: None,
        });
        assert!(
            w.take("eks", "DescribeCluster", None)
                .and_then(aws_error)
                .is_none()
        );
        assert_eq!(
            w.take("eks", "CreateCluster", None)
                .and_then(aws_error)
                .unwrap()
                .code,
            "ThrottlingException"
        );
        assert!(
            w.take("eks", "CreateCluster", None)
                .and_then(aws_error)
                .is_some()
        );
        assert!(
            w.take("eks", "CreateCluster", None)
                .and_then(aws_error)
                .is_none()
        );
        // A fault that lets the first matching call through.
        w.add(Fault {
            id: 0,
            service: "eks".into(),
            operation: "DescribeCluster".into(),
            kind: FaultKind::ServerError,
            times: 1,
            after: 1,
            caller: None,
        });
        assert!(w.take("eks", "DescribeCluster", None).is_none());
        assert_eq!(
            w.take("eks", "DescribeCluster", None),
            Some(FaultKind::ServerError)
        );
        assert!(w.take("eks", "DescribeCluster", None).is_none());
        w.add(Fault {
            id: 0,
            service: "eks".into(),
            operation: "*".into(),
            kind: FaultKind::Stuck,
            times: 1,
            after: 0,
            caller: None,
        });
        assert!(w.stuck("eks", "CreateAddon"));
        assert!(
            w.take("eks", "CreateAddon", None)
                .and_then(aws_error)
                .is_none()
        );
    }

    #[test]
    fn a_fault_scoped_to_a_caller_leaves_other_callers_alone() {
        let w = Faults::default();
        w.add(Fault {
            id: 0,
            service: "eks".into(),
            operation: "CreateCluster".into(),
            kind: FaultKind::ServerError,
            times: 1,
            after: 1,
            caller: Some("AKIDCASE1".into()),
        });
        // Another caller's calls neither take it nor count towards `after`.
        assert_eq!(w.take("eks", "CreateCluster", Some("AKIDCASE2")), None);
        assert_eq!(w.take("eks", "CreateCluster", None), None);
        assert_eq!(w.take("eks", "CreateCluster", Some("AKIDCASE1")), None);
        assert_eq!(w.take("eks", "CreateCluster", Some("AKIDCASE2")), None);
        assert_eq!(
            w.take("eks", "CreateCluster", Some("AKIDCASE1")),
            Some(FaultKind::ServerError)
        );
        assert!(w.list().is_empty());
    }

    #[test]
    fn the_caller_is_the_signing_key_or_the_one_inside_an_eks_token() {
        let mut h = HeaderMap::new();
        h.insert(
            "authorization",
            "AWS4-HMAC-SHA256 Credential=AKIDCASE7/20261130/us-east-1/eks/aws4_request, SignedHeaders=host, Signature=x"
                .parse()
                .unwrap(),
        );
        h.insert(
            "user-agent",
            "aws-sdk-rust/1 app/hypd.op-1.eks".parse().unwrap(),
        );
        let c = Caller::of(&h);
        assert_eq!(
            (c.key.as_deref(), c.agent.as_deref()),
            (Some("AKIDCASE7"), Some("hypd.op-1.eks"))
        );
        use base64::Engine;
        let url = "https://sts.us-east-1.amazonaws.com/?Action=GetCallerIdentity&Version=2011-06-15\
                   &X-Amz-Credential=AKIDCASE8%2F20261130%2Fus-east-1%2Fsts%2Faws4_request&X-Amz-Signature=x";
        let token = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(url.replace(' ', ""));
        let mut h = HeaderMap::new();
        h.insert(
            "authorization",
            format!("Bearer k8s-aws-v1.{token}").parse().unwrap(),
        );
        assert_eq!(Caller::of(&h).key.as_deref(), Some("AKIDCASE8"));
        assert_eq!(Caller::of(&HeaderMap::new()).key, None);
    }

    #[test]
    fn region_comes_from_the_signature() {
        let mut h = HeaderMap::new();
        h.insert(
            "authorization",
            "AWS4-HMAC-SHA256 Credential=testing/20261130/eu-west-1/eks/aws4_request, SignedHeaders=host, Signature=x"
                .parse()
                .unwrap(),
        );
        assert_eq!(region_of(&h), "eu-west-1");
        assert_eq!(region_of(&HeaderMap::new()), "us-east-1");
    }
}
