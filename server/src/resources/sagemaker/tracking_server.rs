//! A SageMaker managed MLflow tracking server, by name. Made once when missing, never
//! changed: one of that name already there (made by anyone) is the one the cluster's
//! jobs use, so a create whose answer was lost, or run again after a kill, finds it
//! instead of failing on the name. Deleted only when it uses hypd's role for the
//! cluster (SageMaker returns no tags with it, and a server on hypd's role is hypd's).

use app::api::ApiError;
use app::api::mlflow::TrackingServer;
use app::api::plan::{Action, Change, KNOWN_AFTER_APPLY};
use aws_sdk_sagemaker::types::{Tag, TrackingServerSize};
use serde_json::json;

use super::Client;
use crate::aws::{SdkResultExt, failed_state};
use crate::resources::{Resource, Want, tags};

const KIND: &str = "sagemaker:MlflowTrackingServer";

/// What a new server is made with.
#[derive(Clone, Debug, PartialEq)]
pub struct Spec {
    /// `s3://bucket/prefix`.
    pub artifact_store: String,
    pub size: app::api::mlflow::TrackingServerSize,
}

pub struct Server {
    pub sagemaker: Client,
    pub name: String,
    /// The cluster it is for, as a tag.
    pub cluster: String,
    /// hypd's role for the cluster's MLflow: the server's role when hypd made it.
    pub role_arn: String,
    pub want: Want<Spec>,
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Op {
    Create,
    Delete,
}

/// Tracking server `name` as SageMaker describes it, None when there is none.
pub async fn describe(sagemaker: &Client, name: &str) -> Result<Option<TrackingServer>, ApiError> {
    let Some(d) = sagemaker
        .describe_mlflow_tracking_server()
        .tracking_server_name(name)
        .send()
        .await
        .found("sagemaker", "DescribeMlflowTrackingServer")?
    else {
        return Ok(None);
    };
    Ok(Some(TrackingServer {
        name: name.to_owned(),
        arn: d.tracking_server_arn().map(str::to_owned),
        status: d
            .tracking_server_status()
            .map_or("Unknown", |s| s.as_str())
            .to_owned(),
        url: d.tracking_server_url().map(str::to_owned),
        artifact_store: d.artifact_store_uri().map(str::to_owned),
        size: d.tracking_server_size().map(|s| s.as_str().to_owned()),
        mlflow_version: d.mlflow_version().map(str::to_owned),
        role_arn: d.role_arn().map(str::to_owned),
    }))
}

/// An error when `server` failed in a way waiting cannot mend.
pub fn check(server: &TrackingServer) -> Result<(), ApiError> {
    match server.status.as_str() {
        s @ ("CreateFailed" | "UpdateFailed" | "DeleteFailed" | "Deleting") => Err(failed_state(
            "sagemaker",
            "DescribeMlflowTrackingServer",
            Some(s),
            format!(
                "tracking server {} is {s}: delete it in SageMaker and create it again",
                server.name
            ),
        )),
        _ => Ok(()),
    }
}

impl Resource for Server {
    type Observed = Option<TrackingServer>;
    type Op = Op;

    async fn observe(&self) -> Result<Self::Observed, ApiError> {
        describe(&self.sagemaker, &self.name).await
    }

    fn diff(&self, observed: &Self::Observed) -> Result<Vec<Op>, ApiError> {
        Ok(match (&self.want, observed) {
            (Want::Present(_), None) => vec![Op::Create],
            (Want::Absent, Some(s))
                if s.role_arn.as_deref() == Some(self.role_arn.as_str())
                    && s.status != "Deleting" =>
            {
                vec![Op::Delete]
            }
            _ => Vec::new(),
        })
    }

    async fn apply(&self, op: &Op, observed: &mut Self::Observed) -> Result<(), ApiError> {
        let spec = match (op, &self.want) {
            (Op::Create, Want::Present(spec)) => spec,
            _ => {
                self.sagemaker
                    .delete_mlflow_tracking_server()
                    .tracking_server_name(&self.name)
                    .send()
                    .await
                    .found("sagemaker", "DeleteMlflowTrackingServer")?;
                if let Some(s) = observed {
                    s.status = "Deleting".to_owned();
                }
                return Ok(());
            }
        };
        let mut request = self
            .sagemaker
            .create_mlflow_tracking_server()
            .tracking_server_name(&self.name)
            .artifact_store_uri(&spec.artifact_store)
            .tracking_server_size(TrackingServerSize::from(spec.size.as_str()))
            .role_arn(&self.role_arn)
            .automatic_model_registration(false);
        for (key, value) in tags::of_cluster(&self.cluster) {
            request = request.tags(Tag::builder().key(key).value(value).build());
        }
        // A create whose answer was lost fails the step; run again, its observe finds
        // the server that create made.
        request
            .send()
            .await
            .upstream("sagemaker", "CreateMlflowTrackingServer")?;
        *observed = describe(&self.sagemaker, &self.name).await?;
        Ok(())
    }

    fn describe(&self, op: &Op, _: &Self::Observed) -> Change {
        match (op, &self.want) {
            (Op::Create, Want::Present(spec)) => Change::new(Action::Create, KIND, &self.name)
                .field("ArtifactStoreUri", None, Some(json!(spec.artifact_store)))
                .field("TrackingServerSize", None, Some(json!(spec.size.as_str())))
                .field("RoleArn", None, Some(json!(self.role_arn))),
            _ => Change::new(Action::Delete, KIND, &self.name),
        }
    }

    fn assume(&self, op: &Op, observed: &mut Self::Observed) {
        match (op, &self.want) {
            (Op::Create, Want::Present(spec)) => {
                *observed = Some(TrackingServer {
                    name: self.name.clone(),
                    arn: Some(KNOWN_AFTER_APPLY.to_owned()),
                    status: "Creating".to_owned(),
                    url: None,
                    artifact_store: Some(spec.artifact_store.clone()),
                    size: Some(spec.size.as_str().to_owned()),
                    mlflow_version: None,
                    role_arn: Some(self.role_arn.clone()),
                })
            }
            _ => *observed = None,
        }
    }
}
