//! AWS access through the SDK's default chain. Endpoints come only from the standard
//! `AWS_ENDPOINT_URL[_SERVICE]` variables, so the sandbox and tests reach moto and sim by
//! the same code path as production. Provider errors keep their code, message and
//! request id.

use std::time::{Duration, Instant};

use app::api::ApiError;
use aws_config::{BehaviorVersion, SdkConfig};
use aws_sdk_sts::error::{DisplayErrorContext, ProvideErrorMetadata, SdkError};
use aws_sdk_sts::operation::RequestId;
use serde::Serialize;
use tokio::sync::Mutex;

/// A failed call to AWS, as the provider reported it.
#[derive(Debug, Clone, thiserror::Error, Serialize)]
#[error("{service}.{operation} failed: {}{message}", code.as_deref().map(|c| format!("{c}: ")).unwrap_or_default())]
pub struct UpstreamError {
    pub service: &'static str,
    pub operation: &'static str,
    pub code: Option<String>,
    pub message: String,
    pub request_id: Option<String>,
    /// The HTTP status of the provider's answer, when there was one.
    #[serde(skip)]
    pub status: Option<u16>,
    /// Asking again later may succeed (decided here, where the error is raised).
    pub transient: bool,
}

/// Provider error codes that mean "slow down" or "our fault, try again", whatever the
/// HTTP status they come with (IAM and STS throttle with a 400).
const TRANSIENT_CODES: &[&str] = &[
    "Throttling",
    "ThrottlingException",
    "ThrottledException",
    "TooManyRequestsException",
    "RequestLimitExceeded",
    "RequestThrottled",
    "RequestThrottledException",
    "SlowDown",
    "ServiceUnavailable",
    "ServiceUnavailableException",
    "InternalFailure",
    "InternalError",
    "InternalServerError",
    "InternalServerException",
    "ServerException",
    "RequestTimeout",
    "RequestTimeoutException",
];

/// Codes and statuses by which the services say an object does not exist.
pub fn is_not_found(code: Option<&str>, status: Option<u16>) -> bool {
    match code {
        Some(c) => {
            c.ends_with(".NotFound")
                || matches!(
                    c,
                    "NotFound"
                        | "NoSuchEntity"
                        | "NoSuchBucket"
                        | "NoSuchKey"
                        | "NoSuchTagSet"
                        | "ResourceNotFound"
                        | "ResourceNotFoundException"
                        | "FileSystemNotFound"
                        | "DataRepositoryAssociationNotFound"
                )
        }
        // S3's HEAD answers carry no body, hence no code.
        None => status == Some(404),
    }
}

impl UpstreamError {
    pub fn from_sdk<E, R>(
        service: &'static str,
        operation: &'static str,
        err: SdkError<E, R>,
    ) -> Self
    where
        E: ProvideErrorMetadata + std::error::Error + 'static,
        R: std::fmt::Debug + HasStatus,
        SdkError<E, R>: RequestId,
    {
        let request_id = err.request_id().map(str::to_owned);
        let status = err.raw_response().map(HasStatus::http_status);
        match &err {
            SdkError::ServiceError(_) => {
                let service_err = err.as_service_error().expect("a service error");
                let code = service_err.code().map(str::to_owned);
                let transient = status.is_some_and(|s| s >= 500 || s == 429)
                    || code
                        .as_deref()
                        .is_some_and(|c| TRANSIENT_CODES.contains(&c));
                UpstreamError {
                    service,
                    operation,
                    message: service_err.message().map_or_else(
                        || DisplayErrorContext(service_err).to_string(),
                        str::to_owned,
                    ),
                    code,
                    request_id,
                    status,
                    transient,
                }
            }
            // Timeouts, connection failures and unreadable answers have no provider code
            // and say nothing about the request itself; a request that could not be built
            // (missing credentials, a bad parameter) fails the same way every time.
            other => UpstreamError {
                service,
                operation,
                code: None,
                message: DisplayErrorContext(&err).to_string(),
                request_id,
                status,
                transient: !matches!(other, SdkError::ConstructionFailure(_)),
            },
        }
    }

    pub fn is_not_found(&self) -> bool {
        is_not_found(self.code.as_deref(), self.status)
    }
}

/// The HTTP status of an SDK's raw response.
pub trait HasStatus {
    fn http_status(&self) -> u16;
}

// Every SDK answers with the same smithy response type; this one impl serves them all.
impl HasStatus for aws_sdk_sts::config::http::HttpResponse {
    fn http_status(&self) -> u16 {
        self.status().as_u16()
    }
}

impl From<UpstreamError> for ApiError {
    fn from(e: UpstreamError) -> Self {
        ApiError::Upstream {
            service: e.service.to_owned(),
            call: e.operation.to_owned(),
            code: e.code,
            message: e.message,
            request_id: e.request_id.map(Into::into),
            transient: e.transient,
        }
    }
}

/// The one way SDK results become the contract's: a provider error kept whole (service,
/// call, code, message, request id, transient or not), and "does not exist" as `None`
/// where the caller expects it may not.
pub trait SdkResultExt<T> {
    fn upstream(self, service: &'static str, call: &'static str) -> Result<T, ApiError>;

    /// `Ok(None)` when the provider answers that the object does not exist.
    fn found(self, service: &'static str, call: &'static str) -> Result<Option<T>, ApiError>;

    /// `Ok(None)` when the provider answers with one of `codes` (e.g. "already exists" on a
    /// create that an earlier, interrupted run made).
    fn allowing(
        self,
        service: &'static str,
        call: &'static str,
        codes: &[&str],
    ) -> Result<Option<T>, ApiError>;
}

impl<T, E, R> SdkResultExt<T> for Result<T, SdkError<E, R>>
where
    E: ProvideErrorMetadata + std::error::Error + 'static,
    R: std::fmt::Debug + HasStatus,
    SdkError<E, R>: RequestId,
{
    fn upstream(self, service: &'static str, call: &'static str) -> Result<T, ApiError> {
        self.map_err(|e| UpstreamError::from_sdk(service, call, e).into())
    }

    fn found(self, service: &'static str, call: &'static str) -> Result<Option<T>, ApiError> {
        match self {
            Ok(v) => Ok(Some(v)),
            Err(e) => {
                let e = UpstreamError::from_sdk(service, call, e);
                if e.is_not_found() {
                    Ok(None)
                } else {
                    Err(e.into())
                }
            }
        }
    }

    fn allowing(
        self,
        service: &'static str,
        call: &'static str,
        codes: &[&str],
    ) -> Result<Option<T>, ApiError> {
        match self {
            Ok(v) => Ok(Some(v)),
            Err(e) => {
                let e = UpstreamError::from_sdk(service, call, e);
                if e.code.as_deref().is_some_and(|c| codes.contains(&c)) {
                    Ok(None)
                } else {
                    Err(e.into())
                }
            }
        }
    }
}

/// An answer that says a provider-side object is in a state no retry can change (an EKS
/// cluster FAILED, an add-on CREATE_FAILED): the stage fails at once with the provider's
/// own words.
pub fn failed_state(
    service: &str,
    call: &str,
    state: Option<&str>,
    message: impl Into<String>,
) -> ApiError {
    ApiError::Upstream {
        service: service.to_owned(),
        call: call.to_owned(),
        code: state.map(str::to_owned),
        message: message.into(),
        request_id: None,
        transient: false,
    }
}

/// Who hypd acts as.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct Identity {
    pub account: String,
    pub arn: String,
    pub user_id: String,
}

/// Shared AWS configuration and the clients built from it.
pub struct Aws {
    config: SdkConfig,
    /// Shared with the copies made for steps ([`Aws::for_step`]): same account.
    identity: std::sync::Arc<Mutex<Option<(Instant, Identity)>>>,
    /// Every client refuses mutating calls (see [`Aws::read_only`]).
    read_only: bool,
}

/// Refuses every call that is not a read, before it is sent: the clients of a plan
/// preview carry it, so a preview cannot change the world even through a step that
/// forgot to ask whether it is planning.
#[derive(Debug)]
struct ReadOnly;

/// Operation-name prefixes of the calls that only read, across the services hypd uses.
const READS: &[&str] = &["Describe", "List", "Get", "Head"];

impl aws_smithy_runtime_api::client::interceptors::Intercept for ReadOnly {
    fn name(&self) -> &'static str {
        "hypd-read-only"
    }

    // Not `read_before_execution`: a client's interceptors first run there before the
    // operation's configuration (which names the operation) is applied.
    fn read_before_serialization(
        &self,
        _: &aws_smithy_runtime_api::client::interceptors::context::BeforeSerializationInterceptorContextRef<'_>,
        _: &aws_smithy_runtime_api::client::runtime_components::RuntimeComponents,
        cfg: &mut aws_sdk_sts::config::ConfigBag,
    ) -> Result<(), aws_smithy_runtime_api::box_error::BoxError> {
        let op = cfg
            .load::<aws_smithy_runtime_api::client::orchestrator::Metadata>()
            .map(|m| m.name().to_owned())
            .unwrap_or_default();
        if READS.iter().any(|p| op.starts_with(p)) {
            Ok(())
        } else {
            Err(format!("hypd refused {op}: a plan preview makes no changes").into())
        }
    }
}

/// A client of `$sdk` for `region` from `$aws`'s config, read-only when `$aws` is.
macro_rules! client {
    ($aws:expr, $sdk:ident, $region:expr $(, $extra:ident($arg:expr))*) => {{
        let mut b = $sdk::config::Builder::from(&$aws.config)
            .region($sdk::config::Region::new($region.to_owned()))
            $(.$extra($arg))*;
        if $aws.read_only {
            b = b.interceptor(ReadOnly);
        }
        $sdk::Client::from_conf(b.build())
    }};
}

/// An identity is re-checked at most this often by readiness probes.
const IDENTITY_TTL: Duration = Duration::from_secs(60);

impl Aws {
    pub async fn from_env() -> Self {
        let config = aws_config::defaults(BehaviorVersion::latest())
            .timeout_config(
                aws_config::timeout::TimeoutConfig::builder()
                    .connect_timeout(Duration::from_secs(5))
                    .operation_timeout(Duration::from_secs(30))
                    .build(),
            )
            .load()
            .await;
        Self::new(config)
    }

    /// The same account, with the SDK's own retries off: for operations, whose steps are
    /// retried whole by the engine (observe first, then only what is missing). An SDK
    /// retry of a create whose answer was lost would make the object twice.
    pub fn for_operations(&self) -> Self {
        let config = self
            .config
            .to_builder()
            .retry_config(aws_config::retry::RetryConfig::disabled())
            .build();
        Self::new(config)
    }

    /// The same account, every call of which names the operation and stage it is made
    /// for in its user agent (`app/hypd.<operation>.<stage>`, within the SDK's 50
    /// characters): CloudTrail, and the Kubernetes audit log through
    /// [`Aws::user_agent`], then tie each call to the step that made it.
    pub fn for_step(&self, operation_id: &str, stage: &str) -> Self {
        let name = format!("hypd.{operation_id}.{stage}");
        // Ids and stage names are of AppName's characters; should that ever change,
        // calls go out unnamed rather than not at all.
        let config = match aws_config::AppName::new(name) {
            Ok(app) => self.config.to_builder().app_name(app).build(),
            Err(_) => self.config.clone(),
        };
        Self {
            config,
            identity: self.identity.clone(),
            read_only: self.read_only,
        }
    }

    /// The User-Agent hypd's Kubernetes clients send: hypd's own, plus the step's name
    /// as the AWS SDK puts it (`app/…`) when the clients are a step's.
    pub fn user_agent(&self) -> String {
        let own = concat!("hypd/", env!("CARGO_PKG_VERSION"));
        match self.config.app_name() {
            Some(app) => format!("{own} app/{app}"),
            None => own.to_owned(),
        }
    }

    /// The same account, with every mutating call refused before it is sent: for plan
    /// previews.
    pub fn read_only(&self) -> Self {
        Self {
            read_only: true,
            ..Self::new(self.config.clone())
        }
    }

    pub fn new(config: SdkConfig) -> Self {
        Self {
            config,
            identity: Default::default(),
            read_only: false,
        }
    }

    pub fn region(&self) -> Option<String> {
        self.config.region().map(|r| r.as_ref().to_owned())
    }

    pub fn sdk_config(&self) -> &SdkConfig {
        &self.config
    }

    /// The credentials to sign a request hypd makes itself (an EKS token, MLflow's REST
    /// API), for `purpose`.
    pub async fn signing_identity(
        &self,
        purpose: &str,
    ) -> Result<aws_smithy_runtime_api::client::identity::Identity, ApiError> {
        use aws_credential_types::provider::ProvideCredentials;
        let provider = self
            .config
            .credentials_provider()
            .ok_or_else(|| ApiError::internal("no AWS credentials are configured"))?;
        let credentials = provider
            .provide_credentials()
            .await
            .map_err(|e| ApiError::Upstream {
                service: "sts".into(),
                call: "credentials".into(),
                code: None,
                message: format!("no AWS credentials to sign {purpose} with: {e}"),
                request_id: None,
                // Credential providers fail for passing reasons too (an expired SSO
                // token refreshed by the user, IMDS unreachable for a moment).
                transient: true,
            })?;
        Ok(credentials.into())
    }

    pub fn ec2(&self, region: &str) -> aws_sdk_ec2::Client {
        client!(self, aws_sdk_ec2, region)
    }

    pub fn eks(&self, region: &str) -> aws_sdk_eks::Client {
        client!(self, aws_sdk_eks, region)
    }

    pub fn fsx(&self, region: &str) -> aws_sdk_fsx::Client {
        client!(self, aws_sdk_fsx, region)
    }

    pub fn iam(&self, region: &str) -> aws_sdk_iam::Client {
        client!(self, aws_sdk_iam, region)
    }

    pub fn s3(&self, region: &str) -> aws_sdk_s3::Client {
        // Path-style: bucket names with dots, and S3-compatible endpoints, need it.
        client!(self, aws_sdk_s3, region, force_path_style(true))
    }

    pub fn sagemaker(&self, region: &str) -> aws_sdk_sagemaker::Client {
        client!(self, aws_sdk_sagemaker, region)
    }

    pub fn service_quotas(&self, region: &str) -> aws_sdk_servicequotas::Client {
        client!(self, aws_sdk_servicequotas, region)
    }

    /// The caller identity (STS GetCallerIdentity), cached for a minute on success. The
    /// lock guards only the cache, never the call: readiness probes and pre-flights do
    /// not queue behind one stalled request to STS.
    pub async fn identity(&self) -> Result<Identity, UpstreamError> {
        if let Some((at, id)) = self.identity.lock().await.as_ref()
            && at.elapsed() < IDENTITY_TTL
        {
            return Ok(id.clone());
        }
        let out = aws_sdk_sts::Client::new(&self.config)
            .get_caller_identity()
            .send()
            .await
            .map_err(|e| UpstreamError::from_sdk("sts", "GetCallerIdentity", e))?;
        let id = Identity {
            account: out.account().unwrap_or_default().to_owned(),
            arn: out.arn().unwrap_or_default().to_owned(),
            user_id: out.user_id().unwrap_or_default().to_owned(),
        };
        *self.identity.lock().await = Some((Instant::now(), id.clone()));
        Ok(id)
    }
}
