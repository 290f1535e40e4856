//! The catalogue of what the account offers, asked of EC2: regions, Availability Zones and the instance
//! types HyperPod can build, with their accelerator and EFA facts. Answers are cached for
//! a few minutes per region (these facts change rarely and consoles and agents ask
//! often), every answer says how fresh it is, and concurrent asks for the same key share
//! one fetch. Pre-flights ask narrow questions (one type in one zone) instead of the
//! whole catalogue.

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use app::api::ApiError;
use app::api::inspect::{
    Accelerator, AcceleratorKind, AvailabilityZone, Freshness, InstanceTypeField, InstanceTypeInfo,
    RegionInfo, efa_only_allowed,
};
use app::api::listing::Listing;
use app::api::values::Region;
use aws_sdk_ec2::types::{InstanceTypeInfo as Ec2Type, LocationType};
use tokio::sync::{Mutex, watch};

use crate::aws::{Aws, SdkResultExt, UpstreamError};
use crate::clock;
use crate::resources::ec2::filter;

/// How long an inspection answer is served from the cache.
pub const FRESH_FOR: Duration = Duration::from_secs(300);

/// Whether HyperPod builds clusters of `ml_type` (`ml.p5.48xlarge`): the SageMaker
/// model's own list of cluster instance types is the one source of truth.
pub fn hyperpod_supports(ml_type: &str) -> bool {
    aws_sdk_sagemaker::types::ClusterInstanceType::values().contains(&ml_type)
}

struct Entry<V> {
    at: Instant,
    fetched: SystemTime,
    value: V,
}

type Filling<V> = watch::Receiver<Option<Result<(V, SystemTime), ApiError>>>;

enum Slot<V> {
    Ready(Entry<V>),
    /// A fetch is under way; its result is sent here.
    Filling(Filling<V>),
}

/// A small per-key cache with a freshness report and one fetch per key at a time.
pub struct Cache<V> {
    entries: Mutex<HashMap<String, Slot<V>>>,
    ttl: Duration,
}

/// Removes a fill that ended without a result (its caller went away), so the next asker
/// fetches again instead of waiting on nothing.
struct FillGuard<'a, V> {
    cache: &'a Cache<V>,
    key: String,
    done: bool,
}

impl<V> Drop for FillGuard<'_, V> {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        if let Ok(mut entries) = self.cache.entries.try_lock() {
            if matches!(entries.get(&self.key), Some(Slot::Filling(_))) {
                entries.remove(&self.key);
            }
        } else {
            tracing::debug!(key = %self.key, "cache fill abandoned while the cache was busy");
        }
    }
}

impl<V: Clone + Send + Sync> Cache<V> {
    pub fn new(ttl: Duration) -> Self {
        Self {
            entries: Mutex::new(HashMap::new()),
            ttl,
        }
    }

    /// The cached value, or `fetch`'s, stored. The lock is never held while fetching, so a
    /// slow AWS call never blocks answers for other keys; a second ask for a key being
    /// fetched (with `refresh` or not) waits for that fetch instead of starting another.
    pub async fn get_or_fetch<F, Fut>(
        &self,
        key: &str,
        refresh: bool,
        fetch: F,
    ) -> Result<(V, Freshness), ApiError>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<V, ApiError>>,
    {
        let mut fetch = Some(fetch);
        loop {
            let mut waiting = {
                let mut entries = self.entries.lock().await;
                match entries.get(key) {
                    Some(Slot::Ready(e)) if !refresh && e.at.elapsed() < self.ttl => {
                        return Ok((e.value.clone(), freshness(e.fetched, true)));
                    }
                    // A fill whose fetcher went away (its sender is gone) is no fill.
                    Some(Slot::Filling(rx)) if rx.has_changed().is_ok() => rx.clone(),
                    _ => {
                        let (tx, rx) = watch::channel(None);
                        entries.insert(key.to_owned(), Slot::Filling(rx));
                        drop(entries);
                        let fetch = fetch.take().expect("a fetch runs once");
                        return self.fill(key, tx, fetch).await;
                    }
                }
            };
            match waiting.wait_for(Option::is_some).await {
                Ok(result) => {
                    return match result.as_ref().expect("waited for a result") {
                        Ok((value, fetched)) => Ok((value.clone(), freshness(*fetched, true))),
                        Err(e) => Err(e.clone()),
                    };
                }
                // The fetch was abandoned; ask again (and likely fetch ourselves).
                Err(_) => continue,
            }
        }
    }

    async fn fill<F, Fut>(
        &self,
        key: &str,
        tx: watch::Sender<Option<Result<(V, SystemTime), ApiError>>>,
        fetch: F,
    ) -> Result<(V, Freshness), ApiError>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<V, ApiError>>,
    {
        let mut guard = FillGuard {
            cache: self,
            key: key.to_owned(),
            done: false,
        };
        let result = fetch().await;
        let fetched = SystemTime::now();
        let mut entries = self.entries.lock().await;
        match &result {
            Ok(value) => {
                entries.insert(
                    key.to_owned(),
                    Slot::Ready(Entry {
                        at: Instant::now(),
                        fetched,
                        value: value.clone(),
                    }),
                );
            }
            Err(_) => {
                entries.remove(key);
            }
        }
        guard.done = true;
        drop(entries);
        let _ = tx.send(Some(
            result
                .as_ref()
                .map(|v| (v.clone(), fetched))
                .map_err(Clone::clone),
        ));
        result.map(|v| (v, freshness(fetched, false)))
    }
}

fn freshness(fetched: SystemTime, cached: bool) -> Freshness {
    Freshness {
        fetched_at: clock::format_time(fetched),
        age_seconds: fetched.elapsed().unwrap_or_default().as_secs(),
        cached,
    }
}

pub struct Inspector {
    regions: Cache<Arc<Vec<RegionInfo>>>,
    zones: Cache<Arc<Vec<AvailabilityZone>>>,
    types: Cache<Arc<Vec<InstanceTypeInfo>>>,
    rendered: std::sync::Mutex<HashMap<ListKey, Rendered>>,
}

/// A filtered instance-type list as it is sent, for the catalogue it was cut from.
struct Rendered {
    from: Arc<Vec<InstanceTypeInfo>>,
    list: Listing<InstanceTypeInfo>,
}

/// The filters an instance-type list is rendered once for (region, zone, accelerated
/// only, the fields sent as a bit set). Lists of named types are rendered per request:
/// there are too many to keep.
type ListKey = (String, Option<String>, bool, u16);

/// The fields asked for as a bit set over `InstanceTypeField::ALL`; all of them when
/// none are named, and `instance_type` always, so every object still says what it is.
pub(super) fn field_set(fields: &[InstanceTypeField]) -> u16 {
    let bit = |f: &InstanceTypeField| {
        1 << InstanceTypeField::ALL
            .iter()
            .position(|a| a == f)
            .unwrap_or_default()
    };
    if fields.is_empty() {
        return InstanceTypeField::ALL.iter().fold(0, |set, f| set | bit(f));
    }
    fields
        .iter()
        .fold(bit(&InstanceTypeField::InstanceType), |set, f| set | bit(f))
}

/// `items` as a JSON array of objects with only the keys in `set`.
pub(super) fn render_fields<'a>(
    items: impl Iterator<Item = &'a InstanceTypeInfo>,
    set: u16,
) -> Result<Listing<InstanceTypeInfo>, serde_json::Error> {
    if set == field_set(&[]) {
        return Listing::render(items);
    }
    let keep: Vec<&str> = InstanceTypeField::ALL
        .iter()
        .enumerate()
        .filter(|(i, _)| set & (1 << i) != 0)
        .map(|(_, f)| f.name())
        .collect();
    let cut = items
        .map(|t| {
            let serde_json::Value::Object(mut o) = serde_json::to_value(t)? else {
                unreachable!("an InstanceTypeInfo is an object")
            };
            o.retain(|k, _| keep.contains(&k.as_str()));
            Ok(o)
        })
        .collect::<Result<Vec<_>, serde_json::Error>>()?;
    let raw = serde_json::value::to_raw_value(&cut)?;
    Ok(Listing::Rendered(Arc::from(raw)))
}

/// Rendered lists kept at most; past it they are all dropped (each is ~30 kB, and the
/// keys a console and agents use are a handful per region).
const RENDERED_KEPT: usize = 64;

impl Default for Inspector {
    fn default() -> Self {
        Self {
            regions: Cache::new(FRESH_FOR),
            zones: Cache::new(FRESH_FOR),
            types: Cache::new(FRESH_FOR),
            rendered: std::sync::Mutex::new(HashMap::new()),
        }
    }
}

fn choices<'a>(names: impl Iterator<Item = &'a str>) -> String {
    names.collect::<Vec<_>>().join(", ")
}

impl Inspector {
    pub async fn regions(
        &self,
        aws: &Aws,
        refresh: bool,
    ) -> Result<(Arc<Vec<RegionInfo>>, Freshness), ApiError> {
        let home = aws.region().unwrap_or_else(|| "us-east-1".to_owned());
        self.regions
            .get_or_fetch("all", refresh, || async {
                let out = aws
                    .ec2(&home)
                    .describe_regions()
                    .send()
                    .await
                    .upstream("ec2", "DescribeRegions")?;
                let mut regions: Vec<RegionInfo> = out
                    .regions()
                    .iter()
                    .filter_map(|r| {
                        Some(RegionInfo {
                            name: r.region_name()?.to_owned(),
                            opt_in_status: r.opt_in_status().map(str::to_owned),
                        })
                    })
                    .collect();
                regions.sort_by(|a, b| a.name.cmp(&b.name));
                Ok(Arc::new(regions))
            })
            .await
    }

    pub async fn zones(
        &self,
        aws: &Aws,
        region: &str,
        refresh: bool,
    ) -> Result<(Arc<Vec<AvailabilityZone>>, Freshness), ApiError> {
        self.zones
            .get_or_fetch(region, refresh, || async {
                let out = aws
                    .ec2(region)
                    .describe_availability_zones()
                    .send()
                    .await
                    .upstream("ec2", "DescribeAvailabilityZones")?;
                let mut zones: Vec<AvailabilityZone> = out
                    .availability_zones()
                    .iter()
                    .filter_map(|z| {
                        Some(AvailabilityZone {
                            name: z.zone_name()?.to_owned(),
                            zone_id: z.zone_id().unwrap_or_default().to_owned(),
                            state: z.state().map(|s| s.as_str().to_owned()).unwrap_or_default(),
                            zone_type: z.zone_type().map(str::to_owned),
                        })
                    })
                    .collect();
                zones.sort_by(|a, b| a.name.cmp(&b.name));
                Ok(Arc::new(zones))
            })
            .await
    }

    /// The instance types of the region HyperPod can build, with the zones offering each.
    pub async fn instance_types(
        &self,
        aws: &Aws,
        region: &str,
        refresh: bool,
    ) -> Result<(Arc<Vec<InstanceTypeInfo>>, Freshness), ApiError> {
        self.types
            .get_or_fetch(region, refresh, || async {
                fetch_instance_types(aws, region).await.map(Arc::new)
            })
            .await
    }

    /// `all` cut by `key`'s filters, serialized once per catalogue fill: every asker of
    /// the same list until the cache refills is sent the same bytes.
    pub(super) fn rendered_list(
        &self,
        key: ListKey,
        all: &Arc<Vec<InstanceTypeInfo>>,
        keep: impl Fn(&InstanceTypeInfo) -> bool,
    ) -> Result<Listing<InstanceTypeInfo>, ApiError> {
        let mut rendered = self.rendered.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(r) = rendered.get(&key)
            && Arc::ptr_eq(&r.from, all)
        {
            return Ok(r.list.clone());
        }
        let list =
            render_fields(all.iter().filter(|t| keep(t)), key.3).map_err(ApiError::internal)?;
        if rendered.len() >= RENDERED_KEPT {
            rendered.clear();
        }
        rendered.insert(
            key,
            Rendered {
                from: all.clone(),
                list: list.clone(),
            },
        );
        Ok(list)
    }

    /// Fills the cache for hypd's own region in the background; a failure is only
    /// logged (the first real ask reports it, and tries again).
    pub async fn warm(&self, aws: &Aws) {
        let Some(home) = aws.region() else { return };
        let started = Instant::now();
        let (regions, zones, types) = tokio::join!(
            self.regions(aws, false),
            self.zones(aws, &home, false),
            self.instance_types(aws, &home, false),
        );
        match (regions, zones, types) {
            (Ok(_), Ok(_), Ok((types, _))) => tracing::info!(
                region = %home,
                instance_types = types.len(),
                seconds = started.elapsed().as_secs_f64(),
                "inspection cache warmed"
            ),
            (r, z, t) => tracing::warn!(
                errors = ?[r.err(), z.err(), t.err()].into_iter().flatten().collect::<Vec<_>>(),
                "could not warm the inspection cache"
            ),
        }
    }

    /// The region a request names, or hypd's own; a named one must be enabled in the
    /// account, so a typo is a field error rather than a failed AWS call.
    pub async fn region(&self, aws: &Aws, requested: Option<&Region>) -> Result<String, ApiError> {
        let Some(region) = requested else {
            return aws.region().ok_or_else(|| {
                ApiError::field(
                    "region",
                    "no region given and hypd has none configured (set AWS_REGION)",
                )
            });
        };
        let (regions, _) = self.regions(aws, false).await?;
        if regions.iter().any(|r| r.name == region.as_str()) {
            Ok(region.to_string())
        } else {
            Err(ApiError::field(
                "region",
                format!(
                    "{region} is not a region enabled for this account; choose one of: {}",
                    choices(regions.iter().map(|r| r.name.as_str()))
                ),
            ))
        }
    }

    /// `zone` is an Availability Zone of `region` (the error names `field`).
    pub async fn check_zone(
        &self,
        aws: &Aws,
        region: &str,
        zone: &str,
        field: &str,
    ) -> Result<(), ApiError> {
        let (zones, _) = self.zones(aws, region, false).await?;
        if zones.iter().any(|z| z.name == zone) {
            Ok(())
        } else {
            Err(ApiError::field(
                field,
                format!(
                    "{zone} is not an Availability Zone of {region}; choose one of: {}",
                    choices(zones.iter().map(|z| z.name.as_str()))
                ),
            ))
        }
    }
}

/// Pre-flight for one instance group's type: HyperPod builds it, and EC2 offers it in
/// `zone`. One narrow offerings call (this type, every zone of the region), not the
/// catalogue. The error names `field`.
pub async fn check_offered(
    aws: &Aws,
    region: &str,
    zone: &str,
    ml_type: &str,
    field: &str,
) -> Result<(), ApiError> {
    if !hyperpod_supports(ml_type) {
        return Err(ApiError::field(
            field,
            format!(
                "{ml_type} is not an instance type HyperPod clusters support; list_instance_types shows the ones that are"
            ),
        ));
    }
    let ec2_type = ml_type.trim_start_matches("ml.");
    let out = aws
        .ec2(region)
        .describe_instance_type_offerings()
        .location_type(LocationType::AvailabilityZone)
        .filters(filter("instance-type", ec2_type))
        .send()
        .await
        .upstream("ec2", "DescribeInstanceTypeOfferings")?;
    let mut zones: Vec<&str> = out
        .instance_type_offerings()
        .iter()
        .filter_map(|o| o.location())
        .collect();
    zones.sort_unstable();
    if zones.contains(&zone) {
        return Ok(());
    }
    Err(ApiError::field(
        field,
        if zones.is_empty() {
            format!("{ml_type} is not offered in any zone of {region}")
        } else {
            format!(
                "{ml_type} is not offered in {zone}; it is offered in: {}",
                zones.join(", ")
            )
        },
    ))
}

async fn fetch_instance_types(aws: &Aws, region: &str) -> Result<Vec<InstanceTypeInfo>, ApiError> {
    let client = aws.ec2(region);
    let mut offered: HashMap<String, Vec<String>> = HashMap::new();
    let mut pages = client
        .describe_instance_type_offerings()
        .location_type(LocationType::AvailabilityZone)
        .into_paginator()
        .send();
    while let Some(page) = pages.next().await {
        let page =
            page.map_err(|e| UpstreamError::from_sdk("ec2", "DescribeInstanceTypeOfferings", e))?;
        for o in page.instance_type_offerings() {
            if let (Some(t), Some(zone)) = (o.instance_type(), o.location())
                && hyperpod_supports(&format!("ml.{}", t.as_str()))
            {
                offered
                    .entry(t.as_str().to_owned())
                    .or_default()
                    .push(zone.to_owned());
            }
        }
    }
    // Only the types HyperPod builds, described in pages of the names themselves: a
    // hundred or so types, not the region's whole catalogue.
    let names: Vec<String> = offered.keys().cloned().collect();
    let mut types = Vec::new();
    for chunk in names.chunks(100) {
        let out = client
            .describe_instance_types()
            .set_instance_types(Some(
                chunk
                    .iter()
                    .map(|n| aws_sdk_ec2::types::InstanceType::from(n.as_str()))
                    .collect(),
            ))
            .send()
            .await
            .upstream("ec2", "DescribeInstanceTypes")?;
        types.extend(
            out.instance_types()
                .iter()
                .filter_map(|t| describe_type(t, &offered)),
        );
    }
    types.sort_by(|a, b| a.instance_type.cmp(&b.instance_type));
    Ok(types)
}

/// One instance type by its HyperPod name (`ml.p5.48xlarge`), described afresh (a single
/// DescribeInstanceTypes call): for a pipeline's steps, which have no catalogue. None
/// when EC2 does not know it.
pub async fn one_type(
    aws: &Aws,
    region: &str,
    ml_type: &str,
) -> Result<Option<InstanceTypeInfo>, ApiError> {
    let name = ml_type.strip_prefix("ml.").unwrap_or(ml_type);
    let out = aws
        .ec2(region)
        .describe_instance_types()
        .instance_types(aws_sdk_ec2::types::InstanceType::from(name))
        .send()
        .await;
    let out = match out {
        Ok(out) => out,
        // EC2 refuses a name it does not know outright.
        Err(e)
            if e.as_service_error().and_then(|s| s.meta().code())
                == Some("InvalidInstanceType") =>
        {
            return Ok(None);
        }
        Err(e) => return Err(UpstreamError::from_sdk("ec2", "DescribeInstanceTypes", e).into()),
    };
    Ok(out
        .instance_types()
        .iter()
        .find_map(|t| describe_type(t, &HashMap::new())))
}

fn describe_type(t: &Ec2Type, offered: &HashMap<String, Vec<String>>) -> Option<InstanceTypeInfo> {
    let name = t.instance_type()?.as_str().to_owned();
    let network = t.network_info();
    let efa_supported = network.and_then(|n| n.efa_supported()).unwrap_or(false);
    let max_efa_interfaces = network
        .and_then(|n| n.efa_info())
        .and_then(|e| e.maximum_efa_interfaces())
        .and_then(|n| u32::try_from(n).ok())
        .unwrap_or(0);
    let mut zones = offered.get(&name).cloned().unwrap_or_default();
    zones.sort();
    Some(InstanceTypeInfo {
        hyperpod_instance_type: format!("ml.{name}"),
        vcpus: t
            .v_cpu_info()
            .and_then(|v| v.default_v_cpus())
            .and_then(|n| u32::try_from(n).ok())
            .unwrap_or(0),
        memory_mib: t
            .memory_info()
            .and_then(|m| m.size_in_mib())
            .and_then(|n| u64::try_from(n).ok())
            .unwrap_or(0),
        accelerator: accelerator(t),
        efa_supported,
        max_efa_interfaces,
        efa_only_allowed: efa_supported && efa_only_allowed(&name, Some(max_efa_interfaces)),
        network_performance: network
            .and_then(|n| n.network_performance())
            .map(str::to_owned),
        offered_in: zones,
        instance_type: name,
    })
}

fn accelerator(t: &Ec2Type) -> Option<Accelerator> {
    let mib = |m: Option<i32>| m.and_then(|n| u64::try_from(n).ok());
    let count = |c: Option<i32>| c.and_then(|n| u32::try_from(n).ok()).unwrap_or(0);
    if let Some(gpu) = t.gpu_info().and_then(|g| g.gpus().first()) {
        return Some(Accelerator {
            kind: AcceleratorKind::Gpu,
            manufacturer: gpu.manufacturer().unwrap_or_default().to_owned(),
            name: gpu.name().unwrap_or_default().to_owned(),
            count: count(gpu.count()),
            memory_mib: mib(gpu.memory_info().and_then(|m| m.size_in_mib())),
        });
    }
    if let Some(dev) = t.neuron_info().and_then(|n| n.neuron_devices().first()) {
        let name = dev.name().unwrap_or_default().to_owned();
        let kind = if name.to_ascii_lowercase().contains("inferentia") {
            AcceleratorKind::Inferentia
        } else {
            AcceleratorKind::Trainium
        };
        return Some(Accelerator {
            kind,
            manufacturer: "AWS".to_owned(),
            name,
            count: count(dev.count()),
            memory_mib: mib(dev.memory_info().and_then(|m| m.size_in_mib())),
        });
    }
    t.inference_accelerator_info()
        .and_then(|i| i.accelerators().first())
        .map(|a| Accelerator {
            kind: AcceleratorKind::Inferentia,
            manufacturer: a.manufacturer().unwrap_or("AWS").to_owned(),
            name: a.name().unwrap_or_default().to_owned(),
            count: count(a.count()),
            memory_mib: mib(a.memory_info().and_then(|m| m.size_in_mib())),
        })
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    fn cpu_type(name: &str, zone: &str) -> InstanceTypeInfo {
        InstanceTypeInfo {
            instance_type: name.to_owned(),
            hyperpod_instance_type: format!("ml.{name}"),
            vcpus: 4,
            memory_mib: 16_384,
            accelerator: None,
            efa_supported: false,
            max_efa_interfaces: 0,
            efa_only_allowed: false,
            network_performance: None,
            offered_in: vec![zone.to_owned()],
        }
    }

    fn rendered_text(l: &Listing<InstanceTypeInfo>) -> (String, *const u8) {
        match l {
            Listing::Rendered(raw) => (raw.get().to_owned(), raw.get().as_ptr()),
            Listing::Items(_) => panic!("not rendered"),
        }
    }

    #[test]
    fn a_list_is_rendered_once_per_catalogue_fill() {
        let inspector = Inspector::default();
        let all = Arc::new(vec![cpu_type("m5.large", "a"), cpu_type("c5.large", "b")]);
        let key = || ("r".to_owned(), Some("a".to_owned()), false, field_set(&[]));
        let in_a = |t: &InstanceTypeInfo| t.offered_in.iter().any(|z| z == "a");
        let first = inspector.rendered_list(key(), &all, in_a).unwrap();
        let again = inspector.rendered_list(key(), &all, in_a).unwrap();
        let (text, at) = rendered_text(&first);
        assert_eq!(
            rendered_text(&again),
            (text.clone(), at),
            "the same bytes, shared"
        );
        let items: Vec<InstanceTypeInfo> = serde_json::from_str(&text).unwrap();
        assert_eq!(items, vec![cpu_type("m5.large", "a")]);

        // A new fill of the catalogue is rendered anew, even when it reads the same.
        let refilled = Arc::new(all.as_ref().clone());
        let fresh = inspector.rendered_list(key(), &refilled, in_a).unwrap();
        assert_ne!(rendered_text(&fresh).1, at);
        assert_eq!(rendered_text(&fresh).0, text);

        // Kept lists are bounded.
        for i in 0..RENDERED_KEPT * 2 {
            let k = (format!("r{i}"), None, false, field_set(&[]));
            inspector.rendered_list(k, &all, |_| true).unwrap();
        }
        assert!(inspector.rendered.lock().unwrap().len() <= RENDERED_KEPT);
    }

    #[test]
    fn fields_cut_each_object_to_the_keys_asked_for() {
        let all = [cpu_type("m5.large", "a")];
        let text = |fields: &[InstanceTypeField]| {
            let (text, _) = rendered_text(&render_fields(all.iter(), field_set(fields)).unwrap());
            serde_json::from_str::<serde_json::Value>(&text).unwrap()
        };
        assert_eq!(
            text(&[InstanceTypeField::OfferedIn, InstanceTypeField::Vcpus]),
            serde_json::json!([{"instance_type": "m5.large", "vcpus": 4, "offered_in": ["a"]}])
        );
        // None named is every field, as the whole object reads.
        assert_eq!(text(&[]), serde_json::json!([all[0]]));
        assert_eq!(
            text(&InstanceTypeField::ALL),
            text(&[]),
            "every field named is the whole object"
        );
    }

    #[test]
    fn only_types_hyperpod_builds_are_supported() {
        assert!(hyperpod_supports("ml.p5.48xlarge"));
        assert!(hyperpod_supports("ml.g5.8xlarge"));
        assert!(!hyperpod_supports("ml.g5g.xlarge"));
        assert!(!hyperpod_supports("ml.g5g.16xlarge"));
        assert!(!hyperpod_supports("p5.48xlarge"));
    }

    #[tokio::test]
    async fn concurrent_fills_of_one_key_are_one_fetch() {
        let cache: Arc<Cache<u32>> = Arc::new(Cache::new(FRESH_FOR));
        let fetches = Arc::new(AtomicUsize::new(0));
        let mut tasks = Vec::new();
        for i in 0..10 {
            let (cache, fetches) = (cache.clone(), fetches.clone());
            tasks.push(tokio::spawn(async move {
                // Half of them ask for a refresh: they join the fetch under way too.
                cache
                    .get_or_fetch("us-east-1", i % 2 == 0, || async {
                        fetches.fetch_add(1, Ordering::SeqCst);
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        Ok(7)
                    })
                    .await
                    .unwrap()
                    .0
            }));
        }
        for t in tasks {
            assert_eq!(t.await.unwrap(), 7);
        }
        assert_eq!(fetches.load(Ordering::SeqCst), 1);
        // A failed fetch is not cached: the next ask fetches again.
        let failing = cache
            .get_or_fetch("eu-west-1", false, || async {
                Err(ApiError::internal("down"))
            })
            .await;
        assert!(failing.is_err());
        let again = cache
            .get_or_fetch("eu-west-1", false, || async { Ok(1) })
            .await
            .unwrap();
        assert_eq!(again.0, 1);
    }

    #[tokio::test]
    async fn an_abandoned_fill_does_not_block_the_next_asker() {
        let cache: Arc<Cache<u32>> = Arc::new(Cache::new(FRESH_FOR));
        let c = cache.clone();
        let stuck = tokio::spawn(async move {
            c.get_or_fetch("k", false, || async {
                tokio::time::sleep(Duration::from_secs(3600)).await;
                Ok(1)
            })
            .await
        });
        tokio::time::sleep(Duration::from_millis(20)).await;
        stuck.abort();
        let _ = stuck.await;
        let got = tokio::time::timeout(
            Duration::from_secs(5),
            cache.get_or_fetch("k", false, || async { Ok(2) }),
        )
        .await
        .expect("the next asker fetches instead of waiting")
        .unwrap();
        assert_eq!(got.0, 2);
    }
}
