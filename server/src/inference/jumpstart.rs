//! `deploy_jumpstart_model` and `list_jumpstart_models`: a SageMaker public hub model,
//! deployed by the inference operator from a `JumpStartModel`, with the same KV cache
//! and routing options as an InferenceEndpointConfig when the hub serves it with vLLM. The hub's
//! DescribeHubContent is the one authority on what a model runs on and whether its
//! licence must be accepted: the pre-flight asks it and refuses by field what the
//! operator would only fail later, and pins the version and group it checked, so a
//! resumed operation deploys exactly that. What the operator makes of the object (its
//! Deployment `<name>`, pods `app=<name>`, Service `<name>-service`) is read, never
//! written.

use app::api::ApiError;
use app::api::inference::{ENDPOINT_LABEL, Engine, NAMESPACE, operator_option_errors};
use app::api::jumpstart::{
    CatalogueModel, DeployJumpstartModel, JumpstartCatalogue, ListJumpstartModels, PORT, PUBLIC_HUB,
};
use app::api::values::{HubModelVersion, IdempotencyKey, InstanceGroupName};
use aws_sdk_sagemaker::types::HubContentType;
use futures_util::{StreamExt, TryStreamExt};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Api;
use serde_json::{Value, json};

use super::deploy::{self, Outputs};
use super::endpoint_config::operator_options;
use super::workload::{
    ENGINE_LABEL, GROUP_ANNOTATION, MODEL_ANNOTATION, OPERATION_ANNOTATION, PORT_ANNOTATION,
};
use crate::auth::Actor;
use crate::aws::{Aws, SdkResultExt};
use crate::cluster::managed::{Where, locate};
use crate::operation::pipeline::{Context, Pipeline, Preflight, Progress, stages};
use crate::resources::converge;
use crate::resources::kube::inference::JumpStartModel;
use crate::resources::kube::object::Applied;
use crate::resources::kube::{self as kubernetes};
use crate::resources::tags::K8S_MANAGED_BY;
use crate::service::{Handler, Service};
use crate::training::check::{Group, groups};

stages! {
    pub enum Stage {
        Model = "model", "The JumpStartModel applied: the inference operator fetches the model from the hub and makes its workers and Service", true;
        Ready = "ready", "The operator reports the deployment complete, every replica ready", true;
    }
}

pub(crate) const JUMPSTART_CRD: &str = "jumpstartmodels.inference.sagemaker.aws.amazon.com";
/// A JumpStartModel as plans name it.
pub(crate) const JUMPSTART_KIND: &str = "k8s:inference.sagemaker.aws.amazon.com/v1/JumpStartModel";

/// Models list_jumpstart_models describes in one answer (one DescribeHubContent each);
/// a search narrows the rest.
const DESCRIBED_AT_MOST: usize = 20;
const DESCRIBED_AT_ONCE: usize = 8;

/// What the hub says of one version of a model.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct HubModel {
    pub id: String,
    pub version: String,
    pub display_name: String,
    pub description: String,
    /// The serving image (`<registry>/<repository>:<tag>`).
    pub image: String,
    pub gated: bool,
    pub eula: Option<String>,
    pub default_instance_type: String,
    pub instance_types: Vec<String>,
}

impl HubModel {
    /// From DescribeHubContent's answer: its JSON document says how the model is hosted.
    fn parse(
        id: &str,
        version: &str,
        display_name: Option<&str>,
        description: Option<&str>,
        document: &str,
    ) -> Result<Self, String> {
        let doc: Value = serde_json::from_str(document)
            .map_err(|e| format!("the hub's document of {id} {version} is not JSON: {e}"))?;
        let text = |k: &str| doc[k].as_str().unwrap_or_default().to_owned();
        Ok(HubModel {
            id: id.to_owned(),
            version: version.to_owned(),
            display_name: display_name.unwrap_or(id).to_owned(),
            description: description.unwrap_or_default().to_owned(),
            image: text("HostingEcrUri"),
            gated: doc["GatedBucket"] == true,
            eula: doc["HostingEulaUri"].as_str().map(str::to_owned),
            default_instance_type: text("DefaultInferenceInstanceType"),
            instance_types: doc["SupportedInferenceInstanceTypes"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|t| t.as_str().map(str::to_owned))
                .collect(),
        })
    }

    /// The serving engine, as the image's repository names it (`vllm`, `djl-inference`...).
    pub fn engine(&self) -> &str {
        let path = self.image.rsplit('/').next().unwrap_or_default();
        path.split([':', '@']).next().unwrap_or_default()
    }

    /// Of `groups`, those of a type the model runs on.
    fn fitting<'a>(&self, groups: &'a [Group]) -> Vec<&'a Group> {
        groups
            .iter()
            .filter(|g| self.instance_types.contains(&g.instance_type))
            .collect()
    }
}

/// Model `id` (at `version`, else its latest) as the public hub describes it; none when
/// the hub has no such model or version.
pub(crate) async fn described(
    aws: &Aws,
    region: &str,
    id: &str,
    version: Option<&str>,
) -> Result<Option<HubModel>, ApiError> {
    let Some(out) = aws
        .sagemaker(region)
        .describe_hub_content()
        .hub_name(PUBLIC_HUB)
        .hub_content_type(HubContentType::Model)
        .hub_content_name(id)
        .set_hub_content_version(version.map(str::to_owned))
        .send()
        .await
        .found("sagemaker", "DescribeHubContent")?
    else {
        return Ok(None);
    };
    HubModel::parse(
        out.hub_content_name().unwrap_or(id),
        out.hub_content_version().unwrap_or_default(),
        out.hub_content_display_name(),
        out.hub_content_description(),
        out.hub_content_document().unwrap_or("{}"),
    )
    .map(Some)
    .map_err(ApiError::internal)
}

/// The group the model runs on: the one asked for, if the model supports its type, else
/// the cluster's one group of a supported type; why not, by field.
fn choose<'a>(
    model: &HubModel,
    groups: &'a [Group],
    asked: Option<&InstanceGroupName>,
    cluster: &str,
) -> Result<&'a Group, ApiError> {
    let supported = model.instance_types.join(", ");
    let id = &model.id;
    if let Some(asked) = asked {
        let group = groups
            .iter()
            .find(|g| g.name == asked.as_str())
            .ok_or_else(|| {
                let names: Vec<&str> = groups.iter().map(|g| g.name.as_str()).collect();
                ApiError::field(
                    "instance_group",
                    format!(
                        "{cluster} has no instance group {asked} (it has {})",
                        names.join(", ")
                    ),
                )
            })?;
        if !model.instance_types.contains(&group.instance_type) {
            return Err(ApiError::field(
                "instance_group",
                format!(
                    "group {asked} is {}, which {id} does not run on (it supports {supported}): choose a group of one of those, or add one with add_instance_group",
                    group.instance_type
                ),
            ));
        }
        return Ok(group);
    }
    match model.fitting(groups).as_slice() {
        [one] => Ok(one),
        [] => {
            let have: Vec<String> = groups
                .iter()
                .map(|g| format!("{} {}", g.name, g.instance_type))
                .collect();
            Err(ApiError::field(
                "instance_group",
                format!(
                    "none of {cluster}'s groups ({}) is of a type {id} runs on ({supported}): add one with add_instance_group (the hub suggests {})",
                    have.join(", "),
                    model.default_instance_type
                ),
            ))
        }
        several => {
            let names: Vec<&str> = several.iter().map(|g| g.name.as_str()).collect();
            Err(ApiError::field(
                "instance_group",
                format!(
                    "several groups can run {id} ({}): name one in instance_group",
                    names.join(", ")
                ),
            ))
        }
    }
}

/// The request's model as the hub has it, or why not by field: an unknown model or
/// version, or a gated model whose licence is not accepted.
async fn model_of(r: &DeployJumpstartModel, aws: &Aws, at: &Where) -> Result<HubModel, ApiError> {
    let id = r.model_id.as_str();
    let version = r.model_version.as_ref().map(HubModelVersion::as_str);
    let model = match described(aws, &at.region, id, version).await? {
        Some(m) => m,
        None => {
            let latest = match version {
                Some(_) => described(aws, &at.region, id, None).await?,
                None => None,
            };
            return Err(match (latest, version) {
                (Some(latest), Some(version)) => ApiError::field(
                    "model_version",
                    format!(
                        "{id} has no version {version} in {PUBLIC_HUB} (its latest is {}): drop model_version for the latest",
                        latest.version
                    ),
                ),
                _ => ApiError::field(
                    "model_id",
                    format!(
                        "{PUBLIC_HUB} has no model {id} in {}: list_jumpstart_models shows what it has",
                        at.region
                    ),
                ),
            });
        }
    };
    if model.gated && !r.accept_eula {
        return Err(ApiError::field(
            "accept_eula",
            format!(
                "{id} is gated: deploying it accepts its licence ({}); ask the user to read it, then set accept_eula: true",
                model.eula.as_deref().unwrap_or("see the model's page")
            ),
        ));
    }
    Ok(model)
}

/// The object: `replicas` workers of the hub's model version on nodes of the group's
/// type. Pure: the dry run's plan is the object the step applies.
pub(crate) fn object(
    r: &DeployJumpstartModel,
    model: &HubModel,
    group: &Group,
    operation: &str,
) -> JumpStartModel {
    let mut spec = json!({
        "model": {
            "modelHubName": PUBLIC_HUB,
            "modelId": model.id,
            "modelVersion": model.version,
            "acceptEula": r.accept_eula,
        },
        "server": { "instanceType": group.instance_type },
        "replicas": r.replicas.get(),
    });
    operator_options(&mut spec, r.kv_cache.as_ref(), r.routing);
    let annotations = [
        (MODEL_ANNOTATION, model.id.clone()),
        (PORT_ANNOTATION, PORT.to_string()),
        (OPERATION_ANNOTATION, operation.to_owned()),
        (GROUP_ANNOTATION, group.name.clone()),
    ];
    let labels = [
        (ENDPOINT_LABEL, r.endpoint.as_str()),
        (ENGINE_LABEL, model.engine()),
        K8S_MANAGED_BY,
    ];
    let metadata = ObjectMeta {
        name: Some(r.endpoint.to_string()),
        namespace: Some(NAMESPACE.to_owned()),
        labels: Some(
            labels
                .into_iter()
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
                .collect(),
        ),
        annotations: Some(
            annotations
                .into_iter()
                .map(|(k, v)| (k.to_owned(), v))
                .collect(),
        ),
        ..ObjectMeta::default()
    };
    JumpStartModel::new(metadata, spec)
}

/// The operator's options work with vLLM workers only, and the hub's image says what
/// the model's workers run.
fn options_fit(r: &DeployJumpstartModel, model: &HubModel) -> Result<(), ApiError> {
    ApiError::unless_broken(operator_option_errors(
        r.kv_cache.as_ref(),
        r.routing,
        (model.engine() != Engine::Vllm.as_str()).then(|| {
            (
                format!("the hub serves {} with {}", model.id, model.image),
                "deploy the model with deploy_inference_endpoint and a vllm serve command",
            )
        }),
    ))
}

/// The cluster's groups, with their types' GPUs.
async fn cluster_groups(aws: &Aws, at: &Where) -> Result<Vec<Group>, ApiError> {
    let described =
        crate::resources::sagemaker::described(&aws.sagemaker(&at.region), &at.hyperpod).await?;
    groups(aws, &at.region, &described).await
}

impl Pipeline for DeployJumpstartModel {
    type Stage = Stage;
    type Outputs = Outputs;

    fn target(&self) -> String {
        super::target(&self.name, &self.endpoint)
    }

    fn idempotency_key(&self) -> Option<&IdempotencyKey> {
        self.idempotency_key.as_ref()
    }

    async fn preflight(mut self, cx: &Preflight<'_>) -> Result<Self, ApiError> {
        let cluster = self.name.as_str();
        let endpoint = self.endpoint.as_str();
        let at = locate(cx.store, cluster, "to deploy inference endpoints").await?;
        let client = kubernetes::connect(cx.aws, &at.region, &at.eks).await?;
        super::managed::operator_serves(
            &client,
            cluster,
            (JUMPSTART_CRD, JumpStartModel::KIND),
            "",
        )
        .await?;
        deploy::free(&client, cluster, endpoint).await?;
        let models = Api::<JumpStartModel>::namespaced(client.clone(), NAMESPACE);
        if kubernetes::get(&models, endpoint).await?.is_some() {
            return Err(ApiError::field(
                "endpoint",
                format!(
                    "{cluster} already has a JumpStartModel named {endpoint} in {NAMESPACE}: choose another name, or delete_endpoint first"
                ),
            ));
        }
        let model = model_of(&self, cx.aws, &at).await?;
        options_fit(&self, &model)?;
        super::managed::tier_kept(self.kv_cache.as_ref(), cx.aws, &at, cluster).await?;
        let groups = cluster_groups(cx.aws, &at).await?;
        let group = choose(&model, &groups, self.instance_group.as_ref(), cluster)?;
        self.instance_group =
            Some(InstanceGroupName::parse(&group.name).map_err(ApiError::internal)?);
        self.model_version =
            Some(HubModelVersion::parse(&model.version).map_err(ApiError::internal)?);
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
            "to deploy inference endpoints",
        )
        .await?;
        let client = kubernetes::connect(&cx.aws, &at.region, &at.eks).await?;
        let endpoint = self.endpoint.as_str();
        out.endpoint = Some(format!("{NAMESPACE}/{endpoint}"));
        out.model = Some(self.model_id.to_string());
        match stage {
            Stage::Model => {
                deploy::claim::<JumpStartModel>(&client, endpoint, &cx.operation_id, false).await?;
                let model = model_of(self, &cx.aws, &at).await?;
                let groups = cluster_groups(&cx.aws, &at).await?;
                let group = choose(
                    &model,
                    &groups,
                    self.instance_group.as_ref(),
                    self.name.as_str(),
                )?;
                out.instance_group = Some(group.name.clone());
                let object = object(self, &model, group, &cx.operation_id);
                converge(&Applied::namespaced(&client, object)).await?;
                Ok(Progress::Done)
            }
            Stage::Ready => {
                deploy::ready(
                    &client,
                    (self.name.as_str(), endpoint),
                    JUMPSTART_KIND,
                    self.replicas.get(),
                    app::api::inference::ServiceShape::ClusterIp,
                    out,
                )
                .await
            }
        }
    }
}

impl Handler<ListJumpstartModels> for Service {
    async fn handle(
        &self,
        _: &Actor,
        r: ListJumpstartModels,
    ) -> Result<JumpstartCatalogue, ApiError> {
        let cluster = r.name.as_str();
        let at = locate(&self.store, cluster, "to list its catalogue models").await?;
        let sagemaker = self.aws.sagemaker(&at.region);
        let mut ids: Vec<String> = Vec::new();
        let mut next = None;
        loop {
            let page = sagemaker
                .list_hub_contents()
                .hub_name(PUBLIC_HUB)
                .hub_content_type(HubContentType::Model)
                .set_name_contains(r.search.clone().filter(|s| !s.is_empty()))
                .max_results(100)
                .set_next_token(next)
                .send()
                .await
                .upstream("sagemaker", "ListHubContents")?;
            ids.extend(
                page.hub_content_summaries()
                    .iter()
                    .filter_map(|s| s.hub_content_name().map(str::to_owned)),
            );
            next = page
                .next_token()
                .filter(|t| !t.is_empty())
                .map(str::to_owned);
            if next.is_none() {
                break;
            }
        }
        ids.sort();
        let more = ids.len().saturating_sub(DESCRIBED_AT_MOST);
        ids.truncate(DESCRIBED_AT_MOST);
        let groups = cluster_groups(&self.aws, &at).await?;
        let aws = &self.aws;
        let region = at.region.as_str();
        let models: Vec<Option<HubModel>> = futures_util::stream::iter(ids)
            .map(|id| async move { described(aws, region, &id, None).await })
            .buffered(DESCRIBED_AT_ONCE)
            .try_collect()
            .await?;
        Ok(JumpstartCatalogue {
            models: models
                .into_iter()
                .flatten()
                .map(|m| CatalogueModel {
                    groups: m.fitting(&groups).iter().map(|g| g.name.clone()).collect(),
                    model_id: m.id,
                    version: m.version,
                    display_name: m.display_name,
                    description: m.description,
                    gated: m.gated,
                    eula: m.eula,
                    default_instance_type: m.default_instance_type,
                    instance_types: m.instance_types,
                })
                .collect(),
            more,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn model() -> HubModel {
        HubModel::parse(
            "meta-textgeneration-llama-3-1-8b-instruct",
            "2.8.0",
            Some("Llama 3.1 8B Instruct"),
            None,
            r#"{"HostingEcrUri":"763104351884.dkr.ecr.us-west-2.amazonaws.com/vllm:0.11.0-gpu-py312","GatedBucket":true,"HostingEulaUri":"s3://x/eula.txt","DefaultInferenceInstanceType":"ml.g5.2xlarge","SupportedInferenceInstanceTypes":["ml.g5.2xlarge","ml.g5.8xlarge"]}"#,
        )
        .unwrap()
    }

    fn group(name: &str, instance_type: &str) -> Group {
        Group {
            name: name.into(),
            instance_type: instance_type.into(),
            spot: false,
            gpus: 1,
            efa: 0,
        }
    }

    #[test]
    fn the_hub_document_says_the_image_engine_licence_and_types() {
        let m = model();
        assert_eq!(m.engine(), "vllm");
        assert!(m.gated);
        assert_eq!(m.eula.as_deref(), Some("s3://x/eula.txt"));
        assert_eq!(m.instance_types, ["ml.g5.2xlarge", "ml.g5.8xlarge"]);
    }

    #[test]
    fn a_group_is_chosen_only_among_the_types_the_model_runs_on() {
        let m = model();
        let groups = [group("cpu", "ml.m5.xlarge"), group("gpu", "ml.g5.8xlarge")];
        assert_eq!(choose(&m, &groups, None, "c").unwrap().name, "gpu");
        let cpu = InstanceGroupName::parse("cpu").unwrap();
        let e = choose(&m, &groups, Some(&cpu), "c")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("ml.m5.xlarge, which") && e.contains("instance_group"),
            "{e}"
        );
        let two = [group("a", "ml.g5.8xlarge"), group("b", "ml.g5.2xlarge")];
        let e = choose(&m, &two, None, "c").unwrap_err().to_string();
        assert!(e.contains("several groups can run"), "{e}");
        let e = choose(&m, &groups[..1], None, "c").unwrap_err().to_string();
        assert!(e.contains("the hub suggests ml.g5.2xlarge"), "{e}");
    }

    #[test]
    fn the_object_pins_the_version_and_the_type() {
        let r: DeployJumpstartModel = serde_json::from_value(json!({
            "name": "c", "endpoint": "llama", "model_id": "meta-textgeneration-llama-3-1-8b-instruct",
            "accept_eula": true, "replicas": 2,
        }))
        .unwrap();
        let o = object(&r, &model(), &group("gpu", "ml.g5.8xlarge"), "op-1");
        assert_eq!(o.spec["model"]["modelVersion"], "2.8.0");
        assert_eq!(o.spec["server"]["instanceType"], "ml.g5.8xlarge");
        assert_eq!(o.spec["replicas"], 2);
        assert!(
            o.spec.get("kvCacheSpec").is_none() && o.spec.get("intelligentRoutingSpec").is_none()
        );
        assert_eq!(o.metadata.labels.unwrap()[ENDPOINT_LABEL], "llama");
    }

    #[test]
    fn the_operators_options_go_in_the_object_for_a_model_the_hub_serves_with_vllm() {
        let r: DeployJumpstartModel = serde_json::from_value(json!({
            "name": "c", "endpoint": "llama", "model_id": "meta-textgeneration-llama-3-1-8b-instruct",
            "accept_eula": true, "routing": "session",
            "kv_cache": { "l2": { "backend": "redis", "url": "redis://kv.internal:6379" } },
        }))
        .unwrap();
        options_fit(&r, &model()).unwrap();
        let o = object(&r, &model(), &group("gpu", "ml.g5.8xlarge"), "op-1");
        assert_eq!(
            o.spec["kvCacheSpec"],
            json!({ "enableL1Cache": true, "enableL2Cache": true,
                    "l2CacheSpec": { "l2CacheBackend": "redis", "l2CacheLocalUrl": "redis://kv.internal:6379" } })
        );
        assert_eq!(
            o.spec["intelligentRoutingSpec"],
            json!({ "enabled": true, "routingStrategy": "session" })
        );

        // A model the hub serves with another container: both options refused, by field,
        // naming the image.
        let mut tgi = model();
        tgi.image = "763104351884.dkr.ecr.us-west-2.amazonaws.com/huggingface-pytorch-tgi-inference:2.4.0-tgi2.3.1-gpu-py311-cu124-ubuntu22.04".into();
        let ApiError::Validation { errors } = options_fit(&r, &tgi).unwrap_err() else {
            panic!("a validation error");
        };
        let fields: Vec<&str> = errors.iter().map(|e| e.field.as_str()).collect();
        assert_eq!(fields, ["kv_cache", "routing"]);
        assert!(
            errors[1].message.contains("vLLM workers only")
                && errors[1]
                    .message
                    .contains("huggingface-pytorch-tgi-inference"),
            "{}",
            errors[1].message
        );
        let plain: DeployJumpstartModel = serde_json::from_value(json!({
            "name": "c", "endpoint": "llama", "model_id": "m",
        }))
        .unwrap();
        options_fit(&plain, &tgi).unwrap();
    }
}
