//! LoadBalancer Services: after [`LB_SECS`] the AWS Load Balancer Controller would have an
//! NLB up, so the Service gets a hostname in the shape that controller gives
//! (`k8s-<ns>-<name>-<hash>.elb.<region>.amazonaws.com`), derived from the UID so it
//! stays the same across passes.

use serde_json::{Value, json};

use super::upsert;
use crate::clock::reached;
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
        if !reached(epoch_now, created + LB_SECS) {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::recording;
    use crate::kube::time::rfc3339;

    #[test]
    fn a_load_balancer_is_due_its_hostname_lb_secs_after_creation() {
        let mut store = Store::new();
        let t0 = parse_rfc3339("2026-01-01T00:00:00Z").unwrap();
        store.put(
            Key::new("/services", "default", "web"),
            json!({"metadata": {"name": "web", "namespace": "default", "uid": "u1",
                    "creationTimestamp": rfc3339(t0)}, "spec": {"type": "LoadBalancer"}}),
        );
        let ((), due) = recording(|| services(&mut store, t0 + 10.0, "us-east-1"));
        assert_eq!(due, LB_SECS - 10.0);
        let ((), due) = recording(|| services(&mut store, t0 + LB_SECS, "us-east-1"));
        assert_eq!(due, f64::INFINITY);
        let svc = store.get(&Key::new("/services", "default", "web")).unwrap();
        assert!(
            svc["status"]["loadBalancer"]["ingress"][0]["hostname"]
                .as_str()
                .unwrap()
                .ends_with(".elb.us-east-1.amazonaws.com")
        );
    }
}
