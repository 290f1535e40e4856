//! `create_mlflow_tracking_server`: the role SageMaker's MLflow uses for the shared
//! bucket, the tracking server (made once; one of that name already there is used), and
//! a wait until it is up. Nothing is changed in a server that exists: its size and store
//! are the user's once made.

use std::collections::BTreeMap;
use std::time::Duration;

use app::api::ApiError;
use app::api::mlflow::CreateMlflowTrackingServer;
use app::api::storage::SHARED_CLAIM;
use app::api::values::IdempotencyKey;
use serde::{Deserialize, Serialize};
use serde_json::json;

use crate::cluster::managed::locate;
use crate::operation::pipeline::{Context, Pipeline, Preflight, Progress, stages};
use crate::resources::iam::role::{RoleSpec, Trust};
use crate::resources::kube::{self as kubernetes};
use crate::resources::sagemaker::tracking_server::{self, Server, Spec};
use crate::resources::{Want, converge, is_planning};

stages! {
    pub enum Stage {
        Role = "role", "The IAM role SageMaker's MLflow assumes to keep artifacts in the shared bucket", true;
        Server = "server", "The tracking server made (or the one of that name used)", true;
        Available = "available", "The tracking server up (Created), about 20 minutes after it is made", true;
    }
}

/// What the stages found, stored with the operation. Field names are stored: never rename.
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct Outputs {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub role_arn: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tracking_server_arn: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<String>,
}

/// The role's name suffix (`hypd-<cluster>-mlflow`).
pub const ROLE_SUFFIX: &str = "mlflow";
/// Where in the shared bucket the server keeps artifacts.
pub const ARTIFACT_PREFIX: &str = "mlflow";

const POLL: Duration = Duration::from_secs(15);

/// The role: SageMaker may assume it, and it may read and write the bucket's `mlflow/`.
fn role_spec(bucket: &str) -> RoleSpec {
    let policy = json!({
        "Version": "2012-10-17",
        "Statement": [
            { "Effect": "Allow", "Action": ["s3:GetObject", "s3:PutObject", "s3:DeleteObject"],
              "Resource": format!("arn:aws:s3:::{bucket}/{ARTIFACT_PREFIX}/*") },
            { "Effect": "Allow", "Action": ["s3:ListBucket", "s3:GetBucketLocation"],
              "Resource": format!("arn:aws:s3:::{bucket}") },
        ],
    });
    RoleSpec {
        trust: Trust::Service("sagemaker.amazonaws.com".to_owned()),
        managed: Vec::new(),
        inline: BTreeMap::from([("artifacts".to_owned(), policy)]),
    }
}

/// The shared bucket of cluster `eks`: where artifacts go.
async fn shared_bucket(cx: &Context, region: &str, eks: &str) -> Result<String, ApiError> {
    let client = kubernetes::connect(&cx.aws, region, eks).await?;
    crate::storage::find(&client, SHARED_CLAIM)
        .await?
        .and_then(|s| s.bucket())
        .ok_or_else(|| {
            ApiError::field(
                "name",
                format!(
                    "{eks} has no shared bucket ({SHARED_CLAIM}) for MLflow's artifacts: reconcile_cluster makes it again"
                ),
            )
        })
}

impl Pipeline for CreateMlflowTrackingServer {
    type Stage = Stage;
    type Outputs = Outputs;

    fn target(&self) -> String {
        format!("cluster/{}/mlflow/{}", self.name, self.server_name())
    }

    fn idempotency_key(&self) -> Option<&IdempotencyKey> {
        self.idempotency_key.as_ref()
    }

    async fn preflight(self, cx: &Preflight<'_>) -> Result<Self, ApiError> {
        locate(
            cx.store,
            self.name.as_str(),
            "to make its MLflow tracking server",
        )
        .await?;
        Ok(self)
    }

    async fn step(
        &self,
        cx: &Context,
        stage: Stage,
        out: &mut Outputs,
    ) -> Result<Progress, ApiError> {
        let at = locate(
            &cx.store,
            self.name.as_str(),
            "to make its MLflow tracking server",
        )
        .await?;
        let sagemaker = cx.aws.sagemaker(&at.region);
        let name = self.server_name();
        match stage {
            Stage::Role => {
                let bucket = shared_bucket(cx, &at.region, &at.eks).await?;
                let role = crate::features::role(
                    &cx.aws,
                    &at.region,
                    &at.eks,
                    ROLE_SUFFIX,
                    Want::Present(role_spec(&bucket)),
                );
                out.role_arn = converge(&role).await?.arn;
                Ok(Progress::Done)
            }
            Stage::Server => {
                let bucket = shared_bucket(cx, &at.region, &at.eks).await?;
                let role_arn = match &out.role_arn {
                    Some(a) => a.clone(),
                    None => crate::features::role_arn(&cx.aws, &at.eks, ROLE_SUFFIX).await?,
                };
                let server = Server {
                    sagemaker,
                    name,
                    cluster: at.eks.clone(),
                    role_arn,
                    want: Want::Present(Spec {
                        artifact_store: format!("s3://{bucket}/{ARTIFACT_PREFIX}"),
                        size: self.size,
                    }),
                };
                if let Some(s) = converge(&server).await? {
                    out.tracking_server_arn = s.arn;
                    out.status = Some(s.status);
                }
                Ok(Progress::Done)
            }
            Stage::Available => {
                if is_planning() {
                    return Ok(Progress::Done);
                }
                let Some(s) = tracking_server::describe(&sagemaker, &name).await? else {
                    return Err(ApiError::Conflict {
                        message: format!("tracking server {name} was deleted before it was up"),
                        operation_id: None,
                        field: Some("tracking_server".into()),
                    });
                };
                tracking_server::check(&s)?;
                out.status = Some(s.status.clone());
                out.url = s.url.clone();
                out.tracking_server_arn = s.arn.clone();
                Ok(if s.up() {
                    Progress::Done
                } else {
                    Progress::wait(POLL, format!("tracking server {name} is {}", s.status))
                })
            }
        }
    }
}

/// What `delete_cluster` does with the cluster's tracking server: deletes it if hypd
/// made it (it uses hypd's role), waits until it is gone, then deletes the role; one
/// that is not hypd's is kept, and said so.
pub async fn teardown(
    aws: &crate::aws::Aws,
    region: &str,
    cluster: &str,
) -> Result<(Progress, Option<String>), ApiError> {
    let name = app::api::mlflow::default_server(cluster);
    let role_arn = crate::features::role_arn(aws, cluster, ROLE_SUFFIX).await?;
    let server = Server {
        sagemaker: aws.sagemaker(region),
        name: name.clone(),
        cluster: cluster.to_owned(),
        role_arn: role_arn.clone(),
        want: Want::Absent,
    };
    let left = converge(&server).await?;
    let mut kept = None;
    if let Some(s) = left {
        if s.role_arn.as_deref() == Some(role_arn.as_str()) {
            if !is_planning() {
                return Ok((
                    Progress::wait(POLL, format!("tracking server {name} is {}", s.status)),
                    None,
                ));
            }
        } else {
            kept = Some(format!(
                "MLflow tracking server {name}: not made by hypd (its role is not {role_arn}); delete it with `aws sagemaker delete-mlflow-tracking-server --tracking-server-name {name}`"
            ));
        }
    }
    let role = crate::features::role(aws, region, cluster, ROLE_SUFFIX, Want::Absent);
    converge(&role).await?;
    Ok((Progress::Done, kept))
}
