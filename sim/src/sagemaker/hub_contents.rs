//! The SageMaker public model hub (`SageMakerPublicHub`) as DescribeHubContent and
//! ListHubContents serve it: a fixed catalogue of JumpStart text-generation models, each
//! served by the AWS vLLM deep learning container. The catalogue is read both by these
//! calls and by the JumpStartModel controller (the real operator asks DescribeHubContent
//! itself), so everything a client is told about a model — its image, artifacts,
//! instance types, EULA — is one function of the model, its version and the region.

use serde_json::{Value, json};

use super::{Order, check_hyphenated, page, str_field, validation};
use crate::world::AwsError;

/// The only hub there is: private hubs (CreateHub) are not simulated.
pub const PUBLIC_HUB: &str = "SageMakerPublicHub";
/// The HubContentDocument schema the catalogue's documents follow.
pub const DOCUMENT_SCHEMA_VERSION: &str = "2.3.0";
/// HubContentType's values, in the API reference's order.
const CONTENT_TYPES: &[&str] = &["Model", "Notebook", "ModelReference", "DataSet", "JsonDoc"];
/// The only type with contents in the public hub as the sim keeps it.
const MODEL: &str = "Model";
/// The account AWS publishes its deep learning containers from, and the vLLM one's tag.
const DLC_ACCOUNT: &str = "763104351884";
const VLLM_IMAGE: &str = "vllm:0.11.0-gpu-py312";
const VERSION_PATTERN: &str = r"^\d{1,4}.\d{1,4}.\d{1,4}$";

/// One version of one model of the catalogue.
#[derive(Debug)]
pub struct CatalogueModel {
    /// The HubContentName (JumpStart's model id).
    pub name: &'static str,
    pub version: &'static str,
    pub display_name: &'static str,
    pub description: &'static str,
    /// Whether the model's weights are behind a EULA the deployer must accept.
    pub gated: bool,
    pub supported_instance_types: &'static [&'static str],
    pub default_instance_type: &'static str,
    /// When this version was published (epoch seconds): fixed, so every run lists the
    /// same times.
    pub created: i64,
    /// The model's page (the document's `Url`).
    url: &'static str,
    /// The context length the container is configured with (`OPTION_MAX_MODEL_LEN`).
    max_model_len: u32,
    /// The EULA's file under `fmhMetadata/eula/` of the region's cache bucket (gated only).
    eula: Option<&'static str>,
}

const QWEN_TYPES: &[&str] = &[
    "ml.g5.2xlarge",
    "ml.g5.4xlarge",
    "ml.g5.8xlarge",
    "ml.g5.12xlarge",
    "ml.g6.2xlarge",
    "ml.g6.12xlarge",
];
const LLAMA_8B_TYPES: &[&str] = &[
    "ml.g5.2xlarge",
    "ml.g5.8xlarge",
    "ml.g5.12xlarge",
    "ml.g5.48xlarge",
    "ml.p4d.24xlarge",
];
const DEEPSEEK_TYPES: &[&str] = &["ml.g5.xlarge", "ml.g5.2xlarge", "ml.g6.xlarge"];
const LLAMA_70B_TYPES: &[&str] = &["ml.g5.48xlarge", "ml.p4d.24xlarge", "ml.p5.48xlarge"];

const QWEN: CatalogueModel = CatalogueModel {
    name: "huggingface-llm-qwen2-5-7b-instruct",
    version: "1.0.0",
    display_name: "Qwen2.5 7B Instruct",
    description: "Qwen2.5 7B Instruct is an instruction-tuned 7-billion-parameter language model from Alibaba Cloud's Qwen team, for chat, coding and long-context tasks.",
    gated: false,
    supported_instance_types: QWEN_TYPES,
    default_instance_type: "ml.g5.2xlarge",
    created: 1_727_740_800,
    url: "https://huggingface.co/Qwen/Qwen2.5-7B-Instruct",
    max_model_len: 32_768,
    eula: None,
};
const LLAMA_8B: CatalogueModel = CatalogueModel {
    name: "meta-textgeneration-llama-3-1-8b-instruct",
    version: "2.0.0",
    display_name: "Llama 3.1 8B Instruct",
    description: "Llama 3.1 8B Instruct is Meta's instruction-tuned 8-billion-parameter model, optimised for multilingual dialogue.",
    gated: true,
    supported_instance_types: LLAMA_8B_TYPES,
    default_instance_type: "ml.g5.2xlarge",
    created: 1_721_692_800,
    url: "https://ai.meta.com/blog/meta-llama-3-1/",
    max_model_len: 8_192,
    eula: Some("llama3_1Eula.txt"),
};
const DEEPSEEK: CatalogueModel = CatalogueModel {
    name: "deepseek-llm-r1-distill-qwen-1-5b",
    version: "1.0.0",
    display_name: "DeepSeek-R1 Distill Qwen 1.5B",
    description: "DeepSeek-R1 Distill Qwen 1.5B is a small reasoning model distilled from DeepSeek-R1 into Qwen2.5-Math-1.5B.",
    gated: false,
    supported_instance_types: DEEPSEEK_TYPES,
    default_instance_type: "ml.g5.xlarge",
    created: 1_738_108_800,
    url: "https://huggingface.co/deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B",
    max_model_len: 32_768,
    eula: None,
};
const LLAMA_70B: CatalogueModel = CatalogueModel {
    name: "meta-textgeneration-llama-3-3-70b-instruct",
    version: "1.0.0",
    display_name: "Llama 3.3 70B Instruct",
    description: "Llama 3.3 70B Instruct is Meta's instruction-tuned 70-billion-parameter model for multilingual dialogue, text only.",
    gated: true,
    supported_instance_types: LLAMA_70B_TYPES,
    default_instance_type: "ml.p4d.24xlarge",
    created: 1_733_443_200,
    url: "https://www.llama.com/docs/model-cards-and-prompt-formats/llama3_3/",
    max_model_len: 8_192,
    eula: Some("llama3_3Eula.txt"),
};

/// Every version of every model; a model's versions ascending, so its latest is its last.
static CATALOGUE: &[CatalogueModel] = &[
    QWEN,
    CatalogueModel {
        version: "1.2.0",
        created: 1_740_787_200,
        ..QWEN
    },
    LLAMA_8B,
    CatalogueModel {
        version: "2.8.0",
        created: 1_743_465_600,
        ..LLAMA_8B
    },
    DEEPSEEK,
    LLAMA_70B,
];

/// Every version of every model in the catalogue.
pub fn all() -> impl DoubleEndedIterator<Item = &'static CatalogueModel> {
    CATALOGUE.iter()
}

/// The latest version of each model, sorted by name.
pub fn latest() -> Vec<&'static CatalogueModel> {
    let mut out: Vec<&CatalogueModel> = all()
        .filter(|m| model(m.name, None).is_some_and(|l| l.version == m.version))
        .collect();
    out.sort_by_key(|m| m.name);
    out
}

/// Model `name` at `version`, or at its latest version.
pub fn model(name: &str, version: Option<&str>) -> Option<&'static CatalogueModel> {
    let mut versions = all().filter(|m| m.name == name);
    match version {
        Some(v) => versions.find(|m| m.version == v),
        None => versions.next_back(),
    }
}

/// The versions of model `name`, ascending (none: no such model).
pub fn versions(name: &str) -> Vec<&'static str> {
    all()
        .filter(|m| m.name == name)
        .map(|m| m.version)
        .collect()
}

/// The public hub's ARN in `region`.
pub fn hub_arn(region: &str) -> String {
    format!("arn:aws:sagemaker:{region}:aws:hub/{PUBLIC_HUB}")
}

/// Whether `name_or_arn` names the public hub of `region` (a hub ARN is regional).
pub fn is_public_hub(name_or_arn: &str, region: &str) -> bool {
    name_or_arn == PUBLIC_HUB || name_or_arn == hub_arn(region)
}

impl CatalogueModel {
    pub fn arn(&self, region: &str) -> String {
        format!(
            "arn:aws:sagemaker:{region}:aws:hub-content/{PUBLIC_HUB}/{MODEL}/{}/{}",
            self.name, self.version
        )
    }

    /// The vLLM deep learning container's image in `region` (the document's
    /// `HostingEcrUri`).
    pub fn hosting_ecr_uri(&self, region: &str) -> String {
        format!("{DLC_ACCOUNT}.dkr.ecr.{region}.amazonaws.com/{VLLM_IMAGE}")
    }

    /// Where the prepacked weights are in the region's JumpStart cache bucket.
    pub fn hosting_artifact_uri(&self, region: &str) -> String {
        format!(
            "s3://jumpstart-cache-prod-{region}/{}/artifacts/inference-prepack/v{}/",
            self.name, self.version
        )
    }

    /// The EULA a gated model's deployer accepts (none for an open model).
    pub fn eula_uri(&self, region: &str) -> Option<String> {
        self.eula
            .map(|file| format!("s3://jumpstart-cache-prod-{region}/fmhMetadata/eula/{file}"))
    }

    pub fn supports(&self, instance_type: &str) -> bool {
        self.supported_instance_types.contains(&instance_type)
    }

    /// The HubContentDocument, JumpStart's own keys, as a JSON value (the API sends it
    /// as a string).
    pub fn document(&self, region: &str) -> Value {
        let env = |name: &str, description: &str, default: String| {
            json!({ "Name": name, "Type": "text", "Description": description,
                    "Default": default, "Scope": "container" })
        };
        let mut doc = json!({
            "Url": self.url,
            "MinSdkVersion": "2.225.0",
            "HostingEcrUri": self.hosting_ecr_uri(region),
            "HostingArtifactUri": self.hosting_artifact_uri(region),
            "DefaultInferenceInstanceType": self.default_instance_type,
            "SupportedInferenceInstanceTypes": self.supported_instance_types,
            "InferenceEnvironmentVariables": [
                env("SM_NUM_GPUS", "The number of GPUs the model is sharded over.", "1".to_owned()),
                env("OPTION_MAX_MODEL_LEN", "The model's maximum context length, in tokens.",
                    self.max_model_len.to_string()),
                env("ENDPOINT_SERVER_TIMEOUT", "Seconds the server waits for a request to finish.",
                    "3600".to_owned()),
                env("SAGEMAKER_ENV", "Marks the container as running on SageMaker.", "1".to_owned()),
            ],
            "GatedBucket": self.gated,
        });
        if let Some(eula) = self.eula_uri(region) {
            doc["HostingEulaUri"] = json!(eula);
        }
        doc
    }

    /// What ListHubContents tells of this version.
    fn summary(&self, region: &str) -> Value {
        json!({
            "HubContentName": self.name,
            "HubContentArn": self.arn(region),
            "HubContentVersion": self.version,
            "HubContentType": MODEL,
            "DocumentSchemaVersion": DOCUMENT_SCHEMA_VERSION,
            "HubContentDisplayName": self.display_name,
            "HubContentDescription": self.description,
            "SupportStatus": "Supported",
            "HubContentSearchKeywords": ["@task:text-generation"],
            "HubContentStatus": "Available",
            "CreationTime": self.created,
        })
    }
}

/// The members the request lacks or gives out of their enum, refused together as AWS's
/// request validation refuses them ("2 validation errors detected: …; …").
fn check_members(body: &Value, required: &[(&str, &str)]) -> Result<(), AwsError> {
    let mut errors = Vec::new();
    for (member, field) in required {
        match body.get(*member) {
            None | Some(Value::Null) => errors.push(format!(
                "Value null at '{field}' failed to satisfy constraint: Member must not be null"
            )),
            Some(v) if *member == "HubContentType" => {
                let t = v.as_str().unwrap_or_default();
                if !CONTENT_TYPES.contains(&t) {
                    errors.push(format!(
                        "Value '{t}' at '{field}' failed to satisfy constraint: Member must satisfy enum value set: [{}]",
                        CONTENT_TYPES.join(", ")
                    ));
                }
            }
            Some(_) => {}
        }
    }
    match errors.len() {
        0 => Ok(()),
        1 => Err(validation(format!(
            "1 validation error detected: {}",
            errors[0]
        ))),
        n => Err(validation(format!(
            "{n} validation errors detected: {}",
            errors.join("; ")
        ))),
    }
}

fn not_found(message: String) -> AwsError {
    AwsError::new(400, "ResourceNotFound", message)
}

/// The hub a request names, which must be the public hub of `region`.
fn check_hub(body: &Value, region: &str) -> Result<(), AwsError> {
    let hub = str_field(body, "HubName").unwrap_or_default();
    if is_public_hub(hub, region) {
        Ok(())
    } else {
        Err(not_found(format!("Hub {hub} does not exist")))
    }
}

/// `DescribeHubContent`: one version (the latest when none is named) of a model.
pub fn describe(region: &str, body: &Value) -> Result<Value, AwsError> {
    check_members(
        body,
        &[
            ("HubName", "hubName"),
            ("HubContentType", "hubContentType"),
            ("HubContentName", "hubContentName"),
        ],
    )?;
    let name = str_field(body, "HubContentName").unwrap_or_default();
    check_hyphenated(
        name,
        "hubContentName",
        63,
        "^[a-zA-Z0-9](-*[a-zA-Z0-9]){0,62}$",
    )?;
    let version = str_field(body, "HubContentVersion");
    if let Some(v) = version {
        let parts: Vec<&str> = v.split('.').collect();
        let ok = parts.len() == 3
            && parts
                .iter()
                .all(|p| (1..=4).contains(&p.len()) && p.chars().all(|c| c.is_ascii_digit()));
        if !ok {
            return Err(validation(format!(
                "1 validation error detected: Value '{v}' at 'hubContentVersion' failed to satisfy constraint: Member must satisfy regular expression pattern: {VERSION_PATTERN}"
            )));
        }
    }
    check_hub(body, region)?;
    let kind = str_field(body, "HubContentType").unwrap_or_default();
    if kind != MODEL || model(name, None).is_none() {
        return Err(not_found(format!(
            "Hub content {name} of type {kind} does not exist in hub {PUBLIC_HUB}"
        )));
    }
    let Some(m) = model(name, version) else {
        return Err(not_found(format!(
            "Hub content {name} of type {kind} with version {} does not exist in hub {PUBLIC_HUB}",
            version.unwrap_or_default()
        )));
    };
    let mut v = m.summary(region);
    if let Some(o) = v.as_object_mut() {
        o.insert("HubName".into(), json!(PUBLIC_HUB));
        o.insert("HubArn".into(), json!(hub_arn(region)));
        o.insert(
            "HubContentDocument".into(),
            json!(m.document(region).to_string()),
        );
    }
    Ok(v)
}

/// `ListHubContents`: the latest version of each model whose name contains
/// `NameContains`, sorted by `SortBy` (the name unless asked), in pages. The filter
/// ignores case: names are lowercase ids, and "Llama" as the display names spell it
/// should still find them.
pub fn list(region: &str, body: &Value) -> Result<Value, AwsError> {
    check_members(
        body,
        &[("HubName", "hubName"), ("HubContentType", "hubContentType")],
    )?;
    let sort_by = str_field(body, "SortBy").unwrap_or("HubContentName");
    if !matches!(
        sort_by,
        "HubContentName" | "CreationTime" | "HubContentStatus"
    ) {
        return Err(validation(format!(
            "1 validation error detected: Value '{sort_by}' at 'sortBy' failed to satisfy constraint: Member must satisfy enum value set: [HubContentName, CreationTime, HubContentStatus]"
        )));
    }
    check_hub(body, region)?;
    let contains = str_field(body, "NameContains").map(str::to_lowercase);
    let after = body.get("CreationTimeAfter").and_then(Value::as_f64);
    let before = body.get("CreationTimeBefore").and_then(Value::as_f64);
    let kind = str_field(body, "HubContentType").unwrap_or_default();
    let mut models: Vec<&CatalogueModel> = latest()
        .into_iter()
        .filter(|_| kind == MODEL)
        .filter(|m| {
            contains
                .as_deref()
                .is_none_or(|c| m.name.to_lowercase().contains(c))
        })
        .filter(|m| after.is_none_or(|a| m.created as f64 > a))
        .filter(|m| before.is_none_or(|b| (m.created as f64) < b))
        .collect();
    // Stable sorts over the names' order: ties stay by name.
    if sort_by == "CreationTime" {
        models.sort_by_key(|m| m.created);
    }
    let (models, next) = page(body, models, Order::Ascending)?;
    let summaries: Vec<Value> = models.iter().map(|m| m.summary(region)).collect();
    let mut out = json!({ "HubContentSummaries": summaries });
    if let Some(token) = next {
        out["NextToken"] = json!(token);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    const REGION: &str = "us-west-2";

    fn version_key(v: &str) -> Vec<u32> {
        v.split('.').map(|p| p.parse().unwrap()).collect()
    }

    #[test]
    fn each_models_versions_ascend_and_its_default_type_is_supported() {
        for m in all() {
            let vs = versions(m.name);
            let mut sorted = vs.clone();
            sorted.sort_by_key(|v| version_key(v));
            assert_eq!(vs, sorted, "{}", m.name);
            assert_eq!(model(m.name, None).unwrap().version, *vs.last().unwrap());
            assert!(m.supports(m.default_instance_type), "{}", m.name);
            assert_eq!(m.gated, m.eula.is_some(), "{}", m.name);
        }
        assert_eq!(
            model("huggingface-llm-qwen2-5-7b-instruct", None)
                .unwrap()
                .version,
            "1.2.0"
        );
        assert!(model("huggingface-llm-qwen2-5-7b-instruct", Some("1.1.0")).is_none());
        assert!(is_public_hub(
            "arn:aws:sagemaker:us-west-2:aws:hub/SageMakerPublicHub",
            REGION
        ));
        assert!(!is_public_hub(
            "arn:aws:sagemaker:us-east-1:aws:hub/SageMakerPublicHub",
            REGION
        ));
    }

    fn describe_body(name: &str, version: Option<&str>) -> Value {
        let mut b =
            json!({ "HubName": PUBLIC_HUB, "HubContentType": "Model", "HubContentName": name });
        if let Some(v) = version {
            b["HubContentVersion"] = json!(v);
        }
        b
    }

    #[test]
    fn describe_hub_content_answers_the_latest_or_the_named_version_with_its_document() {
        let out = describe(
            REGION,
            &describe_body("meta-textgeneration-llama-3-1-8b-instruct", None),
        )
        .unwrap();
        assert_eq!(out["HubContentVersion"], "2.8.0");
        assert_eq!(
            out["HubContentArn"],
            "arn:aws:sagemaker:us-west-2:aws:hub-content/SageMakerPublicHub/Model/meta-textgeneration-llama-3-1-8b-instruct/2.8.0"
        );
        assert_eq!(
            out["HubArn"],
            "arn:aws:sagemaker:us-west-2:aws:hub/SageMakerPublicHub"
        );
        assert_eq!(
            (&out["HubName"], &out["DocumentSchemaVersion"]),
            (&json!(PUBLIC_HUB), &json!("2.3.0"))
        );
        assert_eq!(out["HubContentDisplayName"], "Llama 3.1 8B Instruct");
        assert_eq!(
            (&out["SupportStatus"], &out["HubContentStatus"]),
            (&json!("Supported"), &json!("Available"))
        );
        assert!(out["CreationTime"].is_i64());
        assert!(
            out["HubContentSearchKeywords"]
                .as_array()
                .unwrap()
                .contains(&json!("@task:text-generation"))
        );
        let doc: Value = serde_json::from_str(out["HubContentDocument"].as_str().unwrap()).unwrap();
        assert_eq!(
            doc["HostingEcrUri"],
            "763104351884.dkr.ecr.us-west-2.amazonaws.com/vllm:0.11.0-gpu-py312"
        );
        assert_eq!(
            doc["HostingArtifactUri"],
            "s3://jumpstart-cache-prod-us-west-2/meta-textgeneration-llama-3-1-8b-instruct/artifacts/inference-prepack/v2.8.0/"
        );
        assert_eq!(
            doc["HostingEulaUri"],
            "s3://jumpstart-cache-prod-us-west-2/fmhMetadata/eula/llama3_1Eula.txt"
        );
        assert_eq!(doc["GatedBucket"], true);
        assert_eq!(doc["DefaultInferenceInstanceType"], "ml.g5.2xlarge");
        assert_eq!(
            doc["SupportedInferenceInstanceTypes"],
            json!(LLAMA_8B_TYPES)
        );
        let env = doc["InferenceEnvironmentVariables"].as_array().unwrap();
        let max_len = env
            .iter()
            .find(|e| e["Name"] == "OPTION_MAX_MODEL_LEN")
            .unwrap();
        assert_eq!(
            (&max_len["Default"], &max_len["Scope"]),
            (&json!("8192"), &json!("container"))
        );

        let old = describe(
            REGION,
            &describe_body("meta-textgeneration-llama-3-1-8b-instruct", Some("2.0.0")),
        )
        .unwrap();
        assert_eq!(old["HubContentVersion"], "2.0.0");
        let open = describe(
            REGION,
            &describe_body("deepseek-llm-r1-distill-qwen-1-5b", None),
        )
        .unwrap();
        let doc: Value =
            serde_json::from_str(open["HubContentDocument"].as_str().unwrap()).unwrap();
        assert_eq!(doc["GatedBucket"], false);
        assert!(
            doc.get("HostingEulaUri").is_none(),
            "open models have no EULA"
        );
        // By the hub's ARN too.
        let mut by_arn = describe_body("deepseek-llm-r1-distill-qwen-1-5b", None);
        by_arn["HubName"] = json!(hub_arn(REGION));
        assert!(describe(REGION, &by_arn).is_ok());
    }

    fn refused(out: Result<Value, AwsError>) -> (String, String) {
        let e = out.unwrap_err();
        assert_eq!(e.status.as_u16(), 400);
        (e.code, e.message)
    }

    #[test]
    fn describe_hub_content_refuses_what_aws_refuses() {
        let qwen = "huggingface-llm-qwen2-5-7b-instruct";
        assert_eq!(
            refused(describe(REGION, &json!({ "HubContentType": "Model" }))),
            (
                "ValidationException".to_owned(),
                "2 validation errors detected: Value null at 'hubName' failed to satisfy constraint: Member must not be null; Value null at 'hubContentName' failed to satisfy constraint: Member must not be null".to_owned()
            )
        );
        let mut other_type = describe_body(qwen, None);
        other_type["HubContentType"] = json!("Dataset");
        assert_eq!(
            refused(describe(REGION, &other_type)),
            (
                "ValidationException".to_owned(),
                "1 validation error detected: Value 'Dataset' at 'hubContentType' failed to satisfy constraint: Member must satisfy enum value set: [Model, Notebook, ModelReference, DataSet, JsonDoc]".to_owned()
            )
        );
        assert_eq!(
            refused(describe(REGION, &describe_body(qwen, Some("latest")))).0,
            "ValidationException"
        );
        let mut other_hub = describe_body(qwen, None);
        other_hub["HubName"] = json!("my-hub");
        assert_eq!(
            refused(describe(REGION, &other_hub)),
            (
                "ResourceNotFound".to_owned(),
                "Hub my-hub does not exist".to_owned()
            )
        );
        assert_eq!(
            refused(describe(REGION, &describe_body("no-such-model", None))),
            (
                "ResourceNotFound".to_owned(),
                "Hub content no-such-model of type Model does not exist in hub SageMakerPublicHub"
                    .to_owned()
            )
        );
        assert_eq!(
            refused(describe(REGION, &describe_body(qwen, Some("9.9.9")))),
            (
                "ResourceNotFound".to_owned(),
                format!(
                    "Hub content {qwen} of type Model with version 9.9.9 does not exist in hub SageMakerPublicHub"
                )
            )
        );
        let mut notebook = describe_body(qwen, None);
        notebook["HubContentType"] = json!("Notebook");
        assert_eq!(refused(describe(REGION, &notebook)).0, "ResourceNotFound");
    }

    fn names(out: &Value) -> Vec<&str> {
        out["HubContentSummaries"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s["HubContentName"].as_str().unwrap())
            .collect()
    }

    #[test]
    fn list_hub_contents_lists_each_models_latest_version_by_name_in_pages() {
        let body = json!({ "HubName": PUBLIC_HUB, "HubContentType": "Model" });
        let out = list(REGION, &body).unwrap();
        assert_eq!(
            names(&out),
            [
                "deepseek-llm-r1-distill-qwen-1-5b",
                "huggingface-llm-qwen2-5-7b-instruct",
                "meta-textgeneration-llama-3-1-8b-instruct",
                "meta-textgeneration-llama-3-3-70b-instruct",
            ]
        );
        assert!(out.get("NextToken").is_none());
        let versions: Vec<&str> = out["HubContentSummaries"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s["HubContentVersion"].as_str().unwrap())
            .collect();
        assert_eq!(versions, ["1.0.0", "1.2.0", "2.8.0", "1.0.0"]);
        let first = &out["HubContentSummaries"][0];
        for key in [
            "HubContentArn",
            "HubContentType",
            "DocumentSchemaVersion",
            "HubContentDisplayName",
            "HubContentDescription",
            "SupportStatus",
            "HubContentSearchKeywords",
            "HubContentStatus",
            "CreationTime",
        ] {
            assert!(!first[key].is_null(), "{key}");
        }

        let mut seen = Vec::new();
        let mut token: Option<String> = None;
        loop {
            let mut b =
                json!({ "HubName": hub_arn(REGION), "HubContentType": "Model", "MaxResults": 3 });
            if let Some(t) = &token {
                b["NextToken"] = json!(t);
            }
            let out = list(REGION, &b).unwrap();
            seen.extend(names(&out).into_iter().map(str::to_owned));
            match out["NextToken"].as_str() {
                Some(t) => token = Some(t.to_owned()),
                None => break,
            }
        }
        assert_eq!(seen.len(), 4);

        let llama = list(
            REGION,
            &json!({ "HubName": PUBLIC_HUB, "HubContentType": "Model", "NameContains": "LLAMA" }),
        )
        .unwrap();
        assert_eq!(names(&llama).len(), 2);
        let notebooks = list(
            REGION,
            &json!({ "HubName": PUBLIC_HUB, "HubContentType": "Notebook" }),
        )
        .unwrap();
        assert!(names(&notebooks).is_empty());
    }

    #[test]
    fn list_hub_contents_refuses_what_aws_refuses() {
        for (body, code) in [
            (json!({ "HubName": PUBLIC_HUB }), "ValidationException"),
            (
                json!({ "HubName": PUBLIC_HUB, "HubContentType": "Model", "MaxResults": 0 }),
                "ValidationException",
            ),
            (
                json!({ "HubName": PUBLIC_HUB, "HubContentType": "Model", "MaxResults": 101 }),
                "ValidationException",
            ),
            (
                json!({ "HubName": PUBLIC_HUB, "HubContentType": "Model", "NextToken": "x" }),
                "ValidationException",
            ),
            (
                json!({ "HubName": PUBLIC_HUB, "HubContentType": "Model", "SortBy": "Name" }),
                "ValidationException",
            ),
            (
                json!({ "HubName": "other", "HubContentType": "Model" }),
                "ResourceNotFound",
            ),
        ] {
            assert_eq!(refused(list(REGION, &body)).0, code, "{body}");
        }
    }
}
