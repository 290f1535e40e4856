//! SageMaker managed MLflow tracking servers: Creating → Created, Updating → Updated and
//! Deleting on the sim's clock, an artifact store that must be an S3 URI and a role
//! that must exist in moto, and presigned URLs only for a server that is up. With a real
//! MLflow configured ([`super::mlflow_server`]) a server's URL is that MLflow's, and it
//! is Created only once that MLflow answers.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde_json::{Value, json};

use super::lookups::Lookups;
use super::mlflow_server::Backend;
use super::{Order, check_hyphenated, page, str_field, validation};
use crate::clock::reached;
use crate::world::{ACCOUNT, Aws, AwsError, Phase, fnv1a};

pub const CREATE_SECS: f64 = 1200.0;
pub const UPDATE_SECS: f64 = 600.0;
pub const DELETE_SECS: f64 = 300.0;

pub const MLFLOW_VERSIONS: &[&str] = &["2.13.2", "2.16.2", "3.0"];
pub const DEFAULT_MLFLOW_VERSION: &str = "2.16.2";
const SIZES: &[&str] = &["Small", "Medium", "Large"];

#[derive(Clone, Debug)]
pub struct Server {
    name: String,
    region: String,
    artifact_store_uri: String,
    size: String,
    version: String,
    role_arn: String,
    automatic_model_registration: bool,
    maintenance_window: Option<String>,
    created: f64,
    modified: f64,
    /// The last phase entered and when; `Updating` settles to Updated, `Creating` to
    /// Created.
    phase: (Phase, f64),
    /// The real MLflow's URL, when one serves it.
    backend: Option<String>,
}

#[derive(Default)]
pub struct Mlflow {
    servers: BTreeMap<String, Server>,
    /// The real MLflow, once a tracking server asked for it.
    backend: Option<Arc<Backend>>,
}

impl Mlflow {
    /// The URL of the real MLflow that tracking server `arn` is, when it is one and up:
    /// where job pods that name it report.
    pub fn reporting_url(&self, arn: &str) -> Option<String> {
        let backend = self.backend.as_ref().filter(|b| b.ready())?;
        self.servers
            .values()
            .any(|s| s.arn() == arn && s.phase.0 != Phase::Deleting)
            .then(|| backend.url.clone())
    }
}

impl Server {
    fn arn(&self) -> String {
        format!(
            "arn:aws:sagemaker:{}:{ACCOUNT}:mlflow-tracking-server/{}",
            self.region, self.name
        )
    }

    fn status(&self, now: f64, stuck: impl Fn(Phase) -> bool) -> &'static str {
        let (phase, since) = self.phase;
        let busy = stuck(phase) || {
            let secs = match phase {
                Phase::Creating => CREATE_SECS,
                Phase::Updating => UPDATE_SECS,
                Phase::Deleting => DELETE_SECS,
            };
            !reached(now, since + secs)
        };
        match (phase, busy) {
            (Phase::Creating, true) => "Creating",
            (Phase::Creating, false) => "Created",
            (Phase::Updating, true) => "Updating",
            (Phase::Updating, false) => "Updated",
            (Phase::Deleting, _) => "Deleting",
        }
    }

    fn url(&self) -> String {
        if let Some(url) = &self.backend {
            return url.clone();
        }
        format!(
            "https://t-{}.{}.experiments.sagemaker.aws",
            short_id(&self.arn()),
            self.region
        )
    }
}

/// A stable 12-character id per ARN, like the one AWS puts in the server's URL.
fn short_id(seed: &str) -> String {
    format!("{:016x}", fnv1a(seed))[..12].to_owned()
}

impl Aws {
    fn mlflow_stuck(&self) -> impl Fn(Phase) -> bool + use<> {
        let create = self.stuck("sagemaker", "CreateMlflowTrackingServer");
        let update = self.stuck("sagemaker", "UpdateMlflowTrackingServer");
        let delete = self.stuck("sagemaker", "DeleteMlflowTrackingServer");
        // A server on a real MLflow is up once that MLflow answers.
        let starting = self
            .sagemaker
            .mlflow
            .backend
            .as_ref()
            .is_some_and(|b| !b.ready());
        move |p| match p {
            Phase::Creating => create || starting,
            Phase::Updating => update,
            Phase::Deleting => delete,
        }
    }

    /// Drops servers whose deletion has finished.
    fn settle_mlflow(&mut self) {
        let now = self.clock.now();
        let stuck = self.mlflow_stuck();
        self.sagemaker.mlflow.servers.retain(|_, s| {
            let (phase, since) = s.phase;
            phase != Phase::Deleting || stuck(Phase::Deleting) || !reached(now, since + DELETE_SECS)
        });
    }

    fn tracking_server(&mut self, name: &str) -> Result<&mut Server, AwsError> {
        self.settle_mlflow();
        self.sagemaker.mlflow.servers.get_mut(name).ok_or_else(|| {
            AwsError::new(
                400,
                "ResourceNotFound",
                format!("Tracking server {name} not found"),
            )
        })
    }
}

fn check_server_name(name: &str) -> Result<(), AwsError> {
    check_hyphenated(
        name,
        "trackingServerName",
        256,
        "^[a-zA-Z0-9](-*[a-zA-Z0-9]){0,255}",
    )
}

fn check_artifact_store(uri: &str) -> Result<(), AwsError> {
    let bucket = uri
        .strip_prefix("s3://")
        .map(|r| r.split('/').next().unwrap_or(""));
    if bucket.is_some_and(|b| !b.is_empty()) {
        Ok(())
    } else {
        Err(validation(format!(
            "1 validation error detected: Value '{uri}' at 'artifactStoreUri' failed to satisfy constraint: Member must satisfy regular expression pattern: ^s3://([^/]+)/?(.*)$"
        )))
    }
}

fn check_size(size: &str) -> Result<(), AwsError> {
    if SIZES.contains(&size) {
        Ok(())
    } else {
        Err(validation(format!(
            "1 validation error detected: Value '{size}' at 'trackingServerSize' failed to satisfy constraint: Member must satisfy enum value set: [Small, Medium, Large]"
        )))
    }
}

/// `Tue:03:30`: a weekday, then a UTC hour and minute.
fn check_window(window: &str) -> Result<(), AwsError> {
    let parts: Vec<&str> = window.split(':').collect();
    let ok = parts.len() == 3
        && ["Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun"].contains(&parts[0])
        && parts[1].len() == 2
        && parts[1].parse::<u8>().is_ok_and(|h| h < 24)
        && parts[2].len() == 2
        && parts[2].parse::<u8>().is_ok_and(|m| m < 60);
    if ok {
        Ok(())
    } else {
        Err(validation(format!(
            "1 validation error detected: Value '{window}' at 'weeklyMaintenanceWindowStart' failed to satisfy constraint: Member must satisfy regular expression pattern: (Mon|Tue|Wed|Thu|Fri|Sat|Sun):([01]\\d|2[0-3]):([0-5]\\d)"
        )))
    }
}

pub fn create(
    w: &mut Aws,
    region: &str,
    body: &Value,
    lookups: &Lookups,
) -> Result<Value, AwsError> {
    let name = str_field(body, "TrackingServerName").unwrap_or_default();
    check_server_name(name)?;
    let uri = str_field(body, "ArtifactStoreUri").unwrap_or_default();
    check_artifact_store(uri)?;
    let role = str_field(body, "RoleArn").unwrap_or_default();
    if role.is_empty() {
        return Err(validation(
            "1 validation error detected: Value null at 'roleArn' failed to satisfy constraint: Member must not be null",
        ));
    }
    let size = str_field(body, "TrackingServerSize").unwrap_or("Small");
    check_size(size)?;
    let version = str_field(body, "MlflowVersion").unwrap_or(DEFAULT_MLFLOW_VERSION);
    if !MLFLOW_VERSIONS.contains(&version) {
        return Err(validation(format!(
            "MLflow version {version} is not supported; supported versions: {}",
            MLFLOW_VERSIONS.join(", ")
        )));
    }
    let window = str_field(body, "WeeklyMaintenanceWindowStart");
    if let Some(window) = window {
        check_window(window)?;
    }
    if !lookups.role_exists(role) {
        return Err(validation(format!(
            "Role {role} does not exist or cannot be assumed by SageMaker"
        )));
    }
    if w.tracking_server(name).is_ok() {
        return Err(validation(format!(
            "Cannot create tracking server {name} because a tracking server with the same name already exists"
        )));
    }
    if w.sagemaker.mlflow.backend.is_none()
        && let Some(bin) = Backend::configured()
    {
        match Backend::start(&bin) {
            Ok(b) => w.sagemaker.mlflow.backend = Some(b),
            Err(e) => tracing::error!("no real MLflow: {e}"),
        }
    }
    let backend = w.sagemaker.mlflow.backend.as_ref().map(|b| b.url.clone());
    let now = w.clock.now();
    let server = Server {
        backend,
        name: name.to_owned(),
        region: region.to_owned(),
        artifact_store_uri: uri.to_owned(),
        size: size.to_owned(),
        version: version.to_owned(),
        role_arn: role.to_owned(),
        automatic_model_registration: body
            .get("AutomaticModelRegistration")
            .and_then(Value::as_bool)
            .unwrap_or(false),
        maintenance_window: window.map(str::to_owned),
        created: now,
        modified: now,
        phase: (Phase::Creating, now),
    };
    let arn = server.arn();
    w.sagemaker.mlflow.servers.insert(name.to_owned(), server);
    Ok(json!({ "TrackingServerArn": arn }))
}

fn user() -> Value {
    json!({ "UserProfileArn": format!("arn:aws:iam::{ACCOUNT}:user/hypd"), "UserProfileName": "hypd" })
}

pub fn describe(w: &mut Aws, body: &Value) -> Result<Value, AwsError> {
    let name = str_field(body, "TrackingServerName").unwrap_or_default();
    let now = w.clock.now();
    let stuck = w.mlflow_stuck();
    let s = w.tracking_server(name)?.clone();
    let status = s.status(now, &stuck);
    let active = matches!(status, "Created" | "Updated" | "Updating");
    Ok(json!({
        "TrackingServerArn": s.arn(),
        "TrackingServerName": s.name,
        "ArtifactStoreUri": s.artifact_store_uri,
        "TrackingServerSize": s.size,
        "MlflowVersion": s.version,
        "RoleArn": s.role_arn,
        "TrackingServerStatus": status,
        "IsActive": if active { "Active" } else { "Inactive" },
        "TrackingServerUrl": s.url(),
        "WeeklyMaintenanceWindowStart": s.maintenance_window,
        "AutomaticModelRegistration": s.automatic_model_registration,
        "CreationTime": w.clock.epoch(s.created),
        "CreatedBy": user(),
        "LastModifiedTime": w.clock.epoch(s.modified),
        "LastModifiedBy": user(),
    }))
}

pub fn list(w: &mut Aws, region: &str, body: &Value) -> Result<Value, AwsError> {
    let now = w.clock.now();
    let stuck = w.mlflow_stuck();
    w.settle_mlflow();
    let status = str_field(body, "TrackingServerStatus");
    let version = str_field(body, "MlflowVersion");
    let after = body.get("CreatedAfter").and_then(Value::as_f64);
    let before = body.get("CreatedBefore").and_then(Value::as_f64);
    let mut servers: Vec<&Server> = w
        .sagemaker
        .mlflow
        .servers
        .values()
        .filter(|s| s.region == region)
        .filter(|s| status.is_none_or(|x| x == s.status(now, &stuck)))
        .filter(|s| version.is_none_or(|v| v == s.version))
        .filter(|s| after.is_none_or(|a| w.clock.epoch(s.created) > a))
        .filter(|s| before.is_none_or(|b| w.clock.epoch(s.created) < b))
        .collect();
    match str_field(body, "SortBy").unwrap_or("CreationTime") {
        "Name" => servers.sort_by(|a, b| a.name.cmp(&b.name)),
        "Status" => servers.sort_by_key(|s| s.status(now, &stuck)),
        _ => servers.sort_by(|a, b| a.created.total_cmp(&b.created)),
    }
    let (servers, next) = page(body, servers, Order::Descending)?;
    let summaries: Vec<Value> = servers
        .iter()
        .map(|s| {
            let status = s.status(now, &stuck);
            json!({
                "TrackingServerArn": s.arn(),
                "TrackingServerName": s.name,
                "CreationTime": w.clock.epoch(s.created),
                "LastModifiedTime": w.clock.epoch(s.modified),
                "TrackingServerStatus": status,
                "IsActive": if matches!(status, "Created" | "Updated" | "Updating") { "Active" } else { "Inactive" },
                "MlflowVersion": s.version,
            })
        })
        .collect();
    Ok(json!({ "TrackingServerSummaries": summaries, "NextToken": next }))
}

pub fn update(w: &mut Aws, body: &Value) -> Result<Value, AwsError> {
    let name = str_field(body, "TrackingServerName").unwrap_or_default();
    let now = w.clock.now();
    let stuck = w.mlflow_stuck();
    let uri = str_field(body, "ArtifactStoreUri");
    if let Some(uri) = uri {
        check_artifact_store(uri)?;
    }
    let size = str_field(body, "TrackingServerSize");
    if let Some(size) = size {
        check_size(size)?;
    }
    let window = str_field(body, "WeeklyMaintenanceWindowStart");
    if let Some(window) = window {
        check_window(window)?;
    }
    let s = w.tracking_server(name)?;
    let status = s.status(now, &stuck);
    if !matches!(status, "Created" | "Updated") {
        return Err(AwsError::new(
            400,
            "ConflictException",
            format!(
                "Tracking server {name} is {status}; it can be updated only when Created or Updated"
            ),
        ));
    }
    if let Some(uri) = uri {
        s.artifact_store_uri = uri.to_owned();
    }
    if let Some(size) = size {
        s.size = size.to_owned();
    }
    if let Some(window) = window {
        s.maintenance_window = Some(window.to_owned());
    }
    if let Some(auto) = body
        .get("AutomaticModelRegistration")
        .and_then(Value::as_bool)
    {
        s.automatic_model_registration = auto;
    }
    s.modified = now;
    s.phase = (Phase::Updating, now);
    Ok(json!({ "TrackingServerArn": s.arn() }))
}

pub fn delete(w: &mut Aws, body: &Value) -> Result<Value, AwsError> {
    let name = str_field(body, "TrackingServerName").unwrap_or_default();
    let now = w.clock.now();
    let stuck = w.mlflow_stuck();
    let s = w.tracking_server(name)?;
    let status = s.status(now, &stuck);
    if status == "Deleting" {
        return Err(validation(format!(
            "Tracking server {name} is already being deleted"
        )));
    }
    s.phase = (Phase::Deleting, now);
    Ok(json!({ "TrackingServerArn": s.arn() }))
}

pub fn presigned_url(w: &mut Aws, body: &Value) -> Result<Value, AwsError> {
    let name = str_field(body, "TrackingServerName").unwrap_or_default();
    let expires = body
        .get("ExpiresInSeconds")
        .and_then(Value::as_i64)
        .unwrap_or(300);
    if !(5..=300).contains(&expires) {
        return Err(validation(format!(
            "1 validation error detected: Value '{expires}' at 'expiresInSeconds' failed to satisfy constraint: Member must have value between 5 and 300"
        )));
    }
    let session = body
        .get("SessionExpirationDurationInSeconds")
        .and_then(Value::as_i64)
        .unwrap_or(43200);
    if !(1800..=43200).contains(&session) {
        return Err(validation(format!(
            "1 validation error detected: Value '{session}' at 'sessionExpirationDurationInSeconds' failed to satisfy constraint: Member must have value between 1800 and 43200"
        )));
    }
    let now = w.clock.now();
    let stuck = w.mlflow_stuck();
    let s = w.tracking_server(name)?;
    let status = s.status(now, &stuck);
    if !matches!(status, "Created" | "Updated" | "Updating") {
        return Err(validation(format!(
            "Tracking server {name} is {status}; a presigned URL needs a running tracking server"
        )));
    }
    let token = short_id(&format!("{}/{now}/{expires}", s.arn()));
    Ok(json!({
        "AuthorizedUrl": format!("{}/auth?authToken={token}&expiresIn={expires}", s.url())
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checks_inputs_as_sagemaker_does() {
        assert!(check_artifact_store("s3://bucket/mlflow").is_ok());
        assert!(check_artifact_store("s3://").is_err());
        assert!(check_artifact_store("https://bucket").is_err());
        assert!(check_window("Tue:03:30").is_ok());
        assert!(check_window("Tue:24:00").is_err());
        assert!(check_window("tue:03:30").is_err());
        assert!(check_server_name("exp-1").is_ok());
        assert!(check_server_name("-exp").is_err());
    }
}
