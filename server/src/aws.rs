//! AWS access through the SDK's default chain. Endpoints come only from the standard
//! `AWS_ENDPOINT_URL[_SERVICE]` variables, so the sandbox and tests reach moto and sim by
//! the same code path as production. Provider errors keep their code, message and
//! request id.

use std::time::{Duration, Instant};

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
}

impl UpstreamError {
    pub fn from_sdk<E, R>(
        service: &'static str,
        operation: &'static str,
        err: SdkError<E, R>,
    ) -> Self
    where
        E: ProvideErrorMetadata + std::error::Error + 'static,
        R: std::fmt::Debug,
        SdkError<E, R>: RequestId,
    {
        let request_id = err.request_id().map(str::to_owned);
        match err.as_service_error() {
            Some(service_err) => UpstreamError {
                service,
                operation,
                code: service_err.code().map(str::to_owned),
                message: service_err.message().map_or_else(
                    || DisplayErrorContext(service_err).to_string(),
                    str::to_owned,
                ),
                request_id,
            },
            // Timeouts, connection failures and missing credentials have no provider code.
            None => UpstreamError {
                service,
                operation,
                code: None,
                message: DisplayErrorContext(&err).to_string(),
                request_id,
            },
        }
    }
}

/// A failed SDK call as the contract's error; every AWS client's `SdkError` is the same
/// type, so one function serves them all.
pub fn upstream<E, R>(
    service: &'static str,
    operation: &'static str,
    err: SdkError<E, R>,
) -> app::api::ApiError
where
    E: ProvideErrorMetadata + std::error::Error + 'static,
    R: std::fmt::Debug,
    SdkError<E, R>: RequestId,
{
    UpstreamError::from_sdk(service, operation, err).into()
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
    identity: Mutex<Option<(Instant, Identity)>>,
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

    pub fn new(config: SdkConfig) -> Self {
        Self {
            config,
            identity: Mutex::new(None),
        }
    }

    pub fn region(&self) -> Option<String> {
        self.config.region().map(|r| r.as_ref().to_owned())
    }

    pub fn sdk_config(&self) -> &SdkConfig {
        &self.config
    }

    pub fn ec2(&self, region: &str) -> aws_sdk_ec2::Client {
        let conf = aws_sdk_ec2::config::Builder::from(&self.config)
            .region(aws_sdk_ec2::config::Region::new(region.to_owned()))
            .build();
        aws_sdk_ec2::Client::from_conf(conf)
    }

    pub fn eks(&self, region: &str) -> aws_sdk_eks::Client {
        let conf = aws_sdk_eks::config::Builder::from(&self.config)
            .region(aws_sdk_eks::config::Region::new(region.to_owned()))
            .build();
        aws_sdk_eks::Client::from_conf(conf)
    }

    pub fn iam(&self, region: &str) -> aws_sdk_iam::Client {
        let conf = aws_sdk_iam::config::Builder::from(&self.config)
            .region(aws_sdk_iam::config::Region::new(region.to_owned()))
            .build();
        aws_sdk_iam::Client::from_conf(conf)
    }

    pub fn s3(&self, region: &str) -> aws_sdk_s3::Client {
        // Path-style: bucket names with dots, and S3-compatible endpoints, need it.
        let conf = aws_sdk_s3::config::Builder::from(&self.config)
            .region(aws_sdk_s3::config::Region::new(region.to_owned()))
            .force_path_style(true)
            .build();
        aws_sdk_s3::Client::from_conf(conf)
    }

    pub fn sagemaker(&self, region: &str) -> aws_sdk_sagemaker::Client {
        let conf = aws_sdk_sagemaker::config::Builder::from(&self.config)
            .region(aws_sdk_sagemaker::config::Region::new(region.to_owned()))
            .build();
        aws_sdk_sagemaker::Client::from_conf(conf)
    }

    pub fn service_quotas(&self, region: &str) -> aws_sdk_servicequotas::Client {
        let conf = aws_sdk_servicequotas::config::Builder::from(&self.config)
            .region(aws_sdk_servicequotas::config::Region::new(
                region.to_owned(),
            ))
            .build();
        aws_sdk_servicequotas::Client::from_conf(conf)
    }

    /// The caller identity (STS GetCallerIdentity), cached for a minute on success.
    pub async fn identity(&self) -> Result<Identity, UpstreamError> {
        let mut cached = self.identity.lock().await;
        if let Some((at, id)) = cached.as_ref()
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
        *cached = Some((Instant::now(), id.clone()));
        Ok(id)
    }
}
