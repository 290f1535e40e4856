//! JumpStart as hypd reaches it: the SageMaker public hub's catalogue through the real
//! `aws-sdk-sagemaker` (ListHubContents in pages, DescribeHubContent with its JSON
//! document, AWS's error codes), and a JumpStartModel the inference operator deploys
//! from it, with KV caching and intelligent routing, answering SageMaker's
//! `/invocations` through the API server's service proxy, both at its worker Service
//! and through its router's, refused in its status when its licence is not accepted,
//! scaled and deleted (router and all) through the custom resource.

use crate::support::{
    call, call_in, inference_cluster, moto, network, refused, sagemaker_client, set_time_scale,
    sim, wait_for,
};
use aws_sdk_sagemaker::types::HubContentType;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Pod, Service};
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, ListParams, Patch,
    PatchParams, PostParams,
};
use serde_json::{Value, json};

const HUB: &str = "SageMakerPublicHub";
const QWEN: &str = "huggingface-llm-qwen2-5-7b-instruct";
const LLAMA: &str = "meta-textgeneration-llama-3-1-8b-instruct";

#[tokio::test(flavor = "multi_thread")]
async fn the_public_hubs_models_are_listed_described_and_deployed_as_jumpstart_models() {
    let (_moto, moto_url) = moto();
    let net = network(&moto_url).await;
    let (_sim, sim_url) = sim(&moto_url, 600.0);
    let sm = sagemaker_client(&sim_url).await;

    // The catalogue, a page at a time: each model once, at its latest version.
    let mut listed = Vec::new();
    let mut next = None;
    loop {
        let page = sm
            .list_hub_contents()
            .hub_name(HUB)
            .hub_content_type(HubContentType::Model)
            .max_results(3)
            .set_next_token(next)
            .send()
            .await
            .unwrap();
        for s in page.hub_content_summaries() {
            listed.push((
                s.hub_content_name().unwrap().to_owned(),
                s.hub_content_version().unwrap().to_owned(),
            ));
            assert!(s.creation_time().is_some());
            assert_eq!(s.hub_content_type(), Some(&HubContentType::Model));
        }
        next = page.next_token().map(str::to_owned);
        if next.is_none() {
            break;
        }
    }
    assert_eq!(
        listed,
        [
            ("deepseek-llm-r1-distill-qwen-1-5b", "1.0.0"),
            (QWEN, "1.2.0"),
            (LLAMA, "2.8.0"),
            ("meta-textgeneration-llama-3-3-70b-instruct", "1.0.0"),
        ]
        .map(|(n, v)| (n.to_owned(), v.to_owned()))
    );
    let searched = sm
        .list_hub_contents()
        .hub_name(HUB)
        .hub_content_type(HubContentType::Model)
        .name_contains("qwen")
        .send()
        .await
        .unwrap();
    assert_eq!(searched.hub_content_summaries().len(), 2);

    let llama = sm
        .describe_hub_content()
        .hub_name(HUB)
        .hub_content_type(HubContentType::Model)
        .hub_content_name(LLAMA)
        .send()
        .await
        .unwrap();
    assert_eq!(llama.hub_content_version(), Some("2.8.0"));
    assert_eq!(
        llama.hub_content_display_name(),
        Some("Llama 3.1 8B Instruct")
    );
    assert_eq!(
        llama.hub_arn(),
        Some("arn:aws:sagemaker:us-east-1:aws:hub/SageMakerPublicHub")
    );
    let doc: Value = serde_json::from_str(llama.hub_content_document().unwrap()).unwrap();
    assert_eq!(doc["GatedBucket"], true);
    let eula = doc["HostingEulaUri"].as_str().unwrap().to_owned();
    assert_eq!(
        doc["HostingEcrUri"],
        "763104351884.dkr.ecr.us-east-1.amazonaws.com/vllm:0.11.0-gpu-py312"
    );
    let old = sm
        .describe_hub_content()
        .hub_name(HUB)
        .hub_content_type(HubContentType::Model)
        .hub_content_name(QWEN)
        .hub_content_version("1.0.0")
        .send()
        .await
        .unwrap();
    assert_eq!(old.hub_content_version(), Some("1.0.0"));
    let missing = sm
        .describe_hub_content()
        .hub_name(HUB)
        .hub_content_type(HubContentType::Model)
        .hub_content_name(QWEN)
        .hub_content_version("9.9.9")
        .send()
        .await
        .unwrap_err();
    assert_eq!(refused(missing).0, "ResourceNotFound");
    let other_hub = sm
        .list_hub_contents()
        .hub_name("my-hub")
        .hub_content_type(HubContentType::Model)
        .send()
        .await
        .unwrap_err();
    assert_eq!(
        refused(other_hub),
        (
            "ResourceNotFound".to_owned(),
            "Hub my-hub does not exist".to_owned()
        )
    );
    let too_many = sm
        .list_hub_contents()
        .hub_name(HUB)
        .hub_content_type(HubContentType::Model)
        .max_results(101)
        .send()
        .await
        .unwrap_err();
    assert_eq!(refused(too_many).0, "ValidationException");

    // A cluster with the inference operator, on a type both models run on.
    let client = inference_cluster(
        &sim_url,
        &net,
        "jumpstartmodels.inference.sagemaker.aws.amazon.com",
    )
    .await;
    let gvk = GroupVersionKind::gvk("inference.sagemaker.aws.amazon.com", "v1", "JumpStartModel");
    let ar = ApiResource::from_gvk_with_plural(&gvk, "jumpstartmodels");
    let models: Api<DynamicObject> = Api::namespaced_with(client.clone(), "default", &ar);
    let jsm = |name: &str, model: Value| {
        serde_json::from_value::<DynamicObject>(json!({
            "apiVersion": "inference.sagemaker.aws.amazon.com/v1", "kind": "JumpStartModel",
            "metadata": { "name": name },
            "spec": { "model": model, "server": { "instanceType": "ml.g5.8xlarge" } },
        }))
        .unwrap()
    };
    let state = |o: &DynamicObject| o.data["status"]["state"].as_str().map(str::to_owned);

    // Ten simulated seconds a real one: the worker's 5 s start and 20 s load take 2.5 s.
    set_time_scale(&sim_url, 10.0).await;
    let mut qwen = jsm("qwen", json!({ "modelId": QWEN, "acceptEula": false }));
    qwen.data["spec"]["kvCacheSpec"] = json!({ "enableL1Cache": true });
    qwen.data["spec"]["intelligentRoutingSpec"] = json!({ "enabled": true });
    models.create(&PostParams::default(), &qwen).await.unwrap();
    models
        .create(
            &PostParams::default(),
            &jsm("llama", json!({ "modelId": LLAMA, "acceptEula": false })),
        )
        .await
        .unwrap();
    wait_for("qwen deployed", || async {
        state(&models.get("qwen").await.unwrap()).as_deref() == Some("DeploymentComplete")
    })
    .await;
    let refused_llama = models.get("llama").await.unwrap();
    assert_eq!(state(&refused_llama).as_deref(), Some("DeploymentFailed"));
    let ready = &refused_llama.data["status"]["conditions"][0];
    assert_eq!(ready["reason"], "EulaNotAccepted");
    assert!(
        ready["message"].as_str().unwrap().contains(&eula),
        "{ready}"
    );
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), "default");
    assert!(deployments.get_opt("llama").await.unwrap().is_none());

    let worker = deployments.get("qwen").await.unwrap();
    let container = &worker.spec.template.spec.unwrap().containers[0];
    assert_eq!(
        container.image.as_deref(),
        Some("763104351884.dkr.ecr.us-east-1.amazonaws.com/vllm:0.11.0-gpu-py312")
    );
    assert_eq!(
        container.args.as_ref().unwrap()[0],
        "--kv-transfer-config",
        "LMCache"
    );
    let status = models.get("qwen").await.unwrap().data["status"].clone();
    assert_eq!(
        (&status["selector"], &status["replicas"]),
        (&json!("app=qwen"), &json!(1))
    );

    // SageMaker's path on the hub's vLLM container, and the OpenAI one beside it.
    let ask = json!({ "messages": [{ "role": "user", "content": "Say hello to the cluster" }] });
    let invoked = call(
        &client,
        "POST",
        "qwen-service:8080",
        "/invocations",
        Some(ask.clone()),
    )
    .await;
    assert_eq!(invoked.status, 200, "{}", invoked.body);
    assert_eq!(invoked.body["object"], "chat.completion");
    assert_eq!(invoked.body["model"], QWEN, "served under its model id");
    let chat = call(
        &client,
        "POST",
        "qwen-service:8080",
        "/v1/chat/completions",
        Some(ask.clone()),
    )
    .await;
    assert_eq!(chat.body["choices"], invoked.body["choices"]);
    // As AWS's docs invoke the routing Service; the router passes the path on as it is.
    let system = "hyperpod-inference-system";
    let routed = call_in(
        &client,
        system,
        "POST",
        "https:qwen-default-routing-service:443",
        "/invocations",
        Some(ask.clone()),
    )
    .await;
    assert_eq!(routed.status, 200, "{}", routed.body);
    assert!(
        routed
            .router
            .as_deref()
            .is_some_and(|r| r.starts_with("qwen-default-router-")),
        "{:?}",
        routed.router
    );
    assert!(
        routed
            .pod
            .as_deref()
            .is_some_and(|p| p.starts_with("qwen-")),
        "{:?}",
        routed.pod
    );
    assert_eq!(routed.body["model"], QWEN);
    assert_eq!(routed.body["choices"], invoked.body["choices"]);
    let unknown = call(
        &client,
        "POST",
        "qwen-service:8080",
        "/invocations",
        Some(json!({ "inputs": "hello" })),
    )
    .await;
    assert_eq!(unknown.status, 400, "{}", unknown.body);

    // The scale subresource moves the worker Deployment.
    models
        .patch_scale(
            "qwen",
            &PatchParams::default(),
            &Patch::Merge(json!({ "spec": { "replicas": 2 } })),
        )
        .await
        .unwrap();
    wait_for("two qwen replicas ready", || async {
        let s = models.get("qwen").await.unwrap().data["status"].clone();
        s["state"] == "DeploymentComplete"
            && s["replicas"] == 2
            && s["deploymentStatus"]["status"]["readyReplicas"] == 2
    })
    .await;

    // Deleting the model takes what it made, here and in the operator's namespace.
    models
        .delete("qwen", &DeleteParams::default())
        .await
        .unwrap();
    let services: Api<Service> = Api::namespaced(client.clone(), "default");
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let routers: Api<Deployment> = Api::namespaced(client.clone(), system);
    let routing_services: Api<Service> = Api::namespaced(client.clone(), system);
    wait_for("qwen's objects gone", || async {
        deployments.get_opt("qwen").await.unwrap().is_none()
            && services.get_opt("qwen-service").await.unwrap().is_none()
            && routers
                .get_opt("qwen-default-router")
                .await
                .unwrap()
                .is_none()
            && routing_services
                .get_opt("qwen-default-routing-service")
                .await
                .unwrap()
                .is_none()
            && pods
                .list(&ListParams::default().labels("app=qwen"))
                .await
                .unwrap()
                .items
                .is_empty()
    })
    .await;
}
