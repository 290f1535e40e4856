//! A cluster's advanced features: what each is made of, which shared add-ons it needs,
//! and `get_features`, which reads them all from AWS and Kubernetes (never from the
//! store: a feature turned on or off outside hypd shows as it is). The one rule about
//! shared add-ons lives in [`components`]: those the cluster was made with are never
//! removed by a feature change, and one only features need goes with the last of them.

pub mod autoscaling;
pub mod inference;
pub mod release;
pub mod tiered;
pub mod training;
pub mod update;

use std::collections::BTreeSet;
use std::time::Duration;

use app::api::ApiError;
use app::api::features::{ComponentState, Feature, FeatureState, Features, GetFeatures};

use crate::auth::Actor;
use crate::aws::Aws;
use crate::cluster::dependencies::{ADDONS, Addon, FEATURE_COMPONENTS};
use crate::cluster::managed::Where;
use crate::resources::Resource;
use crate::resources::Want;
use crate::resources::eks::addon::{self, Addon as AddonResource};
use crate::resources::iam::role::{Role, RoleSpec};
use crate::resources::iam::role_name;
use crate::resources::sagemaker::tiered_storage;
use crate::service::{Handler, Service};

/// A shared add-on by name, with whether the cluster was made with it.
fn component(name: &str) -> Option<(&'static Addon, bool)> {
    ADDONS
        .iter()
        .map(|a| (a, true))
        .chain(FEATURE_COMPONENTS.iter().map(|a| (a, false)))
        .find(|(a, _)| a.name == name)
}

/// The shared add-ons a feature change must ensure (those the features turned on need)
/// and may remove (those only features turned off needed, that no feature on after the
/// change needs, and that the cluster was not made with). Pure.
pub fn components(
    on_after: &BTreeSet<Feature>,
    turning_on: &[Feature],
    turning_off: &[Feature],
) -> (Vec<&'static Addon>, Vec<&'static Addon>) {
    let needed = |fs: &mut dyn Iterator<Item = &Feature>| -> BTreeSet<&'static str> {
        fs.flat_map(|f| f.depends_on().iter().copied()).collect()
    };
    let ensure = needed(&mut turning_on.iter());
    let kept = needed(&mut on_after.iter());
    let freed = needed(&mut turning_off.iter());
    let ensure = ensure
        .iter()
        .filter_map(|n| component(n))
        .map(|(a, _)| a)
        .collect();
    let remove = freed
        .difference(&kept)
        .filter_map(|n| component(n))
        .filter(|(_, with_cluster)| !with_cluster)
        .map(|(a, _)| a)
        .collect();
    (ensure, remove)
}

/// Shared add-on `a` installed at its pinned version or newer on the cluster at `at`,
/// its role bound first (the driver must find it when it starts; one someone else
/// installed keeps the identity they gave it). How it stands while it is not active yet.
pub(crate) async fn ensure_component(
    aws: &Aws,
    at: &Where,
    a: &Addon,
) -> Result<Option<String>, ApiError> {
    let r = addon(aws, at, a, Want::Present(a.version.to_owned()));
    let found = crate::resources::Resource::observe(&r).await?;
    if found.as_ref().is_none_or(|s| s.ours)
        && let Some((role, binding)) = component_identity(aws, at, a, true).await?
    {
        crate::resources::converge(&role).await?;
        crate::resources::converge(&binding).await?;
    }
    // One already there at the pinned version or newer is left as it is.
    let state = match found {
        Some(s)
            if !s
                .version
                .as_deref()
                .is_some_and(|v| update::older(v, a.version)) =>
        {
            s
        }
        _ => crate::resources::converge(&r)
            .await?
            .ok_or_else(|| crate::resources::missing("an add-on"))?,
    };
    state.check(a.name)?;
    Ok((!state.active()).then(|| state.describe(a.name)))
}

/// An add-on of the cluster at `at`.
pub(crate) fn addon(aws: &Aws, at: &Where, a: &Addon, want: Want<String>) -> AddonResource {
    AddonResource {
        eks: aws.eks(&at.region),
        cluster: at.eks.clone(),
        name: a.name.to_owned(),
        want,
        configuration: None,
    }
}

const POLL: Duration = Duration::from_secs(15);

/// What reading or changing features needs of the cluster.
const NEEDS: &str = "its features change in an active or imported cluster";

/// The suffixes (`role_name`) of the roles features make, besides those of the shared
/// add-ons (`AddonRole`); teardown removes each. Names of roles already made depend on
/// them.
const ROLE_SUFFIXES: [&str; 3] = [
    training::ROLE_SUFFIX,
    tiered::ROLE_SUFFIX,
    autoscaling::ROLE_SUFFIX,
];

/// The cluster's IAM OIDC provider, which roles for service accounts trust.
#[derive(Clone, Debug)]
pub(crate) struct Oidc {
    pub provider_arn: String,
    /// Without its scheme, as IAM's condition keys name it.
    pub issuer: String,
}

/// The OIDC provider of the cluster at `at`, or why it has none (then roles trusted
/// through it can be read, not made).
pub(crate) async fn oidc(aws: &Aws, at: &Where) -> Result<Result<Oidc, String>, ApiError> {
    let issuer = crate::resources::eks::cluster::describe(&aws.eks(&at.region), &at.eks)
        .await?
        .and_then(|c| c.oidc_issuer);
    let Some(issuer) = issuer else {
        return Ok(Err(format!("EKS cluster {} has no OIDC issuer", at.eks)));
    };
    let account = aws.identity().await?.account;
    Ok(Ok(Oidc {
        provider_arn: crate::resources::iam::oidc_provider::arn(&account, &issuer),
        issuer: issuer.trim_start_matches("https://").to_owned(),
    }))
}

/// Why an operator's controller Deployment is not available yet, if it is not.
pub(crate) async fn controller_pending(
    aws: &Aws,
    at: &Where,
    (namespace, name): (&str, &str),
) -> Result<Option<String>, ApiError> {
    use k8s_openapi::api::apps::v1::Deployment;
    let client = crate::resources::kube::connect(aws, &at.region, &at.eks).await?;
    let found = crate::resources::kube::get(
        &kube::Api::<Deployment>::namespaced(client, namespace),
        name,
    )
    .await?;
    Ok(match found {
        None => Some(format!(
            "waiting for the controller Deployment {namespace}/{name}"
        )),
        Some(d) => {
            let ready = d.status.and_then(|s| s.available_replicas).unwrap_or(0);
            (ready < 1)
                .then(|| format!("waiting for the controller {namespace}/{name} to be available"))
        }
    })
}

/// Why turning off the feature of add-on `a` cannot be done by hypd, if so: an add-on
/// someone else installed is theirs to remove.
pub(crate) async fn not_ours(aws: &Aws, at: &Where, a: &Addon) -> Result<Option<String>, ApiError> {
    Ok(addon(aws, at, a, Want::Absent)
        .observe()
        .await?
        .filter(|s| !s.ours)
        .map(|_| {
            format!(
                "the {} add-on on {} was not installed by hypd; hypd removes only what it made",
                a.name, at.eks
            )
        }))
}

/// The pod identity role of shared add-on `a` and its binding, wanted `on`; none if
/// hypd makes no role for it.
pub(crate) async fn component_identity(
    aws: &Aws,
    at: &Where,
    a: &Addon,
    on: bool,
) -> Result<Option<(Role, crate::resources::eks::pod_identity::PodIdentity)>, ApiError> {
    let Some(r) = a.role else {
        return Ok(None);
    };
    let role = role(
        aws,
        &at.region,
        &at.eks,
        r.suffix,
        if on {
            Want::Present(RoleSpec {
                trust: crate::resources::iam::role::Trust::Service(
                    crate::cluster::identity::POD_IDENTITY_SERVICE.to_owned(),
                ),
                managed: vec![r.policy.to_owned()],
                inline: Default::default(),
            })
        } else {
            Want::Absent
        },
    );
    let (namespace, service_account) = r.service_account;
    let binding = crate::resources::eks::pod_identity::PodIdentity {
        eks: aws.eks(&at.region),
        cluster: at.eks.clone(),
        namespace: namespace.to_owned(),
        service_account: service_account.to_owned(),
        want: if on {
            Want::Present(role_arn(aws, &at.eks, r.suffix).await?)
        } else {
            Want::Absent
        },
    };
    Ok(Some((role, binding)))
}

/// A feature's IAM role on cluster `cluster`, by its suffix.
pub(crate) fn role(
    aws: &Aws,
    region: &str,
    cluster: &str,
    suffix: &str,
    want: Want<RoleSpec>,
) -> Role {
    Role {
        iam: aws.iam(region),
        cluster: cluster.to_owned(),
        name: role_name(cluster, suffix),
        want,
    }
}

/// That role's ARN, known from its name before it exists.
pub(crate) async fn role_arn(aws: &Aws, cluster: &str, suffix: &str) -> Result<String, ApiError> {
    let account = aws.identity().await?.account;
    Ok(format!(
        "arn:aws:iam::{account}:role/{}",
        role_name(cluster, suffix)
    ))
}

/// An add-on's status as get_features says it.
fn status(s: &Option<addon::State>) -> (String, Option<String>) {
    match s {
        None => ("absent".to_owned(), None),
        Some(s) => (
            s.status
                .as_ref()
                .map_or("UNKNOWN", |st| st.as_str())
                .to_owned(),
            s.version.clone(),
        ),
    }
}

fn on(s: &Option<addon::State>) -> bool {
    s.as_ref().is_some_and(|s| {
        !matches!(
            s.status,
            Some(aws_sdk_eks::types::AddonStatus::Deleting)
                | Some(aws_sdk_eks::types::AddonStatus::DeleteFailed)
        )
    })
}

fn feature(f: Feature, enabled: bool, status: String, version: Option<String>) -> FeatureState {
    FeatureState {
        feature: f,
        title: f.title().to_owned(),
        purpose: f.purpose().to_owned(),
        enabled,
        status,
        version,
        details: Vec::new(),
        depends_on: f.depends_on().iter().map(|d| (*d).to_owned()).collect(),
        changeable: true,
    }
}

/// The HyperPod cluster at `at` as DescribeCluster has it now: read once and shared by
/// the features made from it (`described`).
pub(crate) async fn hyperpod(
    aws: &Aws,
    at: &Where,
) -> Result<aws_sdk_sagemaker::operation::describe_cluster::DescribeClusterOutput, ApiError> {
    crate::resources::sagemaker::described(&aws.sagemaker(&at.region), &at.hyperpod).await
}

/// Every feature and shared component of the cluster at `at`, as they are now.
pub(crate) async fn read(
    aws: &Aws,
    store: &crate::store::Store,
    at: &Where,
) -> Result<(Vec<FeatureState>, Vec<ComponentState>), ApiError> {
    let training = training::TrainingOperator::new(aws, at).await?;
    let mut features = vec![training.state().await?];

    let described = hyperpod(aws, at).await?;
    features.push(
        inference::Inference::described(aws, at, &described)
            .await?
            .state()
            .await?,
    );
    let setting = tiered_storage::Observed::from(&described);
    features.push(
        tiered::Tiered::new(aws, at, store)
            .await?
            .state(setting)
            .await?,
    );
    features.push(
        autoscaling::Autoscaling::described(aws, at, &described)
            .await?
            .state()
            .await?,
    );
    for up in [&release::KUBERAY_OPERATOR, &release::KEDA_OPERATOR] {
        features.push(release::Installed::new(aws, at, up).await?.state().await?);
    }

    let enabled: BTreeSet<Feature> = features
        .iter()
        .filter(|f| f.enabled)
        .map(|f| f.feature)
        .collect();
    let mut components = Vec::new();
    for (a, with_cluster) in ADDONS
        .iter()
        .map(|a| (a, true))
        .chain(FEATURE_COMPONENTS.iter().map(|a| (a, false)))
    {
        let (status, version) = status(&addon(aws, at, a, Want::Absent).observe().await?);
        components.push(ComponentState {
            name: a.name.to_owned(),
            status,
            version,
            needed_by: Feature::ALL
                .into_iter()
                .filter(|f| f.depends_on().contains(&a.name))
                .collect(),
            with_cluster,
        });
    }
    // A feature whose shared add-on is missing is not whole: say which.
    for f in &mut features {
        if !enabled.contains(&f.feature) {
            continue;
        }
        for d in &f.depends_on {
            if components
                .iter()
                .any(|c| &c.name == d && c.status != "ACTIVE")
            {
                f.details.push(format!("needs {d}, which is not ACTIVE"));
            }
        }
    }
    Ok((features, components))
}

impl Handler<GetFeatures> for Service {
    async fn handle(&self, _: &Actor, r: GetFeatures) -> Result<Features, ApiError> {
        let at = crate::cluster::managed::locate(&self.store, r.name.as_str(), NEEDS).await?;
        let fetched_at = crate::clock::now();
        let (features, components) = read(&self.aws, &self.store, &at).await?;
        Ok(Features {
            name: at.eks,
            features,
            components,
            fetched_at,
        })
    }
}

/// Removes what hypd made for the cluster's features once its EKS cluster is gone:
/// their IAM roles and the inference operator's TLS bucket (their add-ons, bindings and
/// service accounts went with the EKS cluster, the tiered storage setting with the
/// HyperPod cluster).
pub async fn teardown(aws: &Aws, region: &str, cluster: &str) -> Result<(), ApiError> {
    let components = FEATURE_COMPONENTS
        .iter()
        .filter_map(|a| a.role.map(|r| r.suffix));
    let suffixes = ROLE_SUFFIXES.into_iter().chain(inference::ROLE_SUFFIXES);
    for suffix in suffixes.chain(components) {
        crate::resources::converge(&role(aws, region, cluster, suffix, Want::Absent)).await?;
    }
    inference::teardown(aws, region, cluster).await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(v: &[&Addon]) -> Vec<&'static str> {
        v.iter().map(|a| a.name).collect()
    }

    #[test]
    fn shared_components_go_with_the_last_feature_and_never_with_the_cluster() {
        use Feature::*;
        // Turning the training operator on ensures what it needs.
        let (ensure, remove) = components(&[TrainingOperator].into(), &[TrainingOperator], &[]);
        assert_eq!(names(&ensure), ["cert-manager", "eks-pod-identity-agent"]);
        assert!(remove.is_empty());
        // Turning it off removes nothing: both came with the cluster.
        let (_, remove) = components(&BTreeSet::new(), &[], &[TrainingOperator]);
        assert!(remove.is_empty());
        // The FSx driver only the inference operator needs goes with it…
        let (_, remove) = components(&BTreeSet::new(), &[], &[InferenceOperator]);
        assert_eq!(names(&remove), ["aws-fsx-csi-driver"]);
        // …and cert-manager, which the training operator still uses, never does.
        let (_, remove) = components(&[TrainingOperator].into(), &[], &[InferenceOperator]);
        assert!(!names(&remove).contains(&"cert-manager"));
    }
}
