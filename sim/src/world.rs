//! The sim's shared state: a scaled clock that drives every state machine, injected
//! faults, and the error shape AWS answers with. Transitions are computed from the clock
//! when a resource is read, so nothing runs in the background and a test that changes
//! the time scale changes every pending transition at once.

use std::sync::Arc;
use std::time::Instant;

use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Json, Response};
use serde::{Deserialize, Serialize};
use serde_json::json;
use tokio::sync::Mutex;

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

/// Simulated time: `scale` simulated seconds pass per real second.
#[derive(Debug)]
pub struct Clock {
    base_real: Instant,
    base_sim: f64,
    scale: f64,
    boot_epoch: f64,
}

impl Clock {
    pub fn new(scale: f64) -> Self {
        let boot_epoch = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs_f64())
            .unwrap_or_default();
        Self {
            base_real: Instant::now(),
            base_sim: 0.0,
            scale,
            boot_epoch,
        }
    }

    /// Simulated seconds since the sim started.
    pub fn now(&self) -> f64 {
        self.base_sim + self.base_real.elapsed().as_secs_f64() * self.scale
    }

    pub fn scale(&self) -> f64 {
        self.scale
    }

    /// Changes the speed from now on; time already passed stays passed.
    pub fn set_scale(&mut self, scale: f64) {
        self.base_sim = self.now();
        self.base_real = Instant::now();
        self.scale = scale;
    }

    /// Jumps simulated time forward, for unit tests that need an exact instant.
    #[cfg(test)]
    pub fn advance(&mut self, secs: f64) {
        self.base_sim += secs;
    }

    /// A simulated instant as epoch seconds: boot time plus simulated seconds, so
    /// timestamps advance at the sim's speed.
    pub fn epoch(&self, sim: f64) -> f64 {
        self.boot_epoch + sim
    }
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
    /// The call succeeds, but what it starts ends in its failed state (an EKS cluster
    /// FAILED) with this health issue, for objects started while the fault is
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
    /// `eks` or `sagemaker`, served by the sim, or `ec2`, `iam`, `s3`, `sts`, forwarded
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

pub struct World {
    pub clock: Clock,
    pub faults: Vec<Fault>,
    /// Every API call the world answered (or refused), oldest first: tests compare what
    /// a client did with what it said it would do. Bounded by [`CALLS_KEPT`].
    pub calls: std::collections::VecDeque<Call>,
    next_fault: u64,
    pub eks: Eks,
    pub sagemaker: SageMaker,
    pub moto: Option<Moto>,
    pub kube: Kube,
}

pub type Shared = Arc<Mutex<World>>;

/// One API call as the log keeps it.
#[derive(Clone, Debug, Serialize)]
pub struct Call {
    pub service: String,
    pub operation: String,
    /// The caller's application name from its user agent (`app/NAME`, as the AWS SDKs
    /// write it and CloudTrail records it), if it gave one.
    pub agent: Option<String>,
}

tokio::task_local! {
    /// The application name of the request being answered (see [`with_agent`]).
    static AGENT: Option<String>;
}

/// The `app/NAME` of a request's user agent: the AWS SDKs put it in `x-amz-user-agent`
/// and `User-Agent`, Kubernetes clients in `User-Agent`.
pub fn agent_of(headers: &HeaderMap) -> Option<String> {
    ["x-amz-user-agent", "user-agent"].iter().find_map(|h| {
        headers
            .get(*h)?
            .to_str()
            .ok()?
            .split_whitespace()
            .find_map(|t| t.strip_prefix("app/"))
            .map(str::to_owned)
    })
}

/// Middleware: every call logged while `request` is answered carries its caller's
/// application name.
pub async fn with_agent(request: axum::extract::Request, next: axum::middleware::Next) -> Response {
    let agent = agent_of(request.headers());
    AGENT.scope(agent, next.run(request)).await
}

/// Calls the log keeps; older ones are dropped.
pub const CALLS_KEPT: usize = 100_000;

impl World {
    pub fn new(scale: f64, moto: Option<Moto>) -> Self {
        Self {
            clock: Clock::new(scale),
            faults: Vec::new(),
            calls: std::collections::VecDeque::new(),
            next_fault: 1,
            eks: Eks::default(),
            sagemaker: SageMaker::new(),
            moto,
            kube: Kube::default(),
        }
    }

    pub fn add_fault(&mut self, mut fault: Fault) -> u64 {
        fault.id = self.next_fault;
        self.next_fault += 1;
        let id = fault.id;
        self.faults.push(fault);
        id
    }

    fn matches(f: &Fault, service: &str, operation: &str) -> bool {
        f.service == service && (f.operation == "*" || f.operation == operation)
    }

    fn record_call(&mut self, service: &str, operation: &str) {
        if self.calls.len() >= CALLS_KEPT {
            self.calls.pop_front();
        }
        self.calls.push_back(Call {
            service: service.to_owned(),
            operation: operation.to_owned(),
            agent: AGENT.try_with(Clone::clone).ok().flatten(),
        });
    }

    /// The kind of the first error fault matching this call, if any (consuming one use);
    /// the caller shapes it as its service answers.
    pub fn take_fault_kind(&mut self, service: &str, operation: &str) -> Option<FaultKind> {
        let index = self
            .faults
            .iter()
            .position(|f| !f.kind.lasting() && Self::matches(f, service, operation))?;
        let fault = &mut self.faults[index];
        if fault.after > 0 {
            fault.after -= 1;
            return None;
        }
        let kind = fault.kind.clone();
        fault.times = fault.times.saturating_sub(1);
        if fault.times == 0 {
            self.faults.remove(index);
        }
        Some(kind)
    }

    /// The health issue (code, message) what `operation` starts now must fail with.
    pub fn failing(&self, service: &str, operation: &str) -> Option<(String, String)> {
        self.faults.iter().find_map(|f| match &f.kind {
            FaultKind::Fails { code, message } if Self::matches(f, service, operation) => {
                Some((code.clone(), message.clone()))
            }
            _ => None,
        })
    }

    /// Whether what `operation` started must stay in its transitional state.
    pub fn stuck(&self, service: &str, operation: &str) -> bool {
        self.faults
            .iter()
            .any(|f| f.kind == FaultKind::Stuck && Self::matches(f, service, operation))
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

/// Takes the fault for this call, if any, and waits out a `delay` with the world
/// unlocked (so other calls go on meanwhile). What is left for the dispatcher: refuse
/// the call (an error kind), or carry it out and lose its answer (`lost`).
pub async fn injected(state: &Shared, service: &str, operation: &str) -> Option<FaultKind> {
    let kind = {
        let mut w = state.lock().await;
        w.record_call(service, operation);
        w.take_fault_kind(service, operation)?
    };
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
    fn clock_rescales_without_losing_time() {
        let mut c = Clock::new(1000.0);
        std::thread::sleep(std::time::Duration::from_millis(20));
        let before = c.now();
        assert!(before >= 20.0, "{before}");
        c.set_scale(0.0);
        let frozen = c.now();
        std::thread::sleep(std::time::Duration::from_millis(10));
        assert!((c.now() - frozen).abs() < 1e-9);
        assert!(frozen >= before);
    }

    #[test]
    fn faults_are_consumed_and_matched_by_operation() {
        let mut w = World::new(1.0, None);
        w.add_fault(Fault {
            id: 0,
            service: "eks".into(),
            operation: "CreateCluster".into(),
            kind: FaultKind::Throttle,
            times: 2,
            after: 0,
        });
        assert!(
            w.take_fault_kind("eks", "DescribeCluster")
                .and_then(aws_error)
                .is_none()
        );
        assert_eq!(
            w.take_fault_kind("eks", "CreateCluster")
                .and_then(aws_error)
                .unwrap()
                .code,
            "ThrottlingException"
        );
        assert!(
            w.take_fault_kind("eks", "CreateCluster")
                .and_then(aws_error)
                .is_some()
        );
        assert!(
            w.take_fault_kind("eks", "CreateCluster")
                .and_then(aws_error)
                .is_none()
        );
        // A fault that lets the first matching call through.
        w.add_fault(Fault {
            id: 0,
            service: "eks".into(),
            operation: "DescribeCluster".into(),
            kind: FaultKind::ServerError,
            times: 1,
            after: 1,
        });
        assert!(w.take_fault_kind("eks", "DescribeCluster").is_none());
        assert_eq!(
            w.take_fault_kind("eks", "DescribeCluster"),
            Some(FaultKind::ServerError)
        );
        assert!(w.take_fault_kind("eks", "DescribeCluster").is_none());
        w.add_fault(Fault {
            id: 0,
            service: "eks".into(),
            operation: "*".into(),
            kind: FaultKind::Stuck,
            times: 1,
            after: 0,
        });
        assert!(w.stuck("eks", "CreateAddon"));
        assert!(
            w.take_fault_kind("eks", "CreateAddon")
                .and_then(aws_error)
                .is_none()
        );
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
