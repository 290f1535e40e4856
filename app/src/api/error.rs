//! The one error type every face returns. It is serializable so the console, REST
//! clients and MCP agents all see the same shape, and a validation error names each
//! offending field by its path in the request (`instance_groups[1].efa_only`).

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// One broken rule, at one place in the request.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct FieldError {
    /// Path of the field in the request, e.g. `instance_groups[1].efa_only`; empty
    /// when the request as a whole is malformed.
    pub field: String,
    /// What is wrong and what is accepted, for a human.
    pub message: String,
}

impl FieldError {
    pub fn new(field: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            field: field.into(),
            message: message.into(),
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema, thiserror::Error)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum ApiError {
    /// The request broke one or more rules; nothing was done.
    #[error("invalid request: {}", summary(errors))]
    Validation { errors: Vec<FieldError> },
    #[error("{resource} {name} not found")]
    NotFound { resource: String, name: String },
    /// The request clashes with what exists (another operation holds the target, an
    /// idempotency key names a different request); nothing was done.
    #[error("{message}")]
    Conflict {
        message: String,
        operation_id: Option<String>,
        /// The request field the clash is about, when one is (`idempotency_key`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        field: Option<String>,
    },
    /// The field cannot change for the life of the resource.
    #[error("{field} cannot be changed: {message}")]
    Immutable { field: String, message: String },
    /// AWS or Kubernetes refused or failed a call.
    #[error("{service}.{call} failed: {}{message}", code.as_deref().map(|c| format!("{c}: ")).unwrap_or_default())]
    Upstream {
        service: String,
        call: String,
        code: Option<String>,
        message: String,
        /// The provider's request id, to quote to its support. Boxed: it keeps the one
        /// error type small enough to return by value everywhere.
        request_id: Option<Box<str>>,
        /// The same call may succeed later (throttling, a provider fault, a lost
        /// connection): operations wait and try again. False for an answer such as a
        /// refusal or a resource in a failed state, which repeats if asked again.
        #[serde(default)]
        transient: bool,
    },
    /// No valid token or session.
    #[error("{message}")]
    Unauthorized { message: String },
    /// The caller's role does not allow this command.
    #[error("{message}")]
    Forbidden { message: String },
    /// The request is larger than hypd accepts; nothing was read past the limit.
    #[error("{message}")]
    TooLarge { message: String, limit_bytes: u64 },
    /// The token (or session) sent more requests than its rate allows: try again after
    /// `retry_after_seconds` (also in the `Retry-After` header).
    #[error("{message}")]
    RateLimited {
        message: String,
        retry_after_seconds: u64,
    },
    /// hypd, or what it reaches, cannot take the request now (it holds as many
    /// connections as it allows; a model endpoint is still waking): try again, after
    /// `retry_after_seconds` when given (also in the `Retry-After` header).
    #[error("{message}")]
    Unavailable {
        message: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        retry_after_seconds: Option<u64>,
    },
    #[error("internal error: {message}")]
    Internal { message: String },
}

fn summary(errors: &[FieldError]) -> String {
    errors
        .iter()
        .map(|e| {
            if e.field.is_empty() {
                e.message.clone()
            } else {
                format!("{}: {}", e.field, e.message)
            }
        })
        .collect::<Vec<_>>()
        .join("; ")
}

impl ApiError {
    pub fn field(field: impl Into<String>, message: impl Into<String>) -> Self {
        ApiError::Validation {
            errors: vec![FieldError::new(field, message)],
        }
    }

    /// Every rule a request breaks as one refusal, or none.
    pub fn unless_broken(errors: Vec<FieldError>) -> Result<(), Self> {
        if errors.is_empty() {
            Ok(())
        } else {
            Err(ApiError::Validation { errors })
        }
    }

    pub fn internal(message: impl std::fmt::Display) -> Self {
        ApiError::Internal {
            message: message.to_string(),
        }
    }

    /// The HTTP status REST answers with.
    pub fn http_status(&self) -> u16 {
        match self {
            ApiError::Validation { .. } => 422,
            ApiError::NotFound { .. } => 404,
            ApiError::Conflict { .. } | ApiError::Immutable { .. } => 409,
            ApiError::Upstream { .. } => 502,
            ApiError::Unauthorized { .. } => 401,
            ApiError::Forbidden { .. } => 403,
            ApiError::TooLarge { .. } => 413,
            ApiError::RateLimited { .. } => 429,
            ApiError::Unavailable { .. } => 503,
            ApiError::Internal { .. } => 500,
        }
    }

    /// Errors for one field, if this is a validation error (for forms).
    pub fn errors_for(&self, field: &str) -> Vec<&str> {
        match self {
            ApiError::Validation { errors } => errors
                .iter()
                .filter(|e| e.field == field)
                .map(|e| e.message.as_str())
                .collect(),
            _ => Vec::new(),
        }
    }
}

/// Collects field errors from cross-field checks; empty means valid.
#[derive(Default, Debug)]
pub struct Problems(Vec<FieldError>);

impl Problems {
    pub fn add(&mut self, field: impl Into<String>, message: impl Into<String>) {
        self.0.push(FieldError::new(field, message));
    }

    pub fn into_result(self) -> Result<(), ApiError> {
        if self.0.is_empty() {
            Ok(())
        } else {
            Err(ApiError::Validation { errors: self.0 })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn serializes_with_kind_tag() {
        let e = ApiError::field("instance_groups[1].efa_only", "cannot change");
        let v = serde_json::to_value(&e).unwrap();
        assert_eq!(v["kind"], "validation");
        assert_eq!(v["errors"][0]["field"], "instance_groups[1].efa_only");
        assert_eq!(
            e.to_string(),
            "invalid request: instance_groups[1].efa_only: cannot change"
        );
        let back: ApiError = serde_json::from_value(v).unwrap();
        assert_eq!(back, e);
        assert_eq!(
            e.errors_for("instance_groups[1].efa_only"),
            vec!["cannot change"]
        );
    }
}
