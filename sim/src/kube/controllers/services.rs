//! LoadBalancer Services: after [`LB_SECS`] the AWS Load Balancer Controller would have an
//! NLB up, so the Service gets a hostname in the shape that controller gives
//! (`k8s-<ns>-<name>-<hash>.elb.<region>.amazonaws.com`), derived from the UID so it
//! stays the same across ticks.

use serde_json::{Value, json};

use super::upsert;
use crate::kube::store::{Key, Store, meta};
use crate::kube::time::parse_rfc3339;
use crate::world::fnv1a;

/// Sim seconds until a LoadBalancer Service gets its hostname.
pub const LB_SECS: f64 = 30.0;

pub(super) fn services(store: &mut Store, epoch_now: f64, region: &str) {
    let all: Vec<Value> = store
        .list("/services", None)
        .filter(|s| s["spec"]["type"] == "LoadBalancer")
        .map(|s| (**s).clone())
        .collect();
    for mut svc in all {
        let created = parse_rfc3339(&meta(&svc, "creationTimestamp")).unwrap_or(epoch_now);
        if epoch_now < created + LB_SECS {
            continue;
        }
        let ns = meta(&svc, "namespace");
        let name = meta(&svc, "name");
        let h = fnv1a(&meta(&svc, "uid"));
        let short = |s: &str| s.chars().take(9).collect::<String>();
        let hostname = format!(
            "k8s-{}-{}-{:010x}.elb.{region}.amazonaws.com",
            short(&ns),
            short(&name),
            h & 0xff_ffff_ffff
        );
        svc["status"]["loadBalancer"] = json!({ "ingress": [{ "hostname": hostname }] });
        upsert(store, Key::new("/services", &ns, &name), svc);
    }
}
